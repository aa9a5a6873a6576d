"""``replicates: auto``: boot A and B in interleaved pairs until the plan's A/B is decided or its budget is spent.

The sweep (``flows.sweep``) hands its trials to :func:`run_auto_ab` instead of running them all. The plan's
trial list for ``auto`` is the longest sequence its budget allows, in pairs (``Plan.trials``: A B, B A, A B, ...
for ``ab.order: abba``). Pair by pair:

1. run the pair's two trials (the sweep's own ``run_one``: device locks, slots, bundles, statuses);
2. validate their bundles (the quality gate): a pair counts only when both trials are ``ok`` and pass or warn;
3. per deciding cell (workload x load level x metric of ``ab``) take each boot's value (the mean of its windows,
   :func:`boot_value`) and call ``tunelab.stats.sequential.sequential_ab`` on the usable pairs, at
   ``alpha / cells`` (Bonferroni: the error rate then holds over every cell and every look), with the two
   configs' boot SD from the warehouse's noise model as ``prior_sd`` where they have history (:func:`ab_priors`);
4. stop when every cell is decided, or when the next pair would exceed the budget (boots, or GPU-minutes at the
   mean cost of a pair so far), or after :data:`MAX_UNUSABLE_PAIRS` unusable pairs in a row.

The outcome (:class:`ABOutcome`) goes into the sweep's record (``sweeps.ab_*``, migration 009), is logged at the
end of the sweep and returned in ``SweepSummary.ab``. The statistics are ``tunelab.stats``'s; this module only
orders boots and reads their values.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tunelab import records
from tunelab.bundle import read_bundle
from tunelab.load_profiles import load_label
from tunelab.plan import Plan
from tunelab.stats.intervals import mde_text
from tunelab.stats.sequential import first_finite_pair, sequential_ab

__all__ = ["ABCell", "ABOutcome", "MAX_UNUSABLE_PAIRS", "boot_value", "ab_cells", "ab_priors", "run_auto_ab",
           "record_outcome", "outcome_lines"]

#: Pairs in a row in which a side failed (boot, measurement or quality gate) after which the A/B stops: a config
#: that does not run will not start running on the next boot.
MAX_UNUSABLE_PAIRS = 2


@dataclass(frozen=True)
class ABCell:
    """One deciding cell: the per-boot value of ``metric`` at ``workload`` and load level ``load`` (a label)."""

    workload: str
    load: str
    metric: str

    @property
    def name(self) -> str:
        """``chat c=32 output_tokens_per_s``."""
        return f"{self.workload} {self.load} {self.metric}"


@dataclass
class ABOutcome:
    """What a ``replicates: auto`` sweep decided.

    Attributes:
        baseline / candidate: the two configs' labels (A, B).
        call: ``better`` / ``worse`` / ``equivalent`` (the candidate against the baseline, every cell the same),
            ``mixed`` (every cell decided, not alike), or ``undecided``.
        stop_reason: ``decided``, ``budget_boots``, ``budget_gpu_minutes``, ``max_pairs`` (a GPU-minutes budget
            that ``plan.MAX_AUTO_PAIRS`` pairs did not spend), ``unusable_pairs`` or ``no_pairs``.
        boots: trials started (both sides). pairs: usable pairs analysed. gpu_minutes: device-minutes of the
            trials' wall time (slot taken -> trial ended, x devices).
        verdicts: per cell, the last ``SequentialVerdict`` as a dict plus ``workload``, ``load``, ``metric``,
            ``alpha`` (the cell's share).
    """

    baseline: str
    candidate: str
    call: str = "undecided"
    stop_reason: str = "no_pairs"
    boots: int = 0
    pairs: int = 0
    gpu_minutes: float = 0.0
    verdicts: list[dict[str, Any]] = field(default_factory=list)


def ab_cells(plan: Plan) -> list[ABCell]:
    """The deciding cells of the plan's ``ab`` (workloads x loads x metrics; defaults: all of the plan's)."""
    assert plan.ab is not None
    loads = plan.ab.loads or [p.label for p in plan.load_profiles()]
    workloads = plan.ab.workloads or [w.name for w in plan.workloads]
    return [ABCell(w, lab, m) for w in workloads for lab in loads for m in plan.ab.metrics]


def boot_value(measurements: pd.DataFrame, cell: ABCell) -> float | None:
    """One boot's value of a cell: the mean over the boot's windows (repeats) of ``cell.metric`` at its workload
    and load level; None when there is none (a missing or non-positive value: a ratio needs a positive one).

    Why the mean of windows: windows of one boot share the boot's level (the noise model's nested structure), so
    the boot is the unit and its windows only sharpen its value. The windows of an ``sla_search:``
    (``sla_search_window`` true) are left out: they may share the cell's level (docs/sla_search.md)."""
    if measurements is None or measurements.empty or cell.metric not in measurements.columns:
        return None
    m = measurements[measurements["workload"] == cell.workload]
    # The plan's windows only: a search window may share the level (019); an overloaded open-loop window measured
    # a growing queue (021).
    for col in ("sla_search_window", "overloaded"):
        if col in m.columns:
            m = m[~m[col].astype("boolean").fillna(False).to_numpy(dtype=bool)]
    labels = [load_label(k, v) for k, v in zip(m["load_kind"], m["load_value"])]
    vals = pd.to_numeric(m.loc[[lab == cell.load for lab in labels], cell.metric], errors="coerce").dropna()
    if vals.empty:
        return None
    v = float(vals.mean())
    return v if math.isfinite(v) and v > 0 else None


