"""The live display of ``tunelab run``: renders the sweep's progress events (``tunelab.core.progress``).

On a terminal: a rich ``Live`` panel, redrawn 4 times a second: trial k of N with its config label and
phase, the time in that phase (a boot counts up against its typical length), progress of the window's
requests with the time left in the window, and an estimate of the time left in the sweep. Elsewhere (CI, a
pipe, a file): plain lines, one per phase change and at most one per ``plain_interval_s`` seconds within a
window, so a log stays readable. The Prefect run logs are unaffected.

Time left. In a window: its elapsed time x (total - done) / done, once a request is done. In the sweep: before
the first trial ends, the plan's estimate (``tunelab.core.plan_cost``, sent with the ``sweep`` event) minus the
time elapsed; then the mean duration of the trials ended so far x the trials not yet ended.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable

from tunelab.core import progress as P
from tunelab.core.plan_cost import load_note

__all__ = ["SweepDisplay", "fmt_s", "window_left_s"]


def fmt_s(seconds: float | None) -> str:
    """``seconds`` as ``'42 s'``, ``'3 min 05 s'``, ``'2 h 04 min'``; ``'?'`` for None."""
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def window_left_s(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left in a window at the pace so far: ``elapsed_s x (total - done) / done``; None before the
    first request is done."""
    if done <= 0 or total <= 0:
        return None
    return elapsed_s * max(total - done, 0) / done


@dataclass
class _State:
    trials_total: int | None = None
    estimate_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    trial_index: int | None = None
    trial_label: str = ""
    trial_started: float | None = None
    trials_ended: int = 0
    trial_seconds: float = 0.0
    phase: str = "sweep"
    phase_started: float = field(default_factory=time.monotonic)
    phase_estimate_s: float | None = None
    window: str = ""
    window_label: str = ""
    done: int | None = None
    total: int | None = None
    wait_started: float | None = None  # when the trial began to wait for its device (phase ``wait``)
    wait_detail: str = ""
    # The prompts being built are a level's warm-up (its label, e.g. "w c=4"), not the window shown last.
    prompts_warmup: str | None = None


