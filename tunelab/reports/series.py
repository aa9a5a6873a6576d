"""The release-series section of a report: each series with its change points marked (``tunelab series``,
``tunelab report --series``).

One table per series (config, GPU, workload, load level, metric): one row per scheduled run, in time or release
order, with the geometric mean of the run's boots, the value against the anchor where the sweeps ran one, and the
alarm of ``warehouse.series.series_alarms`` on the row where the new level starts (relative change, its interval,
the permutation p-value). The method is in docs/statistics.md ("Change points of a release series").
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pandas as pd

from tunelab.core.load_profiles import load_label
from tunelab.core.markdown import markdown_table
from tunelab.warehouse.series import SERIES_KEYS, config_key_of, release_series, series_alarms, workload_of

__all__ = ["CHANGE_MARK", "series_markdown", "series_report"]

#: The mark of a change point in a series table.
CHANGE_MARK = "◆"


def series_report(db: Path | str | duckdb.DuckDBPyConnection, metric: str = "output_tokens_per_s", *,
                  config_key: str | None = None, workload: str | None = None, anchor_key: str | None = None,
                  anchor_runtime: str | None = None, order: str = "time", alpha: float = 0.05, seed: int = 0
                  ) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Series, alarms and their markdown, read from a warehouse file (opened read-only) or a connection.

    Returns:
        ``(series, alarms, markdown)``: the frames of ``warehouse.series.release_series`` and ``series_alarms``.

    Raises:
        ValueError: no warehouse file at ``db``, unknown metric or order (from ``release_series``), a
            ``config_key`` / ``anchor_key`` (key or label) or ``workload`` that no trial has (names what exists),
            an ``anchor_runtime`` the anchor (or any trial) never ran on (names the runtimes it ran on), a
            ``config_key`` that is the anchor and has no ok trial off the anchor's runtime (an anchored series
            leaves the anchor out: says so, and that ``--anchor none`` gives its plain series).
    """
    if isinstance(db, duckdb.DuckDBPyConnection):
        con, own = db, False
    else:
        if not Path(db).exists():
            raise ValueError(f"db: no warehouse at {db}; run a sweep first or pass --db PATH")
        con, own = duckdb.connect(str(db), read_only=True), True
    try:
        # A key or label that matches nothing is an error naming what exists, not an empty series (found by a
        # fresh user: --anchor bogus printed "anchored on config bogus" over rows that each said "no anchor").
        config_key = config_key_of(con, config_key, "--key") if config_key is not None else None
        anchor_key = config_key_of(con, anchor_key, "--anchor") if anchor_key is not None else None
        workload = workload_of(con, workload) if workload is not None else None
        if anchor_runtime is not None:  # a runtime the anchor never ran on gave a series of "no anchor" points
            where = "runtime_name = ?" + (" AND config_key = ?" if anchor_key is not None else "")
            found = con.execute(f"SELECT count(*) FROM trials WHERE {where} AND status = 'ok'",
                                [anchor_runtime, *([anchor_key] if anchor_key is not None else [])]).fetchone()[0]
            if not found:
                q = ("SELECT DISTINCT runtime_name FROM trials WHERE status = 'ok'"
                     + (" AND config_key = ?" if anchor_key is not None else "") + " ORDER BY 1")
                have = [r[0] for r in con.execute(q, [anchor_key] if anchor_key is not None else []).fetchall()]
                raise ValueError(f"--anchor-runtime {anchor_runtime!r}: no ok trial "
                                 + (f"of the anchor {anchor_key} " if anchor_key is not None else "")
                                 + f"ran on that runtime; it ran on: {', '.join(have) or 'none'}")
        if config_key is not None and config_key == anchor_key:
            # The anchor's own rows are left out of anchored series (queries/release_series.sql): a user who asked
            # for the anchor's key got "no ok trials" although it had them. Only the anchor's runtime is left out
            # when one is named (the same config on the release under test is then the series).
            rts = [r[0] for r in con.execute(
                "SELECT DISTINCT runtime_name FROM trials WHERE status = 'ok' AND config_key = ? ORDER BY 1",
                [config_key]).fetchall()]
            if not [r for r in rts if anchor_runtime is not None and r != anchor_runtime]:
                on = f" on runtime {anchor_runtime}" if anchor_runtime is not None else ""
                raise ValueError(f"--key {config_key!r} is the anchor{on}: anchored series leave the anchor out "
                                 "(every point would be the anchor against itself); "
                                 f"`--key {config_key} --anchor none` shows its plain series"
                                 + (f"; it ran only on {', '.join(rts)}" if anchor_runtime is not None else ""))
        series = release_series(con, metric, config_key=config_key, workload=workload, anchor_key=anchor_key,
                                anchor_runtime=anchor_runtime, order=order)
    finally:
        if own:
            con.close()
    alarms = series_alarms(series, alpha=alpha, seed=seed)
    return series, alarms, series_markdown(series, alarms, alpha=alpha)


