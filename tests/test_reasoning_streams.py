"""Reasoning streams (issue 16, item 6) against the FAKE timed OpenAI servers (tests/fakes/), both HTTP stacks
of the fake and both transports of the load generator.

A server run with a reasoning parser streams the thinking in the delta's ``reasoning`` (vLLM >= 0.10.2) or
``reasoning_content`` (older releases) before the answer's ``content``; tool calls stream as ``tool_calls``
deltas. The fake's ``[[reasoning:K:FIELD]]`` marker streams the first K tokens that way. TTFT and ITL count
every token chunk; the time to first visible content is ``ttfc_s``; a request whose whole budget went to
reasoning is a success. Checks are structural (chunk counts, which chunk is the first content), never
absolute times.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from tunelab.tasks import metrics as M  # noqa: E402
from tunelab.tasks.loadgen import make_client, run_level  # noqa: E402
from timed_openai_server import FakeServerProcess, FakeTiming  # noqa: E402

MODEL = "fake-model"
N_TOKENS = 10
THINK = 4


@pytest.fixture(scope="module", params=["uvicorn", "raw"])
def fake(request):
    with FakeServerProcess(FakeTiming(ttft_s=0.02, itl_s=0.005, tokens_per_chunk=1), model=MODEL,
                           server=request.param) as s:
        yield s


def _one(fake, prompt: str, transport: str, endpoint: str = "chat", max_tokens: int = N_TOKENS) -> dict:
    """One request through ``run_level``, derived into its ``requests`` row."""

    async def go():
        async with make_client(fake.base_url, "test-key", 4) as client:
            return await run_level(client, MODEL, [prompt], max_tokens, load_kind="concurrency", load_value=1,
                                   endpoint=endpoint, transport=transport)

    res = asyncio.run(go())
    raw = res.records[0]
    return M.derive_request({**raw, "workload": "w", "load_kind": "concurrency", "load_value": 1.0, "repeat": 0,
                             "request_index": 0, "requested_output_tokens": max_tokens, "ignore_eos": True})


@pytest.mark.parametrize("transport", ["raw", "httpx"])
@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_tokens_count_for_ttft_and_itl_and_content_gets_its_own_column(fake, transport, field):
    row = _one(fake, f"think first [[reasoning:{THINK}:{field}]]", transport)
    assert row["ok"], row["error"]
    offs = row["chunk_offsets_s"]
    # Every token is a chunk (tokens_per_chunk=1), reasoning included: TTFT is the first reasoning chunk.
    assert len(offs) == N_TOKENS
    assert row["ttft_s"] == pytest.approx(offs[0])
    assert row["reasoning_chunks"] == THINK
    # The first visible content is the chunk right after the thinking.
    assert row["ttfc_s"] == pytest.approx(offs[THINK])
    assert row["ttfc_s"] > row["ttft_s"]
    assert row["first_content_ts"] == pytest.approx(row["send_ts"] + row["ttfc_s"])
    assert row["itl_mean_s"] == pytest.approx((offs[-1] - offs[0]) / (N_TOKENS - 1))


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_both_field_names_give_the_same_numbers(fake, transport):
    """Same structure under either name: chunk count, reasoning chunks, which chunk is the first content."""
    rows = [_one(fake, f"same [[reasoning:{THINK}:{f}]]", transport) for f in ("reasoning", "reasoning_content")]
    shape = [(r["ok"], len(r["chunk_offsets_s"]), r["reasoning_chunks"], r["output_tokens"],
              r["chunk_offsets_s"].index(r["ttfc_s"])) for r in rows]
    assert shape[0] == shape[1] == (True, N_TOKENS, THINK, N_TOKENS, THINK)


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_whole_budget_spent_on_reasoning_is_a_success_without_content(fake, transport):
    row = _one(fake, f"only thinking [[reasoning:{N_TOKENS}:reasoning]]", transport)
    assert row["ok"] and row["error"] is None
    assert row["ttft_s"] is not None and row["tpot_s"] is not None
    assert row["reasoning_chunks"] == N_TOKENS
    assert row["ttfc_s"] is None and row["first_content_ts"] is None


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_tool_call_deltas_count_as_tokens(fake, transport):
    row = _one(fake, f"call a tool [[reasoning:{THINK}:tool_calls]]", transport)
    assert row["ok"], row["error"]
    assert len(row["chunk_offsets_s"]) == N_TOKENS
    assert row["reasoning_chunks"] == 0
    assert row["ttfc_s"] == pytest.approx(row["chunk_offsets_s"][THINK])


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_without_reasoning_time_to_first_content_is_ttft(fake, endpoint):
    row = _one(fake, "plain answer", "raw", endpoint=endpoint)
    assert row["ok"], row["error"]
    assert row["reasoning_chunks"] == 0
    assert row["ttfc_s"] == row["ttft_s"]


def test_a_raw_record_from_before_reasoning_streams_derives_ttfc_from_its_first_chunk():
    """Records written before first_content_ts existed (every chunk was content) still derive."""
    row = M.derive_request({"workload": "w", "load_kind": "concurrency", "load_value": 1.0, "repeat": 0,
                            "request_index": 0, "send_ts": 100.0, "chunk_ts": [100.5, 100.6], "end_ts": 100.7,
                            "prompt_tokens": 3, "output_tokens": 2, "requested_output_tokens": 2,
                            "ignore_eos": True, "finish_reason": "length", "transport_error": None})
    assert row["ok"] and row["ttfc_s"] == pytest.approx(0.5) and row["reasoning_chunks"] == 0
