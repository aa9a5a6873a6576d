"""Control calls (/tokenize, /metrics, /reset_prefix_cache) against a FAKE server that drops connections: a
dropped connection is retried on a fresh one and recorded; a server that is gone still fails; the reset's
answer is read, not only its status."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from dropping_control_server import DroppingControlServer, json_route  # noqa: E402
from tunelab.tasks.loadgen import PromptBuilder  # noqa: E402
from tunelab.tasks.loadgen.control import CONTROL_ATTEMPTS, control_call, take_retries  # noqa: E402
from tunelab.tasks.measure import RESET_OK, _scrape, reset_prefix_cache  # noqa: E402

METRICS = (b"# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\n"
           b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n')


def test_tokenize_survives_a_dropped_connection_and_says_so():
    # The H200 case: the /tokenize call after a window met a connection the server had closed (ReadError) and
    # the trial failed as measurement_error. Now: one retry on a fresh connection, recorded.
    with DroppingControlServer({"/tokenize": json_route({"count": 3, "tokens": [1, 2, 3]})}, drop_first=1) as fake:
        async def go():
            async with httpx.AsyncClient(base_url=fake.base_url) as client:
                n = await PromptBuilder(client, "m").count("a b c")
                return n, take_retries(client), take_retries(client)

        n, retried, again = asyncio.run(go())
    assert n == 3
    assert fake.dropped == 1 and fake.paths == ["/tokenize", "/tokenize"]
    assert len(retried) == 1 and retried[0].startswith("POST /tokenize: RemoteProtocolError")
    assert retried[0].endswith("ok on attempt 2")
    assert again == []  # taken once


def test_metrics_scrape_survives_a_dropped_connection():
    with DroppingControlServer({"/metrics": (200, METRICS, "text/plain")}, drop_first=1) as fake:
        async def go():
            async with httpx.AsyncClient(base_url=fake.base_url) as client:
                return await _scrape(client), take_retries(client)

        snap, retried = asyncio.run(go())
    assert snap is not None and snap.has("vllm:num_requests_running")
    assert len(retried) == 1


def test_a_server_that_is_gone_still_fails_after_bounded_attempts():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            with pytest.raises(httpx.ConnectError):
                await control_call(client, "POST", "/tokenize", json={})
            return take_retries(client)

    retried = asyncio.run(go())
    assert len(retried) == 1 and f"failed {CONTROL_ATTEMPTS} attempts" in retried[0]


def test_a_dropped_connection_every_time_is_not_retried_forever():
    with DroppingControlServer({"/tokenize": json_route({"count": 1})}, drop_first=100) as fake:
        async def go():
            async with httpx.AsyncClient(base_url=fake.base_url) as client:
                with pytest.raises(httpx.RemoteProtocolError):
                    await control_call(client, "POST", "/tokenize", json={})

        asyncio.run(go())
    assert fake.dropped == CONTROL_ATTEMPTS


@pytest.mark.parametrize("route, outcome", [
    (json_route({"success": False}), "not_taken"),   # vLLM PR 12284: refused while blocks are in use
    ((200, b"", "application/json"), RESET_OK),        # vLLM's empty 200
    (json_route({"success": True}), RESET_OK),
    (json_route({"detail": "Not Found"}, 404), "unavailable"),  # no VLLM_SERVER_DEV_MODE=1
])
def test_prefix_cache_reset_reads_the_answer_not_only_the_status(route, outcome):
    with DroppingControlServer({"/reset_prefix_cache": route}, drop_first=0) as fake:
        async def go():
            async with httpx.AsyncClient(base_url=fake.base_url) as client:
                return await reset_prefix_cache(client)

        got = asyncio.run(go())
    assert got.split(":")[0] == outcome


def test_the_gauge_sampler_survives_a_dropped_connection():
    """GaugePeaks read /metrics with a plain get: a dropped keep-alive connection lost the sample (a window's KV
    peak could be missing for it). Now a control call: retried on a fresh connection and recorded."""
    from tunelab.tasks.bottleneck_evidence import GaugePeaks

    page = (b"# HELP vllm:kv_cache_usage_perc u\n# TYPE vllm:kv_cache_usage_perc gauge\n"
            b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42\n')
    with DroppingControlServer({"/metrics": (200, page, "text/plain")}, drop_first=1) as fake:
        async def go():
            async with httpx.AsyncClient(base_url=fake.base_url) as client:
                g = GaugePeaks(client)
                await g._read()
                return g, take_retries(client)

        g, retried = asyncio.run(go())
    assert fake.dropped == 1 and g.samples == 1 and g.peaks["kv_cache_usage"][0] == pytest.approx(0.42)
    assert len(retried) == 1 and retried[0].startswith("GET /metrics: RemoteProtocolError")


def test_the_health_call_after_a_failed_measurement_survives_a_dropped_connection():
    """A dropped connection on the post-failure /health read as 'alive but /health did not answer: hung or
    stopped', a wrong cause in the trial's failure reason; it is retried as every control call."""
    from types import SimpleNamespace

    from tunelab.tasks.steps.measure_windows import server_state as _server_state

    with DroppingControlServer({"/health": (200, b"", "text/plain")}, drop_first=1) as fake:
        state = _server_state(SimpleNamespace(proc=SimpleNamespace(poll=lambda: None), base_url=fake.base_url))
    assert fake.dropped == 1 and state == "server alive, /health answered 200", state
