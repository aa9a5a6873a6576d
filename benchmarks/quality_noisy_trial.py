"""Does the quality gate catch a deliberately noisy, bursty trial on the real CPU runtime?

Runs `tunelab run benchmarks/noisy_bursty.yaml` (vLLM's multiprocess layout on the CPU runtime, which delivers
streamed tokens in bursts on 2 cores) while busy loops saturate every core, and prints the trial's quality
verdict and the checks that failed. Not a test: whether bursts and noise actually occur depends on the machine
(on a loaded 2-core box the verdict was `fail`/`warn`; on a quiet one the trial was clean and honestly `pass`).

Usage: .venv/bin/python benchmarks/quality_noisy_trial.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "benchmarks" / "noisy_bursty.yaml"

_BURN = "import time\nt=time.time()\nwhile time.time()-t < 600: pass\n"


def main() -> int:
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="tunelab-noisy-"))
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
    if not (tmp_path / "wh.duckdb").exists():
        print(r.stdout[-3000:] + r.stderr[-3000:])
        return 1
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    status, verdict = con.execute("SELECT status, quality_verdict FROM trials").fetchall()[0]
    failed = con.execute("SELECT suite, expectation, severity, observed FROM quality_checks "
                         "WHERE success = false").fetchall()
    print(f"load average {os.getloadavg()}; trial status {status}; quality verdict {verdict}")
    for row in failed:
        print("  failed:", *row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
