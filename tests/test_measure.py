"""measure_server against the FAKE timed OpenAI server: warm-up excluded, fresh prompts per repeat, shared
prefixes, progress, notes. Timing accuracy itself is tested in test_loadgen.py."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from tunelab.tasks.loadgen import PromptBuilder, make_client  # noqa: E402
from tunelab.tasks.measure import measure_server, progress_reporter, window_prompts  # noqa: E402
from timed_openai_server import FakeServerProcess, FakeTiming, fake_tokenize  # noqa: E402
from tunelab.core.plan import Plan, Workload  # noqa: E402

MODEL = "fake-model"


@pytest.fixture(scope="module")
def fake():
    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002, tokens_per_chunk=1), model=MODEL) as s:
        yield s


def _plan(**kw):
    base = dict(name="t", model="unused", workloads=[Workload(name="w", prompt_tokens=24, output_tokens=4,
                                                               num_requests=5)],
                concurrency=[2], warmup_requests=3, repeats=2, seed=7)
    base.update(kw)
    return Plan(**base)


def test_warmup_excluded_and_each_repeat_has_fresh_prompts(fake):
    fake.reset()
    seen = []
    res = measure_server(fake.base_url, "k", MODEL, _plan(), progress=lambda lab, d, t: seen.append((lab, d, t)))
    req = res.requests
    assert len(req) == 2 * 5 and set(req["repeat"]) == {0, 1}  # warm-up requests are not rows
    assert req["ok"].all() and (req["prompt_tokens"] == 24).all()  # exact lengths, as the server counted
    assert len(res.measurements) == 2
    log = fake.log()["log"]
    assert len(log) == 3 + 2 * 5  # the server did get the warm-up requests
    warm, rep0, rep1 = ({e["prompt_sha1"] for e in log[a:b]} for a, b in ((0, 3), (3, 8), (8, 13)))
    assert len(warm) == 3 and len(rep0) == 5 and len(rep1) == 5
    assert not warm & rep0 and not warm & rep1 and not rep0 & rep1  # nothing served twice
    # Progress: every measured request once, per window, ending at total.
    assert len(seen) == 10 and {(lab, d) for lab, d, t in seen if d == t} == {
        (lab, 5) for lab, _, _ in seen}
    assert any("/metrics could not be scraped" in n for n in res.notes)  # the fake has no /metrics


def test_same_seed_same_prompts_new_seed_new_prompts(fake):
    fake.reset()
    measure_server(fake.base_url, "k", MODEL, _plan(warmup_requests=0, repeats=1), progress=lambda *a: None)
    a = [e["prompt_sha1"] for e in fake.log()["log"]]
    fake.reset()
    measure_server(fake.base_url, "k", MODEL, _plan(warmup_requests=0, repeats=1), progress=lambda *a: None)
    b = [e["prompt_sha1"] for e in fake.log()["log"]]
    fake.reset()
    measure_server(fake.base_url, "k", MODEL, _plan(warmup_requests=0, repeats=1, seed=8), progress=lambda *a: None)
    c = [e["prompt_sha1"] for e in fake.log()["log"]]
    assert sorted(a) == sorted(b) and not set(a) & set(c)


def test_shared_prefix_is_common_to_requests_and_repeats(fake):
    w = Workload(name="pfx", prompt_tokens=40, output_tokens=2, num_requests=3, shared_prefix_tokens=16)

    async def go():
        async with make_client(fake.base_url, "k", 8) as client:
            b = PromptBuilder(client, MODEL)
            return await window_prompts(b, w, 3, seed=1), await window_prompts(b, w, 3, seed=2)

    r0, r1 = asyncio.run(go())
    prompts = r0 + r1
    # The longest common prefix of all six has (at least) the 16 shared tokens; the rest differs.
    common = prompts[0]
    for p in prompts[1:]:
        while not p.startswith(common):
            common = common[:-1]
    assert len(fake_tokenize(common)) >= 16
    assert len(set(prompts)) == 6 and all(len(fake_tokenize(p)) == 40 for p in prompts)
    w0 = Workload(name="nopfx", prompt_tokens=40, output_tokens=2, num_requests=3)

    async def go0():
        async with make_client(fake.base_url, "k", 8) as client:
            b = PromptBuilder(client, MODEL)
            return await window_prompts(b, w0, 3, seed=1), await window_prompts(b, w0, 3, seed=2)

    s0, s1 = asyncio.run(go0())
    lead = {p.split(" ")[0] + " " + p.split(" ")[1] for p in s0 + s1}
    assert len(lead) > 1  # without a shared prefix, prompts do not all start alike


def test_rate_level_and_notes(fake):
    fake.reset()
    res = measure_server(fake.base_url, "k", MODEL, _plan(concurrency=[], request_rates=[50.0], repeats=1,
                                                          warmup_requests=1), progress=lambda *a: None)
    m = res.measurements.iloc[0]
    assert m["load_kind"] == "rate" and m["completed"] == 5


def test_progress_reporter_logs_when_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    stream = io.StringIO()
    logger = logging.getLogger("test-progress")
    logger.setLevel(logging.INFO)
    h = logging.StreamHandler(stream)
    logger.addHandler(h)
    try:
        with progress_reporter(logger, min_interval_s=3600) as cb:
            for d in range(1, 4):
                cb("w c=1 repeat 1/1", d, 3)
    finally:
        logger.removeHandler(h)
    lines = stream.getvalue().splitlines()
    assert lines[-1] == "w c=1 repeat 1/1: 3/3 requests" and len(lines) == 2  # first, then the end (throttled)


def test_run_interruptible_reraises_what_a_loop_callback_raised():
    """A signal handler's exception raised inside a loop callback (a transport's data_received) is logged and
    dropped by plain asyncio.run; run_interruptible ends the run with it."""
    from prefect.exceptions import TerminationSignal

    from tunelab.tasks.measure import run_interruptible

    async def long():
        loop = asyncio.get_running_loop()

        def bang():
            raise TerminationSignal(15)

        loop.call_later(0.05, bang)
        await asyncio.sleep(30)

    t0 = time.monotonic()
    with pytest.raises(TerminationSignal):
        run_interruptible(long())
    assert time.monotonic() - t0 < 5


def test_sigterm_raising_handler_ends_a_measurement(fake):
    """Prefect's cancellation: SIGTERM whose handler raises TerminationSignal, in the middle of a window."""
    import os
    import signal
    import threading

    from prefect.exceptions import TerminationSignal

    def bridge(signum, frame):  # what Prefect's SIGTERM bridge does
        raise TerminationSignal(signum)

    plan = _plan(workloads=[Workload(name="w", prompt_tokens=16, output_tokens=64, num_requests=400)],
                 concurrency=[4], repeats=3)
    started = threading.Event()
    previous = signal.signal(signal.SIGTERM, bridge)
    killer = threading.Thread(target=lambda: started.wait(60) and (time.sleep(0.3), os.kill(os.getpid(), signal.SIGTERM)))
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TerminationSignal):
            measure_server(fake.base_url, "k", MODEL, plan,
                           progress=lambda label, done, total: started.set() if "repeat" in label else None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        killer.join(10)
    assert time.monotonic() - t0 < 60


def _stalling_fake(tmp_path, name):
    """A FAKE server whose first batch of each new in-flight size stalls it 0.4 s and logs vLLM's JIT line."""
    log = tmp_path / f"{name}.log"
    log.write_text("(APIServer pid=1) INFO 12-01 10:00:00 [api_server.py:1] boot lines before the windows\n")
    timing = FakeTiming(ttft_s=0.02, itl_s=0.005, tokens_per_chunk=1, new_size_stall_s=0.4)
    return FakeServerProcess(timing, model=MODEL, log_file=log), log


def _jit_plan(**kw):
    return _plan(workloads=[Workload(name="w", prompt_tokens=24, output_tokens=8, num_requests=8)],
                 concurrency=[4], repeats=1, requests_per_concurrency=0, **kw)


def test_warmup_reaches_the_level_concurrency_so_no_batch_size_is_new_in_the_window(tmp_path):
    srv, log = _stalling_fake(tmp_path, "warm")
    with srv:
        res = measure_server(srv.base_url, "k", MODEL, _jit_plan(warmup_requests=2), progress=lambda *a: None,
                             server_log=log)
        stalls = srv.stats()["stalls"]
    m = res.measurements.iloc[0]
    # warmup_requests is a minimum: the warm-up ran 4 requests at concurrency 4, all 4 in flight at once...
    assert m["warmup_requests"] == 4 and m["warmup_peak_in_flight"] == 4
    assert stalls == [1, 2, 3, 4]  # ...so the fake stalled on every size during the warm-up...
    assert log.read_text().count("JIT compilation during inference") == 4
    # ...and not in the measured window: no stalled request, no compile line in the window's log slice.
    assert m["compile_during_window"] == False and m["compile_log_lines"] is None  # noqa: E712 (numpy bool)
    assert res.requests["ok"].all()
    assert res.requests["ttft_s"].max() < 0.02 + 0.4 / 2
    assert m["peak_in_flight"] == 4 and m["client_bound"] == False  # noqa: E712
    assert not any("compiled" in n or "warm-up's" in n for n in res.notes)


def test_compilation_in_a_window_is_flagged_and_not_blamed_on_the_client(tmp_path):
    srv, log = _stalling_fake(tmp_path, "cold")
    with srv:
        # No warm-up on purpose (a cold measurement): the window runs every size for the first time.
        res = measure_server(srv.base_url, "k", MODEL, _jit_plan(warmup_requests=0), progress=lambda *a: None,
                             server_log=log)
    m = res.measurements.iloc[0]
    assert m["warmup_requests"] == 0
    assert m["compile_during_window"] == True  # noqa: E712
    assert m["compile_log_lines"].count("JIT compilation during inference") == 4
    assert res.requests["ttft_s"].max() > 0.4  # the stalls are in the window's numbers...
    assert any("compiled during the measured window" in n for n in res.notes)
    # ...but the client kept its 4 slots busy while it had requests to send and used little CPU: not bound.
    assert m["in_flight_while_sending"] >= 0.9 * 4 and m["client_bound"] == False  # noqa: E712


def test_without_a_server_log_the_compile_flag_is_unknown(fake):
    fake.reset()
    res = measure_server(fake.base_url, "k", MODEL, _plan(repeats=1), progress=lambda *a: None)
    m = res.measurements.iloc[0]
    assert m["compile_during_window"] is None and m["warmup_requests"] == 3


def test_warmup_requests_for_levels():
    from tunelab.core.load_profiles import profile_for as LoadLevel  # a level is a load profile now
    from tunelab.tasks.measure import warmup_requests_for

    p = _plan(warmup_requests=4)
    assert warmup_requests_for(p, LoadLevel("concurrency", 8.0)) == 8
    assert warmup_requests_for(p, LoadLevel("concurrency", 2.0)) == 4  # the plan's count is a minimum
    assert warmup_requests_for(p, LoadLevel("rate", 10.5)) == 11  # one second of arrivals
    assert warmup_requests_for(p, LoadLevel("rate", 0.5)) == 4
    assert warmup_requests_for(_plan(warmup_requests=0), LoadLevel("concurrency", 8.0)) == 0
    with pytest.raises(ValueError, match="kind"):
        warmup_requests_for(p, LoadLevel("burst", 1.0))


def test_progress_logger_throttles_on_the_monotonic_clock(monkeypatch):
    """The one progress throttle (used by progress_reporter off a terminal and by the trial flow's measure
    task): the first call logs, then at most one line per ``min_interval_s``, and always the window's end."""
    from tunelab.tasks import measure as meas

    now = {"t": 100.0}
    monkeypatch.setattr(meas.time, "monotonic", lambda: now["t"])
    seen: list[str] = []

    class _Log:
        def info(self, fmt, *args):
            seen.append(fmt % args)

    cb = meas.progress_logger(_Log(), min_interval_s=2.0)
    for t, done in [(100.0, 1), (101.9, 2), (102.0, 3), (103.0, 4), (103.5, 5)]:
        now["t"] = t
        cb("w", done, 5)
    assert seen == ["w: 1/5 requests", "w: 3/5 requests", "w: 5/5 requests"]


# -- steady-state windows and duration windows (FAKE timed server: exact server timing) -----------------------
@pytest.fixture(scope="module")
def slow_fake():
    """FAKE server with 0.1 s requests (TTFT 10 ms, 10 ms per token, 10 tokens), long enough that the ramp, the
    steady part and the drain of a window are far apart compared with the client's own delays."""
    with FakeServerProcess(FakeTiming(ttft_s=0.01, itl_s=0.01, tokens_per_chunk=1), model=MODEL) as s:
        yield s


def test_closed_loop_window_records_and_excludes_its_ramp(slow_fake):
    res = measure_server(slow_fake.base_url, "k", MODEL, _plan(
        workloads=[Workload(name="w", prompt_tokens=16, output_tokens=10, num_requests=12)], concurrency=[4],
        warmup_requests=0, repeats=1), progress=lambda *a: None)
    m, req = res.measurements.iloc[0], res.requests
    assert m["steady_state"] and m["window_duration_s"] is None
    # The first wave: 3 requests sent before the 4th put 4 in flight; nothing is sent after the last send.
    assert (m["ramp_requests"], m["steady_requests"], m["drain_requests"]) == (3, 9, 0)
    assert m["ramp_s"] + m["steady_s"] + m["drain_s"] == pytest.approx(m["duration_s"])
    first3 = req.sort_values("send_ts").head(3)
    assert (first3["send_ts"] < req["send_ts"].min() + m["ramp_s"] + 1e-9).all()
    # The drain: after the last send, the last wave finishes; the steady part ends at its first end.
    ends = req["end_ts"].sort_values()
    assert req["send_ts"].max() < req["send_ts"].min() + m["ramp_s"] + m["steady_s"] <= ends.iloc[-1]
    assert m["steady_s"] < m["duration_s"]


def test_rate_window_excludes_the_drain_after_the_last_arrival(slow_fake):
    res = measure_server(slow_fake.base_url, "k", MODEL, _plan(
        workloads=[Workload(name="w", prompt_tokens=16, output_tokens=10, num_requests=10)], concurrency=[],
        request_rates=[40.0], warmup_requests=0, repeats=1), progress=lambda *a: None)
    m, req = res.measurements.iloc[0], res.requests
    first_send, last_send, last_end = req["send_ts"].min(), req["send_ts"].max(), req["end_ts"].max()
    assert m["steady_state"]
    # Ramp: until the first end (about one 0.1 s request of the fake); drain: the last arrival's life.
    assert m["ramp_s"] == pytest.approx(req["end_ts"].min() - first_send, abs=1e-6) and m["ramp_s"] >= 0.09
    assert m["drain_s"] == pytest.approx(last_end - last_send, abs=1e-6) and m["drain_s"] >= 0.09
    t0, t1 = first_send + m["ramp_s"], last_send
    assert m["ramp_requests"] == (req["send_ts"] < t0).sum() and m["steady_requests"] == 10 - m["ramp_requests"]
    # Output tokens/s = tokens streamed in the steady part / its length (1 token per chunk on this fake).
    streamed = sum(sum(t0 <= s + o <= t1 for o in offs) for s, offs in zip(req["send_ts"], req["chunk_offsets_s"]))
    assert m["output_tokens_per_s"] == pytest.approx(streamed / (t1 - t0), rel=1e-9)


def test_duration_window_sends_until_its_duration_and_ends_on_time(slow_fake):
    duration_s = 0.8
    t0 = time.monotonic()
    res = measure_server(slow_fake.base_url, "k", MODEL, _plan(
        workloads=[Workload(name="w", prompt_tokens=16, output_tokens=10, num_requests=3)], concurrency=[2],
        warmup_requests=4, repeats=1, window={"duration_s": duration_s}), progress=lambda *a: None)
    took = time.monotonic() - t0
    m, req = res.measurements.iloc[0], res.requests
    sends = req["send_ts"] - req["send_ts"].min()
    assert m["window_duration_s"] == duration_s
    assert sends.max() < duration_s  # nothing sent at or after the duration
    # It kept sending until then (not num_requests=3): 2 slots of ~0.1 s requests for 0.8 s.
    assert len(req) > 6 and sends.max() > duration_s - 2 * req["e2el_s"].max()
    # The window ends on time: at most one request after its duration.
    assert m["duration_s"] < duration_s + 2 * req["e2el_s"].max()
    assert took < 30
    assert not any("ran out of" in n for n in res.notes)


def test_prefix_cache_is_reset_after_the_warm_up_and_before_every_window_with_its_outcome(fake, monkeypatch):
    # The reset comes right before each window (so after the level's warm-up too), and its outcome is the
    # window's: the fake has no /reset_prefix_cache (404), as a server without VLLM_SERVER_DEV_MODE=1.
    import tunelab.tasks.measure as measure

    fake.reset()
    served_at_reset: list[int] = []
    real = measure.reset_prefix_cache

    async def spy(client):
        served_at_reset.append(len(fake.log()["log"]))  # completions the server had got by then
        return await real(client)

    monkeypatch.setattr(measure, "reset_prefix_cache", spy)
    res = measure_server(fake.base_url, "k", MODEL, _plan(), progress=lambda *a: None)
    assert served_at_reset == [3, 3 + 5]  # after the 3 warm-up requests; after window 1; none after the last
    m = res.measurements
    assert m["prefix_cache_reset"].str.startswith("unavailable: HTTP 404").all()
    assert m["unique_prompts"].astype(bool).all() and (m["control_retries"] == 0).all()
    assert not any("prefix-cache reset" in n for n in res.notes)  # unavailable is recorded, not a note per window


def test_an_open_loop_rate_past_the_servers_capacity_is_overloaded_and_higher_rates_are_not_run():
    # A FIFO server of one slot, each request 25 ms + 10 x 5 ms = 75 ms: it completes 13.3 requests/s. At 3 req/s it
    # keeps up; at 40 req/s the queue grows over the window (completions behind arrivals, in flight and TTFT
    # growing): overloaded, and 80 req/s is not measured (guidellm's --detect-saturation).
    timing = FakeTiming(ttft_s=0.025, itl_s=0.005, tokens_per_chunk=1, max_running=1)
    plan = Plan(name="t", model="unused", concurrency=[], request_rates=[3, 40, 80], repeats=1, warmup_requests=0,
                seed=3, workloads=[Workload(name="w", prompt_tokens=8, output_tokens=10, num_requests=24)])
    with FakeServerProcess(timing, model=MODEL, server="uvicorn") as slow:
        res = measure_server(slow.base_url, "k", MODEL, plan, progress=lambda *a: None)
    m = res.measurements.set_index("load_value")
    assert sorted(m.index) == [3.0, 40.0]  # 80 req/s not run
    assert m.loc[3.0, "overloaded"] == False  # noqa: E712 - a nullable bool
    assert m.loc[40.0, "overloaded"] == True  # noqa: E712
    assert sum("overloaded: the server fell behind" in n for n in res.notes) == 1
    assert any("not measured: the server was overloaded" in n for n in res.notes)
