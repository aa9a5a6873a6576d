"""Tests of the measurement quality gates (tunelab/tasks/quality/, tunelab/core/quality_thresholds.py).

Tables are built in memory with the warehouse column names; each gate is shown to pass on
a clean synthetic trial and to fail on data crafted to break exactly that gate.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pydantic
import pytest

from tunelab.tasks import quality
from tunelab.tasks.quality import (
    CHECKS,
    QUALITY_CHECK_COLUMNS,
    QualityResult,
    quality_markdown,
    validate_trial,
)
from tunelab.core.quality_thresholds import QualityThresholds

REPO = Path(__file__).resolve().parents[1]
HW_THERMAL = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap (not throttling for this gate)
TRIAL_ID = "sweep-1/cfg-abc/r0"


@pytest.fixture(scope="module", autouse=True)
def gx_imported():
    """Import great-expectations once for this module (about 3 s)."""
    import great_expectations

    return great_expectations


def make_trial(**over):
    trial = {
        "trial_id": TRIAL_ID,
        "status": "ok",
        "gpu_name": "NVIDIA H200",
        "gpu_clean_at_boot": True,
        "foreign_gpu_processes": 0,
        "gpu_baseline_excess_mib": 12.0,
    }
    trial.update(over)
    return trial


def make_tables(repeats=3, n_req=12, concurrency=4, out_tokens=32, ttft=0.05, itl=0.01,
                server_ttft=0.045, server_itl=0.0095):
    """A clean trial: one workload at one concurrency, `repeats` repeats of `n_req` requests."""
    reqs, meas, sm = [], [], []
    t0 = 1_700_000_000.0
    for r in range(repeats):
        for i in range(n_req):
            send = t0 + r * 100 + i * 0.1
            j = 1.0 + 0.01 * ((i * 7 + r) % 5)  # small deterministic jitter
            t, gap = ttft * j, itl * j
            offsets = [t + k * gap for k in range(out_tokens)]
            e2el = offsets[-1]
            reqs.append({
                "trial_id": TRIAL_ID, "workload": "chat", "load_kind": "concurrency",
                "load_value": float(concurrency), "repeat": r, "request_index": i, "ok": True,
                "error": None, "send_ts": send, "first_token_ts": send + t, "end_ts": send + e2el,
                "chunk_offsets_s": offsets, "prompt_tokens": 80, "output_tokens": out_tokens,
                "requested_output_tokens": out_tokens, "finish_reason": "length",
                "ttft_s": t, "tpot_s": (e2el - t) / (out_tokens - 1), "e2el_s": e2el,
                "itl_mean_s": gap,
            })
        key = {"trial_id": TRIAL_ID, "workload": "chat", "load_kind": "concurrency",
               "load_value": float(concurrency), "repeat": r}
        meas.append({**key, "num_requests": n_req, "completed": n_req, "failed": 0,
                     "ttft_mean_s": ttft, "ttft_p50_s": ttft * (1 + 0.02 * r),
                     "tpot_p50_s": itl * (1 + 0.01 * r), "itl_mean_s": itl,
                     "achieved_concurrency": concurrency * 0.97, "client_cpu_frac": 0.3,
                     "host_other_cpu_frac": 0.01,
                     "client_bound": False, "compile_during_window": False,
                     "unique_prompts": True, "prefix_cache_reset": "ok", "overloaded": False})
        sm += [
            {**key, "metric": "server_ttft", "kind": "histogram", "value": server_ttft,
             "count": n_req, "sum": server_ttft * n_req},
            {**key, "metric": "server_itl", "kind": "histogram", "value": server_itl,
             "count": n_req * (out_tokens - 1), "sum": server_itl * n_req * (out_tokens - 1)},
            {**key, "metric": "preemptions", "kind": "counter_delta", "value": 0.0,
             "count": None, "sum": None},
            {**key, "metric": "prefix_cache_queries", "kind": "counter_delta", "value": 80.0 * n_req,
             "count": None, "sum": None},
            {**key, "metric": "prefix_cache_hits", "kind": "counter_delta", "value": 0.0,
             "count": None, "sum": None},
        ]
    gpu = pd.DataFrame({
        "trial_id": TRIAL_ID, "ts": t0 + np.arange(40) * 0.5, "gpu_index": 0,
        "memory_used_mib": 120_000.0, "utilization_pct": 95.0,
        "sm_clock_mhz": 1980.0 - 15.0 * (np.arange(40) % 3),
        "throttle_reasons": np.where(np.arange(40) % 4 == 0, SW_POWER_CAP, 0).astype("int64"),
    })
    return {"requests": pd.DataFrame(reqs), "measurements": pd.DataFrame(meas),
            "server_metrics": pd.DataFrame(sm), "gpu_samples": gpu}


def failed(result: QualityResult) -> dict[str, str]:
    c = result.checks
    bad = c[c["success"] == False]  # noqa: E712
    return dict(zip(bad["expectation"], bad["severity"]))


def skipped(result: QualityResult) -> set[str]:
    c = result.checks
    return set(c.loc[c["success"].isna(), "expectation"])


# ------------------------------------------------------------------ good data


def test_clean_trial_passes_every_check():
    res = validate_trial(make_tables(), make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary
    assert list(res.checks.columns) == list(QUALITY_CHECK_COLUMNS)
    assert set(res.checks["expectation"]) == set(CHECKS)  # every check ran
    assert res.checks["success"].eq(True).all(), res.checks[~res.checks["success"].eq(True)]
    assert (res.checks["trial_id"] == TRIAL_ID).all()
    assert res.summary.startswith("pass:") and "\n" not in res.summary


def test_nullable_dtypes_from_a_loader_still_validate():
    tables = {k: v.convert_dtypes() for k, v in make_tables().items()}
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary


# ------------------------------------------------------------------ each gate fails on bad data


def _set(table, col, value, rows=slice(0, 1)):
    def mutate(t):
        df = t[table]
        idx = df.index[rows]
        df[col] = df[col].astype(object) if isinstance(value, list) else df[col]
        for i in idx:
            df.at[i, col] = value
    return mutate


def _compiled_in_window(t):
    # The server log of the first window shows a JIT compilation (tunelab/tasks/measure.py read it); the rest none.
    m = t["measurements"]
    m["compile_during_window"] = [True] + [False] * (len(m) - 1)
    m["compile_log_lines"] = ["WARNING [jit_monitor.py:103] Triton kernel JIT compilation during inference"] + \
        [None] * (len(m) - 1)


def _engine_saw_it(t, repeat):
    """The engine's TTFT histogram of window ``repeat`` after its requests' TTFTs changed: vLLM times the same
    requests (server_client_ttft_agree compares over every request of the window), 0.9 x the client's mean as in
    make_tables."""
    req, sm = t["requests"], t["server_metrics"]
    mean = req.loc[req["repeat"] == repeat, "ttft_s"].mean()
    sm.loc[(sm["repeat"] == repeat) & (sm["metric"] == "server_ttft"), "value"] = 0.9 * mean


def _first_k_slower(col, factor):
    def mutate(t):
        df = t["requests"]
        first = df[(df["repeat"] == 0) & (df["request_index"] < 3)].index
        df.loc[first, col] = df.loc[first, col] * factor
        if col == "ttft_s":
            _engine_saw_it(t, 0)
    return mutate


def _stall(rows, factor=20.0, cols=("e2el_s", "tpot_s"), repeat=1):
    """Requests `rows` (request_index) of one window stalled: `cols` x `factor`."""
    def mutate(t):
        df = t["requests"]
        idx = df[(df["repeat"] == repeat) & df["request_index"].isin(list(rows))].index
        assert len(idx) == len(list(rows))
        for col in cols:
            df.loc[idx, col] = df.loc[idx, col] * factor
        if "ttft_s" in cols:
            _engine_saw_it(t, repeat)
    return mutate


def _client_evidence(t, client_bound=False, same_read=0.0, loop_lag=0.0011, cpu=0.07):
    """The client-evidence columns of ``measurements`` (schema 004) on every window; default: the H200 client's
    figures (not bound, thread 0.07 of a core, no gap in one read, loop lag p99 1.1 ms)."""
    m = t["measurements"]
    m["client_bound"] = client_bound
    m["same_read_itl_frac"] = same_read
    m["loop_lag_p99_s"] = loop_lag
    m["client_cpu_frac"] = cpu


def _h200_frontend_lag(t, client_itl=0.0262, server_itl=0.00927, **evidence):
    """One API server at concurrency 256 on an H200: client ITL 26.2 ms vs vLLM's engine-side ITL 9.27 ms, the
    client healthy by its own evidence (every request of the window and its steady part alike)."""
    t["measurements"]["itl_mean_s"] = client_itl
    t["requests"]["itl_mean_s"] = client_itl
    sm = t["server_metrics"]
    sm.loc[sm["metric"] == "server_itl", "value"] = server_itl
    _client_evidence(t, **evidence)


def _cache_not_taken(t):
    """The report behind cache_not_cold: a reset answered 200 with success=false, and the next window of unique
    prompts hit 128 of 256 queried tokens."""
    sm, m = t["server_metrics"], t["measurements"]
    first = sm["repeat"] == 1
    sm.loc[first & (sm["metric"] == "prefix_cache_queries"), "value"] = 256.0
    sm.loc[first & (sm["metric"] == "prefix_cache_hits"), "value"] = 128.0
    m.loc[m["repeat"] == 1, "prefix_cache_reset"] = "not_taken: the server answered 200 with success=false"


def _throttle(t):
    t["gpu_samples"].loc[5:8, "throttle_reasons"] = HW_THERMAL | SW_POWER_CAP


def _clock_swings(t):
    g = t["gpu_samples"]
    g["sm_clock_mhz"] = np.where(np.arange(len(g)) % 2 == 0, 1980.0, 1100.0)


CASES = {
    # name: (mutation of tables, mutation of trial, thresholds, expected failed {check: severity})
    "requests_present": (lambda t: t.update(requests=t["requests"].iloc[0:0]), {}, {},
                         {"requests_present": "fail"}),
    "error_rate": (_set("requests", "ok", False, slice(0, 3)), {}, {},
                   {"error_rate": "fail", "no_failed_requests": "warn"}),
    "no_failed_requests": (_set("requests", "ok", False), {}, {"max_error_rate": 0.05},
                           {"no_failed_requests": "warn"}),
    "ttft_s_not_null": (_set("requests", "ttft_s", np.nan), {}, {}, {"ttft_s_not_null": "fail"}),
    "e2el_s_not_null": (_set("requests", "e2el_s", np.nan), {}, {}, {"e2el_s_not_null": "fail"}),
    "output_tokens_not_null": (_set("requests", "output_tokens", np.nan), {}, {},
                               {"output_tokens_not_null": "fail"}),
    "send_ts_not_null": (_set("requests", "send_ts", np.nan), {}, {}, {"send_ts_not_null": "fail"}),
    "end_ts_not_null": (_set("requests", "end_ts", np.nan), {}, {}, {"end_ts_not_null": "fail"}),
    "ttft_s_positive": (_set("requests", "ttft_s", 0.0), {}, {}, {"ttft_s_positive": "fail"}),
    "itl_mean_s_non_negative": (_set("requests", "itl_mean_s", -0.001), {}, {},
                                {"itl_mean_s_non_negative": "fail"}),
    "chunk_offsets_non_decreasing": (_set("requests", "chunk_offsets_s", [0.05, 0.07, 0.06]), {},
                                     {}, {"chunk_offsets_non_decreasing": "fail"}),
    "output_tokens_match_requested": (_set("requests", "output_tokens", 20), {}, {},
                                      {"output_tokens_match_requested": "fail"}),
    "cv_ttft_p50": (_set("measurements", "ttft_p50_s", 0.15, slice(2, 3)), {}, {},
                    {"cv_ttft_p50": "warn"}),
    "cv_tpot_p50": (_set("measurements", "tpot_p50_s", 0.03, slice(2, 3)), {}, {},
                    {"cv_tpot_p50": "warn"}),
    "achieved_concurrency": (_set("measurements", "achieved_concurrency", 2.0), {}, {},
                             {"achieved_concurrency": "fail"}),
    "client_cpu_frac": (_set("measurements", "client_cpu_frac", 0.85), {}, {},
                        {"client_cpu_frac": "warn"}),
    # another program took 30 % of the host's CPU in one window (a test run beside a CPU sweep read 19-36 %)
    "host_not_busy": (_set("measurements", "host_other_cpu_frac", 0.3, slice(1, 2)), {}, {},
                      {"host_not_busy": "fail"}),
    "client_not_bound": (_set("measurements", "client_bound", True), {}, {},
                         {"client_not_bound": "fail"}),
    "no_compile_in_window": (_compiled_in_window, {}, {}, {"no_compile_in_window": "warn"}),
    "gpu_clean_at_boot": (None, {"gpu_clean_at_boot": False}, {}, {"gpu_clean_at_boot": "fail"}),
    "no_foreign_gpu_processes": (None, {"foreign_gpu_processes": 1}, {},
                                 {"no_foreign_gpu_processes": "fail"}),
    "gpu_baseline_excess": (None, {"gpu_baseline_excess_mib": 2048.0}, {},
                            {"gpu_baseline_excess": "warn"}),
    "no_throttling": (_throttle, {}, {}, {"no_throttling": "fail"}),
    "no_throttling_allowed": (_throttle, {}, {"forbid_throttling": False},
                              {"no_throttling": "warn"}),
    "sm_clock_stable": (_clock_swings, {}, {}, {"sm_clock_stable": "warn"}),
    # the engine slower than every request the client timed (a client faster than the engine is never the
    # frontend's doing): the first window only
    "server_client_ttft_agree": (_set("server_metrics", "value", 0.5, slice(0, 1)), {}, {},
                                 {"server_client_ttft_agree": "fail"}),
    "server_client_itl_agree": (_set("server_metrics", "value", 0.05, slice(1, 2)), {}, {},
                                {"server_client_itl_agree": "fail"}),
    "server_frontend_lag": (_h200_frontend_lag, {}, {}, {"server_frontend_lag": "warn"}),
    "preemptions": (_set("server_metrics", "value", 5.0, slice(2, 3)), {}, {},
                    {"preemptions": "warn"}),
    "warmup_ttft_settled": (_first_k_slower("ttft_s", 5.0), {}, {}, {"warmup_ttft_settled": "warn"}),
    "warmup_e2el_settled": (_first_k_slower("e2el_s", 3.0), {}, {}, {"warmup_e2el_settled": "warn"}),
    "no_outlier_cluster": (_stall(range(4, 8)), {}, {}, {"no_outlier_cluster": "warn"}),
    "cache_not_cold": (_cache_not_taken, {}, {}, {"cache_not_cold": "warn"}),
    "overloaded": (_set("measurements", "overloaded", True, slice(1, 2)), {}, {}, {"overloaded": "warn"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_gate_fails_on_crafted_bad_data(case):
    mutate_tables, trial_over, th, expected = CASES[case]
    tables = make_tables()
    if mutate_tables:
        mutate_tables(tables)
    res = validate_trial(tables, make_trial(**trial_over), QualityThresholds(**th))
    assert failed(res) == expected, res.checks[res.checks["success"] != True]  # noqa: E712
    want = "fail" if "fail" in expected.values() else "warn"
    assert res.verdict == want
    for name in expected:
        assert name in res.summary
        assert name in quality_markdown(res)


def test_every_check_has_a_bad_data_case():
    covered = set()
    for *_, expected in CASES.values():
        covered |= set(expected)
    covered.add("repeats_for_cv")  # test_single_repeat_cannot_assess_cv
    assert covered == set(CHECKS)


def test_a_busy_host_fails_under_rule_version_6_and_passed_under_5():
    """v6 added host_not_busy; v5's behaviour (``restores``: 1.0) passes the same boot, as `recheck` shows."""
    from tunelab.core.quality_thresholds import RULE_VERSIONS

    tables = make_tables()
    _set("measurements", "host_other_cpu_frac", 0.3, slice(1, 2))(tables)
    v6 = validate_trial(tables, make_trial(), QualityThresholds())
    v5 = validate_trial(tables, make_trial(), QualityThresholds(**RULE_VERSIONS[-1].restores))
    assert RULE_VERSIONS[-1].version == 6 and failed(v6) == {"host_not_busy": "fail"} and v6.verdict == "fail"
    assert failed(v5) == {} and v5.verdict == "pass"
    assert "0.3" in _row(v6, "host_not_busy")["observed"]


