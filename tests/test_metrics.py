"""Client-side metric math on hand-computed streams (no server, no clock)."""

import math

import numpy as np
import pandas as pd
import pytest

from tunelab.tasks.metrics import (
    MEASUREMENT_COLUMNS,
    REQUEST_COLUMNS,
    aggregate,
    derive_request,
    in_flight,
    itl_values,
    summarize_repeats,
)

T0 = 1_790_000_000.0  # an epoch second; offsets below are added to it


def raw(offsets=(0.2, 0.3, 0.4), end=0.5, out=3, req=3, send=0.0, **kw):
    """A raw record as the load generator writes it; times given as offsets from T0."""
    rec = dict(
        workload="chat",
        load_kind="concurrency",
        load_value=2.0,
        repeat=0,
        request_index=0,
        send_ts=T0 + send,
        chunk_ts=[T0 + send + o for o in offsets],
        end_ts=None if end is None else T0 + send + end,
        prompt_tokens=10,
        output_tokens=out,
        requested_output_tokens=req,
        ignore_eos=True,
        finish_reason="length",
        transport_error=None,
    )
    rec.update(kw)
    return rec


# ------------------------------------------------------------------ derive_request


def test_row_has_every_requests_table_column():
    row = derive_request(raw())
    assert set(REQUEST_COLUMNS) <= set(row)
    assert "trial_id" not in row
    assert derive_request(raw(trial_id="s/c/r0"))["trial_id"] == "s/c/r0"


def test_role_only_first_chunk_is_not_the_first_token():
    # The server sent a role-only delta at +0.05 s; per the contract it is not in chunk_ts,
    # so TTFT is the first chunk carrying text (+0.25 s), not the role chunk and never 0.
    row = derive_request(raw(offsets=(0.25, 0.35, 0.45), end=0.5, out=3, req=3))
    assert row["ok"] and row["error"] is None
    assert row["ttft_s"] == pytest.approx(0.25, abs=1e-6)
    assert row["first_token_ts"] == pytest.approx(T0 + 0.25)
    assert row["chunk_offsets_s"] == pytest.approx([0.25, 0.35, 0.45], abs=1e-6)
    assert row["e2el_s"] == pytest.approx(0.45, abs=1e-6)  # ends at the last token, not at the last byte (0.5)
    assert row["last_token_ts"] == pytest.approx(T0 + 0.45) and row["end_ts"] == pytest.approx(T0 + 0.5)
    assert row["itl_mean_s"] == pytest.approx(0.1, abs=1e-6)
    assert row["tpot_s"] == pytest.approx((0.45 - 0.25) / 2, abs=1e-6)


def test_tpot_uses_usage_tokens_not_chunk_count():
    # 3 chunks carrying 9 tokens: TPOT = (0.6 - 0.2) / (9 - 1) = 0.05, not (0.4)/2 = 0.2
    row = derive_request(raw(offsets=(0.2, 0.3, 0.6), end=0.65, out=9, req=9))
    assert row["ok"]
    assert row["tpot_s"] == pytest.approx(0.05, abs=1e-6)
    assert row["itl_mean_s"] == pytest.approx(0.2, abs=1e-6)  # ITL is per chunk
    assert row["output_tokens"] == 9


def test_single_token_has_no_tpot_and_no_itl():
    row = derive_request(raw(offsets=(0.2,), end=0.21, out=1, req=1))
    assert row["ok"]
    assert row["tpot_s"] is None and row["itl_mean_s"] is None
    assert row["ttft_s"] == pytest.approx(0.2, abs=1e-6)


def _assert_failed(row, prefix):
    assert row["ok"] is False
    assert row["error"].startswith(prefix), row["error"]
    for col in ("ttft_s", "tpot_s", "e2el_s", "itl_mean_s"):
        assert row[col] is None, col


def test_empty_stream_fails_without_ttft():
    row = derive_request(raw(offsets=(), end=0.3, out=0, finish_reason="stop", ignore_eos=False))
    _assert_failed(row, "no_text")
    assert row["first_token_ts"] is None and row["chunk_offsets_s"] == []


def test_cut_off_stream_without_end_fails():
    row = derive_request(raw(offsets=(0.2, 0.3), end=None, out=None, finish_reason=None))
    _assert_failed(row, "cut_off")
    assert row["chunk_offsets_s"] == pytest.approx([0.2, 0.3], abs=1e-6)  # facts kept