def _usable(status: dict | None) -> bool:
    return bool(status) and status.get("status") == "ok" and status.get("verdict") in ("pass", "warn")


def _minutes(timing: dict, devices: int) -> float:
    start, end = timing.get("slot_at") or timing.get("queued_at"), timing.get("end_at")
    return 0.0 if start is None or end is None else max(0.0, end - start) * max(devices, 1) / 60.0


def budget_warnings(plan: Plan, priors: dict[ABCell, tuple[float, float]]) -> list[str]:
    """Warnings for a ``replicates: auto`` budget that cannot decide a cell: without history for it (no entry in
    ``priors``, see :func:`ab_priors`) the always-valid interval stays infinite until
    :func:`stats.sequential.first_finite_pair` pairs at the cell's alpha, so a budget of fewer pairs runs to its
    end undecided. Empty for other plans or when the budget suffices."""
    if plan.replicates != "auto" or plan.ab is None:
        return []
    cells = ab_cells(plan)
    alpha_cell = plan.ab.alpha / len(cells)
    need = first_finite_pair(alpha_cell)
    pairs = plan.max_boots()  # boots per config = pairs
    if need is None or pairs >= need:
        return []
    bare = [c for c in cells if c not in priors]
    if not bare:
        return []
    names = ", ".join(f"{c.workload} {c.load} {c.metric}" for c in bare[:3]) + (" ..." if len(bare) > 3 else "")
    return [f"ab.budget: {pairs} pair(s) cannot decide {len(bare)} of {len(cells)} cell(s) ({names}): without "
            f"history of both configs the always-valid interval at alpha {alpha_cell:.3g} per cell stays infinite "
            f"until pair {need}; raise ab.budget.boots to at least {2 * need}, declare fewer cells (ab.metrics, "
            f"ab.loads), or run a fixed design of both configs first (its boots become the noise model's history)"]


def ab_priors(plan: Plan, db_path: str | Path | None, logger: Any = None) -> dict[ABCell, tuple[float, float]]:
    """History for the sequential rule: per deciding cell, ``(prior_sd, prior_df)`` from the warehouse's noise model
    (``warehouse.noise``) of the two configs, for ``sequential_ab(prior_sd=, prior_df=)``.

    A boot's value here is the mean of its ``plan.repeats`` windows (:func:`boot_value`), so its log variance is
    ``var_boot + var_window / repeats`` (the noise model's two components), pooled over the two configs on their
    ``df_boot`` degrees of freedom: ``prior_sd`` is its square root, ``prior_df`` the summed df. A cell where
    either config has fewer than 2 ok boots of history gets none (the rule then runs without history). A missing
    or unreadable warehouse gives no priors, never an error."""
    if plan.ab is None or db_path is None or not Path(db_path).exists():
        return {}
    a, b = plan.ab_pair()
    cells = ab_cells(plan)
    out: dict[ABCell, tuple[float, float]] = {}
    try:
        import duckdb

        from tunelab.design_plan import config_noise

        con = duckdb.connect(str(db_path), read_only=True)
        try:
            for metric in sorted({c.metric for c in cells}):
                per = [config_noise(con, metric, t.runtime, t.config_key) for t in (a, b)]
                for c in (c for c in cells if c.metric == metric):
                    ss = df = 0.0
                    for nm in per:
                        at = pd.Series([load_label(k, v) == c.load for k, v in zip(nm["load_kind"], nm["load_value"])],
                                       index=nm.index, dtype=bool)
                        hit = nm[(nm["workload"] == c.workload) & at]
                        if hit.empty or hit.iloc[0]["boots"] < 2 or not math.isfinite(hit.iloc[0]["var_boot"]):
                            break
                        r = hit.iloc[0]
                        vw = float(r["var_window"]) if math.isfinite(r["var_window"]) else 0.0
                        ss += float(r["df_boot"]) * (float(r["var_boot"]) + vw / plan.repeats)
                        df += float(r["df_boot"])
                    else:
                        if df > 0:
                            out[c] = (math.sqrt(ss / df), df)
        finally:
            con.close()
    except Exception as e:  # history sharpens the rule; without it the rule is still valid
        if logger is not None:
            logger.warning("A/B history not read (the rule runs without it): %s", e)
        return {}
    if logger is not None and out:
        logger.info("A/B history from the noise model: %s", "; ".join(
            f"{c.name}: boot SD {sd:.1%} on {df:g} df" for c, (sd, df) in out.items()))
    return out