def test_single_repeat_cannot_assess_cv():
    res = validate_trial(make_tables(repeats=1), make_trial(), QualityThresholds())
    assert failed(res) == {"repeats_for_cv": "warn"}
    assert {"cv_ttft_p50", "cv_tpot_p50"} <= skipped(res)
    assert res.verdict == "warn"
    row = res.checks.set_index("expectation").loc["repeats_for_cv"]
    assert "cannot assess" in row["observed"]


def _h200_8b_burst_window(t):
    """H200, 8B, 2,048-token prompts at c=64 with --max-num-batched-tokens 2048: the first wave, a burst of long
    prompts, waited up to 3.4 s for its first token (every request of the window 1.24 s on average); the steady part
    after it 0.31 s. The measurement row counts the steady part (tunelab.tasks.metrics), vLLM's histogram every
    request of the window."""
    t["requests"]["ttft_s"] = 1.24
    t["measurements"]["ttft_mean_s"] = 0.31
    t["server_metrics"].loc[t["server_metrics"]["metric"] == "server_ttft", "value"] = 1.22


def test_server_and_client_are_compared_over_the_same_requests():
    """Every request of the window agrees with the engine (1.24 s vs 1.22 s) although the steady part's mean
    (0.31 s) does not: pass. The reverse - the window's requests disagree, the steady-part row agrees - fails: the
    check reads the requests."""
    tables = make_tables()
    _h200_8b_burst_window(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary
    assert _row(res, "server_client_ttft_agree")["success"] == True  # noqa: E712
    tables = make_tables()
    tables["measurements"]["ttft_mean_s"] = 1.24  # the row agrees ...
    tables["server_metrics"].loc[tables["server_metrics"]["metric"] == "server_ttft", "value"] = 1.22
    res = validate_trial(tables, make_trial(), QualityThresholds())  # ... the requests (0.05 s) do not
    assert failed(res) == {"server_client_ttft_agree": "fail"}
    assert "client 0.05" in _row(res, "server_client_ttft_agree")["observed"]


def test_window_itl_mean_weights_each_request_by_its_gaps():
    """ITL over every gap of the window: a 2-token request at 0.5 s and 31 requests of 31 gaps at 0.01 s average
    (0.5 x 1 + 0.01 x 31 x 11) / (1 + 31 x 11) = 0.0115 s, within tolerance of an engine at 0.0095 s; an
    unweighted mean of request means (0.05 s) would fail."""
    tables = make_tables()
    req = tables["requests"]
    first = req.index[(req["repeat"] == 0)][0]
    req.loc[first, ["output_tokens", "requested_output_tokens", "itl_mean_s"]] = [2, 2, 0.5]
    req["itl_mean_s"] = req["itl_mean_s"].where(req.index == first, 0.01)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert "server_client_itl_agree" not in failed(res), res.summary
    req.loc[req.index != first, "output_tokens"] = 2  # now the 0.5 s gap weighs as much as any other
    req.loc[req.index != first, "requested_output_tokens"] = 2
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res).get("server_client_itl_agree") == "fail", res.summary


