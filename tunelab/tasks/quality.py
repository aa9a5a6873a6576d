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

great-expectations costs about 3 s to import, so it is imported inside ``validate_trial``
only. An ephemeral GX context is used, progress bars are off, nothing is written to disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import pynvml

from tunelab.quality_thresholds import QualityThresholds

__all__ = [
    "CHECKS",
    "QUALITY_CHECK_COLUMNS",
    "THROTTLE_REASON_BITS",
    "CheckInfo",
    "QualityResult",
    "QualityValidationError",
    "Verdict",
    "quality_markdown",
    "validate_trial",
]

Verdict = Literal["pass", "warn", "fail", "unvalidated"]
Severity = Literal["fail", "warn"]

QUALITY_CHECK_COLUMNS: tuple[str, ...] = (
    "trial_id",
    "suite",
    "expectation",
    "success",
    "severity",
    "observed",
    "threshold",
    "detail",
)
"""Columns of the ``quality_checks`` warehouse table, in schema order."""

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

_MEASUREMENT_KEY = ["workload", "load_kind", "load_value", "repeat"]
_GROUP_KEY = ["workload", "load_kind", "load_value"]
_OUTLIER_MIN_REQUESTS = 5
"""Smallest window ``no_outlier_cluster`` assesses: with 5 ok requests a cluster of two
outliers is still a minority, so the window median is a normal request."""

_REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "requests": (
        *_MEASUREMENT_KEY,
        "ok",
        "send_ts",
        "end_ts",
        "output_tokens",
        "requested_output_tokens",
        "ttft_s",
        "e2el_s",
        "itl_mean_s",
    ),
    "measurements": (
        *_MEASUREMENT_KEY,
        "ttft_p50_s",
        "tpot_p50_s",
        "ttft_mean_s",
        "itl_mean_s",
        "achieved_concurrency",
        "client_cpu_frac",
        "client_bound",
    ),
    "server_metrics": (*_MEASUREMENT_KEY, "metric", "kind", "value"),
    "gpu_samples": ("gpu_index", "ts", "sm_clock_mhz", "throttle_reasons"),
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
                                "achieved_concurrency / min(load_value, num_requests) >= "
                                "min_concurrency_ratio for load_kind = 'concurrency'"),
    "client_cpu_frac": _ci("aggregates", "ExpectColumnValuesToBeBetween", "warn",
                           "measurements.client_cpu_frac <= max_client_cpu_frac"),
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
                                    "|client ttft_mean_s - server TTFT mean| <= allowed"),
    "server_client_itl_agree": _ci("server_vs_client",
                                   "ExpectColumnPairValuesAToBeGreaterThanB", "fail",
                                   "|client itl_mean_s - server ITL mean| <= allowed"),
    "preemptions": _ci("server_vs_client", "ExpectColumnValuesToBeBetween", "warn",
                       "preemptions counter delta per measurement <= max_preemptions"),
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


@dataclass
class _Spec:
    """One expectation to run on a frame, with the metadata of its quality_checks row."""

    name: str
    expectation: Any  # a gxe.Expectation instance
    threshold: str
    observed: str | None = None
    severity: Severity | None = None  # default: CHECKS[name].severity


@dataclass
class _Plan:
    """A frame to validate with a list of expectations; ``label`` column names its rows."""

    frame: pd.DataFrame
    specs: list[_Spec]


@dataclass
class _Skip:
    name: str
    reason: str
    threshold: str = ""
    severity: Severity | None = None  # default: CHECKS[name].severity


@dataclass
class _Collector:
    plans: list[_Plan] = field(default_factory=list)
    skips: list[_Skip] = field(default_factory=list)


def _table(tables: Mapping[str, pd.DataFrame | None], name: str) -> pd.DataFrame | None:
    """The table, or None when missing or without rows; checks its required columns."""
    df = tables.get(name)
    if df is None or len(df) == 0:
        return None
    if not isinstance(df, pd.DataFrame):
        raise QualityValidationError(
            f"table '{name}' must be a pandas DataFrame, got {type(df).__name__}"
        )
    missing = [c for c in _REQUIRED_COLUMNS[name] if c not in df.columns]
    if missing:
        raise QualityValidationError(
            f"table '{name}' lacks column(s) {missing}; expected the columns of the "
            f"warehouse table '{name}' (tunelab/warehouse/schema/001_init.sql)"
        )
    return df.reset_index(drop=True)


def _num(s: pd.Series) -> pd.Series:
    """Float64 with NaN for missing (nullable Int64/boolean NA would break GX metrics)."""
    return pd.Series(
        pd.to_numeric(s, errors="coerce").to_numpy(dtype="float64", na_value=np.nan),
        index=s.index,
    )


def _bool_obj(s: pd.Series) -> pd.Series:
    """Object series of Python True/False/None."""
    return pd.Series(
        [None if (v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)))
         else bool(v) for v in s],
        index=s.index,
        dtype=object,
    )


