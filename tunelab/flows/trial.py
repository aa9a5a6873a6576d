"""Flow ``trial``: the life of one engine config on one runtime — clean GPU, boot, warm up and measure,
tear down — ending in a result bundle on disk. Order lives here; the steps are the Prefect tasks of
``tunelab/tasks/steps/`` (one module a step), over the plain functions of ``tunelab/tasks/``.

A boot failure is a result (``status='boot_failed'`` with its failure class), not an exception: the sweep
goes on. Teardown runs in ``finally``, so success, failure, timeout, Ctrl-C and Prefect cancellation
(``TerminationSignal`` from Prefect's SIGTERM bridge) all stop the server's whole process group.
"""

from __future__ import annotations

import datetime as dt
import socket
import traceback
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
from prefect import flow, get_run_logger

from tunelab.core import progress
from tunelab.core import records as R
from tunelab.flows.devices import Device, distributed_ports_env
from tunelab.flows.run_states import cancelled_not_crashed_hook
from tunelab.tasks import bootlog
from tunelab.core.bundle import write_bundle
from tunelab.tasks.engine import BootFailed, EngineServer
from tunelab.tasks.gpu import host_load_avg
from tunelab.tasks.bottleneck_evidence import window_diagnoses
from tunelab.tasks.flag_proof import prove_flags
from tunelab.tasks.steps.boot import TrialBoots, WrongDevice, boot_failure_reason, boot_task, placement_check
from tunelab.tasks.steps.clean_gpu import clean_gpu_task
from tunelab.tasks.steps.measure_windows import measure_task, server_state, sla_search_task
from tunelab.tasks.steps.outcome import task_value
from tunelab.tasks.steps.teardown import teardown_task
from tunelab.core.plan import Plan, Trial, kv_block_tokens
from tunelab.host.runtime import Runtime

__all__ = ["run_trial", "trial_row_base", "TrialContext", "SERVER_ENV_DEFAULTS", "trial_server_env"]

# Env var names whose values are secrets: redacted in the warehouse and logs.
_SECRET_HINTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")



#: Characters of measurement notes a trial row keeps (whole lines only).
NOTES_MAX_CHARS = 16000


def _kept_notes(notes: list[str], max_chars: int = NOTES_MAX_CHARS) -> str:
    """The notes as ``trials.measurement_notes``: one per line, whole lines only (a note cut mid-word was grouped
    as a cause of its own, "lon"), up to ``max_chars``; when some do not fit, a last line says how many."""
    kept: list[str] = []
    size = 0
    for n in notes:
        if size + len(n) + 1 > max_chars:
            kept.append(f"({len(notes) - len(kept)} more note(s) not kept)")
            break
        kept.append(n)
        size += len(n) + 1
    return "\n".join(kept)

def _redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if any(h in k.upper() for h in _SECRET_HINTS) else v) for k, v in env.items()}


#: Set for every server unless the plan's env sets the variable itself. ``VLLM_SERVER_DEV_MODE=1`` enables
#: ``POST /reset_prefix_cache`` (vllm/entrypoints/serve/dev), which ``tunelab/tasks/measure.py`` calls right
#: before each measured window (after the warm-up too) so every window starts with an empty prefix cache; without it only fresh prompts keep the
#: cache cold. The dev routes have no API key check: tolerable because servers bind 127.0.0.1 and live for one
#: trial; a plan sets ``VLLM_SERVER_DEV_MODE: "0"`` to opt out. Recorded with the trial's env (``trials.env``);
#: not part of ``config_key`` (it does not change the engine).
SERVER_ENV_DEFAULTS = {"VLLM_SERVER_DEV_MODE": "1"}


