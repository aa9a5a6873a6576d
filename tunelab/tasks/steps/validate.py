"""Task ``validate``: the quality suites on one bundle (``tasks.quality.validate_trial``), the verdict and the
checks written back into it, before it is loaded."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tunelab.core.bundle import read_bundle, update_bundle_table
from tunelab.core.plan import Plan

__all__ = ["validate_task"]


@task(name="validate", cache_policy=NO_CACHE)
def validate_task(bundle: Path, plan: Plan) -> str:
    """Run the quality suites on one bundle and write the verdict and checks back into it.
    Returns the verdict (pass | warn | fail | unvalidated); a trial that did not measure stays unvalidated."""
    from tunelab.tasks.quality import validate_trial  # great-expectations: imported when a bundle is validated

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