def test_stream_ending_without_finish_reason_is_cut_off():
    _assert_failed(derive_request(raw(finish_reason=None)), "cut_off")


def test_early_stop_despite_ignore_eos_fails_with_counts():
    row = derive_request(raw(out=17, req=32, finish_reason="stop"))
    _assert_failed(row, "early_stop")
    assert row["error"] == "early_stop: 17/32 tokens"


def test_early_eos_without_ignore_eos_is_fine():
    row = derive_request(raw(out=17, req=32, finish_reason="stop", ignore_eos=False))
    assert row["ok"] and row["tpot_s"] is not None


def test_transport_error_fails_even_with_chunks():
    row = derive_request(raw(transport_error="ReadError: connection reset", end=None, finish_reason=None))
    _assert_failed(row, "transport_error: ReadError")


def test_request_never_sent_fails_without_timing():
    row = derive_request(raw(send_ts=None, chunk_ts=[], end=None, finish_reason=None, transport_error="ConnectError"))
    _assert_failed(row, "transport_error: ConnectError")
    assert row["send_ts"] is None and row["chunk_offsets_s"] == []
    with pytest.raises(ValueError, match="send_ts"):
        derive_request(raw(send_ts=None))  # without a transport error a missing send time is a bug


def test_missing_usage_fails():
    _assert_failed(derive_request(raw(out=None)), "no_usage")


def test_server_abort_fails():
    _assert_failed(derive_request(raw(finish_reason="abort")), "server_abort")


def test_out_of_order_timestamps_fail_the_request():
    _assert_failed(derive_request(raw(offsets=(0.3, 0.2, 0.4))), "bad_timing")
    _assert_failed(derive_request(raw(offsets=(0.2, 0.3), end=0.25)), "bad_timing")


@pytest.mark.parametrize("field", ["send_ts", "chunk_ts", "output_tokens", "ignore_eos"])
def test_missing_field_is_named(field):
    rec = raw()
    del rec[field]
    with pytest.raises(ValueError, match=field):
        derive_request(rec)


@pytest.mark.parametrize(
    "field, value",
    [("load_kind", "qps"), ("send_ts", None), ("chunk_ts", "0.1"), ("output_tokens", -3), ("ignore_eos", "yes")],
)
def test_bad_field_is_named(field, value):
    with pytest.raises(ValueError, match=field):
        derive_request(raw(**{field: value}))


# ------------------------------------------------------------------ itl_values


def test_itl_values_pools_gaps_of_ok_requests_only():
    rows = [
        derive_request(raw(offsets=(0.1, 0.3, 0.6), end=0.7)),  # gaps 0.2, 0.3
        derive_request(raw(offsets=(0.2, 0.25), out=2, req=2)),  # gap 0.05
        derive_request(raw(offsets=(0.1, 0.9), out=None)),  # failed: no_usage -> excluded
    ]
    got = itl_values(rows)
    assert got == pytest.approx([0.2, 0.3, 0.05], abs=1e-6)
    assert np.allclose(itl_values(pd.DataFrame(rows)), got)
    assert itl_values([]).shape == (0,)


# ------------------------------------------------------------------ aggregate


def frame(*recs):
    return pd.DataFrame([derive_request(r) for r in recs])


def test_aggregate_has_every_measurements_column():
    m = aggregate(frame(raw()), slo=None)
    assert set(MEASUREMENT_COLUMNS) <= set(m)


def test_percentiles_match_numpy_linear_on_known_list():
    ttfts = [0.11, 0.52, 0.23, 0.91, 0.35, 0.47, 0.18, 0.66, 0.29, 0.74, 0.05]
    recs = [raw(offsets=(t, t + 0.1), end=t + 0.2, out=2, req=2, request_index=i) for i, t in enumerate(ttfts)]
    m = aggregate(frame(*recs), slo=None)
    for p in (50, 90, 95, 99):
        assert m[f"ttft_p{p}_s"] == pytest.approx(np.percentile(ttfts, p, method="linear"), abs=1e-6)
    assert m["ttft_mean_s"] == pytest.approx(np.mean(ttfts), abs=1e-6)


