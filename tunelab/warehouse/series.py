"""Release series from the warehouse, anchor-adjusted, with their change-point alarms.

Each scheduled sweep adds one point per (config, GPU, workload, load level, metric): the mean over the sweep's
boots of ln(boot value) (``queries/release_series.sql``). Where the sweeps ran an anchor (a reference config that
never changes: the plan's ``anchor:``), the anchor's mean ln value of the same sweep and cell is subtracted, so
that what moved the whole sweep (machine, driver, host load) cancels and what is left is the config against the
anchor. The series is ordered by time (``run_at``) or by vLLM release (PEP 440 order, then time), and
``stats.changepoints.detect_changepoints`` marks where it moved, with the relative change and its interval.

``confirm_by_alarm`` is the gate of the Prefect regression event (``flows.compare``): a series regression of the
consecutive-violation rule is confirmed only when a change point agrees.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pandas as pd

from tunelab.stats.changepoints import detect_changepoints
from tunelab.warehouse.compare import metric_direction
from tunelab.warehouse.query import run_query

__all__ = ["MIN_POINTS_FOR_ALARM", "SERIES_KEYS", "confirm_by_alarm", "config_key_of", "release_series", "series_alarms",
           "workload_of"]

#: What identifies one series.
SERIES_KEYS = ["config_key", "gpu_name", "workload", "load_kind", "load_value", "metric"]
#: Shortest series that the change-point test is run on with the default ``min_size=3``: below it a permutation
#: p-value rarely reaches 0.05 (a 6-point series has 20 ways to split 3 + 3) and ``confirm_by_alarm`` leaves the
#: consecutive-violation rule to decide alone.
MIN_POINTS_FOR_ALARM = 8


def release_series(con: duckdb.DuckDBPyConnection, metric: str = "output_tokens_per_s", *,
                   config_key: str | None = None, workload: str | None = None, anchor_key: str | None = None,
                   anchor_runtime: str | None = None, order: str = "time") -> pd.DataFrame:
    """The series of ``metric``: one row per (config, GPU, workload, load level, sweep, release).

    Args:
        con: warehouse connection (read-only is enough).
        metric: a comparable ``measurements`` column (``warehouse.compare.metric_direction``).
        config_key, workload: restrict to one config / workload (None: all).
        anchor_key: the anchor config's ``config_key``: subtract its per-sweep mean ln value (None: no anchor).
        anchor_runtime: the anchor's runtime name (None: any). A config key does not depend on the runtime, so an
            anchor that is the same config on a pinned release is named by key and runtime; the series is then
            that config on every other runtime.
        order: ``"time"`` (by ``run_at``) or ``"release"`` (by ``vllm_version_key``, then ``run_at``; points of
            untrusted versions, which have no key, are dropped).

    Returns:
        DataFrame with the columns of ``queries/release_series.sql`` plus ``series_log_value`` (the value the
        change points are found in: ``adjusted_log_value`` with an anchor, ``log_value`` without; NaN where an
        anchor was asked for and the sweep has none there), ``value`` (``exp(log_value)``, the geometric mean in
        the metric's unit) and ``anchored`` (bool). Ordered by series, then ``order``.

    Raises:
        ValueError: unknown metric or order.
    """
    metric_direction(metric)
    if order not in ("time", "release"):
        raise ValueError(f"order={order!r}: use 'time' (by run date) or 'release' (by vLLM version)")
    df = run_query(con, "release_series", metric=metric, config_key=config_key, workload=workload,
                   anchor_key=anchor_key, anchor_runtime=anchor_runtime if anchor_key is not None else None)
    if order == "release":
        df = df[df["vllm_version_key"].notna()]
    by = ["run_at", "vllm_version_key"] if order == "time" else ["vllm_version_key", "run_at"]
    df = df.sort_values(SERIES_KEYS[:-1] + by, kind="stable").reset_index(drop=True)
    df["anchored"] = anchor_key is not None
    df["series_log_value"] = df["adjusted_log_value"] if anchor_key is not None else df["log_value"]
    df["value"] = np.exp(df["log_value"].astype(float))
    df.attrs.update(metric=metric, anchor_key=anchor_key, anchor_runtime=anchor_runtime, order=order)
    return df



def config_key_of(con: duckdb.DuckDBPyConnection, text: str, option: str) -> str:
    """The config key that ``text`` names (a key, else a label) among the warehouse's ok trials.

    Args:
        text: a config key (``44bbf9bf51da``; matched ignoring case, as ``tunelab compare`` matches anchor keys) or
            label (``max-num-seqs=4``, matched exactly), as ``tunelab compare`` accepts them.
        option: the CLI option it came from (``--key``, ``--anchor``), named in the error.

    Raises:
        ValueError: no ok trial has that key or label, or the label names several keys; lists what exists.
    """
    rows = con.execute("SELECT DISTINCT config_key, config_label FROM trials WHERE status = 'ok' "
                       "ORDER BY 1, 2").fetchall()
    # keys are hex digests: 630C1D61A446 pasted from a report heading names the same config as 630c1d61a446
    for k, _ in rows:
        if k.lower() == text.lower():
            return k
    keys = sorted({k for k, label in rows if label == text})
    if len(keys) == 1:
        return keys[0]
    known = ", ".join(f"{k} ({label})" for k, label in rows) or "none: the warehouse has no ok trials"
    if keys:
        raise ValueError(f"{option} {text!r}: the label names {len(keys)} config keys ({', '.join(keys)}); give one key")
    raise ValueError(f"{option} {text!r}: no ok trial has that config key or label; configs: {known}")


def workload_of(con: duckdb.DuckDBPyConnection, text: str) -> str:
    """``text`` when some measurement has that workload.

    Raises:
        ValueError: no such workload; lists the warehouse's workloads.
    """
    found = [r[0] for r in con.execute("SELECT DISTINCT workload FROM measurements ORDER BY 1").fetchall()]
    if text not in found:
        raise ValueError(f"--workload {text!r}: no measurement of that workload; workloads: {', '.join(found) or 'none'}")
    return text

def series_alarms(series: pd.DataFrame, *, alpha: float = 0.05, min_size: int = 3, n_permutations: int = 499,
                  confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Change points of every series in ``series`` (a :func:`release_series` frame), as alarms.

    Points without a ``series_log_value`` (no anchor in that sweep) are left out of the detection.

    Returns:
        DataFrame, one row per change point: the series keys, ``position`` (index of the first point of the new
        level within the series' detected points), ``sweep_id``, ``vllm_version``, ``vllm_version_key`` and
        ``run_at`` of that point, ``prev_sweep_id`` / ``prev_vllm_version`` (the point before), ``rel_change``
        (``exp(shift) - 1``), ``rel_ci_low``/``rel_ci_high`` (Welch interval at ``confidence``), ``p_value``,
        ``n_before``/``n_after``, ``direction`` (``worse`` | ``better``, from the metric's direction),
        ``anchored``.

    Raises:
        ValueError: as ``stats.changepoints.detect_changepoints``.
    """
    cols = SERIES_KEYS + ["position", "sweep_id", "vllm_version", "vllm_version_key", "run_at", "prev_sweep_id",
                          "prev_vllm_version", "rel_change", "rel_ci_low", "rel_ci_high", "p_value", "n_before",
                          "n_after", "direction", "anchored"]
    rows = []
    if len(series):
        for keys, g in series.groupby(SERIES_KEYS, dropna=False, sort=False):
            g = g[g["series_log_value"].notna()].reset_index(drop=True)
            direction = metric_direction(str(keys[-1]))
            for cp in detect_changepoints(g["series_log_value"].to_numpy(float), alpha=alpha, min_size=min_size,
                                          n_permutations=n_permutations, confidence=confidence, seed=seed):
                at, prev = g.iloc[cp.index], g.iloc[cp.index - 1]
                lo, hi = cp.rel_ci
                rows.append({**dict(zip(SERIES_KEYS, keys)), "position": cp.index, "sweep_id": at["sweep_id"],
                             "vllm_version": at["vllm_version"], "vllm_version_key": at["vllm_version_key"],
                             "run_at": at["run_at"], "prev_sweep_id": prev["sweep_id"],
                             "prev_vllm_version": prev["vllm_version"], "rel_change": cp.rel_change,
                             "rel_ci_low": lo, "rel_ci_high": hi, "p_value": cp.p_value,
                             "n_before": cp.n_before, "n_after": cp.n_after,
                             "direction": "worse" if direction * cp.shift < 0 else "better",
                             "anchored": bool(g["anchored"].iloc[0])})
    return pd.DataFrame(rows, columns=cols)


def confirm_by_alarm(con: duckdb.DuckDBPyConnection, reg: pd.DataFrame, metric: str, *, alpha: float = 0.05,
                     anchor_key: str | None = None, anchor_runtime: str | None = None) -> pd.DataFrame:
    """Gate the consecutive-violation rule's regressions (``warehouse.compare.regressions``, by version) on a
    change point: a copy of ``reg`` where a ``regression`` point stays ``regression`` only when its series (by
    release) has a ``worse`` alarm at a release from the start of that regression run up to the point; otherwise
    its status becomes ``regression_no_alarm``. A series shorter than :data:`MIN_POINTS_FOR_ALARM` points keeps
    the rule's status (too short for the test; column ``alarm`` says so). ``anchor_key``/``anchor_runtime``:
    the anchor the series are divided by (as in :func:`release_series`; the compare flow passes the one the
    compared sweeps' plans recorded, or ``--anchor``).

    Returns:
        ``reg`` with the column ``alarm``: ``change point p=<p> at <version>``, ``no change point`` or
        ``series too short for a change-point test (<n> points)``; ``""`` on rows that are not regressions.
    """
    out = reg.copy()
    if not len(out) or not (out["status"] == "regression").any():
        out["alarm"] = ""
        return out
    # only the series that hold a rule regression are searched (the test is per series)
    keys_with = sorted(set(out.loc[out["status"] == "regression", "config_key"]))
    series = pd.concat([release_series(con, metric, config_key=k, anchor_key=anchor_key,
                                       anchor_runtime=anchor_runtime, order="release")
                        for k in keys_with], ignore_index=True)
    alarms = series_alarms(series, alpha=alpha)
    keys = SERIES_KEYS[:-1]
    n_points = series.groupby(keys, dropna=False).size().to_dict() if len(series) else {}
    worse = alarms[alarms["direction"] == "worse"]
    alarm_col, status_col = [], []
    run_start_key = None
    for r in out.itertuples(index=False):
        if bool(getattr(r, "regression_start", False)):
            run_start_key = r.vllm_version_key
        if r.status != "regression":
            alarm_col.append("")
            status_col.append(r.status)
            continue
        skey = tuple(getattr(r, k) for k in keys)
        n = n_points.get(skey, 0)
        if n < MIN_POINTS_FOR_ALARM:
            alarm_col.append(f"series too short for a change-point test ({n} points)")
            status_col.append(r.status)
            continue
        mask = np.ones(len(worse), dtype=bool)
        for k, v in zip(keys, skey):
            col = worse[k]
            mask &= (col.isna().to_numpy() if _isna(v) else (col == v).to_numpy())
        hit = worse[mask & (worse["vllm_version_key"] <= r.vllm_version_key).to_numpy()
                    & (worse["vllm_version_key"] >= (run_start_key or r.vllm_version_key)).to_numpy()]
        if len(hit):
            h = hit.iloc[0]
            alarm_col.append(f"change point p={h['p_value']:.3f} at {h['vllm_version']}")
            status_col.append("regression")
        else:
            alarm_col.append("no change point")
            status_col.append("regression_no_alarm")
    out["alarm"] = alarm_col
    out["status"] = status_col
    return out


def _isna(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
