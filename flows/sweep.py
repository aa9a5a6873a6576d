"""Flow ``tuning_sweep``: one plan execution, start to finish.

    validate plan -> stop leftovers of earlier runs -> inventory GPUs
      -> for each trial (interleaved A B A B): subflow ``trial`` -> bundle on disk
      -> validate each bundle (great-expectations) -> load bundles into DuckDB -> report

Everything a trial produces is on disk (a bundle) before it is validated and loaded, so a failed load
loses nothing: ``tunelab load`` picks the bundles up later.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import signal
import socket
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

import tunelab
from flows.trial import run_trial
from tasks.bundle import read_bundle, update_bundle_table, write_bundle
from tasks.engine import stop_leftovers, _state_read
from tasks.gpu import inventory
from tasks.report import comparison_frame, comparison_markdown
from tunelab import paths
from tunelab.plan import Plan, PlanError, load_plan
from tunelab.runtime import RuntimeError_, load_runtime
from warehouse.loader import load_pending

__all__ = ["tuning_sweep", "preflight", "SweepSummary"]


class SweepSummary(dict):
    """Returned by :func:`tuning_sweep`: sweep_id, db path, results folder, trial statuses, comparison."""


def preflight(plan: Plan) -> dict[str, Any]:
    """Everything that must hold before any server starts: runtimes exist, model folder exists.

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
            f"model: {plan.model!r} is not a model folder (no config.json); build the tiny one with "
            f"`tunelab model tiny {plan.model}` or point 'model' at a local model directory"
        )
    return runtimes


def _install_sigterm() -> None:
    # Cancellation (Prefect, a worker, `kill`) arrives as SIGTERM: turn it into an exception so that every
    # `finally` runs and the server's process group is torn down.
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (e.g. inside a test harness): nothing to do
        pass


@task(name="validate", cache_policy=NO_CACHE)
def validate_task(bundle: Path, plan: Plan) -> str:
    """Run the quality suites on one bundle and write the verdict and checks back into it."""
    from tasks.quality import validate_trial

    tables = read_bundle(bundle)
    trial = tables["trial"].iloc[0].to_dict()
    if trial.get("status") != "ok":
        return trial.get("quality_verdict") or "unvalidated"
    trial.setdefault("ignore_eos", all(w.ignore_eos for w in plan.workloads))
    res = validate_trial(tables, trial, plan.quality)
    update_bundle_table(bundle, "quality_checks", res.checks)
    tdf = tables["trial"].copy()
    tdf["quality_verdict"] = res.verdict
    update_bundle_table(bundle, "trial", tdf)
    return res.verdict


@task(name="load", cache_policy=NO_CACHE)
def load_task(db: Path, results: Path) -> int:
    """Load every bundle not yet in the warehouse; returns how many were loaded. A bundle that fails to
    load stays on disk (logged with its reason) for a later `tunelab load`."""
    logger = get_run_logger()
    results_ = load_pending(db, results)
    for r in results_:
        if r.status == "failed":
            logger.error("bundle %s not loaded: %s", r.bundle_dir, r.error)
    return len([r for r in results_ if r.status == "loaded"])


@flow(name="tuning_sweep", flow_run_name="sweep {plan_path}", log_prints=True)
def tuning_sweep(plan_path: str, db: str | None = None, results: str | None = None) -> dict:
    """Run every trial of the plan, validate, load into DuckDB and report.

    Args:
        plan_path: the plan YAML.
        db: DuckDB file (default ``<tunelab home>/warehouse.duckdb``).
        results: results folder for bundles (default ``<tunelab home>/results``).

    Raises:
        PlanError: before any server starts, for a bad plan, a missing runtime or model.
    """
    logger = get_run_logger()
    _install_sigterm()
    plan = load_plan(plan_path)
    runtimes = preflight(plan)
    db_path = Path(db) if db else paths.db_path()
    results_dir = Path(results) if results else paths.results_dir()
    started = dt.datetime.now(dt.timezone.utc)
    sweep_id = f"{started:%Y%m%dT%H%M%SZ}-{plan.name}-{secrets.token_hex(2)}"
    sweep = {
        "sweep_id": sweep_id,
        "plan_name": plan.name,
        "plan_yaml": Path(plan_path).read_text(),
        "host": socket.gethostname(),
        "started_at": started.isoformat(),
        "tunelab_version": tunelab.__version__,
        "source": "tunelab",
    }
    left = stop_leftovers(log=logger.info)
    if left:
        logger.warning("stopped %d leftover server(s) of an earlier run", len(left))
    inv = inventory()
    gpu = inv.gpus[0] if inv.available and inv.gpus else None
    if not inv.available:
        logger.info("%s; running on CPU", inv.reason)
    logs_dir = paths.logs_dir() / sweep_id
    logs_dir.mkdir(parents=True, exist_ok=True)
    ctx = {
        "sweep": sweep,
        "results_dir": str(results_dir),
        "logs_dir": str(logs_dir),
        "gpu_index": gpu.index if gpu else None,
        "gpu_name": gpu.name if gpu else "cpu",
        "gpu_baseline_mib": gpu.memory_used_mib if gpu else None,
        "driver_version": inv.driver_version,
        "cuda_version": inv.cuda_version,
    }
    trials = plan.trials()
    logger.info("sweep %s: %d trial(s)", sweep_id, len(trials))
    bundles: list[Path] = []
    statuses = []
    gpu_unusable = False
    for i, t in enumerate(trials):
        trial_id = f"{sweep_id}/{t.runtime}/{t.config_key}/r{t.replicate}"
        if gpu_unusable:
            logger.error("skipping %s: the GPU is unusable after a server could not be stopped", trial_id)
            continue
        ctx["our_pids"] = [e["pid"] for e in _state_read()]
        logger.info("trial %d/%d: %s [%s] on %s", i + 1, len(trials), t.label, t.config_key, t.runtime)
        bundle = run_trial(t, trial_id, plan, runtimes[t.runtime], ctx)
        bundles.append(bundle)
        trow = read_bundle(bundle)["trial"].iloc[0]
        statuses.append({"trial_id": trial_id, "config": t.label, "runtime": t.runtime,
                         "status": trow["status"], "failure_class": trow.get("failure_class"),
                         "boot_s": trow.get("boot_s")})
        if trow.get("teardown_clean") is False or trow.get("teardown_clean") == False:  # noqa: E712
            gpu_unusable = True
    for b in bundles:
        try:
            validate_task(b, plan)
        except Exception as e:  # the verdict stays 'unvalidated'; never 'pass'
            logger.error("validation of %s could not run: %s", b, e)
    sweep["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat()
    loaded = load_task(db_path, results_dir)
    logger.info("loaded %d bundle(s) into %s", loaded, db_path)
    comp = comparison_frame(db_path, sweep_id)
    md = comparison_markdown(comp, sweep_id, statuses)
    try:
        create_markdown_artifact(md, key="sweep-report", description=f"tunelab sweep {sweep_id}")
        create_table_artifact(pd.DataFrame(statuses).astype(str).to_dict("records"), key="sweep-trials")
    except Exception as e:  # artifacts are a view; never lose a sweep over them
        logger.warning("could not create artifacts: %s", e)
    return SweepSummary(sweep_id=sweep_id, db=str(db_path), results=str(results_dir), trials=statuses,
                        comparison=comp.to_dict("records"), report_markdown=md)
