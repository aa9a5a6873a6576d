"""``replicates: auto``: A and B in interleaved pairs until the plan's A/B is decided or its budget is spent.

The plan's trial list for ``auto`` is the longest sequence its budget allows, in pairs (``Plan.trials``: A B, B A,
A B, ... for ``ab.order: abba``). :class:`SequentialAB` answers one pair at a time; after each:

1. the loop has validated both bundles (the quality gate): a pair counts only when both trials are ``ok`` and pass
   or warn;
2. per deciding cell (workload x load level x metric of ``ab``) take each boot's value (the mean of its windows,
   :func:`boot_value`) and call ``tunelab.stats.sequential.sequential_ab`` on the usable pairs, at ``alpha / cells``
   (Bonferroni: the error rate then holds over every cell and every look), with the two configs' boot SD from the
   warehouse's noise model as ``prior_sd`` where they have history (``flows.ab_auto.ab_priors``);
3. stop when every cell is decided, or when the next pair would exceed the budget (boots, or GPU-minutes at the mean
   cost of a pair so far), or after :data:`MAX_UNUSABLE_PAIRS` unusable pairs in a row.

The outcome (:class:`ABOutcome`) is the design's ``outcome``. The statistics are ``tunelab.stats``'s; this module only
orders boots and reads their values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import pandas as pd

from tunelab.designs.base import TrialResult, TrialSpec
from tunelab.core.load_profiles import load_label
from tunelab.core.plan import Plan
from tunelab.stats.sequential import sequential_ab

__all__ = ["ABCell", "ABOutcome", "MAX_UNUSABLE_PAIRS", "SequentialAB", "ab_cells", "boot_value"]

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


class SequentialAB:
    """The ``replicates: auto`` design: the plan's trials (pairs, in order) one pair per answer, until decided.

    Args:
        plan: the ``replicates: auto`` plan (``plan.ab`` set).
        logger: a logger (``info``/``warning``) for the design's lines.
        priors: per cell ``(prior_sd, prior_df)`` of history (``flows.ab_auto.ab_priors``), passed to
            ``sequential_ab``; cells without one run without history.

    Attributes:
        outcome: the :class:`ABOutcome` so far (final once :meth:`next_trials` answered nothing).
    """

    gate_each_trial = True

    def __init__(self, plan: Plan, logger: Any, priors: dict[ABCell, tuple[float, float]] | None = None):
        assert plan.ab is not None
        self.plan, self.logger, self.priors = plan, logger, priors or {}
        self.a, self.b = plan.ab_pair()
        self.cells = ab_cells(plan)
        self.alpha_cell = plan.ab.alpha / len(self.cells)
        self.trials = plan.trials()
        self.trials_total: int | None = len(self.trials)
        self.outcome = ABOutcome(baseline=self.a.label, candidate=self.b.label)
        self._values: dict[ABCell, tuple[list[float], list[float]]] = {c: ([], []) for c in self.cells}
        self._k = 0  # index of the pair's first trial in self.trials
        self._asked = False  # a pair was answered and its results are due
        self._unusable_in_row = 0

    def next_trials(self, done: Sequence[TrialResult]) -> list[TrialSpec]:
        """The next pair; nothing once decided, out of budget, or after too many unusable pairs."""
        out, budget = self.outcome, self.plan.ab.budget
        if not self._asked:
            self.logger.info("replicates: auto: %s (A) vs %s (B), %d deciding cell(s) at alpha %.3g each; budget %s",
                             self.a.label, self.b.label, len(self.cells), self.alpha_cell,
                             ", ".join(f"{k} {v:g}" for k, v in budget.model_dump().items() if v is not None))
        else:
            if self._stop_after(done[-2:]):
                return []
            self._k += 2
        if self._k >= len(self.trials) - 1:  # the plan's trial list ran out: the budget's boots, or MAX_AUTO_PAIRS
            if out.boots:
                out.stop_reason = "budget_boots" if budget.boots is not None else "max_pairs"
            return []
        if out.boots > 0:
            per_pair = out.gpu_minutes / (out.boots / 2)
            if budget.boots is not None and out.boots + 2 > budget.boots:
                out.stop_reason = "budget_boots"
                return []
            if budget.gpu_minutes is not None and out.gpu_minutes + per_pair > budget.gpu_minutes:
                out.stop_reason = "budget_gpu_minutes"
                return []
        self._asked = True
        return [TrialSpec(t) for t in self.trials[self._k:self._k + 2]]

    def interrupted(self, exc: BaseException) -> None:
        """Nothing to record: the outcome stays as it was after the last whole pair."""

    def _stop_after(self, pair: Sequence[TrialResult]) -> bool:
        """Take a pair's results; True when the A/B stops here (``outcome.stop_reason`` set)."""
        out, plan, a = self.outcome, self.plan, self.a
        out.boots += 2
        for r in pair:
            out.gpu_minutes += r.gpu_minutes
        ok = True
        by_side: dict[str, pd.DataFrame | None] = {}
        for r in pair:
            ok = ok and bool(r.status) and r.usable
            t = r.spec.trial
            side = "A" if t.config_key == a.config_key and t.runtime == a.runtime else "B"
            by_side[side] = r.tables().get("measurements") if r.bundle is not None else None
        vals = {c: (boot_value(by_side.get("A"), c), boot_value(by_side.get("B"), c)) for c in self.cells}
        if not ok or any(x is None or y is None for x, y in vals.values()):
            self._unusable_in_row += 1
            why = ", ".join(f"{r.spec.trial.label} r{r.spec.trial.replicate}: {r.status.get('status')}/"
                            f"{r.status.get('verdict')}" for r in pair)
            self.logger.warning("A/B pair %d not usable (%s; a pair counts when both sides are ok, pass or warn the "
                                "quality gate and have every deciding value); %d in a row", self._k // 2 + 1, why,
                                self._unusable_in_row)
            if self._unusable_in_row >= MAX_UNUSABLE_PAIRS:
                out.stop_reason = "unusable_pairs"
                return True
            return False
        self._unusable_in_row = 0
        for c, (x, y) in vals.items():
            self._values[c][0].append(x)
            self._values[c][1].append(y)
        out.pairs += 1
        if out.pairs < plan.ab.min_pairs:
            return False
        priors = self.priors
        verdicts = {c: sequential_ab(self._values[c][0], self._values[c][1],
                                     higher_is_better=plan.ab.higher_is_better(c.metric), alpha=self.alpha_cell,
                                     margin=plan.ab.margin, prior_sd=priors[c][0] if c in priors else None,
                                     prior_df=priors[c][1] if c in priors else None) for c in self.cells}
        out.verdicts = [{"workload": c.workload, "load": c.load, "metric": c.metric, "alpha": self.alpha_cell,
                         **asdict(v)} for c, v in verdicts.items()]
        self.logger.info("A/B after %d pair(s): %s", out.pairs, "; ".join(
            f"{c.name}: {v.call} {v.rel_change:+.1%} [{v.ci_low:+.1%}, {v.ci_high:+.1%}]" for c, v in verdicts.items()))
        if all(v.decided for v in verdicts.values()):
            out.stop_reason = "decided"
            calls = {v.call for v in verdicts.values()}
            out.call = calls.pop() if len(calls) == 1 else "mixed"
            return True
        return False