class SweepDisplay:
    """A progress sink (``tunelab.core.progress``) that shows the sweep: a live panel on a terminal, plain lines
    elsewhere. Use as a context manager: it registers itself as a sink on entry and removes itself on exit.

    Args:
        out: the stream (default ``sys.stdout``); terminal: whether to draw the live panel (default:
            ``out.isatty()``); plain_interval_s: least seconds between two plain lines of one window;
        clock: monotonic clock (tests).
    """

    def __init__(self, out: IO[str] | None = None, terminal: bool | None = None, plain_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        import sys

        self.out = out or sys.stdout
        self.terminal = bool(self.out.isatty()) if terminal is None else terminal
        self.plain_interval_s = plain_interval_s
        self.clock = clock
        self.state = _State(started=clock(), phase_started=clock())
        self._lock = threading.Lock()
        self._last_plain = float("-inf")
        self._live: Any = None

    # -- sink ---------------------------------------------------------------------------------------------
    def __call__(self, ev: P.ProgressEvent) -> None:
        with self._lock:
            line = self._apply(ev)
        if self.terminal:
            if self._live is not None:
                self._live.update(self._render())
        elif line is not None:
            self.out.write(line + "\n")
            self.out.flush()

    def _apply(self, ev: P.ProgressEvent) -> str | None:
        """Update the state with ``ev``; return the plain line it gives (None: nothing to print now)."""
        st, now = self.state, self.clock()
        if ev.phase == "sweep":
            st.trials_total, st.estimate_s, st.started = ev.trials_total, ev.estimate_s, now
            n = ev.trials_total if ev.trials_total is not None else "?"
            detail = "; ".join(d for d in (ev.detail, load_note()) if d)
            return f"sweep: {n} trial(s); estimated {fmt_s(ev.estimate_s)} ({detail})"
        if ev.phase == "wait":
            # Waiting for a device another sweep holds: the previous trial has ended, this one has not started, and
            # the wait is no work of this sweep (the estimate's clock stops until the trial starts).
            if st.trial_started is not None:
                st.trials_ended += 1
                st.trial_seconds += now - st.trial_started
                st.trial_started = None
            if st.phase != "wait":
                st.wait_started = now
            st.trial_index, st.trial_label = ev.trial_index, ev.label or ""
            st.trials_total = ev.trials_total or st.trials_total
            st.phase, st.phase_started, st.phase_estimate_s = "wait", st.wait_started, None
            st.wait_detail = ev.detail
            return f"{self._head()}: {self._phase_text()}"
        if ev.phase == "trial":
            if st.phase == "wait" and st.wait_started is not None:
                st.started += now - st.wait_started
                st.wait_started = None
            if st.trial_started is not None:
                st.trials_ended += 1
                st.trial_seconds += now - st.trial_started
            st.trial_index, st.trial_label, st.trial_started = ev.trial_index, ev.label or "", now
            st.trials_total = ev.trials_total or st.trials_total
            st.window, st.done, st.total = "", None, None
            st.phase, st.phase_started, st.phase_estimate_s = "trial", now, None
            return f"{self._head()}: starts; sweep time left {fmt_s(self.sweep_left_s())}"
        new_phase = ev.phase != st.phase or (ev.phase == "window" and ev.window_index is not None
                                             and f"{ev.window_index}/{ev.windows_total}" != st.window)
        if new_phase:
            st.phase, st.phase_started, st.phase_estimate_s = ev.phase, now, ev.estimate_s
        if ev.phase in ("validate", "load", "report", "done") and st.trial_started is not None:
            st.trials_ended += 1
            st.trial_seconds += now - st.trial_started
            st.trial_started = None
        if ev.phase == "prompts" and (ev.label or ev.window_index is not None):  # a build starts (chunks carry neither)
            # A warm-up's prompts come with its label and no window: "for window k/n" named the last window.
            st.prompts_warmup = None if ev.window_index is not None else (ev.label or "").removesuffix(" warm-up")
        if ev.window_index is not None:
            st.window = f"{ev.window_index}/{ev.windows_total}"
        if ev.phase == "window":
            st.window_label = ev.label or st.window_label
        st.done, st.total = ev.done, ev.total
        if new_phase:
            self._last_plain = now
            return f"{self._head()}: {self._phase_text()}"
        if ev.phase in ("window", "warmup") and ev.done is not None and (
                ev.done == ev.total or now - self._last_plain >= self.plain_interval_s):
            self._last_plain = now
            return f"{self._head()}: {self._phase_text()}"
        return None

    # -- text ---------------------------------------------------------------------------------------------
    def _head(self) -> str:
        st = self.state
        if st.trial_index is None:
            return "sweep"
        return f"trial {st.trial_index}/{st.trials_total or '?'} {st.trial_label}".rstrip()

    def _phase_text(self) -> str:
        st, now = self.state, self.clock()
        in_phase = now - st.phase_started
        if st.phase == "window":
            text = f"window {st.window} {st.window_label}"
            if st.done is not None and st.total:
                text += f": {st.done}/{st.total} requests"
                left = window_left_s(in_phase, st.done, st.total) if st.done < st.total else None
                if left is not None:  # a finished window has nothing left to say (it read "~0 s left")
                    text += f", ~{fmt_s(left)} left in the window"
            return text
        if st.phase == "wait":
            return f"waiting for a device ({st.wait_detail})" if st.wait_detail else "waiting for a device"
        names = {"sweep": "starting (Prefect, checks, leftovers)", "trial": "starting (device slot)",
                 "clean": "checking the device is clean", "boot": "booting the server",
                 "prompts": "building prompts", "warmup": "warm-up", "teardown": "tearing the server down",
                 "validate": "validating (quality gate)", "load": "loading into the warehouse",
                 "report": "writing the report", "done": "done"}
        text = names.get(st.phase, st.phase)
        if st.phase == "prompts" and st.prompts_warmup is not None:
            text = "building warm-up prompts" + (f" ({st.total} for {st.prompts_warmup})" if st.total else "")
        elif st.phase == "prompts" and st.total:
            text += f" ({st.total} for window {st.window or '?'})" if st.window else f" ({st.total})"
        if st.phase == "warmup" and st.total:
            text += f": {st.done or 0}/{st.total} requests"
        if st.phase == "boot" and st.phase_estimate_s:
            text += f" (typically ~{fmt_s(st.phase_estimate_s)})"
        return text

    def sweep_left_s(self) -> float | None:
        """Estimated seconds left in the sweep (module docstring); None when unknown."""
        st, now = self.state, self.clock()
        if st.trials_ended and st.trials_total:
            per = st.trial_seconds / st.trials_ended
            in_this = (now - st.trial_started) if st.trial_started is not None else 0.0
            return max(per * (st.trials_total - st.trials_ended) - in_this, 0.0)
        if st.estimate_s is not None:
            return max(st.estimate_s - (now - st.started), 0.0)
        return None

    def _render(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        with self._lock:
            st, now = self.state, self.clock()
            t = Table.grid(padding=(0, 1))
            t.add_row(f"[bold]{self._head()}[/]", f"[cyan]{self._phase_text()}[/]",
                      f"{fmt_s(now - st.phase_started)} in this phase")
            if st.phase in ("window", "warmup") and st.total:
                t.add_row("", ProgressBar(total=st.total, completed=st.done or 0, width=40), "")
            t.add_row("", f"sweep: {fmt_s(now - st.started)} elapsed, ~{fmt_s(self.sweep_left_s())} left", "")
            return t

    # -- context ------------------------------------------------------------------------------------------
    def __enter__(self) -> "SweepDisplay":
        if self.terminal:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._render(), console=Console(file=self.out), refresh_per_second=4,
                              transient=True, get_renderable=self._render)
            self._live.__enter__()
        P.add_sink(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        P.remove_sink(self)
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
