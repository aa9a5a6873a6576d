"""Where a cell's noise comes from when each boot has one window: inside the window, or between boots.

The committed 8B sweeps of the verdicts-over-time issue measured one 5 s window a cell and boot, so the nested model
(``tunelab.stats.noise_model``: windows within boots) has no window-to-window term from them. This benchmark makes
one from the requests: each window's steady part (``tasks.metrics.steady_interval``, the same part the measurement
counts) is cut into ``k`` equal slices by time, and each slice gets the window's own statistics over its span
(output tokens/s: the tokens streamed in it, each request's tokens spread over its chunks, as
``tasks.metrics.aggregate`` counts them; p50 TPOT: over the requests sent in it). The slices of one window are then
"windows" of ``1/k`` the length for ``noise_model.variance_components``:

* ``var_slice`` (slice to slice within a window) gives the within-window noise of a full window as
  ``var_slice / k`` when slices are independent; the ratio of the quarter to the half variance checks that
  (2.0 for white noise; less means slow swings that a longer window averages less);
* the spread of the full windows' values across the boots of one config, minus that within-window part, is the
  between-boot variance, which only more boots reduce.

From the two, the projected 95 % half-width of an anchored cross-sweep comparison (two sweeps, the candidate and the
anchor ``n`` boots each in each, fixed sweep effects: variance of the difference ``4 s^2 / n`` with
``s^2 = var_boot + var_window / L`` for windows ``L`` times as long, t on ``4 (n - 1)`` df) and the GPU-minutes per
sweep (``2 n`` boots of the measured trial time, plus the longer windows of every cell). Assumptions: log-normal
noise, the within-window part scales as ``1 / L`` (checked by the quarter / half ratio), the between-boot part does
not depend on the window.

Where boots have 2 or more windows a cell (``repeats:``), the window noise is also measured directly
(:func:`direct_window_noise`: OLS of the log window values on boot and repeat, the repeat's seeded request mix being
the same in every boot) and printed beside the slices' estimate, with the between-boot SD beyond it
(``evidence/h100-2026-12-07-window-check``).

Run: ``python benchmarks/window_halves.py [EVIDENCE_DIR ...]`` (default: the two 8B anchored runs).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tunelab.stats.noise_model import variance_components  # noqa: E402
from tunelab.tasks.metrics import steady_interval  # noqa: E402

DEFAULT = ("evidence/h100-2026-12-07-versions-anchored", "evidence/h200-2026-12-03-aa-anchored")
METRICS = ("output_tokens_per_s", "tpot_p50_s")
WINDOW = ["trial_id", "workload", "load_kind", "load_value", "repeat"]


def load(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The ok trials, their measurements and their ok requests from an evidence folder's Parquet."""
    wh = folder / "warehouse"
    con = duckdb.connect()
    trials = con.execute(f"select * from read_parquet('{wh / 'trials.parquet'}') where status = 'ok'").df()
    meas = con.execute(f"select * from read_parquet('{wh / 'measurements.parquet'}')").df()
    req = con.execute(f"select * from read_parquet('{wh / 'requests.parquet'}') where ok").df()
    keep = set(trials.trial_id)
    return trials, meas[meas.trial_id.isin(keep)], req[req.trial_id.isin(keep)]


def slice_values(window: pd.DataFrame, target: float | None, k: int) -> list[dict]:
    """Output tokens/s and p50 TPOT of each of ``k`` equal time slices of one window's steady part.

    ``window``: the window's requests (``send_ts``, ``end_ts``, ``chunk_offsets_s``, ``output_tokens``,
    ``tpot_s``). Returns one dict per slice (``slice``, ``seconds``, ``output_tokens_per_s``, ``tpot_p50_s``,
    ``requests``); empty when the window has no steady part. ``k = 1`` reproduces the measurement's own figures.
    """
    iv = steady_interval(window.send_ts.to_numpy(float), window.end_ts.to_numpy(float), target)
    if iv is None:
        return []
    edges = np.linspace(iv.start_ts, iv.end_ts, k + 1)
    out = []
    for j in range(k):
        a, b = edges[j], edges[j + 1]
        tokens = 0.0
        for r in window.itertuples(index=False):
            offs = np.asarray(list(r.chunk_offsets_s if r.chunk_offsets_s is not None else []), dtype=float)
            if offs.size and r.output_tokens:
                ts = float(r.send_ts) + offs
                # the last slice is closed at the steady part's end, as the measurement counts it
                inside = (ts >= a) & ((ts < b) if j < k - 1 else (ts <= b))
                tokens += float(r.output_tokens) * float(inside.sum()) / offs.size
        sent = window[(window.send_ts >= a) & ((window.send_ts < b) if j < k - 1 else (window.send_ts <= b))]
        tpot = sent.tpot_s[(sent.output_tokens > 1) & sent.tpot_s.notna()].to_numpy(float)
        out.append({"slice": j, "seconds": b - a, "output_tokens_per_s": tokens / (b - a),
                    "tpot_p50_s": float(np.percentile(tpot, 50)) if tpot.size else math.nan,
                    "requests": int(len(sent))})
    return out