def test_percentiles_hand_computed():
    # E2EL 1, 2, 3, 4 s -> linear p50 = 2.5, p90 = 3.7, p99 = 3.97
    recs = [raw(offsets=(e,), end=e, out=1, req=1, request_index=i) for i, e in enumerate((1.0, 2.0, 3.0, 4.0))]
    m = aggregate(frame(*recs), slo=None)
    assert m["e2el_p50_s"] == pytest.approx(2.5, abs=1e-6)
    assert m["e2el_p90_s"] == pytest.approx(3.7, abs=1e-6)
    assert m["e2el_p99_s"] == pytest.approx(3.97, abs=1e-6)
    assert m["tpot_mean_s"] is None  # every request had one token


def test_itl_percentiles_are_over_pooled_gaps():
    recs = [
        raw(offsets=(0.1, 0.2, 0.5, 0.6), end=0.7, out=4, req=4, request_index=0),  # gaps .1 .3 .1
        raw(offsets=(0.1, 0.9), end=1.0, out=2, req=2, request_index=1),  # gap .8
    ]
    m = aggregate(frame(*recs), slo=None)
    gaps = [0.1, 0.3, 0.1, 0.8]
    assert m["itl_mean_s"] == pytest.approx(np.mean(gaps), abs=1e-6)  # not the mean of per-request means
    assert m["itl_p50_s"] == pytest.approx(np.percentile(gaps, 50), abs=1e-6)


def test_throughput_counts_ok_tokens_over_first_send_to_last_end():
    recs = [
        raw(send=0.0, offsets=(0.5, 1.0), end=2.0, out=10, req=10, request_index=0),
        raw(send=1.0, offsets=(0.5, 1.0), end=3.0, out=10, req=10, request_index=1),  # ends at 4.0
        raw(send=2.0, offsets=(0.5,), end=1.0, out=3, req=10, request_index=2),  # early stop, ends 3.0
    ]
    m = aggregate(frame(*recs), slo=None)
    assert (m["num_requests"], m["completed"], m["failed"]) == (3, 2, 1)
    assert m["duration_s"] == pytest.approx(4.0, abs=1e-6)
    assert m["request_throughput_per_s"] == pytest.approx(2 / 4.0)
    assert m["total_output_tokens"] == 20 and m["total_input_tokens"] == 20
    assert m["output_tokens_per_s"] == pytest.approx(20 / 4.0)
    assert m["total_tokens_per_s"] == pytest.approx(40 / 4.0)


def test_achieved_concurrency_littles_law_and_client_bound():
    # in flight [0,2] and [1,3]: busy 4 s over a 3 s window -> L = 4/3
    recs = [
        raw(send=0.0, offsets=(0.5,), end=2.0, out=1, req=1, request_index=0),
        raw(send=1.0, offsets=(0.5,), end=2.0, out=1, req=1, request_index=1),
    ]
    df = frame(*recs)
    m = aggregate(df, slo=None, target=2)
    assert m["achieved_concurrency"] == pytest.approx(4 / 3, abs=1e-6)
    assert m["client_bound"] is True  # 1.33 < 0.9 * 2
    assert aggregate(df, slo=None, target=1)["client_bound"] is False  # 1.33 >= 0.9 * 1
    assert aggregate(df, slo=None)["client_bound"] is None  # nothing to judge by
    assert aggregate(df, slo=None, client_cpu_frac=0.95)["client_bound"] is True
    assert aggregate(df, slo=None, client_cpu_frac=0.2, target=1)["client_bound"] is False
    # a target larger than the number of requests cannot be reached: judged against n=2
    assert aggregate(df, slo=None, target=64)["client_bound"] is True


def test_late_usage_chunk_does_not_lengthen_e2el_or_tpot():
    # 16 tokens at 5 ms from +35 ms, then a usage-only chunk and [DONE] 50 ms after the last token: E2EL and
    # TPOT end at the last token (as vllm bench serve); the stream's end stays in end_ts.
    offs = tuple(0.035 + 0.005 * k for k in range(16))
    row = derive_request(raw(offsets=offs, end=offs[-1] + 0.050, out=16, req=16))
    assert row["ok"]
    assert row["e2el_s"] == pytest.approx(offs[-1], abs=1e-6)
    assert row["tpot_s"] == pytest.approx(0.005, abs=1e-6)
    assert row["end_ts"] - row["last_token_ts"] == pytest.approx(0.050, abs=1e-6)