def test_without_request_columns_the_measurement_row_is_compared():
    tables = make_tables()
    _h200_8b_burst_window(tables)
    from tunelab.tasks.quality import suites
    out = suites._Collector()
    import great_expectations.expectations as gxe
    suites._suite_server_vs_client(gxe, tables["measurements"], tables["server_metrics"], QualityThresholds(),
                                   out, req=None)
    ttft = [p for p in out.plans if p.specs[0].name == "server_client_ttft_agree"]
    assert ttft and "client 0.31 s vs server 1.22 s" in ttft[0].specs[0].observed


def test_a_drain_after_the_last_send_is_not_a_concurrency_fail():
    """H200, 8B, 96 requests of equal length at c=64: 64.0 in flight while sending, 0.77 x 64 over the whole
    window (the last 32 requests drain with nobody to replace them): pass. While sending 0.8 x 64: fail."""
    tables = make_tables(concurrency=64, n_req=96)
    m = tables["measurements"]
    m["achieved_concurrency"] = 49.4
    m["in_flight_while_sending"] = 64.0
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert "achieved_concurrency" not in failed(res), res.summary
    assert _row(res, "achieved_concurrency")["success"] == True  # noqa: E712 - judged, not skipped
    m.loc[1, "in_flight_while_sending"] = 51.2
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res).get("achieved_concurrency") == "fail"
    assert "chat/concurrency/64/1" in _row(res, "achieved_concurrency")["detail"]
    m["in_flight_while_sending"] = np.nan  # an older row: the whole-window figure is judged
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res).get("achieved_concurrency") == "fail"


