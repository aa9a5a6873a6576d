"""Flow ``tuning_sweep``: one plan execution, start to finish.

    validate plan -> stop leftovers of earlier runs -> inventory devices (GPUs; a CPU host has one, ``cpu0``)
      -> create one Prefect global concurrency limit per device (idempotent, limit 1)
      -> trials as the plan's design asks for them (``tunelab.designs``: the fixed grid in plan order, interleaved
       A B A B; A/B pairs until decided; a search's boots), each as subflow ``trial`` on a free device,
         holding that device's slot for boot .. teardown; trials on different GPUs run in parallel
      -> validate each bundle (great-expectations) -> load bundles into DuckDB -> report (artifacts)

Devices and slots. A trial needs ``tensor-parallel-size x pipeline-parallel-size x data-parallel-size`` GPUs
(1 when none is set; a CPU runtime always needs the one ``cpu0`` device). It takes the lowest-numbered free
devices and, before it boots, one slot of each device's global concurrency limit
``tunelab-<host>-gpu<index>`` (``-cpu0`` on CPU), acquired with ``strict=True``: a missing or misspelled
limit is an error, never a run without a lock. Under every slot, and alone in ephemeral mode, a host-level
file lock per device (``device_locks``) makes two sweeps (two processes, two deployments) on one host share
a GPU one trial at a time, and is released by the OS when a sweep is killed; Prefect slots are taken only
against a real server (``PREFECT_API_URL``), whose lease expiry frees the slot of a killed sweep and shows
the slots in the UI. Inside one sweep the scheduler hands out devices itself. Trials start in plan order (first in, first out, no back-filling), so the interleaving of the plan
is kept on any number of GPUs.

Failures and cancellation. A failed trial never stops the sweep: a boot failure is a result, and anything a
trial raises is recorded. Cancellation keeps Prefect's own protocol: Prefect's SIGTERM bridge stays installed
(its runner only delivers a "cancel" intent to a process whose bridge is armed, and the engine ends a run
Cancelled only for a ``TerminationSignal`` carrying that intent; tunelab's former handler, which raised
KeyboardInterrupt instead, made every cancelled run and trial end Crashed). A run started directly
(``tunelab run`` against a server) has no runner to signal it: :func:`tunelab.host.cancel_watch.watch_for_cancel`
polls its state and, on Cancelling, does what the runner does. ``TerminationSignal`` or Ctrl-C's
``KeyboardInterrupt``: a trial on the main thread (one device) tears down in its own ``finally`` and writes a
``cancelled`` bundle; with several devices the sweep stops every live server of this process, waits for the
trial threads to write their bundles and marks the trials that were running as ``cancelled``. The bundles
written so far are then loaded (best effort) and the interruption propagates to Prefect, which records the
run (and the trial subflow) as Cancelled; a bare ``kill -TERM`` or Ctrl-C, which nobody requested through
Prefect, ends them Crashed in Prefect's engine, and the flows' ``on_crashed`` hook
(``flows.run_states.cancelled_not_crashed_hook``) then sets them Cancelled, as ``tunelab run`` reports it.

Everything a trial produces is on disk (a bundle) before it is validated and loaded, so a failed load loses
nothing: ``tunelab load`` picks the bundles up later. A warehouse file that another process holds for longer
than ``lock_timeout_s`` is such a case: the sweep then reports from its bundles loaded into an in-memory
warehouse (``warehouse.loader.bundles_warehouse``, the same tables) and says who holds the file
(``SweepSummary.not_loaded``; ``tunelab run`` exits 3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypedDict

from prefect import flow, get_run_logger

import tunelab
from tunelab.core import progress
from tunelab.core import records
from tunelab.designs import Design, TrialResult, TrialSpec
from tunelab.flows.run_states import final_state_hook, cancelled_not_crashed_hook, mark_all_failed, mark_quality
from tunelab.flows.trial import TrialContext, run_trial, trial_row_base
from tunelab.core.bundle import bundle_dir_for, read_bundle, update_bundle_table, write_bundle, write_sweep_row
from tunelab.tasks.engine import stop_leftovers, tracked_servers
from tunelab.tasks.gpu import inventory
from tunelab.reports import report as R
from tunelab.core.markdown import shorten
from tunelab.host import paths
from tunelab.host.cancel_watch import watch_for_cancel
# Device scheduling and locks live in flows/devices.py; re-exported here (their public home before the split).
from tunelab.flows.devices import (
    INTERRUPTS,
    SLOT_LEASE_S,
    Device,
    device_locks,
    devices_from_inventory,
    device_env,
    host_devices,
    host_name,
    ensure_slots,
    gpus_needed,
    prefect_slots_enabled,
    run_on_devices,
    slot_name,
)
from tunelab.core.plan import Plan, PlanError, Trial, load_plan, runtime_checks
from tunelab.host.runtime import Runtime, RuntimeError_, load_runtime
from tunelab.host.slot_holders import hold_slots
from tunelab.tasks.steps.load import load_task
from tunelab.tasks.steps.validate import validate_task
from tunelab.warehouse.loader import DEFAULT_LOCK_TIMEOUT_S, bundles_warehouse, load_pending

__all__ = [
    "INTERRUPTS",
    "SLOT_LEASE_S",
    "Device",
    "SweepSummary",
    "TrialStatus",
    "devices_from_inventory",
    "ensure_slots",
    "gpus_needed",
    "preflight",
    "run_on_devices",
    "slot_name",
    "sweep_run_name",
    "trial_run_name",
    "trial_state",
    "trial_tags",
    "tuning_sweep",
]


class TrialStatus(TypedDict):
    """One trial of a sweep as the sweep reports it (``SweepSummary.trials``, the report's trial table, the
    CLI's failure lines): a dict with these keys, filled from the trial's bundle (``trials`` row) after it ran.
    A TypedDict, not a dataclass, because its readers (the CLI, ``reports.report.sweep_markdown``, the sweep's
    table artifact) take it as a dict.

    Keys: trial_id (``records.trial_id``); config (the plan's label), config_key, runtime, replicate (boot
    number); device (device labels joined by '+', '-' when none); status (``records.TrialRow.status``; 'failed'
    when the orchestrator raised); failure_class ('orchestrator_error' then), failure_reason; boot_s (seconds);
    compile_cache; teardown_clean; verdict (pass | warn | fail | unvalidated); measurement_notes.
    """

    trial_id: str
    config: str
    config_key: str
    runtime: str
    replicate: int
    device: str
    status: str
    failure_class: str | None
    failure_reason: str | None
    boot_s: float | None
    compile_cache: str | None
    teardown_clean: bool | None
    verdict: str
    measurement_notes: str | None


@dataclass
class SweepSummary:
    """Returned by :func:`tuning_sweep`.

    Attributes:
        sweep_id: the sweep's id (``records.sweep_id``). db: the warehouse file. results: the bundles' folder.
        trials: one :class:`TrialStatus` per trial, in plan order.
        comparison: records of ``tunelab.reports.report.comparison_frame``; left_out: what it left out.
        quality: verdict counts. report_markdown: the sweep's report. plots: PNG paths.
        timings: per trial: queued/slot/start/end epoch seconds.
        not_loaded: None, or when the warehouse file stayed locked by another process: a dict with ``db``,
            ``results``, ``holder_pid`` (None if DuckDB did not name it), ``holder_exe``, ``bundles`` (how many
            of this sweep's) and ``error``; the comparison and quality summary are then computed from the
            sweep's bundles in memory, the same tables.
    """

    sweep_id: str
    db: str
    results: str
    trials: list[TrialStatus]
    comparison: list[dict[str, Any]]
    left_out: list[Any]
    quality: dict[str, int]
    report_markdown: str
    timings: list[dict[str, Any]]
    plots: list[str]
    not_loaded: dict[str, Any] | None = None
    #: ``replicates: auto``: what the A/B decided (``flows.ab_auto.ABOutcome``); None for other plans.
    ab: Any = None
    #: Fixed designs with two or more configs: the A/B per cell with what it could detect (``design_plan.ab_lines``).
    ab_lines: list[str] = dataclasses.field(default_factory=list)
    #: ``search:`` plans: what the search did (``tunelab.core.search.config_tpe.SearchOutcome``) and its tuning report (markdown).
    search: Any = None
    tuning_markdown: str | None = None
    #: ``precision:`` plans: a line per cell whose interval did not reach the plan's half-width.
    precision_warnings: list[str] = dataclasses.field(default_factory=list)
    #: ``sla_search:`` plans: one line per trial and workload, the max load under the SLO
    #: (``reports.report.sla_search_lines``).
    sla_search: list[str] = dataclasses.field(default_factory=list)
    #: The windows with a bottleneck finding (records of ``reports.report.bottleneck_findings``; the report's
    #: "Bottlenecks" section), so that ``tunelab run`` ends with what ``tunelab report`` shows.
    bottlenecks: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def trial_run_name(trial: Trial, devices: Sequence[Device]) -> str:
    """Flow run name of a trial in the UI: config label, config key, runtime, replicate and device(s),
    e.g. ``enforce-eager [3f2a9c1b0d4e] cpu r0 @ cpu0``."""
    dev = "+".join(d.label for d in devices) or "-"
    return f"{trial.label} [{trial.config_key}] {trial.runtime} r{trial.replicate} @ {dev}"


# -- the sweep's trials ------------------------------------------------------------------------------------------
@dataclass
class _Job:
    index: int
    trial: Trial
    need: int
    pool: str  # "gpu" | "cpu"
    window_check: Any = None  # the spec's per-window check (designs.base.WindowCheck), None: every window


# -- tasks and helpers --------------------------------------------------------------------------------------
def preflight(plan: Plan) -> dict[str, Runtime]:
    """Everything that must hold before any server starts: runtimes exist, model folder exists, parallel
    sizes are integers, every engine-arg name is a ``vllm serve`` option of at least one of the plan's runtimes
    (``tunelab.core.plan.unknown_engine_args``, through ``runtime_checks``: a check that raises is skipped, never fatal).

    Raises:
        PlanError: with the field and the fix.
    """
    runtimes = {}
    for name in plan.runtime_names():
        try:
            runtimes[name] = load_runtime(name)
        except RuntimeError_ as e:
            raise PlanError(f"runtime: {e}") from None
    mp = Path(plan.model)
    if not (mp / "config.json").exists():
        raise PlanError(
            f"model: {plan.model!r} ({mp.resolve()}) is not a model folder (no config.json; a relative model path "
            "is read from the plan's folder first, then the current folder); build the tiny one with "
            f"`tunelab model tiny {plan.model}` or point 'model' at a local model directory"
        )
    for t in plan.trials():
        gpus_needed(t)
    arg_errors, _ = runtime_checks(plan, runtimes)
    if arg_errors:
        raise PlanError("\n".join(arg_errors))
    return runtimes


def trial_tags(trial: Trial, runtime: Runtime) -> list[str]:
    """Tags of a trial's flow run, to filter runs by in the Prefect UI and API: ``config_key:<key>``,
    ``runtime:<name>``, ``vllm:<version>`` ('unknown' when the runtime did not record one); the trial adds
    ``status:<status>`` (``records.TrialRow.status``) when it ends."""
    return [f"config_key:{trial.config_key}", f"runtime:{runtime.name}",
            f"vllm:{runtime.versions.get('vllm') or 'unknown'}"]


#: Final state names of a trial run by ``trials.status`` (``records.TrialRow.status``); their Prefect types are in
#: :func:`trial_state`. A failed trial ends Failed (red in the run list, header and timeline) under a name that
#: says how; the sweep run that called it stays Completed.
TRIAL_STATE_NAMES = {"ok": "Completed", "boot_failed": "BootFailed", "gpu_busy": "GpuBusy", "failed": "Failed",
                     "cancelled": "Cancelled"}


def trial_state(status: dict[str, Any]) -> Any:
    """The Prefect state a trial's flow run ends in, from its ``trials`` row (a dict with ``status``,
    ``failure_class``, ``failure_reason``): Completed for ``ok``; Cancelled for ``cancelled``; otherwise a
    FAILED-type state named after the status (``BootFailed``, ``GpuBusy``, ``Failed``) whose message leads with
    the failure class, e.g. ``invalid_config: ValueError: User-specified max_model_len ...`` (shortened at a word
    boundary to 300 characters; the whole reason is in the warehouse)."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    st = str(status.get("status") or "failed")
    reason = ": ".join(x for x in (status.get("failure_class"), shorten(status.get("failure_reason"), 260)) if x)
    if st == "ok":
        return State(type=StateType.COMPLETED, name="Completed", message=None)
    kind = StateType.CANCELLED if st == "cancelled" else StateType.FAILED
    return State(type=kind, name=TRIAL_STATE_NAMES.get(st, "Failed"), message=shorten(reason or st, 300))


def _trial_subflow(name: str, box: dict[str, Any], window_check: Any = None) -> Any:
    """The ``trial`` subflow (``flows.trial.run_trial``) under a descriptive run name. The bundle goes into
    ``box["bundle"]``; the run attaches the trial's table artifact to itself, adds its ``status:`` tag and ends
    in :func:`trial_state` (a failed trial is a Failed run, which the sweep reads with ``return_state=True``
    and survives). ``window_check``: the trial spec's per-window check (``designs.base.TrialSpec``)."""
    inner = getattr(run_trial, "fn", run_trial)

    @flow(name="trial", flow_run_name=lambda: name, log_prints=True, validate_parameters=False,
          on_crashed=[cancelled_not_crashed_hook])
    def trial(trial: Trial, trial_id: str, plan: Plan, runtime: Runtime, ctx: TrialContext) -> Any:
        # Only a check that exists is passed: a trial body without one keeps the five parameters (the tests' fakes).
        extra = {"window_check": window_check} if window_check is not None else {}
        bundle = inner(trial, trial_id, plan, runtime, ctx, **extra)
        box["bundle"] = bundle
        row = _status_of(bundle)
        _trial_run_views(trial, plan, bundle, row)
        return trial_state(row)

    trial.__doc__ = getattr(inner, "__doc__", None)
    return trial


def _trial_run_views(trial: Trial, plan: Plan, bundle: Path, row: dict[str, Any]) -> None:
    """On the trial's own flow run: its table artifact (one row per window; the facts and the config key's full
    settings as the description) and the ``status:<status>`` tag. Views only: a failure is logged, never raised."""
    logger = get_run_logger()
    try:
        from prefect.artifacts import create_table_artifact

        tables = read_bundle(bundle, verify=False)
        create_table_artifact(R.trial_table(tables),
                              key=_artifact_key("trial", plan.name, trial.runtime, trial.config_key, f"r{trial.replicate}"),
                              description=R.trial_facts_markdown(tables))
    except Exception as e:
        logger.warning("could not create the trial artifact: %s", e)
    try:
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        frc = FlowRunContext.get()
        if frc and frc.flow_run:
            tags = [t for t in (frc.flow_run.tags or []) if not t.startswith("status:")] + [f"status:{row.get('status')}"]
            with get_client(sync_client=True) as c:
                c.update_flow_run(frc.flow_run.id, tags=tags)
    except Exception as e:
        logger.warning("could not tag the trial run: %s", e)


@contextlib.contextmanager
def _no_subflow_heartbeats():
    """Trial subflows send no flow run heartbeats; the sweep's own run still does.

    Why: Prefect's heartbeat thread sleeps in whole seconds and every flow run waits for it on exit, which cost
    0.9-1.2 s between two trials (measured: 6 fake trials, body end -> next body start 1.17-1.21 s). The
    heartbeats of a subflow in the sweep's process add nothing to the sweep's: both stop together."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def _stop_live_servers(log: Callable[..., Any]) -> None:
    """Stop every server this process started and has not stopped yet (cancellation with trials in threads)."""
    from tunelab.tasks import engine

    with engine._LIVE_LOCK:  # the engine's registry of live servers of this process
        live = list(engine._LIVE.values())
    for s in live:
        try:
            td = s.stop()
            log(f"cancel: stopped server pid {s.proc.pid} ({'clean' if td.clean else td.detail})")
        except Exception as e:  # keep stopping the others
            log(f"cancel: could not stop server: {e}")


def _artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower())).strip("-")[:200]


def _device_minutes(timing: dict, devices: int) -> float:
    """Device-minutes of a trial: slot taken (or queued) -> trial ended, times its devices; 0 when not timed."""
    start, end = timing.get("slot_at") or timing.get("queued_at"), timing.get("end_at")
    return 0.0 if start is None or end is None else max(0.0, end - start) * max(devices, 1) / 60.0


def _status_of(bundle: Path) -> dict[str, Any]:
    t = read_bundle(bundle, verify=False)["trial"].iloc[0]
    return {k: (None if (isinstance(v, float) and math.isnan(v)) else v) for k, v in t.to_dict().items()}


def _skip_bundle(trial: Trial, trial_id: str, runtime: Runtime, ctx: TrialContext, reason: str,
                 failure_class: str) -> Path:
    """A bundle for a trial that was never booted (not enough devices, a device out of service)."""
    row = trial_row_base(trial, trial_id, ctx.sweep.sweep_id, runtime, ctx)
    row.update(status="failed", failure_class=failure_class, failure_reason=reason,
               finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
    return write_bundle(Path(ctx.results_dir), ctx.sweep, row, {})


def _mark_cancelled(bundle: Path | None, status: TrialStatus | None, logger: Any) -> None:
    """A trial that was running in a worker thread when the sweep was cancelled ends as a failed boot or
    measurement (its server was stopped under it): record it as ``cancelled``, keeping what it saw."""
    if bundle is None:
        return
    try:
        tdf = read_bundle(bundle)["trial"].copy()
        if tdf["status"].iloc[0] == "cancelled":
            return
        # Bundles of records have every column; an unset failure_reason is None there (absent in older ones).
        reason = tdf["failure_reason"].iloc[0] if "failure_reason" in tdf else None
        seen = f"{tdf['status'].iloc[0]}: {reason or ''}"
        tdf["status"] = "cancelled"
        tdf["failure_reason"] = f"cancelled while running (the trial then saw {seen})"[:2000]
        update_bundle_table(bundle, "trial", tdf)
        if status is not None:
            status["status"] = "cancelled"
    except Exception as e:
        logger.warning("could not mark %s cancelled: %s", bundle, e)


# -- the flow ------------------------------------------------------------------------------------------------
def sweep_run_name() -> str:
    """Flow run name of a sweep: ``sweep <plan name>`` (the plan's ``name:``), not the plan file's path, which
    says little in the run list (``sweep /tmp/x/plan.yaml``); the file's stem when the plan cannot be read
    (the flow then fails with the plan's error)."""
    from prefect.runtime import flow_run

    plan_path = str(flow_run.parameters.get("plan_path", ""))
    try:
        import yaml

        name = (yaml.safe_load(Path(plan_path).read_text()) or {}).get("name")
    except Exception:  # the flow itself reports an unreadable plan
        name = None
    return f"sweep {name or Path(plan_path).stem}"


@flow(name="tuning_sweep", flow_run_name=sweep_run_name, log_prints=True, validate_parameters=False,
      on_completion=[final_state_hook], on_crashed=[cancelled_not_crashed_hook])
def tuning_sweep(plan_path: str, db: str | None = None, results: str | None = None,
                 gpus: list[int] | None = None, plots: bool = True,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> dict:
    """Run every trial of the plan, validate, load into DuckDB and report.

    Args:
        plan_path: the plan YAML.
        db: DuckDB file (default ``<tunelab home>/warehouse.duckdb``).
        results: results folder for bundles (default ``<tunelab home>/results``).
        gpus: NVML indices of the GPUs this sweep may use (default: all GPUs NVML sees).
        plots: write the latency-vs-throughput plot of the sweep next to its bundles and link it from the report.
        lock_timeout_s: how long the load step waits for another process holding the warehouse file, seconds;
            then the bundles stay on disk (``not_loaded`` in the summary) and the report is made from them.

    Returns:
        :class:`SweepSummary`.

    Raises:
        PlanError: before any server starts, for a bad plan, a missing runtime or model.
        ValueError: ``gpus`` names a GPU the host does not have.
        TerminationSignal: cancellation (Prefect's SIGTERM bridge), KeyboardInterrupt: Ctrl-C; after teardown
            and the cancelled bundles.
    """
    logger = get_run_logger()
    from prefect.context import FlowRunContext

    from tunelab.host.run_records import record_run

    frc = FlowRunContext.get()
    # This process is the run's runner while it runs: `tunelab clean` marks the run Crashed once it is dead.
    with record_run(str(frc.flow_run.id) if frc and frc.flow_run else None), watch_for_cancel(log=logger.warning):
        return _sweep(plan_path, db, results, gpus, plots, logger, lock_timeout_s)


class _SweepTrials:
    """The trials of one sweep on their devices: runs each one (under its device locks and Prefect slots),
    records its outcome, and knows which trials were running when the sweep was interrupted.

    ``run_one``, ``on_skip`` and ``on_interrupt`` are :func:`run_on_devices`' callbacks; with several devices
    they run in worker threads, so every attribute below that they change is changed under ``self.lock``:

    - ``statuses``, ``bundles``: by job index, the trial's status dict and its bundle (None until recorded);
    - ``timings``: by job index, ``queued_at``/``slot_at``/``end_at`` epoch seconds;
    - ``out_of_service``: devices whose teardown was not clean (not handed out again in this sweep);
    - ``in_flight``: job index -> trial_id of the trials running now;
    - ``unrecorded``: trials started and not yet recorded (a trial on the main thread that Ctrl-C interrupts
      writes its own cancelled bundle and leaves ``in_flight`` on the way out, without reaching ``record``);
    - ``cancelled``: the trials that were in flight when ``on_interrupt`` ran.
    """

    def __init__(self, *, plan: Plan, runtimes: dict[str, Runtime], sweep_id: str,
                 slot_names: dict[Device, str], base_ctx: TrialContext, use_slots: bool, flow_run_id: Any,
                 progress_id: Any, logger: Any, trials_total: int | None):
        self.plan, self.runtimes, self.sweep_id = plan, runtimes, sweep_id
        self.jobs: list[_Job] = []  # one per trial a design asked for, in the order asked (job.index)
        self.slot_names, self.base_ctx, self.use_slots, self.flow_run_id = slot_names, base_ctx, use_slots, flow_run_id
        self.progress_id, self.logger = progress_id, logger
        self.lock = threading.Lock()
        self.statuses: list[TrialStatus | None] = []
        self.bundles: list[Path | None] = []
        self.timings: list[dict] = []
        self.flow_runs: list[Any] = []  # by job index, the trial's flow run id (None until it ran)
        self.out_of_service: set[Device] = set()
        # N of "trial k/N" (log lines, progress events, the progress artifact): the design's trials in all (a
        # search's budget of boots), None when not known (a search bound by GPU-minutes only).
        self.trials_total: int | None = trials_total
        self.in_flight: dict[int, str] = {}
        self.unrecorded: set[int] = set()
        self.cancelled: set[int] = set()
        self.done = 0

    def trial_id_of(self, job: _Job) -> str:
        t = job.trial
        return records.trial_id(self.sweep_id, t.config_key, t.runtime, t.replicate)

    def usable(self, device: Device) -> bool:
        return device not in self.out_of_service

    def record(self, job: _Job, bundle: Path | None, devs: list[Device], error: str | None = None) -> None:
        """Store the trial's status (from its bundle, or the orchestrator's ``error``), take its devices out
        of service after an unclean teardown, and update the trial and progress artifacts."""
        logger, plan = self.logger, self.plan
        st = TrialStatus(trial_id=self.trial_id_of(job), config=job.trial.label, config_key=job.trial.config_key,
                         runtime=job.trial.runtime, replicate=job.trial.replicate,
                         device="+".join(d.label for d in devs) or "-", status="failed",
                         failure_class="orchestrator_error" if error else None, failure_reason=error,
                         boot_s=None, compile_cache=None, teardown_clean=None, verdict="unvalidated",
                         measurement_notes=None)
        if bundle is not None:
            row = _status_of(bundle)
            for k in ("status", "failure_class", "failure_reason", "boot_s", "compile_cache", "teardown_clean",
                      "measurement_notes"):
                st[k] = row.get(k)
            if row.get("teardown_clean") is False:
                with self.lock:
                    self.out_of_service.update(devs)
                logger.error("%s taken out of service: the teardown of %s was not clean",
                             "+".join(d.label for d in devs), st["trial_id"])
        with self.lock:
            self.statuses[job.index] = st
            self.bundles[job.index] = bundle
            self.unrecorded.discard(job.index)
            self.done += 1
            n = self.done
        # The trial's table artifact hangs on its own run (_trial_run_views), not on the sweep's.
        if self.progress_id is not None:
            try:
                from prefect.artifacts import update_progress_artifact

                total = max(self.trials_total or len(self.jobs), n, 1)
                with self.lock:
                    done = [x for x in self.statuses if x]
                update_progress_artifact(self.progress_id, 100.0 * n / total,
                                         description=progress_description(self.sweep_id, done, self.trials_total,
                                                                          f"{job.trial.label} {st['status']}"))
            except Exception as e:
                logger.warning("could not update the progress artifact: %s", e)

    def run_one(self, job: _Job, devs: list[Device]) -> Path | None:
        """Run one trial on ``devs`` under their locks (and Prefect slots); returns its bundle, None when the
        trial raised (recorded as ``orchestrator_error``; the sweep goes on)."""
        logger, t = self.logger, job.trial
        trial_id = self.trial_id_of(job)
        tim = self.timings[job.index]
        tim["queued_at"] = time.time()
        names = [self.slot_names[d] for d in devs]
        try:
            # Prefect's slot, with this sweep recorded as its holder: a waiting sweep names it every few seconds
            # and takes back the slot of a holder that is provably dead (tunelab/host/slot_holders.py).
            def waiting(msg: str) -> None:  # the log line, and the live display says whom the trial waits for
                logger.info(msg)
                if msg.startswith("waiting for"):
                    progress.emit("wait", trial_id=trial_id, trial_index=job.index + 1,
                                  trials_total=self.trials_total, label=t.label, detail=msg[len("waiting for "):])

            slots = (hold_slots(names, lease_duration_s=SLOT_LEASE_S, sweep_id=self.sweep_id,
                                flow_run_id=self.flow_run_id, log=waiting)
                     if self.use_slots else contextlib.nullcontext())
            with device_locks(names, log=waiting), slots:
                tim["slot_at"] = time.time()
                if tim["slot_at"] - tim["queued_at"] > 1:
                    logger.info("%s: waited %.1f s for %s", trial_id, tim["slot_at"] - tim["queued_at"], names)
                gpu = devs[0] if devs and devs[0].kind == "gpu" else None
                ctx = dataclasses.replace(self.base_ctx, gpu_index=gpu.index if gpu else None,
                                          gpu_indices=tuple(d.index for d in devs if d.kind == "gpu"),
                                          gpu_name=gpu.name if gpu else "cpu",
                                          gpu_baseline_mib=gpu.baseline_mib if gpu else None,
                                          our_pids=tuple(e["pid"] for e in tracked_servers()), device=" ".join(names),
                                          cuda_visible_devices=device_env(devs),
                                          gpu_uuids=tuple(d.uuid for d in devs if d.kind == "gpu" and d.uuid))
                logger.info("trial %d/%s: %s [%s] on %s, %s", job.index + 1, self.trials_total or "?", t.label,
                            t.config_key, t.runtime, "+".join(d.label for d in devs))
                progress.emit("trial", trial_id=trial_id, trial_index=job.index + 1, trials_total=self.trials_total,
                              label=t.label)
                with self.lock:
                    self.in_flight[job.index] = trial_id
                    self.unrecorded.add(job.index)
                name = trial_run_name(t, devs)
                box: dict[str, Any] = {}
                try:
                    from prefect import tags

                    with _no_subflow_heartbeats(), tags(*trial_tags(t, self.runtimes[t.runtime])):
                        state = _trial_subflow(name, box, job.window_check)(t, trial_id, self.plan, self.runtimes[t.runtime], ctx,
                                                          return_state=True)
                    self.flow_runs[job.index] = getattr(state.state_details, "flow_run_id", None)
                    bundle = box.get("bundle")
                    if bundle is None:  # the trial raised before it wrote its bundle: raise that here
                        state.result()
                        raise RuntimeError(f"trial run ended {state.name} without a bundle: {state.message}")
                finally:
                    with self.lock:
                        self.in_flight.pop(job.index, None)
                    tim["end_at"] = time.time()
        except Exception as e:  # a trial that raised is recorded; the sweep goes on
            logger.error("trial %s could not run: %s: %s", trial_id, type(e).__name__, e)
            self.record(job, None, devs, f"{type(e).__name__}: {e}"[:2000])
            return None
        self.record(job, bundle, devs)
        return bundle

    def on_skip(self, job: _Job, reason: str) -> Path:
        """A trial that cannot run (not enough devices, a device out of service): a failed bundle, recorded."""
        t = job.trial
        fc = "device_out_of_service" if "out of service" in reason else "not_enough_devices"
        self.logger.error("skipping %s: %s", self.trial_id_of(job), reason)
        b = _skip_bundle(t, self.trial_id_of(job), self.runtimes[t.runtime], self.base_ctx, reason, fc)
        self.record(job, b, [])
        return b

    def on_interrupt(self) -> None:
        with self.lock:
            self.cancelled.update(self.in_flight)
        _stop_live_servers(self.logger.warning)

    def add(self, spec: TrialSpec) -> _Job:
        """A job for a trial a design asked for: the next index, its devices' pool and count, its window check."""
        t = spec.trial
        on_gpu = self.runtimes[t.runtime].device == "cuda"
        with self.lock:
            job = _Job(len(self.jobs), t, gpus_needed(t) if on_gpu else 1, "gpu" if on_gpu else "cpu",
                       spec.window_check)
            self.jobs.append(job)
            self.statuses.append(None)
            self.bundles.append(None)
            self.timings.append(dict(trial_index=job.index))
            self.flow_runs.append(None)
        return job

    def dispatch(self, jobs: list[_Job], pools: dict[str, list[Device]], no_gpu_reason: str) -> None:
        """Run ``jobs`` pool by pool: GPU trials and CPU-runtime trials use different devices; each pool's jobs run
        in order. GPU jobs on a host without a selected GPU are skipped with ``no_gpu_reason``."""
        for p in sorted({j.pool for j in jobs}):
            pj = [j for j in jobs if j.pool == p]
            if p == "gpu" and not pools["gpu"]:
                for j in pj:
                    self.on_skip(j, f"runtime {j.trial.runtime!r} needs a GPU; {no_gpu_reason or 'none selected'}")
                continue
            run_on_devices(pj, lambda j: j.need, pools[p], self.run_one, on_skip=self.on_skip,
                           on_interrupt=self.on_interrupt, usable=self.usable)

    def run_design(self, design: Design, pools: dict[str, list[Device]], no_gpu_reason: str,
                   validate: Callable[[Path, Plan], str] | None = None) -> None:
        """The sweep's one loop: ask ``design`` for the next trials given the results so far, run them on the
        devices (:meth:`dispatch`), and, for a design that decides on quality-gated results
        (``design.gate_each_trial``), validate each bundle at once (``validate(bundle, plan) -> verdict``; a
        validation that cannot run leaves the trial unusable, the sweep validates again at its end). Ends when the
        design answers no trial.

        Raises:
            An interruption (:data:`INTERRUPTS`), after ``design.interrupted(exc)`` recorded what it knew.
        """
        done: list[TrialResult] = []
        while True:
            specs = design.next_trials(done)
            if not specs:
                return
            jobs = [self.add(s) for s in specs]
            try:
                self.dispatch(jobs, pools, no_gpu_reason)
            except INTERRUPTS as e:
                design.interrupted(e)
                raise
            for spec, j in zip(specs, jobs):
                bundle, st = self.bundles[j.index], self.statuses[j.index]
                if (design.gate_each_trial and validate is not None and bundle is not None and st is not None
                        and st.get("status") == "ok"):
                    try:
                        st["verdict"] = validate(bundle, self.plan)
                    except Exception as e:  # the trial then does not count; the sweep validates again at its end
                        self.logger.error("validation of %s could not run: %s", bundle, e)
                done.append(TrialResult(spec=spec, trial_id=self.trial_id_of(j), status=st if st is not None else {},
                                        bundle=bundle, gpu_minutes=_device_minutes(self.timings[j.index], j.need)))

    def mark_running_cancelled(self) -> int:
        """After an interruption: mark every trial that was running as ``cancelled``; returns how many."""
        with self.lock:
            running_then = set(self.cancelled) | set(self.in_flight) | self.unrecorded
        self.logger.warning("sweep %s cancelled; %d trial(s) were running", self.sweep_id, len(running_then))
        for i in running_then:
            bundle = self.bundles[i]
            if bundle is None:
                # Interrupted after it kept windows but before its final bundle (e.g. in teardown): the bundle on
                # disk is the windows-so-far one, which would read "killed or its host lost".
                job = next((j for j in self.jobs if j.index == i), None)
                kept = bundle_dir_for(Path(self.base_ctx.results_dir), self.sweep_id, self.trial_id_of(job)) \
                    if job is not None else None
                bundle = kept if kept is not None and kept.exists() else None
            _mark_cancelled(bundle, self.statuses[i], self.logger)
        return len(running_then)


def _sweep_row(plan: Plan, plan_path: str, host: str) -> records.Sweep:
    """The sweep's ``sweeps`` record as far as it is known at the start (``finished_at`` is set at the end)."""
    started = dt.datetime.now(dt.timezone.utc)
    return records.Sweep(sweep_id=records.sweep_id(started, plan.name), plan_name=plan.name,
                         plan_yaml=Path(plan_path).read_text(), host=host, started_at=started,
                         tunelab_version=tunelab.__version__, source="tunelab")


def progress_description(sweep_id: str, statuses: list[dict], trials_total: int | None, last: str) -> str:
    """The progress artifact's description: the bar alone reads "Progress: 100%" in the UI, so the text says what
    the trials that ended came to (status counts, e.g. ``4 ok, 1 boot_failed``) and which one ended last.

    Args: statuses: the ended trials' status dicts (``status`` key); trials_total: planned trials (None: unknown,
    a search bound by GPU-minutes); last: the trial that ended last and its status. Returns one line, e.g.
    ``"s1: 5/6 trials ended: 4 ok, 1 boot_failed; last: eager ok"``."""
    counts: dict[str, int] = {}
    for st in statuses:
        counts[str(st.get("status"))] = counts.get(str(st.get("status")), 0) + 1
    by = ", ".join(f"{k_n} {k}" for k, k_n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{sweep_id}: {len(statuses)}/{trials_total or '?'} trials ended: {by or 'none'}; last: {last}"


def _progress_artifact(plan: Plan, sweep_id: str, n_trials: int | None, logger: Any) -> Any:
    """The sweep's progress artifact id, None when it could not be created (artifacts are a view)."""
    try:
        from prefect.artifacts import create_progress_artifact

        return create_progress_artifact(0.0, key=_artifact_key("sweep-progress", plan.name),
                                        description=f"{sweep_id}: 0/{n_trials or '?'} trials")
    except Exception as e:  # artifacts are a view; never lose a sweep over them
        logger.warning("could not create the progress artifact: %s", e)
        return None


def _validate_all(plan: Plan, bundles: list[Path | None], statuses: list[TrialStatus | None], logger: Any) -> None:
    """Quality verdict of every bundle into its status; a validation that cannot run leaves 'unvalidated'."""
    for i, b in enumerate(bundles):
        if b is None:
            continue
        try:
            v = validate_task.with_options(task_run_name=f"validate {statuses[i]['config']} r{statuses[i]['replicate']}")(b, plan)
        except Exception as e:  # the verdict stays 'unvalidated'; never 'pass'
            logger.error("validation of %s could not run: %s", b, e)
            continue
        statuses[i]["verdict"] = v


def _sweep(plan_path: str, db: str | None, results: str | None, gpus: list[int] | None, plots: bool,
           logger: Any, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> SweepSummary:
    plan = load_plan(plan_path)
    # precision: instead of counts: the design from the warehouse's noise model (tunelab.reports.design_plan).
    from tunelab.reports.design_plan import resolve_precision

    plan, design = resolve_precision(plan, Path(db) if db else paths.db_path())
    runtimes = preflight(plan)
    # Optional checks against the cached runtime facts: warnings only, and a check that fails is one more
    # warning (runtime_checks never raises), never a failed sweep.
    for msg in runtime_checks(plan, runtimes)[1]:
        logger.warning(msg)
    db_path = Path(db) if db else paths.db_path()
    results_dir = Path(results) if results else paths.results_dir()
    host = host_name()
    sweep = _sweep_row(plan, plan_path, host)
    sweep_id = sweep.sweep_id
    left = stop_leftovers(log=logger.info)
    if left:
        logger.warning("stopped %d leftover server(s) of an earlier run", len(left))
    inv = inventory()
    gpu_devices = host_devices(inv, gpus, log=logger.warning)
    if not inv.available:
        logger.info("%s; running on CPU", inv.reason)
    logs_dir = paths.logs_dir() / sweep_id
    logs_dir.mkdir(parents=True, exist_ok=True)
    base_ctx = TrialContext(sweep=sweep, results_dir=str(results_dir), logs_dir=str(logs_dir),
                            driver_version=inv.driver_version, cuda_version=inv.cuda_version, host=host)
    trials = plan.trials()
    pools = {"gpu": gpu_devices, "cpu": [Device("cpu", 0)]}
    used_pools = sorted({"gpu" if runtimes[t.runtime].device == "cuda" else "cpu" for t in trials})
    slot_names = {d: slot_name(host, d) for p in used_pools for d in pools[p]}
    use_slots = prefect_slots_enabled()
    flow_run_id = None
    if use_slots:
        ensure_slots(list(slot_names.values()))
        from prefect.context import FlowRunContext

        frc = FlowRunContext.get()
        flow_run_id = frc.flow_run.id if frc and frc.flow_run else None
    else:
        logger.info("Prefect runs ephemeral: devices are guarded by host-level locks only (no global concurrency "
                    "slots: an ephemeral server cannot expire the lease of a killed sweep)")
    order = " ".join(f"{t.label}/r{t.replicate}" for t in trials)
    # A search's trials are its boots: the default's, then one per config it asks for, up to its budget.
    n_total = (plan.search.budget.boots if plan.search is not None else len(trials))
    logger.info("sweep %s: %s trial(s) on %s; order (%s): %s", sweep_id, n_total if n_total is not None else "?",
                ", ".join(f"{d.label} ({slot_names[d]})" for p in used_pools for d in pools[p]) or "no device",
                plan.interleave, order)

    if design is not None:
        for line in design.lines():
            (logger.warning if line.startswith("warning") else logger.info)(line)
    _announce(plan, runtimes, n_total, db_path)
    run = _SweepTrials(plan=plan, runtimes=runtimes, sweep_id=sweep_id, slot_names=slot_names,
                       base_ctx=base_ctx, use_slots=use_slots, flow_run_id=flow_run_id,
                       progress_id=_progress_artifact(plan, sweep_id, n_total, logger), logger=logger,
                       trials_total=n_total)
    boots = _design_of(plan, db_path, logger)  # which trials to boot next (tunelab.designs)
    ab = search = None
    try:
        try:
            run.run_design(boots, pools, inv.reason, validate=lambda b, p: validate_task(b, p))
        finally:
            if plan.search is not None:  # each boot's search columns into its bundle, also when interrupted
                from tunelab.flows.record_search import record_search_trials

                record_search_trials(run, boots.outcome, logger)
        if plan.replicates == "auto":
            ab = boots.outcome
        elif plan.search is not None:
            search = boots.outcome
    except INTERRUPTS:
        run.mark_running_cancelled()
        _record_interrupted_search(plan, sweep, run, boots.outcome if plan.search is not None else None, logger)
        try:
            n = load_pending(db_path, results_dir, lock_timeout_s=10)
            logger.warning("cancelled: loaded %d bundle(s); the rest stay on disk for `tunelab load`", len(n))
        except Exception as e:
            logger.warning("cancelled: bundles not loaded (%s); run `tunelab load`", e)
        raise

    progress.emit("validate")
    _validate_all(plan, run.bundles, run.statuses, logger)
    # Checks over the sweep's trials together (anchor drift, windows in two modes): warn rows in the bundles.
    from tunelab.tasks.quality.shape_checks import sweep_shape_step

    at = plan.anchor_trial()
    sweep_shape_step(run.bundles, run.statuses, (at.runtime, at.config_key) if at else None, logger)
    # What the gate found, where the runs are looked at: the trial runs' quality tags and states, the sweep's tag.
    mark_quality(zip(run.flow_runs, run.statuses, run.bundles), logger)
    mark_all_failed(flow_run_id_of_sweep(), [s for s in run.statuses if s], logger)
    sweep.finished_at = dt.datetime.now(dt.timezone.utc)
    if ab is not None:  # the decision goes with the sweep's row (every bundle's sweep table) before loading
        from tunelab.flows.ab_auto import record_outcome

        record_outcome(sweep, ab)
    if search is not None:  # the search's summary goes with the sweep's row too
        from tunelab.flows.record_search import record_search

        record_search(sweep, plan, search)
    # The bundles carry the sweep row as it was at the start (finished_at NULL) and the loader upserts it from them:
    # the finished record goes into every bundle once, after the A/B and the search added theirs (without it a plain
    # sweep stayed unfinished in `sweeps`, seen in the H200 evidence of 2026-12-02).
    write_sweep_row(sweep, run.bundles)
    progress.emit("load")
    outcome = load_task(db_path, results_dir, lock_timeout_s)
    progress.emit("report")
    summary = _report(plan, sweep_id, db_path, results_dir, run, outcome, plots, logger)
    _fixed_ab(plan, sweep_id, db_path, summary, design, logger)
    if ab is not None:
        from tunelab.flows.ab_auto import outcome_lines

        summary.ab = ab
        for line in outcome_lines(ab):
            logger.info(line)
    if search is not None:
        _search_report(plan, search, summary, report_db=db_path if summary.not_loaded is None else None,
                       plots=plots, logger=logger)
    return summary


def flow_run_id_of_sweep() -> Any:
    """The id of the flow run this code runs in (the sweep's), None outside a run."""
    from prefect.context import FlowRunContext

    frc = FlowRunContext.get()
    return frc.flow_run.id if frc and frc.flow_run else None


def _design_of(plan: Plan, db_path: Path, logger: Any) -> Design:
    """The plan's design (``tunelab.designs``): ``replicates: auto`` pairs until decided (with the warehouse's
    history of both configs, and a warning when the budget cannot decide), a ``search:``, or the fixed grid."""
    if plan.replicates == "auto":
        from tunelab.flows.ab_auto import SequentialAB, ab_priors, budget_warnings

        priors = ab_priors(plan, db_path, logger)
        for msg in budget_warnings(plan, priors):
            logger.warning("warning: %s", msg)
        return SequentialAB(plan, logger, priors=priors)
    if plan.search is not None:
        from tunelab.designs.config_search import SearchDesign

        return SearchDesign(plan, logger)
    from tunelab.designs.grid import FixedGrid

    return FixedGrid(plan.trials())


def _record_interrupted_search(plan: Plan, sweep: records.Sweep, run: "_SweepTrials", partial: Any,
                               logger: Any) -> None:
    """An interrupted ``search:`` sweep keeps its search record: the sweep's ``search_*`` columns (stop reason
    ``interrupted``) into every bundle written so far, before they are loaded; never raises (the interruption
    goes on)."""
    if partial is None:
        return
    try:
        from tunelab.flows.record_search import record_search, sweep_bundles

        partial.stop_reason = "interrupted"
        record_search(sweep, plan, partial)
        write_sweep_row(sweep, sweep_bundles(run))
        logger.warning("search interrupted after %d boot(s): its record so far is kept (`tunelab tuning-report %s`)",
                       partial.boots, sweep.sweep_id)
    except Exception as e:  # noqa: BLE001 - the interruption matters more than its record
        logger.warning("could not record the interrupted search: %s", e)


def _search_report(plan: Plan, search: Any, summary: SweepSummary, report_db: Path | None, plots: bool,
                   logger: Any) -> None:
    """A ``search:`` sweep's end: its lines, and the tuning report (``reports.tuning``) in the log and as a Prefect
    markdown artifact; never fails the sweep (the results are in the warehouse: `tunelab tuning-report`)."""
    from tunelab.flows.record_search import search_lines

    summary.search = search
    for line in search_lines(plan, search):
        logger.info(line)
    if report_db is None:
        return
    try:
        from tunelab.reports.tuning import tuning_report

        rep = tuning_report(report_db, summary.sweep_id,
                            plots_dir=Path(summary.results) / summary.sweep_id / "plots" if plots else None)
        summary.tuning_markdown = rep.markdown
        for line in rep.lines:
            logger.info(line)
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(rep.markdown, key=_artifact_key("tuning-report", plan.name),
                                 description=f"tunelab search {summary.sweep_id}")
    except Exception as e:  # a view; never lose a sweep over it
        logger.warning("could not make the tuning report: %s", e)


def _fixed_ab(plan: Plan, sweep_id: str, db_path: Path, summary: SweepSummary, design: Any, logger: Any) -> None:
    """What the sweep's design could detect (issue 14 item 7): the A/B of every other config against the first per
    cell with its MDE (``design_plan.sweep_ab_rows``), and a warning per cell where a ``precision:`` was not
    reached. Into ``summary.ab_lines`` / ``summary.precision_warnings`` and the log; never fails the sweep."""
    if (summary.not_loaded is not None or plan.replicates == "auto" or getattr(plan, "search", None) is not None
            or len(plan._round(0)) < 2):
        return
    try:
        import duckdb

        from tunelab.reports.design_plan import ab_lines, busy_line, precision_warnings, sweep_ab_rows
        from tunelab.core.plan_cost import load_now

        con = duckdb.connect(str(db_path), read_only=True)
        try:
            rows = sweep_ab_rows(con, plan, sweep_id)
            busy = busy_line(con, sweep_id, rows, load_now())
        finally:
            con.close()
        summary.ab_lines = ab_lines(rows) + ([busy] if busy else [])
        summary.precision_warnings = precision_warnings(plan, rows, design)
    except Exception as e:  # a view of the results; the sweep's data is loaded either way
        logger.warning("could not compute the sweep's A/B: %s", e)
        return
    for line in summary.precision_warnings:
        logger.warning(line)
    if summary.ab_lines:
        section = "## A/B (what this design could detect)\n\n" + "\n".join(
            f"- {x}" for x in summary.ab_lines + summary.precision_warnings)
        summary.report_markdown += "\n\n" + section
        # The lines go to the UI as an artifact of their own (the sweep report's artifact was made before them), and
        # the log says where: logged one by one they were printed twice by `tunelab run`, once by Prefect's
        # console handler and once by the command's own closing lines (found by a fresh user).
        key = _artifact_key("sweep-ab", plan.name)
        try:
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(section, key=key, description=f"A/B per cell of {sweep_id}")
            logger.info("A/B per cell: %d line(s) in the artifact %s (and at the end of `tunelab run`)",
                        len(summary.ab_lines), key)
        except Exception as e:  # a view; the lines are in the summary either way
            logger.warning("could not create the A/B artifact: %s", e)
            for line in summary.ab_lines:
                logger.info(line)


def _announce(plan: Plan, runtimes: dict[str, Runtime], n_trials: int | None, db_path: Path | None = None) -> None:
    """The live display's ``sweep`` event: trials (a search's budget of boots; None: not known, a search bound by
    GPU-minutes only) and the plan's time estimate (``tunelab.core.plan_cost``, with the boots of the warehouse at
    ``db_path`` and the runtimes whose compile cache is empty; never fatal: the display is a view)."""
    if not progress.sinks():
        return
    try:
        from tunelab.core.plan_cost import plan_cost
        from tunelab.tasks.compile_cache import uncompiled
        from tunelab.warehouse.boot_history import boot_history

        est = plan_cost(plan, {n: r.device for n, r in runtimes.items()}, boot_history(db_path or paths.db_path()),
                        uncompiled(runtimes)).estimate_s
    except Exception:
        est = None
    progress.emit("sweep", trials_total=n_trials, estimate_s=est,
                  detail="from the plan, this warehouse's boots and typical figures; `tunelab plan check` says how")


def _report(plan: Plan, sweep_id: str, db_path: Path, results_dir: Path, run: _SweepTrials,
            outcome: dict[str, Any], plots: bool, logger: Any) -> SweepSummary:
    """The sweep's report (comparison, quality, plot, markdown, artifacts) and its :class:`SweepSummary`."""
    statuses_ = [s for s in run.statuses if s]
    not_loaded = None
    mine = [b for b in run.bundles if b is not None]
    if outcome["locked"] is None:
        logger.info("loaded %d bundle(s) into %s", outcome["loaded"], db_path)
    else:
        not_loaded = {"db": str(db_path), "results": str(results_dir), "bundles": len(mine), **outcome["locked"]}
    # The report reads the warehouse; when the file is locked, the same tables from this sweep's bundles in
    # memory (loaded by the same loader), so the sweep still ends with its comparison.
    report_db: Any = db_path if not_loaded is None else bundles_warehouse(mine)
    try:
        comp = R.comparison_frame(report_db, sweep_id)
        quality = R.quality_summary(report_db, sweep_id)
        findings = R.bottleneck_findings(report_db, sweep_id)  # bottlenecks per window (tunelab.core.bottleneck_rules)
        plot_paths: list[Path] = []
        if plots:
            try:
                from tunelab.reports.plots import latency_throughput_plot

                p = latency_throughput_plot(report_db, sweep_id, results_dir / sweep_id / "plots")
                plot_paths = [p] if p else []
            except Exception as e:
                logger.warning("could not draw the plots: %s", e)
    finally:
        if not isinstance(report_db, Path):
            report_db.close()
    settings = {t.config_key: R.settings_text(t.engine_args, t.env) for t in plan.trials()}
    md = R.sweep_markdown(comp, sweep_id, statuses_, quality, plots=plot_paths, interleave=plan.interleave,
                          config_settings=settings, findings=findings)
    try:
        from prefect.artifacts import create_markdown_artifact, create_table_artifact

        create_markdown_artifact(md, key=_artifact_key("sweep-report", plan.name), description=f"tunelab sweep {sweep_id}")
        create_table_artifact(R.trials_table(statuses_), key=_artifact_key("sweep-trials", plan.name),
                              description=f"trials of {sweep_id} (failure reasons: the trial runs' state messages "
                                          "and the report)")
    except Exception as e:  # artifacts are a view; never lose a sweep over them
        logger.warning("could not create artifacts: %s", e)
    counts = quality["counts"]
    logger.info("quality: %s", ", ".join(f"{k} {v}" for k, v in counts.items()))
    for line in R.quality_check_lines(quality):  # why a trial warns or fails, without a query
        logger.info("%s", line)
    return SweepSummary(sweep_id=sweep_id, db=str(db_path), results=str(results_dir), trials=statuses_,
                        comparison=comp.to_dict("records"), left_out=comp.attrs.get("left_out", []),
                        quality=counts, report_markdown=md,
                        timings=run.timings, plots=[str(p) for p in plot_paths], not_loaded=not_loaded,
                        sla_search=comp.attrs.get("sla_search", []),
                        bottlenecks=findings.to_dict("records") if findings is not None else [])
