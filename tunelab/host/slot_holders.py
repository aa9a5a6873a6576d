"""Who holds a device's Prefect concurrency slot, and taking back the slot of a holder that is provably dead.

Why this exists. Trials hold one slot of each device's global concurrency limit (``flows.sweep``), through
Prefect's ``concurrency(..., lease_duration=...)``: the server keeps a lease per acquisition that the holder
renews in the background; a holder killed by SIGKILL stops renewing, and the server's lease check (the
"repossessor", every 15 s by default) frees the slot once the lease has run out, 60-75 s later. Meanwhile the
next sweep waited in Prefect's acquisition loop without a word (seen: about 55 s). Prefect 3.9 does not say who
holds a slot: a lease's holder is only ``{type: flow_run | task_run | deployment, id: UUID}``
(``ConcurrencyLeaseHolder``, extra fields forbidden), and the REST API has no call that lists a limit's leases.

So tunelab records the holder itself, one small JSON file per slot under ``<host locks dir>/slots/``
(``paths.host_locks_dir``: the host's, shared by every tunelab home on it, like the device locks) written
when the slot is taken and removed when it is given back: PID, host name, the process's start time (from
``/proc/<pid>/stat``, so a reused PID is told apart), the kernel's boot id, sweep id, flow run id, and the
lease id Prefect returned (also passed to Prefect as the lease's holder: the sweep's flow run). A sweep that
waits for a slot (:func:`hold_slots`) logs every ``poll_s`` seconds which slot, who holds it, how long it has
waited and how long the wait may last, and releases the lease of a holder that is provably dead:

- same host and the PID is gone, or now belongs to a process that started at another time, or the host has
  rebooted since (another boot id): dead, its lease is released (``release_concurrency_slots_with_lease``);
- another host: nothing here can prove it dead; the waiter says so and waits for the lease to run out;
- no record (a holder on another host, an older tunelab): the holder is unknown, the same.

Releasing a lease by its id frees only that acquisition's slots; a lease that has already expired or been
released is a no-op on the server, so two waiters reclaiming at once, or a record that outlived its lease, do
no harm.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence
from uuid import UUID

from tunelab.host import paths

__all__ = ["SlotHolder", "holder_is_dead", "hold_slots", "read_holder", "record_path", "this_process"]

#: How often the server frees expired leases, seconds (Prefect's ``server.services.repossessor.loop_seconds``
#: default), used only to say until when a dead holder's lease can last.
REPOSSESSOR_S = 15.0


@dataclass(frozen=True)
class SlotHolder:
    """The process holding a slot, as recorded when it took it.

    Attributes:
        slot: the global concurrency limit's name (``tunelab-<host>-gpu0``).
        pid: the holder's process id.
        host: its host name (``socket.gethostname()``).
        proc_start_ticks: its start time, clock ticks after boot (``/proc/<pid>/stat`` field 22); None off Linux.
        boot_id: the kernel's boot id (``/proc/sys/kernel/random/boot_id``); None off Linux.
        sweep_id: the sweep that holds it, or None.
        flow_run_id: the Prefect flow run of that sweep, or None.
        lease_id: the Prefect lease of the acquisition, or None when it could not be read.
        lease_duration_s: the lease's duration, seconds; the holder renews it while it runs.
        taken_at: when the slot was taken, epoch seconds.
    """

    slot: str
    pid: int
    host: str
    proc_start_ticks: int | None
    boot_id: str | None
    sweep_id: str | None
    flow_run_id: str | None
    lease_id: str | None
    lease_duration_s: float
    taken_at: float

    def describe(self) -> str:
        """``PID 4242 on host gpu-1 (sweep S, flow run F, since 12:00:01)``."""
        since = dt.datetime.fromtimestamp(self.taken_at).strftime("%H:%M:%S")
        return (f"PID {self.pid} on host {self.host} (sweep {self.sweep_id or '?'}, flow run {self.flow_run_id or '?'}, "
                f"since {since})")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks after boot) of process ``pid`` from ``/proc/<pid>/stat`` (fields 3 and
    22, proc(5)); None if there is no such process (or no /proc)."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = s[s.rfind(")") + 2:].split()  # the command name may contain spaces and parentheses
    return (fields[0], int(fields[19])) if len(fields) > 19 else None


def _proc_start_ticks(pid: int) -> int | None:
    st = _proc_stat(pid)
    return st[1] if st else None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def this_process(slot: str, *, sweep_id: str | None, flow_run_id: str | None, lease_id: str | None,
                 lease_duration_s: float) -> SlotHolder:
    """The record of this process holding ``slot``."""
    pid = os.getpid()
    return SlotHolder(slot=slot, pid=pid, host=socket.gethostname(), proc_start_ticks=_proc_start_ticks(pid),
                      boot_id=_boot_id(), sweep_id=sweep_id, flow_run_id=flow_run_id, lease_id=lease_id,
                      lease_duration_s=float(lease_duration_s), taken_at=time.time())


def record_path(slot: str) -> Path:
    """``<host locks dir>/slots/<slot>.json`` (``paths.host_locks_dir``: per host, whatever the tunelab home)."""
    return paths.host_locks_dir() / "slots" / f"{slot}.json"


def read_holder(slot: str) -> SlotHolder | None:
    """The recorded holder of ``slot``, or None when there is no (readable) record."""
    try:
        return SlotHolder(**json.loads(record_path(slot).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write(h: SlotHolder) -> None:
    p = record_path(h.slot)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(asdict(h)))
    os.replace(tmp, p)  # atomic: a reader sees the old record or the new one


def _remove(slot: str, lease_id: str | None, pid: int) -> None:
    """Remove the record of ``slot`` if it is still the one of this lease and PID (a later holder overwrote it
    otherwise)."""
    h = read_holder(slot)
    if h is not None and h.lease_id == lease_id and h.pid == pid:
        with contextlib.suppress(OSError):
            record_path(slot).unlink()


def holder_is_dead(h: SlotHolder) -> tuple[bool, str]:
    """Whether the holder is provably dead, and why (or why it cannot be told).

    Dead only on the same host name: the host has rebooted since (another boot id), the PID is gone, has exited
    (a zombie), or is now a process that started at another time (a reused PID). On another host it is never
    called dead: nothing here can see its processes. (Two containers that share a host name and a tunelab home
    but not a PID namespace would defeat this; tunelab's locks assume one host per host name.)

    Returns:
        (dead, reason), the reason one clause for a log line.
    """
    if h.host != socket.gethostname():
        return False, f"on another host ({h.host}): cannot prove from here that it is dead"
    boot = _boot_id()
    if h.boot_id and boot and h.boot_id != boot:
        return True, "this host has rebooted since it took the slot"
    st = _proc_stat(h.pid)
    if st is None:
        return True, f"PID {h.pid} is gone"
    state, start = st
    if h.proc_start_ticks is not None and start != h.proc_start_ticks:
        return True, f"PID {h.pid} is now another process (started at another time)"
    if state == "Z":  # exited, not yet reaped by its parent: it renews nothing
        return True, f"PID {h.pid} has exited (a zombie)"
    return False, f"PID {h.pid} is alive"


class _Waiter:
    """While a slot acquisition blocks (in Prefect's loop, on the calling thread), a thread that logs who holds
    the slots every ``poll_s`` seconds and releases the lease of a holder that is provably dead."""

    def __init__(self, names: Sequence[str], log: Callable[[str], None], poll_s: float, lease_duration_s: float,
                 first_after_s: float):
        self.names, self.log, self.poll_s = list(names), log, poll_s
        self.lease_duration_s, self.first_after_s = lease_duration_s, first_after_s
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._busy_since: dict[str, float] = {}
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,),
                                        name="tunelab-slot-waiter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        from prefect.client.orchestration import get_client

        if self._stop.wait(self.first_after_s):
            return
        with get_client(sync_client=True) as client:
            while not self._stop.is_set():
                try:
                    self._check(client)
                except Exception as e:  # a report, never a reason to lose the trial
                    self.log(f"could not check the slot holders of {self.names}: {type(e).__name__}: {e}")
                if self._stop.wait(self.poll_s):
                    return

    def _check(self, client) -> None:
        waited = time.monotonic() - self.t0
        for name in self.names:
            lim = client.read_global_concurrency_limit_by_name(name)
            if lim.active_slots < lim.limit:
                self._busy_since.pop(name, None)
                continue  # free now: Prefect's next retry takes it
            first = self._busy_since.setdefault(name, time.time())
            # A holder that was dead when this wait began renews nothing after it: its lease is gone by the
            # lease duration + the server's check interval later. Busy past that: someone renews it, alive.
            end = first + self.lease_duration_s + REPOSSESSOR_S
            if time.time() < end:
                lasts = f"if it is dead, its lease runs out by {dt.datetime.fromtimestamp(end):%H:%M:%S} at the latest"
            else:
                lasts = "its lease has been renewed while we waited: it is alive, the wait lasts until its trial ends"
            h = read_holder(name)
            if h is None:
                self.log(f"waiting for slot {name}: held by a holder tunelab has no record of (another host, or "
                         f"an older tunelab); waited {waited:.0f} s; {lasts}")
                continue
            dead, why = holder_is_dead(h)
            if dead and h.lease_id:
                client.release_concurrency_slots_with_lease(lease_id=UUID(h.lease_id))
                _remove(name, h.lease_id, h.pid)
                self.log(f"slot {name}: released the lease of {h.describe()}: {why}; waited {waited:.0f} s")
            elif dead:
                self.log(f"waiting for slot {name}: held by {h.describe()}, dead ({why}), but its lease id was not "
                         f"recorded; waited {waited:.0f} s; {lasts}")
            elif h.host == socket.gethostname():
                self.log(f"waiting for slot {name}: held by {h.describe()}; {why}: it renews its "
                         f"{h.lease_duration_s:g} s lease until its trial ends; waited {waited:.0f} s")
            else:
                self.log(f"waiting for slot {name}: held by {h.describe()}; {why}; waited {waited:.0f} s; {lasts}")


@contextlib.contextmanager
def hold_slots(names: Sequence[str], *, lease_duration_s: float, sweep_id: str | None = None,
               flow_run_id: str | UUID | None = None, log: Callable[[str], None] = print, poll_s: float = 5.0,
               first_report_after_s: float = 1.0) -> Iterator[str | None]:
    """Hold one slot of each of the global concurrency limits ``names`` (Prefect's
    ``concurrency(names, occupy=1, strict=True, lease_duration=lease_duration_s)``, lease renewed by Prefect in
    the background), recording this process as their holder while held.

    While waiting: after ``first_report_after_s`` and then every ``poll_s`` seconds, one log line per busy slot
    (slot, holder, seconds waited, until when the lease may last) and the lease of a provably dead holder is
    released (see the module docstring).

    Yields:
        The lease id (str), or None when Prefect's concurrency context did not expose it (then the holder is
        recorded without it: named to waiters, but not reclaimable).

    Raises:
        prefect.exceptions.ConcurrencySlotAcquisitionError: a limit does not exist (``strict``).
    """
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.concurrency.context import ConcurrencyContext
    from prefect.concurrency.sync import concurrency

    names = list(names)
    holder = ConcurrencyLeaseHolder(type="flow_run", id=UUID(str(flow_run_id))) if flow_run_id else None
    waiter = _Waiter(names, log, poll_s, lease_duration_s, first_report_after_s)
    waiter.start()
    try:
        # A context of our own: Prefect's sync acquisition records the granted lease id in the current
        # ConcurrencyContext (to release it if the caller is cancelled), the only place it is exposed.
        with ConcurrencyContext() as cctx, concurrency(names, occupy=1, strict=True, lease_duration=lease_duration_s,
                                                       holder=holder, raise_on_lease_renewal_failure=False):
            waiter.stop()
            lease_id = str(cctx.cleanup_lease_ids[-1]) if cctx.cleanup_lease_ids else None
            pid = os.getpid()
            for n in names:
                _write(this_process(n, sweep_id=sweep_id, flow_run_id=str(flow_run_id) if flow_run_id else None,
                                    lease_id=lease_id, lease_duration_s=lease_duration_s))
            try:
                yield lease_id
            finally:
                for n in names:
                    _remove(n, lease_id, pid)
    finally:
        waiter.stop()