def trial_server_env(trial: Trial, runtime: Runtime | None = None, gpu_indices: list[int] | None = None,
                     cuda_visible: str | None = None) -> dict[str, str]:
    """Environment variables a trial's server gets on top of the runtime's: :data:`SERVER_ENV_DEFAULTS`, then for
    a GPU trial ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` with ``CUDA_VISIBLE_DEVICES`` = ``cuda_visible`` (the GPUs'
    PCI-bus-order ordinals, ``tasks.gpu.cuda_visible_devices``; the NVML indices ``gpu_indices`` when not given)
    and the port block of its first GPU (``flows.devices.distributed_ports_env``), then the plan's env (which
    wins). This is the ``extra`` that ``Runtime.launch_env`` lays over the runtime's process environment when the
    engine starts the server; it replaces a ``CUDA_VISIBLE_DEVICES`` the sweep itself inherited (which the sweep
    has already applied to the GPUs it schedules)."""
    env = dict(SERVER_ENV_DEFAULTS)
    if gpu_indices and (runtime is None or runtime.device == "cuda"):
        # Without PCI_BUS_ID, CUDA numbers GPUs fastest-first, and an index would name another GPU than the one
        # NVML cleaned, samples and records on a host with two GPU models.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible or ",".join(str(i) for i in gpu_indices)
        env.update(distributed_ports_env([Device("gpu", gpu_indices[0])]))
    env.update(trial.env)
    return env


