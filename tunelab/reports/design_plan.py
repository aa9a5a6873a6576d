"""Design from the noise model (issue 14 item 3): a plan's ``precision:`` turned into counts, and the check of
what a sweep reached against it (item 7).

A plan with ``precision: {metric, half_width, loads, workloads}`` gives no ``replicates`` / ``repeats``. Before
its trials are expanded (``plan check``, the sweep's start) :func:`design_for_plan` reads the noise model of the
warehouse (``warehouse.noise_history.noise_model``: per runtime, config, workload and load level the log-scale variance
between boots and between windows of a boot, and the seconds a boot and a window cost) for every config of the
plan and every cell the precision names, and chooses with ``stats.design.optimal_design``:

* per cell, the components of the plan's configs are combined conservatively: the largest ``var_boot`` and the
  largest ``var_window`` among the configs (every pair of configs then reaches the target), the mean costs;
* the cell that needs the most GPU time decides: its windows per boot become the plan's ``repeats`` and its
  boots per config its ``replicates`` (one boot measures every cell, so the binding cell's design covers the
  others);
* only trusted history is read (``TRUSTED``: quality ``pass`` / ``warn``, status ``ok``): an ``unvalidated``
  boot (a demo, a sweep whose validation did not run) may be broken, and one broken boot makes the boot SD
  huge; the design's line says how many boots and sweeps it used;
* a config with no usable history in some cell (fewer than 2 ok boots, or no repeat within a boot) has no
  components: the whole plan runs ``stats.design.pilot_design`` (3 boots x 3 windows), which measures them,
  and says so; the next sweep of the plan is designed from it.

:func:`apply_design` returns the plan with those counts; :func:`resolve_precision` does both from a warehouse
file. :func:`precision_warnings` compares what a sweep's A/B intervals reached with the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tunelab.core.load_profiles import load_label
from tunelab.core.plan import Plan
from tunelab.stats.design import Design, optimal_design, pilot_design
from tunelab.stats.intervals import mde_text

__all__ = ["BUSY_OTHER_CPU_FRAC", "TRUSTED", "CellNoise", "PlanDesign", "ab_lines", "busy_line", "apply_design", "config_noise", "design_for_plan",
           "precision_warnings", "resolve_precision", "sweep_ab_rows"]

#: Quality verdicts of the history a design reads (with status ``ok``); ``unvalidated`` boots are left out.
TRUSTED = ("pass", "warn")


@dataclass(frozen=True)
class CellNoise:
    """A config's noise in one cell of the precision: log-scale components, their df and the costs (s)."""

    config: str
    workload: str
    load: str
    var_boot: float
    var_window: float
    df_boot: float
    boot_s: float
    window_s: float
    boots: int


