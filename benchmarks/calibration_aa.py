"""A/A calibration of tunelab's comparisons on the committed evidence and on simulations with drift and sweep shifts.

Evidence: for every committed evidence warehouse (``evidence/**/warehouse/*.parquet``) and every (runtime, config)
with an even number >= 4 of ok boots, the boots are split in two halves and one half relabelled as a twin config:
an A/A comparison (both sides are the same engine). Every balanced split is run (3 for 4 boots), each labelled
(a config with an even count >= 4 of boots in each of several sweeps is split within each sweep, and once sweep
against sweep):

* ``sweep-vs-sweep``: each half is the boots of one sweep (the nightly use: a config against itself a sweep later);
* ``early-vs-late``: the first half of the boots in start order against the second, within one sweep;
* ``interleaved``: any other balanced split (odd vs even, outer vs inner);
* ``run-vs-run (two evidence folders)``: no relabelling: a (runtime, config) that two committed runs (two sessions,
  possibly two cards) both measured with >= 2 boots a sweep, each sweep of one against each of the other, read as
  ``tunelab compare`` reads a cross-sweep comparison (its anchored "Across sweeps" rows only; anchored path).

Each split goes through two of the product's paths, 4 metrics (output tokens/s, p50 TPOT, p50 TTFT, p99 ITL) x
every cell:

* ``compare()``: ``tunelab.warehouse.compare.compare`` as ``tunelab compare`` runs it (history borrowed) on a
  warehouse built from the Parquet with the twin's ``config_key`` relabelled;
* ``anchored``: ``tunelab.stats.anchored.anchored_difference`` over the same boots (``warehouse.boot_rows``) and
  those of one anchor, as a plan's ``anchor:`` would give: another config measured in every sweep of the unit,
  on the same runtime (``default`` first); drift term on boot order when significant.

A false call is an interval that excludes 0. Per split type: the per-cell false-call rate with its 95 %
Clopper-Pearson interval (verdicts of one split share boots, so the binomial interval is optimistic: read it
with the split count) and the share of A/A reports (one split = one report of cells x metrics) with any false
call.

Simulations (``tunelab.stats.simulate_sweeps``; boot SD 2 %, sweep SD 5 %, drift 8 % over a sweep): the
anchored comparison against the naive Welch on boot values that ignores sweeps and order, for a config
against itself in two sweeps with the anchor interleaved (sweep-vs-sweep) and early-vs-late within one sweep.

The CPU calibration plan's own design (``experiments/cpu_aa_calibration.yaml``: the anchor and three twins, 4
balanced rounds): :func:`simulate_runtime` runs its early-vs-late split under normal, Student t (3 df), resampled
CPU boot residuals and random-walk wander noise; :func:`simulate_reports` draws whole CPU boots (16 cell-metric
residuals each, without replacement) so that a report's 16 verdicts are as dependent as real ones, and counts the
reports whose Holm-adjusted headline holds a false call.

Run: ``python benchmarks/calibration_aa.py [--sims 400] [--seed 20261203] [--runtime-sims 400] [--report-sims 200]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tunelab.reports.evidence import warehouse_from_parquet  # noqa: E402
from tunelab.stats.anchored import anchored_difference, interaction_variance  # noqa: E402
from tunelab.stats.simulate_sweeps import simulate_sweeps  # noqa: E402
from tunelab.warehouse.boot_rows import boot_rows  # noqa: E402
from tunelab.warehouse.compare import compare  # noqa: E402

METRICS = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s", "itl_p99_s")
TWIN = "~twin"
CELL = ["workload", "load_kind", "load_value"]


def evidence_warehouses(root: Path = ROOT / "evidence") -> list[Path]:
    """Every folder of committed evidence Parquet with trials and measurements."""
    return sorted(p.parent for p in root.glob("**/warehouse/trials.parquet")
                  if (p.parent / "measurements.parquet").exists())


def _split_type(a: pd.DataFrame, b: pd.DataFrame, ordered: list[str]) -> str:
    sa, sb = set(a.sweep_id), set(b.sweep_id)
    if len(sa) == 1 and len(sb) == 1 and sa != sb:
        return "sweep-vs-sweep"
    half = len(ordered) // 2
    if set(a.trial_id) in (set(ordered[:half]), set(ordered[half:])):
        return "early-vs-late"
    return "interleaved"


def splits_of(trials: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """Every balanced split of one unit's boots (trial rows in start order): (type, trial ids of the twin half).
    Each unordered split once (the half that holds the last boot is the twin)."""
    ordered = trials.sort_values(["started_at", "trial_id"]).trial_id.tolist()
    n = len(ordered)
    out = []
    for half in itertools.combinations(range(n), n // 2):
        if n - 1 not in half:
            continue
        twin = [ordered[i] for i in half]
        a, b = trials[~trials.trial_id.isin(twin)], trials[trials.trial_id.isin(twin)]
        out.append((_split_type(a, b, ordered), twin))
    return out


def _units_and_splits(trials: pd.DataFrame, max_boots: int):
    """(runtime, config) units of one folder with their splits: ``(label, (rt, key), boots, [(type, twin ids)])``.

    A config measured with an even count >= 4 of boots in each of several sweeps is split within each sweep (every
    balanced split: early-vs-late and interleaved, the anchor from that sweep) and, where there are two sweeps of
    equal count, once sweep against sweep; the balanced splits that mix the sweeps are left out (35 for 4 + 4 boots, each an interleaved split across sweeps,
    which the other units already cover). Otherwise the unit is all the config's boots, every balanced split."""
    for (rt, key), g in trials.groupby(["runtime_name", "config_key"]):
        per_sweep = g.groupby("sweep_id").size()
        if len(per_sweep) > 1 and ((per_sweep >= 4) & (per_sweep % 2 == 0)).all():
            for _, gs in g.groupby("sweep_id"):
                yield f"{rt}/{key} in {gs.sweep_id.iloc[0]}", (rt, key), gs, splits_of(gs)
            if len(per_sweep) == 2 and per_sweep.iloc[0] == per_sweep.iloc[1]:
                yield f"{rt}/{key}", (rt, key), g, [(k, t) for k, t in splits_of(g) if k == "sweep-vs-sweep"]
            continue
        if len(g) < 4 or len(g) % 2 or len(g) > max_boots:
            continue
        yield f"{rt}/{key}", (rt, key), g, splits_of(g)