def run_auto_ab(run: Any, pools: dict, no_gpu_reason: str, plan: Plan, logger: Any,
                validate: Any = None, priors: dict[ABCell, tuple[float, float]] | None = None) -> ABOutcome:
    """Run the sweep's trials (``run``: the sweep's ``_SweepTrials``) pair by pair until decided or out of budget.

    Args:
        run: the sweep's trial runner; its jobs are ``plan.trials()`` (pairs in order).
        pools: device pools by name (``gpu``, ``cpu``), as the sweep built them.
        no_gpu_reason: why no GPU was selected (skipped GPU jobs say it).
        plan: the ``replicates: auto`` plan.
        logger: the sweep's logger.
        validate: ``validate(bundle, plan) -> verdict`` (the sweep's quality gate).
        priors: per cell ``(prior_sd, prior_df)`` of history (:func:`ab_priors`), passed to ``sequential_ab``;
            cells without one run without history.

    Returns:
        :class:`ABOutcome`; the trials that ran have their bundles and statuses in ``run``.
    """
    from tunelab.flows.devices import run_on_devices

    assert plan.ab is not None
    a, b = plan.ab_pair()
    cells = ab_cells(plan)
    alpha_cell = plan.ab.alpha / len(cells)
    budget = plan.ab.budget
    out = ABOutcome(baseline=a.label, candidate=b.label)
    values: dict[ABCell, tuple[list[float], list[float]]] = {c: ([], []) for c in cells}
    jobs = run.jobs
    unusable_in_row = 0
    logger.info("replicates: auto: %s (A) vs %s (B), %d deciding cell(s) at alpha %.3g each; budget %s",
                a.label, b.label, len(cells), alpha_cell,
                ", ".join(f"{k} {v:g}" for k, v in budget.model_dump().items() if v is not None))
    for k in range(0, len(jobs) - 1, 2):
        pair = jobs[k:k + 2]
        if out.boots > 0:
            per_pair = out.gpu_minutes / (out.boots / 2)
            if budget.boots is not None and out.boots + 2 > budget.boots:
                out.stop_reason = "budget_boots"
                break
            if budget.gpu_minutes is not None and out.gpu_minutes + per_pair > budget.gpu_minutes:
                out.stop_reason = "budget_gpu_minutes"
                break
        for p in sorted({j.pool for j in pair}):
            pj = [j for j in pair if j.pool == p]
            if p == "gpu" and not pools["gpu"]:
                for j in pj:
                    run.on_skip(j, f"runtime {j.trial.runtime!r} needs a GPU; {no_gpu_reason or 'none selected'}")
                continue
            run_on_devices(pj, lambda j: j.need, pools[p], run.run_one, on_skip=run.on_skip,
                           on_interrupt=run.on_interrupt, usable=run.usable)
        out.boots += 2
        for j in pair:
            out.gpu_minutes += _minutes(run.timings[j.index], j.need)
        ok = True
        by_side: dict[str, pd.DataFrame | None] = {}
        for j in pair:
            bundle, st = run.bundles[j.index], run.statuses[j.index]
            if bundle is not None and st is not None and st.get("status") == "ok" and validate is not None:
                try:
                    st["verdict"] = validate(bundle, plan)
                except Exception as e:  # the pair is then unusable; the sweep validates again at its end
                    logger.error("validation of %s could not run: %s", bundle, e)
            ok = ok and _usable(st)
            side = "A" if j.trial.config_key == a.config_key and j.trial.runtime == a.runtime else "B"
            by_side[side] = read_bundle(bundle, verify=False).get("measurements") if bundle is not None else None
        vals = {c: (boot_value(by_side.get("A"), c), boot_value(by_side.get("B"), c)) for c in cells}
        if not ok or any(x is None or y is None for x, y in vals.values()):
            unusable_in_row += 1
            why = ", ".join(f"{j.trial.label} r{j.trial.replicate}: {(run.statuses[j.index] or {}).get('status')}/"
                            f"{(run.statuses[j.index] or {}).get('verdict')}" for j in pair)
            logger.warning("A/B pair %d not usable (%s; a pair counts when both sides are ok, pass or warn the "
                           "quality gate and have every deciding value); %d in a row", k // 2 + 1, why,
                           unusable_in_row)
            if unusable_in_row >= MAX_UNUSABLE_PAIRS:
                out.stop_reason = "unusable_pairs"
                break
            continue
        unusable_in_row = 0
        for c, (x, y) in vals.items():
            values[c][0].append(x)
            values[c][1].append(y)
        out.pairs += 1
        if out.pairs < plan.ab.min_pairs:
            continue
        priors = priors or {}
        verdicts = {c: sequential_ab(values[c][0], values[c][1], higher_is_better=plan.ab.higher_is_better(c.metric),
                                     alpha=alpha_cell, margin=plan.ab.margin,
                                     prior_sd=priors[c][0] if c in priors else None,
                                     prior_df=priors[c][1] if c in priors else None) for c in cells}
        out.verdicts = [{"workload": c.workload, "load": c.load, "metric": c.metric, "alpha": alpha_cell,
                         **asdict(v)} for c, v in verdicts.items()]
        logger.info("A/B after %d pair(s): %s", out.pairs, "; ".join(
            f"{c.name}: {v.call} {v.rel_change:+.1%} [{v.ci_low:+.1%}, {v.ci_high:+.1%}]" for c, v in verdicts.items()))
        if all(v.decided for v in verdicts.values()):
            out.stop_reason = "decided"
            calls = {v.call for v in verdicts.values()}
            out.call = calls.pop() if len(calls) == 1 else "mixed"
            break
    else:  # the plan's trial list ran out: the budget's boots, or MAX_AUTO_PAIRS
        if out.boots:
            out.stop_reason = "budget_boots" if budget.boots is not None else "max_pairs"
    return out