def _label(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    def fmt(v: Any) -> str:
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return str(v)

    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    return pd.Series(["/".join(fmt(v) for v in row) for row in df[cols].itertuples(index=False)],
                     index=df.index, dtype=object)


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def _worst(frame: pd.DataFrame, col: str, largest: bool = True) -> str:
    s = frame[col].dropna()
    if s.empty:
        return "n/a"
    idx = s.idxmax() if largest else s.idxmin()
    return f"{'max' if largest else 'min'} {_fmt(float(s[idx]))} ({frame.at[idx, 'label']})"


def _is_cpu(trial: Mapping[str, Any]) -> bool:
    name = trial.get("gpu_name")
    return name is None or str(name).strip().lower() in ("", "cpu", "none")


def _present(trial: Mapping[str, Any], key: str) -> bool:
    v = trial.get(key)
    return v is not None and not (isinstance(v, float) and math.isnan(v))


# ----------------------------------------------------------------------------- suites


def _suite_requests(gxe: Any, req: pd.DataFrame, trial: Mapping[str, Any],
                    th: QualityThresholds, out: _Collector) -> None:
    ok = _bool_obj(req["ok"])
    n, n_fail = len(req), int((ok != True).sum())  # noqa: E712 - None counts as failed
    all_frame = pd.DataFrame({"ok": ok.map(lambda v: bool(v) if v is not None else False)})
    all_frame["label"] = _label(req, _MEASUREMENT_KEY + ["request_index"]
                                if "request_index" in req.columns else _MEASUREMENT_KEY)
    rate = n_fail / n if n else 0.0
    errors = ""
    if n_fail and "error" in req.columns:
        top = req.loc[~all_frame["ok"], "error"].astype(str).value_counts().head(3)
        errors = "; ".join(f"{k} x{v}" for k, v in top.items())
    observed_rate = f"{_fmt(rate)} ({n_fail}/{n})" + (f"; {errors}" if errors else "")
    out.plans.append(_Plan(all_frame, [
        _Spec("requests_present", gxe.ExpectTableRowCountToBeBetween(min_value=1),
              ">= 1 row", f"{n} rows"),
        _Spec("error_rate",
              gxe.ExpectColumnValuesToBeInSet(column="ok", value_set=[True],
                                              mostly=1.0 - th.max_error_rate),
              f"<= {th.max_error_rate}", observed_rate),
        _Spec("no_failed_requests",
              gxe.ExpectColumnValuesToBeInSet(column="ok", value_set=[True]),
              "0 failed", observed_rate),
    ]))

    okr = req[all_frame["ok"]].reset_index(drop=True)
    if okr.empty:
        for col in ("ttft_s", "e2el_s", "output_tokens", "send_ts", "end_ts"):
            out.skips.append(_Skip(f"{col}_not_null", "no ok request"))
        for name in ("ttft_s_positive", "itl_mean_s_non_negative",
                     "chunk_offsets_non_decreasing", "output_tokens_match_requested"):
            out.skips.append(_Skip(name, "no ok request"))
        return
    f = pd.DataFrame({c: _num(okr[c]) for c in
                      ("ttft_s", "e2el_s", "output_tokens", "send_ts", "end_ts", "itl_mean_s",
                       "requested_output_tokens")})
    f["label"] = _label(okr, _MEASUREMENT_KEY + (["request_index"]
                                                 if "request_index" in okr.columns else []))
    specs = [
        _Spec(f"{col}_not_null", gxe.ExpectColumnValuesToNotBeNull(column=col), "not null",
              f"{int(f[col].isna().sum())} null of {len(f)}")
        for col in ("ttft_s", "e2el_s", "output_tokens", "send_ts", "end_ts")
    ]
    specs.append(_Spec("ttft_s_positive",
                       gxe.ExpectColumnValuesToBeBetween(column="ttft_s", min_value=0,
                                                         strict_min=True),
                       "> 0 s", _worst(f, "ttft_s", largest=False)))
    if f["itl_mean_s"].notna().any():
        specs.append(_Spec("itl_mean_s_non_negative",
                           gxe.ExpectColumnValuesToBeBetween(column="itl_mean_s", min_value=0),
                           ">= 0 s", _worst(f, "itl_mean_s", largest=False)))
    else:
        out.skips.append(_Skip("itl_mean_s_non_negative",
                               "itl_mean_s is null for every ok request (single-token outputs?)",
                               ">= 0 s"))

    # chunk offsets -> ITL gaps
    offsets = okr["chunk_offsets_s"] if "chunk_offsets_s" in okr.columns else None
    mono: list[bool | None] = []
    if offsets is not None:
        for v in offsets:
            if v is None or (isinstance(v, float) and math.isnan(v)):
                mono.append(None)
                continue
            arr = np.asarray(v, dtype="float64")
            mono.append(bool(arr.size == 0 or (arr[0] >= 0 and np.all(np.diff(arr) >= 0))))
    if any(m is not None for m in mono):
        f["chunk_offsets_ok"] = pd.Series(mono, dtype=object)
        n_bad = sum(1 for m in mono if m is False)
        specs.append(_Spec("chunk_offsets_non_decreasing",
                           gxe.ExpectColumnValuesToBeInSet(column="chunk_offsets_ok",
                                                           value_set=[True]),
                           "every gap >= 0", f"{n_bad} of {len(f)} requests with a negative gap"))
    else:
        out.skips.append(_Skip("chunk_offsets_non_decreasing",
                               "no chunk_offsets_s recorded", "every gap >= 0"))

    # Fixed output lengths (ignore_eos): every ok request must return exactly
    # requested_output_tokens. Unless the trial says ignore_eos=True, a request that ended
    # with finish_reason 'stop' (a natural EOS, impossible under ignore_eos) is left out.
    has_req = f["requested_output_tokens"].notna()
    ignore_eos = bool(trial["ignore_eos"]) if _present(trial, "ignore_eos") else None
    if ignore_eos is not True and "finish_reason" in okr.columns:
        has_req &= okr["finish_reason"].astype(object).ne("stop").to_numpy()
    fixed = f[has_req].reset_index(drop=True)
    if ignore_eos is False:
        out.skips.append(_Skip("output_tokens_match_requested",
                               "trial ran without ignore_eos", "== requested_output_tokens"))
    elif fixed.empty:
        out.skips.append(_Skip("output_tokens_match_requested",
                               "no ok request with requested_output_tokens that was not "
                               "stopped by EOS", "== requested_output_tokens"))
    else:
        n_bad = int((fixed["output_tokens"] != fixed["requested_output_tokens"]).sum())
        out.plans.append(_Plan(fixed, [_Spec(
            "output_tokens_match_requested",
            gxe.ExpectColumnPairValuesToBeEqual(column_A="output_tokens",
                                                column_B="requested_output_tokens",
                                                ignore_row_if="either_value_is_missing"),
            "== requested_output_tokens", f"{n_bad} of {len(fixed)} differ")]))
    out.plans.append(_Plan(f, specs))


def _suite_aggregates(gxe: Any, meas: pd.DataFrame | None, th: QualityThresholds,
                      out: _Collector) -> None:
    names = ("repeats_for_cv", "cv_ttft_p50", "cv_tpot_p50", "achieved_concurrency",
             "client_cpu_frac", "client_not_bound", "no_compile_in_window")
    if meas is None:
        for name in names:
            out.skips.append(_Skip(name, "no measurements rows"))
        return
    m = meas.copy()
    for c in ("load_value", "ttft_p50_s", "tpot_p50_s", "achieved_concurrency",
              "client_cpu_frac"):
        m[c] = _num(m[c])
    m["label"] = _label(m, _MEASUREMENT_KEY)

    # repeat-to-repeat CV per (workload, load_kind, load_value)
    rows = []
    for key, g in m.groupby(_GROUP_KEY, sort=True, dropna=False):
        rec = dict(zip(_GROUP_KEY, key))
        rec["n_repeats"] = float(g["repeat"].nunique())
        for col, out_col in (("ttft_p50_s", "cv_ttft_p50"), ("tpot_p50_s", "cv_tpot_p50")):
            s = g[col].dropna()
            mean = s.mean() if len(s) else np.nan
            rec[out_col] = (float(s.std(ddof=1) / abs(mean))
                            if len(s) >= 2 and mean and not math.isnan(mean) else np.nan)
        rows.append(rec)
    groups = pd.DataFrame(rows)
    groups["label"] = _label(groups, _GROUP_KEY)
    few = groups[groups["n_repeats"] < 2]
    out.plans.append(_Plan(groups, [_Spec(
        "repeats_for_cv", gxe.ExpectColumnValuesToBeBetween(column="n_repeats", min_value=2),
        ">= 2 repeats",
        (f"cannot assess CV for {len(few)} of {len(groups)} groups with < 2 repeats"
         if len(few) else f"min {int(groups['n_repeats'].min())} repeats"))]))
    cv_specs = []
    for name, col, lim in (("cv_ttft_p50", "cv_ttft_p50", th.max_cv_p50_ttft),
                           ("cv_tpot_p50", "cv_tpot_p50", th.max_cv_p50_tpot)):
        if groups[col].notna().any():
            cv_specs.append(_Spec(name, gxe.ExpectColumnValuesToBeBetween(column=col,
                                                                          max_value=lim),
                                  f"<= {lim}", _worst(groups, col)))
        else:
            out.skips.append(_Skip(name, "no group has >= 2 repeats with a value", f"<= {lim}"))
    if cv_specs:
        out.plans.append(_Plan(groups, cv_specs))

    conc = m[(m["load_kind"] == "concurrency") & m["achieved_concurrency"].notna()
             & (m["load_value"] > 0)].reset_index(drop=True)
    if conc.empty:
        out.skips.append(_Skip("achieved_concurrency",
                               "no load_kind='concurrency' measurement with achieved_concurrency",
                               f">= {th.min_concurrency_ratio} x target"))
    else:
        # target as in tunelab/tasks/metrics.py: a measurement of n < load_value requests can keep
        # at most n in flight.
        target = conc["load_value"]
        if "num_requests" in conc.columns:
            target = np.fmin(target, _num(conc["num_requests"]))
        conc["concurrency_ratio"] = conc["achieved_concurrency"] / target
        out.plans.append(_Plan(conc, [_Spec(
            "achieved_concurrency",
            gxe.ExpectColumnValuesToBeBetween(column="concurrency_ratio",
                                              min_value=th.min_concurrency_ratio),
            f">= {th.min_concurrency_ratio} x target",
            "ratio " + _worst(conc, "concurrency_ratio", largest=False))]))

    specs = []
    if m["client_cpu_frac"].notna().any():
        specs.append(_Spec("client_cpu_frac",
                           gxe.ExpectColumnValuesToBeBetween(column="client_cpu_frac",
                                                             max_value=th.max_client_cpu_frac),
                           f"<= {th.max_client_cpu_frac}", _worst(m, "client_cpu_frac")))
    else:
        out.skips.append(_Skip("client_cpu_frac", "client_cpu_frac not recorded",
                               f"<= {th.max_client_cpu_frac}"))
    bound = _bool_obj(m["client_bound"])
    if bound.notna().any():
        m["client_bound"] = bound
        n_bound = int(bound.map(lambda v: v is True).sum())
        detail = f"{n_bound} of {int(bound.notna().sum())} measurements client-bound"
        if n_bound and "in_flight_while_sending" in m.columns:
            # The evidence the verdict rests on, for the first bound window.
            i = bound.map(lambda v: v is True).idxmax()
            detail += (f" (first: {m.at[i, 'label']}, client CPU {_fmt(m.at[i, 'client_cpu_frac'])}, "
                       f"in flight while sending {_fmt(_num(m['in_flight_while_sending'])[i])} of "
                       f"{_fmt(m.at[i, 'load_value'])})")
        specs.append(_Spec("client_not_bound",
                           gxe.ExpectColumnValuesToBeInSet(column="client_bound",
                                                           value_set=[False]),
                           "false", detail))
    else:
        out.skips.append(_Skip("client_not_bound", "client_bound not recorded", "false"))
    comp = (_bool_obj(m["compile_during_window"]) if "compile_during_window" in m.columns
            else pd.Series([None] * len(m), index=m.index, dtype=object))
    if comp.notna().any():
        m["compile_during_window"] = comp
        hit = comp.map(lambda v: v is True)
        specs.append(_Spec("no_compile_in_window",
                           gxe.ExpectColumnValuesToBeInSet(column="compile_during_window",
                                                           value_set=[False]),
                           "false",
                           f"{int(hit.sum())} of {int(comp.notna().sum())} measurements compiled"
                           + (f" ({', '.join(m.loc[hit, 'label'].head(3))})" if hit.any() else "")))
    else:
        out.skips.append(_Skip("no_compile_in_window",
                               "compile_during_window not recorded (server log not read)", "false"))
    if specs:
        out.plans.append(_Plan(m, specs))


def _suite_environment(gxe: Any, gpu: pd.DataFrame | None, trial: Mapping[str, Any],
                       th: QualityThresholds, out: _Collector) -> None:
    throttle_sev: Severity = "fail" if th.forbid_throttling else "warn"
    if _is_cpu(trial):
        reason = f"no GPU (gpu_name={trial.get('gpu_name')!r})"
        for name in ("gpu_clean_at_boot", "no_foreign_gpu_processes", "gpu_baseline_excess",
                     "no_throttling", "sm_clock_stable"):
            out.skips.append(_Skip(name, reason, severity=throttle_sev
                                   if name == "no_throttling" else None))
        return

    row: dict[str, list[Any]] = {"label": [str(trial.get("gpu_name"))]}
    specs = []
    if _present(trial, "gpu_clean_at_boot"):
        row["gpu_clean_at_boot"] = [bool(trial["gpu_clean_at_boot"])]
        specs.append(_Spec("gpu_clean_at_boot",
                           gxe.ExpectColumnValuesToBeInSet(column="gpu_clean_at_boot",
                                                           value_set=[True]),
                           "true", str(bool(trial["gpu_clean_at_boot"])).lower()))
    else:
        out.skips.append(_Skip("gpu_clean_at_boot", "trial has no gpu_clean_at_boot", "true"))
    if _present(trial, "foreign_gpu_processes"):
        row["foreign_gpu_processes"] = [float(trial["foreign_gpu_processes"])]
        specs.append(_Spec("no_foreign_gpu_processes",
                           gxe.ExpectColumnValuesToBeBetween(column="foreign_gpu_processes",
                                                             max_value=0),
                           "== 0", str(int(trial["foreign_gpu_processes"]))))
    else:
        out.skips.append(_Skip("no_foreign_gpu_processes",
                               "trial has no foreign_gpu_processes", "== 0"))
    lim = th.max_gpu_baseline_excess_mib
    if _present(trial, "gpu_baseline_excess_mib"):
        row["gpu_baseline_excess_mib"] = [float(trial["gpu_baseline_excess_mib"])]
        specs.append(_Spec("gpu_baseline_excess",
                           gxe.ExpectColumnValuesToBeBetween(column="gpu_baseline_excess_mib",
                                                             max_value=lim),
                           f"<= {lim} MiB", f"{_fmt(float(trial['gpu_baseline_excess_mib']))} MiB"))
    else:
        out.skips.append(_Skip("gpu_baseline_excess", "trial has no gpu_baseline_excess_mib",
                               f"<= {lim} MiB"))
    if specs:
        out.plans.append(_Plan(pd.DataFrame(row), specs))

    if gpu is None:
        out.skips.append(_Skip("no_throttling", "no gpu_samples recorded", "no throttle bit",
                               throttle_sev))
        out.skips.append(_Skip("sm_clock_stable", "no gpu_samples recorded",
                               f"CV <= {th.max_sm_clock_cv}"))
        return
    g = gpu.copy()
    g["label"] = g["gpu_index"].astype(str).radd("gpu ") + g["ts"].map(lambda t: f" @{t}")
    reasons = _num(g["throttle_reasons"])
    if reasons.notna().any():
        bits = reasons.fillna(0).astype("int64")
        g["throttle_bits"] = (bits & _THROTTLE_MASK).astype("float64")
        g.loc[reasons.isna(), "throttle_bits"] = np.nan
        seen = int(np.bitwise_or.reduce(bits.to_numpy() & _THROTTLE_MASK)) if len(bits) else 0
        names = [k for k, b in THROTTLE_REASON_BITS.items() if seen & b]
        n_thr = int((g["throttle_bits"] > 0).sum())
        out.plans.append(_Plan(g, [_Spec(
            "no_throttling",
            gxe.ExpectColumnValuesToBeInSet(column="throttle_bits", value_set=[0]),
            "no throttle bit",
            f"{n_thr} of {int(reasons.notna().sum())} samples" + (f": {', '.join(names)}"
                                                                  if names else ""),
            severity=throttle_sev)]))
    else:
        out.skips.append(_Skip("no_throttling", "throttle_reasons not recorded",
                               "no throttle bit", throttle_sev))

    g["sm_clock_mhz"] = _num(g["sm_clock_mhz"])
    busy = g[g["sm_clock_mhz"].notna()]
    busy = busy[(reasons.loc[busy.index].fillna(0).astype("int64") & _GPU_IDLE_BIT) == 0]
    rows = []
    for idx, s in busy.groupby("gpu_index")["sm_clock_mhz"]:
        if len(s) >= 2 and s.mean() > 0:
            rows.append({"label": f"gpu {idx}", "sm_clock_cv": float(s.std(ddof=1) / s.mean())})
    if rows:
        cv = pd.DataFrame(rows)
        out.plans.append(_Plan(cv, [_Spec(
            "sm_clock_stable",
            gxe.ExpectColumnValuesToBeBetween(column="sm_clock_cv", max_value=th.max_sm_clock_cv),
            f"CV <= {th.max_sm_clock_cv}", "CV " + _worst(cv, "sm_clock_cv"))]))
    else:
        out.skips.append(_Skip("sm_clock_stable", "fewer than 2 non-idle SM clock samples per GPU",
                               f"CV <= {th.max_sm_clock_cv}"))


def _suite_server_vs_client(gxe: Any, meas: pd.DataFrame | None, sm: pd.DataFrame | None,
                            th: QualityThresholds, out: _Collector) -> None:
    pairs = (
        ("server_client_ttft_agree", "server_ttft", "ttft_mean_s",
         th.server_client_ttft_tolerance, th.server_client_ttft_floor_s),
        ("server_client_itl_agree", "server_itl", "itl_mean_s",
         th.server_client_itl_tolerance, th.server_client_itl_floor_s),
    )
    for name, metric, client_col, rel, floor in pairs:
        thr = f"<= max({rel} x server, {floor} s)"
        if sm is None or meas is None:
            out.skips.append(_Skip(name, "no server_metrics rows" if sm is None
                                   else "no measurements rows", thr))
            continue
        srv = sm[(sm["metric"] == metric) & (sm["kind"] == "histogram")].copy()
        srv["server_mean_s"] = _num(srv["value"])
        srv = srv[srv["server_mean_s"].notna()]
        if srv.empty:
            out.skips.append(_Skip(name, f"no '{metric}' histogram value in server_metrics "
                                   "(metric absent in this vLLM version?)", thr))
            continue
        cli = meas[_MEASUREMENT_KEY + [client_col]].copy()
        cli["client_mean_s"] = _num(cli[client_col])
        for df in (srv, cli):
            df["load_value"] = _num(df["load_value"])
            df["repeat"] = _num(df["repeat"])
        j = cli.merge(srv[_MEASUREMENT_KEY + ["server_mean_s"]], on=_MEASUREMENT_KEY, how="inner")
        j = j[j["client_mean_s"].notna()].reset_index(drop=True)
        if j.empty:
            out.skips.append(_Skip(name, f"no measurement has both client {client_col} and "
                                   f"server {metric}", thr))
            continue
        j["label"] = _label(j, _MEASUREMENT_KEY)
        j["abs_diff_s"] = (j["client_mean_s"] - j["server_mean_s"]).abs()
        j["allowed_diff_s"] = np.maximum(rel * j["server_mean_s"], floor)
        j["excess_s"] = j["abs_diff_s"] - j["allowed_diff_s"]
        w = j["excess_s"].idxmax()
        observed = (f"client {_fmt(j.at[w, 'client_mean_s'])} s vs server "
                    f"{_fmt(j.at[w, 'server_mean_s'])} s ({j.at[w, 'label']})")
        out.plans.append(_Plan(j, [_Spec(
            name,
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="allowed_diff_s",
                                                        column_B="abs_diff_s", or_equal=True),
            thr, observed)]))

    thr = f"<= {th.max_preemptions}"
    if sm is None:
        out.skips.append(_Skip("preemptions", "no server_metrics rows", thr))
        return
    p = sm[(sm["metric"] == "preemptions") & (sm["kind"] == "counter_delta")].copy()
    p["preemptions"] = _num(p["value"])
    p = p[p["preemptions"].notna()].reset_index(drop=True)
    if p.empty:
        out.skips.append(_Skip("preemptions", "no 'preemptions' counter_delta in server_metrics",
                               thr))
        return
    p["label"] = _label(p, _MEASUREMENT_KEY)
    out.plans.append(_Plan(p, [_Spec(
        "preemptions",
        gxe.ExpectColumnValuesToBeBetween(column="preemptions", max_value=th.max_preemptions),
        thr, f"total {int(p['preemptions'].sum())}, " + _worst(p, "preemptions"))]))


