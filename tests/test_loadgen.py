"""Load generator against the FAKE timed OpenAI server (tests/fakes/timed_openai_server.py).

The fake logs when it read each request and when it handed each chunk to the transport (perf_counter,
one clock for all processes on Linux), so the client's timestamps are checked against what the server did.
Tolerances are generous (25 ms) because the box's 2 cores are shared; causality relations (a client can
never see a chunk before the server sent it) are exact.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from tunelab.tasks import metrics as M  # noqa: E402
from tunelab.core.load_profiles import arrival_offsets  # noqa: E402
from tunelab.tasks.loadgen import Clock, PromptBuilder, make_client, run_level  # noqa: E402
from timed_openai_server import FakeServerProcess, FakeTiming, fake_tokenize  # noqa: E402

TOL_S = 0.025
MODEL = "fake-model"


@pytest.fixture(scope="module")
def fake():
    with FakeServerProcess(FakeTiming(ttft_s=0.05, itl_s=0.01, tokens_per_chunk=1), model=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def fake4():
    with FakeServerProcess(FakeTiming(ttft_s=0.03, itl_s=0.005, tokens_per_chunk=4), model=MODEL) as s:
        yield s


def _run(fake, prompts, max_tokens=8, **kw):
    async def go():
        async with make_client(fake.base_url, "test-key", 64) as client:
            return await run_level(client, MODEL, prompts, max_tokens, **kw)

    fake.reset()
    return asyncio.run(go())


def _derive(raw, i, requested):
    return M.derive_request({**raw, "workload": "w", "load_kind": "concurrency", "load_value": 1.0, "repeat": 0,
                             "request_index": i, "requested_output_tokens": requested, "ignore_eos": True})


def _by_sha(log):
    return {e["prompt_sha1"]: e for e in log}


def _sha(p):
    return hashlib.sha1(p.encode()).hexdigest()


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_timings_match_fake_emission_times_at_low_concurrency(fake, transport):
    prompts = [f"timing {transport} {i} hello there" for i in range(6)]
    res = _run(fake, prompts, max_tokens=10, load_kind="concurrency", load_value=2, transport=transport)
    log = _by_sha(fake.log()["log"])
    clock = Clock(res.clock_origin)
    for i, (p, raw) in enumerate(zip(prompts, res.records)):
        e = log[_sha(p)]
        row = _derive(raw, i, 10)
        assert row["ok"], row["error"]
        # Causality on one clock: sent before the server read it; each chunk seen after the server began
        # writing it.
        assert clock.to_perf(raw["send_ts"]) <= e["recv"]
        assert all(clock.to_perf(c) >= em for c, em in zip(raw["chunk_ts"], e["emit_pre"]))
        assert len(raw["chunk_ts"]) == len(e["emit"]) == 10
        assert abs(row["ttft_s"] - (e["emit"][0] - e["recv"])) < TOL_S
        assert abs(row["e2el_s"] - (e["emit"][-1] - e["recv"])) < TOL_S  # E2EL ends at the last token
        gaps_err = np.diff(row["chunk_offsets_s"]) - np.diff(e["emit"])
        assert np.max(np.abs(gaps_err)) < TOL_S
        assert row["ttft_s"] >= 0.05 - 1e-3  # the fake never emits before its schedule
    assert res.records[0]["prompt_tokens"] == len(fake_tokenize(prompts[0]))


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_chat_role_only_first_chunk_is_not_a_token(fake, transport):
    prompts = [f"chat {transport} {i}" for i in range(2)]
    res = _run(fake, prompts, max_tokens=5, load_kind="concurrency", load_value=1, endpoint="chat",
               transport=transport)
    log = _by_sha(fake.log()["log"])
    clock = Clock(res.clock_origin)
    for i, (p, raw) in enumerate(zip(prompts, res.records)):
        e = log[_sha(p)]
        assert e["role"] is not None and e["role"] < e["emit"][0]  # the fake did send a role chunk first
        assert len(raw["chunk_ts"]) == 5
        assert clock.to_perf(raw["chunk_ts"][0]) >= e["emit_pre"][0]  # TTFT ends at content, not at the role chunk
        row = _derive(raw, i, 5)
        assert row["ok"] and row["ttft_s"] >= 0.05 - 1e-3


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_several_tokens_per_chunk_tpot_from_usage(fake4, transport):
    prompts = [f"multi {transport} {i}" for i in range(3)]
    res = _run(fake4, prompts, max_tokens=10, load_kind="concurrency", load_value=3, transport=transport)
    log = _by_sha(fake4.log()["log"])
    for i, (p, raw) in enumerate(zip(prompts, res.records)):
        e = log[_sha(p)]
        assert e["chunk_tokens"] == [4, 4, 2]
        assert len(raw["chunk_ts"]) == 3 and raw["output_tokens"] == 10
        row = _derive(raw, i, 10)
        assert row["ok"], row["error"]
        true_tpot = (e["emit"][-1] - e["emit"][0]) / 9
        assert abs(row["tpot_s"] - true_tpot) < TOL_S / 9 + 1e-3
        # TPOT counts tokens, not chunks: a chunk gap spans 4 tokens.
        assert row["itl_mean_s"] > 2 * row["tpot_s"]


@pytest.fixture(scope="module")
def fake_late_usage():
    """A FAKE that sends the usage-only chunk 50 ms after the last token (then [DONE]): 16 tokens at 5 ms."""
    with FakeServerProcess(FakeTiming(ttft_s=0.035, itl_s=0.005, tokens_per_chunk=1, usage_delay_s=0.05),
                           model=MODEL) as s:
        yield s


@pytest.mark.parametrize("server", ["uvicorn", "raw"])
@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_late_usage_chunk_ends_e2el_and_tpot_at_the_last_token(fake_late_usage, transport, server):
    if server == "raw":  # the lean fake must behave the same
        ctx = FakeServerProcess(fake_late_usage.timing, model=MODEL, server="raw")
    else:
        ctx = None
    srv = ctx.start() if ctx else fake_late_usage
    try:
        prompts = [f"late usage {transport} {server} {i}" for i in range(3)]
        res = _run(srv, prompts, max_tokens=16, load_kind="concurrency", load_value=1, transport=transport)
        log = _by_sha(srv.log()["log"])
        clock = Clock(res.clock_origin)
        for i, (p, raw) in enumerate(zip(prompts, res.records)):
            e = log[_sha(p)]
            assert e["usage"] - e["emit"][-1] >= 0.05  # the fake did wait before the usage chunk
            row = _derive(raw, i, 16)
            assert row["ok"], row["error"]
            true_tpot = (e["emit"][-1] - e["emit"][0]) / 15  # 5 ms, not (5 * 15 + 50) / 15 = 8.3 ms
            assert abs(row["tpot_s"] - true_tpot) < 0.5 * (0.05 / 15)
            assert abs(row["e2el_s"] - (e["emit"][-1] - e["recv"])) < 0.5 * 0.05
            # The stream's end is kept: after the usage chunk, so at least 50 ms after the last token.
            assert clock.to_perf(raw["end_ts"]) >= e["usage"]
            assert row["end_ts"] - row["last_token_ts"] >= 0.05 - 1e-3
    finally:
        if ctx:
            ctx.stop()


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_cut_off_stream_and_http_503_are_failed_with_reasons(fake, transport):
    prompts = ["ok one", "[[fault:cut:3]] cut me", "[[fault:503]] overloaded", "ok two"]
    res = _run(fake, prompts, max_tokens=6, load_kind="concurrency", load_value=1, transport=transport)
    rows = [_derive(r, i, 6) for i, r in enumerate(res.records)]
    assert rows[0]["ok"] and rows[3]["ok"]  # the connection is usable after a failed request
    cut, unavailable = rows[1], rows[2]
    assert not cut["ok"] and cut["error"].startswith("transport_error")
    assert res.records[1]["end_ts"] is None and len(res.records[1]["chunk_ts"]) == 3
    assert not unavailable["ok"] and "HTTP 503" in unavailable["error"]
    assert unavailable["ttft_s"] is None and cut["ttft_s"] is None


@pytest.mark.parametrize("processes", [1, 2])
def test_concurrency_is_reached_and_never_exceeded(fake, processes):
    prompts = [f"conc {processes} {i}" for i in range(18)]
    res = _run(fake, prompts, max_tokens=6, load_kind="concurrency", load_value=6, processes=processes)
    stats = fake.stats()
    assert stats["max_in_flight"] == 6  # the server saw exactly the target in flight, never more
    assert res.processes == processes
    # The client's own view: at no instant more than 6 requests between send and end.
    events = sorted([(r["send_ts"], 1) for r in res.records] + [(r["end_ts"], -1) for r in res.records],
                    key=lambda x: (x[0], x[1]))
    assert max(np.cumsum([d for _, d in events])) <= 6
    assert all(_derive(r, i, 6)["ok"] for i, r in enumerate(res.records))
    assert {r["worker"] for r in res.records} == set(range(processes))


def test_load_processes_share_one_queue(fake):
    """Two processes at c=2 pull from one queue: when one process's requests end fast (HTTP 503 here), it takes
    the next ones instead of idling. A static split (every other request per process) ran the slow requests
    one at a time in the other process, and the window's achieved concurrency fell short."""
    prompts = [f"share {i}" if i % 2 == 0 else f"[[fault:503]] share {i}" for i in range(8)]
    res = _run(fake, prompts, max_tokens=6, load_kind="concurrency", load_value=2, processes=2)
    assert res.processes == 2 and len(res.records) == 8
    # Records come back in request order, whichever process sent them:
    for i, r in enumerate(res.records):
        assert ("HTTP 503" in (r.get("transport_error") or "")) == (i % 2 == 1), (i, r.get("transport_error"))
    ok = [r for i, r in enumerate(res.records) if i % 2 == 0]
    events = sorted([(r["send_ts"], 1) for r in ok] + [(r["end_ts"], -1) for r in ok], key=lambda x: (x[0], x[1]))
    assert max(np.cumsum([d for _, d in events])) == 2  # two slow requests in flight at once
    assert {r["worker"] for r in ok} == {0, 1}


