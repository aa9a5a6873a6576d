"""A plan with ``search:``: boot the plan's default config, then the configs optuna's TPE sampler suggests, one boot
at a time, until the budget is spent (``tunelab.search.run_search`` decides; this module boots).

The sweep (``flows.sweep``) hands its trial runner to :func:`run_search_sweep` instead of running its trials. The
plan's trial list is its one base config (the default); every config the search asks for becomes one more job of
the sweep's runner, run by the sweep's own ``run_one`` (device locks, slots, the trial subflow, its bundle and
status), validated by the sweep's quality gate at once (a boot counts only when it is ``ok`` and passes or warns),
and recorded with its search columns (``trials.search_*``, migration 018). A config is pruned through
``flows.trial.WINDOW_CHECKS``: after each measured window the search's rule may stop the measurement.

At the end :func:`record_search` puts the search's summary into the sweep's record (``sweeps.search_*``) and into
every bundle, so the warehouse's rows carry it; ``reports.tuning`` reads them (``tunelab tuning-report``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from tunelab import records
from tunelab.bundle import read_bundle, update_bundle_table
from tunelab.plan import Plan, config_key
from tunelab.search import (BootOutcome, SearchBoot, SearchOutcome, SearchRecord, boots_phrase, default_in_space,
                            flagged_bottlenecks, run_search)

__all__ = ["run_search_sweep", "record_search", "search_lines", "sweep_bundles"]


def _minutes(timing: dict, devices: int) -> float:
    start, end = timing.get("slot_at") or timing.get("queued_at"), timing.get("end_at")
    return 0.0 if start is None or end is None else max(0.0, end - start) * max(devices, 1) / 60.0


def run_search_sweep(run: Any, pools: dict, no_gpu_reason: str, plan: Plan, logger: Any,
                     validate: Any = None, outcome: SearchOutcome | None = None) -> SearchOutcome:
    """Run the plan's search on the sweep's trial runner.

    Args:
        run: the sweep's ``_SweepTrials``; its one job is the plan's default config (a template for the others).
        pools: device pools by name (``gpu``, ``cpu``). no_gpu_reason: why no GPU was selected.
        plan: the plan with ``search:``.
        logger: the sweep's logger.
        validate: ``validate(bundle, plan) -> verdict`` (the sweep's quality gate).
        outcome: filled in as the search goes (default: a new one): when an interruption (Ctrl-C, a cancel) ends
            the search, it holds what the search knew (``stop_reason`` ``interrupted``, the boot it ended
            ``cancelled``) for :func:`record_search`.

    Returns:
        :class:`tunelab.search.SearchOutcome`; every boot's bundle and status are in ``run`` (one job each).

    Raises:
        What the boots raise (an interruption), after every boot's bundle, the cancelled one's included, got its
        search columns.
    """
    from tunelab.flows.devices import run_on_devices
    from tunelab.flows.trial import WINDOW_CHECKS

    assert plan.search is not None
    template = run.jobs[0]
    base = template.trial
    workload, load = plan.search_cell()
    logger.info("search: %s %s at %s %s under SLO %s; budget %s; space: %s", plan.search.objective.direction,
                plan.search.objective.metric, workload, load,
                {k: v for k, v in plan.slo.model_dump().items() if v is not None} or "none",
                ", ".join(f"{k} {v:g}" for k, v in plan.search.budget.model_dump().items() if v is not None),
                json.dumps(plan.search.space.model_dump(exclude_defaults=True), default=str))

    def boot(req: SearchBoot) -> BootOutcome:
        if req.role == "default":
            job = template
        else:
            # The label shows the space's names and whatever a walk-down changed beside them.
            axes = list(plan.search.space.engine_args) + list(plan.search.space.env)
            axes += [k for k, v in req.engine_args.items() if k not in axes and base.engine_args.get(k) != v]
            t = base.model_copy(update={"engine_args": req.engine_args, "env": req.env, "name": None,
                                        "axes": tuple(axes)})
            with run.lock:
                job = dataclasses.replace(template, index=len(run.jobs), trial=t)
                run.jobs.append(job)
                run.statuses.append(None)
                run.bundles.append(None)
                run.timings.append(dict(trial_index=job.index))
        trial_id = run.trial_id_of(job)
        current[:] = [job, trial_id]
        if req.walked:
            logger.info("search: memory walk-down: %s", req.walked)
        WINDOW_CHECKS[trial_id] = req.window_check
        try:
            if job.pool == "gpu" and not pools["gpu"]:
                run.on_skip(job, f"runtime {job.trial.runtime!r} needs a GPU; {no_gpu_reason or 'none selected'}")
            else:
                run_on_devices([job], lambda j: j.need, pools[job.pool], run.run_one, on_skip=run.on_skip,
                               on_interrupt=run.on_interrupt, usable=run.usable)
        finally:
            WINDOW_CHECKS.pop(trial_id, None)
        bundle, st = run.bundles[job.index], run.statuses[job.index] or {}
        if bundle is not None and st.get("status") == "ok" and validate is not None:
            try:
                st["verdict"] = validate(bundle, plan)
            except Exception as e:  # the boot then does not count; the sweep validates again at its end
                logger.error("validation of %s could not run: %s", bundle, e)
        tables = read_bundle(bundle, verify=False) if bundle is not None else {}
        # The diagnosis of its windows at the objective's cell: what the search may try next (search.guide).
        return BootOutcome(status=st.get("status") or "failed", failure_class=st.get("failure_class"),
                           measurements=tables.get("measurements"), usable=st.get("verdict") in ("pass", "warn"),
                           gpu_minutes=_minutes(run.timings[job.index], job.need), trial_id=trial_id,
                           bottlenecks=flagged_bottlenecks(tables.get("window_diagnoses"), workload, load))

    current: list = []  # [job, trial_id] of the boot running now
    longest = max(w.prompt_tokens + w.output_tokens for w in plan.workloads)
    out = outcome if outcome is not None else SearchOutcome()
    try:
        run_search(plan.search, base_args=dict(base.engine_args), base_env=dict(base.env), seed=plan.seed,
                   workload=workload, load=load, slo=plan.slo.model_dump(), boot=boot, min_model_len=longest,
                   key=lambda a, e: config_key(plan.model_id(), a, e), log=logger.info, outcome=out)
    finally:  # also when interrupted: what the search knew goes into the bundles of the boots it ran
        if out.records and out.records[-1].state == "cancelled" and current:
            out.records[-1].trial_id = current[1]
        by_id = {r.trial_id: r for r in out.records}
        for j in run.jobs:  # each boot's search columns into its bundle's trial row
            b = run.bundles[j.index] or _bundle_on_disk(run, j)
            rec = by_id.get(run.trial_id_of(j))
            if b is not None and rec is not None:
                _record_trial(b, rec, logger)
    return out


def _bundle_on_disk(run: Any, job: Any) -> Path | None:
    """The bundle a trial wrote though the sweep did not record it (a trial on the main thread that an interruption
    ended writes its ``cancelled`` bundle on the way out); None when there is none."""
    from tunelab.bundle import bundle_dir_for

    try:
        b = bundle_dir_for(Path(run.base_ctx.results_dir), run.sweep_id, run.trial_id_of(job))
    except Exception:  # noqa: BLE001 - no bundle to record into
        return None
    return b if (b / "manifest.json").is_file() else None


def sweep_bundles(run: Any) -> list[Path]:
    """Every bundle of the sweep's jobs on disk: those it recorded and those an interruption left unrecorded."""
    return [b for j in run.jobs if (b := run.bundles[j.index] or _bundle_on_disk(run, j)) is not None]


def _record_trial(bundle: Path, rec: SearchRecord, logger: Any) -> None:
    try:
        tdf = read_bundle(bundle, verify=False)["trial"].copy()
        tdf["search_role"] = rec.role
        tdf["search_trial"] = rec.number
        tdf["search_state"] = rec.state
        tdf["search_value"] = rec.value
        tdf["search_slo_violation"] = rec.violation if rec.violation is None or math.isfinite(rec.violation) else None
        tdf["search_walk_down"] = rec.walked
        tdf["search_walked_from"] = rec.walked_from
        tdf["search_reason"] = rec.reason
        update_bundle_table(bundle, "trial", records.frame(records.Trial, tdf))
    except Exception as e:  # the bundle keeps its measurements; only its search columns are missing
        logger.warning("could not record the search columns of %s: %s", bundle, e)


def record_search(sweep: records.Sweep, plan: Plan, outcome: SearchOutcome) -> None:
    """The search's summary into the sweep's record (the sweep then writes the record into its bundles,
    ``bundle.write_sweep_row``: the loader upserts the sweep row from them)."""
    assert plan.search is not None
    workload, load = plan.search_cell()
    obj = plan.search.objective
    sweep.update(search_objective=json.dumps({"metric": obj.metric, "direction": obj.direction, "workload": workload,
                                              "load": load, "slo": plan.slo.model_dump(),
                                              "slo_percentile": obj.slo_percentile}, sort_keys=True),
                 search_space=json.dumps(plan.search.space.model_dump(exclude_defaults=True), sort_keys=True,
                                         default=str),
                 search_stop_reason=outcome.stop_reason, search_boots=outcome.boots,
                 search_grid_size=outcome.grid_size, search_gpu_minutes=outcome.gpu_minutes,
                 search_best_config_key=outcome.best_key)


def search_lines(plan: Plan, outcome: SearchOutcome) -> list[str]:
    """The search as the lines printed at the end of the sweep."""
    assert plan.search is not None
    obj = plan.search.objective
    default = next((r for r in outcome.records if r.role == "default"), None)
    in_grid = None if default is None else default_in_space(plan.search.space, default.engine_args, default.env)
    boots = boots_phrase(outcome.boots, outcome.grid_size, in_grid,
                         [(r.role, r.state, r.config_key) for r in outcome.records])
    best = outcome.best()
    lines = [f"search: {boots}, {outcome.gpu_minutes:.2f} GPU-minutes; stopped: {outcome.stop_reason}"]
    if best is None:
        lines.append("search: no config met the SLO with a usable boot")
    else:
        lines.append(f"search: best {obj.metric} = {best.value:.4g} ({best.role}, config {best.config_key}); "
                     "`tunelab tuning-report` shows the frontier, the verdict against the default and the command")
    return lines