def test_drain_tail_is_not_client_bound():
    # c=2: slot A runs r0 [0, 1] then r2 [1, 2]; slot B runs r1 [0, 3], slowed down by the server. Both slots
    # were busy until the last send (t=1); the tail [2, 3] with one request left is not the client's doing.
    recs = [
        raw(send=0.0, offsets=(0.5,), end=1.0, out=1, req=1, request_index=0),
        raw(send=0.0, offsets=(2.5,), end=3.0, out=1, req=1, request_index=1),
        raw(send=1.0, offsets=(0.5,), end=1.0, out=1, req=1, request_index=2),
    ]
    m = aggregate(frame(*recs), slo=None, client_cpu_frac=0.03, target=2)
    assert m["achieved_concurrency"] == pytest.approx(5 / 3, abs=1e-6)  # below 0.9 x 2: the load was low...
    assert m["in_flight_while_sending"] == pytest.approx(2.0, abs=1e-6)  # ...but the client kept both slots
    assert m["peak_in_flight"] == 2
    assert m["client_bound"] is False
    # A client that waited 0.5 s before refilling slot A is to blame: 2.5 s in flight over 1.5 s of sending.
    late = [recs[0], recs[1], raw(send=1.5, offsets=(0.5,), end=1.0, out=1, req=1, request_index=2)]
    m = aggregate(frame(*late), slo=None, client_cpu_frac=0.03, target=2)
    assert m["in_flight_while_sending"] == pytest.approx((1.0 + 1.5) / 1.5, abs=1e-6)  # < 0.9 x 2
    assert m["client_bound"] is True


def test_in_flight_peak_and_while_sending():
    nan = float("nan")
    # a slot handed on at t=1 (an end and a send at the same instant) is one in flight, not two
    assert in_flight([0.0, 1.0], [1.0, 2.0]) == (1, 1.0)
    assert in_flight([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]) == (3, 3.0)  # all sent at once
    assert in_flight([0.0, 0.5], [nan, 1.0]) == (2, 1.0)  # unknown end: still in flight
    assert in_flight([nan], [nan]) == (None, None)
    with pytest.raises(ValueError, match="same length"):
        in_flight([0.0], [1.0, 2.0])


def test_failed_requests_with_an_end_count_toward_concurrency():
    recs = [
        raw(send=0.0, offsets=(0.5,), end=2.0, out=1, req=1, request_index=0),
        raw(send=0.0, offsets=(), end=2.0, out=0, req=1, finish_reason="stop", request_index=1),  # no_text
    ]
    m = aggregate(frame(*recs), slo=None, target=2)
    assert m["failed"] == 1
    assert m["achieved_concurrency"] == pytest.approx(2.0, abs=1e-6)
    assert m["client_bound"] is False


def test_rate_target_is_not_a_concurrency_check():
    df = frame(raw(load_kind="rate", load_value=5.0))
    assert aggregate(df, slo=None, target=5.0)["client_bound"] is None


def test_goodput_follows_vllm_goodput_rule():
    # (ttft, e2el, tokens) -> tpot = (e2el - ttft)/(tokens - 1)
    recs = [
        raw(offsets=(0.1, 1.0), end=1.0, out=10, req=10, request_index=0),  # ttft .1 tpot .1   e2el 1.0
        raw(offsets=(0.4, 1.3), end=1.3, out=10, req=10, request_index=1),  # ttft .4 tpot .1   e2el 1.3
        raw(offsets=(0.2, 2.0), end=2.0, out=10, req=10, request_index=2),  # ttft .2 tpot .2   e2el 2.0
        raw(offsets=(0.3,), end=0.3, out=1, req=1, request_index=3),  # ttft .3 tpot None e2el 0.3
        raw(offsets=(0.05,), end=0.5, out=None, request_index=4),  # failed: never good
    ]
    df = frame(*recs)
    duration = 2.0
    g = lambda slo: aggregate(df, slo=slo)["goodput_per_s"]  # noqa: E731
    assert g(None) is None and g({}) is None
    assert g({"ttft_s": 0.3}) == pytest.approx(3 / duration)  # .1 .2 .3 (<= is good)
    assert g({"tpot_s": 0.15}) == pytest.approx(3 / duration)  # .1 .1 and the 1-token request
    assert g({"ttft_s": 0.3, "tpot_s": 0.15}) == pytest.approx(2 / duration)
    assert g({"ttft_s": 0.3, "tpot_s": 0.15, "e2el_s": 0.9}) == pytest.approx(1 / duration)
    assert g({"e2el_s": 0.01}) == 0.0


