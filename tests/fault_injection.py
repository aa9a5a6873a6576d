"""FAULT INJECTION for end-to-end tests: stall a real ``vllm serve`` while tunelab measures it.

Nothing in tunelab imports this module; it lives with the tests (and the benchmark that reuses it). It acts
on a server from the outside, the way a noisy host would: the server's process group is stopped and
continued (SIGSTOP/SIGCONT) on a duty cycle, so every process of the server (API server and engine) makes
no progress for most of the time. The load generator and the measurement code run unchanged.

- :class:`ProcessGroupStall` stops a process group ``stop_s`` seconds, lets it run ``run_s`` seconds, and so
  on until halted; it always leaves the group continued.
- :class:`StallOneRepeat` follows the log lines of a ``tunelab run`` process and stalls one measured repeat
  of the first trial: it starts when the previous repeat's last request is logged (``<workload> c=<n>
  repeat k/R: N/N requests``, written by ``tunelab/flows/trial.py`` at the end of every window) and stops when the
  stalled repeat's last request is logged, so the stall covers that whole window and no other. The server is
  found in tunelab's state file (``tasks.engine.tracked_servers``) by the owner pid of the ``tunelab run``
  process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from tunelab.tasks.engine import tracked_servers  # imported up front: a first import at the trigger costs ~0.3 s

__all__ = ["ProcessGroupStall", "StallOneRepeat", "StallReport", "run_with_stall"]


@dataclass
class StallReport:
    """What a stall did: ``slices`` stop periods, ``stopped_s`` seconds stopped out of ``wall_s`` seconds."""

    pgid: int | None = None
    trial_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    realtime: bool = False  # the duty-cycle thread ran under SCHED_FIFO
    slices: int = 0
    stopped_s: float = 0.0
    wall_s: float = 0.0
    events: list[str] = field(default_factory=list)

    @property
    def stopped_frac(self) -> float:
        return self.stopped_s / self.wall_s if self.wall_s else 0.0


class ProcessGroupStall:
    """FAULT INJECTION: SIGSTOP the process group ``pgid`` for ``stop_s`` s, SIGCONT it for ``run_s`` s, repeat.

    Runs in a daemon thread between :meth:`start` and :meth:`halt` (or until the group is gone, or
    ``max_s`` seconds as a safety net). The group is always continued when the thread ends.
    """

    def __init__(self, pgid: int, stop_s: float = 0.2, run_s: float = 0.005, max_s: float = 120.0):
        self.pgid, self.stop_s, self.run_s, self.max_s = pgid, stop_s, run_s, max_s
        self.report = StallReport(pgid=pgid)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"stall-{pgid}", daemon=True)

    def start(self) -> "ProcessGroupStall":
        """Stop the group now (in the caller's thread, so no time is lost) and run the duty cycle."""
        self._t0 = time.monotonic()
        self.report.started_at = time.time()
        self._stopped = self._signal(signal.SIGSTOP)
        self._thread.start()
        return self

    def halt(self) -> StallReport:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.report

    def _signal(self, sig: int) -> bool:
        try:
            os.killpg(self.pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def _loop(self) -> None:
        # Real-time priority for this thread where allowed (Linux applies it to the calling thread): on a loaded
        # box a normal thread woke up tens of ms late, which let the server run several engine steps per
        # "5 ms" run slice and made the stall far weaker than asked for. The thread sleeps almost all the time.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            self.report.realtime = True
        except (AttributeError, OSError):
            pass
        t0 = s0 = self._t0  # s0: when the group was last stopped
        stopped = self._stopped
        try:
            while stopped and time.monotonic() - t0 < self.max_s:
                halted = self._halt.wait(self.stop_s)
                self._signal(signal.SIGCONT)
                self.report.stopped_s += time.monotonic() - s0
                self.report.slices += 1
                if halted or self._halt.wait(self.run_s):
                    break
                stopped = self._signal(signal.SIGSTOP)
                s0 = time.monotonic()
        finally:
            self._signal(signal.SIGCONT)
            self.report.wall_s = time.monotonic() - t0
            self.report.ended_at = time.time()


class StallOneRepeat:
    """FAULT INJECTION driven by a ``tunelab run`` log: stall measured repeat ``repeat`` (0-based, >= 1) of the
    first trial of the sweep run by process ``owner_pid``. Feed it every output line with :meth:`feed`;
    call :meth:`close` at the end (continues the server if a stall is still running). :meth:`feed` never raises
    (it runs in the thread that drains the sweep's output): a failure ends the injection and is recorded in
    ``report.events`` with ``report.trial_id`` left None."""

    def __init__(self, owner_pid: int, repeat: int, repeats: int, stop_s: float = 0.2, run_s: float = 0.005):
        if not 1 <= repeat < repeats:
            raise ValueError("repeat must be a later repeat (1 .. repeats-1): the one before it starts the stall")
        self.owner_pid, self.repeat, self.repeats = owner_pid, repeat, repeats
        self.stop_s, self.run_s = stop_s, run_s
        self._start_re = re.compile(rf"repeat {repeat}/{repeats}: (\d+)/\1 requests")
        self._end_re = re.compile(rf"repeat {repeat + 1}/{repeats}: (\d+)/\1 requests")
        self.stall: ProcessGroupStall | None = None
        self.report: StallReport | None = None

    def _server(self) -> dict:
        ours = [e for e in tracked_servers() if e.get("owner_pid") == self.owner_pid]
        if len(ours) != 1:
            raise RuntimeError(f"expected one live server of process {self.owner_pid} in the state file, "
                               f"found {len(ours)}")
        return ours[0]

    def feed(self, line: str) -> None:
        if self.report is not None:
            return  # one stall per sweep: the first trial's
        try:
            if self.stall is None and self._start_re.search(line):
                entry = self._server()
                self.stall = ProcessGroupStall(int(entry["pgid"]), self.stop_s, self.run_s).start()
                self.stall.report.trial_id = entry["trial_id"]
                self.stall.report.events.append(f"start after: {line.strip()}")
            elif self.stall is not None and self._end_re.search(line):
                self.report = self.stall.halt()
                self.report.events.append(f"end after: {line.strip()}")
        except Exception as e:  # never break the reader: record and stop injecting
            self.report = self.stall.halt() if self.stall is not None else StallReport()
            self.report.trial_id = None
            self.report.events.append(f"injection failed: {type(e).__name__}: {e}")

    def close(self) -> StallReport | None:
        if self.stall is not None and self.report is None:
            self.report = self.stall.halt()
            self.report.events.append("end: closed before the stalled repeat was logged as finished")
        return self.report


def run_with_stall(cmd: list[str], cwd, env: dict, repeat: int, repeats: int, timeout_s: float = 900,
                   **stall: float) -> tuple[int, str, StallReport | None]:
    """Run ``cmd`` (a ``tunelab run``) and stall measured repeat ``repeat`` of its first trial
    (:class:`StallOneRepeat`; ``stall`` passes ``stop_s``/``run_s``). The process is killed after ``timeout_s``.

    Returns:
        (return code, the process's stdout and stderr, the stall report or None if no stall started).
    """
    p = subprocess.Popen(cmd, cwd=cwd, env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    injector = StallOneRepeat(p.pid, repeat, repeats, **stall)
    lines: list[str] = []

    def follow() -> None:
        for line in p.stdout:
            lines.append(line)
            injector.feed(line)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    finally:
        reader.join(timeout=10)
        report = injector.close()
    return p.returncode, "".join(lines), report