@dataclass
class PlanDesign:
    """What :func:`design_for_plan` chose.

    Attributes:
        design: the plan-wide design (``stats.design.Design``); ``pilot`` when some config has no history.
        metric, half_width: the plan's precision.
        cell: ``workload load`` of the binding cell (most GPU time), None for a pilot.
        no_history: labels of the configs without usable history (the reason for a pilot).
        cells: the per-config noise read from the warehouse.
        configs: configs of the plan (an A/B pair's GPU time is ``2 x design.gpu_s_per_config``).
    """

    design: Design
    metric: str
    half_width: float
    cell: str | None
    no_history: list[str] = field(default_factory=list)
    cells: list[CellNoise] = field(default_factory=list)
    configs: int = 2
    history_boots: int = 0
    history_sweeps: int = 0
    cap_set: bool = False
    max_boots: int = 40

    @property
    def gpu_minutes(self) -> float:
        """GPU-minutes of the whole plan at this design (every config, every boot)."""
        return self.configs * self.design.gpu_s_per_config / 60.0

    def lines(self) -> list[str]:
        """The design as lines for ``plan check`` and the sweep's opening (what, why, predicted half-width, cost)."""
        d = self.design
        target = f"{self.metric} +-{self.half_width:.1%}"
        if d.pilot:
            return [f"precision {target}: pilot, no history for {', '.join(self.no_history)} in the warehouse: "
                    f"{d.boots_per_config} boots x {d.windows_per_boot} windows per config measure its noise "
                    f"(about {self.gpu_minutes:.1f} GPU-minutes); the next sweep of this plan is designed from it "
                    f"(history read: {self._history()})"]
        head = (f"precision {target} at {self.cell}: {d.boots_per_config} boots x {d.windows_per_boot} windows per "
                f"config (replicates {d.boots_per_config}, repeats {d.windows_per_boot}), predicted +-{d.half_width:.1%}, "
                f"about {self.gpu_minutes:.1f} GPU-minutes for {self.configs} configs "
                f"({d.measuring_fraction:.0%} of it measuring); from the noise model of {self._history()}")
        out = [head]
        for c in self.cells:
            out.append(f"  {c.config} {c.workload} {c.load}: boot SD {math.sqrt(c.var_boot):.1%}, window SD "
                       f"{math.sqrt(c.var_window):.1%} ({c.boots} boots), boot {c.boot_s:.0f} s, window {c.window_s:.1f} s")
        if not d.reachable:
            out.append(f"warning: {self.metric}: {d.note}")
        return out

    def _history(self) -> str:
        b, s = self.history_boots, self.history_sweeps
        return (f"{b} boot{'s' if b != 1 else ''} in {s} sweep{'s' if s != 1 else ''} of trusted history "
                f"(quality pass/warn, status ok)")

    def refusal(self) -> str | None:
        """Why ``tunelab run`` should not start this design: the target is out of reach (not a pilot) and the plan
        did not set ``precision.max_boots`` (an explicit cap the user accepted). The message gives the half-width
        the design reaches and what the target would take. None when the run may start."""
        d = self.design
        if d.pilot or d.reachable or self.cap_set:
            return None
        take = "more than 200 boots per config (the most precision.max_boots allows)"
        if self.cells:
            vb, vw = max(c.var_boot for c in self.cells), max(c.var_window for c in self.cells)
            bs = sum(c.boot_s for c in self.cells) / len(self.cells)
            ws = sum(c.window_s for c in self.cells) / len(self.cells)
            need = optimal_design(vb, vw, bs, ws, self.half_width, max_boots=200)
            if need.reachable:
                take = (f"{need.boots_per_config} boots x {need.windows_per_boot} windows per config (about "
                        f"{self.configs * need.gpu_s_per_config / 60:.0f} GPU-minutes)")
        return (f"precision: {self.metric} +-{self.half_width:.1%} at {self.cell} is out of reach: "
                f"{d.boots_per_config} boots x {d.windows_per_boot} windows per config reach +-{d.half_width:.1%} "
                f"(about {self.gpu_minutes:.0f} GPU-minutes for {self.configs} configs, from "
                f"{self._history()}); the target would take {take}. Loosen precision.half_width, or set "
                f"precision.max_boots (e.g. max_boots: {d.boots_per_config}) to run at that cap anyway; "
                f"`tunelab plan check` shows the design")

    def warnings(self) -> list[str]:
        """A warning when the target is out of reach within the limits (``design.reachable`` False, not a pilot)."""
        d = self.design
        if d.pilot or d.reachable:
            return []
        return [f"{self.metric} at {self.cell}: the plan's precision +-{self.half_width:.1%} cannot be reached: "
                f"{d.note}"]


def _precision_cells(plan: Plan) -> list[tuple[str, str, str, float]]:
    """(workload, load label, load_kind, load_value) of the cells the precision names."""
    assert plan.precision is not None
    profiles = plan.load_profiles()
    loads = plan.precision.loads or [p.label for p in profiles]
    workloads = plan.precision.workloads or [w.name for w in plan.workloads]
    out = []
    for w in workloads:
        for p in profiles:
            if p.label in loads:
                kind, value = _kind_value(p)
                out.append((w, p.label, kind, value))
    return out


def _kind_value(profile: Any) -> tuple[str, float]:
    """The (load_kind, load_value) a profile writes to ``measurements``."""
    return str(profile.kind), float(profile.value)


def config_noise(con: Any, metric: str, runtime: str, config_key: str) -> pd.DataFrame:
    """The noise model rows of one config on one runtime (``warehouse.noise_history.noise_model`` of trusted history,
    ``TRUSTED``), one per (workload, load level): where several GPUs have history, the one with the most boots.
    Empty without history."""
    from tunelab.warehouse.noise_history import noise_model

    nm = noise_model(con, metric, config_key=config_key, quality=TRUSTED)
    nm = nm[nm["runtime_name"] == runtime]
    if nm.empty:
        return nm
    return (nm.sort_values("boots", ascending=False)
              .drop_duplicates(["workload", "load_kind", "load_value"]).reset_index(drop=True))