def test_rate_mode_follows_the_schedule(fake):
    offs = arrival_offsets(8, 20.0, 1.0, seed=3)
    prompts = [f"rate {i}" for i in range(8)]
    res = _run(fake, prompts, max_tokens=4, load_kind="rate", load_value=20.0, arrival_offsets_s=list(offs))
    sched = np.array([r["scheduled_ts"] for r in res.records])
    send = np.array([r["send_ts"] for r in res.records])
    assert np.allclose(sched - sched[0], offs - offs[0], atol=1e-6)  # the schedule is the one given
    assert np.all(send >= sched - 1e-6) and np.all(send - sched < TOL_S)  # each sent on time, never early


def test_bad_load_arguments_are_named():
    async def go(**kw):
        async with make_client("http://127.0.0.1:9", "k", 1) as client:
            return await run_level(client, MODEL, ["a"], 1, **kw)

    with pytest.raises(ValueError, match="arrival_offsets_s"):
        asyncio.run(go(load_kind="rate", load_value=1.0))
    with pytest.raises(ValueError, match="load_kind"):
        asyncio.run(go(load_kind="qps", load_value=1.0))
    with pytest.raises(ValueError, match="transport"):
        asyncio.run(go(load_kind="concurrency", load_value=1, transport="curl"))


def _build(fake, fn):
    async def go():
        async with make_client(fake.base_url, "k", 8) as client:
            b = PromptBuilder(client, MODEL)
            return await fn(b), b

    return asyncio.run(go())


