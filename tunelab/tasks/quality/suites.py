"""The five quality suites: each turns one trial's tables into GX expectations on a frame (``_Plan``) or a
skipped check (``_Skip``). The expectation classes are passed in as ``gxe`` (``great_expectations.expectations``),
so importing this module does not import great-expectations; ``runner`` runs the plans."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tunelab.core.load_profiles import concurrency_target_kinds
from tunelab.core.quality_thresholds import QualityThresholds
from tunelab.tasks.measure import LOOP_LAG_NOTE_S, SAME_READ_NOTE_FRAC
from tunelab.tasks.quality.catalogue import (
    _GPU_IDLE_BIT,
    _GROUP_KEY,
    _MEASUREMENT_KEY,
    _OUTLIER_MIN_REQUESTS,
    _REQUIRED_COLUMNS,
    _THROTTLE_MASK,
    CHECKS,
    THROTTLE_REASON_BITS,
    QualityValidationError,
    Severity,
)

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


def _plan_windows(meas: pd.DataFrame | None, req: pd.DataFrame
                  ) -> tuple[pd.DataFrame | None, pd.DataFrame, int]:
    """The plan's own windows: ``(measurements, requests, search windows left out)`` without the windows of the
    plan's ``sla_search`` (``measurements.sla_search_window`` true, 019). The search pushes the server past its
    SLO on purpose and judges its levels by its own SLO bounds, so the load checks (error rate, achieved
    concurrency, client, repeat CV, outliers, warm-up) judge the plan's windows only; the integrity checks (nulls,
    signs, output lengths, server vs client) still read every window. The measurements frame is None when
    no window is left (as for a trial without measurements)."""
    if meas is None or "sla_search_window" not in meas.columns:
        return meas, req, 0
    search = _bool_obj(meas["sla_search_window"]).map(lambda v: v is True)
    if not search.any():
        return meas, req, 0
    keys = meas.loc[search, _MEASUREMENT_KEY].copy()
    keys["load_value"] = _num(keys["load_value"])
    keys["repeat"] = _num(keys["repeat"])
    keys["_search"] = True
    r = req[_MEASUREMENT_KEY].copy()
    r["load_value"] = _num(r["load_value"])
    r["repeat"] = _num(r["repeat"])
    hit = r.merge(keys.drop_duplicates(_MEASUREMENT_KEY), on=_MEASUREMENT_KEY, how="left")["_search"]
    hit = hit.fillna(False).astype(bool).to_numpy()
    own = meas[~search].reset_index(drop=True)
    return (own if len(own) else None), req[~hit].reset_index(drop=True), int(search.sum())



def _suite_requests(gxe: Any, req: pd.DataFrame, trial: Mapping[str, Any],
                    th: QualityThresholds, out: _Collector, rate_req: pd.DataFrame | None = None) -> None:
    """``rate_req``: the requests the error-rate checks count (the plan's own windows, :func:`_plan_windows`);
    default ``req``. Every other check reads ``req``."""
    rr = req if rate_req is None or rate_req.empty else rate_req
    ok = _bool_obj(rr["ok"])
    n, n_fail = len(rr), int((ok != True).sum())  # noqa: E712 - None counts as failed
    all_frame = pd.DataFrame({"ok": ok.map(lambda v: bool(v) if v is not None else False)})
    all_frame["label"] = _label(rr, _MEASUREMENT_KEY + ["request_index"]
                                if "request_index" in rr.columns else _MEASUREMENT_KEY)
    rate = n_fail / n if n else 0.0
    errors = ""
    if n_fail and "error" in rr.columns:
        top = rr.loc[~all_frame["ok"], "error"].astype(str).value_counts().head(3)
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

    okr = req[_bool_obj(req["ok"]) == True].reset_index(drop=True)  # noqa: E712
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
            # NULL arrives as None or NaN from a bundle's Parquet, as pd.NA from a DuckDB query (tunelab recheck)
            if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
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
             "client_cpu_frac", "host_not_busy", "client_not_bound", "no_compile_in_window")
    if meas is None:
        for name in names:
            out.skips.append(_Skip(name, "no measurements rows"))
        return
    m = meas.copy()
    for c in ("load_value", "ttft_p50_s", "tpot_p50_s", "achieved_concurrency",
              "client_cpu_frac"):
        m[c] = _num(m[c])
    m["host_other_cpu_frac"] = (_num(m["host_other_cpu_frac"]) if "host_other_cpu_frac" in m.columns
                                else pd.Series(np.nan, index=m.index))
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

    # Load kinds whose load_value is an in-flight target (fixed concurrency), by their load profile.
    conc = m[m["load_kind"].isin(concurrency_target_kinds()) & m["achieved_concurrency"].notna()
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
        # What the client kept in flight while it still had requests to send (``in_flight_while_sending``,
        # tunelab.tasks.metrics.in_flight): the load the server saw over the part of the window the rates and
        # percentiles count. The whole-window ``achieved_concurrency`` also counts the drain after the last send,
        # which no client can fill: 96 requests at c=64 with equal lengths spend ~45 % of the window draining
        # (H200, 8B: 0.77 x 64 over the window, 64.0 while sending). Rows without it (warehouses before schema
        # 005) keep the whole-window figure.
        kept = _num(conc["in_flight_while_sending"]) if "in_flight_while_sending" in conc.columns \
            else pd.Series(np.nan, index=conc.index)
        conc["concurrency_ratio"] = kept.fillna(_num(conc["achieved_concurrency"])) / target
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
    # Why: a boot measured while another program shared the host (a test run beside a CPU sweep) read 3-4 times
    # slower than its config's other boots and passed every other check (rule version 6).
    if m["host_other_cpu_frac"].notna().any():
        specs.append(_Spec("host_not_busy",
                           gxe.ExpectColumnValuesToBeBetween(column="host_other_cpu_frac",
                                                             max_value=th.max_host_other_cpu_frac),
                           f"<= {th.max_host_other_cpu_frac} of the host's CPU",
                           _worst(m, "host_other_cpu_frac")))
    else:
        out.skips.append(_Skip("host_not_busy", "host_other_cpu_frac not recorded",
                               f"<= {th.max_host_other_cpu_frac} of the host's CPU"))
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


def _clean_client(meas: pd.DataFrame) -> pd.Series:
    """Per measurement row: True when the client's own evidence says it kept up - ``client_bound`` is False,
    ``same_read_itl_frac`` <= ``SAME_READ_NOTE_FRAC`` and ``loop_lag_p99_s`` <= ``LOOP_LAG_NOTE_S`` (the
    limits above which tunelab.tasks.measure notes a window). A missing column or value is not clean (a
    warehouse older than schema 004 keeps the strict check)."""
    clean = _bool_obj(meas["client_bound"]).map(lambda v: v is False).astype(bool)  # a required column
    for col, limit in (("same_read_itl_frac", SAME_READ_NOTE_FRAC), ("loop_lag_p99_s", LOOP_LAG_NOTE_S)):
        if col not in meas.columns:
            return clean & False
        clean &= (_num(meas[col]) <= limit).fillna(False).astype(bool)  # NaN <= x is False
    return clean


_EVIDENCE_COLUMNS = ("client_cpu_frac", "same_read_itl_frac", "loop_lag_p99_s")


def _frontend_lag_observed(f: pd.DataFrame) -> str:
    """``server_frontend_lag``'s observed text: the attributed window with the largest excess over its allowed
    difference, with the client evidence that cleared the client."""
    lag = f[f["frontend_lag"]]
    if lag.empty:
        return "no window"
    w = (lag["excess_s"] / lag["allowed_diff_s"]).idxmax()
    r = lag.loc[w]
    same = _num(pd.Series([r.get("same_read_itl_frac")])).iloc[0]
    loop = _num(pd.Series([r.get("loop_lag_p99_s")])).iloc[0]
    cpu = _num(pd.Series([r.get("client_cpu_frac")])).iloc[0]
    more = f"{len(lag)} of {len(f)} window-metrics; worst: " if len(lag) > 1 else ""
    return (f"{more}client {r['what']} {_fmt(r['client_mean_s'])} s vs engine {_fmt(r['server_mean_s'])} s "
            f"({r['window']}): client not bound (thread {_fmt(cpu, 2)} cores), "
            f"{_fmt(same * 100, 2)} % of gaps in one read, loop lag p99 {_fmt(loop * 1000, 2)} ms: the server's "
            "API process delivered late (see window_diagnoses api_server)")


def _window_client_means(req: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per window (``workload, load_kind, load_value, repeat``): the client's TTFT and ITL means in seconds over
    every ok request of the window, the requests vLLM's histograms count between the scrapes around it.

    Columns ``window_ttft_mean_s`` (mean of ``requests.ttft_s``) and ``window_itl_mean_s`` (the requests'
    ``itl_mean_s`` weighted by their ``output_tokens - 1`` gaps: the mean over every gap of the window, exact when
    a chunk carries one token, as vLLM's ``vllm:inter_token_latency_seconds`` counts one observation per new
    token). Why not the measurement row's means: those count the window's steady part only (tunelab.tasks.metrics,
    since 2026-12), while the engine's histogram counts the ramp and the drain too; a window whose first wave is a
    burst of long prompts then reads a client "faster" than the engine (H200, 8B, 64 x 2,048-token prompts at
    c=64, ``--max-num-batched-tokens 2048``: steady-part client TTFT 0.31 s, every request 1.24 s, engine 1.22 s).
    None when ``req`` lacks the columns or has no ok request."""
    need = {"ok", "ttft_s", "itl_mean_s", "output_tokens"}
    if req is None or req.empty or not need <= set(req.columns):
        return None
    ok = req[_bool_obj(req["ok"]).map(lambda v: v is True).to_numpy()]
    if ok.empty:
        return None
    f = ok[_MEASUREMENT_KEY].copy()
    f["load_value"] = _num(f["load_value"])
    f["repeat"] = _num(f["repeat"])
    f["ttft"] = _num(ok["ttft_s"])
    gaps = (_num(ok["output_tokens"]) - 1).clip(lower=0)
    itl = _num(ok["itl_mean_s"])
    use = itl.notna() & (gaps > 0)
    f["gaps"] = gaps.where(use, 0.0)
    f["itl_x_gaps"] = (itl * gaps).where(use, 0.0)
    g = f.groupby(_MEASUREMENT_KEY, dropna=False)
    w = g["ttft"].mean().rename("window_ttft_mean_s").to_frame()
    n = g["gaps"].sum()
    w["window_itl_mean_s"] = (g["itl_x_gaps"].sum() / n).where(n > 0)
    return w.reset_index()


def _suite_server_vs_client(gxe: Any, meas: pd.DataFrame | None, sm: pd.DataFrame | None,
                            th: QualityThresholds, out: _Collector, req: pd.DataFrame | None = None) -> None:
    """Client TTFT/ITL means against vLLM's engine-side histograms, per window, over the same requests: the
    client's side is the mean over every ok request of the window (:func:`_window_client_means`; the measurement
    row's mean only where ``req`` cannot give it, e.g. no requests passed). With
    ``th.attribute_frontend_lag`` a window whose client is slower than the engine beyond the allowed difference
    while the client's own evidence is clean (``_clean_client``) is attributed to the server's frontend (its
    API process delivered late): it leaves the ``server_client_*_agree`` (fail) frame and is reported by
    ``server_frontend_lag`` (warn). A client faster than the engine, or one whose evidence is not clean, still
    fails the agree check."""
    pairs = (
        ("server_client_ttft_agree", "TTFT", "server_ttft", "ttft_mean_s",
         th.server_client_ttft_tolerance, th.server_client_ttft_floor_s),
        ("server_client_itl_agree", "ITL", "server_itl", "itl_mean_s",
         th.server_client_itl_tolerance, th.server_client_itl_floor_s),
    )
    whole = _window_client_means(req)
    lag_thr = ("client slower than engine beyond the agree check's allowed difference, with client not bound, "
               f"same_read_itl_frac <= {SAME_READ_NOTE_FRAC}, loop_lag_p99_s <= {LOOP_LAG_NOTE_S} s: none")
    judged: list[pd.DataFrame] = []
    for name, what, metric, client_col, rel, floor in pairs:
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
        cli["client_clean"] = _clean_client(meas)
        for col in _EVIDENCE_COLUMNS:
            if col in meas.columns:
                cli[col] = _num(meas[col])
        for df in (srv, cli):
            df["load_value"] = _num(df["load_value"])
            df["repeat"] = _num(df["repeat"])
        if whole is not None:  # every request of the window, as the engine's histogram counts them
            wcol = "window_" + client_col
            cli = cli.merge(whole[_MEASUREMENT_KEY + [wcol]], on=_MEASUREMENT_KEY, how="left")
            cli["client_mean_s"] = cli[wcol].fillna(cli["client_mean_s"])
            cli = cli.drop(columns=[wcol])
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
        # Client slower than the engine beyond the allowed difference, with a clean client: delay added after
        # the engine, by the server's API process (H200, one API server at c=256: client ITL 26-31 ms vs
        # engine 8.4-10.8 ms with the client idle at 0.07 of a core).
        slower = (j["client_mean_s"] - j["server_mean_s"]) > j["allowed_diff_s"]
        j["frontend_lag"] = (slower & j["client_clean"]).astype(bool) if th.attribute_frontend_lag \
            else False
        judged.append(j.assign(what=what, window=j["label"], label=what + " " + j["label"]))
        kept = j[~j["frontend_lag"]].reset_index(drop=True)
        if kept.empty:
            out.skips.append(_Skip(name, f"every window's {what} disagreement ({len(j)}) is attributed to the "
                                   "server's frontend (client slower, client evidence clean): see "
                                   "server_frontend_lag", thr))
            continue
        w = kept["excess_s"].idxmax()
        observed = (f"client {_fmt(kept.at[w, 'client_mean_s'])} s vs server "
                    f"{_fmt(kept.at[w, 'server_mean_s'])} s ({kept.at[w, 'label']})")
        if len(kept) < len(j):
            observed += f"; {len(j) - len(kept)} window(s) attributed to the server's frontend"
        out.plans.append(_Plan(kept.drop(columns=["client_clean", "frontend_lag"]), [_Spec(
            name,
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="allowed_diff_s",
                                                        column_B="abs_diff_s", or_equal=True),
            thr, observed)]))

    if not th.attribute_frontend_lag:
        out.skips.append(_Skip("server_frontend_lag", "attribute_frontend_lag is false: every disagreement "
                               "counts against server_client_*_agree", lag_thr))
    elif not judged:
        out.skips.append(_Skip("server_frontend_lag", "no window has both a client and a server TTFT or ITL "
                               "mean", lag_thr))
    else:
        f = pd.concat(judged, ignore_index=True)
        keep = ["label", "what", "window", "client_mean_s", "server_mean_s", "allowed_diff_s", "excess_s",
                "frontend_lag"] + [c for c in _EVIDENCE_COLUMNS if c in f.columns]
        f = f[keep]
        out.plans.append(_Plan(f, [_Spec(
            "server_frontend_lag",
            gxe.ExpectColumnValuesToBeInSet(column="frontend_lag", value_set=[False]),
            lag_thr, _frontend_lag_observed(f))]))

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
    ``outlier_request_ratio`` x the window's median and allow max(1, floor(frac x n)). In a window whose
    requests differ in length (prompt or output tokens: workloads of tunelab.core.workloads other than fixed), E2EL
    differs by design, so only TPOT counts there."""
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
        lengths_vary = any(c in g.columns and g[c].nunique() > 1 for c in ("prompt_tokens", "output_tokens"))
        for col in (("tpot", "tpot") if lengths_vary else ("e2el_s", "tpot")):
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