def _ok_requests(req: pd.DataFrame, cols: tuple[str, ...]) -> pd.DataFrame:
    """The ok requests with ``cols`` as float64 (NaN for missing)."""
    okr = req[_bool_obj(req["ok"]) == True].copy()  # noqa: E712
    for c in cols:
        okr[c] = _num(okr[c])
    return okr


def _suite_outliers(gxe: Any, req: pd.DataFrame, th: QualityThresholds, out: _Collector) -> None:
    """``no_outlier_cluster``: per window, count the ok requests whose E2EL or TPOT is above
    ``outlier_request_ratio`` x the window's median and allow max(1, floor(frac x n))."""
    m, frac = th.outlier_request_ratio, th.max_outlier_request_frac
    thr = f"<= max(1, floor({frac} x n)) requests > {m:g}x window median E2EL or TPOT"
    okr = _ok_requests(req, ("e2el_s", "ttft_s", "output_tokens"))
    # TPOT as tunelab/tasks/metrics.py: (E2EL - TTFT) / (output_tokens - 1); the stored column wins.
    derived = (okr["e2el_s"] - okr["ttft_s"]) / (okr["output_tokens"] - 1)
    derived = derived.where(okr["output_tokens"] > 1)
    okr["tpot"] = (_num(okr["tpot_s"]).fillna(derived) if "tpot_s" in okr.columns
                   else derived)
    rows = []
    for key, g in okr.groupby(_MEASUREMENT_KEY, sort=True, dropna=False):
        if len(g) < _OUTLIER_MIN_REQUESTS:
            continue
        ratios = []
        for col in ("e2el_s", "tpot"):
            med = g[col].median()
            ratios.append(g[col] / med if med and med > 0 else pd.Series(np.nan, index=g.index))
        ratio = np.fmax(ratios[0], ratios[1])  # NaN only where both are NaN
        n = len(g)
        rec = dict(zip(_MEASUREMENT_KEY, key))
        rec.update(n=float(n), n_outliers=float((ratio > m).sum()),
                   allowed_outliers=float(max(1, math.floor(frac * n + 1e-9))),
                   max_ratio=float(ratio.max()) if ratio.notna().any() else np.nan)
        rows.append(rec)
    if not rows:
        out.skips.append(_Skip("no_outlier_cluster",
                               f"no window has >= {_OUTLIER_MIN_REQUESTS} ok requests", thr))
        return
    w = pd.DataFrame(rows)
    w["label"] = _label(w, _MEASUREMENT_KEY)
    worst = w.assign(_e=w["n_outliers"] - w["allowed_outliers"]).sort_values(
        ["_e", "n_outliers", "max_ratio"], ascending=False, kind="stable").index[0]
    observed = (f"{int(w.at[worst, 'n_outliers'])} of {int(w.at[worst, 'n'])} requests "
                f"> {m:g}x median (allowed {int(w.at[worst, 'allowed_outliers'])}), largest "
                f"{_fmt(w.at[worst, 'max_ratio'])}x ({w.at[worst, 'label']})")
    out.plans.append(_Plan(w, [_Spec(
        "no_outlier_cluster",
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="allowed_outliers",
                                                    column_B="n_outliers", or_equal=True),
        thr, observed)]))


