"""Plots from the warehouse, saved as PNG (matplotlib, Agg backend: no display needed).

- :func:`latency_throughput_plot`: for one sweep, latency against output throughput per config, one point per
  load level (concurrency or request rate), one panel per workload. The curve a capacity planner reads: how
  much latency each config pays for more tokens/s. Values are means over boots and repeats (the numbers of
  ``tunelab/warehouse/queries/sweep_comparison.sql``).
- :func:`version_plot`: a metric across vLLM versions, one line per (config, workload, load level), versions in
  PEP 440 order (``trials.vllm_version_key``, never the raw string), error bars = boot-to-boot standard
  deviation (repeats are averaged per boot first: the boot is the unit of replication, as in
  ``tunelab/warehouse/compare.py``).
- :func:`write_plots`: both, into a folder; the paths are linked from the report.
- :func:`ab_interval_plot`: an A/B comparison, the change of each config / workload / load level with its
  confidence interval (the chart of ``tunelab compare --html``). The version plot only where the
  warehouse has two or more vLLM versions. Legends sit outside the axes, never over the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from tunelab.core.load_profiles import load_label, profile_class

__all__ = ["ab_interval_plot", "latency_throughput_plot", "version_plot", "write_plots"]

_LATENCIES = ("ttft_p50_s", "tpot_p50_s", "itl_p50_s", "e2el_p95_s")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[:80]


def _legend_outside(ax: Any) -> None:
    """The legend to the right of the axes, never over the data (inside, matplotlib's 'best' place still
    covered the top points of a crowded plot)."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _save(fig: Any, out_dir: Path, name: str) -> Path:
    """Lay out ``fig``, write it as ``out_dir/name`` (PNG, 110 dpi, cropped to what is drawn, legends outside
    the axes included; the folder is made) and free it."""
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def latency_throughput_plot(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str, out_dir: Path,
                            latency: str = "ttft_p50_s") -> Path | None:
    """Latency (ms) against output tokens/s for each config of sweep ``sweep_id``; one panel per workload.

    Args:
        db_path: the DuckDB warehouse (opened read-only), or an open connection (e.g. the sweep's bundles in
            memory, ``warehouse.loader.bundles_warehouse``).
        sweep_id: the sweep.
        out_dir: folder for the PNG (created).
        latency: one of ``ttft_p50_s``, ``tpot_p50_s``, ``itl_p50_s``, ``e2el_p95_s`` (plotted in ms).

    Returns:
        The PNG path (``latency_throughput_<sweep>.png``), or None when the sweep has no measurements.

    Raises:
        ValueError: unknown ``latency``.
    """
    if latency not in _LATENCIES:
        raise ValueError(f"latency {latency!r}: use one of {list(_LATENCIES)}")
    from tunelab.reports.report import comparison_frame

    db = db_path if isinstance(db_path, duckdb.DuckDBPyConnection) else Path(db_path)
    df = comparison_frame(db, sweep_id)
    caveat = ""
    if df.empty:
        # No trial passed its quality gate: still draw what was measured, and say so in the title.
        df = comparison_frame(db, sweep_id, all_quality=True)
        caveat = " (no trial passed its quality gate: all measured trials shown)"
    if df.empty:
        return None
    plt = _plt()
    workloads = sorted(df["workload"].unique())
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        d = df[df["workload"] == w]
        for (rt, cfg), g in d.groupby(["runtime", "config"], sort=True):
            for kind, gk in g.groupby("load_kind"):
                gk = gk.sort_values("load_value")
                ax.plot(gk["output_tokens_per_s"], gk[latency] * 1000, marker=profile_class(kind).plot_marker,
                        label=f"{cfg} ({rt}, {kind})")
                for _, r in gk.iterrows():
                    ax.annotate(load_label(kind, r["load_value"]), (r["output_tokens_per_s"], r[latency] * 1000), fontsize=7,
                                textcoords="offset points", xytext=(3, 3))
        ax.set_title(w)
        ax.set_xlabel("output tokens/s (mean over boots and repeats)")
        ax.set_ylabel(f"{latency.removesuffix('_s').replace('_', ' ').upper()} (ms)")
        ax.grid(alpha=0.3)
        _legend_outside(ax)
    fig.suptitle(f"latency vs throughput, sweep {sweep_id}{caveat}", fontsize=9)
    return _save(fig, out_dir, f"latency_throughput_{_safe(sweep_id)}.png")


