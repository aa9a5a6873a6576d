"""FAKE GPU host for the multi-host test: the real ``host_trial`` flow (device locks, Prefect slot, trial flow
call, validation, shipping to the store) on a FAKE NVML whose devices come from the ``FAKE_NVML_GPUS``
environment variable (JSON list of ``FakeGpu`` keyword arguments), with a FAKE trial body (no vLLM server:
it sleeps ``FAKE_TRIAL_S`` seconds and writes a synthetic bundle) and no runtime/model pre-flight.

Deployment entrypoint: ``tests/fakes/fake_host_flow.py:host_trial`` (a process worker imports this file in
each flow run's process).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS.parent))
sys.path.insert(0, str(TESTS))

from prefect import flow  # noqa: E402

import tunelab.flows.hosts as H  # noqa: E402
from fakes.fake_nvml import FakeGpu, FakeNvml  # noqa: E402
from tunelab.core.bundle import write_bundle  # noqa: E402
from tunelab.flows.trial import trial_row_base  # noqa: E402
from tunelab.host.runtime import Runtime  # noqa: E402
from tunelab.tasks import gpu  # noqa: E402
from tunelab.warehouse.synthetic import synthetic_trial  # noqa: E402


@flow(name="trial", validate_parameters=False)
def fake_trial(trial, trial_id, plan, runtime, ctx, window_check=None):
    """FAKE trial: no server; a synthetic bundle with the trial's ids, after ``FAKE_TRIAL_S`` seconds."""
    time.sleep(float(os.environ.get("FAKE_TRIAL_S", "2")))
    row = trial_row_base(trial, trial_id, ctx.sweep.sweep_id, runtime, ctx)
    syn = synthetic_trial(sweep_id=ctx.sweep.sweep_id, config_key=trial.config_key, replicate=trial.replicate,
                          requests_per_repeat=6, chunk_offsets=4)
    tables = {k: v.assign(trial_id=trial_id) for k, v in syn.tables.items() if k != "quality_checks"}
    m = tables["measurements"]
    tables["measurements"] = m.assign(tpot_p50_s=m["tpot_mean_s"], itl_mean_s=m["tpot_mean_s"],
                                      achieved_concurrency=m["load_value"], client_cpu_frac=0.1)
    row.update(status="ok", boot_s=0.5, teardown_s=0.1, teardown_clean=True, boot_attempts=1,
               finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
    return write_bundle(Path(ctx.results_dir), ctx.sweep, row, tables)


def _fake_nvml() -> FakeNvml:
    return FakeNvml([FakeGpu(**g) for g in json.loads(os.environ.get("FAKE_NVML_GPUS", "[]"))])


_RT = Runtime(name="gpu-fake", device="cuda", python=sys.executable, versions={"vllm": "0.32.0"})
H.run_trial = fake_trial
H.inventory = lambda: gpu.inventory(nvml=_fake_nvml())
H.preflight = lambda plan: {"gpu-fake": _RT}
host_trial = H.host_trial