def _suite_warmup(gxe: Any, req: pd.DataFrame, th: QualityThresholds, out: _Collector) -> None:
    """The slowest of the first k requests of each window against the rest of the window:
    allowed is max(ratio x median of the rest, p90 of the rest). The max, not a median of
    the first k, so that one cold request is caught; the rest's p90 (nearest lower rank, so
    the single slowest of the rest never sets it) so that a first request no slower than
    the window's normal tail is not flagged, whatever one random slow request does."""
    k, ratio = th.warmup_first_k, th.warmup_slowdown_ratio
    thr = f"each of first {k} <= max({ratio} x median, p90) of the rest"
    okr = _ok_requests(req, ("send_ts", "ttft_s", "e2el_s"))
    okr = okr[okr["send_ts"].notna()]
    rows = []
    for key, g in okr.groupby(_MEASUREMENT_KEY, sort=True, dropna=False):
        g = g.sort_values("send_ts", kind="stable")
        if len(g) < 2 * k:
            continue
        first, rest = g.iloc[:k], g.iloc[k:]
        rec: dict[str, Any] = dict(zip(_MEASUREMENT_KEY, key))
        for col in ("ttft", "e2el"):
            a, b = first[f"{col}_s"].dropna(), rest[f"{col}_s"].dropna().to_numpy()
            if a.empty or b.size == 0:
                continue
            med, p90 = float(np.median(b)), float(np.quantile(b, 0.9, method="lower"))
            rec[f"{col}_first_max_s"] = float(a.max())
            rec[f"{col}_allowed_s"] = max(ratio * med, p90)
            rec[f"{col}_rest_median_s"] = med
            rec[f"{col}_rest_p90_s"] = p90
        rows.append(rec)
    if not rows:
        for name in ("warmup_ttft_settled", "warmup_e2el_settled"):
            out.skips.append(_Skip(name, f"no measurement has >= {2 * k} ok requests", thr))
        return
    w = pd.DataFrame(rows)
    w["label"] = _label(w, _MEASUREMENT_KEY)
    for name, col in (("warmup_ttft_settled", "ttft"), ("warmup_e2el_settled", "e2el")):
        a_col, b_col = f"{col}_allowed_s", f"{col}_first_max_s"
        f = (w[w[a_col].notna() & w[b_col].notna()].reset_index(drop=True)
             if a_col in w.columns else w.iloc[0:0])
        if f.empty or not (f[f"{col}_rest_median_s"] > 0).any():
            out.skips.append(_Skip(name, f"{col.upper()} of the first {k} or of the rest "
                                   "could not be read", thr))
            continue
        f["_excess"] = (f[b_col] / f[a_col]).where(f[a_col] > 0)
        i = f["_excess"].idxmax() if f["_excess"].notna().any() else 0
        r = f.loc[i]
        med = float(r[f"{col}_rest_median_s"])
        rel = [_fmt(float(r[c]) / med if med > 0 else float("nan")) + "x"
               for c in (b_col, a_col, f"{col}_rest_p90_s")]
        observed = (f"first {k} max {rel[0]} rest median, allowed {rel[1]} "
                    f"(rest p90 {rel[2]}) ({r['label']})")
        out.plans.append(_Plan(f.drop(columns="_excess"), [_Spec(
            name,
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A=a_col, column_B=b_col,
                                                        or_equal=True),
            thr, observed)]))


