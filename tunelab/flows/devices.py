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
from typing import Any, Callable, Mapping, Sequence

from prefect.exceptions import TerminationSignal

from tunelab.host import paths
from tunelab.core.plan import PlanError, Trial
from tunelab.tasks.gpu import Inventory, cuda_visible_devices, inherited_restriction

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
    "DIST_PORT_BASE",
    "DIST_PORT_BLOCK",
    "distributed_ports_env",
    "unusable_gpus",
    "host_devices",
    "host_name",
    "device_env",
    "free_device_locks",
]

#: First port of the per-device blocks of distributed / internal ports (below Linux's ephemeral range, 32768+,
#: so that ports the kernel hands out to other programs rarely fall into them), and the block size.
DIST_PORT_BASE = 20000
DIST_PORT_BLOCK = 100

#: Lease of a held device slot, seconds. Prefect renews it in the background while the trial runs; a holder
#: that dies (SIGKILL) would block the device for about this long (70 s measured with 60; Prefect's minimum is
#: 60), unless a waiting sweep on its host sees it dead and releases its lease (tunelab/host/slot_holders.py).
SLOT_LEASE_S = 60.0

#: What ends a sweep early: Prefect's cancellation (its SIGTERM bridge raises ``TerminationSignal``), Ctrl-C.
INTERRUPTS = (KeyboardInterrupt, SystemExit, TerminationSignal)

_PARALLEL_FLAGS = ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size")
_SHORT_FLAGS = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size"}


# -- devices ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """One schedulable device: a GPU (``kind='gpu'``, NVML index) or the host CPU (``kind='cpu'``, index 0).

    ``baseline_mib`` is the GPU memory used at inventory time (MiB), the reference for the pre-boot check.
    ``uuid`` is NVML's ``GPU-...`` UUID, ``cuda_index`` the GPU's ordinal in PCI bus order (its CUDA index under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; None: the NVML index is used)."""

    kind: str
    index: int
    name: str = "cpu"
    baseline_mib: float | None = None
    uuid: str | None = None
    cuda_index: int | None = None

    @property
    def label(self) -> str:
        """``gpu0``, ``gpu1``, ... or ``cpu0``."""
        return f"{self.kind}{self.index}"


def devices_from_inventory(inv: Inventory, only: Sequence[int] | None = None,
                           allowed: Sequence[int] | None = None) -> list[Device]:
    """The schedulable GPUs of an inventory as devices: status ``ok`` (``tasks.gpu.DEVICE_STATUSES``; the others
    are :func:`unusable_gpus`), within ``allowed`` (the NVML indices a ``CUDA_VISIBLE_DEVICES`` the sweep
    inherited allows, ``tasks.gpu.inherited_restriction``; None = all) and, when given, the NVML indices in
    ``only`` (the sweep's ``gpus`` parameter).

    Raises:
        ValueError: ``only`` names an index the inventory does not have, one outside ``allowed``, or one whose
            status is not ``ok`` (the message names the index, the reason and the fix).
    """
    if not inv.available:
        return []
    every = {g.index: g for g in inv.gpus}
    gpus = {i: g for i, g in every.items() if allowed is None or i in allowed}
    if only is not None:
        missing = [i for i in only if i not in every]
        if missing:
            raise ValueError(f"gpus: {missing} not on this host (NVML sees {sorted(every)}); fix the 'gpus' parameter")
        hidden = [i for i in only if i not in gpus]
        if hidden:
            raise ValueError(f"gpus: {hidden} are outside the inherited CUDA_VISIBLE_DEVICES (allowed NVML indices "
                             f"{sorted(gpus)}); fix the 'gpus' parameter or the environment")
        bad = [f"{i} ({every[i].status}: {every[i].reason})" for i in only if every[i].status != "ok"]
        if bad:
            raise ValueError(f"gpus: {', '.join(bad)} cannot be scheduled; leave them out of the 'gpus' parameter")
        gpus = {i: gpus[i] for i in only}
    return [Device("gpu", g.index, g.name, g.memory_used_mib, g.uuid, g.cuda_index)
            for g in sorted(gpus.values(), key=lambda g: g.index) if g.status == "ok"]


def unusable_gpus(inv: Inventory) -> list[str]:
    """One line per GPU of ``inv`` that is not scheduled because of its status: ``gpu1 (NVIDIA H200,
    GPU-...): mig: MIG enabled ...``. Empty for a host without NVML."""
    return [f"gpu{g.index} ({g.name}, {g.uuid}): {g.status}: {g.reason}" for g in inv.gpus if g.status != "ok"]


def host_name() -> str:
    """This host's name in slot names and records: ``TUNELAB_HOST`` when set (two workers standing in for two
    hosts on one machine, containers whose host names are random), else ``socket.gethostname()``."""
    import socket

    return os.environ.get("TUNELAB_HOST") or socket.gethostname()


def host_devices(inv: Inventory, only: Sequence[int] | None = None, env: Mapping[str, str] | None = None,
                 log: Callable[[str], Any] | None = None) -> list[Device]:
    """The GPUs a sweep on this host may schedule: :func:`devices_from_inventory` within the restriction of the
    ``CUDA_VISIBLE_DEVICES`` / ``CUDA_DEVICE_ORDER`` the sweep inherited (``env``, default ``os.environ``;
    ``tasks.gpu.inherited_restriction``). GPUs left out for their status, or by the restriction, are logged.

    Raises:
        ValueError: an inherited ``CUDA_VISIBLE_DEVICES`` that cannot be mapped to NVML devices, or a bad
            ``only`` (see :func:`devices_from_inventory`).
    """
    env = os.environ if env is None else env
    allowed = inherited_restriction(env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"), inv) \
        if inv.available else None
    for line in unusable_gpus(inv):
        if log:
            log(f"not scheduled: {line}")
    if allowed is not None and log:
        log(f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')} inherited: only NVML GPUs {allowed} are used")
    return devices_from_inventory(inv, only, allowed)


def device_env(devices: Sequence[Device]) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a server on ``devices`` (PCI-bus-order ordinals, ``tasks.gpu``); None on CPU."""
    gpus = [d for d in devices if d.kind == "gpu"]
    return cuda_visible_devices(gpus) if gpus else None


