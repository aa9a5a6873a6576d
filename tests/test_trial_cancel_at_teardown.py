"""A cancel that lands while a finished trial tears its server down (Prefect's runner SIGTERMs the run's process
as soon as the run is cancelled, wherever the trial is): the teardown is finished, the bundle is written with
status ``cancelled`` and the interruption propagates. Before, the signal left the trial without a bundle.

The trial flow's own code (``flows.trial.run_trial``) runs without Prefect's machinery against the FAKE timed
OpenAI server (tests/fakes/) through a FAKE engine whose first ``stop()`` is interrupted.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal


sys.path.insert(0, str(Path(__file__).parent / "fakes"))
sys.path.insert(0, str(Path(__file__).parent))


class _InterruptedStopEngine:
    """FAKE engine (as in test_records) whose first ``stop()`` raises ``TerminationSignal``, as Prefect's SIGTERM
    bridge does when the signal arrives mid-teardown; later calls stop cleanly. Counts the calls."""

    def __init__(self, base):
        self.base, self.stops = base, 0

    def __getattr__(self, name):
        return getattr(self.base, name)

    def stop(self):
        self.stops += 1
        if self.stops == 1:
            raise TerminationSignal(signal=signal.SIGTERM)
        return self.base.stop()


def test_a_cancel_during_a_normal_teardown_finishes_it_and_writes_a_cancelled_bundle(tmp_path):
    from fake_trial import fake_trial_setup
    from test_records import FakeEngine
    from timed_openai_server import FakeServerProcess, FakeTiming

    import tunelab.flows.trial as T
    from tunelab.core.bundle import read_bundle
    from tunelab.core.plan import Plan, Workload

    engines: list[_InterruptedStopEngine] = []

    def boot(*a, **k):
        engines.append(_InterruptedStopEngine(FakeEngine(fake, a[3])))
        return engines[-1]

    mp = pytest.MonkeyPatch()
    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002, tokens_per_chunk=1), model="fake-model") as fake:
        try:
            mp.setattr(T, "get_run_logger", lambda: logging.getLogger("test_trial_cancel_at_teardown"))
            mp.setattr(T, "_boot_once", boot)
            for name in ("clean_gpu_task", "boot_task", "measure_task", "teardown_task"):
                mp.setattr(T, name, getattr(T, name).fn)  # the task bodies, without Prefect's task runs
            plan = Plan(name="cancel-at-teardown", model="unused", seed=7, repeats=1, warmup_requests=2,
                        concurrency=[2], workloads=[Workload(name="w", prompt_tokens=24, output_tokens=4,
                                                             num_requests=4)])
            trial, runtime, ctx, trial_id = fake_trial_setup(plan, tmp_path)
            with pytest.raises(TerminationSignal):
                T.run_trial.fn(trial, trial_id, plan, runtime, ctx)
        finally:
            mp.undo()
    assert len(engines) == 1 and engines[0].stops == 2  # the interrupted teardown was finished
    bundles = sorted((tmp_path / "results").rglob("manifest.json"))
    assert len(bundles) == 1, "no bundle was written"
    b = read_bundle(bundles[0].parent)
    row = b["trial"].iloc[0]
    assert row["status"] == "cancelled" and row["teardown_clean"]
    assert "TerminationSignal" in row["failure_reason"]
    assert len(b["measurements"]) == 1  # the window measured before the cancel is kept