# ----------------------------------------------------------------------------- GX runner


def _exception_messages(info: Any) -> list[str]:
    """Collect exception messages from a GX ``exception_info`` (flat or keyed by metric)."""
    if not isinstance(info, dict):
        return []
    if "raised_exception" in info:
        return [str(info.get("exception_message"))] if info.get("raised_exception") else []
    msgs: list[str] = []
    for v in info.values():
        msgs.extend(_exception_messages(v))
    return msgs


def _failing_labels(frame: pd.DataFrame, result: dict[str, Any], limit: int = 5) -> str:
    idx = result.get("partial_unexpected_index_list") or []
    if not idx or "label" not in frame.columns:
        return ""
    labels = [str(frame["label"].iloc[i]) for i in idx[:limit] if 0 <= int(i) < len(frame)]
    more = int(result.get("unexpected_count") or len(idx)) - len(labels)
    return ", ".join(labels) + (f" (+{more} more)" if more > 0 else "")


def _run_plans(plans: list[_Plan], skips: list[_Skip], trial_id: str) -> pd.DataFrame:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    datasource = context.data_sources.add_pandas(name="tunelab_quality")
    # One asset and batch definition, a new dataframe per batch: adding assets re-serialises
    # the (in-memory) project config each time, which cost ~20 ms per frame.
    batch_def = datasource.add_dataframe_asset(name="frame").add_batch_definition_whole_dataframe(
        "whole"
    )
    rows: list[dict[str, Any]] = []
    for i, plan in enumerate(plans):
        by_name = {s.name: s for s in plan.specs}
        for s in plan.specs:
            s.expectation.meta = {"check": s.name}
        batch = batch_def.get_batch(batch_parameters={"dataframe": plan.frame})
        suite = gx.ExpectationSuite(name=f"suite_{i}",
                                    expectations=[s.expectation for s in plan.specs])
        # BASIC is ~25 % cheaper than SUMMARY but has no row indices; the few failed
        # expectations are re-run with SUMMARY to name the failing rows in `detail`.
        results = list(batch.validate(suite, result_format="BASIC").results)
        rerun = [s.expectation for s in plan.specs
                 if any(not er.success and (er.expectation_config.meta or {}).get("check")
                        == s.name for er in results)]
        if rerun and "label" in plan.frame.columns:
            again = batch.validate(gx.ExpectationSuite(name=f"suite_{i}_failed",
                                                       expectations=rerun),
                                   result_format="SUMMARY").results
            names = {(er.expectation_config.meta or {}).get("check") for er in again}
            results = [er for er in results
                       if (er.expectation_config.meta or {}).get("check") not in names]
            results += list(again)
        for er in results:
            name = (er.expectation_config.meta or {}).get("check")
            spec = by_name[name]
            errs = _exception_messages(er.exception_info)
            if errs:
                raise QualityValidationError(
                    f"great-expectations raised on check '{name}' "
                    f"({er.expectation_config.type}): {errs[0]}"
                )
            info = CHECKS[name]
            result = dict(er.result or {})
            observed = spec.observed
            if observed is None:
                observed = str(result.get("observed_value", result.get("unexpected_count", "")))
            detail = info.description
            if not er.success:
                failing = _failing_labels(plan.frame, result)
                if failing:
                    detail += f"; failing: {failing}"
            rows.append({
                "trial_id": trial_id,
                "suite": info.suite,
                "expectation": name,
                "success": bool(er.success),
                "severity": spec.severity or info.severity,
                "observed": observed,
                "threshold": spec.threshold,
                "detail": f"[{er.expectation_config.type}] {detail}",
            })
    for sk in skips:
        info = CHECKS[sk.name]
        rows.append({
            "trial_id": trial_id, "suite": info.suite, "expectation": sk.name,
            "success": None, "severity": sk.severity or info.severity, "observed": None,
            "threshold": sk.threshold or None, "detail": f"skipped: {sk.reason}",
        })
    return _checks_frame(rows)


