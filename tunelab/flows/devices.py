"""Devices of one host and the scheduler that hands them to trials.

A trial needs ``tensor-parallel-size x pipeline-parallel-size x data-parallel-size`` GPUs (:func:`gpus_needed`;
1 when none is set; a CPU runtime always needs the one ``cpu0`` device). :func:`run_on_devices` starts jobs in
order (first in, first out, no back-filling) on the lowest-numbered free devices, so an interleaved plan stays
interleaved on any number of GPUs.

Locks. Each device has a host-level file lock (:func:`device_locks`), which makes two sweeps on one host share
a GPU one trial at a time and is released by the OS when a sweep is killed, and, against a real Prefect server
only (:func:`prefect_slots_enabled`), a global concurrency limit of 1 named by :func:`slot_name` and created by
:func:`ensure_slots`. Why both, and why no Prefect slots in ephemeral mode: ``tunelab.flows.sweep``'s module
docstring. The sweep order, the trials and their records are the sweep's (``tunelab.flows.sweep``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from prefect.exceptions import TerminationSignal

from tunelab import paths
from tunelab.plan import PlanError, Trial
from tunelab.tasks.gpu import Inventory

__all__ = [
    "INTERRUPTS",
    "SLOT_LEASE_S",
    "Device",
    "device_locks",
    "devices_from_inventory",
    "ensure_slots",
    "gpus_needed",
    "prefect_slots_enabled",
    "run_on_devices",
    "slot_name",
]

#: Lease of a held device slot, seconds. Prefect renews it in the background while the trial runs; a holder
#: that dies (SIGKILL) would block the device for about this long (70 s measured with 60; Prefect's minimum is
#: 60), unless a waiting sweep on its host sees it dead and releases its lease (tunelab/slot_holders.py).
SLOT_LEASE_S = 60.0

#: What ends a sweep early: Prefect's cancellation (its SIGTERM bridge raises ``TerminationSignal``), Ctrl-C.
INTERRUPTS = (KeyboardInterrupt, SystemExit, TerminationSignal)

_PARALLEL_FLAGS = ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size")
_SHORT_FLAGS = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size"}


# -- devices ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """One schedulable device: a GPU (``kind='gpu'``, NVML index) or the host CPU (``kind='cpu'``, index 0).

    ``baseline_mib`` is the GPU memory used at inventory time (MiB), the reference for the pre-boot check."""

    kind: str
    index: int
    name: str = "cpu"
    baseline_mib: float | None = None

    @property
    def label(self) -> str:
        """``gpu0``, ``gpu1``, ... or ``cpu0``."""
        return f"{self.kind}{self.index}"


def devices_from_inventory(inv: Inventory, only: Sequence[int] | None = None) -> list[Device]:
    """The GPUs of an inventory as devices (restricted to the NVML indices in ``only`` when given).

    Raises:
        ValueError: ``only`` names an index the inventory does not have.
    """
    if not inv.available:
        return []
    gpus = {g.index: g for g in inv.gpus}
    if only is not None:
        missing = [i for i in only if i not in gpus]
        if missing:
            raise ValueError(f"gpus: {missing} not on this host (NVML sees {sorted(gpus)}); fix the 'gpus' parameter")
        gpus = {i: gpus[i] for i in only}
    return [Device("gpu", g.index, g.name, g.memory_used_mib) for g in sorted(gpus.values(), key=lambda g: g.index)]


def gpus_needed(trial: Trial) -> int:
    """GPUs one boot of ``trial`` occupies: product of ``--tensor-parallel-size``, ``--pipeline-parallel-size``
    and ``--data-parallel-size`` (also spelled ``tp``/``pp``/``dp``) in its engine args; 1 when none is set.

    Raises:
        PlanError: a value that is not a positive integer (names the flag).
    """
    n = 1
    for raw, v in trial.engine_args.items():
        flag = _SHORT_FLAGS.get(raw, raw)
        if flag in _PARALLEL_FLAGS and v not in (None, False):
            try:
                k = int(v)
            except (TypeError, ValueError):
                k = 0
            if k < 1 or str(k) != str(v).strip():
                raise PlanError(f"engine_args.{raw}: {v!r} is not a positive integer number of GPUs")
            n *= k
    return n


def slot_name(host: str, device: Device) -> str:
    """Name of the global concurrency limit guarding ``device`` on ``host``: ``tunelab-<host>-gpu0``.
    The host name is lower-cased with characters other than letters, digits, '-' and '.' replaced by '-'."""
    h = re.sub(r"[^a-z0-9.-]+", "-", host.lower()).strip("-") or "host"
    return f"tunelab-{h}-{device.label}"


def ensure_slots(names: Sequence[str]) -> None:
    """Create (or reset to limit 1) the global concurrency limit of each device, idempotently
    (``upsert_global_concurrency_limit_by_name``; ``prefect gcl create`` fails when it exists).

    Raises:
        prefect errors when the API cannot be reached: a sweep without its locks does not start.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        for n in names:
            try:
                client.upsert_global_concurrency_limit_by_name(n, 1)
            except ObjectAlreadyExists:
                # The upsert is read-then-create, not atomic: another sweep created it in between. Once more
                # (now an update to limit 1 if needed).
                client.upsert_global_concurrency_limit_by_name(n, 1)