@pytest.mark.parametrize(
    "slo, match",
    [({"itl_s": 0.1}, "itl_s"), ({"ttft": 0.1}, "ttft"), ({"ttft_s": 0}, "ttft_s"), ({"ttft_s": "1"}, "ttft_s")],
)
def test_bad_slo_is_named(slo, match):
    with pytest.raises(ValueError, match=match):
        aggregate(frame(raw()), slo=slo)


def test_no_ok_requests_gives_none_latencies_not_zero():
    recs = [
        raw(offsets=(), end=0.3, out=0, finish_reason="stop", request_index=0),
        raw(transport_error="ConnectError", end=None, finish_reason=None, request_index=1),
    ]
    m = aggregate(frame(*recs), slo={"ttft_s": 1.0})
    assert (m["completed"], m["failed"]) == (0, 2)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "p50", "p90", "p95", "p99"):
            assert m[f"{metric}_{stat}_s"] is None
    assert m["request_throughput_per_s"] == 0.0 and m["goodput_per_s"] == 0.0
    assert m["total_output_tokens"] == 0


def test_no_end_at_all_gives_no_duration_and_no_rates():
    m = aggregate(frame(raw(transport_error="boom", end=None, finish_reason=None)), slo=None)
    assert m["duration_s"] is None and m["request_throughput_per_s"] is None
    assert m["achieved_concurrency"] is None


def test_aggregate_refuses_mixed_groups_and_empty_frames():
    with pytest.raises(ValueError, match="repeat"):
        aggregate(frame(raw(repeat=0), raw(repeat=1)), slo=None)
    with pytest.raises(ValueError, match="no requests"):
        aggregate(pd.DataFrame(columns=list(REQUEST_COLUMNS)), slo=None)
    with pytest.raises(ValueError, match="ttft_s"):
        aggregate(frame(raw()).drop(columns=["ttft_s"]), slo=None)


# ------------------------------------------------------------------ summarize_repeats


def _measurement(repeat, ttft_p50, tpot_p50, tok_s, load_value=2.0):
    return dict(
        workload="chat",
        load_kind="concurrency",
        load_value=load_value,
        repeat=repeat,
        ttft_p50_s=ttft_p50,
        tpot_p50_s=tpot_p50,
        output_tokens_per_s=tok_s,
    )


def test_summarize_repeats_mean_std_cv():
    ms = pd.DataFrame(
        [
            _measurement(0, 1.0, 0.1, 100.0),
            _measurement(1, 2.0, None, 110.0),
            _measurement(2, 3.0, 0.3, 120.0),
            _measurement(0, 5.0, 0.5, 50.0, load_value=8.0),
        ]
    )
    s = summarize_repeats(ms).set_index("load_value")
    two = s.loc[2.0]
    assert two["n_repeats"] == 3
    assert two["ttft_p50_s_mean"] == pytest.approx(2.0)
    assert two["ttft_p50_s_std"] == pytest.approx(1.0)  # sample std (ddof=1)
    assert two["ttft_p50_s_cv"] == pytest.approx(0.5)
    assert two["tpot_p50_s_mean"] == pytest.approx(0.2)  # missing value skipped, not a 0
    assert two["output_tokens_per_s_cv"] == pytest.approx(np.std([100, 110, 120], ddof=1) / 110)
    one = s.loc[8.0]
    assert one["n_repeats"] == 1 and one["ttft_p50_s_mean"] == 5.0
    assert math.isnan(one["ttft_p50_s_std"]) and math.isnan(one["ttft_p50_s_cv"])


def test_summarize_repeats_keeps_trials_apart():
    ms = pd.DataFrame([_measurement(0, 1.0, 0.1, 10.0), _measurement(0, 3.0, 0.1, 10.0)])
    ms["trial_id"] = ["a", "b"]
    s = summarize_repeats(ms)
    assert len(s) == 2 and list(s["trial_id"]) == ["a", "b"]