def evidence_verdicts(folders: list[Path] | None = None, metrics: tuple[str, ...] = METRICS,
                      max_boots: int = 8) -> pd.DataFrame:
    """One row per (folder, unit, split, metric, cell, path): ``false_call`` (bool) and the interval."""
    rows = []
    for folder in folders if folders is not None else evidence_warehouses():
        with tempfile.TemporaryDirectory() as tmp:
            db = warehouse_from_parquet(folder, Path(tmp) / "w.duckdb")
            con = duckdb.connect(str(db))
            try:
                rows += _folder_verdicts(con, folder, metrics, max_boots)
            finally:
                con.close()
    return pd.DataFrame(rows)


def _folder_verdicts(con, folder: Path, metrics, max_boots: int) -> list[dict]:
    trials = con.execute("""SELECT trial_id, sweep_id, runtime_name, config_key, started_at FROM trials
                            WHERE status = 'ok' AND quality_verdict IN ('pass', 'warn')""").fetchdf()
    values = {m: boot_rows(con, m) for m in metrics}
    out = []
    for unit, (rt, key), g, splits in _units_and_splits(trials, max_boots):
        sweeps = set(g.sweep_id)
        for s_i, (kind, twin) in enumerate(splits):
            con.execute("UPDATE trials SET config_key = config_key || ? WHERE trial_id IN (SELECT unnest(?))",
                        [TWIN, twin])
            try:
                for m in metrics:
                    res = compare(con, {"config_key": key, "runtime_name": rt},
                                  {"config_key": key + TWIN, "runtime_name": rt}, m)
                    for r in res.itertuples(index=False):
                        lo, hi = r.rel_ci_low, r.rel_ci_high
                        out.append({"folder": folder.relative_to(ROOT).as_posix(), "unit": unit,
                                    "split": s_i, "split_type": kind, "metric": m,
                                    "cell": f"{r.workload} {r.load_kind}={r.load_value:g}", "path": "compare()",
                                    "rel_low": lo, "rel_high": hi, "p_value": r.p_value,
                                    "false_call": bool(np.isfinite(lo) and (lo > 0 or hi < 0))})
            finally:
                con.execute("UPDATE trials SET config_key = replace(config_key, ?, '') WHERE trial_id IN "
                            "(SELECT unnest(?))", [TWIN, twin])
            for m in metrics:
                v = values[m][values[m].sweep_id.isin(sweeps)].copy()
                v["config"] = v.runtime_name + "/" + v.config_key
                v.loc[v.trial_id.isin(twin), "config"] = f"{rt}/{key}{TWIN}"
                v = v.rename(columns={"sweep_id": "sweep", "boot_order": "order"})
                anchor = _anchor_for(v, rt, key, sweeps)
                # as ``warehouse.anchored_compare.anchored_cells`` gives it: the config x sweep interaction from
                # every config of these sweeps but the two compared (only a cross-sweep split uses it)
                others = v[~v.config.isin([f"{rt}/{key}", f"{rt}/{key}{TWIN}"])]
                v = v[v.config.isin([f"{rt}/{key}", f"{rt}/{key}{TWIN}", anchor])]
                for cell, c in v.groupby(CELL):
                    o = others[(others[CELL] == pd.Series(cell, index=CELL)).all(axis=1)]
                    inter = interaction_variance(o[["config", "sweep", "order", "value"]]) if len(o) else (np.nan, 0.0)
                    r = anchored_difference(c[["config", "sweep", "order", "value"]], f"{rt}/{key}",
                                            f"{rt}/{key}{TWIN}", anchor, interaction_var=inter if inter[1] > 0 else None)
                    out.append({"folder": folder.relative_to(ROOT).as_posix(), "unit": unit, "split": s_i,
                                "split_type": kind, "metric": m, "cell": f"{cell[0]} {cell[1]}={cell[2]:g}",
                                "path": "anchored", "rel_low": r.rel_low, "rel_high": r.rel_high,
                                "p_value": r.p_value, "false_call": bool(np.isfinite(r.rel_low) and (r.rel_low > 0 or r.rel_high < 0))})
    return out


