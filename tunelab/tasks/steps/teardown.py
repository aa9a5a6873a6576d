"""Task ``teardown``: stop the server's process group (``tasks.engine.EngineServer.stop``)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tunelab.tasks.engine import EngineServer

__all__ = ["teardown_task"]


@task(name="teardown", cache_policy=NO_CACHE)
def teardown_task(server: EngineServer) -> dict[str, Any]:
    """Stop the process group (SIGTERM, grace, SIGKILL), wait for the port; timings in seconds.

    Returns:
        The ``tasks.engine.TeardownResult`` fields as a dict (``total_s``, ``clean``, ``detail``, ...).
    """
    td = server.stop()
    return dict(td.__dict__)
