"""The design protocol: a design answers "which trials next, given the results so far"; the sweep's one loop runs them.

Modelled on guidellm's ``Profile.next_strategy(prev_strategy, prev_benchmark)``: the loop calls
:meth:`Design.next_trials` with every result so far (in the order the trials were asked for), runs what it answers
on the host's devices, and stops at an empty answer. A design keeps its own outcome (an A/B's decision, a search's
record) for the sweep to read afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import pandas as pd

from tunelab.core.plan import Trial

__all__ = ["Design", "TrialResult", "TrialSpec", "WindowCheck"]

#: Called with a trial's measurements so far (``measurements`` rows) after each measured window; True stops the
#: measurement (the trial ends ``failed`` with failure class ``pruned`` and keeps its windows).
WindowCheck = Callable[[pd.DataFrame], bool]


@dataclass(frozen=True)
class TrialSpec:
    """One trial a design asks for: the plan's trial (config, runtime, replicate) and, for a design that may stop a
    trial early, its per-window check (None: measure every window)."""

    trial: Trial
    window_check: WindowCheck | None = None


@dataclass(frozen=True)
class TrialResult:
    """What one trial gave, as the loop hands it back to the design.

    Attributes:
        spec: the spec it ran for. trial_id: ``records.trial_id`` of the trial.
        status: the sweep's status dict of the trial (``flows.sweep.TrialStatus``: ``status``, ``failure_class``,
            ``verdict`` ...; the verdict is the quality gate's when the design asked for it, else ``unvalidated``).
        bundle: the trial's bundle folder (None when the orchestrator failed before one was written).
        gpu_minutes: device-minutes of the trial (slot taken -> trial ended, x devices).
    """

    spec: TrialSpec
    trial_id: str
    status: Mapping[str, Any]
    bundle: Path | None
    gpu_minutes: float = 0.0

    @property
    def usable(self) -> bool:
        """The trial counts for a decision: ``ok`` and the quality gate passed or warned."""
        return self.status.get("status") == "ok" and self.status.get("verdict") in ("pass", "warn")

    def tables(self) -> dict[str, pd.DataFrame]:
        """The bundle's tables (``tunelab.core.bundle.read_bundle``, not re-verified); empty without a bundle."""
        from tunelab.core.bundle import read_bundle

        return read_bundle(self.bundle, verify=False) if self.bundle is not None else {}


@runtime_checkable
class Design(Protocol):
    """What the sweep's loop asks of a design.

    Attributes:
        trials_total: the trials the design may ask for in all (the N of "trial k/N"); None when not known (a search
            bounded by GPU-minutes only).
        gate_each_trial: True when the design decides on quality-gated results: the loop validates each trial's
            bundle as soon as it ran (the verdict is then in ``TrialResult.status``).
    """

    trials_total: int | None
    gate_each_trial: bool

    def next_trials(self, done: Sequence[TrialResult]) -> list[TrialSpec]:
        """The trials to run next, given every result so far (oldest first); an empty list ends the sweep.
        The trials of one answer run in order on the free devices (in parallel where there are several)."""
        ...

    def interrupted(self, exc: BaseException) -> None:
        """An interruption (Ctrl-C, a cancel) ended the trials of the last answer; ``exc`` propagates after this.
        The design records what it knew (e.g. the running boot as ``cancelled``)."""
        ...
