"""The noise model of the warehouse: variance components per (runtime, config, GPU, workload, load level,
metric) with the cost of each level, from all trustworthy history (``tunelab.stats.noise_model`` computes; this module
only selects the rows). ``queries/noise_model.sql`` is the same boot/window estimate in SQL.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pandas as pd

from tunelab.stats.noise_model import quantile_factor, request_components, variance_components
from tunelab.warehouse.compare import metric_direction

__all__ = ["CELL_KEYS", "noise_model", "noise_windows"]

CELL_KEYS = ("runtime_name", "config_key", "gpu_name", "workload", "load_kind", "load_value")
#: The request-level column behind a latency metric's prefix.
_REQUEST_COLUMN = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s", "itl": "itl_mean_s"}


#: SQL condition on ``measurements m``: the plan's own windows, not an SLA search's (019; docs/sla_search.md), nor
#: an open-loop window the server fell behind (``overloaded``, 021).
_PLAN_WINDOWS = "m.sla_search_window IS NOT TRUE AND m.overloaded IS NOT TRUE"


def _cell_columns(alias: str) -> str:
    return ", ".join("f." + k if k in ("runtime_name", "config_key", "gpu_name") else f"{alias}." + k
                     for k in CELL_KEYS)


def _where(quality: list[str], config_key: str | None) -> tuple[str, list]:
    sql = (f"f.status = 'ok' AND f.quality_verdict IN ({', '.join('?' for _ in quality)}) "
           f"AND {_PLAN_WINDOWS}")
    params: list = [*quality]
    if config_key is not None:
        sql, params = sql + " AND f.config_key = ?", params + [config_key]
    return sql, params


def noise_windows(con: duckdb.DuckDBPyConnection, metric: str = "output_tokens_per_s", *,
                  config_key: str | None = None, quality=("pass", "warn", "unvalidated")) -> pd.DataFrame:
    """The windows :func:`noise_model` reads: one row per measured window of an ok trial whose quality verdict
    is in ``quality``, an ``sla_search:`` window excluded, and whose ``metric`` value is finite and > 0.

    Returns the ``CELL_KEYS`` columns plus ``trial_id``, ``sweep_id``, ``repeat``, ``value`` (the metric, its
    unit), ``window_s`` (seconds of the window) and ``boot_s`` (seconds to ready plus teardown of its trial).
    Count distinct ``trial_id`` / ``sweep_id`` of the cells used to say how much history a figure rests on.

    Raises:
        ValueError: a metric that is not comparable (``warehouse.compare.metric_direction``).
    """
    metric_direction(metric)
    where, params = _where(list(quality), config_key)
    w = con.execute(
        f"""SELECT {_cell_columns('m')}, m.trial_id, f.sweep_id, m.repeat, m.{metric} AS value,
                   m.duration_s AS window_s, coalesce(f.boot_s, 0) + coalesce(f.teardown_s, 0) AS boot_s
            FROM measurements m JOIN trial_facts f USING (trial_id)
            WHERE {where}""",
        params,
    ).fetchdf()
    v = pd.to_numeric(w["value"], errors="coerce").astype(float)
    return w[np.isfinite(v) & (v > 0)].reset_index(drop=True)


def noise_model(con: duckdb.DuckDBPyConnection, metric: str = "output_tokens_per_s", *,
                config_key: str | None = None, quality=("pass", "warn", "unvalidated")) -> pd.DataFrame:
    """Variance components of ``metric`` per cell (``CELL_KEYS``) from every ok trial of the warehouse whose
    quality verdict is in ``quality``, from the plan's own windows only (:func:`noise_windows`: an SLA search's
    windows, and their requests, are left out).

    Returns ``stats.noise_model.variance_components``' columns plus ``metric``, and for latency metrics with
    request rows ``var_request`` (one request's log variance), ``requests_per_window``, ``var_request_part``
    (``f * var_request / m``: the window noise a longer window would average away) and ``var_window_slow``
    (``max(0, var_window - var_request_part)``: drift within a boot that it would not). ``boot_s`` is
    seconds to ready plus teardown; ``window_s`` the mean measured window.

    Raises:
        ValueError: a metric that is not comparable (``warehouse.compare.metric_direction``).
    """
    w = noise_windows(con, metric, config_key=config_key, quality=quality).drop(columns=["sweep_id"])
    where, params = _where(list(quality), config_key)
    out = variance_components(w, CELL_KEYS)
    out.insert(len(CELL_KEYS), "metric", metric)
    for c in ("var_request", "requests_per_window", "var_request_part", "var_window_slow"):
        out[c] = math.nan
    column = _REQUEST_COLUMN.get(metric.split("_", 1)[0])
    factor = quantile_factor(metric)
    if column and np.isfinite(factor) and len(out):
        r = con.execute(
            f"""SELECT {_cell_columns('q')}, q.trial_id, q.repeat, q.{column}
                FROM requests q JOIN trial_facts f USING (trial_id)
                JOIN measurements m USING (trial_id, workload, load_kind, load_value, repeat)
                WHERE q.ok AND {where}""",
            params,
        ).fetchdf()
        if len(r):
            rc = request_components(r, CELL_KEYS, column)
            out = out.drop(columns=["var_request", "requests_per_window"]).merge(
                rc[[*CELL_KEYS, "var_request", "requests_per_window"]], on=list(CELL_KEYS), how="left")
            out["var_request_part"] = factor * out["var_request"] / out["requests_per_window"]
            out["var_window_slow"] = (out["var_window"] - out["var_request_part"]).clip(lower=0)
    return out