def slices(trials: pd.DataFrame, req: pd.DataFrame, k: int) -> pd.DataFrame:
    """Every window's ``k`` slices, long format: the window's keys, runtime and config, ``metric``, ``value``."""
    rows = []
    info = trials.set_index("trial_id")[["runtime_name", "config_key", "config_label", "sweep_id"]]
    for key, g in req.groupby(WINDOW, sort=False):
        tid, workload, kind, level, rep = key
        target = float(level) if kind == "concurrency" else None
        for s in slice_values(g, target, k):
            for m in METRICS:
                rows.append({"trial_id": tid, "workload": workload, "load_kind": kind, "load_value": level,
                             "repeat": rep, **info.loc[tid].to_dict(), "slice": s["slice"], "metric": m,
                             "value": s[m], "seconds": s["seconds"]})
    return pd.DataFrame(rows)


def components(trials: pd.DataFrame, req: pd.DataFrame) -> pd.DataFrame:
    """Per (sweep, runtime, config, cell, metric): boots, the variance across boots of a full window's value and
    of a slice's (same position in the window), and the split into within-window and between-boot parts.

    Why across boots at the same position, not slice against slice within a window: the window's requests are
    seeded (``tasks.measure``: the same prompts and output lengths in every boot), so a window has a pattern in
    time (its first half holds the ramp's prefills, say) that is the same in every boot. It moves no comparison,
    and slice-to-slice differences would count it as noise. With ``s_b^2`` between boots and a within-window
    part ``s_w^2`` for a full window that is white in time, a 1/k slice varies across boots as
    ``s_b^2 + k s_w^2``: least squares over k = 1, 2, 4 gives both (truncated at 0).
    """
    return split_variance({k: slices(trials, req, k) for k in (1, 2, 4)})


KEYS = ["sweep_id", "runtime_name", "config_label", "workload", "load_value", "metric"]


def split_variance(by_k: dict[int, pd.DataFrame], keys: list[str] = KEYS) -> pd.DataFrame:
    """:func:`components` from slices already cut: ``by_k[k]`` holds, per window cut in ``k`` (k = 1
    and 2 and 4), one row per slice with the ``keys``, ``trial_id`` (the boot), ``repeat``, ``slice`` (its position) and
    ``value`` (> 0). Returns the frame :func:`components` documents. Raises KeyError when one of them is missing."""
    rows = []
    for cell, g in by_k[1].groupby(keys, sort=True):
        if g.trial_id.nunique() < 2:
            continue
        var_k = {}
        for k, p in by_k.items():
            sel = p.set_index(keys).loc[[cell]].reset_index()
            sel = sel[np.isfinite(sel.value) & (sel.value > 0)]
            # per slice position: log value per boot (its windows averaged), variance across boots
            per = sel.assign(y=np.log(sel.value)).groupby(["slice", "trial_id"]).y.mean()
            v = per.groupby(level="slice").var(ddof=1)
            var_k[k] = float(v.mean())
        ks = np.array(sorted(var_k), dtype=float)
        vs = np.array([var_k[int(k)] for k in ks])
        slope, intercept = np.polyfit(ks, vs, 1)
        var_within, var_between = max(float(slope), 0.0), max(float(intercept), 0.0)
        rows.append({**dict(zip(keys, cell)), "boots": int(g.trial_id.nunique()),
                     "sd_boot_means": math.sqrt(var_k[1]), "sd_half_across_boots": math.sqrt(var_k[2]),
                     "sd_quarter_across_boots": math.sqrt(var_k[4]),
                     "sd_within_window": math.sqrt(var_within), "sd_between_boots": math.sqrt(var_between),
                     "var_within": var_within, "var_between": var_between})
    return pd.DataFrame(rows)


def projected_half_width(var_between: float, var_within: float, boots: int, longer: float) -> float:
    """95 % half-width (relative) of an anchored cross-sweep difference: 2 sweeps x (candidate, anchor) x ``boots``,
    windows ``longer`` times as long. Raises ValueError for boots < 2 or longer <= 0."""
    if boots < 2 or longer <= 0:
        raise ValueError(f"boots must be >= 2 and longer > 0, got {boots}, {longer}")
    se = math.sqrt(4 * (var_between + var_within / longer) / boots)
    return math.expm1(stats.t.ppf(0.975, 4 * (boots - 1)) * se)