def version_plot(db_path: Path, out_dir: Path, metric: str = "output_tokens_per_s",
                 config_key: str | None = None, workload: str | None = None,
                 quality: tuple[str, ...] = ("pass", "warn")) -> Path | None:
    """``metric`` across vLLM versions for every config (or one ``config_key``) and workload.

    Only trials with ``status='ok'`` and a verdict in ``quality`` count. Returns the PNG path
    (``version_<metric>.png``), or None when no trial qualifies or they all ran one vLLM version (a plot "across
    versions" of one version is a single column of dots: it says nothing).

    Raises:
        ValueError: ``metric`` is not a comparable ``measurements`` column (``warehouse.compare.metric_direction``).
    """
    from tunelab.warehouse.compare import metric_direction

    direction = metric_direction(metric)  # validates the column name before it goes into SQL
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        where, params = ["f.status = 'ok'", f"f.quality_verdict IN ({', '.join('?' for _ in quality)})"], list(quality)
        if config_key:
            where.append("f.config_key = ?")
            params.append(config_key)
        if workload:
            where.append("m.workload = ?")
            params.append(workload)
        df = con.execute(
            f"""SELECT f.config_key, any_value(f.config_label) AS config_label, m.workload, m.load_kind,
                       m.load_value, min(coalesce(f.vllm_public_version, f.vllm_version)) AS vllm_version,
                       f.vllm_version_key, f.trial_id, avg(m.{metric}) AS boot_value
                FROM measurements m JOIN trial_facts f ON f.trial_id = m.trial_id
                WHERE {' AND '.join(where)} AND m.{metric} IS NOT NULL AND f.vllm_version_key IS NOT NULL
                GROUP BY f.config_key, m.workload, m.load_kind, m.load_value, f.vllm_version_key, f.trial_id""",
            params).fetchdf()  # builds of one release (0.26.0, 0.26.0+empty) share the key: one x position
    finally:
        con.close()
    if df.empty:
        return None
    pts = (df.groupby(["config_key", "config_label", "workload", "load_kind", "load_value", "vllm_version_key",
                       "vllm_version"], dropna=False)["boot_value"]
             .agg(["mean", "std", "count"]).reset_index().sort_values("vllm_version_key"))
    versions = pts[["vllm_version_key", "vllm_version"]].drop_duplicates().sort_values("vllm_version_key")
    xpos = {k: i for i, k in enumerate(versions["vllm_version_key"])}
    if len(xpos) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(xpos) + 4), 4.5))
    for (ck, lab, w, lk, lv), g in pts.groupby(["config_key", "config_label", "workload", "load_kind", "load_value"]):
        load = load_label(lk, lv)
        ax.errorbar([xpos[k] for k in g["vllm_version_key"]], g["mean"], yerr=g["std"].fillna(0), marker="o",
                    capsize=3, label=f"{lab} [{ck[:6]}] {w} {load}")
    ax.set_xticks(range(len(xpos)), list(versions["vllm_version"]), rotation=30, ha="right")
    ax.set_xlabel("vLLM version (PEP 440 order)")
    ax.set_ylabel(f"{metric} ({'higher' if direction > 0 else 'lower'} is better)")
    ax.set_title(f"{metric} across vLLM versions (mean of boot means; bars = boot SD)", fontsize=9)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return _save(fig, out_dir, f"version_{_safe(metric)}.png")


def write_plots(db_path: Path, sweep_id: str | None, out_dir: Path, metric: str = "output_tokens_per_s") -> list[Path]:
    """The latency-vs-throughput plot of ``sweep_id`` (skipped when None) and ``metric`` across vLLM versions;
    returns the paths written (a plot with no data is not written)."""
    paths = []
    if sweep_id:
        paths.append(latency_throughput_plot(db_path, sweep_id, out_dir))
    paths.append(version_plot(db_path, out_dir, metric))
    return [p for p in paths if p is not None]


def ab_interval_plot(rows: list[dict], out_dir: Path, name: str = "ab_change.png") -> Path | None:
    """The A/B comparison as a chart: per row of ``flows.compare.compare``'s ``rows`` (config, workload, load
    level), the relative change of the candidate against the baseline (%) with its confidence interval, coloured
    by verdict (better green, worse red, otherwise grey), and a line at 0. Rows without a change (a side without
    boots) are left out.

    Args:
        rows: dicts with ``rel_diff``, ``rel_ci_low``, ``rel_ci_high`` (relative, 0.1 = +10 %), ``verdict``,
            ``workload``, ``load_kind``, ``load_value``, and optional ``config_label``/``config_key``, ``metric``.
        out_dir: folder for the PNG (created).

    Returns:
        The PNG path, or None when no row has a change.
    """
    import math

    pts = [r for r in rows if r.get("rel_diff") is not None and not (isinstance(r["rel_diff"], float)
                                                                      and math.isnan(r["rel_diff"]))]
    if not pts:
        return None
    plt = _plt()
    colours = {"better": "tab:green", "worse": "tab:red"}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(pts) + 1.4))
    for i, r in enumerate(pts):
        # A row below the minimum boots has its interval as None (the key is present): draw the point alone.
        d = float(r["rel_diff"]) * 100
        lo = d if r.get("rel_ci_low") is None else float(r["rel_ci_low"]) * 100
        hi = d if r.get("rel_ci_high") is None else float(r["rel_ci_high"]) * 100
        lo, hi = (d, d) if math.isnan(lo) or math.isnan(hi) else (lo, hi)
        c = colours.get(str(r.get("verdict")), "tab:gray")
        ax.errorbar([d], [i], xerr=[[max(d - lo, 0)], [max(hi - d, 0)]], fmt="o", color=c, capsize=3)
    ax.set_yticks(range(len(pts)), [f"{(r.get('config_label') or '')} {r['workload']} "
                                    f"{load_label(r['load_kind'], r['load_value'])}".strip() for r in pts], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"candidate vs baseline, % change of {pts[0].get('metric', 'the metric')} (bars: confidence interval)")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, out_dir, name)