def design_for_plan(plan: Plan, con: Any | None) -> PlanDesign:
    """Choose the plan's design from the warehouse's noise model (``con`` None: no warehouse, a pilot).

    Raises:
        ValueError: the plan has no ``precision``.
    """
    if plan.precision is None:
        raise ValueError("design_for_plan: the plan has no precision")
    from tunelab.warehouse.noise_history import CELL_KEYS

    spec = plan.precision
    trials = plan._round(0)
    cells = _precision_cells(plan)
    noise: dict[str, dict[tuple[str, str], CellNoise]] = {}
    used: dict[str, list[tuple]] = {}  # config name -> the noise model cells (CELL_KEYS values) it read
    no_history: list[str] = []
    for t in trials:
        name = t.label if len(plan.runtime_names()) == 1 else f"{t.label} @ {t.runtime}"
        nm = config_noise(con, spec.metric, t.runtime, t.config_key) if con is not None else pd.DataFrame()
        mine: dict[tuple[str, str], CellNoise] = {}
        read: list[tuple] = []
        for w, lab, kind, value in cells:
            row = None
            if not nm.empty:
                hit = nm[(nm["workload"] == w) & (nm["load_kind"] == kind) & (nm["load_value"].astype(float) == value)]
                row = hit.iloc[0] if len(hit) else None
            ok = (row is not None and row["boots"] >= 2 and math.isfinite(row["var_boot"])
                  and math.isfinite(row["var_window"]) and row["df_window"] > 0
                  and math.isfinite(row["boot_s"]) and row["boot_s"] > 0 and row["window_s"] > 0)
            if not ok:
                break
            read.append(tuple(row[k] for k in CELL_KEYS))
            mine[(w, lab)] = CellNoise(name, w, lab, float(row["var_boot"]), float(row["var_window"]),
                                       float(row["df_boot"]), float(row["boot_s"]), float(row["window_s"]),
                                       int(row["boots"]))
        else:
            noise[name], used[name] = mine, read
            continue
        no_history.append(name)
    hb, hs = _history_counts(con, spec.metric, [c for n in noise for c in used[n]])
    extra = {"history_boots": hb, "history_sweeps": hs, "max_boots": spec.max_boots,
             "cap_set": "max_boots" in spec.model_fields_set}
    if no_history:
        known = [c for m in noise.values() for c in m.values()]
        boot_s = sum(c.boot_s for c in known) / len(known) if known else 90.0
        window_s = sum(c.window_s for c in known) / len(known) if known else 10.0
        return PlanDesign(pilot_design(boot_s, window_s), spec.metric, spec.half_width, None, no_history,
                          known, len(trials), **extra)
    best: tuple[Design, str] | None = None
    for w, lab, _k, _v in cells:
        per = [noise[n][(w, lab)] for n in noise]
        d = optimal_design(max(c.var_boot for c in per), max(c.var_window for c in per),
                           sum(c.boot_s for c in per) / len(per), sum(c.window_s for c in per) / len(per),
                           spec.half_width, max_windows=spec.max_windows, max_boots=spec.max_boots)
        # The binding cell: out of reach first, then the most GPU time.
        key = (not d.reachable, d.gpu_s_per_config)
        if best is None or key > (not best[0].reachable, best[0].gpu_s_per_config):
            best = (d, f"{w} {lab}")
    assert best is not None
    cell = best[1]
    return PlanDesign(best[0], spec.metric, spec.half_width, cell, [],
                      [c for m in noise.values() for c in m.values() if f"{c.workload} {c.load}" == cell],
                      len(trials), **extra)