def test_prompts_have_exact_token_counts_with_few_round_trips(fake):
    prompts, b = _build(fake, lambda b: b.many(64, 300, random.Random(1)))
    assert [len(fake_tokenize(p)) for p in prompts] == [300] * 64
    assert len(set(prompts)) == 64
    # Learning + verifying, not a tokenize/detokenize loop per prompt.
    assert b.stats["tokenize_calls"] <= 96 + 16 + 64
    assert b.stats["adjusted"] == 0


def test_adjustment_loop_fixes_wrong_word_counts(fake):
    async def fn(b):
        await b._learn()
        b._counts = {w: 1 for w in b._counts}  # pretend every word is one token: drafts come out too long
        return await b.many(5, 40, random.Random(2), verify="all")

    prompts, b = _build(fake, fn)
    assert [len(fake_tokenize(p)) for p in prompts] == [40] * 5
    assert b.stats["adjusted"] >= 1


def test_shared_prefix_and_seeds(fake):
    async def fn(b):
        prefix, n = await b.exact(20, random.Random(9))
        a = await b.many(4, 60, random.Random(1), prefix=prefix)
        a2 = await b.many(4, 60, random.Random(1), prefix=prefix)
        c = await b.many(4, 60, random.Random(2), prefix=prefix)
        return prefix, n, a, a2, c

    (prefix, n, a, a2, c), _ = _build(fake, fn)
    assert n == 20 and len(fake_tokenize(prefix)) == 20
    assert a == a2  # same seed, same prompts
    assert not set(a) & set(c)  # another seed, other prompts
    for p in a + c:
        assert p.startswith(prefix + " ") and len(fake_tokenize(p)) == 60


