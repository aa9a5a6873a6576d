"""End to end on the real CPU runtime: a deliberately noisy, bursty trial is not marked pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "tests" / "plans" / "noisy_bursty.yaml"

pytestmark = pytest.mark.runtime

_BURN = "import time\nt=time.time()\nwhile time.time()-t < 600: pass\n"


def test_noisy_bursty_trial_is_not_pass(tmp_path, cpu_runtime, tiny_model):
    env = dict(os.environ, TUNELAB_DB=str(tmp_path / "wh.duckdb"), TUNELAB_RESULTS=str(tmp_path / "results"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    # Busy loops on every core (and one more) for the whole trial: the client, the API server and the engine
    # compete for CPU, which is what a shared, overloaded load-generator host looks like.
    burners = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range((os.cpu_count() or 2) + 1)]
    try:
        r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(PLAN)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    status, verdict = con.execute("SELECT status, quality_verdict FROM trials").fetchall()[0]
    assert status == "ok"
    assert verdict in ("warn", "fail"), verdict
    failed = con.execute("SELECT suite, expectation, severity, observed FROM quality_checks "
                         "WHERE success = false").fetchall()
    assert failed, "a non-pass verdict must name the checks that failed"
