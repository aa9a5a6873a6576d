"""Multi-turn sessions (issue 16, item 4): the workload type's specs, the session runner against the FAKE timed
OpenAI server (tests/fakes/: exact, logged arrivals; its chat prompt is the messages' contents joined), and on
the real CPU runtime the prefix-cache hits per turn, from the server's usage and its /metrics."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from tunelab.core.plan import Workload  # noqa: E402
from tunelab.tasks.loadgen import make_client, run_sessions  # noqa: E402
from tunelab.core.workloads import MultiTurnWorkload  # noqa: E402
from timed_openai_server import FakeServerProcess, FakeTiming  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODEL = "fake-model"


def test_specs_are_per_turn_messages_in_session_order_and_reproducible():
    w = MultiTurnWorkload(turns=3, prompt_tokens=100, turn_prompt_tokens=20, output_tokens=8, think_time_s=0.5)
    specs = w.request_specs(7, seed=1)
    assert [s.prompt_tokens for s in specs] == [100, 20, 20, 100, 20, 20, 100]
    assert specs == w.request_specs(7, seed=1)
    assert [w.session_of(i) for i in (0, 2, 3, 6)] == [(0, 0), (0, 2), (1, 0), (2, 0)]
    assert w.nominal_prompt_tokens == 100 + 2 * (8 + 20)
    with pytest.raises(ValueError, match="context of 150"):
        w.request_specs(3, seed=1, context_tokens=150)


def test_a_plan_workload_of_sessions_needs_the_chat_endpoint():
    spec = {"name": "mt", "type": "multi_turn", "turns": 2, "prompt_tokens": 8, "turn_prompt_tokens": 4,
            "output_tokens": 4, "num_requests": 4}
    assert Workload(**spec, endpoint="chat").type == "multi_turn"
    with pytest.raises(ValueError, match="endpoint: chat"):
        Workload(**spec)


def test_turns_carry_the_conversation_with_the_real_answers_think_time_and_sessions_interleave():
    think = 0.15
    sessions = [[f"s{k} first question", f"s{k} follow up", f"s{k} last one"] for k in range(4)]
    with FakeServerProcess(FakeTiming(ttft_s=0.02, itl_s=0.005), model=MODEL) as fake:

        async def go():
            async with make_client(fake.base_url, "k", 4) as client:
                return await run_sessions(client, MODEL, sessions, 6, concurrency=2, think_time_s=think)

        res = asyncio.run(go())
        log = fake.log()
        stats = fake.stats()
    recs = res.records
    assert [(r["session_index"], r["turn"]) for r in recs] == [(k, t) for k in range(4) for t in range(3)]
    assert [r["messages_sent"] for r in recs[:3]] == [1, 3, 5]  # user, +answer +user, ...
    assert all(r["transport_error"] is None and r["output_tokens"] == 6 for r in recs)
    # The fake's chat prompt is every message's content joined: turn t carries the earlier answers, whose
    # first token is the fake's request id <rid>.
    for k in range(4):
        mine = sorted((e for e in log["log"] if e["prompt_head"].startswith(f"s{k} first question")),
                      key=lambda e: e["recv"])
        assert len(mine) == 3
        assert f"<{mine[0]['rid']}>" in mine[1]["prompt_head"] and f"<{mine[0]['rid']}>" in mine[2]["prompt_head"]
        assert mine[0]["prompt_len_chars"] < mine[1]["prompt_len_chars"] < mine[2]["prompt_len_chars"]
    # Think time: a session's next send comes at least think_time_s after its previous answer ended.
    for a, b in zip(recs, recs[1:]):
        if a["session_index"] == b["session_index"]:
            assert b["send_ts"] - a["end_ts"] >= think * 0.95
    # Two sessions in flight at once, never three; session 2 starts only after session 0 or 1 finished.
    span = {k: (min(r["send_ts"] for r in recs if r["session_index"] == k),
                max(r["end_ts"] for r in recs if r["session_index"] == k)) for k in range(4)}
    assert span[1][0] < span[0][1]  # 0 and 1 interleave
    assert span[2][0] >= min(span[0][1], span[1][1]) - 1e-3
    assert stats["max_in_flight"] <= 2


@pytest.mark.runtime
def test_prefix_cache_hits_per_turn_on_the_real_cpu_runtime(tmp_path, tiny_model):
    """tests/plans/multi_turn.yaml through `tunelab run`: turns after the first are served partly from the prefix
    cache (their history was the previous turn's prompt and answer), turn 0 is not, and /metrics shows hits."""
    import yaml

    plan = yaml.safe_load((REPO / "tests" / "plans" / "multi_turn.yaml").read_text())
    plan["model"] = str(tiny_model)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    env = dict(os.environ, TUNELAB_DB=str(tmp_path / "wh.duckdb"), TUNELAB_RESULTS=str(tmp_path / "results"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(tmp_path / "plan.yaml")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    rows = con.execute("SELECT turn, requests, ok_requests, prompt_tokens_mean, cached_prompt_tokens_mean "
                       "FROM turn_prefix_cache ORDER BY turn").fetchall()
    w = plan["workloads"][0]
    sessions = -(-w["num_requests"] // w["turns"])
    assert [t[0] for t in rows] == list(range(w["turns"]))
    assert all(t[1] == t[2] == sessions for t in rows)
    prompts = [t[3] for t in rows]
    cached = [t[4] for t in rows]
    assert prompts[0] < prompts[1] < prompts[2]  # the conversation grows
    assert cached[0] < cached[1] <= cached[2] and cached[1] > 0  # later turns reuse the history
    assert all(c < p for c, p in zip(cached, prompts))  # never the whole prompt: the new message is computed
    hits = con.execute("SELECT sum(value) FROM server_metrics WHERE metric = 'prefix_cache_hits'").fetchall()[0][0]
    per_request = con.execute("SELECT sum(cached_prompt_tokens) FROM requests").fetchall()[0][0]
    # The server's own counters over the window are the per-request hits summed.
    assert hits is not None and hits > 0 and hits == per_request


def test_turn_summary_lines_give_cached_share_per_turn():
    import pandas as pd

    from tunelab.tasks.measure import turn_summary

    df = pd.DataFrame({"turn": [0, 0, 1, 1], "ok": [True, True, True, False],
                       "prompt_tokens": [300, 300, 400, 400], "cached_prompt_tokens": [0, 0, 256, None],
                       "ttft_s": [0.02, 0.04, 0.01, None]})
    assert turn_summary(df) == ["turn 0: 2 requests (2 ok), prompt 300 tokens, cached 0 (0 %), TTFT p50 30.0 ms",
                                "turn 1: 2 requests (1 ok), prompt 400 tokens, cached 256 (64 %), TTFT p50 10.0 ms"]
    df["cached_prompt_tokens"] = None
    assert "cached n/a" in turn_summary(df)[0]