def record_outcome(sweep: records.Sweep, outcome: ABOutcome) -> None:
    """Put the outcome into the sweep's record (the sweep then writes the record into its bundles,
    ``bundle.write_sweep_row``, so the warehouse's ``sweeps`` row carries it)."""
    sweep.update(ab_baseline=outcome.baseline, ab_candidate=outcome.candidate, ab_call=outcome.call,
                 ab_stop_reason=outcome.stop_reason, ab_boots=outcome.boots, ab_pairs=outcome.pairs,
                 ab_gpu_minutes=outcome.gpu_minutes,
                 ab_verdicts=json.dumps(_finite(outcome.verdicts), sort_keys=True))


def _finite(x: Any) -> Any:
    """JSON has no infinity: an unbounded interval end or MDE (too few pairs) is stored as null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def outcome_lines(outcome: ABOutcome) -> list[str]:
    """The outcome as the lines printed at the end of the sweep."""
    lines = [f"A/B (replicates: auto): {outcome.candidate} vs {outcome.baseline}: {outcome.call.upper()} after "
             f"{outcome.boots} boots ({outcome.pairs} usable pairs, {outcome.gpu_minutes:.2f} GPU-minutes); "
             f"stopped: {outcome.stop_reason}"]
    for v in outcome.verdicts:
        lines.append(f"  {v['workload']} {v['load']} {v['metric']}: {v['call']} {v['rel_change']:+.2%} "
                     f"[{v['ci_low']:+.2%}, {v['ci_high']:+.2%}] (always-valid {1 - v['alpha']:.1%} interval; "
                     f"detectable at this design: {mde_text(v['mde'])}; {v['n_pairs']} pairs)")
    return lines