def _history_counts(con: Any | None, metric: str, cells: list[tuple]) -> tuple[int, int]:
    """(boots, sweeps) behind the design: distinct trials and sweeps with a window in one of ``cells`` (noise model
    cells, ``warehouse.noise_history.CELL_KEYS`` values) among the windows the noise model read (``noise_windows``:
    trusted history, the plan's own windows, a usable value of ``metric``). A pilot's configs without history
    add nothing."""
    if con is None or not cells:
        return 0, 0
    from tunelab.warehouse.noise_history import CELL_KEYS, noise_windows

    keys = list(CELL_KEYS)

    def norm(df: pd.DataFrame) -> pd.DataFrame:  # one spelling of a key on both sides (a NULL GPU, 32 vs 32.0)
        df = df.copy()
        for k in keys:
            df[k] = df[k].astype(float) if k == "load_value" else df[k].map(lambda v: "" if pd.isna(v) else str(v))
        return df

    want = norm(pd.DataFrame(cells, columns=keys)).drop_duplicates()
    frames = []
    for ck in want["config_key"].unique():
        w = norm(noise_windows(con, metric, config_key=str(ck), quality=TRUSTED))
        frames.append(w.merge(want, on=keys, how="inner"))
    hit = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["trial_id", "sweep_id"])
    return int(hit["trial_id"].nunique()), int(hit["sweep_id"].nunique())


def apply_design(plan: Plan, design: PlanDesign) -> Plan:
    """The plan with the design's counts (``replicates`` = boots per config, ``repeats`` = windows per boot)."""
    d = design.design
    return plan.model_copy(update={"replicates": d.boots_per_config, "repeats": d.windows_per_boot})


def resolve_precision(plan: Plan, db_path: str | Path | None = None) -> tuple[Plan, PlanDesign | None]:
    """For a plan with ``precision``: its design from the warehouse file ``db_path`` (default: this environment's)
    and the plan with those counts; other plans are returned as they are, with None. A missing warehouse means no
    history (a pilot); a warehouse that cannot be opened read-only (locked by a writer) is treated as no
    history (the design's line then says pilot)."""
    if plan.precision is None:
        return plan, None
    from tunelab.host import paths

    db = Path(db_path) if db_path is not None else paths.db_path()
    con = None
    if db.exists():
        try:
            import duckdb

            con = duckdb.connect(str(db), read_only=True)
        except Exception:
            con = None
    try:
        design = design_for_plan(plan, con)
    finally:
        if con is not None:
            con.close()
    return apply_design(plan, design), design


def precision_warnings(plan: Plan, ab_rows: list[dict], design: PlanDesign | None = None) -> list[str]:
    """Warnings when a sweep's A/B intervals did not reach the plan's precision (issue 14 item 7).

    ``ab_rows``: the sweep's fixed-design A/B rows (``sweep_ab_rows``: ``warehouse.compare.compare`` rows plus
    ``baseline``/``candidate`` labels). For each row of the precision's metric and cells, the reached half-width
    is half the log interval's width (``exp(t se) - 1``); where it exceeds the target, one line names the metric,
    the cell, the half-width reached and what it would take: the design ``stats.design.optimal_design`` gives from
    the variance this A/B saw (``se_log``, its boots and windows), or that it is out of reach. A plan without
    ``precision`` gives none."""
    if plan.precision is None:
        return []
    spec = plan.precision
    loads = set(spec.loads or [p.label for p in plan.load_profiles()])
    workloads = set(spec.workloads or [w.name for w in plan.workloads])
    out = []
    for r in ab_rows:
        if r.get("metric") != spec.metric or r.get("workload") not in workloads:
            continue
        lab = load_label(r["load_kind"], r["load_value"])
        if lab not in loads:
            continue
        lo, hi = r.get("rel_ci_low"), r.get("rel_ci_high")
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
            reached, what = math.inf, "no interval (fewer than 2 boots per side)"
        else:
            reached = math.expm1((math.log1p(hi) - math.log1p(lo)) / 2)
            what = f"+-{reached:.1%}"
        if reached <= spec.half_width:
            continue
        boots = int(min(r.get("baseline_boots") or 0, r.get("candidate_boots") or 0))
        windows = plan.repeats
        take = "run it again: the noise model now has this sweep's boots and designs from them"
        se = r.get("se_log")
        if se is not None and math.isfinite(se) and boots >= 2:
            var_boot_mean = se * se * boots / 2  # var of one boot's mean value: var_boot + var_window / windows
            need = optimal_design(var_boot_mean, 1e-12, _cost(design, "boot_s", 90.0),
                                  _cost(design, "window_s", 10.0) * windows, spec.half_width,
                                  max_windows=1, max_boots=spec.max_boots)
            take = (f"about {need.boots_per_config} boots per config at {windows} windows per boot"
                    if need.reachable else f"more than {spec.max_boots} boots per config at this noise ({need.note})")
        out.append(f"precision not reached: {spec.metric} at {r['workload']} {lab} "
                   f"({r.get('candidate', 'candidate')} vs {r.get('baseline', 'baseline')}): the interval reached "
                   f"{what}, the plan asks +-{spec.half_width:.1%}; it would take {take}")
    return out


