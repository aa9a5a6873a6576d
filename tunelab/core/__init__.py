"""The core: what a sweep is and what it produces. Pure domain code (no Prefect, no warehouse, no host state).

- :mod:`tunelab.core.plan` - the plan file (YAML) parsed and checked, expanded into trials;
  :mod:`tunelab.core.plan_cost` its GPU-time estimate; :mod:`tunelab.core.trial_order` the order of its trials.
- :mod:`tunelab.core.load_profiles` - the load levels (concurrency, request rate, arrivals);
  :mod:`tunelab.core.workloads` - the prompts (datasets, shapes); :mod:`tunelab.core.engine_arg_values` - the
  values of vLLM engine args.
- :mod:`tunelab.core.records` - the rows a sweep writes (pydantic); :mod:`tunelab.core.bundle` - the result
  bundle on disk; :mod:`tunelab.core.quality_thresholds` - the quality rules' thresholds and versions;
  :mod:`tunelab.core.bottleneck_rules` - a window's bottleneck diagnosis; :mod:`tunelab.core.progress` - progress
  events; :mod:`tunelab.core.markdown` - the one markdown table writer.
- :mod:`tunelab.core.search` - the search algorithms: ``tpe`` (engine args and env, boots as cost) and ``sla``
  (the highest load meeting the SLOs on one server).
"""