RUN_VS_RUN = "run-vs-run (two evidence folders)"


def _units(folder: Path) -> dict[tuple[str, str], dict[str, int]]:
    """(runtime, config_key) -> {sweep_id: ok boots} of one evidence folder (quality pass or warn)."""
    t = pd.read_parquet(folder / "trials.parquet", columns=["sweep_id", "runtime_name", "config_key", "status",
                                                            "quality_verdict"])
    t = t[(t.status == "ok") & t.quality_verdict.isin(["pass", "warn"])]
    out: dict[tuple[str, str], dict[str, int]] = {}
    for (rt, key, sw), g in t.groupby(["runtime_name", "config_key", "sweep_id"]):
        out.setdefault((rt, key), {})[sw] = len(g)
    return out


def _plans_name_an_anchor(folder: Path) -> bool:
    """Whether a sweep of the folder recorded a plan with an ``anchor:`` (``sweeps.plan_yaml``)."""
    import yaml

    if not (folder / "sweeps.parquet").exists():
        return False
    for text in pd.read_parquet(folder / "sweeps.parquet", columns=["plan_yaml"]).plan_yaml.dropna():
        try:
            plan = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(plan, dict) and plan.get("anchor"):
            return True
    return False


def across_run_verdicts(folders: list[Path] | None = None, metrics: tuple[str, ...] = METRICS) -> list[dict]:
    """A/A across runs: a (runtime, config) measured in two committed evidence folders (two sessions, maybe two
    cards) with >= 2 ok boots in a sweep of each, compared sweep against sweep as ``tunelab compare --baseline
    sweep=S1,... --candidate sweep=S2,...`` reads it (``flows.compare.compare``, its "Across sweeps" rows): only the
    rows anchored through a config both runs booted count (an unanchored row or the anchor against itself is left
    out). A false call is an anchored verdict other than "no significant change"."""
    folders = folders if folders is not None else evidence_warehouses()
    from tunelab.flows.compare import compare as compare_flow

    # only runs whose plans named an anchor (``anchor:`` in the recorded plan): without one, compare's rows across
    # sweeps are unanchored and not counted, and building their joined warehouses cost minutes
    folders = [f for f in folders if _plans_name_an_anchor(f)]
    units = {f: _units(f) for f in folders}
    out: list[dict] = []
    for one, other in itertools.combinations(folders, 2):  # an A/A: which side is which does not matter
        shared = [u for u in units[one] if u in units[other]]
        if len(shared) < 2:  # the unit and an anchor
            continue
        with tempfile.TemporaryDirectory() as tmp:
            db = warehouse_from_parquet(one, Path(tmp) / "w.duckdb", other)
            for rt, key in shared:
                for s1, n1 in units[one][(rt, key)].items():
                    for s2, n2 in units[other][(rt, key)].items():
                        if n1 < 2 or n2 < 2:
                            continue
                        b, c = ({"sweep_id": s, "config_key": key, "runtime_name": rt} for s in (s1, s2))
                        for m in metrics:
                            res = compare_flow.fn(b, c, metric=m, db=str(db), with_regressions=False)
                            for r in res["anchored"]:
                                if not r.get("anchored") or r.get("anchor") == f"{rt}/{key}":
                                    continue
                                out.append({"folder": f"{one.relative_to(ROOT).as_posix()} + "
                                                      f"{other.relative_to(ROOT).as_posix()}",
                                            "unit": f"{rt}/{key}", "split": f"{s1}|{s2}", "split_type": RUN_VS_RUN,
                                            "metric": m, "cell": f"{r['workload']} {r['load_kind']}={r['load_value']:g}",
                                            "path": "anchored", "rel_low": r["rel_low"], "rel_high": r["rel_high"],
                                            "p_value": r["p_value"],
                                            "false_call": r["verdict"] != "no significant change"})
    return out


