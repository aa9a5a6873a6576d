"""The Prefect tasks of one experiment, one module a step, each a small ``@task`` over plain functions of
``tunelab.tasks`` (so a test calls the function, or ``task.fn``, without Prefect):

- ``clean_gpu``: the device check before boot (``tasks.gpu.check_clean``).
- ``boot``: start ``vllm serve`` and wait until it serves (``tasks.engine.EngineServer``); raises
  ``tasks.engine.BootFailed`` with its classified reason, retried once by Prefect when the failure was transient;
  after it, the placement check (the server on the GPUs it was given).
- ``measure_windows``: warm-up and the measured windows (``tasks.measure.measure_server``, whose ``warm_up()``
  runs before each load level's windows), then the plan's SLA search (``tasks.sla_search``), sampling the GPU;
  what the server was doing when a measurement failed.
- ``teardown``: stop the server's process group.
- ``validate``: the quality suites on a bundle (``tasks.quality``).
- ``load``: bundles into the warehouse (``warehouse.loader``).
- ``outcome``: how a step's failure reaches the flow (a logger that works outside a run, a Failed state).

The order of the steps is the trial flow's (``flows.trial.run_trial``) and the sweep's (``flows.sweep``).
"""
