"""Progress events of a sweep: which trial runs, in which phase, how far its window is. The flows and tasks
report here; a display renders them (``tunelab.reports.live`` in ``tunelab run``). Nothing here draws.

Why a separate channel: the Prefect run logs stay what they are (one line per step, throttled window
progress); a person at a terminal also wants to see the silent parts (a boot of 15-110 s, prompt building)
moving, with an estimate of the time left. Emitting costs one function call per sink; with no sink (a
deployment run, the tests) an event goes nowhere.

Phases (:data:`PHASES`), in the order a trial goes through them: ``clean`` (GPU check), ``boot``,
``prompts`` (building a window's prompts), ``warmup``, ``window`` (measured window k of n, with
requests done/total), ``teardown``; then, for the sweep: ``validate``, ``load``, ``report``.
The sweep itself sends ``sweep`` (start: trials_total, estimate_s), ``wait`` (trial k of N waits for its device,
which another sweep holds; ``detail`` says which and who) and ``trial`` (trial k of N starts).

Threads: with several devices trials run in worker threads; :func:`emit` may be called from any thread, and a
sink must be thread-safe. The trial an event belongs to is the ``trial_id`` given, else the one set with
:func:`current_trial` in this thread's context (the trial flow sets it, so the measurement need not know it).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

__all__ = ["PHASES", "ProgressEvent", "Sink", "add_sink", "current_trial", "emit", "remove_sink", "sinks"]

#: Every phase an event can name (see the module docstring).
PHASES = ("sweep", "wait", "trial", "clean", "boot", "prompts", "warmup", "window", "teardown", "validate", "load",
          "report", "done")


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a sweep.

    Attributes:
        phase: one of :data:`PHASES`.
        trial_id: the trial it belongs to (``records.trial_id``); None for sweep-level phases.
        trial_index: 1-based position of the trial in the sweep (``trial`` events); trials_total: N.
        label: the trial's config label (``trial``), or a window's label (``window``: workload, level, repeat).
        window_index: 1-based measured window of the trial; windows_total: the trial's windows
            (workloads x load levels x repeats).
        done, total: requests done / to do in the window (``window``, ``warmup``), prompts (``prompts``).
        estimate_s: an estimate of the seconds the step (``sweep``: the whole sweep; ``boot``: the boot) takes,
            None when unknown; ``tunelab.core.plan_cost`` says how it is made.
        detail: a short free text (``boot``: the port, ``teardown``: clean or not).
        at: ``time.monotonic()`` when emitted, seconds.
    """

    phase: str
    trial_id: str | None = None
    trial_index: int | None = None
    trials_total: int | None = None
    label: str | None = None
    window_index: int | None = None
    windows_total: int | None = None
    done: int | None = None
    total: int | None = None
    estimate_s: float | None = None
    detail: str = ""
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r} is not one of {PHASES}")


Sink = Callable[[ProgressEvent], None]

_SINKS: list[Sink] = []
_LOCK = threading.Lock()
_TRIAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("tunelab_progress_trial", default=None)


def add_sink(sink: Sink) -> None:
    """Send every later event to ``sink`` (called in the emitting thread)."""
    with _LOCK:
        _SINKS.append(sink)


def remove_sink(sink: Sink) -> None:
    """Stop sending events to ``sink`` (no error if it was not added)."""
    with _LOCK:
        with contextlib.suppress(ValueError):
            _SINKS.remove(sink)


def sinks() -> list[Sink]:
    """The sinks now registered (a copy)."""
    with _LOCK:
        return list(_SINKS)


@contextlib.contextmanager
def current_trial(trial_id: str | None) -> Iterator[None]:
    """Within the block (this thread's context, and asyncio tasks started from it), events without a
    ``trial_id`` belong to ``trial_id``."""
    token = _TRIAL.set(trial_id)
    try:
        yield
    finally:
        _TRIAL.reset(token)


def emit(phase: str, **fields) -> ProgressEvent | None:
    """Send one :class:`ProgressEvent` to every sink; returns it (None when there is no sink, and nothing is
    built). A sink that raises is removed (a display must never cost a sweep); ``ValueError`` for an unknown
    phase or field is raised to the caller, a programming error."""
    with _LOCK:
        targets = list(_SINKS)
    if not targets:
        return None
    fields.setdefault("trial_id", _TRIAL.get())
    ev = ProgressEvent(phase=phase, **fields)
    for s in targets:
        try:
            s(ev)
        except Exception:
            remove_sink(s)
    return ev
