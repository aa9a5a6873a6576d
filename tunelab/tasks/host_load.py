"""The host around a measurement: CPU pinning of the server and the load, and the per-window covariates that no
engine config can change (other processes' CPU use, steal, CPU frequency).

Why. On the H200 the c=1 windows were set by the host side: p50 TPOT moved between 1.44 and 2.46 ms while the
GPU waited half of the time, and one boot with the server's processes pinned to cores of their own was faster
and steadier than two unpinned ones (research notes "Where the c=1 noise comes from"). Pinning removes a source
of noise; what cannot be removed but is measured in the same window can serve as a covariate.

* ``plan.parse_cpus`` reads a CPU list (``"0-3,8"``, as ``taskset -c`` and cgroups' ``cpuset`` write it).
* :func:`pin_tree` sets the affinity of a process and every thread of it and of its descendants
  (``os.sched_setaffinity`` per thread id): applied right after the server's Popen (the threads and processes
  it starts later inherit it) and again once it is ready (anything started before the first call).
* :func:`pinned_thread` pins the calling thread for a block: the measurement's event loop, and the load
  processes it spawns, which inherit it.
* :class:`ServerProcSample` / :func:`server_process_cpu`: the CPU time of each process (and its busiest thread) of
  the server's tree over a window, keyed by role (:func:`process_role`: the API server, the engine core, workers),
  as cores (CPU seconds / wall seconds): the evidence of an API-server-bound window (``tunelab.core.bottleneck_rules``).
* :class:`HostSample` / :func:`covariates`: ``/proc/stat`` and ``/proc/<pid>/stat`` before and after a window
  give the CPU time used by processes that are not tunelab's (this process and its descendants, the server
  included, and the children it has reaped), as a fraction of the host's CPU time; the steal fraction
  (a virtual machine's CPU taken by its hypervisor); and the mean CPU frequency (``scaling_cur_freq``, else
  ``/proc/cpuinfo``), MHz.

GPU utilisation and power are *outcomes*, not covariates: a config changes them (at c=1 on the H200 p50 TPOT
correlated -0.94 with GPU utilisation because a slow host starves the GPU), so adjusting an A/B for them would
remove part of the effect. The covariates here are ones a config cannot move: other processes' CPU use, steal,
and the frequency (its governor follows the host's load, which the server's own share of is excluded from only
in part: read it as context, not as an adjustment, unless the docs' check shows no treatment effect on it).

Linux only; on another system every reading is None and pinning raises.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tunelab.core.plan import format_cpus, parse_cpus

__all__ = ["parse_cpus", "format_cpus", "pin_tree", "pinned_thread", "descendants", "HostSample", "covariates",
           "ServerProcSample", "process_role", "server_process_cpu"]

_PROC = Path("/proc")
_SYS_CPU = Path("/sys/devices/system/cpu")


def _check_available(cpus: tuple[int, ...], field: str) -> None:
    have = os.sched_getaffinity(0)
    missing = [c for c in cpus if c not in have]
    if missing:
        raise ValueError(f"{field}: CPUs {format_cpus(missing)} are not available to tunelab on this host (it may "
                         f"use {format_cpus(have)}); fix the plan's {field}")


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (index 0 = state), or None when gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (by parent pid, from /proc), in no particular order."""
    children: dict[int, list[int]] = {}
    for d in _PROC.iterdir():
        if d.name.isdigit():
            f = _stat_fields(d.name)
            if f is not None:
                children.setdefault(int(f[1]), []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def pin_tree(pid: int, cpus: tuple[int, ...], field: str = "cpu_affinity.server") -> int:
    """Pin ``pid``, its descendants and all their threads to ``cpus``; returns how many threads were pinned.
    Threads that end meanwhile are skipped.

    Raises:
        ValueError: a CPU this process may not use (names ``field``).
    """
    _check_available(cpus, field)
    n = 0
    for p in descendants(pid):
        try:
            tids = [int(t.name) for t in (_PROC / str(p) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
    return n


@contextlib.contextmanager
def pinned_thread(cpus: tuple[int, ...] | None, field: str = "cpu_affinity.load") -> Iterator[None]:
    """Pin the calling thread (and so the processes it spawns) to ``cpus`` for the block; None: no change.

    Raises:
        ValueError: a CPU this process may not use (names ``field``).
    """
    if not cpus:
        yield
        return
    _check_available(cpus, field)
    tid = threading.get_native_id()
    before = os.sched_getaffinity(tid)
    os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(tid, before)


@dataclass(frozen=True)
class HostSample:
    """A reading of the host's CPU counters (clock ticks): ``total`` and ``busy`` over all CPUs (``/proc/stat``;
    busy = total - idle - iowait - steal: time some process ran), ``steal``, and ``ours``: CPU time of this process and its descendants
    (utime + stime, plus cutime + cstime of this process: its reaped children, e.g. load processes)."""

    total: int
    busy: int
    steal: int
    ours: int

    @classmethod
    def read(cls) -> "HostSample | None":
        """Now; None when ``/proc/stat`` cannot be read (not Linux)."""
        try:
            first = (_PROC / "stat").read_text().splitlines()[0].split()
        except (OSError, IndexError):
            return None
        v = [int(x) for x in first[1:9]] + [0] * max(0, 9 - len(first))
        user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
        total = user + nice + system + idle + iowait + irq + softirq + steal
        ours = 0
        me = os.getpid()
        for p in descendants(me):
            f = _stat_fields(p)
            if f is None:
                continue
            ours += int(f[11]) + int(f[12])  # utime, stime
            if p == me:
                ours += int(f[13]) + int(f[14])  # cutime, cstime: reaped children (load processes)
        return cls(total=total, busy=total - idle - iowait - steal, steal=steal, ours=ours)


def _cpu_mhz() -> float | None:
    """Mean current frequency of the online CPUs, MHz (``scaling_cur_freq``, else ``/proc/cpuinfo``); None when
    neither is readable (many virtual machines)."""
    vals = []
    for f in _SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            vals.append(int(f.read_text()) / 1000.0)
        except (OSError, ValueError):
            pass
    if not vals:
        try:
            vals = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", (_PROC / "cpuinfo").read_text(), re.M)]
        except OSError:
            vals = []
    return sum(vals) / len(vals) if vals else None


def covariates(before: HostSample | None, after: HostSample | None = None) -> dict[str, float | None]:
    """A window's host covariates from the samples at its start and end (``after`` None: read now).

    Returns:
        ``host_other_cpu_frac``: CPU time of processes that are not tunelab's / all CPU time of the host in the
        window (0..1; 0.5 on a 16-core host = 8 cores busy with something else); ``host_steal_frac``: steal /
        all CPU time; ``host_cpu_mhz``: mean CPU frequency at the window's end. None where not readable.
    """
    after = after if after is not None else HostSample.read()
    out: dict[str, float | None] = {"host_other_cpu_frac": None, "host_steal_frac": None, "host_cpu_mhz": _cpu_mhz()}
    if before is None or after is None or after.total <= before.total:
        return out
    d_total = after.total - before.total
    # A process of ours that ended in the window without being reaped by this process takes its ticks with it:
    # the other-processes figure can then read a little high, never below 0.
    other = (after.busy - before.busy) - (after.ours - before.ours)
    out["host_other_cpu_frac"] = min(1.0, max(0.0, other / d_total))
    out["host_steal_frac"] = max(0.0, (after.steal - before.steal) / d_total)
    return out


def _clk_tck() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def process_role(pid: int, root: int) -> str:
    """Role of a process of the server's tree, from its name (``/proc/<pid>/comm``, which vLLM sets with
    setproctitle, e.g. ``VLLM::EngineCore``) and command line:

    * ``api_server``: the root (``vllm serve`` itself, which runs the API server), whatever its command line;
    * ``engine_core``: 'EngineCore' in either (vLLM V1's engine-core process: scheduler + model executor);
    * ``worker``: 'Worker' in either (a GPU worker of a tensor-parallel engine);
    * ``api_server`` too: 'APIServer' in either (the API server processes of ``--api-server-count`` > 1);
    * ``other``: anything else (the resource tracker, compile workers, ...).
    """
    try:
        comm = (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        comm = ""
    try:
        cmd = (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = ""
    text = f"{comm} {cmd}"
    if pid == root:
        return "api_server"
    if "EngineCore" in text:
        return "engine_core"
    if "Worker" in text:
        return "worker"
    if "APIServer" in text:
        return "api_server"
    return "other"


@dataclass(frozen=True)
class ServerProcSample:
    """CPU ticks (utime + stime) of every process of a server's tree and of each of their threads at one moment:
    ``procs``: {pid: (role, ticks)}, ``threads``: {(pid, tid): ticks}, ``wall``: ``time.monotonic()``."""

    procs: dict
    threads: dict
    wall: float

    @classmethod
    def read(cls, root: int | None) -> "ServerProcSample | None":
        """Now, for ``root`` and its descendants; None when ``root`` is None or not readable (not Linux, gone)."""
        import time

        if root is None or _stat_fields(root) is None:
            return None
        procs, threads = {}, {}
        for p in descendants(root):
            f = _stat_fields(p)
            if f is None:
                continue
            procs[p] = (process_role(p, root), int(f[11]) + int(f[12]))
            try:
                tids = [t.name for t in (_PROC / str(p) / "task").iterdir()]
            except OSError:
                tids = []
            for tid in tids:
                try:
                    raw = (_PROC / str(p) / "task" / tid / "stat").read_text()
                except OSError:
                    continue
                tf = raw[raw.rfind(")") + 2:].split()
                threads[(p, int(tid))] = int(tf[11]) + int(tf[12])
        return cls(procs=procs, threads=threads, wall=time.monotonic())


def server_process_cpu(before: ServerProcSample | None, after: ServerProcSample | None) -> dict | None:
    """CPU of the server's processes over a window, by role (:func:`process_role`).

    Returns:
        ``{role: {"cpu": cores, "busiest_thread": cores, "processes": n}}``: ``cpu`` the CPU time of that role's
        processes / wall time (1.0 = one core busy all the window; a process with several threads can pass 1),
        ``busiest_thread`` the busiest single thread of that role (an event loop saturates at 1.0);
        processes present at both readings only. None without two readings or with no wall time.
    """
    if before is None or after is None or after.wall <= before.wall:
        return None
    hz, wall = _clk_tck(), after.wall - before.wall
    out: dict[str, dict[str, float]] = {}
    for pid, (role, ticks) in after.procs.items():
        if pid not in before.procs:
            continue
        r = out.setdefault(role, {"cpu": 0.0, "busiest_thread": 0.0, "processes": 0})
        r["cpu"] += max(0, ticks - before.procs[pid][1]) / hz / wall
        r["processes"] += 1
    for (pid, tid), ticks in after.threads.items():
        if pid in before.procs and pid in after.procs and (pid, tid) in before.threads:
            role = after.procs[pid][0]
            busy = max(0, ticks - before.threads[(pid, tid)]) / hz / wall
            out[role]["busiest_thread"] = max(out[role]["busiest_thread"], busy)
    return {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in out.items()}
