"""Run ``tunelab run PLAN`` on the FAKE sweep host (``fake_sweep_cli.py``) until its blocking trial starts, then send
a signal: the harness of the tests that cancel a running sweep (``FAKE_BLOCK_FROM`` / ``FAKE_BLOCK_MARK`` in ``env``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def run_until_blocked_then_signal(plan: Path, env: dict, sig: int, what: str = "the blocking trial",
                                  start_s: float = 240.0) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of the fake ``tunelab run`` after ``sig`` was sent once the file named by
    ``env['FAKE_BLOCK_MARK']`` exists. Fails the test (AssertionError) if the run ends first or ``what`` does not
    start within ``start_s``; the process group is killed if it outlives the test."""
    mark = Path(env["FAKE_BLOCK_MARK"])
    p = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakes" / "fake_sweep_cli.py"), "run", str(plan)],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + start_s
        while not mark.exists():
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"{what} never started"
            time.sleep(0.2)
        p.send_signal(sig)
        out, errs = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, out, errs
