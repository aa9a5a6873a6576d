"""Prefect settings tunelab needs, applied before ``prefect`` is imported.

- ``PREFECT_HOME`` inside the tunelab home unless the user set one (``import prefect`` creates it).
- No telemetry: ``DO_NOT_TRACK=1`` and ``PREFECT_SERVER_ANALYTICS_ENABLED=false`` (the latter also removed
  an intermittent "database is locked" error of the ephemeral server).
- The ephemeral server gets 90 s to start by Prefect's own setting: it took 5.7-10 s on a loaded 2-core box
  against a 20 s default. :func:`start_ephemeral_server` waits longer still (default 300 s, or Prefect's setting
  when that is longer): on a host at load 8-18 it took over 100 s, and a user's
  ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=1`` made every start fail with a traceback. A user's
  ``TUNELAB_PREFECT_START_TIMEOUT_S`` is the bound, shorter or longer than Prefect's setting (that setting, 90 s
  by :func:`configure`'s default, used to be a floor under it), and it is wall-clock time: Prefect's own wait
  counts only its 0.1 s sleeps, not the time its health requests take, so on a loaded host it waited longer than
  its timeout; tunelab waits with a deadline of its own. When the bound passes it raises
  :class:`PrefectUnavailable`, one line the command line prints before it exits 4.
Without ``PREFECT_API_URL`` Prefect runs ephemeral. With it, runs go to that server.

The ephemeral server (:func:`start_ephemeral_server`). Prefect starts it as a plain child process
(``SubprocessASGIServer``: uvicorn), stopped by an ``atexit`` hook. Two things went wrong with that:

- Ctrl-C in a terminal sends SIGINT to the whole foreground process group, the server included: it shut down
  at once, and the sweep, recording the interrupted runs' states on the way out, hung in the Prefect client's
  connection retries against the dead server until a second Ctrl-C. tunelab starts the server in its own
  session, out of the terminal's reach; the ``atexit`` hook still stops it after the last state is written.
- SIGKILL of the sweep (OOM killer, ``kill -9``) skips ``atexit``: the server ran on, orphaned, for good.
  A guard process (a few lines of Python, no imports beyond the standard library) holds a pidfd of the server
  and the read end of a pipe whose write end only the sweep holds; the kernel closes it when the sweep dies,
  however it dies, and the guard then stops the server (SIGTERM, 5 s, SIGKILL). A pidfd never reaches
  another process that reused the server's PID.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

from tunelab.host import paths

__all__ = ["PrefectUnavailable", "START_TIMEOUT_ENV", "configure", "start_bound_s", "start_ephemeral_server"]

#: The environment variable that bounds the wait for the ephemeral server, seconds (default 300).
START_TIMEOUT_ENV = "TUNELAB_PREFECT_START_TIMEOUT_S"
_DEFAULT_START_S = 300.0


class PrefectUnavailable(RuntimeError):
    """Prefect's temporary API server did not answer within :func:`start_bound_s`; the message is one line that
    says how long tunelab waited, the host's load and the two fixes (a longer bound, or a running server)."""


def start_bound_s() -> float:
    """How long :func:`start_ephemeral_server` waits for the server, wall-clock seconds:
    ``TUNELAB_PREFECT_START_TIMEOUT_S`` when set (whatever Prefect's setting; the user's word for tunelab), else
    300 or Prefect's ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` if that is longer.

    Raises:
        PrefectUnavailable: ``TUNELAB_PREFECT_START_TIMEOUT_S`` is not a positive number.
    """
    raw = os.environ.get(START_TIMEOUT_ENV)
    try:
        ours = float(raw) if raw else _DEFAULT_START_S
        if not ours > 0:
            raise ValueError
    except ValueError:
        raise PrefectUnavailable(f"{START_TIMEOUT_ENV}={raw!r}: not a positive number of seconds; unset it (300 s) "
                                 "or give e.g. 600") from None
    if raw:
        return ours
    try:
        theirs = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 0)
    except ValueError:
        theirs = 0.0
    return max(ours, theirs)


def configure() -> None:
    """Set Prefect's environment defaults (never overriding what the user set)."""
    os.environ.setdefault("PREFECT_HOME", str(paths.prefect_home()))
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")


