"""The Prefect states and tags that say how a run ended, beyond what the engine sets on its own.

- A trial that booted and measured but failed the quality gate: its run (Completed when the trial ended, before the
  gate ran) is set to a COMPLETED-type state named ``QualityFailed`` whose message names the failed checks, and
  every validated trial run gets the tag ``quality:<verdict>`` (pass | warn | fail). Completed, not Failed: the trial
  ran and its data is in the warehouse; the gate left it out of comparisons.
- A sweep in which no trial ended ``ok`` (``tunelab run`` exits 1): the run gets the tag ``status:all_failed`` and,
  once the engine has ended it Completed, the FAILED-type state ``AllTrialsFailed`` (:func:`final_state_hook`). The
  flow still returns its summary to a Python caller.
- A run that an interruption nobody asked for through Prefect ended (Ctrl-C, a bare SIGTERM, SystemExit): Prefect
  ends it Crashed ("Crash detected!"); :func:`cancelled_not_crashed_hook` sets it Cancelled, as ``tunelab run``
  reports it (exit 130/143). A run cancelled through Prefect already ends Cancelled.

Views only: a state or tag that cannot be set is logged, never raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from tunelab.core.markdown import shorten

__all__ = ["ALL_FAILED_TAG", "QUALITY_FAILED", "final_state_hook", "cancelled_not_crashed_hook", "mark_all_failed",
           "mark_quality", "quality_failed_state"]

#: State name of a trial run that failed the quality gate (a COMPLETED-type state).
QUALITY_FAILED = "QualityFailed"
#: Tag of a sweep run in which no trial ended ok.
ALL_FAILED_TAG = "status:all_failed"
#: Prefect's messages of a Crashed state made from an interruption (``prefect.states.exception_to_crashed_state``).
_INTERRUPTED = ("Execution was aborted by an interrupt signal.", "Execution was aborted by a termination signal.",
                "Execution was aborted by Python system exit call.")


def quality_failed_state(failed_checks: Iterable[str]) -> Any:
    """The state of a trial run whose bundle failed the quality gate: COMPLETED type, name :data:`QUALITY_FAILED`,
    message ``quality gate: fail (<check>, <check>, ...)`` shortened to 300 characters."""
    from prefect.states import Completed

    checks = ", ".join(failed_checks)
    return Completed(name=QUALITY_FAILED, message=shorten(f"quality gate: fail ({checks or 'see the report'})", 300))


def _failed_checks(bundle: Path | None) -> list[str]:
    """``suite/expectation`` of the fail-severity checks that did not pass in the bundle (empty when unreadable)."""
    if bundle is None:
        return []
    try:
        from tunelab.core.bundle import read_bundle

        qc = read_bundle(bundle, verify=False).get("quality_checks")
        if qc is None or qc.empty:
            return []
        bad = qc[(qc["success"] == False) & (qc["severity"] == "fail")]  # noqa: E712 - a nullable column
        return [f"{s}/{e}" for s, e in zip(bad["suite"], bad["expectation"])]
    except Exception:  # noqa: BLE001 - the message is a view
        return []


def _add_tag(client: Any, flow_run_id: Any, tag: str, drop_prefix: str) -> None:
    run = client.read_flow_run(flow_run_id)
    tags = [t for t in (run.tags or []) if not t.startswith(drop_prefix)] + [tag]
    client.update_flow_run(flow_run_id, tags=tags)


def mark_quality(trials: Iterable[tuple[Any, Mapping[str, Any], Path | None]], logger: Any) -> None:
    """After the quality gate: per trial ``(flow_run_id, status, bundle)`` (``status``: the sweep's status dict, with
    ``verdict``), the tag ``quality:<verdict>`` on each validated trial run, and :func:`quality_failed_state` on
    each ``ok`` trial whose verdict is ``fail``. Trials without a run id or a verdict are left as they are."""
    todo = [(fr, st, b) for fr, st, b in trials if fr is not None and st and st.get("verdict") in ("pass", "warn", "fail")]
    if not todo:
        return
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as c:
            for fr, st, b in todo:
                _add_tag(c, fr, f"quality:{st['verdict']}", "quality:")
                if st["verdict"] == "fail" and st.get("status") == "ok":
                    c.set_flow_run_state(fr, quality_failed_state(_failed_checks(b)), force=True)
    except Exception as e:  # noqa: BLE001 - a view of the results
        logger.warning("could not mark the trial runs' quality verdicts: %s", e)


def mark_all_failed(flow_run_id: Any, statuses: list[Mapping[str, Any]], logger: Any) -> bool:
    """Tag the sweep run :data:`ALL_FAILED_TAG` when it has trials and none ended ``ok`` (what makes ``tunelab run``
    exit 1); :func:`final_state_hook` then ends it ``AllTrialsFailed``. Returns whether every trial failed."""
    every = bool(statuses) and all(s.get("status") != "ok" for s in statuses)
    if every and flow_run_id is not None:
        try:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as c:
                _add_tag(c, flow_run_id, ALL_FAILED_TAG, ALL_FAILED_TAG)
        except Exception as e:  # noqa: BLE001 - a view
            logger.warning("could not tag the sweep run: %s", e)
    return every


def final_state_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect ``on_completion`` hook of the sweep (named for what it decides, since Prefect logs the name on every
    completed run): a run tagged :data:`ALL_FAILED_TAG` (read back from the API: the
    tag is the record) ends in the FAILED-type state ``AllTrialsFailed``."""
    from prefect.client.orchestration import get_client
    from prefect.states import Failed

    with get_client(sync_client=True) as c:
        if ALL_FAILED_TAG in (c.read_flow_run(flow_run.id).tags or []):
            c.set_flow_run_state(flow_run.id, Failed(name="AllTrialsFailed", message="no trial of this sweep "
                                                     "ended ok (`tunelab report` lists why)"), force=True)


def cancelled_not_crashed_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect ``on_crashed`` hook of the sweep and trial flows: a run that crashed because an interruption ended
    it (Ctrl-C, a SIGTERM nobody asked for through Prefect, SystemExit) is set Cancelled, with Prefect's reason as
    its message; any other crash stays Crashed."""
    if (state.message or "") not in _INTERRUPTED:
        return
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    with get_client(sync_client=True) as c:
        c.set_flow_run_state(flow_run.id, Cancelled(message=f"cancelled: {state.message}"), force=True)
