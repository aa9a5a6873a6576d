"""Cancellation from the Prefect UI/API for a flow run that no Prefect runner or worker supervises.

How Prefect 3 cancels a run: the UI/API sets the run's state to Cancelling; the runner or worker that started
the run's process (a deployment run: ``tunelab serve``, ``prefect worker``) sees it, tells the process over
its control channel that the coming SIGTERM is a cancellation, and sends SIGTERM. In the process, Prefect's
SIGTERM bridge raises ``TerminationSignal``; every ``finally`` runs (tunelab tears its servers down and writes
``cancelled`` bundles) and the engine records the run Cancelled. Without the "cancel" intent the engine
records a SIGTERM as Crashed.

A run started directly (``tunelab run`` with ``PREFECT_API_URL``) has no runner: cancelling it in the UI only
set the state to Cancelling while the sweep ran on to its end (measured with Prefect 3.9.1: the run then
stayed Cancelling for good). :func:`watch_for_cancel` plays the runner's part for such a run: it polls the
run's state and, on Cancelling, commits the "cancel" intent and sends SIGTERM to this process.

The intent is committed through ``prefect._internal.control_listener`` (Prefect has no public call for it);
should that ever fail, the run still stops and tears down, and Prefect records it Crashed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import threading
from typing import Callable, Iterator

__all__ = ["POLL_S", "watch_for_cancel", "clear_cancel_intent"]

#: Seconds between two reads of the run's state (one small API call each).
POLL_S = 2.0


def _commit_cancel_intent() -> bool:
    try:
        from prefect._internal import control_listener

        control_listener._set_intent("cancel")
        return True
    except Exception:  # a Prefect without it: the run ends Crashed instead of Cancelled
        return False


def clear_cancel_intent() -> None:
    """Forget a committed "cancel" intent once the cancelled flow has ended, so that a later flow run in the
    same interpreter does not take a bare SIGTERM for a cancellation."""
    try:
        from prefect._internal import control_listener

        control_listener.clear_intent()
    except Exception:
        pass


def _needs_watch() -> str | None:
    """The id of the current flow run if it needs the watch: a run without a deployment (nothing supervises
    it), against a real server (``PREFECT_API_URL``; an ephemeral server has no UI to cancel from), in the
    main thread (signals are delivered there)."""
    if not os.environ.get("PREFECT_API_URL") or threading.current_thread() is not threading.main_thread():
        return None
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx else None
    if run is None or run.deployment_id is not None:
        return None
    return str(run.id)


@contextlib.contextmanager
def watch_for_cancel(log: Callable[[str], None] | None = None, poll_s: float = POLL_S) -> Iterator[None]:
    """While the block runs inside a flow run that no runner supervises, stop it the way Prefect's runner
    would when it is cancelled from the UI/API: "cancel" intent, then SIGTERM to this process (so the
    ``TerminationSignal`` reaches the main thread wherever it is). Does nothing for deployment runs (their
    runner or worker does it) and for ephemeral runs."""
    run_id = _needs_watch()
    if run_id is None:
        yield
        return
    from prefect.client.orchestration import get_client

    stop = threading.Event()

    def watch() -> None:
        with get_client(sync_client=True) as client:
            while not stop.wait(poll_s):
                try:
                    state = client.read_flow_run(run_id).state
                except Exception:  # the server is briefly unreachable: try again
                    continue
                if state is not None and (state.is_cancelling() or state.is_cancelled()) and not stop.is_set():
                    if log:
                        log(f"flow run {run_id} was cancelled through the Prefect API/UI: stopping the sweep")
                    _commit_cancel_intent()
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

    # The thread carries this context: Prefect's settings (the API URL) live in a context variable.
    th = threading.Thread(target=contextvars.copy_context().run, args=(watch,), name="tunelab-cancel-watch",
                          daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
