"""Which processes are tunelab's ``vllm serve`` servers: process groups and environments read from /proc, the
listening sockets of a port, and the state file of servers tunelab started (``<tunelab home>/state/servers.json``).

Both ``tasks.engine`` (boot, teardown, leftovers) and ``tasks.gpu`` (is a process NVML lists ours?) need these
answers; they live here so that neither of those two modules imports the other. Why a process is "ours" only
when its environment carries a server id of the state file: see ``tasks.engine``'s module docstring.
Linux only: on other systems the readers return "nothing found" (empty list, None).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from tunelab.host import paths

__all__ = [
    "SERVER_ID_ENV",
    "group_alive",
    "group_members",
    "is_tunelab_process",
    "port_holders",
    "port_listeners",
    "tracked_servers",
]

#: Environment variable carrying the per-server id into the server and all its children.
SERVER_ID_ENV = "TUNELAB_SERVER_ID"


# -- processes, from /proc --------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, pgrp, ...]; None if gone."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return s[s.rfind(")") + 2 :].split()


def _proc_start_ticks(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[19]) if st and len(st) > 19 else None


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes in process group ``pgid``, read from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st and len(st) >= 3 and st[0] != "Z" and int(st[2]) == pgid:
                out.append(int(d.name))
    return out


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process of group ``pgid`` exists."""
    return bool(group_members(pgid))


def _server_id_of(pid: int) -> str | None:
    """The ``TUNELAB_SERVER_ID`` in the environment of ``pid`` (None if absent or unreadable)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = SERVER_ID_ENV.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


def is_tunelab_process(pid: int, entries: list[dict] | None = None) -> bool:
    """True only if ``pid`` is a live process of this PID namespace whose environment carries the server id
    of a tracked server (default: the state file's entries). A PID reported by NVML from another PID
    namespace, or a recycled PID, is never confirmed."""
    ids = {e.get("server_id") for e in (tracked_servers() if entries is None else entries)} - {None}
    sid = _server_id_of(pid)
    return sid is not None and sid in ids


def _socket_inodes(pids: list[int]) -> set[int]:
    out: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    return out


def port_listeners(port: int) -> set[int] | None:
    """Socket inodes of the TCP sockets listening on ``port`` (any address, IPv4 and IPv6), from
    /proc/net/tcp{,6}; None when those files cannot be read (not Linux)."""
    found: set[int] = set()
    readable = False
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(f).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for ln in lines:
            parts = ln.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(parts[9]))
    return found if readable else None


# -- the state file of servers we started --------------------------------------------------------------
def _state_file() -> Path:
    return paths.state_dir() / "servers.json"


@contextlib.contextmanager
def _state_lock():
    """Exclusive lock around read-modify-write of the state file (several trials/processes at once)."""
    with open(paths.state_dir() / "servers.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _state_read() -> list[dict]:
    try:
        data = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict) and "pid" in e and "pgid" in e] if isinstance(data, list) else []


def tracked_servers() -> list[dict]:
    """The state file's records of servers tunelab started and has not yet seen stopped: dicts with ``pid``,
    ``pgid``, ``port``, ``trial_id``, ``server_id``, ``run_dir``, ``owner_pid``, ``owner_start_ticks``,
    ``start_ticks``, ``started_at`` (epoch seconds)."""
    return _state_read()


def _state_write(entries: list[dict]) -> None:
    f = _state_file()
    tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(f)


def _state_add(entry: dict) -> None:
    with _state_lock():
        _state_write([e for e in _state_read() if e["pid"] != entry["pid"]] + [entry])


def _state_remove(pid: int) -> None:
    with _state_lock():
        _state_write([e for e in _state_read() if e["pid"] != pid])


def _cmdline(pid: int, limit: int = 120) -> str:
    """The command line of ``pid`` as one string (``/proc/<pid>/cmdline``), cut at ``limit`` characters; '' if gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def port_holders(inodes: set[int]) -> list[tuple[int, str]]:
    """The processes that hold the sockets ``inodes`` (e.g. from :func:`port_listeners`): ``[(pid, command
    line), ...]`` sorted by PID, read from /proc/*/fd (the socket links ``socket:[<inode>]``). A process of
    another user, whose fds cannot be read, is not found: an empty list then means "held by a process this user
    cannot see"."""
    out = []
    if not inodes:
        return out
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and _socket_inodes([int(d.name)]) & inodes:
            out.append((int(d.name), _cmdline(int(d.name))))
    return sorted(out)
