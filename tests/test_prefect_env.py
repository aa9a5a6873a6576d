"""Prefect's ephemeral server as tunelab starts it: out of the terminal's Ctrl-C, and gone with the process that
started it, also when that process is SIGKILLed. Each test runs a real ephemeral server (no vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A sweep-like orchestrator: starts the ephemeral server the way `tunelab run` does, runs a flow that sleeps
# (a measurement), prints the server's PID when the flow runs.
ORCHESTRATOR = """
import signal, sys, time
# Ctrl-C as in a terminal: an ignored signal stays ignored across exec, and tests started as a background job
# (`pytest &` in a script) inherit SIGINT ignored; Python then installs no KeyboardInterrupt handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
from tunelab.host import prefect_env
prefect_env.configure()
pid = prefect_env.start_ephemeral_server()
from prefect import flow

@flow(name="sleeper")
def sleeper():
    print("SERVER", pid, flush=True)
    time.sleep(120)

sleeper()
"""


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rfind(")") + 2] != "Z"


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), PYTHONFAULTHANDLER="1")
    env.pop("PREFECT_API_URL", None)
    p = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("SERVER "):
            return p, int(line.split()[1])
    p.wait(10)
    raise AssertionError("the flow never ran: " + "".join(seen)[-3000:])


def _gone_within(pid: int, seconds: float) -> bool:
    t0 = time.monotonic()
    while _alive(pid):
        if time.monotonic() - t0 > seconds:
            return False
        time.sleep(0.2)
    return True


def test_sigkilled_orchestrator_takes_its_ephemeral_server_along(tmp_path):
    p, server = _start(tmp_path)
    try:
        assert _alive(server) and os.getsid(server) != os.getsid(p.pid)  # own session: no terminal Ctrl-C
        p.kill()
        p.wait(10)
        assert _gone_within(server, 15), "the ephemeral server outlived the SIGKILLed orchestrator"
    finally:
        if p.poll() is None:
            p.kill()
        if _alive(server):
            os.kill(server, signal.SIGKILL)


def test_one_ctrl_c_ends_the_run(tmp_path):
    """Ctrl-C reaches the terminal's whole process group. The server used to get it too and die first; the
    run then hung recording its Crashed state until a second Ctrl-C."""
    p, server = _start(tmp_path)
    try:
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        try:
            out = p.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            # Say where it hung: Python's tracebacks of every thread (faulthandler on SIGABRT), then its output.
            os.kill(p.pid, signal.SIGABRT)
            out = p.communicate(timeout=20)[0]
            raise AssertionError("no exit 60 s after one Ctrl-C:\n" + out[-6000:]) from None
        assert p.returncode != 0 and time.monotonic() - t0 < 30, out[-3000:]
        assert "Finished in state Crashed" in out, out[-3000:]  # the state was recorded on a live server
        assert _gone_within(server, 15)  # stopped by Prefect's exit hook
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        if _alive(server):
            os.kill(server, signal.SIGKILL)


def _processes_with_env(entry: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if entry.encode() in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                pass
    return [p for p in out if _alive(p)]


def test_killed_while_the_server_starts(tmp_path):
    """SIGKILL in the seconds between the server's spawn and its first healthy answer (Prefect registers its
    exit hook only then): the guard is in place from the spawn on."""
    home = tmp_path / "prefect"
    env = dict(os.environ, PREFECT_HOME=str(home))
    env.pop("PREFECT_API_URL", None)
    code = "from tunelab.host import prefect_env\nprefect_env.configure()\nprefect_env.start_ephemeral_server()\n" \
           "import time\ntime.sleep(120)\n"
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    mine = f"PREFECT_HOME={home}"
    try:
        t0 = time.monotonic()
        while not [q for q in _processes_with_env(mine) if q != p.pid and "uvicorn" in
                   Path(f"/proc/{q}/cmdline").read_bytes().decode(errors="replace")]:
            assert time.monotonic() - t0 < 60 and p.poll() is None, "no server spawned"
            time.sleep(0.05)
        p.kill()
        p.wait(10)
        t0 = time.monotonic()
        while _processes_with_env(mine):
            assert time.monotonic() - t0 < 15, f"left behind: {_processes_with_env(mine)}"
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.kill()
        for q in _processes_with_env(mine):
            os.kill(q, signal.SIGKILL)