def test_summarize_repeats_end_to_end_from_aggregates():
    aggs = []
    for rep, ttft in enumerate((0.2, 0.4)):
        aggs.append(aggregate(frame(raw(repeat=rep, offsets=(ttft, ttft + 0.1), end=ttft + 0.2)), slo=None))
    s = summarize_repeats(pd.DataFrame(aggs))
    assert s.loc[0, "ttft_p50_s_mean"] == pytest.approx(0.3, abs=1e-6)


def test_summarize_repeats_names_missing_columns():
    with pytest.raises(ValueError, match="tpot_p50_s"):
        summarize_repeats(pd.DataFrame([_measurement(0, 1, 1, 1)]).drop(columns=["tpot_p50_s"]))


# ------------------------------------------------------------------ steady-state windows
def _c2_window():
    """c=2, 5 requests, exact times (offsets from T0). r0 is the ramp (sent before 2 were in flight) with a slow
    first token; r3's end at 2.6 is the first end after the last send (r4 at 2.0): the drain is 2.6 -> 2.8."""
    return frame(
        raw(send=0.0, offsets=(0.9, 1.0), end=1.0, out=2, req=2, request_index=0),
        raw(send=0.1, offsets=(0.1, 1.4), end=1.4, out=2, req=2, request_index=1),
        raw(send=1.0, offsets=(0.1, 0.9), end=1.0, out=2, req=2, request_index=2),
        raw(send=1.5, offsets=(0.1, 1.0), end=1.1, out=2, req=2, request_index=3),
        raw(send=2.0, offsets=(0.1, 0.7), end=0.8, out=2, req=2, request_index=4),
    )


def test_steady_interval_closed_and_open_loop():
    from tunelab.tasks.metrics import steady_interval

    df = _c2_window()
    iv = steady_interval(df["send_ts"], df["end_ts"], target=2)
    assert (iv.start_ts - T0, iv.end_ts - T0) == (pytest.approx(0.1), pytest.approx(2.6))
    iv = steady_interval(df["send_ts"], df["end_ts"], target=None)  # open loop: first end to last send
    assert (iv.start_ts - T0, iv.end_ts - T0) == (pytest.approx(1.0), pytest.approx(2.0))
    assert steady_interval(df["send_ts"], df["end_ts"], target=8) is None  # the target never held
    assert steady_interval([T0], [T0 + 1], target=1) is None  # one request: no interval


def test_aggregate_excludes_ramp_and_drain():
    df = _c2_window()
    m = aggregate(df, slo=None, target=2)
    assert m["steady_state"] is True
    assert (m["ramp_s"], m["steady_s"], m["drain_s"]) == (pytest.approx(0.1), pytest.approx(2.5), pytest.approx(0.2))
    assert m["ramp_s"] + m["steady_s"] + m["drain_s"] == pytest.approx(m["duration_s"])
    assert (m["ramp_requests"], m["steady_requests"], m["drain_requests"]) == (1, 4, 0)
    # Latencies of the requests sent in the steady part only: r0's 0.9 s TTFT is the ramp's.
    assert m["ttft_p99_s"] == pytest.approx(0.1) and m["ttft_mean_s"] == pytest.approx(0.1)
    # Tokens streamed in [0.1, 2.6]: all but r4's last (at 2.7); requests whose last token came in it: r0..r3.
    assert m["output_tokens_per_s"] == pytest.approx(9 / 2.5)
    assert m["request_throughput_per_s"] == pytest.approx(4 / 2.5)
    assert m["total_output_tokens"] == 10 and m["achieved_concurrency"] == pytest.approx(
        (1.0 + 1.4 + 1.0 + 1.1 + 0.8) / 2.8)  # Little's law stays over the whole window
    whole = aggregate(df, slo=None, target=2, steady_state=False)
    assert whole["steady_state"] is None and whole["ramp_requests"] is None
    assert whole["output_tokens_per_s"] == pytest.approx(10 / 2.8)
    assert whole["ttft_p99_s"] > 0.8  # r0 counted


