"""Host-level device locks: exclusive across processes, released by the OS when the holder is SIGKILLed; the
records of who holds a device's Prefect slot and when a holder is provably dead (tunelab/host/slot_holders.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from tunelab.flows.sweep import device_locks, prefect_slots_enabled

REPO = Path(__file__).resolve().parent.parent

_HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from tunelab.flows.sweep import device_locks
with device_locks(["tunelab-h-cpu0"]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_lock_is_exclusive_and_released_when_the_holder_is_killed(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    env = dict(os.environ, TUNELAB_HOME=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD.format(repo=str(REPO))], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        got = threading.Event()

        def take():
            with device_locks(["tunelab-h-cpu0"], poll_s=0.05):
                got.set()

        t = threading.Thread(target=take, daemon=True)
        t.start()
        assert not got.wait(1.0)          # the other process holds the device
        holder.send_signal(signal.SIGKILL)  # a sweep killed without any cleanup
        holder.wait()
        assert got.wait(10)                 # ... does not block the device
        t.join(5)
    finally:
        if holder.poll() is None:
            holder.kill()


def test_different_devices_do_not_block_each_other(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    with device_locks(["tunelab-h-gpu0"]):
        t0 = time.monotonic()
        with device_locks(["tunelab-h-gpu1"], poll_s=0.05):
            pass
        assert time.monotonic() - t0 < 5


def test_prefect_slots_only_with_a_server(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert prefect_slots_enabled() is False
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert prefect_slots_enabled() is True


def _record(**kw):
    from tunelab.host.slot_holders import this_process

    h = this_process("tunelab-h-gpu0", sweep_id="s1", flow_run_id=None, lease_id="0" * 32, lease_duration_s=60)
    return replace(h, **kw) if kw else h


def test_slot_holder_provably_dead_only_on_this_host():
    from tunelab.host.slot_holders import holder_is_dead

    assert holder_is_dead(_record()) == (False, f"PID {os.getpid()} is alive")
    # another host: never called dead, and the reason says so
    dead, why = holder_is_dead(_record(host="some-other-host"))
    assert not dead and "cannot prove" in why and "some-other-host" in why
    # a PID that does not exist (above the kernel's pid_max)
    dead, why = holder_is_dead(_record(pid=2**22 + 1))
    assert dead and "gone" in why
    # our PID, but recorded with another start time: the PID was reused
    me = _record()
    dead, why = holder_is_dead(replace(me, proc_start_ticks=me.proc_start_ticks + 1))
    assert dead and "another process" in why
    # recorded before a reboot
    dead, why = holder_is_dead(_record(boot_id="00000000-0000-0000-0000-000000000000"))
    assert dead and "rebooted" in why


def test_slot_holder_that_exited_unreaped_is_dead():
    from tunelab.host.slot_holders import holder_is_dead

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        t0 = time.monotonic()
        while Path(f"/proc/{p.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":  # exited, not reaped
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)
        from tunelab.host.slot_holders import _proc_start_ticks

        dead, why = holder_is_dead(_record(pid=p.pid, proc_start_ticks=_proc_start_ticks(p.pid)))
        assert dead and "exited" in why
    finally:
        p.wait()


def test_slot_holder_record_is_written_atomically_and_read_back(tmp_path, monkeypatch):
    from tunelab.host import slot_holders as SH

    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    assert SH.read_holder("tunelab-h-gpu0") is None
    h = _record()
    SH._write(h)
    assert SH.read_holder("tunelab-h-gpu0") == h
    assert [p.name for p in SH.record_path("tunelab-h-gpu0").parent.iterdir()] == ["tunelab-h-gpu0.json"]
    SH._remove("tunelab-h-gpu0", "another-lease", h.pid)  # a later holder's record is not ours to remove
    assert SH.read_holder("tunelab-h-gpu0") == h
    SH._remove("tunelab-h-gpu0", h.lease_id, h.pid)
    assert SH.read_holder("tunelab-h-gpu0") is None


def test_two_homes_on_one_host_share_the_device_lock(tmp_path, monkeypatch):
    """Two clones (two tunelab homes) on one host: the second sweep waits for the device the first holds
    (issue 29 item 16: the lock lived in <home>/state/locks, so both booted on one device at once)."""
    home_a, home_b = tmp_path / "clone-a" / ".tunelab", tmp_path / "clone-b" / ".tunelab"
    env = dict(os.environ, TUNELAB_HOME=str(home_a))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD.format(repo=str(REPO))], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("TUNELAB_HOME", str(home_b))
        got, said = threading.Event(), []

        def take():
            with device_locks(["tunelab-h-cpu0"], log=said.append, poll_s=0.05):
                got.set()

        t = threading.Thread(target=take, daemon=True)
        t.start()
        assert not got.wait(1.0), "the second home booted on the device the first home holds"
        assert said and "another sweep on this host holds it" in said[0]
        holder.kill()
        holder.wait()
        assert got.wait(10)
        t.join(5)
    finally:
        if holder.poll() is None:
            holder.kill()


def test_lock_and_slot_record_folder_is_the_hosts_not_the_homes(tmp_path, monkeypatch):
    """Without TUNELAB_LOCK_DIR: $XDG_RUNTIME_DIR/tunelab-locks (else <tmp>/tunelab-locks-<uid>), whatever
    TUNELAB_HOME is; the slot holder records live there too."""
    from tunelab.host import paths
    from tunelab.host.slot_holders import record_path

    monkeypatch.delenv("TUNELAB_LOCK_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    for home in ("h1", "h2"):
        monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / home))
        assert paths.host_locks_dir() == tmp_path / "run" / "tunelab-locks"
        assert record_path("tunelab-h-gpu0").parent == tmp_path / "run" / "tunelab-locks" / "slots"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert paths.host_locks_dir().name == f"tunelab-locks-{os.getuid()}"
    monkeypatch.setenv("TUNELAB_LOCK_DIR", str(tmp_path / "shared"))
    assert paths.host_locks_dir() == tmp_path / "shared"