def _checks_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    order = {name: i for i, name in enumerate(CHECKS)}
    df = pd.DataFrame(rows, columns=list(QUALITY_CHECK_COLUMNS))
    df["success"] = df["success"].astype("boolean")
    if len(df):
        df = df.iloc[df["expectation"].map(order).argsort(kind="stable")].reset_index(drop=True)
    return df


def _verdict(checks: pd.DataFrame) -> Verdict:
    failed = checks[checks["success"] == False]  # noqa: E712 - NA (skipped) excluded
    if (failed["severity"] == "fail").any():
        return "fail"
    if (failed["severity"] == "warn").any():
        return "warn"
    return "pass"


def _summary(verdict: Verdict, checks: pd.DataFrame) -> str:
    failed = checks[checks["success"] == False]  # noqa: E712
    hard = failed[failed["severity"] == "fail"]["expectation"].tolist()
    soft = failed[failed["severity"] == "warn"]["expectation"].tolist()
    n_skip = int(checks["success"].isna().sum())
    n_pass = int((checks["success"] == True).sum())  # noqa: E712
    parts = [f"{verdict}:"]
    if hard:
        parts.append(f"{len(hard)} failed ({', '.join(hard)});")
    if soft:
        parts.append(f"{len(soft)} warned ({', '.join(soft)});")
    parts.append(f"{n_pass} passed, {n_skip} skipped of {len(checks)} checks")
    return " ".join(parts)


