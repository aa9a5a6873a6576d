"""Resolution of an interleaved A/B run: interval widths, GPU-minutes, time spent measuring, and what the
sequential rule would have decided pair by pair. Prints figures; asserts nothing.

Input: an evidence folder with ``warehouse/*.parquet`` (``tunelab export``), e.g. the H200 run of
``experiments/gpu_h200_resolution.yaml``; a baseline config label and one or more candidate labels.

For each candidate against the baseline, per cell (workload x load level) and metric:

* ``fixed``: tunelab's A/B (``warehouse.compare.compare``: boot means, log ratio, t interval with the variance
  pooled from history / moderated across cells), its 95 % interval and minimum detectable effect (MDE, 80 %
  power);
* ``paired``: the paired t interval of the log ratios of adjacent boots (boot i of A and boot i of B ran one
  after the other, so slow drift of the host cancels), no borrowing: the plain fixed-sample figure;
* ``paired_eb``: tunelab's paired A/B (``compare(paired=True)``): the same pairs, their variance moderated
  across cells (empirical Bayes, df capped for the cells' shared boots), and its half-width ``paired_hw``;
* ``seq``: ``stats.sequential.sequential_ab`` replayed on the pairs in boot order with the plan's alpha split
  over the cells (Bonferroni), the pair at which it would have stopped for this cell, and its interval then.

Cost per A/B: GPU-minutes = wall time of the two configs' trials (start -> finish: boot, warm-up, windows,
teardown; a shared control counts half to each A/B it serves), and the fraction of it inside measured windows.
Noise: per config and cell, the boot-to-boot CV of the boot means and the CV between windows of one boot
(``tunelab.warehouse.noise_history.noise_model``).

Run: ``python benchmarks/resolution_report.py evidence/<run> --baseline default``
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
from scipy import stats

from tunelab.reports.evidence import warehouse_from_parquet
from tunelab.stats.sequential import sequential_ab
from tunelab.warehouse.compare import compare, metric_direction
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.noise_history import noise_model

METRICS = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s", "e2el_p50_s", "itl_p99_s")


def _boot_means(con, sel: dict, metric: str) -> pd.DataFrame:
    where = " AND ".join(f"f.{k} = ?" for k in sel)
    return con.execute(
        f"""SELECT f.trial_id, t.started_at, m.workload, m.load_kind, m.load_value, avg(m.{metric}) AS v
            FROM measurements m JOIN trial_facts f USING (trial_id) JOIN trials t USING (trial_id)
            WHERE {where} AND f.status = 'ok' AND f.quality_verdict IN ('pass', 'warn')
            GROUP BY ALL ORDER BY t.started_at""", list(sel.values())).fetchdf()


def _paired(b: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
    n = min(len(b), len(c))
    d = np.log(c[:n]) - np.log(b[:n])
    if n < 2:
        return math.nan, math.nan, math.nan
    hw = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
    return math.expm1(d.mean()), math.expm1(d.mean() - hw), math.expm1(d.mean() + hw)


def _cost(con, labels: list[str], shared: str, n_ab: int, runtime: str | None) -> tuple[float, float]:
    t = con.execute(
        """SELECT f.config_label, f.trial_id, epoch(f.finished_at) - epoch(f.started_at) AS wall_s
           FROM trials f WHERE f.config_label IN (SELECT unnest(?)) AND (? IS NULL OR f.runtime_name = ?)""",
        [labels, runtime, runtime]).fetchdf()
    w = con.execute(
        """SELECT m.trial_id, sum(m.duration_s) AS measured_s FROM measurements m GROUP BY ALL""").fetchdf()
    t = t.merge(w, on="trial_id", how="left").fillna({"measured_s": 0.0})
    share = np.where(t["config_label"] == shared, 1.0 / n_ab, 1.0)
    gpu_min = float((t["wall_s"] * share).sum() / 60)
    frac = float((t["measured_s"] * share).sum() / (t["wall_s"] * share).sum())
    return gpu_min, frac


def _history_sd(run_dir: Path | None, metric: str, runtime: str | None) -> dict:
    """(workload, load_value) -> (prior_sd, prior_df): the between-boot SD of log boot means pooled over the
    configs of an earlier run (its own warehouse), on its degrees of freedom."""
    if run_dir is None:
        return {}
    db = Path(tempfile.mkdtemp()) / "h.duckdb"
    warehouse_from_parquet(run_dir / "warehouse", db)
    con = connect(db)
    try:
        nm = noise_model(con, metric)
    finally:
        con.close()
    if runtime:
        nm = nm[nm.runtime_name == runtime]
    out = {}
    for (wl, lv), g in nm.dropna(subset=["var_boot"]).groupby(["workload", "load_value"]):
        df = float(g["df_boot"].sum())
        if df > 0:
            out[(wl, float(lv))] = (math.sqrt(float((g["var_boot"] * g["df_boot"]).sum()) / df), df)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--baseline", default="default")
    ap.add_argument("--candidates", nargs="*", default=None, help="config labels (default: every other)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--runtime", default=None, help="only this runtime's trials (a runtime_name)")
    ap.add_argument("--history", type=Path, default=None,
                    help="an earlier evidence folder of the same runtime, GPU and model: its between-boot SD is the "
                         "sequential rule's prior_sd (the noise model's history)")
    a = ap.parse_args()
    db = Path(tempfile.mkdtemp()) / "w.duckdb"
    warehouse_from_parquet(a.run_dir / "warehouse", db)
    con = connect(db)
    labels = [r[0] for r in con.execute("SELECT DISTINCT config_label FROM trial_facts ORDER BY 1").fetchall()]
    cands = a.candidates or [x for x in labels if x != a.baseline]
    print(f"configs: {labels}; baseline {a.baseline!r}")
    trials = con.execute("""SELECT config_label, replicate, status, quality_verdict, round(boot_s, 1) AS boot_s,
                                   compile_cache, round(epoch(finished_at) - epoch(started_at), 1) AS wall_s
                            FROM trials ORDER BY started_at""").fetchdf()
    print(trials.to_string(index=False))
    for cand in cands:
        gpu_min, frac = _cost(con, [a.baseline, cand], a.baseline, len(cands), a.runtime)
        print(f"\n## {cand} vs {a.baseline}: {gpu_min:.1f} GPU-minutes (shared control counted 1/{len(cands)}), "
              f"{frac:.0%} of it measuring")
        rows = []
        for metric in METRICS:
            hib = metric_direction(metric) > 0
            hist = _history_sd(a.history, metric, a.runtime)
            rt = {"runtime_name": a.runtime} if a.runtime else {}
            sel_b, sel_c = {"config_label": a.baseline, **rt}, {"config_label": cand, **rt}
            fx = compare(con, sel_b, sel_c, metric)
            px = compare(con, sel_b, sel_c, metric, paired=True)
            bb, cc = _boot_means(con, sel_b, metric), _boot_means(con, sel_c, metric)
            cells = fx[["workload", "load_kind", "load_value"]].drop_duplicates().itertuples(index=False)
            n_cells = len(fx) * len(METRICS)
            for wl, kind, val in cells:
                key = (bb.workload == wl) & (bb.load_kind == kind) & (bb.load_value == val)
                b = bb[key]["v"].to_numpy()
                key = (cc.workload == wl) & (cc.load_kind == kind) & (cc.load_value == val)
                c = cc[key]["v"].to_numpy()
                f = fx[(fx.workload == wl) & (fx.load_kind == kind) & (fx.load_value == val)].iloc[0]
                pe = px[(px.workload == wl) & (px.load_kind == kind) & (px.load_value == val)].iloc[0]
                p_rel, p_lo, p_hi = _paired(b, c)
                stop = None
                sv = None
                for k in range(2, min(len(b), len(c)) + 1):
                    prior_sd, prior_df = hist.get((wl, float(val)), (None, None))
                    sv = sequential_ab(b[:k], c[:k], higher_is_better=hib, alpha=a.alpha / n_cells, margin=0.05,
                                       prior_sd=prior_sd, prior_df=prior_df)
                    if sv.decided:
                        stop = k
                        break
                rows.append({
                    "cell": f"{wl} {kind}={val:g}", "metric": metric, "boots": f"{len(b)}v{len(c)}",
                    "rel": f"{f.rel_diff:+.1%}", "fixed_ci": f"[{f.rel_ci_low:+.1%}, {f.rel_ci_high:+.1%}]",
                    "fixed_hw": f"{(f.rel_ci_high - f.rel_ci_low) / 2:.1%}", "mde": f"{f.mde_rel:.1%}",
                    "verdict": f.verdict,
                    "paired_ci": f"[{p_lo:+.1%}, {p_hi:+.1%}]" if math.isfinite(p_lo) else "-",
                    "paired_eb": (f"{pe.verdict} [{pe.rel_ci_low:+.1%}, {pe.rel_ci_high:+.1%}]"
                                  if math.isfinite(pe.rel_ci_low) else pe.verdict),
                    "paired_hw": f"{(pe.rel_ci_high - pe.rel_ci_low) / 2:.1%}" if math.isfinite(pe.rel_ci_low) else "-",
                    "seq": (f"{sv.call} at pair {stop}" if stop else f"undecided after {sv.n_pairs if sv else 0}"),
                    "seq_ci": (f"[{sv.ci_low:+.1%}, {sv.ci_high:+.1%}]" if sv else "-"),
                })
        print(pd.DataFrame(rows).to_string(index=False))
    print("\n## noise per config and cell (CV of boot means; CV between windows of one boot)")
    for metric in ("output_tokens_per_s", "tpot_p50_s"):
        nm = noise_model(con, metric)
        cols = [c for c in ("config_key", "workload", "load_value", "boots", "windows", "mean_value", "sd_boot_rel",
                            "sd_window_rel", "boot_s", "window_s") if c in nm.columns]
        keys = con.execute("SELECT DISTINCT config_key, config_label FROM trial_facts").fetchdf()
        nm = nm.merge(keys, on="config_key", how="left")
        print(f"\n{metric}")
        print(nm[["config_label", *[c for c in cols if c != "config_key"]]].round(4).to_string(index=False))
    cov = con.execute("""SELECT f.config_label, m.workload, m.load_value, round(avg(m.host_other_cpu_frac), 3) AS other_cpu,
                                round(avg(m.host_steal_frac), 4) AS steal, round(avg(m.host_cpu_mhz)) AS cpu_mhz,
                                any_value(m.server_cpus) AS server_cpus
                         FROM measurements m JOIN trial_facts f USING (trial_id) GROUP BY ALL ORDER BY ALL""")
    try:
        print("\n## host covariates per cell\n" + cov.fetchdf().to_string(index=False))
    except duckdb.Error:
        pass
    con.close()


if __name__ == "__main__":
    main()