def _anchor_for(v: pd.DataFrame, rt: str, key: str, sweeps: set[str]) -> str | None:
    """The anchor of a unit's A/A, as a plan would name it: another config measured in every one of the unit's
    sweeps, on the same runtime where one exists (the ``default`` config first), else on another runtime."""
    per = v.groupby("config").sweep.nunique()
    cands = [c for c in per.index if per[c] == len(sweeps) and not c.startswith(f"{rt}/{key}")]
    labels = v.drop_duplicates("config").set_index("config").config_label
    cands.sort(key=lambda c: (not c.startswith(f"{rt}/"), labels.get(c) != "default", c))
    return cands[0] if cands else None


def _holm_false(g: pd.DataFrame, alpha: float = 0.05) -> bool:
    """True when some false call of one report survives Holm's adjustment of the report's p-values (statsmodels
    ``multipletests``, the method ``stats.family.family_adjust`` uses); rows without a p-value are not tested."""
    ok = g.p_value.notna().to_numpy() & np.isfinite(g.p_value.to_numpy(dtype=float))
    if not ok.any():
        return False
    reject = multipletests(g.p_value.to_numpy(dtype=float)[ok], alpha=alpha, method="holm")[0]
    return bool((reject & g.false_call.to_numpy()[ok]).any())


