"""Tasks ``measure`` and ``sla-search``: the measured windows on a running server, sampling the GPU meanwhile.

``measure``: ``tasks.measure.measure_server`` (per load level its ``warm_up()``, then the windows); ``sla-search``:
the plan's ``sla_search`` after them (``tasks.sla_search.run_sla_search``). A measurement that fails ends its task
Failed with the exception as data (``tasks.steps.outcome.failed_state``): the trial records it and goes on.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from tunelab.core import records as R
from tunelab.core.plan import Plan
from tunelab.tasks.engine import EngineServer
from tunelab.tasks.gpu import GpuSampler
from tunelab.tasks.measure import MeasureResult, measure_server, progress_logger
from tunelab.tasks.sla_search import run_sla_search
from tunelab.tasks.steps.outcome import failed_state, step_logger

__all__ = ["measure_task", "sla_search_task", "gpu_sampling", "measurement_deadline_s", "server_state"]

#: Seconds a measurement may take on top of its windows' own deadlines: set-up, prompts' /tokenize, scrapes.
MEASURE_SLACK_S = 300


def measurement_deadline_s(plan: Plan) -> float:
    """tunelab's own deadline for a trial's whole measurement, seconds: each load profile's window deadline
    (``tunelab.core.load_profiles``) x workloads x repeats, plus :data:`MEASURE_SLACK_S`."""
    duration_s = plan.window.duration_s if plan.window else None
    per_level_s = sum(lp.window_deadline_s(plan.request_timeout_s, plan.repeats, duration_s)
                      for lp in plan.load_profiles())
    return per_level_s * len(plan.workloads) * plan.repeats + MEASURE_SLACK_S


@contextlib.contextmanager
def gpu_sampling(gpu_index: int | None) -> Iterator[list[dict]]:
    """NVML samples of ``gpu_index`` while the block runs (``tasks.gpu.GpuSampler``); yields the list the rows
    land in (empty on a CPU runtime, ``gpu_index`` None). Shared by the measure and SLA-search tasks."""
    sampler = GpuSampler(gpu_index) if gpu_index is not None else None
    if sampler is None:
        yield []
        return
    sampler.__enter__()
    try:
        yield sampler.rows
    finally:
        sampler.__exit__(None, None, None)


def _server_pid(server: Any) -> int | None:
    return getattr(getattr(server, "proc", None), "pid", None)


@task(name="measure", cache_policy=NO_CACHE)
def measure_task(server: EngineServer, plan: Plan, gpu_index: int | None,
                 on_window: Callable[[MeasureResult], None] | None = None) -> Any:
    """Warm-up + all workloads x load levels x repeats on the running server, sampling the GPU meanwhile.
    ``on_window``: ``measure_server``'s, called with the windows so far after each window.

    Returns:
        ``(MeasureResult, gpu_samples frame)``; or a Failed state carrying the exception when the measurement
        failed (read with ``tasks.steps.outcome.task_value``, which raises it).
    """
    progress = progress_logger(step_logger(), min_interval_s=2.0)
    with gpu_sampling(gpu_index) as rows:
        try:
            res = measure_server(server.base_url, server.api_key, server.served_model_name, plan,
                                 progress=progress, deadline_s=measurement_deadline_s(plan),
                                 load_processes=plan.load_processes, server_log=server.log_path,
                                 on_window=on_window, server_pid=_server_pid(server))
        except Exception as e:  # the trial records it; the reason leads the log (see outcome.failed_state)
            return failed_state(e, f"measurement failed: {type(e).__name__}: {e or repr(e)}")
    gpu = R.frame(R.GpuSample, pd.DataFrame(rows), without=("trial_id",))
    return res, gpu


def _concat(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([f for f in (a, b) if len(f)] or [a], ignore_index=True)


@task(name="sla-search", cache_policy=NO_CACHE)
def sla_search_task(server: EngineServer, plan: Plan, gpu_index: int | None, measured: MeasureResult,
                    on_window: Callable[[MeasureResult], None] | None = None,
                    on_interrupted: Callable[[pd.DataFrame], None] | None = None) -> Any:
    """The plan's ``sla_search`` on the running server, after its own windows (``measured``):
    ``tasks.sla_search.run_sla_search``, sampling the GPU meanwhile. Each search window has its own deadline (its
    profile's, plus slack). ``on_interrupted``: given the ``sla_searches`` frame so far (an ``interrupted`` row
    for the search cut short) before a cancel or an error propagates.

    Returns:
        (every window, the plan's and the search's, as one MeasureResult; the search's GPU samples; the
        ``sla_searches`` frame); or a Failed state carrying the exception (as :func:`measure_task`).
    """
    logger = step_logger()
    with gpu_sampling(gpu_index) as rows:
        try:
            found, sla = run_sla_search(server.base_url, server.api_key, server.served_model_name, plan,
                                        measured=measured, progress=progress_logger(logger, min_interval_s=2.0),
                                        load_processes=plan.load_processes, server_log=server.log_path,
                                        server_pid=_server_pid(server), on_window=on_window, log=logger.info,
                                        on_interrupted=on_interrupted)
        except Exception as e:  # the trial records it; the reason leads the log (see outcome.failed_state)
            return failed_state(e, f"SLA search failed: {type(e).__name__}: {e or repr(e)}")
    gpu = R.frame(R.GpuSample, pd.DataFrame(rows), without=("trial_id",))
    every = MeasureResult(_concat(measured.requests, found.requests),
                          _concat(measured.measurements, found.measurements),
                          _concat(measured.server_metrics, found.server_metrics),
                          list(measured.notes) + found.notes)
    return every, gpu, sla


def server_state(server: Any) -> str:
    """One line on the server after a failed measurement: exited (with its status, or the signal that killed
    it), alive but not answering ``/health`` within 2 s (hung or stopped), or alive and healthy."""
    proc = getattr(server, "proc", None)
    rc = proc.poll() if proc is not None else None
    if rc is not None:
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        return f"server process exited during the measurement ({how})"
    try:
        from tunelab.tasks.loadgen.control import control_call_sync

        # Retried on a fresh connection after a dropped one, as every control call (a drop is not a hang).
        r = control_call_sync(server.base_url, "GET", "/health", timeout=2.0)
        return f"server alive, /health answered {r.status_code}"
    except Exception as e:
        return f"server process alive but /health did not answer within 2 s ({type(e).__name__}): hung or stopped"
