"""``tunelab clean``: what a killed sweep (``kill -9``, the OOM killer, a lost terminal) leaves behind, put right.

A sweep that dies without running its ``finally`` blocks leaves:

1. its ``vllm serve`` process group running (GBs of memory, its port listening): stopped here with
   ``tasks.engine.stop_leftovers``, which knows which processes are tunelab's (the state file of servers
   started, each server's ``TUNELAB_SERVER_ID`` in its environment) and leaves alone the servers of a sweep that
   is still running;
2. device locks (``flows.devices.device_locks``, in the host-wide ``paths.host_locks_dir``): ``flock`` locks,
   which the kernel releases when their process dies; reported here (free, or held by a live sweep), never
   taken from a live holder; compile-cache locks (``tasks.compile_cache``) are not devices and not counted;
3. Prefect concurrency slots (server mode only): the slot records of ``tunelab.host.slot_holders`` whose holder is
   provably dead get their lease released (a waiting sweep would do the same, later) and their record removed;
4. its Prefect flow run, and the trial subflow it was in, "Running" for ever: the runs recorded by
   ``tunelab.host.run_records`` whose process is provably dead are set to Crashed (forced, with a message naming the
   PID and why it is known dead), and so are their Running trial subflows. With an ephemeral Prefect (no
   ``PREFECT_API_URL``) the runs are in the ephemeral database under the tunelab home: the command starts the
   ephemeral server, as ``tunelab run`` does, only when there is a run (or a slot) to put right;
5. the windows it measured: kept as an ``incomplete`` bundle (``flows.trial``); counted here, loaded by
   ``tunelab load``.

Every step reports what it did; one that fails is reported and the others still run.
"""

from __future__ import annotations

import fcntl
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tunelab.host import paths

__all__ = ["CleanReport", "clean"]


@dataclass
class CleanReport:
    """What :func:`clean` did.

    Attributes:
        servers_stopped: state-file records of the server groups stopped (``stop_leftovers``' dicts).
        locks_free, locks_held: device lock names free now / held by a live process (left alone).
        slots_released: slot names whose dead holder's lease was released.
        runs_crashed: flow run ids set to Crashed (sweeps and their trial subflows).
        incomplete_bundles: bundle folders whose trial status is ``incomplete``.
        problems: steps that could not run, one line each.
    """

    servers_stopped: list[dict] = field(default_factory=list)
    locks_free: list[str] = field(default_factory=list)
    locks_held: list[str] = field(default_factory=list)
    slots_released: list[str] = field(default_factory=list)
    runs_crashed: list[str] = field(default_factory=list)
    incomplete_bundles: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


#: A device lock's file name (``flows.devices.slot_name``: ``tunelab-<host>-gpu0.lock``); anything else in the
#: folder (a compile-cache lock of an older tunelab, which kept both in one folder) is not a device.
_DEVICE_LOCK = re.compile(r"^tunelab-.+-(gpu|cpu)\d+\.lock$")


def _locks(rep: CleanReport) -> None:
    d = paths.host_locks_dir()
    for f in sorted(p for p in d.glob("*.lock") if _DEVICE_LOCK.match(p.name)):
        with open(f, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                rep.locks_held.append(f.stem)
                continue
            fcntl.flock(fh, fcntl.LOCK_UN)
            rep.locks_free.append(f.stem)


def _slots(rep: CleanReport, log: Callable[[str], None], start_prefect: Callable[[], object]) -> None:
    from uuid import UUID

    from tunelab.host.slot_holders import SlotHolder, holder_is_dead, read_holder

    d = paths.host_locks_dir() / "slots"
    holders: list[SlotHolder] = [h for f in sorted(d.glob("*.json")) if d.is_dir()
                                 for h in [read_holder(f.stem)] if h is not None]
    dead = [(h, why) for h in holders for dead_, why in [holder_is_dead(h)] if dead_]
    if not dead:
        return
    start_prefect()
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for h, why in dead:
            if h.lease_id:
                client.release_concurrency_slots_with_lease(lease_id=UUID(h.lease_id))
            with_lease = "its lease released" if h.lease_id else "no lease id recorded: its lease runs out by itself"
            log(f"slot {h.slot}: holder {h.describe()} is dead ({why}); {with_lease}")
            (d / f"{h.slot}.json").unlink(missing_ok=True)
            rep.slots_released.append(h.slot)


def _runs(rep: CleanReport, log: Callable[[str], None], start_prefect: Callable[[], object]) -> None:
    from tunelab.host.run_records import forget_run, orphaned_runs

    orphans = orphaned_runs()
    if not orphans:
        return
    start_prefect()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterParentFlowRunId, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = {StateType.RUNNING, StateType.PENDING, StateType.CANCELLING, StateType.SCHEDULED}
    with get_client(sync_client=True) as client:
        for h, why in orphans:
            msg = f"its process (PID {h.pid} on {h.host}) died without ending it: {why}; marked by `tunelab clean`"
            try:
                fr = client.read_flow_run(h.flow_run_id)
            except Exception as e:  # deleted, or another server than the one it ran against
                log(f"flow run {h.flow_run_id}: not found on this Prefect ({type(e).__name__}); record dropped")
                forget_run(h.flow_run_id)
                continue
            children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[fr.id]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(unfinished)))))
            for run in [*children, fr]:
                if run.state is not None and run.state.type in unfinished:
                    client.set_flow_run_state(run.id, Crashed(message=msg), force=True)
                    rep.runs_crashed.append(str(run.id))
                    log(f"flow run {run.name} ({run.id}): {run.state.type.value} -> Crashed: {msg}")
            forget_run(h.flow_run_id)


def _incomplete(rep: CleanReport, results_dir: Path) -> None:
    import pandas as pd

    from tunelab.core.bundle import list_bundles, read_manifest

    for b in list_bundles(results_dir):
        entry = read_manifest(b)["files"].get("trial")
        if entry and pd.read_parquet(b / entry["file"], columns=["status"])["status"].iloc[0] == "incomplete":
            rep.incomplete_bundles.append(b)


def clean(results_dir: Path | None = None, log: Callable[[str], None] = print,
          start_prefect: Callable[[], object] = lambda: None) -> CleanReport:
    """Stop tunelab's leftover servers, report device locks, release dead holders' slots, mark orphaned flow
    runs Crashed, count incomplete bundles (module docstring). Prefect must be configured
    (``tunelab.host.prefect_env``) before the call.

    Args:
        results_dir: the bundles' folder (default ``<tunelab home>/results``).
        log: one call per thing done.
        start_prefect: called once before the first Prefect call, only when there is a dead holder's slot or an
            orphaned run to put right (the CLI starts the temporary server there: a clean host needs none).

    Returns:
        :class:`CleanReport`; a step that raised is a line of ``problems``, never an exception.
    """
    from tunelab.tasks.engine import stop_leftovers

    rep = CleanReport()
    started: list[object] = []

    def once() -> None:
        if not started:
            started.append(start_prefect())

    steps = [("servers", lambda: rep.servers_stopped.extend(stop_leftovers(log=log))),
             ("device locks", lambda: _locks(rep)),
             ("slots", lambda: _slots(rep, log, once)),
             ("flow runs", lambda: _runs(rep, log, once)),
             ("bundles", lambda: _incomplete(rep, Path(results_dir) if results_dir else paths.results_dir()))]
    for name, step in steps:
        try:
            step()
        except Exception as e:  # report it; the other steps still run
            rep.problems.append(f"{name}: {type(e).__name__}: {e}")
    return rep