def _cost(design: PlanDesign | None, attr: str, default: float) -> float:
    if design is None or not design.cells:
        return default
    return sum(getattr(c, attr) for c in design.cells) / len(design.cells)


def sweep_ab_rows(con: Any, plan: Plan, sweep_id: str, metrics: list[str] | None = None) -> list[dict]:
    """The fixed-design A/B of a finished sweep: every other config of the plan against the first (per runtime),
    per cell, with ``warehouse.compare.compare`` (log-scale t interval, variance borrowed from history and other
    cells, ``mde_rel``: the effect this design could detect with 80 % power). ``metrics`` default:
    ``output_tokens_per_s``, the precision's metric and the plan's ``primary:`` metrics. Rows are ``compare``'s plus
    ``baseline`` and ``candidate`` (labels); their headline verdicts (``family_verdict``) are adjusted as one family
    over every candidate, cell and metric (``warehouse.selection.report_family``: Holm), the plan's ``primary:``
    rows apart from the secondary ones. Plans with one config or ``replicates: auto`` (which decides its own A/B)
    give none."""
    from tunelab.warehouse.compare import compare

    if plan.replicates == "auto":
        return []
    metrics = list(metrics or ["output_tokens_per_s"])
    if plan.precision is not None and plan.precision.metric not in metrics:
        metrics.append(plan.precision.metric)
    primary = plan.primary.model_dump() if plan.primary is not None else None
    metrics += [m for m in (primary or {}).get("metrics", []) if m not in metrics]
    rnd = plan._round(0)
    out: list[dict] = []
    for rt in plan.runtime_names():
        mine = [t for t in rnd if t.runtime == rt]
        if len(mine) < 2:
            continue
        base = mine[0]
        for cand in mine[1:]:
            for m in metrics:
                try:
                    df = compare(con, {"sweep_id": sweep_id, "config_key": base.config_key, "runtime_name": rt},
                                 {"sweep_id": sweep_id, "config_key": cand.config_key, "runtime_name": rt}, m)
                except ValueError:
                    continue
                for r in df.to_dict("records"):
                    out.append({**r, "baseline": base.label, "candidate": cand.label})
    if not out:
        return out
    from tunelab.warehouse.selection import report_family

    return report_family(pd.DataFrame(out), primary=primary).to_dict("records")


def _welch_text(r: dict) -> str:
    """``; Welch on boot means: difference [-355.8, +412.1]``: the plain Welch t interval of the difference of
    the boot means (``stats.verdict.ABRecord.welch_ci_*``, per cell, nothing borrowed), in the metric's unit,
    shown beside the product's interval so a reader sees what the method adds. In the metric's unit, not as a
    percentage: on 2-3 boots the plain interval of a difference reaches below minus the baseline's mean, which
    reads as an impossible fall of more than 100 %. Empty where there is none (< 2 boots a side)."""
    lo, hi = r.get("welch_ci_low"), r.get("welch_ci_high")
    if lo is None or hi is None or not all(math.isfinite(x) for x in (lo, hi)):
        return ""
    unit = metric_unit(str(r.get("metric") or ""))
    return f"; Welch on boot means: difference [{lo:+.4g}, {hi:+.4g}]" + (f" {unit}" if unit else "")


def metric_unit(metric: str) -> str:
    """The unit of a ``measurements`` column from its name's suffix (units are in the names): ``*_tokens_per_s``
    tokens/s, ``request_throughput_per_s`` / ``goodput_per_s`` requests/s, other ``*_per_s`` 1/s, ``*_s`` s; ''
    for another name."""
    if metric.endswith("tokens_per_s"):
        return "tokens/s"
    if metric in ("request_throughput_per_s", "goodput_per_s"):
        return "requests/s"
    if metric.endswith("_per_s"):
        return "1/s"
    if metric.endswith("_s"):
        return "s"
    return ""