def prefect_slots_enabled() -> bool:
    """Whether trials also hold Prefect global concurrency slots: only against a real Prefect server
    (``PREFECT_API_URL`` set). Prefect keeps slot leases in the server process's memory; an ephemeral server
    dies with its sweep, so a sweep killed while holding a slot leaves ``active_slots = 1`` in the shared
    database that no later ephemeral server can ever expire (seen: a second sweep then waited forever).
    The host-level device locks (:func:`device_locks`) guard the devices in every mode."""
    return bool(os.environ.get("PREFECT_API_URL"))


@contextlib.contextmanager
def device_locks(names: Sequence[str], log: Callable[[str], None] | None = None, poll_s: float = 1.0):
    """Hold an exclusive host-level lock for each device name (``fcntl.flock`` on
    ``<tunelab home>/state/locks/<name>.lock``), in sorted order so two sweeps cannot deadlock. The OS
    releases a lock when its process dies, also on SIGKILL: a crashed sweep never blocks a device."""
    import fcntl

    d = paths.state_dir() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    files = []
    try:
        for n in sorted(set(names)):
            f = open(d / f"{n}.lock", "a+")
            files.append(f)
            waited = 0.0
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if log and waited == 0.0:
                        log(f"waiting for device {n}: another sweep on this host holds it")
                    time.sleep(poll_s)
                    waited += poll_s
        yield
    finally:
        for f in files:
            try:
                fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()


# -- the scheduler ---------------------------------------------------------------------------------------
def run_on_devices(
    jobs: Sequence[Any],
    need: Callable[[Any], int],
    devices: Sequence[Device],
    run_one: Callable[[Any, list[Device]], Any],
    *,
    on_skip: Callable[[Any, str], Any] | None = None,
    on_interrupt: Callable[[], None] | None = None,
    usable: Callable[[Device], bool] = lambda d: True,
) -> list[Any]:
    """Run ``jobs`` in order on ``devices``, at most one job per device at a time.

    Each job takes the ``need(job)`` lowest-numbered free usable devices; a job that needs more devices than
    are usable is passed to ``on_skip(job, reason)`` instead. Jobs start strictly in order (a job waiting
    for two devices is not overtaken), so an interleaved plan stays interleaved. With one device the jobs run
    on the calling thread (an interruption reaches the running trial directly); with several, each runs
    in a worker thread that carries the caller's context variables (the Prefect flow run context, so trials
    appear as subflows of the sweep).

    ``usable(device)`` is checked whenever a device is handed out: a device whose teardown was not clean is
    taken out of service for the rest of the sweep.

    On an interruption (:data:`INTERRUPTS`: Ctrl-C, Prefect's cancellation) in the calling thread with jobs in worker threads: ``on_interrupt()``
    (stop the servers) is called, the running jobs are awaited and the interruption is re-raised with the
    results so far in its ``results`` attribute.

    Returns:
        ``run_one``'s / ``on_skip``'s return values in job order (None for jobs never started).
    """
    results: list[Any] = [None] * len(jobs)
    if not devices:
        for i, job in enumerate(jobs):
            results[i] = on_skip(job, "no device to run on") if on_skip else None
        return results
    order = {d: i for i, d in enumerate(devices)}
    free = list(devices)
    if len(devices) == 1:
        for i, job in enumerate(jobs):
            n = need(job)
            if n > 1 or not usable(devices[0]):
                why = (f"needs {n} devices, this host has 1" if n > 1 else
                       f"{devices[0].label} is out of service (an earlier teardown was not clean)")
                results[i] = on_skip(job, why) if on_skip else None
                continue
            results[i] = run_one(job, [devices[0]])
        return results

    # One thread per started job (registered before it starts), completions through a queue: an interruption
    # of this thread at any point cannot lose track of a trial that runs.
    done_q: queue.Queue = queue.Queue()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    busy = [0]

    def lane(i: int, job: Any, devs: list[Device]) -> None:
        try:
            results[i] = run_one(job, devs)
        except BaseException as e:  # noqa: BLE001 - re-raised by the scheduler
            errors.append(e)
        finally:
            done_q.put(devs)

    def reap() -> None:
        devs = done_q.get()
        busy[0] -= 1
        free.extend(devs)
        free.sort(key=order.__getitem__)

    def n_usable() -> int:
        return len([d for d in devices if usable(d)])

    try:
        for i, job in enumerate(jobs):
            n = need(job)
            while n <= n_usable() and len([d for d in free if usable(d)]) < n:
                reap()
            if n > n_usable():
                results[i] = on_skip(job, f"needs {n} devices, {n_usable()} usable") if on_skip else None
                continue
            devs = [d for d in free if usable(d)][:n]
            for d in devs:
                free.remove(d)
            th = threading.Thread(target=contextvars.copy_context().run, args=(lane, i, job, devs),
                                  name=f"tunelab-{'+'.join(d.label for d in devs)}")
            threads.append(th)
            busy[0] += 1
            th.start()
        while busy[0]:
            reap()
    except INTERRUPTS as e:
        if on_interrupt:
            on_interrupt()
        for th in threads:  # the trials finish (their servers are stopped) and store their results
            t_end = time.monotonic() + 2
            while th.ident is None and time.monotonic() < t_end:  # interrupted inside start()
                time.sleep(0.01)
            if th.ident is not None:
                th.join()
        e.results = results  # type: ignore[attr-defined]
        raise
    if errors:
        raise errors[0]
    return results
