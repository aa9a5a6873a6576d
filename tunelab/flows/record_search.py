"""A plan with ``search:`` in the sweep: each boot's search columns into its bundle, the search's summary into the
sweep's record, its lines. The design (which config to boot next) is :mod:`tunelab.designs.config_search`, run by the sweep's
one loop (``flows.sweep``) like any design: each boot is one more trial of the sweep (device locks, slots, the trial
subflow, its bundle and status), validated by the quality gate at once (a boot counts only when it is ``ok`` and
passes or warns), and recorded with its search columns (``trials.search_*``, migration 018). A config is pruned by
its spec's window check: after each measured window the search's rule may stop the measurement.

At the end :func:`record_search` puts the search's summary into the sweep's record (``sweeps.search_*``) and into
every bundle, so the warehouse's rows carry it; ``reports.tuning`` reads them (``tunelab tuning-report``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tunelab.core import records
from tunelab.core.bundle import read_bundle, update_bundle_table
from tunelab.core.plan import Plan
from tunelab.core.search.config_tpe import SearchOutcome, SearchRecord, boots_phrase, default_in_space

__all__ = ["record_search", "record_search_trials", "search_lines", "sweep_bundles"]


def record_search_trials(run: Any, outcome: SearchOutcome, logger: Any) -> None:
    """Each boot's search columns into its bundle's trial row (also after an interruption: what the search knew goes
    into the bundles of the boots it ran; the boot it ended, recorded ``cancelled``, is the sweep's last trial).

    Args:
        run: the sweep's trial runner (``flows.sweep._SweepTrials``): its jobs, bundles and trial ids.
        outcome: the search's record so far.
    """
    if outcome.records and outcome.records[-1].state == "cancelled" and run.jobs:
        outcome.records[-1].trial_id = run.trial_id_of(run.jobs[-1])
    by_id = {r.trial_id: r for r in outcome.records}
    for j in run.jobs:
        b = run.bundles[j.index] or _bundle_on_disk(run, j)
        rec = by_id.get(run.trial_id_of(j))
        if b is not None and rec is not None:
            _record_trial(b, rec, logger)


def _bundle_on_disk(run: Any, job: Any) -> Path | None:
    """The bundle a trial wrote though the sweep did not record it (a trial on the main thread that an interruption
    ended writes its ``cancelled`` bundle on the way out); None when there is none."""
    from tunelab.core.bundle import bundle_dir_for

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
        update_bundle_table(bundle, "trial", records.frame(records.TrialRow, tdf))
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