def cancel_reason(e: BaseException) -> str:
    """A cancelled trial's ``failure_reason``: the exception's name and text, or with no text what it means
    (Ctrl-C, a SIGTERM or a cancel through Prefect), never a dangling ``KeyboardInterrupt:``."""
    name, text = type(e).__name__, str(e).strip()
    if name == "TerminationSignal":  # its text is the signal number
        return f"{name} (signal {text or '?'}: SIGTERM or a cancel through Prefect)"
    if text:
        return f"{name}: {text}"
    return f"{name} (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else name


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@dataclass(frozen=True)
class TrialContext:
    """What the sweep tells a trial.

    Attributes:
        sweep: the sweep's row (written into every bundle).
        results_dir: root folder of the bundles; logs_dir: folder of the servers' logs.
        driver_version, cuda_version: from the NVML inventory (None on a CPU host).
        gpu_index: NVML index of the trial's (first) GPU; None on CPU. gpu_indices: all its GPUs.
        gpu_name: the GPU's name, 'cpu' on CPU. gpu_baseline_mib: its used memory at inventory time, MiB.
        our_pids: PIDs of servers tunelab started (not foreign on the GPU). device: the device slots held.
        cuda_visible_devices: ``CUDA_VISIBLE_DEVICES`` for the server (PCI-bus-order ordinals of its GPUs).
        gpu_uuids: NVML UUIDs of its GPUs. host: the host the trial runs on (``flows.devices.host_name``).
    """

    sweep: R.Sweep
    results_dir: str
    logs_dir: str
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_index: int | None = None
    gpu_indices: tuple[int, ...] = ()
    gpu_name: str = "cpu"
    gpu_baseline_mib: float | None = None
    our_pids: tuple[int, ...] = ()
    device: str | None = None
    cuda_visible_devices: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    host: str | None = None

    @classmethod
    def of(cls, ctx: "TrialContext | Mapping[str, Any]") -> "TrialContext":
        """``ctx`` itself, or a context built from a dict with the same keys (``sweep`` a dict or a record).

        Raises:
            TypeError: a key that is not a field (names it).
        """
        if isinstance(ctx, TrialContext):
            return ctx
        values = dict(ctx)
        if not isinstance(values.get("sweep"), R.Sweep):
            values["sweep"] = R.Sweep(**R.to_row(R.Sweep, values["sweep"], full=False))
        for key in ("gpu_indices", "our_pids", "gpu_uuids"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
            else:
                values.pop(key, None)
        if values.get("gpu_name") is None:
            values.pop("gpu_name", None)
        return cls(**values)


def trial_row_base(trial: Trial, trial_id: str, sweep_id: str, runtime: Runtime,
                   ctx: TrialContext | Mapping[str, Any]) -> R.TrialRow:
    """The ``trials`` record with the fields known before boot (``status`` 'failed' until the trial says
    otherwise, ``quality_verdict`` 'unvalidated' until validated)."""
    ctx = TrialContext.of(ctx)
    v = runtime.versions
    return R.TrialRow(
        trial_id=trial_id,
        sweep_id=sweep_id,
        config_key=trial.config_key,
        config_label=trial.label,
        replicate=trial.replicate,
        runtime_name=runtime.name,
        vllm_version=v.get("vllm"),
        torch_version=v.get("torch"),
        transformers_version=v.get("transformers"),
        fastokens_version=v.get("fastokens"),
        cuda_version=ctx.cuda_version,
        driver_version=ctx.driver_version,
        gpu_name=ctx.gpu_name or "cpu",
        gpu_index=ctx.gpu_index,
        model=trial.model_id,
        engine_args=dict(trial.engine_args),
        env=_redact_env(trial_server_env(trial, runtime, list(ctx.gpu_indices), ctx.cuda_visible_devices)),
        host=ctx.host,
        gpu_uuids=",".join(ctx.gpu_uuids) or None,
        status="failed",
        quality_verdict="unvalidated",
        started_at=_now(),
    )


def _boot_once(trial: Trial, runtime: Runtime, plan: Plan, log_path: Path, trial_id: str, gpu_index,
               gpu_indices: list[int] | None = None, cuda_visible: str | None = None) -> EngineServer:
    return EngineServer(
        runtime=runtime,
        model=trial.model,
        serve_args=trial.serve_args(),
        env=trial_server_env(trial, runtime, gpu_indices, cuda_visible),
        log_path=log_path,
        boot_timeout_s=plan.boot_timeout_s,
        trial_id=trial_id,
        gpu_index=gpu_index,
        cpu_affinity=plan.cpu_affinity.server_cpus() if plan.cpu_affinity else None,
    )


class MeasurementStopped(Exception):
    """Raised after a window when the trial's window check says stop (a pruned search config)."""


@flow(name="trial", flow_run_name="{trial_id}", log_prints=True, validate_parameters=False,
      on_crashed=[cancelled_not_crashed_hook])
def run_trial(trial: Trial, trial_id: str, plan: Plan, runtime: Runtime, ctx: TrialContext | Mapping[str, Any],
              window_check: Callable[[pd.DataFrame], bool] | None = None) -> Path:
    """Run one trial end to end and write its bundle. Returns the bundle folder.

    The steps: the trial's record (:func:`_trial_record`), the device check (``clean-gpu``), boot (:func:`_boot`),
    the placement check, measure (:func:`_measure_into`: warm-up, windows, an SLA search, the bottleneck diagnosis),
    then, whatever happened, teardown and the bundle (:func:`_tear_down_and_write`). A failure of a step is recorded
    on the row by its ``_record_*`` function.

    ``window_check`` (the trial spec's, ``designs.base.TrialSpec``): called with the measurements so far after each
    measured window; True stops the measurement (the trial ends ``failed`` with failure_class ``pruned``, keeping its
    windows): a search prunes a config whose first windows are clearly worse than the best so far.

    Never raises for a failed boot or measurement: the trial row carries ``status`` and
    ``failure_class``/``failure_reason``. An interruption (Prefect's ``TerminationSignal``, KeyboardInterrupt,
    SystemExit) still tears down and writes a ``cancelled`` bundle, then propagates; so does one that lands
    during a normal teardown (the teardown is finished first).
    """
    logger = get_run_logger()
    ctx = TrialContext.of(ctx)
    row, log_path = _trial_record(trial, trial_id, plan, runtime, ctx)
    tables: dict[str, pd.DataFrame] = {}
    gpu_index = ctx.gpu_index
    boots = TrialBoots(lambda lp: _boot_once(trial, runtime, plan, lp, trial_id, gpu_index, list(ctx.gpu_indices),
                                         ctx.cuda_visible_devices),
                   log_path, runtime.name, trial.config_key, log=logger.info)
    interrupted: BaseException | None = None
    # The windows measured so far, kept on disk after each one (_keep_windows): a trial killed outright
    # (SIGKILL, power loss) leaves a bundle with status 'incomplete' holding them, which `tunelab load` loads.
    measured: dict[str, pd.DataFrame] = {}

    def keep_windows(res) -> None:
        measured.update(requests=res.requests, measurements=res.measurements, server_metrics=res.server_metrics)
        _keep_windows(ctx, row, measured, len(res.measurements), trial_id, logger)
        if window_check is not None and window_check(res.measurements):  # a search may stop a worse config here
            raise MeasurementStopped(f"pruned by the search after {len(res.measurements)} window(s): its objective "
                                     "so far is clearly worse than the best config's (docs/tuning.md)")

    def keep_search(frame: pd.DataFrame) -> None:  # an SLA search cut short: its record goes with its windows
        measured["sla_searches"] = frame

    events = progress.current_trial(trial_id)  # events of this thread belong to this trial until the end
    events.__enter__()
    try:
        progress.emit("clean")
        gpu_state = clean_gpu_task(gpu_index, ctx.gpu_baseline_mib, list(ctx.our_pids))
        row.update({k: v for k, v in gpu_state.items() if k != "detail"})
        if gpu_state.get("gpu_clean_at_boot") is False and gpu_state.get("foreign_gpu_processes"):
            row.update(status="gpu_busy", failure_class="gpu_busy", failure_reason=gpu_state["detail"])
            logger.warning("GPU %s busy: %s", gpu_index, gpu_state["detail"])
        else:
            try:
                _boot(boots, row, runtime, logger)
                wrong = placement_check(boots.server, runtime, list(ctx.gpu_indices))
                if wrong:
                    raise WrongDevice(wrong)
                _measure_into(tables, row, boots.server, trial, plan, gpu_index, keep_windows, keep_search, logger)
            except MeasurementStopped as e:  # the search pruned it: the windows so far stay in the bundle
                _record_pruned(row, tables, measured, e, logger)
            except WrongDevice as e:
                _record_wrong_device(row, e, logger)
            except BootFailed as e:
                _record_boot_failure(row, e, log_path, trial, trial_id, plan, runtime, ctx, logger)
            except Exception as e:  # measurement failure: record, keep the sweep going
                _record_measurement_error(row, tables, measured, boots.server, e, logger)
    except BaseException as e:  # cancellation / Ctrl-C: tear down, record, propagate
        interrupted = e
        _record_cancelled(row, e)
        # Keep what was measured before the interruption (the windows that ended); no verdict is given to it.
        tables.update(measured)
    finally:
        try:
            bundle, interrupted = _tear_down_and_write(row, tables, boots.server, interrupted, log_path, trial,
                                                       trial_id, ctx, logger)
        finally:
            events.__exit__(None, None, None)
    if interrupted is not None:
        raise interrupted
    return bundle


# -- the trial's steps -------------------------------------------------------------------------------------------
def _trial_record(trial: Trial, trial_id: str, plan: Plan, runtime: Runtime,
                  ctx: TrialContext) -> tuple[R.TrialRow, Path]:
    """The trial's ``trials`` record as known before boot (:func:`trial_row_base`, the workloads' records, the log
    path, the host's load) and the server log's path. Every later assignment to the record is validated against its
    column (tunelab/core/records.py)."""
    row = trial_row_base(trial, trial_id, ctx.sweep.sweep_id, runtime, ctx)
    # type, parameters, sha256 of any file read, endpoint, shared prefix against this server's KV-cache block
    row.workloads = [w.record(kv_block_tokens(trial.engine_args, runtime.device)) for w in plan.workloads]
    row.dataset_filters = [r for r in (w.dataset_filter_record() for w in plan.workloads) if r] or None
    log_path = Path(ctx.logs_dir) / f"{trial_id.replace('/', '__')}.log"
    row.log_path = str(log_path)
    row.load_avg_1m = host_load_avg()
    return row, log_path


def _boot(boots: TrialBoots, row: R.TrialRow, runtime: Runtime, logger: Any) -> None:
    """Boot the server (the ``boot`` task, retried once after a transient failure) and record the boot's seconds and
    attempts. ``boots.server`` is then the attempt that booted, or that failed last (the one torn down).

    Raises:
        BootFailed: with ``failure`` (``bootlog.BootFailure``) set, the server already stopped.
    """
    progress.emit("boot", estimate_s=_TYPICAL_BOOT_S.get(runtime.device))
    try:
        boot = boot_task(boots)
    finally:
        row.boot_attempts = boots.attempts
        row.boot_retry_reason = boots.first_failure
    row.boot_s = boot["boot_s"]
    row.health_s = boot["health_s"]
    logger.info("ready in %.1f s on port %s", boot["boot_s"], boot["port"])


def _measure_into(tables: dict[str, pd.DataFrame], row: R.TrialRow, server: EngineServer, trial: Trial, plan: Plan,
                  gpu_index: int | None, keep_windows: Callable[[Any], None],
                  keep_search: Callable[[pd.DataFrame], None], logger: Any) -> None:
    """Measure the running server into ``tables`` (the ``measure`` task: warm-up and the plan's windows; then the
    plan's ``sla_search``, if any), diagnose each window's bottleneck, and set the row ``ok`` with the measurement's
    notes. Raises what the measurement raises (the caller records it)."""
    # Positive proof of the env flags, read from the live server (tasks.flag_proof; 021).
    proofs = prove_flags(trial.env, getattr(getattr(server, "proc", None), "pid", None))
    row.flag_proof = proofs  # stored as JSON text
    for flag, proof in proofs.items():
        if proof["status"] == "contradicted":
            logger.warning("%s=%s did not take effect as set: %s", flag, proof["value"], proof["evidence"])
    res, gpu = task_value(measure_task(server, plan, gpu_index, on_window=keep_windows))
    if plan.sla_search is not None:  # the highest load meeting the slo, on this server (017)
        # The plan's windows stay in the bundle if the search fails (the trial is then 'failed').
        tables.update(requests=res.requests, measurements=res.measurements,
                      server_metrics=res.server_metrics, gpu_samples=gpu)
        res, sla_gpu, tables["sla_searches"] = task_value(
            sla_search_task(server, plan, gpu_index, res, on_window=keep_windows,
                            on_interrupted=keep_search))
        gpu = pd.concat([f for f in (gpu, sla_gpu) if len(f)] or [gpu], ignore_index=True)
    else:  # the table in every measured bundle, empty without a search
        tables["sla_searches"] = pd.DataFrame(columns=list(R.columns(R.SlaSearch))[1:])
    tables.update(requests=res.requests, measurements=res.measurements,
                  server_metrics=res.server_metrics, gpu_samples=gpu)
    # Which bottleneck holds each window back, from its evidence (tunelab.core.bottleneck_rules). A diagnosis that
    # fails costs its table, not the trial's measurements.
    try:
        tables["window_diagnoses"] = window_diagnoses(
            res.measurements, res.requests, res.server_metrics, gpu, model=trial.model,
            gpu_name=row.gpu_name, gpu_index=gpu_index,
            gpus=int(trial.engine_args.get("tensor-parallel-size") or 1))
    except Exception as e:  # noqa: BLE001
        logger.warning("bottleneck diagnosis failed: %s: %s", type(e).__name__, e)
    row.status = "ok"
    if res.notes:
        # Not a failure: what the measurement noticed about its windows (see tasks.measure). Logged
        # so the terminal and the Prefect UI show it, stored for SQL.
        row.measurement_notes = _kept_notes(res.notes)
        # One line per cause with its count (reports.notes), not one per window: a busy 2-core run
        # had about ten near-identical ones.
        from tunelab.reports.notes import group_notes

        for g in group_notes([(trial.label, trial.replicate, row.measurement_notes)]):
            logger.warning("measurement note (%d window(s)): %s", g.windows, g.example)


def _record_pruned(row: R.TrialRow, tables: dict[str, pd.DataFrame], measured: dict[str, pd.DataFrame],
                   e: MeasurementStopped, logger: Any) -> None:
    """The window check stopped the measurement: ``failed`` / ``pruned``, the windows so far kept."""
    row.status = "failed"
    row.failure_class = "pruned"
    row.failure_reason = str(e)
    tables.update(measured)
    logger.info("%s", e)


def _record_wrong_device(row: R.TrialRow, e: WrongDevice, logger: Any) -> None:
    """The server runs on other GPUs than it was given: ``boot_failed`` / ``wrong_device``, retryable."""
    row.status = "boot_failed"
    row.failure_class = "wrong_device"
    row.failure_reason = str(e)[:2000]
    row.failure_retryable = True  # the host's device mapping, not the config
    logger.error("wrong device: %s", e)


def _record_boot_failure(row: R.TrialRow, e: BootFailed, log_path: Path, trial: Trial, trial_id: str, plan: Plan,
                         runtime: Runtime, ctx: TrialContext, logger: Any) -> None:
    """A failed boot: ``boot_failed`` with the class from the server's log (``bootlog``), whether a retry could
    help, the reason; and, when the plan asks for it, the eager diagnosis (one more boot with --enforce-eager)."""
    row.boot_s = e.boot_s
    row.status = "boot_failed"
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    fail = getattr(e, "failure", None) or bootlog.classify_boot_failure(text, e.returncode,
                                                                        e.kind == "timeout")
    # A transient or retryable failure says nothing about the config: readers must not call the
    # config infeasible from it (docs/warehouse.md).
    row.failure_retryable = bool(fail.retryable or fail.transient)
    row.failure_class = fail.failure_class if e.kind != "not_ours" else "port_conflict"
    row.failure_reason = boot_failure_reason(e, fail)
    logger.warning("boot failed (%s): %s", row.failure_class, row.failure_reason)
    if plan.eager_diagnosis and fail.failure_class != "invalid_config" \
            and not trial.engine_args.get("enforce-eager"):
        row.eager_diagnosis = _eager_diagnosis(trial, runtime, plan, log_path, trial_id, ctx.gpu_index,
                                                 list(ctx.gpu_indices), ctx.cuda_visible_devices)


def _record_measurement_error(row: R.TrialRow, tables: dict[str, pd.DataFrame], measured: dict[str, pd.DataFrame],
                              server: Any, e: Exception, logger: Any) -> None:
    """A measurement that raised: ``failed`` / ``measurement_error`` with what the server was doing."""
    row.status = "failed"
    row.failure_class = "measurement_error"
    # httpx's ReadError / ReadTimeout carry no text: say what the server was doing.
    row.failure_reason = f"{server_state(server)}; {type(e).__name__}: {e or repr(e)}"
    if "sla_searches" in measured:  # an SLA search failed part-way: its windows and its record stay
        tables.update(measured)
    logger.error("trial failed: %s\n%s", e, traceback.format_exc())


def _record_cancelled(row: R.TrialRow, e: BaseException) -> None:
    row.status = "cancelled"
    row.failure_reason = cancel_reason(e)


def _tear_down_and_write(row: R.TrialRow, tables: dict[str, pd.DataFrame], server: Any,
                         interrupted: BaseException | None, log_path: Path, trial: Trial, trial_id: str,
                         ctx: TrialContext, logger: Any) -> tuple[Path, BaseException | None]:
    """Stop the server (the ``teardown`` task; after an interruption directly), record the teardown and what the
    boot log says (version, effective config, env not applied, compile cache, boot phases), and write the bundle.

    Returns:
        (the bundle folder, the interruption to propagate: ``interrupted``, or one that landed in the teardown).
    """
    progress.emit("teardown")
    try:
        td = teardown_task(server) if interrupted is None else dict(server.stop().__dict__)
    except BaseException as e:  # noqa: BLE001 - re-raised by the caller
        if interrupted is not None:
            raise
        # A cancel (Prefect's runner SIGTERMs as soon as the run is cancelled, wherever the trial is) that
        # lands in a normal teardown: finish stopping the server, record the trial cancelled (Prefect ends
        # its run Cancelled), then propagate. Without this the bundle was never written.
        interrupted = e
        _record_cancelled(row, e)
        td = dict(server.stop().__dict__)
    row.teardown_s = td.get("total_s")
    row.teardown_clean = bool(td.get("clean", True))
    if not td.get("clean", True):
        # The sweep reads teardown_clean from the bundle and takes the device out of service.
        row.failure_reason = ((row.failure_reason or "") + f"; teardown: {td.get('detail')}").strip("; ")
    row.command = server.redacted_command()
    report = bootlog.read_boot_report(log_path)
    row.vllm_version = row.vllm_version or getattr(report, "vllm_version", None)
    row.effective_config = getattr(report, "effective_config", {}) or {}
    row.env_not_applied = [k for k in getattr(report, "unknown_env", []) if k in trial.env]
    row.compile_cache = getattr(report, "compile_cache", None)
    tables["boot_phases"] = bootlog.boot_phases_frame(report)
    row.finished_at = _now()
    bundle = write_bundle(Path(ctx.results_dir), ctx.sweep, row, tables)
    logger.info("trial %s: %s; bundle %s", trial_id, row.status, bundle)
    return bundle, interrupted


#: Typical boot seconds per device kind, for the live display's "typically ~N s" (tunelab.core.plan_cost.TYPICAL).
def _typical_boot_s() -> dict[str, float]:
    from tunelab.core.plan_cost import TYPICAL

    return {k: v.boot_s for k, v in TYPICAL.items()}


_TYPICAL_BOOT_S = _typical_boot_s()


def _keep_windows(ctx: TrialContext, row: R.TrialRow, measured: dict[str, pd.DataFrame], n_windows: int,
                  trial_id: str, logger: Any) -> None:
    """Write the trial's bundle with the windows measured so far and ``status='incomplete'`` (atomically, as any
    bundle: ``tunelab.core.bundle.write_bundle``). The trial's final bundle replaces it; only a trial that never got
    there (killed with SIGKILL, the host lost) leaves it, and ``tunelab load`` then loads what it measured as
    ``incomplete``, which no comparison uses (they take ``status='ok'``). A write that fails is logged and the
    measurement goes on: the final bundle does not depend on it."""
    part = row.model_copy()
    part.update(status="incomplete", finished_at=_now(),
                failure_reason=f"the trial ended without its final bundle after {n_windows} measured window(s): "
                               "killed or its host lost; these windows were kept as they ended")
    try:
        write_bundle(Path(ctx.results_dir), ctx.sweep, part, dict(measured))
    except Exception as e:
        logger.warning("could not keep window %d of %s on disk: %s", n_windows, trial_id, e)


def _eager_diagnosis(trial: Trial, runtime: Runtime, plan: Plan, log_path: Path, trial_id: str, gpu_index,
                     gpu_indices: list[int] | None = None, cuda_visible: str | None = None) -> str:
    """The seeds' diagnostic: boot the failed config once more with only --enforce-eager added.
    Eager boots -> the failure is in CUDA graph capture / torch.compile; eager fails too -> memory sizing
    (weights, KV cache, context length, concurrency) or configuration."""
    eager_log = log_path.with_name(log_path.stem + ".eager.log")
    s = _boot_once(trial.with_eager(), runtime, plan, eager_log, trial_id + "/eager", gpu_index, gpu_indices,
                   cuda_visible)
    try:
        with s:
            found = f"eager boots ({s.boot.boot_s:.1f} s): graph capture / compile problem"
    except BootFailed as e:
        text = eager_log.read_text(errors="replace") if eager_log.exists() else ""
        f = bootlog.classify_boot_failure(text, e.returncode, e.kind == "timeout")
        if e.kind == "timeout":  # a boot too slow for the bound shows nothing about memory or graphs
            found = (f"eager also timed out ({f.failure_class}): the boot is too slow for the plan's boot timeout "
                     "with or without CUDA graphs (model loading, a cold compile, a loaded host); this tells "
                     f"nothing about graphs or memory: raise the boot timeout and re-run (eager log {eager_log})")
        else:
            found = f"eager also fails ({f.failure_class}): memory sizing or configuration, not graphs"
    get_run_logger().warning("eager diagnosis of %s: %s", trial_id, found)  # said where the failure is said
    return found


def host_name() -> str:
    return socket.gethostname()
