"""Runs the quality suites with great-expectations and turns the results into ``quality_checks`` rows and a
verdict. great-expectations costs about 3 s to import, so it is imported inside the functions that run it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from tunelab.core.quality_thresholds import RULES_VERSION, QualityThresholds
from tunelab.tasks.quality import conditions as _conditions
from tunelab.tasks.quality import suites as _suites
from tunelab.tasks.quality.catalogue import (
    _REQUIRED_COLUMNS,
    CHECKS,
    QUALITY_CHECK_COLUMNS,
    QualityResult,
    QualityValidationError,
    Verdict,
)
from tunelab.tasks.quality.suites import _Plan, _Skip


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
        req = _suites._table(tables, "requests")
        if req is None:  # present with no rows: the requests_present check fails
            req = pd.DataFrame({c: pd.Series(dtype="float64")
                                for c in _REQUIRED_COLUMNS["requests"]})
        meas = _suites._table(tables, "measurements")
        sm = _suites._table(tables, "server_metrics")
        gpu = _suites._table(tables, "gpu_samples")

        import great_expectations.expectations as gxe

        # The plan's sla_search windows (overload on purpose, judged by the search's SLO bounds) are left out of
        # the load checks; the integrity checks read every window (suites._plan_windows).
        own_meas, own_req, _n_search = _suites._plan_windows(meas, req)
        out = _suites._Collector()
        _suites._suite_requests(gxe, req, trial, th, out, rate_req=own_req)
        _suites._suite_outliers(gxe, own_req, th, out)
        _suites._suite_aggregates(gxe, own_meas, th, out)
        _suites._suite_environment(gxe, gpu, trial, th, out)
        _suites._suite_server_vs_client(gxe, meas, sm, th, out, req=req)
        _suites._suite_warmup(gxe, own_req, th, out)
        _conditions.suite_conditions(gxe, meas, sm, out)  # cache_not_cold, overloaded
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
        checks["rule_version"] = RULES_VERSION  # the rules that judged it (quality_thresholds.RULE_VERSIONS)
        return QualityResult("unvalidated", checks, f"unvalidated: {text}")
    checks["rule_version"] = RULES_VERSION
    verdict = _verdict(checks)
    return QualityResult(verdict, checks, _summary(verdict, checks))
