"""Task ``load``: the bundles on disk into the warehouse (``warehouse.loader.load_pending``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tunelab.tasks.steps.outcome import step_logger
from tunelab.warehouse.loader import DEFAULT_LOCK_TIMEOUT_S, WarehouseLocked, load_pending

__all__ = ["load_task"]


@task(name="load", cache_policy=NO_CACHE)
def load_task(db: Path, results: Path, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> dict[str, Any]:
    """Load every bundle not yet in the warehouse. A bundle that fails to load stays on disk (logged with its
    reason) for a later `tunelab load`.

    Returns:
        ``{"loaded": n, "locked": None}``; when another process held the warehouse file for ``lock_timeout_s``
        seconds: ``{"loaded": 0, "locked": {"holder_pid", "holder_exe", "error"}}`` (from
        :class:`warehouse.loader.WarehouseLocked`; the PID is None when DuckDB did not name it). The lock is an
        outcome, not a failure of the task: every bundle is safe on disk, and a raised error here cost the sweep
        its report (and printed three tracebacks: task, flow, command).
    """
    logger = step_logger()
    try:
        results_ = load_pending(db, results, lock_timeout_s=lock_timeout_s)
    except WarehouseLocked as e:
        logger.warning("warehouse %s is locked by %s: nothing loaded; the bundles stay in %s for `tunelab load`",
                       db, e.holder, results)
        return {"loaded": 0, "locked": {"holder_pid": e.holder_pid, "holder_exe": e.holder_exe, "error": str(e)}}
    for r in results_:
        if r.status == "failed":
            logger.error("bundle %s not loaded: %s", r.bundle_dir, r.error)
    return {"loaded": len([r for r in results_ if r.status == "loaded"]), "locked": None}
