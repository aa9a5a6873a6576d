"""Does the quality gate catch a deliberately noisy, bursty trial on the real CPU runtime?

Runs `tunelab run benchmarks/noisy_bursty.yaml` (vLLM's multiprocess layout on the CPU runtime, which delivers
streamed tokens in bursts on 2 cores) while busy loops saturate every core, and prints the trial's quality
verdict and the checks that failed. Not a test: whether bursts and noise actually occur depends on the machine
(on a loaded 2-core box the verdict was `fail`/`warn`; on a quiet one the trial was clean and honestly `pass`).

With ``--stall`` no busy loops run; instead the test-side FAULT INJECTION of ``tests/fault_injection.py`` stops
the server's process group in 200 ms slices with 5 ms of running between them during the second measured
repeat, as the test ``tests/test_quality_e2e.py`` does: that trial is not `pass` on any machine.

Usage: .venv/bin/python benchmarks/quality_noisy_trial.py [--stall]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "benchmarks" / "noisy_bursty.yaml"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

_BURN = "import time\nt=time.time()\nwhile time.time()-t < 600: pass\n"


def _run_with_stall(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``tunelab run`` and stall its first trial's second measured repeat (FAULT INJECTION, test-side)."""
    from fault_injection import run_with_stall

    rc, output, report = run_with_stall(cmd, REPO, env, repeat=1, repeats=2)  # noisy_bursty.yaml: repeats 2
    if report is not None:
        print(f"stall: {report.slices} slices, stopped {report.stopped_s:.2f} s of {report.wall_s:.2f} s "
              f"({report.stopped_frac:.0%}) of trial {report.trial_id}; {report.events}")
    return subprocess.CompletedProcess(cmd, rc, output, "")


def main() -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stall", action="store_true",
                    help="stall one measured repeat of the server (SIGSTOP/SIGCONT) instead of busy loops")
    args = ap.parse_args()
    tmp_path = Path(tempfile.mkdtemp(prefix="tunelab-noisy-"))
    env = dict(os.environ, TUNELAB_DB=str(tmp_path / "wh.duckdb"), TUNELAB_RESULTS=str(tmp_path / "results"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    cmd = [sys.executable, "-m", "tunelab.cli", "run", str(PLAN)]
    if args.stall:
        r = _run_with_stall(cmd, env)
    else:
        # Busy loops on every core (and one more) for the whole trial: the client, the API server and the engine
        # compete for CPU, which is what a shared, overloaded load-generator host looks like.
        burners = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range((os.cpu_count() or 2) + 1)]
        try:
            r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
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