_GUARD = """
import os, select, signal, sys
try:
    fd = os.pidfd_open(int(sys.argv[1]))
except OSError:
    sys.exit(0)
sys.stdin.buffer.read()  # EOF: the process that started us is gone
try:
    signal.pidfd_send_signal(fd, signal.SIGTERM)
    if not select.select([fd], [], [], 5.0)[0]:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
except ProcessLookupError:
    pass
"""

_guards: list[tuple[subprocess.Popen, int]] = []


class _OwnSessionPopen(subprocess.Popen):
    """``subprocess.Popen`` that starts the child in its own session (not in the terminal's process group) and
    puts it under a guard at once, so that it dies with this process from its first moment on."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("start_new_session", True)
        super().__init__(*args, **kwargs)
        _guard_process(self.pid)


def _guard_process(pid: int) -> None:
    """Start a guard that stops ``pid`` when this process dies (see the module notes)."""
    r, w = os.pipe()  # both ends non-inheritable: no other child of ours keeps the write end open
    try:
        g = subprocess.Popen([sys.executable, "-I", "-c", _GUARD, str(pid)], stdin=r, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(r)
    _guards.append((g, w))  # the write end stays open as long as this process lives


def _subprocess_with_own_session() -> types.ModuleType:
    """A stand-in for the ``subprocess`` module whose ``Popen`` starts children in their own session."""
    mod = types.ModuleType("subprocess")
    mod.__dict__.update(subprocess.__dict__)
    mod.Popen = _OwnSessionPopen
    return mod


def _start_within(srv, bound_s: float) -> None:
    """``SubprocessASGIServer.start`` with a wall-clock deadline of ``bound_s`` (Prefect's loop counts its sleeps
    only): start the uvicorn process, poll ``/health`` until it answers 200. Its port taken (exit code 3): a new
    port, as Prefect does. Marks the server running (Prefect's later ``start`` calls are then no-ops) and stops it
    at exit as Prefect does.

    Raises:
        RuntimeError: the server exited while starting (its code), or did not answer within ``bound_s``.
    """
    import atexit
    import time

    import httpx

    if srv.running:
        return
    srv.port = srv.port or srv.find_available_port()
    deadline = time.monotonic() + bound_s
    srv.running = True
    try:
        srv.server_process = srv._run_uvicorn_command()
        atexit.register(srv.stop)
        with httpx.Client() as client:
            while True:
                code = srv.server_process.poll()
                if code == 3:  # port taken between the check and the bind (Prefect retries the same way)
                    srv.port = srv.find_available_port()
                    srv.server_process = srv._run_uvicorn_command()
                    continue
                if code is not None:
                    raise RuntimeError(f"the ephemeral Prefect API server exited with code {code}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the ephemeral Prefect API server did not answer within {bound_s:g} s")
                try:
                    if client.get(f"{srv.api_url}/health", timeout=min(left, 5.0)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    except BaseException:
        srv.running = False
        raise


def start_ephemeral_server() -> int | None:
    """Start Prefect's ephemeral API server now, in its own session and guarded so that it dies with this
    process (see the module notes); returns its PID. Does nothing (None) when ``PREFECT_API_URL`` names a
    server. Prefect's client then uses this server: it is the instance ``SubprocessASGIServer()`` returns.

    Waits up to :func:`start_bound_s` for the server to answer.

    Raises:
        PrefectUnavailable: it did not answer in time, or exited (one line: how long, the load, the fixes).
    """
    if os.environ.get("PREFECT_API_URL"):
        return None
    from prefect.server.api import server as server_mod

    # Only the uvicorn command of that module starts processes; Prefect's own code is left as it is.
    server_mod.subprocess = _subprocess_with_own_session()
    srv = server_mod.SubprocessASGIServer()
    bound = start_bound_s()
    try:
        _start_within(srv, bound)
    except Exception as e:
        exited = srv.server_process.poll() if srv.server_process is not None else None
        try:
            srv.stop()
        except Exception:  # already gone: the guard process stops it anyway
            pass
        load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "unknown"
        what = (f"exited with code {exited} while starting" if exited is not None
                else f"did not answer within {bound:.0f} s")
        raise PrefectUnavailable(
            f"Prefect's temporary API server {what} (host load {load}; {type(e).__name__}); nothing ran. Wait "
            f"longer with {START_TIMEOUT_ENV}=600, or start one server (`prefect server start`) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api") from e
    proc = srv.server_process
    if proc is None:
        return None
    return proc.pid
