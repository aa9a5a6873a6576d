"""``replicates: auto`` in the sweep: the history the A/B rule starts from, the budget's warnings, and the outcome's
record and lines. The design itself (which pair to boot next, when to stop) is :mod:`tunelab.designs.sequential_ab`;
the sweep's one loop (``flows.sweep``) runs it.

The outcome (``ABOutcome``) goes into the sweep's record (``sweeps.ab_*``, migration 009), is logged at the end of
the sweep and returned in ``SweepSummary.ab``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from tunelab.core import records
from tunelab.designs.sequential_ab import MAX_UNUSABLE_PAIRS, ABCell, ABOutcome, SequentialAB, ab_cells, boot_value
from tunelab.core.load_profiles import load_label
from tunelab.core.plan import Plan
from tunelab.stats.intervals import mde_text
from tunelab.stats.sequential import first_finite_pair

__all__ = ["ABCell", "ABOutcome", "MAX_UNUSABLE_PAIRS", "SequentialAB", "boot_value", "ab_cells", "ab_priors",
           "budget_warnings", "record_outcome", "outcome_lines"]


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
    (``warehouse.noise_history``) of the two configs, for ``sequential_ab(prior_sd=, prior_df=)``.

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

        from tunelab.reports.design_plan import config_noise

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
