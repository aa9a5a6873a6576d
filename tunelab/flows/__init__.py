"""Prefect flows of tunelab. Flows decide order, concurrency and what the UI shows; the steps are the Prefect tasks
of ``tunelab/tasks/steps/`` over the plain functions of ``tunelab/tasks/``.

- ``flows.sweep.tuning_sweep``: one plan execution (trials as subflows, one per device at a time, validate,
  load, report); its one loop asks the plan's design (``tunelab.designs``) which trials to boot next.
- ``flows.run_states``: the Prefect states and tags that say how a trial or sweep ended (QualityFailed,
  AllTrialsFailed, Cancelled after an interruption).
- ``flows.trial.run_trial``: one trial (clean GPU, boot, warm-up + measure, teardown, bundle).
- ``flows.compare.compare``: A/B and regression report from the warehouse.

Deployments of these flows are declared in ``deployments/prefect.yaml``; ``tunelab serve`` serves them locally.
Modules are imported on use (``from flows.sweep import tuning_sweep``): importing this package does not import
Prefect.
"""

__all__ = ["compare", "sweep", "trial"]