def ab_lines(rows: list[dict]) -> list[str]:
    """The sweep's A/B as lines: per cell the verdict, the change with its 95 % interval, what this design could
    detect (the MDE at 80 % power) and the plain Welch interval on boot means beside it; a cell without an
    interval says why."""
    out = []
    for r in rows:
        lab = load_label(r["load_kind"], r["load_value"])
        head = (f"A/B {r['candidate']} vs {r['baseline']}: {r['workload']} {lab} {r['metric']}: "
                f"{str(r['verdict']).replace('_', ' ')}")
        fam = r.get("family_verdict")
        if fam is not None and (fam != r["verdict"] or r.get("family_role") == "secondary"):
            # The headline (Holm over the sweep's A/B verdicts) differs from the per-cell verdict, or is secondary.
            head += (f" per cell; headline {str(fam).replace('_', ' ')}"
                     f"{' (secondary)' if r.get('family_role') == 'secondary' else ''}")
        lo, hi, mde = r.get("rel_ci_low"), r.get("rel_ci_high"), r.get("mde_rel")
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
            head += f" {r['rel_diff']:+.1%} [{lo:+.1%}, {hi:+.1%}]"
            head += (f"; detectable at this design ({r['baseline_boots']} vs {r['candidate_boots']} boots): "
                     f"{mde_text(mde)}" if mde is not None and math.isfinite(mde) else "")
            head += _welch_text(r)
        else:
            head += f" ({r.get('reason', '')})"
        left = {side: int(r.get(f"{side}_trials_excluded") or 0) for side in ("baseline", "candidate")}
        if any(left.values()):
            head += "; left out (quality gate or status): " + ", ".join(f"{n} {side} boot{'s' if n != 1 else ''}"
                                                                         for side, n in left.items() if n)
        out.append(head)
    return out


#: Other processes' share of the host's CPU time over a sweep's measured windows (``measurements.host_other_cpu_frac``,
#: ``tasks.host_load.covariates``) from which a sweep that decided nothing says the machine was too busy. 0.25: a
#: quarter of the host's CPU taken by others. The README's demo decided its c=4 cells on an idle 2-core machine and
#: none beside a test run (2026-12-02, 2026-12-03), where the others took most of the CPU.
BUSY_OTHER_CPU_FRAC = 0.25


def busy_line(con: Any, sweep_id: str, rows: list[dict], load_note: str | None = None) -> str | None:
    """One line for a sweep whose A/B decided nothing on a busy machine, naming the load it saw; else None.

    Args:
        con: a DuckDB connection to the warehouse holding the sweep.
        sweep_id: the sweep.
        rows: the sweep's A/B rows (:func:`sweep_ab_rows`), each with ``verdict`` and ``mde_rel``.
        load_note: the machine's load now in words (``plan_cost.load_note``), appended when given.
    Returns:
        None when any cell was decided (better, worse), when there are no rows, or when other processes took less
        than :data:`BUSY_OTHER_CPU_FRAC` of the CPU over the sweep's windows (the mean of
        ``host_other_cpu_frac`` over its measured windows; no reading: None). Otherwise a line such as
        ``"A/B: the machine was too busy to decide: other processes took 62% of the CPU during the 24 measured
        windows; ... rerun on an otherwise idle machine"``.
    Why: under load the boot-to-boot spread grows until no effect is detectable (the demo's cells read "no
    significant change" with MDEs of -92 %/+1,151 %), which reads as "no difference" unless the cause is said.
    """
    if not rows or any(r.get("verdict") in ("better", "worse") for r in rows):
        return None
    got = con.execute(
        "SELECT avg(m.host_other_cpu_frac), count(m.host_other_cpu_frac) FROM measurements m "
        "JOIN trials t USING (trial_id) WHERE t.sweep_id = ?", [sweep_id]).fetchone()
    frac, n = (got or (None, 0))
    if frac is None or not n or frac < BUSY_OTHER_CPU_FRAC:
        return None
    mdes = [r.get("mde_rel") for r in rows if r.get("mde_rel") is not None and math.isfinite(r.get("mde_rel"))]
    widest = f"; the widest cell could detect only {mde_text(max(mdes))}" if mdes else ""
    line = (f"A/B: the machine was too busy to decide: other processes took {frac:.0%} of the CPU during the "
            f"{n} measured windows{widest}; no cell reached a verdict, which says nothing about the configs: rerun "
            "on an otherwise idle machine")
    return line + (f" ({load_note})" if load_note else "")