def test_aggregate_rate_window_excludes_the_drain_after_the_last_arrival():
    df = _c2_window().assign(load_kind="rate", load_value=2.0)
    m = aggregate(df, slo={"ttft_s": 0.5}, target=None)
    # Open loop: the ramp lasts until the first end (r0 at 1.0); the drain follows the last arrival (r4 at 2.0).
    assert m["steady_state"] is True and m["ramp_s"] == pytest.approx(1.0)
    assert m["steady_s"] == pytest.approx(1.0) and m["drain_s"] == pytest.approx(0.8)
    assert (m["ramp_requests"], m["steady_requests"]) == (2, 3) and m["ttft_p99_s"] == pytest.approx(0.1)
    # In [1.0, 2.0]: r0 1 (1.0), r1 1 (1.5), r2 2 (1.1, 1.9), r3 1 (1.6) tokens; r0, r1, r2 ended in it.
    assert m["output_tokens_per_s"] == pytest.approx(5 / 1.0)
    assert m["goodput_per_s"] == pytest.approx(2 / 1.0)  # r0 misses the TTFT SLO


def test_aggregate_without_steady_part_counts_the_whole_window():
    df = frame(*(raw(send=0.0, offsets=(0.1, 0.2), end=0.2 + 0.1 * i, out=2, req=2, request_index=i)
                 for i in range(3)))
    m = aggregate(df, slo=None, target=4)  # 3 requests never put 4 in flight
    assert m["steady_state"] is False and (m["ramp_requests"], m["drain_requests"]) == (0, 0)
    assert m["output_tokens_per_s"] == pytest.approx(6 / m["duration_s"])
    assert aggregate(df, slo=None)["steady_state"] is None  # concurrency without its target: not asked


# ------------------------------------------------------------------ TPOT after a first chunk of several tokens


def test_tpot_divides_by_the_tokens_after_a_first_chunk_of_several():
    # 64 tokens: the first chunk holds 5 at 100 ms, then 59 chunks of 1 token every 5 ms. TPOT is the time after
    # the first chunk over the tokens after it: 59 x 5 ms / 59 = 5.00 ms (output_tokens - 1 gives 4.68 ms).
    offsets = [0.100] + [0.100 + 0.005 * i for i in range(1, 60)]
    row = derive_request(raw(offsets=offsets, end=offsets[-1] + 0.001, out=64, req=64, first_chunk_tokens=5))
    assert row["ok"] and row["first_chunk_tokens"] == 5
    assert row["tpot_s"] == pytest.approx(0.005, rel=1e-6)
    # The server did not say: vLLM's divisor, and the column says unknown.
    old = derive_request(raw(offsets=offsets, end=offsets[-1] + 0.001, out=64, req=64))
    assert old["first_chunk_tokens"] is None and old["tpot_s"] == pytest.approx(0.295 / 63, rel=1e-6)


def test_tpot_is_none_when_the_first_chunk_held_every_token():
    row = derive_request(raw(offsets=(0.1,), end=0.2, out=4, req=4, first_chunk_tokens=4))
    assert row["ok"] and row["tpot_s"] is None and row["first_chunk_tokens"] == 4


# ------------------------------------------------------------------ open-loop saturation


def _open_loop(n, gap_s, service_s, slots=None, ramp_ttft=None):
    """Rows of an open-loop window: a send every gap_s; a FIFO server of `slots` slots (None: no queue) that
    takes service_s per request, TTFT = queueing + 10 ms."""
    rows, free = [], [0.0] * (slots or 1)
    for i in range(n):
        send = i * gap_s
        if slots is None:
            start = send
        else:
            k = min(range(len(free)), key=free.__getitem__)
            start = max(send, free[k])
            free[k] = start + service_s
        ttft = start - send + 0.010
        end = start + service_s
        rows.append(derive_request(raw(offsets=(ttft, end - send), end=end - send, out=2, req=2, send=send,
                                       request_index=i, load_kind="rate")))
    return pd.DataFrame(rows)


def test_overload_needs_completions_behind_and_in_flight_and_ttft_growing():
    from tunelab.tasks.metrics import overload

    over = overload(_open_loop(30, 0.05, 0.125, slots=1))  # 20 req/s into 8 req/s
    assert over.overloaded is True
    assert over.completion_ratio < 0.9 and over.in_flight_growth > 1.5 and over.ttft_growth > 1.5
    fine = overload(_open_loop(30, 0.25, 0.125, slots=1))  # 4 req/s into 8 req/s
    assert fine.overloaded is False
    # No queue, long requests: in flight ramps up from an empty server, TTFT stays: not overloaded.
    ramp = overload(_open_loop(30, 0.05, 0.6))
    assert ramp.in_flight_growth > 1.5 and ramp.overloaded is False
    assert overload(_open_loop(5, 0.05, 0.125, slots=1)).overloaded is None  # too few requests to judge
