"""The quality check catalogue: every check ``validate_trial`` can emit (``CHECKS``), its suite, GX expectation
and severity; the ``quality_checks`` columns; the NVML throttle bits; the columns each suite needs; the verdict
types. No great-expectations here (see ``runner``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd
import pynvml

from tunelab.core import records as R
from tunelab.tasks.measure import LOOP_LAG_NOTE_S, SAME_READ_NOTE_FRAC

Verdict = Literal["pass", "warn", "fail", "unvalidated"]
Severity = Literal["fail", "warn"]

QUALITY_CHECK_COLUMNS: tuple[str, ...] = R.columns(R.QualityCheck)
"""Columns of the ``quality_checks`` warehouse table, in schema order (``records.QualityCheck``)."""

THROTTLE_REASON_BITS: dict[str, int] = {
    "HwSlowdown": pynvml.nvmlClocksEventReasonHwSlowdown,  # 0x08
    "SwThermalSlowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,  # 0x20
    "HwThermalSlowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,  # 0x40
    "HwPowerBrakeSlowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,  # 0x80
}
"""NVML clock-event bits (``nvmlDeviceGetCurrentClocksEventReasons``, nvidia-ml-py) that count
as throttling. Not counted: GpuIdle (0x1), ApplicationsClocksSetting (0x2), SwPowerCap (0x4,
the normal state of a GPU at its power limit under full load - its effect shows up in
``sm_clock_stable``), SyncBoost (0x10), DisplayClockSetting (0x100)."""

_THROTTLE_MASK = 0
for _bit in THROTTLE_REASON_BITS.values():
    _THROTTLE_MASK |= _bit
_GPU_IDLE_BIT = pynvml.nvmlClocksEventReasonGpuIdle

_MEASUREMENT_KEY = list(R.pick(R.Measurement, "workload", "load_kind", "load_value", "repeat"))
_GROUP_KEY = ["workload", "load_kind", "load_value"]
_OUTLIER_MIN_REQUESTS = 5
"""Smallest window ``no_outlier_cluster`` assesses: with 5 ok requests a cluster of two
outliers is still a minority, so the window median is a normal request."""

#: Columns each suite reads, per table, checked against the table's record (``records.pick`` raises at import
#: for a name the record does not have); a frame lacking one makes the trial ``unvalidated``.
_REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "requests": R.pick(R.Request, *_MEASUREMENT_KEY, "ok", "send_ts", "end_ts", "output_tokens",
                       "requested_output_tokens", "ttft_s", "e2el_s", "itl_mean_s"),
    "measurements": R.pick(R.Measurement, *_MEASUREMENT_KEY, "ttft_p50_s", "tpot_p50_s", "ttft_mean_s",
                           "itl_mean_s", "achieved_concurrency", "client_cpu_frac", "client_bound"),
    "server_metrics": R.pick(R.ServerMetric, *_MEASUREMENT_KEY, "metric", "kind", "value"),
    "gpu_samples": R.pick(R.GpuSample, "gpu_index", "ts", "sm_clock_mhz", "throttle_reasons"),
}


class QualityValidationError(RuntimeError):
    """Validation could not be carried out (bad input or a GX error). Turned into verdict
    ``unvalidated`` by ``validate_trial``; never raised out of it."""


@dataclass(frozen=True)
class CheckInfo:
    """Catalogue entry of one quality check.

    Attributes:
        suite: suite name, the ``quality_checks.suite`` value.
        gx_expectation: the GX 1.x expectation class that decides the check.
        severity: severity of a failure (``no_throttling`` is ``fail`` only while
            ``QualityThresholds.forbid_throttling`` is true, else ``warn``).
        description: what is checked, on which table or derived frame.
    """

    suite: str
    gx_expectation: str
    severity: Severity
    description: str


def _ci(suite: str, gx: str, severity: Severity, description: str) -> CheckInfo:
    return CheckInfo(suite, gx, severity, description)


CHECKS: dict[str, CheckInfo] = {
    # requests
    "requests_present": _ci("requests", "ExpectTableRowCountToBeBetween", "fail",
                            "the trial has at least one measured request"),
    "error_rate": _ci("requests", "ExpectColumnValuesToBeInSet(mostly)", "fail",
                      "fraction of requests with ok = false is at most max_error_rate"),
    "no_failed_requests": _ci("requests", "ExpectColumnValuesToBeInSet", "warn",
                              "no request failed at all"),
    **{
        f"{col}_not_null": _ci("requests", "ExpectColumnValuesToNotBeNull", "fail",
                               f"requests.{col} is set for every ok request")
        for col in ("ttft_s", "e2el_s", "output_tokens", "send_ts", "end_ts")
    },
    "ttft_s_positive": _ci("requests", "ExpectColumnValuesToBeBetween", "fail",
                           "requests.ttft_s > 0 for ok requests"),
    "itl_mean_s_non_negative": _ci("requests", "ExpectColumnValuesToBeBetween", "fail",
                                   "requests.itl_mean_s >= 0 for ok requests"),
    "chunk_offsets_non_decreasing": _ci("requests", "ExpectColumnValuesToBeInSet", "fail",
                                        "requests.chunk_offsets_s starts >= 0 and never "
                                        "decreases, i.e. every ITL gap >= 0"),
    "output_tokens_match_requested": _ci("requests", "ExpectColumnPairValuesToBeEqual", "fail",
                                         "output_tokens == requested_output_tokens for ok "
                                         "requests that asked for a fixed length (ignore_eos)"),
    "no_outlier_cluster": _ci("requests", "ExpectColumnPairValuesAToBeGreaterThanB", "warn",
                              "per window (workload, load level, repeat) at most "
                              "max(1, floor(max_outlier_request_frac x n)) of its n ok "
                              "requests have E2EL or TPOT > outlier_request_ratio x the "
                              "window's median: no cluster of stalled requests"),
    # aggregates
    "repeats_for_cv": _ci("aggregates", "ExpectColumnValuesToBeBetween", "warn",
                          "every (workload, load_kind, load_value) has >= 2 repeats, "
                          "else its CV cannot be assessed"),
    "cv_ttft_p50": _ci("aggregates", "ExpectColumnValuesToBeBetween", "warn",
                       "repeat-to-repeat CV of ttft_p50_s <= max_cv_p50_ttft"),
    "cv_tpot_p50": _ci("aggregates", "ExpectColumnValuesToBeBetween", "warn",
                       "repeat-to-repeat CV of tpot_p50_s <= max_cv_p50_tpot"),
    "achieved_concurrency": _ci("aggregates", "ExpectColumnValuesToBeBetween", "fail",
                                "in_flight_while_sending (else achieved_concurrency) / "
                                "min(load_value, num_requests) >= min_concurrency_ratio for "
                                "load_kind = 'concurrency'"),
    "client_cpu_frac": _ci("aggregates", "ExpectColumnValuesToBeBetween", "warn",
                           "measurements.client_cpu_frac <= max_client_cpu_frac"),
    "host_not_busy": _ci("aggregates", "ExpectColumnValuesToBeBetween", "fail",
                         "measurements.host_other_cpu_frac <= max_host_other_cpu_frac (other processes' share of "
                         "the host's CPU during the window; rule version 6)"),
    "client_not_bound": _ci("aggregates", "ExpectColumnValuesToBeInSet", "fail",
                            "measurements.client_bound is false (set by tunelab/tasks/metrics.py from the "
                            "client's own evidence: its CPU >= 0.9, or fewer than 0.9 x target in "
                            "flight while it still had requests to send)"),
    "no_compile_in_window": _ci("aggregates", "ExpectColumnValuesToBeInSet", "warn",
                                "measurements.compile_during_window is false: the server log "
                                "written during the window shows no compilation or graph capture"),
    # environment
    "gpu_clean_at_boot": _ci("environment", "ExpectColumnValuesToBeInSet", "fail",
                             "trials.gpu_clean_at_boot is true"),
    "no_foreign_gpu_processes": _ci("environment", "ExpectColumnValuesToBeBetween", "fail",
                                    "trials.foreign_gpu_processes == 0"),
    "gpu_baseline_excess": _ci("environment", "ExpectColumnValuesToBeBetween", "warn",
                               "trials.gpu_baseline_excess_mib <= max_gpu_baseline_excess_mib"),
    "no_throttling": _ci("environment", "ExpectColumnValuesToBeInSet", "fail",
                         "no gpu_samples row has a throttling bit of THROTTLE_REASON_BITS"),
    "sm_clock_stable": _ci("environment", "ExpectColumnValuesToBeBetween", "warn",
                           "CV of sm_clock_mhz per GPU (non-idle samples) <= max_sm_clock_cv"),
    # server vs client
    "server_client_ttft_agree": _ci("server_vs_client",
                                    "ExpectColumnPairValuesAToBeGreaterThanB", "fail",
                                    "|client ttft_mean_s - server TTFT mean| <= allowed, windows "
                                    "attributed to the server's frontend (server_frontend_lag) "
                                    "excepted"),
    "server_client_itl_agree": _ci("server_vs_client",
                                   "ExpectColumnPairValuesAToBeGreaterThanB", "fail",
                                   "|client itl_mean_s - server ITL mean| <= allowed, windows "
                                   "attributed to the server's frontend (server_frontend_lag) "
                                   "excepted"),
    "server_frontend_lag": _ci("server_vs_client", "ExpectColumnValuesToBeInSet", "warn",
                               "no window's client TTFT/ITL mean exceeds the server mean by more than the "
                               "agree checks allow while the client's evidence is clean (client_bound false, "
                               f"same_read_itl_frac <= {SAME_READ_NOTE_FRAC}, loop_lag_p99_s <= "
                               f"{LOOP_LAG_NOTE_S} s): such a window is the "
                               "server's API process delivering late, not a measurement fault, and is taken "
                               "out of server_client_*_agree (QualityThresholds.attribute_frontend_lag)"),
    "preemptions": _ci("server_vs_client", "ExpectColumnValuesToBeBetween", "warn",
                       "preemptions counter delta per measurement <= max_preemptions"),
    # conditions (tunelab/tasks/quality/conditions.py)
    "cache_not_cold": _ci("conditions", "ExpectColumnValuesToBeBetween", "warn",
                          "per window of unique prompts (measurements.unique_prompts): prefix-cache hits / "
                          "queried tokens (server_metrics) <= 0.25: the window started with a cold cache (a "
                          "reset that did not take shows in measurements.prefix_cache_reset)"),
    "overloaded": _ci("conditions", "ExpectColumnValuesToBeInSet", "warn",
                      "no open-loop window in which the server fell behind its arrivals (measurements.overloaded: "
                      "completions behind arrivals, in flight and TTFT growing; tasks.metrics.overload); such a "
                      "window is left out of comparisons"),
    # warmup
    "warmup_ttft_settled": _ci("warmup", "ExpectColumnPairValuesAToBeGreaterThanB", "warn",
                               "per window, each of the first k requests has TTFT <= "
                               "max(warmup_slowdown_ratio x median, p90) of the rest"),
    "warmup_e2el_settled": _ci("warmup", "ExpectColumnPairValuesAToBeGreaterThanB", "warn",
                               "per window, each of the first k requests has E2EL <= "
                               "max(warmup_slowdown_ratio x median, p90) of the rest"),
}
"""Every check ``validate_trial`` can emit, keyed by its ``quality_checks.expectation`` name."""


@dataclass(frozen=True)
class QualityResult:
    """Outcome of ``validate_trial`` for one trial.

    Attributes:
        verdict: ``fail`` if a fail-severity check failed, else ``warn`` if a warn-severity
            check failed, else ``pass``; ``unvalidated`` if validation could not run.
        checks: one row per check, columns ``QUALITY_CHECK_COLUMNS`` (the
            ``quality_checks`` table); ``success`` is a nullable boolean, NULL = skipped.
        summary: one line for a UI, e.g. ``"fail: 1 failed (server_client_itl_agree); ..."``.
    """

    verdict: Verdict
    checks: pd.DataFrame
    summary: str


# ----------------------------------------------------------------------------- helpers