def test_request_asks_for_usage_on_every_chunk_and_records_the_first_chunks_tokens():
    # stream_options.continuous_usage_stats (vLLM): each chunk carries the cumulative usage, so the first content
    # chunk's token count (k1) is known; TPOT divides by the tokens after it (tasks.metrics.derive_request).
    from tunelab.tasks.loadgen.transport import _completion_request, _new_record, _take_event

    for endpoint in ("chat", "completions"):
        _, body, _ = _completion_request("m", "hi", 64, endpoint, True)
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    rec = _new_record()
    usage = lambda k: {"prompt_tokens": 7, "completion_tokens": k, "total_tokens": 7 + k}  # noqa: E731
    _take_event({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": usage(0)}, 1.0, rec, True)
    _take_event({"choices": [{"delta": {"content": "a b c d e"}}], "usage": usage(5)}, 1.1, rec, True)
    _take_event({"choices": [{"delta": {"content": " f"}}], "usage": usage(6)}, 1.105, rec, True)
    _take_event({"choices": [{"delta": {"content": " g"}, "finish_reason": "length"}], "usage": usage(7)}, 1.11,
                rec, True)
    assert rec["first_chunk_tokens"] == 5 and rec["output_tokens"] == 7 and rec["chunk_ts"] == [1.1, 1.105, 1.11]
    # A server that sends the usage only at the end: unknown, never a guess.
    rec = _new_record()
    _take_event({"choices": [{"text": "a b"}]}, 1.0, rec, False)
    _take_event({"choices": [], "usage": usage(2)}, 1.1, rec, False)
    assert rec["first_chunk_tokens"] is None and rec["output_tokens"] == 2


@pytest.mark.parametrize("processes", [1, 2])
def test_staggered_closed_loop_spreads_the_first_sends(fake, processes):
    """Schedule.stagger_s (issue 28.2, lockstep waves): slot k of c takes its first request k x stagger / c after
    the window's start, across load processes too (their slots continue the count). The lower bounds hold by
    construction (each slot sleeps until its turn); without a stagger the same window sends its first c at once."""
    from tunelab.core.load_profiles import Schedule

    prompts = [f"stagger {processes} {i}" for i in range(8)]
    spans = {}
    for stagger in (0.0, 0.3):  # a request takes >= 0.05 + 40 x 0.01 s: every slot starts before one ends
        res = _run(fake, prompts, max_tokens=40, schedule=Schedule(8, slots=4, stagger_s=stagger),
                   processes=processes)
        first = sorted(r["send_ts"] for r in res.records)[:4]
        assert all(_derive(r, i, 40)["ok"] for i, r in enumerate(res.records))
        gaps = np.diff(first)
        spans[stagger] = (first[-1] - first[0], gaps)
    span, gaps = spans[0.3]
    assert span >= 0.3 * 3 / 4 - 0.01, spans  # slot 3 waits 3/4 of the stagger
    assert (gaps >= 0.075 - 0.01).all(), gaps  # each slot a quarter of the stagger after the one before
    assert spans[0.0][0] < span  # together without it


def test_schedule_stagger_needs_a_closed_loop_and_a_finite_value():
    from tunelab.core.load_profiles import Schedule

    with pytest.raises(ValueError, match="stagger_s"):
        Schedule(4, send_offsets_s=(0.0, 0.1, 0.2, 0.3), stagger_s=0.5)
    with pytest.raises(ValueError, match="stagger_s"):
        Schedule(4, slots=2, stagger_s=-1.0)
