"""Kernel receive stamps in the raw transport: a chunk's timestamp is when it arrived, not when the client's
event loop got round to reading it.

The server here is a FAKE: a bare socket thread in the test process that answers one streaming completion
with a script of timed writes and stamps each write (perf_counter before and after ``sendall``; on loopback
the kernel queues the bytes on the client's socket inside that call). The client's event loop is blocked
on purpose (``time.sleep`` in a loop callback, which releases the GIL so the fake thread keeps running)
while chunks arrive. Assertions compare stamps within one run, never absolute durations.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time

import pytest

from tunelab.tasks import loadgen, rx_stamps
from tunelab.tasks.loadgen import Clock, RawPool, send_streaming_raw

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux-only")

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(payload: str) -> bytes:
    data = f"data: {payload}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


def _text(t: str) -> str:
    return json.dumps({"choices": [{"index": 0, "text": t, "finish_reason": None}]})


LAST = (_chunk(json.dumps({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}))
        + _chunk(json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}))
        + _chunk("[DONE]") + b"0\r\n\r\n")


class _ScriptedFake(threading.Thread):
    """FAKE streaming server: after reading one request, ``script`` = [(delay_s after the request, bytes)];
    ``sent`` = [(perf before sendall, perf after)] per write."""

    def __init__(self, script: list[tuple[float, bytes]]) -> None:
        super().__init__(daemon=True)
        self.script = script
        self.sent: list[tuple[float, float]] = []
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]

    def run(self) -> None:
        conn, _ = self.lsock.accept()
        self.lsock.close()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            t_req = time.perf_counter()
            for delay, data in self.script:
                time.sleep(max(0.0, t_req + delay - time.perf_counter()))
                t0 = time.perf_counter()
                conn.sendall(data)
                self.sent.append((t0, time.perf_counter()))
            conn.recv(1)  # until the client closes


def _run(script: list[tuple[float, bytes]], blocks: list[tuple[float, float]]):
    """Stream one request from a scripted fake while the client's loop is blocked for each (start, length)
    seconds after the send. Returns (record, clock, fake, pool.rx.summary())."""
    fake = _ScriptedFake(script)
    fake.start()

    async def go():
        clock = Clock()
        pool = RawPool(f"http://127.0.0.1:{fake.port}", None, clock)
        await pool.prewarm(1)
        loop = asyncio.get_running_loop()
        for start, length in blocks:
            loop.call_later(start, time.sleep, length)
        try:
            rec = await send_streaming_raw(pool, clock, "fake-model", "hi", 2)
        finally:
            pool.close()
        return rec, clock, pool.rx.summary()

    rec, clock, rx = asyncio.run(go())
    fake.join(timeout=5)
    return rec, clock, fake, rx


def _within(t: float, window: tuple[float, float], slack_s: float = 0.002) -> bool:
    return window[0] - slack_s <= t <= window[1] + slack_s


def test_chunk_stamp_is_its_arrival_while_the_loop_was_blocked():
    # chunk 1 arrives 0.1 s after the request, while the loop is blocked from 0.02 to 0.52 s; the end
    # arrives at 0.7 s while the loop is blocked again (0.6 to 1.0 s).
    rec, clock, fake, rx = _run([(0.0, HEAD), (0.1, _chunk(_text("a"))), (0.7, LAST)],
                                [(0.02, 0.5), (0.6, 0.4)])
    assert rec["transport_error"] is None and rec["output_tokens"] == 2
    first, end = clock.to_perf(rec["chunk_ts"][0]), clock.to_perf(rec["end_ts"])
    # The client read chunk 1 only after the first block ended: a read-time stamp would be ~0.4 s late.
    assert rx["kernel"] >= 2 and rx["read"] == 0
    assert rx["delay_max_s"] >= 0.2, rx  # the blocks really delayed the reads
    assert _within(first, fake.sent[1]), (first, fake.sent[1])
    assert _within(clock.to_perf(rec["chunk_ts"][1]), fake.sent[2])
    assert _within(end, fake.sent[2]), (end, fake.sent[2])  # E2EL ends at the arrival, not at the task's resume
    assert first >= clock.to_perf(rec["send_ts"])


def test_without_kernel_stamps_the_read_time_is_used_and_reported(monkeypatch):
    monkeypatch.setattr(rx_stamps, "enable", lambda sock: False)
    rec, clock, fake, rx = _run([(0.0, HEAD), (0.1, _chunk(_text("a"))), (0.15, LAST)], [(0.02, 0.4)])
    assert rec["transport_error"] is None
    assert rx == {"kernel": 0, "read": rx["read"], "delay_p99_s": None, "delay_max_s": None} and rx["read"] >= 1
    # Stamped when read, i.e. after the block: later than the server's write by most of the block.
    assert clock.to_perf(rec["chunk_ts"][0]) - fake.sent[1][1] >= 0.15
    assert loadgen._rx_fields([rx]) == ("read", None, None)


def test_rx_fields_of_a_window():
    k = {"kernel": 5, "read": 0, "delay_p99_s": 0.002, "delay_max_s": 0.004}
    r = {"kernel": 0, "read": 3, "delay_p99_s": None, "delay_max_s": None}
    assert loadgen._rx_fields([k, dict(k, delay_p99_s=0.001, delay_max_s=0.009)]) == ("kernel", 0.002, 0.009)
    assert loadgen._rx_fields([k, r]) == ("mixed", 0.002, 0.004)
    assert loadgen._rx_fields([None]) == ("read", None, None)


def _window(chunk_ts_lists, read_delay_max_s, cpu=0.1):
    recs = [{"chunk_ts": ts} for ts in chunk_ts_lists]
    return loadgen.LevelResult(recs, 1.0, cpu, rx_stamps="kernel", read_delay_p99_s=read_delay_max_s,
                               read_delay_max_s=read_delay_max_s)


def test_same_read_gaps_and_who_caused_them():
    from tunelab.tasks.measure import same_read_note

    # 2 streams, 6 gaps, 2 of them 0 s (two chunks in one read); typical gap 10 ms
    ts = [[0.0, 0.01, 0.01, 0.03], [1.0, 1.01, 1.02, 1.02]]
    late = _window(ts, read_delay_max_s=0.025)
    assert late.same_read_itl_frac() == pytest.approx(2 / 6)
    assert late.median_nonzero_gap_s() == pytest.approx(0.01)
    note = same_read_note(late)
    assert note and "client fell behind" in note and "25.0 ms late" in note and "33.3%" in note
    # the advice depends on why: an idle client waited for a CPU; a busy one needs more processes, which
    # concurrency 1 cannot use
    assert "oversubscribed" in note and "raise the plan" not in note
    busy = _window(ts, read_delay_max_s=0.025, cpu=0.8)
    assert "raise the plan's load_processes" in same_read_note(busy, 8)
    assert "at concurrency 1" in same_read_note(busy, 1)
    # the client always read within 1 ms, less than a gap: the server must have written those chunks together
    prompt = _window(ts, read_delay_max_s=0.001)
    assert "server sent those chunks together" in same_read_note(prompt)
    # without kernel stamps there is no read delay: the client is not cleared
    assert "client fell behind" in same_read_note(_window(ts, read_delay_max_s=None))
    # under the threshold (1 %): no note
    many = [[i + k * 0.01 for k in range(40)] for i in range(3)] + [[9.0, 9.0]]
    assert 0 < _window(many, 0.05).same_read_itl_frac() < 0.01 and same_read_note(_window(many, 0.05)) is None
    assert _window([[0.0], []], 0.0).same_read_itl_frac() is None