def _pct(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}%"


def series_markdown(series: pd.DataFrame, alarms: pd.DataFrame, alpha: float = 0.05) -> str:
    """Markdown: a heading, then per series a line naming it and a table of its points, change points marked.

    Columns: ``run`` (sweep id), ``date`` (UTC), ``vLLM``, ``boots``, ``value`` (geometric mean of the boots, the
    metric's unit), ``vs anchor`` (the run's value against the anchor of the same sweep, when the series is
    anchored), ``level`` (the series value against its first point), ``change`` (``◆`` and the alarm on the first
    point of a new level).
    """
    metric = series.attrs.get("metric", "")
    anchor = series.attrs.get("anchor_key")
    ordered = "ordered by vLLM release" if series.attrs.get("order") == "release" else "ordered by time"
    lines = [f"## Release series: {metric}", "",
             f"One point per scheduled run ({ordered}); "
             + (f"anchored on config `{anchor}`"
                + (f" on runtime `{series.attrs['anchor_runtime']}`" if series.attrs.get("anchor_runtime") else "")
                + " (its mean of the same sweep is divided out)" if anchor else
                "not anchored (no anchor config given: sweep-to-sweep machine drift stays in the series)")
             + f". {CHANGE_MARK} marks a change point (binary segmentation of mean shifts, permutation test at "
               f"alpha={alpha}: at most {alpha:.0%} of series without a change alarm; interval: Welch, before vs "
               "after).",
             ""]
    if series.empty:
        return "\n".join(lines + ["_no points: no ok trials of this metric_"])
    for keys, g in series.groupby(SERIES_KEYS, dropna=False, sort=False):
        k = dict(zip(SERIES_KEYS, keys))
        mine = alarms
        for c in SERIES_KEYS:
            mine = mine[(mine[c] == k[c]) | (mine[c].isna() & pd.isna(k[c]))] if len(mine) else mine
        # a sweep may hold two points of one config (two releases): a mark is the sweep's point of that release
        marks = {(r.sweep_id, str(r.vllm_version_key)): r for r in mine.itertuples(index=False)}
        gpu = "" if k["gpu_name"] is None or pd.isna(k["gpu_name"]) else f" on {k['gpu_name']}"
        # the plan's label first (what a user typed), the key after it (what the warehouse joins on)
        labels = [x for x in g["config_label"].dropna().unique()] if "config_label" in g else []
        name = f"**{labels[-1]}** (`{k['config_key']}`)" if labels else f"**{k['config_key']}**"
        lines.append(f"{name} {k['workload']} {load_label(k['load_kind'], k['load_value'])}{gpu}"
                     f": {len(g)} point(s), {len(mine)} change point(s)")
        lines.append("")
        valid = g["series_log_value"].dropna()
        first = float(valid.iloc[0]) if len(valid) else math.nan
        rows = []
        for r in g.itertuples(index=False):
            a = marks.get((r.sweep_id, str(r.vllm_version_key)))
            lo, hi = (a.rel_ci_low, a.rel_ci_high) if a is not None else (None, None)
            rows.append({
                "run": r.sweep_id,
                "date": pd.Timestamp(r.run_at).strftime("%Y-%m-%d %H:%M") if pd.notna(r.run_at) else "",
                "vLLM": r.vllm_version, "boots": int(r.boots), "value": f"{r.value:.4g}",
                **({"vs anchor": _pct(math.expm1(r.adjusted_log_value)) if pd.notna(r.adjusted_log_value)
                    else "no anchor"} if anchor else {}),
                "level": _pct(math.expm1(r.series_log_value - first)) if pd.notna(r.series_log_value) else "",
                "change": "" if a is None else
                f"{CHANGE_MARK} {a.direction} {_pct(a.rel_change)} [{_pct(lo)}, {_pct(hi)}] p={a.p_value:.3f}",
            })
        lines += markdown_table(rows)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