# ----------------------------------------------------------------------------- public API


def validate_trial(
    tables: Mapping[str, pd.DataFrame | None],
    trial: Mapping[str, Any],
    thresholds: QualityThresholds | None = None,
) -> QualityResult:
    """Run the quality suites over one trial and return its verdict.

    Args:
        tables: frames with the columns of the warehouse tables of the same name
            (``tunelab/warehouse/schema/001_init.sql``): ``requests`` (required), ``measurements``,
            ``server_metrics``, ``gpu_samples`` (each optional; missing, None or empty means
            the checks needing it are skipped). Times in seconds, memory in MiB.
            ``server_metrics`` rows used: ``metric`` in ``server_ttft``/``server_itl``
            with ``kind='histogram'`` (``value`` = window mean in s, from vLLM's
            ``vllm:time_to_first_token_seconds`` / ``vllm:inter_token_latency_seconds``)
            and ``metric='preemptions'`` with ``kind='counter_delta'``
            (``vllm:num_preemptions_total``).
        trial: the ``trials`` row as a dict. Used: ``trial_id`` (else taken from
            ``requests.trial_id``), ``status`` (only ``'ok'`` trials are validated),
            ``gpu_name`` (``'cpu'``/empty = no GPU: GPU checks skipped), optional
            ``gpu_clean_at_boot: bool``, ``foreign_gpu_processes: int``,
            ``gpu_baseline_excess_mib: float``, and ``ignore_eos: bool`` (False skips the
            fixed-output-length check; otherwise every ok request with a
            ``requested_output_tokens`` is expected to return exactly that many tokens).
        thresholds: limits; ``QualityThresholds()`` defaults when None.

    Returns:
        ``QualityResult``. Never raises for bad input or GX errors: those give verdict
        ``'unvalidated'`` with the error text in ``summary`` and a single
        ``validation_completed`` row in ``checks``.
    """
    th = thresholds if thresholds is not None else QualityThresholds()
    trial_id = str(trial.get("trial_id") or "")
    try:
        req_raw = tables.get("requests")
        if not trial_id and isinstance(req_raw, pd.DataFrame) and "trial_id" in req_raw.columns \
                and len(req_raw):
            trial_id = str(req_raw["trial_id"].iloc[0])
        if not trial_id:
            raise QualityValidationError("trial has no 'trial_id' (and requests has none)")
        if "status" not in trial:
            raise QualityValidationError(f"trial {trial_id}: the trials row has no 'status'")
        if trial["status"] != "ok":
            raise QualityValidationError(
                f"trial status is {trial['status']!r}, not 'ok': nothing measured to validate"
            )
        if req_raw is None:
            raise QualityValidationError(
                "table 'requests' is missing: pass tables['requests'] (may have 0 rows)"
            )
        if not isinstance(req_raw, pd.DataFrame):
            raise QualityValidationError(
                f"table 'requests' must be a pandas DataFrame, got {type(req_raw).__name__}"
            )
        req = _table(tables, "requests")
        if req is None:  # present with no rows: the requests_present check fails
            req = pd.DataFrame({c: pd.Series(dtype="float64")
                                for c in _REQUIRED_COLUMNS["requests"]})
        meas = _table(tables, "measurements")
        sm = _table(tables, "server_metrics")
        gpu = _table(tables, "gpu_samples")

        import great_expectations.expectations as gxe

        out = _Collector()
        _suite_requests(gxe, req, trial, th, out)
        _suite_outliers(gxe, req, th, out)
        _suite_aggregates(gxe, meas, th, out)
        _suite_environment(gxe, gpu, trial, th, out)
        _suite_server_vs_client(gxe, meas, sm, th, out)
        _suite_warmup(gxe, req, th, out)
        checks = _run_plans(out.plans, out.skips, trial_id)
    except Exception as exc:  # noqa: BLE001 - any failure of validation -> 'unvalidated'
        text = f"{type(exc).__name__}: {exc}"
        checks = _checks_frame([])
        checks = pd.concat([checks, pd.DataFrame([{
            "trial_id": trial_id or None, "suite": "validation",
            "expectation": "validation_completed", "success": False, "severity": "fail",
            "observed": "error", "threshold": "completes", "detail": text,
        }])], ignore_index=True)
        checks["success"] = checks["success"].astype("boolean")
        return QualityResult("unvalidated", checks, f"unvalidated: {text}")
    verdict = _verdict(checks)
    return QualityResult(verdict, checks, _summary(verdict, checks))


