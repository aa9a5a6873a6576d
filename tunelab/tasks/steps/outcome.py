"""How a step's failure reaches its flow: one readable line in the run's log, then the exception in the flow.

A task that raises makes Prefect log "Task run failed with exception" with a traceback of its own frames, which
came in a trial's log before the one line that says why. The steps that expect a failure as an outcome (a boot
that fails, a measurement that fails) therefore log the reason first and either return a Failed state carrying
the exception (:func:`failed_state`, read back with :func:`task_value`) or raise a typed exception whose
traceback a logging filter turns into one line (``tasks.steps.boot.BootFailedLogFilter``).
"""

from __future__ import annotations

import logging
from typing import Any

from tunelab.core.markdown import shorten

__all__ = ["step_logger", "failed_state", "task_value"]


def step_logger() -> Any:
    """The Prefect run logger inside a flow or task run; the ``tunelab.tasks`` logger outside one (a test calling
    a task's ``.fn``), where Prefect's raises ``MissingContextError``."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("tunelab.tasks")


def failed_state(e: BaseException, why: str) -> Any:
    """Log the one-line reason ``why``, then return a Failed state with ``e`` as its data (the task ends Failed
    without raising: the red task bar stays, without Prefect's traceback). :func:`task_value` raises ``e``."""
    from prefect.states import Failed

    step_logger().error("%s", shorten(why, 500))
    return Failed(message=shorten(why, 300), data=e)


def task_value(out: Any) -> Any:
    """A task's return value; when the task returned its Failed state (:func:`failed_state`), raise the exception
    it carries here, in the flow, where it is recorded."""
    from prefect.states import State

    if isinstance(out, State):
        raise out.result(raise_on_failure=False)
    return out
