"""Host-level device locks: exclusive across processes, released by the OS when the holder is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from flows.sweep import device_locks, prefect_slots_enabled

REPO = Path(__file__).resolve().parent.parent

_HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from flows.sweep import device_locks
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
