"""FAKE sweep host for command-line tests: runs the real ``tunelab`` command (``tunelab.cli.app``) with the real
``tuning_sweep`` flow (scheduler, slots, validation, load, report), but with a FAKE trial body (no vLLM server:
it writes a synthetic bundle at once), a FAKE one-GPU inventory and no runtime/model pre-flight. For faults
that need no real server, e.g. a warehouse file locked by another process when the sweep loads.

    python tests/fakes/fake_sweep_cli.py run PLAN.yaml [options]   # the plan names runtime 'gpu-fake'

``FAKE_BLOCK_FROM=N``: trials N, N+1, ... (0-based, in start order) block instead of writing their bundle, after
creating the file ``FAKE_BLOCK_MARK``; interrupted (Ctrl-C, SIGTERM), such a trial writes a ``cancelled`` bundle
and re-raises, as the real trial flow does. For tests of cancelling a running sweep. With ``FAKE_BLOCK_KEPT=1`` a
blocking trial first writes the windows-so-far bundle (``status='incomplete'``, as ``flows.trial._keep_windows``)
and, interrupted, writes nothing more: a trial interrupted after its windows, in its teardown. ``FAKE_FINDING=1``:
each trial's first window has a flagged (FAKE) kv_cache finding.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))


_started: list[str] = []


def _install_fakes() -> None:
    from prefect import flow

    import tunelab.flows.sweep as S
    from tunelab.flows.trial import trial_row_base
    from tunelab.core.bundle import write_bundle
    from tunelab.tasks.gpu import GpuInfo, Inventory
    from tunelab.host.runtime import Runtime
    from tunelab.warehouse.synthetic import synthetic_trial

    @flow(name="trial", validate_parameters=False)
    def fake_trial(trial, trial_id, plan, runtime, ctx, window_check=None):
        """FAKE trial: no server; a synthetic bundle with the trial's ids."""
        row = trial_row_base(trial, trial_id, ctx.sweep.sweep_id, runtime, ctx)
        _started.append(trial_id)
        block_from = os.environ.get("FAKE_BLOCK_FROM")
        if block_from is not None and len(_started) > int(block_from):
            kept = os.environ.get("FAKE_BLOCK_KEPT") == "1"
            if kept:
                row.update(status="incomplete", failure_reason="the trial ended without its final bundle after 1 "
                           "measured window(s): killed or its host lost; these windows were kept as they ended")
                write_bundle(Path(ctx.results_dir), ctx.sweep, row, {})
            Path(os.environ["FAKE_BLOCK_MARK"]).write_text(trial_id)
            try:
                while True:
                    time.sleep(0.1)
            except BaseException as e:  # cancelled: record it, as flows.trial.run_trial does
                if kept:
                    raise
                row.update(status="cancelled", failure_reason=f"{type(e).__name__}: {e}",
                           finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
                write_bundle(Path(ctx.results_dir), ctx.sweep, row, {})
                raise
        syn = synthetic_trial(sweep_id=ctx.sweep.sweep_id, config_key=trial.config_key,
                              replicate=trial.replicate, requests_per_repeat=6, chunk_offsets=4)
        tables = {k: v.assign(trial_id=trial_id) for k, v in syn.tables.items() if k != "quality_checks"}
        m = tables["measurements"]  # the columns the quality gate needs that synthetic trials leave out
        tables["measurements"] = m.assign(tpot_p50_s=m["tpot_mean_s"], itl_mean_s=m["tpot_mean_s"],
                                          achieved_concurrency=m["load_value"], client_cpu_frac=0.1)
        if os.environ.get("FAKE_FINDING") == "1":  # one flagged bottleneck in each trial's first window
            import pandas as pd

            w = tables["measurements"].iloc[0]
            tables["window_diagnoses"] = pd.DataFrame([{
                "trial_id": trial_id, "workload": w["workload"], "load_kind": w["load_kind"],
                "load_value": float(w["load_value"]), "repeat": int(w["repeat"]), "bottleneck": "kv_cache",
                "flagged": True, "metric": "preemptions", "value": 3.0, "threshold": 0.0,
                "summary": "FAKE 3 preemptions", "evidence": "{}", "remedy": "FAKE remedy", "sources": "fake"}])
        row.update(status="ok", boot_s=0.5, teardown_s=0.1, teardown_clean=True,
                   finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
        return write_bundle(Path(ctx.results_dir), ctx.sweep, row, tables)

    rt = Runtime(name="gpu-fake", device="cuda", python=sys.executable, versions={"vllm": "0.32.0"})
    S.run_trial = fake_trial
    S.inventory = lambda: Inventory(True, driver_version="fake", cuda_version="12.9",
                                    gpus=[GpuInfo(0, "FAKE H200", "GPU-fake-0", 143771.0, 500.0)])
    S.preflight = lambda plan: {"gpu-fake": rt}
    S.stop_leftovers = lambda log=None: []


if __name__ == "__main__":
    # A child of a shell script run in the background inherits SIGINT ignored; then Python installs no
    # KeyboardInterrupt handler and a test's "Ctrl-C" would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tunelab.host import prefect_env

    prefect_env.configure()
    _install_fakes()
    from tunelab.cli import app

    sys.exit(app())
