"""Prefect settings tunelab needs, applied before ``prefect`` is imported.

- ``PREFECT_HOME`` inside the tunelab home unless the user set one (``import prefect`` creates it).
- No telemetry: ``DO_NOT_TRACK=1`` and ``PREFECT_SERVER_ANALYTICS_ENABLED=false`` (the latter also removed
  an intermittent "database is locked" error of the ephemeral server).
- The ephemeral server gets 90 s to start: it took 5.7-10 s on a loaded 2-core box against a 20 s default.
Without ``PREFECT_API_URL`` Prefect runs ephemeral: no server to start. With it, runs go to that server.
"""

from __future__ import annotations

import os

from tunelab import paths

__all__ = ["configure"]


def configure() -> None:
    """Set Prefect's environment defaults (never overriding what the user set)."""
    os.environ.setdefault("PREFECT_HOME", str(paths.prefect_home()))
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