def test_failing_groups_are_named_in_detail():
    tables = make_tables()
    tables["measurements"].loc[1, "achieved_concurrency"] = 1.0
    res = validate_trial(tables, make_trial(), QualityThresholds())
    detail = res.checks.set_index("expectation").loc["achieved_concurrency", "detail"]
    assert "chat/concurrency/4/1" in detail


# ------------------------------------------------------------------ within a window


def _row(res, name):
    return res.checks.set_index("expectation").loc[name]


@pytest.mark.parametrize("col", ["ttft_s", "e2el_s"])
def test_one_cold_first_request_is_flagged(col):
    """One first request 20x slower than the rest: the median of the first 3 hides it, the
    check must not."""
    tables = make_tables(n_req=16)
    _stall([0], cols=(col,), repeat=0)(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    name = f"warmup_{col[:4]}_settled"
    assert failed(res) == {name: "warn"}, res.checks[res.checks["success"] != True]  # noqa: E712
    row = _row(res, name)
    m = re.match(r"first 3 max ([0-9.]+)x rest median, allowed 2x", row["observed"])
    assert m and float(m.group(1)) > 15, row["observed"]
    assert row["observed"].endswith("(chat/concurrency/4/0)")
    assert "failing: chat/concurrency/4/0" in row["detail"]


def test_slow_request_in_the_middle_is_not_a_warmup_problem():
    tables = make_tables(n_req=16)
    _stall([8], cols=("ttft_s", "e2el_s", "tpot_s"), repeat=0)(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary  # one slow request is not a cluster either


def test_slow_first_request_no_worse_than_the_window_tail_passes():
    """The first request is 3x the rest's median (above warmup_slowdown_ratio), but the window
    has slow requests in the middle of that size too (its p90): its normal tail, not warm-up."""
    tables = make_tables(n_req=16)
    _stall([0], factor=3.0, cols=("ttft_s", "e2el_s"), repeat=0)(tables)
    _stall([5, 9, 13], factor=3.5, cols=("ttft_s", "e2el_s"), repeat=0)(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary
    # without the slow tail the same first request is flagged
    tables = make_tables(n_req=16)
    _stall([0], factor=3.0, cols=("ttft_s", "e2el_s"), repeat=0)(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res) == {"warmup_ttft_settled": "warn", "warmup_e2el_settled": "warn"}


def test_one_random_slow_request_does_not_hide_a_cold_first_request():
    """The rest's tail is its p90 at the nearest lower rank: a single slow request elsewhere
    in the window does not raise it to the cold first request's level."""
    tables = make_tables(n_req=16)
    _stall([0, 9], cols=("ttft_s",), repeat=0)(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res) == {"warmup_ttft_settled": "warn"}


@pytest.mark.parametrize("cols", [("e2el_s", "tpot_s"), ("e2el_s",), ("tpot_s",)])
def test_four_of_sixteen_stalled_requests_are_flagged(cols):
    tables = make_tables(n_req=16)
    _stall(range(6, 10), cols=cols)(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res) == {"no_outlier_cluster": "warn"}, res.summary
    row = _row(res, "no_outlier_cluster")
    assert row["observed"].startswith("4 of 16 requests > 10x median (allowed 1), largest 20")
    assert row["observed"].endswith("(chat/concurrency/4/1)")
    assert "failing: chat/concurrency/4/1" in row["detail"] and "(+" not in row["detail"]


def test_long_answers_of_a_window_of_varying_lengths_are_not_outliers():
    """A workload of varying lengths (tunelab.core.workloads): four answers 20x longer take 20x the E2EL at the same
    TPOT; that is the workload, not a stall. The same four at one length are outliers."""
    tables = make_tables(n_req=16)
    _stall(range(6, 10), cols=("e2el_s", "output_tokens"))(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert "no_outlier_cluster" not in failed(res), res.summary
    assert _row(res, "no_outlier_cluster")["observed"].startswith("0 of 16")
    tables = make_tables(n_req=16)
    _stall(range(6, 10), cols=("e2el_s",))(tables)
    assert failed(validate_trial(tables, make_trial(), QualityThresholds())) == {"no_outlier_cluster": "warn"}


def test_clean_window_of_sixteen_passes():
    res = validate_trial(make_tables(n_req=16), make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary
    row = _row(res, "no_outlier_cluster")
    assert row["success"] == True and row["observed"].startswith("0 of 16")  # noqa: E712


def test_outlier_allowance_scales_with_the_window():
    """One outlier is always allowed; a window of 64 allows floor(0.05 x 64) = 3."""
    tables = make_tables(n_req=16)
    _stall([6])(tables)
    assert validate_trial(tables, make_trial(), QualityThresholds()).verdict == "pass"
    tables = make_tables(n_req=64)
    _stall([10, 20, 30])(tables)
    assert validate_trial(tables, make_trial(), QualityThresholds()).verdict == "pass"
    _stall([40])(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res) == {"no_outlier_cluster": "warn"}
    assert _row(res, "no_outlier_cluster")["observed"].startswith("4 of 64")
    # below outlier_request_ratio nothing is an outlier; a lower ratio makes them count
    tables = make_tables(n_req=16)
    _stall(range(6, 10), factor=8.0)(tables)
    assert validate_trial(tables, make_trial(), QualityThresholds()).verdict == "pass"
    res = validate_trial(tables, make_trial(), QualityThresholds(outlier_request_ratio=5.0))
    assert failed(res) == {"no_outlier_cluster": "warn"}


def test_small_windows_are_not_assessed_for_outlier_clusters():
    res = validate_trial(make_tables(n_req=4), make_trial(), QualityThresholds())
    assert "no_outlier_cluster" in skipped(res)


# The two noisiest windows of real CPU-runtime trials on a shared 2-core host (seconds, in
# send order): 2 of 8 requests at 7.3x and 6.9x the median TPOT; one request at 28.9x TPOT
# and 11.7x E2EL in a window with bursty delivery. Normal for that runtime: not a cluster.
REAL_CPU_WINDOWS = {
    "long_summary c=1": dict(
        ttft_s=[0.36238, 0.42381, 0.11337, 0.13445, 0.09056, 0.40544, 0.38997, 0.09368],
        e2el_s=[0.83791, 4.01916, 0.61756, 0.34049, 1.19442, 0.79742, 3.74831, 0.5187],
        tpot_s=[0.00755, 0.05707, 0.008, 0.00327, 0.01752, 0.00622, 0.05331, 0.00675]),
    "short_chat c=4": dict(
        ttft_s=[0.02781, 0.12177, 0.12233, 0.12276, 0.03543, 0.03446, 0.03419, 0.03407,
                0.24658, 0.33777, 0.35412, 0.5379, 0.12224, 0.18356, 0.06779, 0.04909],
        e2el_s=[0.12464, 0.12497, 0.12477, 0.12464, 0.10933, 0.10825, 0.10795, 0.10782,
                0.24768, 0.35411, 0.5385, 0.79876, 0.50467, 0.44414, 0.26037, 2.18421],
        tpot_s=[0.00312, 0.0001, 8e-05, 6e-05, 0.00238, 0.00238, 0.00238, 0.00238,
                4e-05, 0.00053, 0.00595, 0.00841, 0.01234, 0.00841, 0.00621, 0.06887]),
}


@pytest.mark.parametrize("window", list(REAL_CPU_WINDOWS))
def test_real_cpu_runtime_window_is_not_an_outlier_cluster(window):
    values = REAL_CPU_WINDOWS[window]
    tables = make_tables(repeats=1, n_req=len(values["ttft_s"]))
    for col, v in values.items():
        tables["requests"][col] = v
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert _row(res, "no_outlier_cluster")["success"] == True, res.summary  # noqa: E712


def test_h200_evidence_has_no_outlier_cluster_and_settled_warmup():
    """Every window of the committed H200 evidence (24 trials, 192 windows of 12-64 requests)
    passes the within-window checks with the default thresholds."""
    req = pd.concat([pd.read_parquet(REPO / "evidence" / d / "warehouse" / "requests.parquet")
                     for d in ("h200-2026-11-29", "h200-2026-11-29-versions")], ignore_index=True)
    req["workload"] = req["trial_id"] + "/" + req["workload"]  # windows of all trials at once
    assert req.groupby(quality._MEASUREMENT_KEY).ngroups == 192
    res = validate_trial({"requests": req}, make_trial(gpu_name="cpu"), QualityThresholds())
    for name in ("no_outlier_cluster", "warmup_ttft_settled", "warmup_e2el_settled"):
        assert _row(res, name)["success"] == True, _row(res, name)  # noqa: E712


# ------------------------------------------------------------------ bursty delivery


def test_bursty_delivery_fails():
    """Tokens reach the client in one lump at the end: client ITL ~0, client TTFT ~ E2EL,
    while vLLM's /metrics saw TTFT 23 ms and ITL 3 ms (figures seen on the CPU runtime)."""
    tables = make_tables(server_ttft=0.0228, server_itl=0.003)
    req = tables["requests"]
    lump = req["e2el_s"]
    req["ttft_s"] = lump - 0.002
    req["itl_mean_s"] = 0.00008
    req["chunk_offsets_s"] = [[e - 0.002 + k * 0.00008 for k in range(32)] for e in lump]
    m = tables["measurements"]
    m["ttft_mean_s"] = float(lump.mean()) - 0.002
    m["itl_mean_s"] = 0.00008
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "fail"
    f = failed(res)
    assert f["server_client_itl_agree"] == "fail"
    assert f["server_client_ttft_agree"] == "fail"


# ------------------------------------------------------------------ server frontend lag (attributed disagreement)


def test_h200_single_api_server_window_is_frontend_lag_not_a_fail():
    """The H200 window: client ITL 0.0262 s vs engine 0.00927 s, client not bound, no gap in one read, loop lag
    p99 1.1 ms. The delay was added after the engine by vLLM's API process: warn, not fail."""
    tables = make_tables()
    _h200_frontend_lag(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "warn", res.summary
    assert failed(res) == {"server_frontend_lag": "warn"}
    assert "server_client_itl_agree" in skipped(res)  # every window attributed: nothing left to judge
    itl = _row(res, "server_client_itl_agree")
    assert "attributed to the server's frontend" in itl["detail"]
    lag = _row(res, "server_frontend_lag")
    assert lag["severity"] == "warn" and lag["suite"] == "server_vs_client"
    for text in ("client ITL 0.0262 s vs engine 0.00927 s (chat/concurrency/4/", "thread 0.07 cores",
                 "0 % of gaps in one read", "loop lag p99 1.1 ms", "window_diagnoses api_server"):
        assert text in lag["observed"], lag["observed"]
    assert "ITL chat/concurrency/4/0" in lag["detail"]  # the failing rows are named
    assert _row(res, "server_client_ttft_agree")["success"] == True  # noqa: E712 - TTFT agreed: judged
    assert "server_frontend_lag" in quality_markdown(res)


def test_h200_ttft_window_is_frontend_lag_not_a_fail():
    """TTFT likewise: one window read client TTFT mean 0.405 s vs server 0.256 s."""
    tables = make_tables(ttft=0.405, server_ttft=0.256)
    _client_evidence(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "warn", res.summary
    assert failed(res) == {"server_frontend_lag": "warn"}
    assert "server_client_ttft_agree" in skipped(res)
    # the client's mean over every request of the worst window: 0.405 s with make_tables' jitter of <= 4 %
    assert re.search(r"client TTFT 0\.4[01]\d* s vs engine 0\.256 s", _row(res, "server_frontend_lag")["observed"])


def _drop_evidence(t, cols=("same_read_itl_frac", "loop_lag_p99_s")):
    _h200_frontend_lag(t)
    t["measurements"] = t["measurements"].drop(columns=list(cols))


def _null_evidence(col):
    def mutate(t):
        _h200_frontend_lag(t)
        t["measurements"][col] = np.nan if col != "client_bound" else None
    return mutate


NOT_ATTRIBUTED = {
    "client_bound": (lambda t: _h200_frontend_lag(t, client_bound=True), {}),
    "bursty_same_read": (lambda t: _h200_frontend_lag(t, same_read=0.4), {}),
    "loop_lag": (lambda t: _h200_frontend_lag(t, loop_lag=0.02), {}),
    "client_faster": (lambda t: _h200_frontend_lag(t, client_itl=0.004, server_itl=0.02), {}),
    "no_evidence_columns": (_drop_evidence, {}),
    "null_same_read": (_null_evidence("same_read_itl_frac"), {}),
    "null_loop_lag": (_null_evidence("loop_lag_p99_s"), {}),
    "null_client_bound": (_null_evidence("client_bound"), {}),
    "attribution_off": (_h200_frontend_lag, {"attribute_frontend_lag": False}),
}


@pytest.mark.parametrize("case", list(NOT_ATTRIBUTED))
def test_disagreement_not_attributed_to_the_frontend_still_fails(case):
    """A client that was bound, delivered in lumps (40 % of gaps in one read), woke late, was faster than the
    engine, or has no (or null) evidence, or attribution turned off: the ITL disagreement fails as before."""
    mutate, th = NOT_ATTRIBUTED[case]
    tables = make_tables()
    mutate(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds(**th))
    assert res.verdict == "fail", res.summary
    f = failed(res)
    assert f["server_client_itl_agree"] == "fail"
    assert "server_frontend_lag" not in f
    if case == "attribution_off":
        assert f == {"server_client_itl_agree": "fail"}  # today's behaviour: nothing else changes
        assert "server_frontend_lag" in skipped(res)
    else:
        assert _row(res, "server_frontend_lag")["observed"] == "no window"


def test_only_the_clean_window_is_attributed():
    """Repeat 1's client was bound: that window still fails the agree check (and is the one named); repeats 0
    and 2 are attributed to the frontend."""
    tables = make_tables()
    _h200_frontend_lag(tables)
    tables["measurements"].loc[1, "client_bound"] = True
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "fail", res.summary
    f = failed(res)
    assert f["server_client_itl_agree"] == "fail" and f["server_frontend_lag"] == "warn"
    itl = _row(res, "server_client_itl_agree")
    assert "failing: chat/concurrency/4/1" in itl["detail"] and "/4/0" not in itl["detail"]
    assert "2 window(s) attributed" in itl["observed"]
    lag = _row(res, "server_frontend_lag")
    assert "ITL chat/concurrency/4/0" in lag["detail"] and "ITL chat/concurrency/4/1" not in lag["detail"]


def test_clean_evidence_and_agreement_passes():
    tables = make_tables()
    _client_evidence(tables)
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "pass", res.summary
    assert _row(res, "server_frontend_lag")["observed"] == "no window"


# ------------------------------------------------------------------ no GPU, missing parts


def test_cpu_trial_skips_gpu_checks_and_does_not_fail():
    tables = make_tables()
    del tables["gpu_samples"]
    trial = {"trial_id": TRIAL_ID, "status": "ok", "gpu_name": "cpu"}
    res = validate_trial(tables, trial, QualityThresholds())
    assert res.verdict == "pass", res.summary
    env = res.checks[res.checks["suite"] == "environment"]
    assert len(env) == 5
    assert env["success"].isna().all()
    assert env["detail"].str.startswith("skipped: no GPU").all()
    assert "5 skipped" in res.summary


def test_gpu_trial_without_samples_records_skips():
    tables = make_tables()
    tables["gpu_samples"] = tables["gpu_samples"].iloc[0:0]
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert res.verdict == "pass"
    assert {"no_throttling", "sm_clock_stable"} <= skipped(res)


def test_missing_server_metrics_are_skipped_not_passed():
    tables = make_tables()
    tables["server_metrics"] = None
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert {"server_client_ttft_agree", "server_client_itl_agree", "server_frontend_lag",
            "preemptions"} <= skipped(res)
    assert res.verdict == "pass"


def test_power_cap_bit_alone_is_not_throttling():
    tables = make_tables()
    tables["gpu_samples"]["throttle_reasons"] = SW_POWER_CAP
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert "no_throttling" not in failed(res)
    tables["gpu_samples"].loc[3, "throttle_reasons"] = SW_POWER_CAP | HW_THERMAL
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res)["no_throttling"] == "fail"
    obs = res.checks.set_index("expectation").loc["no_throttling", "observed"]
    assert "HwThermalSlowdown" in obs and "SwPowerCap" not in obs


def test_natural_eos_is_excluded_unless_trial_says_ignore_eos():
    tables = make_tables()
    req = tables["requests"]
    req.loc[0, "output_tokens"] = 7
    req.loc[0, "finish_reason"] = "stop"  # an EOS: only possible without ignore_eos
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert "output_tokens_match_requested" not in failed(res)
    for flag in (True, np.True_):  # a trials row read from a bundle gives numpy bools
        res = validate_trial(tables, make_trial(ignore_eos=flag), QualityThresholds())
        assert failed(res) == {"output_tokens_match_requested": "fail"}


def test_concurrency_target_is_capped_by_num_requests():
    tables = make_tables()
    m = tables["measurements"]
    m["load_value"] = 64.0  # more than the 12 requests of each measurement
    for t in ("requests", "server_metrics"):
        tables[t]["load_value"] = 64.0
    m["achieved_concurrency"] = 11.5
    assert validate_trial(tables, make_trial(), QualityThresholds()).verdict == "pass"
    m.loc[0, "achieved_concurrency"] = 8.0
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert failed(res) == {"achieved_concurrency": "fail"}


def test_ignore_eos_false_skips_output_length_check():
    tables = make_tables()
    tables["requests"]["output_tokens"] = 7
    res = validate_trial(tables, make_trial(ignore_eos=False), QualityThresholds())
    assert "output_tokens_match_requested" in skipped(res)
    assert "output_tokens_match_requested" not in failed(res)


# ------------------------------------------------------------------ unvalidated


@pytest.mark.parametrize("how", ["no_requests_table", "missing_column", "bad_status", "no_status"])
def test_unvalidated_when_validation_cannot_run(how):
    tables, trial = make_tables(), make_trial()
    if how == "no_requests_table":
        del tables["requests"]
        needle = "requests"
    elif how == "missing_column":
        tables["measurements"] = tables["measurements"].drop(columns=["client_bound"])
        needle = "client_bound"
    elif how == "bad_status":
        trial["status"] = "boot_failed"
        needle = "boot_failed"
    else:
        del trial["status"]
        needle = "status"
    res = validate_trial(tables, trial, QualityThresholds())
    assert res.verdict == "unvalidated"
    assert res.summary.startswith("unvalidated:") and needle in res.summary
    assert list(res.checks.columns) == list(QUALITY_CHECK_COLUMNS)
    assert res.checks["expectation"].tolist() == ["validation_completed"]


def test_unvalidated_when_a_suite_raises(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom in suite")

    monkeypatch.setattr(quality.suites, "_suite_warmup", boom)
    res = validate_trial(make_tables(), make_trial(), QualityThresholds())
    assert res.verdict == "unvalidated"
    assert "boom in suite" in res.summary


def test_unvalidated_when_great_expectations_raises(monkeypatch, gx_imported):
    from great_expectations.datasource.fluent.interfaces import Batch

    def broken(self, *a, **k):
        raise RuntimeError("gx exploded")

    monkeypatch.setattr(Batch, "validate", broken)
    res = validate_trial(make_tables(), make_trial(), QualityThresholds())
    assert res.verdict == "unvalidated"
    assert "gx exploded" in res.summary


def test_gx_exception_is_raised_not_passed(gx_imported):
    import great_expectations.expectations as gxe

    plan = quality._Plan(pd.DataFrame({"x": [1.0]}), [quality._Spec(
        "ttft_s_positive", gxe.ExpectColumnValuesToBeBetween(column="nope", min_value=0), "> 0")])
    with pytest.raises(quality.QualityValidationError, match="nope"):
        quality._run_plans([plan], [], TRIAL_ID)


# ------------------------------------------------------------------ thresholds


def test_misspelled_threshold_names_the_field():
    with pytest.raises(pydantic.ValidationError) as err:
        QualityThresholds.model_validate({"max_eror_rate": 0.1})
    assert "max_eror_rate" in str(err.value)


def test_out_of_range_threshold_names_the_field():
    with pytest.raises(pydantic.ValidationError) as err:
        QualityThresholds(max_error_rate=1.5)
    assert "max_error_rate" in str(err.value)


def test_every_threshold_is_documented():
    doc = (REPO / "docs" / "quality.md").read_text()
    for name, f in QualityThresholds.model_fields.items():
        assert f.description, name
        assert f"`{name}`" in doc, f"{name} missing from docs/quality.md"
    for name in CHECKS:
        assert f"`{name}`" in doc, f"check {name} missing from docs/quality.md"


# ------------------------------------------------------------------ side effects, rendering


def test_no_files_and_no_progress_bars(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    validate_trial(make_tables(), make_trial(), QualityThresholds())
    assert list(tmp_path.iterdir()) == []
    err = capfd.readouterr().err
    assert "Calculating Metrics" not in err and "it/s" not in err


def test_markdown_lists_failed_and_warned_checks():
    tables = make_tables()
    tables["measurements"].loc[0, "client_bound"] = True
    tables["server_metrics"].loc[2, "value"] = 3.0
    res = validate_trial(tables, make_trial(gpu_name="cpu"), QualityThresholds())
    md = quality_markdown(res)
    assert md.startswith("**Quality: FAIL**")
    rows = [ln for ln in md.splitlines() if ln.startswith("| fail") or ln.startswith("| warn")]
    assert [r.split("|")[3].strip() for r in rows] == ["client_not_bound", "preemptions"]
    assert "Skipped (5)" in md
    clean = quality_markdown(validate_trial(make_tables(), make_trial(), QualityThresholds()))
    assert "No check failed or warned." in clean and "| fail" not in clean


def test_module_import_does_not_import_great_expectations():
    code = "import sys, tunelab.tasks.quality; print('great_expectations' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ sla_search windows


def _with_search_windows(t, flag=True):
    """The clean trial plus an sla_search's overload windows at c=3 (achieved 0.74 x target, 2 of 12 requests
    failed) and c=4 (client-bound), marked ``sla_search_window`` (019) when ``flag``."""
    over = make_tables(repeats=1, concurrency=3)
    over["measurements"]["achieved_concurrency"] = 0.74 * 3
    over["requests"].loc[:1, "ok"] = False
    c4 = make_tables(repeats=1, concurrency=4)
    for name in c4:  # c=4 at repeat 3: after the plan's repeats 0..2 at that level
        if "repeat" in c4[name].columns:
            c4[name]["repeat"] = 3
    c4["measurements"]["client_bound"] = True
    out = {}
    for name in t:
        extra = [over[name], c4[name]] if name != "gpu_samples" else []
        out[name] = pd.concat([t[name], *extra], ignore_index=True)
    m = out["measurements"]
    m["sla_search_window"] = pd.Series([None] * len(t["measurements"]) + [flag] * 2, dtype=object)
    return out


def test_sla_search_overload_windows_do_not_sink_the_plans_windows():
    res = validate_trial(_with_search_windows(make_tables()), make_trial(), QualityThresholds())
    assert res.verdict in ("pass", "warn"), res.summary
    assert "achieved_concurrency" not in failed(res) and "client_not_bound" not in failed(res)
    assert "error_rate" not in failed(res)
    # The same windows unmarked are the plan's own: they fail the gate as before.
    bad = validate_trial(_with_search_windows(make_tables(), flag=None), make_trial(), QualityThresholds())
    assert bad.verdict == "fail"
    assert {"achieved_concurrency", "client_not_bound", "error_rate"} <= set(failed(bad))


def test_sla_search_windows_still_get_the_integrity_checks():
    t = _with_search_windows(make_tables())
    t["requests"].loc[len(t["requests"]) - 1, "ttft_s"] = -0.01  # a search window's request with a bad TTFT
    res = validate_trial(t, make_trial(), QualityThresholds())
    assert failed(res).get("ttft_s_positive") == "fail", res.summary


def test_a_plans_own_bad_window_still_fails_beside_search_windows():
    t = _with_search_windows(make_tables())
    t["measurements"].loc[0, "achieved_concurrency"] = 1.0  # the plan's c=4 repeat 0
    res = validate_trial(t, make_trial(), QualityThresholds())
    assert failed(res).get("achieved_concurrency") == "fail", res.summary


def test_cache_not_cold_names_the_window_and_its_reset():
    tables = make_tables()
    _cache_not_taken(tables)
    row = validate_trial(tables, make_trial(), QualityThresholds()).checks.set_index("expectation").loc["cache_not_cold"]
    assert "chat/concurrency/4/1" in row["observed"] and "128 of 256" in row["observed"]
    assert "success=false" in row["observed"]


def test_a_shared_prefix_window_is_not_judged_cold():
    tables = make_tables()
    _cache_not_taken(tables)
    tables["measurements"]["unique_prompts"] = False  # shared_prefix_tokens: hits are the point
    res = validate_trial(tables, make_trial(), QualityThresholds())
    assert "cache_not_cold" in skipped(res) and "cache_not_cold" not in failed(res)