def trial_minutes(trials: pd.DataFrame, meas: pd.DataFrame) -> tuple[float, float, int]:
    """Mean warm trial minutes, the minutes of one cell's window (duration + ramp + drain, with its warm-up
    share), and the cells a boot measures."""
    t = trials.assign(wall=(pd.to_datetime(trials.finished_at) - pd.to_datetime(trials.started_at)).dt.total_seconds())
    warm = t[t.compile_cache != "cold"].wall
    cells = meas.groupby(["workload", "load_value"]).ngroups
    window_s = float((meas.window_duration_s.fillna(meas.duration_s)).mean())
    return float((warm if len(warm) else t.wall).mean()) / 60, window_s / 60, cells


def report(folder: Path) -> str:
    trials, meas, req = load(folder)
    comp = components(trials, req)
    warm_min, window_min, cells = trial_minutes(trials, meas)
    gpu = trials.gpu_name.dropna().iloc[0] if trials.gpu_name.notna().any() else "?"
    lines = [f"## {folder.name} ({gpu}; {len(trials)} ok boots; warm trial {warm_min:.2f} min, "
             f"{cells} cells a boot, window {window_min * 60:.1f} s)", "",
             "| sweep | config | cell | metric | boots | SD across boots: full window | half | quarter | "
             "within-window SD | between-boot SD |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in comp.itertuples(index=False):
        lines.append(f"| {r.sweep_id[:15]} | {r.runtime_name} {r.config_label} | {r.workload} c={r.load_value:g} | "
                     f"{r.metric} | {r.boots} | {100 * r.sd_boot_means:.2f} % | {100 * r.sd_half_across_boots:.2f} % | "
                     f"{100 * r.sd_quarter_across_boots:.2f} % | {100 * r.sd_within_window:.2f} % | "
                     f"{100 * r.sd_between_boots:.2f} % |")
    pooled = (comp.groupby(["workload", "load_value", "metric"])[["var_within", "var_between"]].mean().reset_index())
    lines += ["", "Pooled over the sweeps and configs (mean of the variances), projected anchored cross-sweep "
              "half-widths (95 %) and GPU-minutes a sweep (candidate + anchor):", "",
              "| cell | metric | within SD | between SD | " + " | ".join(
                  f"{n} boots, {L:g}x window" for n, L in DESIGNS) + " |",
              "|---|---|---|---|" + "---|" * len(DESIGNS)]
    for r in pooled.itertuples(index=False):
        hw = [projected_half_width(r.var_between, r.var_within, n, L) for n, L in DESIGNS]
        lines.append(f"| {r.workload} c={r.load_value:g} | {r.metric} | {100 * math.sqrt(r.var_within):.2f} % | "
                     f"{100 * math.sqrt(r.var_between):.2f} % | " + " | ".join(f"+-{100 * h:.1f} %" for h in hw)
                     + " |")
    cost = [2 * n * (warm_min + cells * (L - 1) * window_min) for n, L in DESIGNS]
    lines.append("| GPU-minutes a sweep (warm trials) | | | | " + " | ".join(f"{c:.1f}" for c in cost) + " |")
    direct = direct_window_noise(trials, meas)
    if not direct.empty:
        pooled_w = pooled.set_index(["workload", "load_value", "metric"])
        lines += ["", "Measured directly (boots with >= 2 windows): OLS of the log window values on boot and repeat "
                  "(the repeat's seeded request mix is the same in every boot), beside the slices' within SD above:", "",
                  "| cell | metric | boots | windows | window SD ignoring the repeat | window SD | df | repeats' "
                  "range | slices' within SD | SD of boot means | between-boot SD (boot means less window part) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in direct.itertuples(index=False):
            key = (r.workload, r.load_value, r.metric)
            sl = math.sqrt(pooled_w.loc[key, "var_within"]) if key in pooled_w.index else math.nan
            per_boot = r.windows / r.boots
            between = math.sqrt(max(r.sd_boot_means**2 - r.sd_window**2 / per_boot, 0.0))
            lines.append(f"| {r.workload} c={r.load_value:g} | {r.metric} | {r.boots} | {r.windows} | "
                         f"{100 * r.sd_window_ignoring_repeat:.2f} % | {100 * r.sd_window:.2f} % | {r.df_window:g} | "
                         f"{100 * r.repeat_range:.1f} % | {100 * sl:.2f} % | {100 * r.sd_boot_means:.2f} % | "
                         f"{100 * between:.2f} % |")
    corr = engine_core_correlation(trials, meas)
    if not corr.empty:
        lines += ["", "Boots against the engine core's CPU: within each (sweep, runtime, config), the Pearson correlation "
                  "of a boot's log value with the busiest engine-core thread's CPU share in that window:", "",
                  "| cell | windows | engine-core busiest thread | corr with log output tokens/s | "
                  "corr with log p50 TPOT |", "|---|---|---|---|---|"]
        for r in corr.itertuples(index=False):
            lines.append(f"| {r.workload} c={r.load_value:g} | {r.windows} | {r.busy_min:.2f}-{r.busy_max:.2f} | "
                         f"{r.corr_output_tokens_per_s:+.2f} | {r.corr_tpot_p50_s:+.2f} |")
    return "\n".join(lines)


def engine_core_correlation(trials: pd.DataFrame, meas: pd.DataFrame) -> pd.DataFrame:
    """Per cell: within-config correlation of the window's log metric with the engine core's busiest thread.

    ``measurements.server_process_cpu`` (JSON, ``tasks.host_load``): ``engine_core.busiest_thread`` is the CPU
    time of vLLM's EngineCore process's busiest thread / window wall time. Values and the share are centred per
    (sweep, runtime, config), so a config or card effect does not make the correlation. Cells with fewer than 4
    windows are left out. Returns workload, load_value, windows, busy_min, busy_max and the two correlations.
    """
    import json
    m = meas.merge(trials[["trial_id", "sweep_id", "runtime_name", "config_key"]], on="trial_id")
    m = m[m.server_process_cpu.notna()].copy()
    if m.empty:
        return pd.DataFrame()
    m["busy"] = [json.loads(x).get("engine_core", {}).get("busiest_thread", math.nan) for x in m.server_process_cpu]
    group = ["sweep_id", "runtime_name", "config_key"]
    rows = []
    for (w, lv), g in m.groupby(["workload", "load_value"]):
        g = g[np.isfinite(g.busy)]
        if len(g) < 4:
            continue
        x = g.busy - g.groupby(group).busy.transform("mean")
        out = {"workload": w, "load_value": lv, "windows": len(g), "busy_min": g.busy.min(), "busy_max": g.busy.max()}
        for col in METRICS:
            y = np.log(g[col]) - np.log(g[col]).groupby([g[k] for k in group]).transform("mean")
            out[f"corr_{col}"] = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else math.nan
        rows.append(out)
    return pd.DataFrame(rows)


def direct_window_noise(trials: pd.DataFrame, meas: pd.DataFrame) -> pd.DataFrame:
    """Per cell and metric, the window-to-window noise measured directly, where boots have >= 2 windows (repeats).

    statsmodels OLS on the log window values of one cell, pooled over sweeps and configs:
    ``log y ~ C(trial_id) + C(repeat)``. The repeat is a fixed effect because its requests come from a seed of (plan
    seed, workload, level, repeat) (``tasks.measure``): repeat r draws the same lengths in every boot, so windows
    differ by their mix as well as by noise, and the mix cancels from every comparison. Returns ``workload,
    load_value, metric, boots, windows``, ``sd_window_ignoring_repeat`` (residual SD of ``log y ~ C(trial_id)``),
    ``sd_window`` (after the repeat too) with ``df_window``, ``repeat_range`` (max - min of the repeats' mean log
    values) and ``sd_boot_means`` (SD of the boots' mean log values). Empty when no boot has 2 windows."""
    import statsmodels.formula.api as smf

    m = meas[meas.trial_id.isin(trials.trial_id)]
    rows = []
    for (w, lv), g in m.groupby(["workload", "load_value"]):
        if g.groupby("trial_id").size().max() < 2 or g.trial_id.nunique() < 2:
            continue
        for col in METRICS:
            d = g[np.isfinite(g[col]) & (g[col] > 0)].assign(y=lambda x: np.log(x[col]), rep=lambda x: x.repeat.astype(str))
            f0 = smf.ols("y ~ C(trial_id)", d).fit()
            f1 = smf.ols("y ~ C(trial_id) + C(rep)", d).fit()
            if f1.df_resid < 1:
                continue
            reps = d.groupby("rep").y.mean()
            rows.append({"workload": w, "load_value": lv, "metric": col, "boots": d.trial_id.nunique(),
                         "windows": len(d), "sd_window_ignoring_repeat": math.sqrt(f0.scale),
                         "sd_window": math.sqrt(f1.scale), "df_window": float(f1.df_resid),
                         "repeat_range": float(reps.max() - reps.min()),
                         "sd_boot_means": float(d.groupby("trial_id").y.mean().std(ddof=1))})
    return pd.DataFrame(rows)


#: (boots per config per sweep, window length as a multiple of the measured one)
DESIGNS = ((3, 1.0), (3, 2.0), (3, 3.0), (4, 1.0), (4, 2.0), (5, 1.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", default=list(DEFAULT))
    args = ap.parse_args(argv)
    for f in args.folders:
        print(report(ROOT / f if not Path(f).is_absolute() else Path(f)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