def distributed_ports_env(devices: Sequence[Device]) -> dict[str, str]:
    """Port variables that keep parallel servers' internal ports apart: each GPU owns the block
    ``DIST_PORT_BASE + DIST_PORT_BLOCK x NVML index`` (100 ports), and a server uses the block of its first GPU.
    Two servers never hold one GPU at once on a host (device locks), so their blocks never meet, across sweeps
    too. ``VLLM_PORT`` is where vLLM's ``get_open_port`` starts (torch.distributed's TCP store and the other
    internal sockets; it steps up past a busy port), ``MASTER_PORT`` torch.distributed's env:// rendezvous
    (default 29500 otherwise: the EADDRINUSE of two parallel tensor-parallel boots), ``VLLM_DP_MASTER_PORT``
    the data-parallel master. Empty for CPU devices."""
    gpus = [d for d in devices if d.kind == "gpu"]
    if not gpus:
        return {}
    base = DIST_PORT_BASE + DIST_PORT_BLOCK * gpus[0].index
    return {"VLLM_PORT": str(base), "MASTER_PORT": str(base + 80), "VLLM_DP_MASTER_PORT": str(base + 90)}


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
    ``<host locks dir>/<name>.lock``, ``paths.host_locks_dir``: one folder for the whole host, whatever the
    sweep's tunelab home), in sorted order so two sweeps cannot deadlock. The OS releases a lock when its
    process dies, also on SIGKILL: a crashed sweep never blocks a device."""
    import fcntl

    d = paths.host_locks_dir()
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
                        log(f"waiting for device {n}: another sweep on this host holds it (lock {d / (n + '.lock')})")
                    time.sleep(poll_s)
                    waited += poll_s
        yield
    finally:
        for f in files:
            try:
                fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()


@contextlib.contextmanager
def free_device_locks(devices: Sequence[Device], n: int, log: Callable[[str], None] | None = None,
                      poll_s: float = 1.0):
    """Take the host-level locks (as :func:`device_locks`) of the ``n`` lowest-numbered devices of ``devices``
    that nobody holds, waiting until ``n`` are free at once; yield those devices. For runs that share a host
    without one scheduler (a worker runs several ``host_trial`` flow runs at once, ``flows.hosts``). Tries each
    lock without blocking and gives back a partial set before it waits, so two waiters never deadlock.

    Raises:
        ValueError: ``n`` is more than ``len(devices)`` (the message says how many the host has).
    """
    import fcntl

    if n > len(devices):
        raise ValueError(f"needs {n} devices, this host has {len(devices)} schedulable")
    d = paths.host_locks_dir()
    said = False
    while True:
        held: list[tuple[Device, Any]] = []
        for dev in sorted(devices, key=lambda x: x.index):
            f = open(d / f"{slot_name(_host_for_locks(), dev)}.lock", "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append((dev, f))
            except BlockingIOError:
                f.close()
            if len(held) == n:
                break
        if len(held) == n:
            break
        for _, f in held:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        if log and not said:
            log(f"waiting for {n} free device(s) of {[x.label for x in devices]}")
            said = True
        time.sleep(poll_s)
    try:
        yield [dev for dev, _ in held]
    finally:
        for _, f in held:
            try:
                fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()


def _host_for_locks() -> str:
    """The host part of lock file names: the same names as the sweep's ``device_locks`` (its slot names), so a
    single-host sweep and a worker's trials on one host exclude each other."""
    return host_name()


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
