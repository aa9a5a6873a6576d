"""What ``flows.trial.run_trial`` needs besides its plan, for tests that run the trial flow's own code on a FAKE
engine (no vLLM, no Prefect task runs): one trial of a FAKE runtime and the sweep context it runs in."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any


def fake_trial_setup(plan: Any, out: Path, *, runtime: str = "fake-rt", device: str = "cpu",
                     **context: Any) -> tuple[Any, Any, Any, str]:
    """``(trial, runtime, ctx, trial_id)`` for ``run_trial.fn(trial, trial_id, plan, runtime, ctx)``: a trial with
    no engine args on a FAKE runtime named ``runtime`` (vLLM 0.32.0 on ``device``), a new sweep of ``plan`` on host
    ``fake-host``, bundles under ``out/results`` and server logs under ``out/logs`` (created). ``context``: more
    ``TrialContext`` fields (the GPU's index, name, baseline)."""
    import tunelab.flows.trial as T
    from tunelab.core import records as R
    from tunelab.core.plan import Trial
    from tunelab.host.runtime import Runtime

    trial = Trial(runtime=runtime, model="unused", model_id="unused", engine_args={}, env={})
    rt = Runtime(name=runtime, device=device, python=sys.executable, versions={"vllm": "0.32.0"})
    started = dt.datetime.now(dt.timezone.utc)
    sweep = R.Sweep(sweep_id=R.sweep_id(started, plan.name), plan_name=plan.name, host="fake-host", started_at=started)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    ctx = T.TrialContext(sweep=sweep, results_dir=str(out / "results"), logs_dir=str(out / "logs"), **context)
    return trial, rt, ctx, R.trial_id(sweep.sweep_id, trial.config_key, rt.name, 0)