def _md_cell(v: Any) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v).replace("|", "\\|").replace("\n", " ")


def quality_markdown(result: QualityResult) -> str:
    """Markdown for a Prefect artifact: the verdict, the summary line, and a table of the
    checks that failed or warned (skipped checks are counted, not listed).

    Args:
        result: a ``QualityResult`` from ``validate_trial``.

    Returns:
        Markdown text (GitHub table syntax, ``|`` in cells escaped).
    """
    c = result.checks
    lines = [f"**Quality: {result.verdict.upper()}** - {_md_cell(result.summary)}", ""]
    bad = c[c["success"] == False]  # noqa: E712
    if len(bad):
        bad = bad.assign(_o=bad["severity"].map({"fail": 0, "warn": 1}).fillna(2))
        bad = bad.sort_values("_o", kind="stable")
        lines += ["| severity | suite | check | observed | threshold | detail |",
                  "|---|---|---|---|---|---|"]
        for r in bad.itertuples(index=False):
            lines.append("| " + " | ".join(_md_cell(x) for x in (
                r.severity, r.suite, r.expectation, r.observed, r.threshold, r.detail)) + " |")
    else:
        lines.append("No check failed or warned.")
    n_skip = int(c["success"].isna().sum())
    if n_skip:
        skipped = ", ".join(c.loc[c["success"].isna(), "expectation"].astype(str))
        lines += ["", f"Skipped ({n_skip}): {skipped}"]
    return "\n".join(lines) + "\n"

