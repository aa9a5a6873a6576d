"""Task ``boot``: start ``vllm serve`` and wait until it really serves, or raise why not.

A failed boot raises ``tasks.engine.BootFailed`` with its classified failure (``failure_class``, ``reason``,
``retryable``; ``tasks.bootlog``), the server already stopped. Prefect runs the task once more
(``retries=BOOT_RETRIES``) only when the failure was transient (:func:`retry_transient`: a port taken between
choosing and binding it, a corrupted compile cache); the trial records ``trials.boot_attempts`` and
``boot_retry_reason`` from :class:`TrialBoots`.

A boot failure is an expected outcome, not a bug: the task logs it as one line, and
:class:`BootFailedLogFilter` keeps Prefect's "Task run failed with exception" record of it to one line too,
instead of a traceback of Prefect's frames per failed boot.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from tunelab.core.markdown import shorten
from tunelab.tasks import bootlog, compile_cache
from tunelab.host.runtime import Runtime
from tunelab.tasks.engine import BootFailed, EngineServer, group_members
from tunelab.tasks.gpu import placement_problem, server_placement
from tunelab.tasks.steps.outcome import step_logger

__all__ = ["boot_task", "TrialBoots", "retry_transient", "BOOT_RETRIES", "BootFailedLogFilter",
           "install_boot_log_filter", "boot_failure_reason", "WrongDevice", "placement_check"]

#: Boots of one trial after the first: one more after a transient failure (Prefect task retries).
BOOT_RETRIES = 1


class TrialBoots:
    """The boots of one trial: a fresh :class:`EngineServer` per attempt (one object = one server), the compile
    lock around each (``tasks.compile_cache``), the failure of each attempt.

    ``make(log_path)`` builds the server of an attempt. ``server`` is the current attempt's server (measured and
    torn down by the trial); ``attempts`` counts the boots started; ``first_failure`` is 'class: reason' of the
    first transient failure, the reason of a retry (``trials.boot_retry_reason``)."""

    def __init__(self, make: Callable[[Path], EngineServer], log_path: Path, runtime_name: str, compile_key: str,
                 log: Any = None):
        self.make, self.log_path, self.runtime_name, self.compile_key = make, log_path, runtime_name, compile_key
        self.log = log
        self.server: EngineServer = make(log_path)
        self.attempts = 0
        self.first_failure: str | None = None

    def attempt(self) -> dict[str, Any]:
        """Boot once more (a new server after the first attempt).

        Returns:
            ``{"boot_s", "health_s", "port"}`` (seconds from Popen to ready and to the first /health 200).

        Raises:
            BootFailed: with ``failure`` set (``bootlog.BootFailure``), the server stopped.
        """
        if self.attempts:  # a retry: a new server, its own log; the earlier attempt's log stays next to it
            if self.log_path.exists():
                self.log_path.rename(self.log_path.with_name(f"{self.log_path.stem}.attempt{self.attempts}.log"))
            self.server = self.make(self.log_path)
        self.attempts += 1
        server = self.server
        with compile_cache.first_compile(self.runtime_name, self.compile_key, log=self.log):
            server.start()
            try:
                b = server.wait_ready()
            except BootFailed as e:
                server.stop()
                e.failure = self._classify(e)
                if self.first_failure is None and e.failure.transient:
                    self.first_failure = f"{e.failure.failure_class}: {e.failure.reason}"[:2000]
                raise
            except BaseException:
                server.stop()
                raise
            compile_cache.mark_warm(self.runtime_name, self.compile_key)
        return {"boot_s": b.boot_s, "health_s": b.health_s, "port": b.port}

    def _classify(self, e: BootFailed) -> bootlog.BootFailure:
        """The attempt's failure from the server's log; a port conflict is transient, and a corrupted compile
        cache is moved aside (so the retry boots cold)."""
        fail = e.classify()
        if e.kind == "not_ours":  # another program took the port between free_port() and bind
            fail = bootlog.BootFailure(failure_class="crash", reason=str(e), retryable=True, transient=True)
        if fail.failure_class == "compile_cache_corrupt":
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            moved = compile_cache.move_aside(self.runtime_name, self.compile_key, bootlog.corrupt_cache_dir(text))
            fail.reason += f" (cache moved aside to {moved})" if moved else ""
        return fail


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` of the boot task: retry only a boot whose failure was transient
    (``bootlog.BootFailure.transient``: a port in use, a corrupted compile cache, ...). A config that cannot boot
    (OOM, invalid config) or a timeout is not booted again. ``state``: the Failed state Prefect built around
    what the task raised."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            state.result()
            return False
        except BaseException as e:  # noqa: BLE001 - only looked at
            exc = e
    fail = getattr(exc, "failure", None) if isinstance(exc, BootFailed) else None
    return bool(fail is not None and fail.transient)


class BootFailedLogFilter(logging.Filter):
    """Keeps Prefect's own record of a failed boot to one line: a record of the task-run logger that carries a
    ``BootFailed`` as its exception ("Task run failed with exception: BootFailed(...) - Retries are exhausted")
    loses the traceback, and its text is cut to one line. Any other exception keeps its traceback (a bug should
    show where it is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        if isinstance(exc, BootFailed):
            text = record.getMessage()
            record.msg = shorten(" ".join(text.split()), 500)
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = BootFailedLogFilter()


def install_boot_log_filter() -> None:
    """Put :class:`BootFailedLogFilter` on Prefect's task-run logger (once; Prefect's logging set-up keeps a
    logger's filters)."""
    logger = logging.getLogger("prefect.task_runs")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


install_boot_log_filter()


@task(name="boot", cache_policy=NO_CACHE, retries=BOOT_RETRIES, retry_delay_seconds=1,
      retry_condition_fn=retry_transient)
def boot_task(server: "EngineServer | TrialBoots") -> dict[str, Any]:
    """Start ``vllm serve`` and wait until it really serves. Given the trial's :class:`TrialBoots`, each call is its
    next attempt (a fresh server), and Prefect runs the task once more (``retries``) when the failure was
    transient (:func:`retry_transient`).

    Returns:
        ``{"boot_s", "health_s", "port"}``.

    Raises:
        BootFailed: the server did not become ready (already stopped); its ``failure`` holds the class and the
            reason from the server's log (``reason``, ``retryable``), logged as one line first.
    """
    install_boot_log_filter()  # again: a test or a host may have replaced the logger's filters since import
    log = step_logger()
    if isinstance(server, TrialBoots):
        try:
            return server.attempt()
        except BootFailed as e:
            again = " - booting once more" if e.failure.transient and server.attempts <= BOOT_RETRIES else ""
            log.error("%s", shorten(f"boot failed ({e.failure_class}): {e.reason}{again}", 500))
            raise
    server.start()
    try:
        b = server.wait_ready()
    except BootFailed as e:
        server.stop()
        try:
            e.failure = e.classify()
            why = f"boot failed ({e.failure_class}): {e.reason}"
        except Exception:  # the classification is the trial's job; the launcher's message still says why
            why = f"boot failed: {e}"
        log.error("%s", shorten(why, 500))
        raise
    except BaseException:
        server.stop()
        raise
    return {"boot_s": b.boot_s, "health_s": b.health_s, "port": b.port}


def boot_failure_reason(e: BootFailed, fail: Any) -> str:
    """``trials.failure_reason`` of a failed boot: the launcher's message, then what the server's log says
    (``fail``: ``bootlog.BootFailure``). Kept whole; the terminal shortens it for display (``cli.short_reason``).

    A port conflict (``e.kind == 'not_ours'``) is the launcher's finding alone (who holds the port): our server's
    log knows nothing of it, and its classification ("server stopped before ready with no exit status") only
    contradicted the launcher's message."""
    return str(e) if e.kind == "not_ours" else f"{e}: {fail.reason}"


class WrongDevice(Exception):
    """NVML shows the server's processes on other GPUs than the trial was given (the text says where)."""


def placement_check(server: EngineServer, runtime: Runtime, intended: list[int]) -> str | None:
    """After boot: where NVML sees the server's process group against the GPUs it was given
    (``tasks.gpu.placement_problem``); None when right, on a CPU runtime, or when NVML cannot tell."""
    if runtime.device != "cuda" or not intended or server.proc is None:
        return None
    return placement_problem(intended, server_placement(group_members(server.proc.pid)))
