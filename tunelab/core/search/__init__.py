"""Search algorithms, pure and testable without a server (their Prefect side is elsewhere).

- :mod:`tunelab.core.search.config_tpe` - a plan's ``search:``: optuna's TPE sampler over engine args and env, one boot
  per config, under a budget of boots or GPU minutes (the design: ``designs.config_search``; its records: ``flows.record_search``).
- :mod:`tunelab.core.search.sla` - a plan's ``sla_search:``: grow then bisect the load level to the highest one
  whose SLOs hold on one booted server (the task: ``tasks.sla_search``).
"""