def summarise(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Per (path, split type, and 'all'): verdicts, false calls, the rate and its 95 % Clopper-Pearson interval,
    reports (splits), the share of reports with any false call and its interval."""
    rows = []
    v = verdicts.assign(report=verdicts.folder + "|" + verdicts.unit + "|" + verdicts.split.astype(str))
    for path, gp in v.groupby("path", sort=False):
        for kind, g in [*gp.groupby("split_type"), ("all", gp)]:
            n, k = len(g), int(g.false_call.sum())
            lo, hi = proportion_confint(k, n, alpha=0.05, method="beta")
            rep = g.groupby("report").false_call.any()
            rlo, rhi = proportion_confint(int(rep.sum()), len(rep), alpha=0.05, method="beta")
            # The headline a report shows: its verdicts Holm-adjusted as one family (stats.family, as `tunelab
            # compare` adjusts one report's cells x metrics); a false headline is a false call that survives it.
            held = g.groupby("report")[["p_value", "false_call"]].apply(_holm_false)
            hlo, hhi = proportion_confint(int(held.sum()), len(held), alpha=0.05, method="beta")
            rows.append({"path": path, "split_type": kind, "verdicts": n, "false_calls": k, "rate": k / n,
                         "rate_low": lo, "rate_high": hi, "reports": len(rep), "reports_with_false": int(rep.sum()),
                         "report_rate": float(rep.mean()), "report_low": rlo, "report_high": rhi,
                         "reports_with_false_holm": int(held.sum()), "holm_rate": float(held.mean()),
                         "holm_low": hlo, "holm_high": hhi})
    return pd.DataFrame(rows)


SIM_LAYOUTS = {
    # a config against itself a sweep later, the anchor interleaved (balanced order) in both sweeps
    "sweep-vs-sweep": ([["a", "anchor", "a", "a", "anchor", "a"], ["b", "anchor", "b", "b", "anchor", "b"]], 0.0),
    # the first three boots of a config against its last three in one sweep, the anchor between them, drifting
    "early-vs-late": ([["anchor", "a", "anchor", "a", "anchor", "a", "anchor", "b", "anchor", "b", "anchor", "b",
                        "anchor"]], 0.08),
}


def simulate(n: int = 400, seed: int = 20261203, sd_boot: float = 0.02, sd_sweep: float = 0.05) -> pd.DataFrame:
    """Per simulated layout and path (anchored, naive Welch): A/A false calls of ``n`` comparisons."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind, (layout, drift) in SIM_LAYOUTS.items():
        k_anch = k_naive = 0
        for _ in range(n):
            d = simulate_sweeps(layout, sd_boot=sd_boot, sd_sweep=sd_sweep, drift=drift * rng.choice([-1, 1]),
                                rng=rng)
            r = anchored_difference(d, "a", "b", "anchor")
            k_anch += r.rel_low > 0 or r.rel_high < 0
            k_naive += r.welch_p_value < 0.05
        for path, k in (("anchored", k_anch), ("naive Welch (no sweep, no order)", k_naive)):
            lo, hi = proportion_confint(k, n, alpha=0.05, method="beta")
            rows.append({"path": path, "split_type": f"simulated {kind}", "verdicts": n, "false_calls": int(k),
                         "rate": k / n, "rate_low": lo, "rate_high": hi})
    return pd.DataFrame(rows)


#: the noise conditions of :func:`simulate_runtime`: (label, simulate_sweeps keyword arguments)
RUNTIME_NOISE = (
    ("normal", {}),
    ("Student t, 3 df (heavy tails)", {"noise_df": 3.0}),
    ("resampled CPU boot residuals", {"noise_pool": "cpu"}),
    ("random-walk wander, SD = boot SD", {"sd_wander": 0.1}),
)


def runtime_residual_vectors(folders: list[Path] | None = None, metrics: tuple[str, ...] = METRICS) -> np.ndarray:
    """Standardised boot residuals of the CPU A/A evidence, one row per boot: shape ``(boots, cells x metrics)``,
    unitless. Per (sweep, cell, metric), each ok boot's log value less its config's mean in that sweep, times
    ``sqrt(n_c / (n_c - 1))`` (``n_c`` the config's boots there, so that a residual has the boot noise's variance),
    divided by the SD of those residuals. Configs with one boot in a sweep and boots without every (cell, metric) are
    left out. A row keeps one boot's residuals together, so resampling rows keeps how cells and metrics of a boot
    move together (their correlation) as well as the runtime's tails. ``folders``: warehouse folders (default: every
    ``evidence/cpu-aa-calibration-*/warehouse``)."""
    folders = folders if folders is not None else sorted((ROOT / "evidence").glob("cpu-aa-calibration-*/warehouse"))
    cols = []
    for folder in folders:
        with tempfile.TemporaryDirectory() as tmp:
            db = warehouse_from_parquet(folder, Path(tmp) / "w.duckdb")
            con = duckdb.connect(str(db))
            try:
                for m in metrics:
                    v = boot_rows(con, m).assign(y=lambda d: np.log(d.value))
                    for cell, g in v.groupby(["sweep_id", *CELL]):
                        by = g.groupby("config_key").y
                        n_c = by.transform("size").to_numpy(float)
                        r = (g.y - by.transform("mean")).to_numpy(float) * np.sqrt(n_c / np.maximum(n_c - 1, 1))
                        keep = n_c >= 2
                        if keep.sum() >= 4 and r[keep].std() > 0:
                            cols.append(pd.Series(r[keep] / r[keep].std(), index=g.trial_id.to_numpy()[keep],
                                                  name=(folder.parent.name, m, *cell[1:])))
            finally:
                con.close()
    by_folder: dict[str, list[pd.Series]] = {}
    for c in cols:
        by_folder.setdefault(c.name[0], []).append(c.rename(c.name[1:]))
    # one frame per folder (its boots x its cells and metrics, a sweep's column filled by that sweep's boots)
    frames = [pd.concat(v, axis=1).T.groupby(level=list(range(len(v[0].name)))).first().T for v in by_folder.values()]
    return np.vstack([f.dropna().to_numpy(float) for f in frames])


def runtime_residuals(folders: list[Path] | None = None) -> np.ndarray:
    """:func:`runtime_residual_vectors` flattened: shape ``(boots x cells x metrics,)``, the pool of boot noise."""
    return runtime_residual_vectors(folders).ravel()


def _cpu_plan_order() -> list[str]:
    """The boot order of one sweep of ``experiments/cpu_aa_calibration.yaml``: 4 balanced rounds of the anchor and
    three twins, the anchor in the middle of each round (``core.trial_order``)."""
    from tunelab.core.trial_order import boot_order

    return boot_order([["twin1", "anchor", "twin2", "twin3"]] * 4, "balanced", anchor="anchor")


def simulate_runtime(n: int = 300, seed: int = 20261207, sd_boot: float = 0.1) -> pd.DataFrame:
    """Early-vs-late A/A in the CPU calibration plan's own design, under four boot-noise conditions (
    :data:`RUNTIME_NOISE`): the anchor and three twins, 4 balanced rounds (``core.trial_order``, the anchor in the
    middle of each round: 16 boots), each twin's first 2 boots against its last 2 with the anchor's 4, as
    :func:`evidence_verdicts` splits ``experiments/cpu_aa_calibration.yaml``'s sweeps. ``n`` sweeps per condition, 3
    verdicts each. Answers whether the anchored path's early-vs-late rate on real CPU sweeps above nominal comes
    from the heavy tails or from a wander that a linear drift term cannot remove, or is chance."""
    order = _cpu_plan_order()
    pool = runtime_residuals()
    rng = np.random.default_rng(seed)
    rows = []
    for label, kw in RUNTIME_NOISE:
        kw = {**kw, "noise_pool": pool} if kw.get("noise_pool") == "cpu" else kw
        k = tot = 0
        for _ in range(n):
            d = simulate_sweeps([order], sd_boot=sd_boot, sd_sweep=0.0, rng=rng, **kw)
            for twin in ("twin1", "twin2", "twin3"):
                late = d.index[d.config == twin][2:]
                dd = d[d.config.isin([twin, "anchor"])].copy()
                dd.loc[late, "config"] = twin + TWIN
                with warnings.catch_warnings():
                    # resampled residuals can give a side two equal values: scipy's Welch (beside the verdict,
                    # not the verdict) warns of precision loss there
                    warnings.simplefilter("ignore", RuntimeWarning)
                    r = anchored_difference(dd, twin, twin + TWIN, "anchor")
                k += bool(r.rel_low > 0 or r.rel_high < 0)
                tot += 1
        lo, hi = proportion_confint(k, tot, alpha=0.05, method="beta")
        rows.append({"path": "anchored", "split_type": f"simulated early-vs-late, CPU plan order, {label}",
                     "verdicts": tot, "false_calls": k, "rate": k / tot, "rate_low": lo, "rate_high": hi})
    return pd.DataFrame(rows)


def simulate_reports(n: int = 100, seed: int = 20261207, sd_boot: float = 0.1) -> pd.DataFrame:
    """A/A reports in the CPU calibration plan's design with the runtime's own boots: each simulated sweep (16 boots
    in the plan's balanced order, :func:`simulate_runtime`) draws whole boot residual vectors
    (:func:`runtime_residual_vectors`, 4 cells x 4 metrics) without replacement, so the 16 verdicts of a report are
    as dependent as real ones and no side holds the same boot twice. Per twin, first 2 boots against last 2 with
    the anchor's 4: 16 anchored verdicts, one report, Holm-adjusted as ``tunelab compare`` adjusts a report
    (:func:`_holm_false`). One row: per-cell false calls and reports with a false headline, with their 95 %
    Clopper-Pearson intervals (``n`` sweeps, 3 reports each)."""
    order = _cpu_plan_order()
    vecs = runtime_residual_vectors()
    rng = np.random.default_rng(seed)
    k_cell = n_cell = k_rep = 0
    for _ in range(n):
        # without replacement: two boots of one side drawn as the same boot would have no spread, which no real
        # pair has (with replacement the ties alone took the per-cell rate from 5.0 % to 6.0 %)
        draw = vecs[rng.choice(len(vecs), size=len(order), replace=False)]
        for twin in ("twin1", "twin2", "twin3"):
            rows = [k for k, c in enumerate(order) if c in (twin, "anchor")]
            late = [k for k, c in enumerate(order) if c == twin][2:]
            cfg = [twin + TWIN if k in late else order[k] for k in rows]
            ps, falses = [], []
            for j in range(vecs.shape[1]):
                d = pd.DataFrame({"config": cfg, "sweep": "s0", "order": rows,
                                  "value": np.exp(5.0 + sd_boot * draw[rows, j])})
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # Welch beside the verdict on equal draws
                    r = anchored_difference(d, twin, twin + TWIN, "anchor")
                ps.append(r.p_value)
                falses.append(bool(r.rel_low > 0 or r.rel_high < 0))
            k_cell += sum(falses)
            n_cell += len(falses)
            k_rep += _holm_false(pd.DataFrame({"p_value": ps, "false_call": falses}))
    lo, hi = proportion_confint(k_cell, n_cell, alpha=0.05, method="beta")
    rlo, rhi = proportion_confint(k_rep, 3 * n, alpha=0.05, method="beta")
    return pd.DataFrame([{"path": "anchored", "split_type": "simulated early-vs-late reports, CPU plan order, resampled "
                          "CPU boots (whole vectors)", "verdicts": n_cell, "false_calls": k_cell, "rate": k_cell / n_cell,
                          "rate_low": lo, "rate_high": hi, "reports": 3 * n, "reports_with_false_holm": k_rep,
                          "holm_rate": k_rep / (3 * n), "holm_low": rlo, "holm_high": rhi}])


def _table(df: pd.DataFrame, report: bool) -> str:
    head = "| path | split | verdicts | false calls | per-cell rate [95 % CI] |"
    sep = "|---|---|---|---|---|"
    if report:
        head += " A/A reports | with any false call, per cell [95 % CI] | with a false headline, Holm [95 % CI] |"
        sep += "---|---|---|"
    lines = [head, sep]
    for r in df.itertuples(index=False):
        line = (f"| {r.path} | {r.split_type} | {r.verdicts} | {r.false_calls} | {r.rate:.1%} "
                f"[{r.rate_low:.1%}, {r.rate_high:.1%}] |")
        if report:
            line += (f" {r.reports} | {r.reports_with_false} = {r.report_rate:.0%} [{r.report_low:.0%}, "
                     f"{r.report_high:.0%}] | {r.reports_with_false_holm} = {r.holm_rate:.0%} [{r.holm_low:.0%}, "
                     f"{r.holm_high:.0%}] |")
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=400, help="simulated A/A comparisons per layout")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--runtime-sims", type=int, default=400, help="simulated sweeps per noise condition")
    ap.add_argument("--report-sims", type=int, default=200, help="simulated sweeps of whole resampled boots")
    a = ap.parse_args()
    t0 = time.perf_counter()
    ev = evidence_verdicts()
    ev = pd.concat([ev, pd.DataFrame(across_run_verdicts())], ignore_index=True)
    within = ev[ev.split_type != RUN_VS_RUN]
    runs = ev[ev.split_type == RUN_VS_RUN]
    print(f"evidence: {within.folder.nunique()} folder(s) with a config of >= 4 ok boots, "
          f"{within.groupby(['folder', 'unit']).ngroups} (runtime, config) units, "
          f"{within.groupby(['folder', 'unit', 'split']).ngroups} A/A splits, "
          f"{len(within[within.path == 'anchored'])} verdicts per path; across runs: "
          f"{runs.groupby(['folder', 'unit', 'split']).ngroups} sweep pairs of {runs.folder.nunique()} folder pair(s), "
          f"{len(runs)} anchored verdicts")
    print(_table(summarise(ev), report=True))
    print()
    print(f"simulations: {a.sims} A/A per row, boot SD 2 %, sweep SD 5 %, drift 8 % over a sweep (seed {a.seed})")
    print(_table(simulate(a.sims, a.seed), report=False))
    print()
    print(f"the CPU calibration plan's design (anchor + 3 twins, 4 balanced rounds), early-vs-late, {a.runtime_sims} "
          "sweeps per row (3 verdicts each), boot SD 10 %, no drift")
    print(_table(simulate_runtime(a.runtime_sims), report=False))
    rep = simulate_reports(a.report_sims).iloc[0]
    print(f"\nreports, the same design with whole resampled boots, {a.report_sims} sweeps: per cell "
          f"{rep.false_calls} of {rep.verdicts} = {rep.rate:.1%} [{rep.rate_low:.1%}, {rep.rate_high:.1%}]; reports "
          f"with a false headline (Holm over 16) {rep.reports_with_false_holm} of {rep.reports} = {rep.holm_rate:.1%} "
          f"[{rep.holm_low:.1%}, {rep.holm_high:.1%}]")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
