"""Measurement quality gates: validate one trial's tables with great-expectations.

A latency or throughput number is only worth storing next to last month's if the
measurement behind it was clean. ``validate_trial`` runs five suites of expectations over
one trial's warehouse tables (``requests``, ``measurements``, ``server_metrics``,
``gpu_samples``; columns as in ``tunelab/warehouse/schema/001_init.sql``) and returns a verdict
``pass | warn | fail | unvalidated`` plus one ``quality_checks`` row per expectation.

Suites (each check, its GX expectation and severity are listed in ``CHECKS`` and
``docs/quality.md``):

* ``requests``          - required fields present, TTFT > 0, ITL >= 0, fixed output lengths
                          honoured (``ignore_eos``), error rate, no cluster of stalled
                          requests (E2EL/TPOT far above the window median) in a window.
* ``aggregates``        - repeat-to-repeat CV of p50 TTFT/TPOT, achieved vs. target
                          concurrency, load generator not saturated.
* ``environment``       - GPU clean at boot, no thermal/power throttling, stable SM clock.
* ``server_vs_client``  - the client's TTFT/ITL agree with vLLM's own histograms (catches
                          bursty delivery), no unexpected preemptions.
* ``warmup``            - none of the first measured requests of a window is much slower
                          than the rest of it (its median and its tail).

Where GX has an expectation for the question it is used on the table itself; where the
question is about a derived statistic (a CV, a ratio, a server/client difference) the
statistic is computed with pandas into a small frame (one row per measurement, group or
GPU, with a ``label`` column) and a GX expectation is run on that frame.

A check that cannot run (no GPU, metric absent in this vLLM version, too few requests) is
recorded with ``success = NULL`` and ``detail = 'skipped: <reason>'``; skipped checks never
change the verdict. If validation itself breaks (a required table or column is missing,
GX raises) the verdict is ``unvalidated`` with the error in ``summary`` - never ``pass``.

Modules: ``catalogue`` (``CHECKS``, columns, verdict types), ``suites`` (the checks), ``runner``
(great-expectations, ``validate_trial``), ``markdown`` (``quality_markdown``). great-expectations costs
about 3 s to import, so it is imported inside ``validate_trial`` only. An ephemeral GX context is used, progress bars are off, nothing is written to disk.
"""

from tunelab.tasks.quality import suites
from tunelab.tasks.quality.catalogue import (
    _MEASUREMENT_KEY,
    CHECKS,
    QUALITY_CHECK_COLUMNS,
    THROTTLE_REASON_BITS,
    CheckInfo,
    QualityResult,
    QualityValidationError,
    Verdict,
)
from tunelab.tasks.quality.markdown import quality_markdown
from tunelab.tasks.quality.runner import _run_plans, validate_trial
from tunelab.tasks.quality.suites import _Plan, _Spec

__all__ = [
    "CHECKS",
    "QUALITY_CHECK_COLUMNS",
    "THROTTLE_REASON_BITS",
    "CheckInfo",
    "QualityResult",
    "QualityValidationError",
    "Verdict",
    "quality_markdown",
    "suites",
    "validate_trial",
]
