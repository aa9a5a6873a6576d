"""The fixed grid: every trial of the plan (configs x runtimes x replicates, interleaved in plan order), all asked for
at once; the loop runs them first in, first out on the free devices."""

from __future__ import annotations

from typing import Sequence

from tunelab.designs.base import TrialResult, TrialSpec
from tunelab.core.plan import Trial

__all__ = ["FixedGrid"]


class FixedGrid:
    """The plan's trials in plan order (``Plan.trials()``: interleaved replicates, A B A B), asked for in one answer.

    Args:
        trials: the trials, in the order they start.
    """

    gate_each_trial = False

    def __init__(self, trials: Sequence[Trial]):
        self.trials = list(trials)
        self.trials_total: int | None = len(self.trials)
        self._asked = False

    def next_trials(self, done: Sequence[TrialResult]) -> list[TrialSpec]:
        """Every trial on the first call; nothing after."""
        if self._asked:
            return []
        self._asked = True
        return [TrialSpec(t) for t in self.trials]

    def interrupted(self, exc: BaseException) -> None:
        """Nothing to record: the sweep marks the running trials cancelled."""
