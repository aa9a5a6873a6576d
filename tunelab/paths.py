"""Where tunelab keeps its state: one home folder, overridable with ``TUNELAB_HOME``.

Default: ``./.tunelab`` in the current directory (the repository root when run from the README).
Layout::

    runtimes/<name>/          one vLLM installation (venv + runtime.json)
    models/<name>/            locally built models
    results/<sweep>/<trial>/  result bundles (written before loading)
    logs/<sweep>/             vllm serve logs per trial
    state/servers.json        servers tunelab started and has not yet seen stopped
    prefect/                  PREFECT_HOME for ephemeral runs
    warehouse.duckdb          the warehouse (``TUNELAB_DB`` overrides)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["home", "runtimes_dir", "models_dir", "results_dir", "logs_dir", "state_dir", "db_path", "prefect_home"]


def home() -> Path:
    """The tunelab home folder (created on first use)."""
    p = Path(os.environ.get("TUNELAB_HOME", ".tunelab")).resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def _sub(name: str) -> Path:
    p = home() / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def runtimes_dir() -> Path:
    return _sub("runtimes")


def models_dir() -> Path:
    return _sub("models")


def results_dir() -> Path:
    return Path(os.environ["TUNELAB_RESULTS"]).resolve() if os.environ.get("TUNELAB_RESULTS") else _sub("results")


def logs_dir() -> Path:
    return _sub("logs")


def state_dir() -> Path:
    return _sub("state")


def prefect_home() -> Path:
    return _sub("prefect")


def db_path() -> Path:
    return Path(os.environ["TUNELAB_DB"]).resolve() if os.environ.get("TUNELAB_DB") else home() / "warehouse.duckdb"
