"""Boot-level rows for the anchored cross-sweep model (``tunelab.stats.anchored``): one row per boot and cell.

The boot's order position in its sweep is not a column of its own: ``trials.started_at`` is recorded for every
trial, and its rank within the sweep (``boot_order``, 0-based, ties broken by trial id) is the order the sweep
ran its boots in (``tunelab.core.trial_order`` decides it; several devices start boots in that order too).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pandas as pd

from tunelab.core import records as R

__all__ = ["boot_rows"]


def boot_rows(con: duckdb.DuckDBPyConnection, metric: str, *, sweep_ids: Sequence[str] | None = None,
              statuses: Sequence[str] = ("ok",), quality: Sequence[str] | None = ("pass", "warn")) -> pd.DataFrame:
    """Per boot (trial) and cell, the mean of ``metric`` over the boot's windows, with its sweep and order.

    Args:
        con: a warehouse connection (tables ``trials`` and ``measurements``).
        metric: a numeric ``measurements`` column, e.g. ``output_tokens_per_s`` (tokens/s) or ``tpot_p50_s``.
        sweep_ids: only these sweeps (None: all).
        statuses: trial statuses admitted; quality: ``quality_verdict`` values admitted (None: any).

    Returns:
        Columns ``trial_id, sweep_id, runtime_name, config_key, config_label, replicate, boot_order, workload,
        load_kind, load_value, value, windows``; ``value`` in the metric's unit (> 0 rows only); the windows of an
        ``sla_search:`` are left out, as in ``warehouse.compare``.

    Raises:
        ValueError: ``metric`` is not a numeric column of ``measurements`` (names the allowed ones).
    """
    allowed = [c for c in R.columns(R.Measurement) if c.endswith(("_s", "_per_s"))]
    if metric not in allowed:
        raise ValueError(f"metric {metric!r} is not a numeric measurements column; use one of {allowed}")
    where, params = ["t.status IN (SELECT unnest(?))"], [list(statuses)]
    if quality is not None:
        where.append("t.quality_verdict IN (SELECT unnest(?))")
        params.append(list(quality))
    if sweep_ids is not None:
        where.append("t.sweep_id IN (SELECT unnest(?))")
        params.append(list(sweep_ids))
    return con.execute(
        f"""WITH boots AS (
                SELECT t.trial_id, t.sweep_id, t.runtime_name, t.config_key, t.config_label, t.replicate,
                       rank() OVER (PARTITION BY t.sweep_id ORDER BY t.started_at, t.trial_id) - 1 AS boot_order
                FROM trials t WHERE {' AND '.join(where)})
            SELECT b.*, m.workload, m.load_kind, m.load_value, avg(m.{metric}) AS value,
                   count(m.{metric}) AS windows
            FROM boots b JOIN measurements m USING (trial_id)
            WHERE m.{metric} IS NOT NULL AND isfinite(m.{metric}) AND m.sla_search_window IS NOT TRUE
            GROUP BY ALL HAVING avg(m.{metric}) > 0
            ORDER BY b.sweep_id, b.boot_order, m.workload, m.load_kind, m.load_value""",
        params,
    ).fetchdf()
