"""Speculative-decoding acceptance from vLLM's /metrics (issue 16, item 7): the counters of
vllm/v1/spec_decode/metrics.py become server_metrics rows only where the server exposes them, and the window's
acceptance rate and mean acceptance length follow vLLM's definitions. Pages: the recorded vLLM 0.32 fixtures,
with the spec-decode counters a server run with --speculative-config adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.tasks.server_metrics import (CANONICAL_METRICS, SPEC_DECODE_METRICS, snapshot, spec_decode_acceptance,
                                          window_rows)

FIX = Path(__file__).parent / "fixtures" / "metrics"
IDENT = dict(trial_id="s/c/r0", workload="chat", load_kind="concurrency", load_value=4.0, repeat=1)


def _with_spec(page: str, drafts: float, draft_tokens: float, accepted: float) -> str:
    out = [page.rstrip("\n")]
    for name, v in (("drafts", drafts), ("draft_tokens", draft_tokens), ("accepted_tokens", accepted)):
        out += [f"# HELP vllm:spec_decode_num_{name}_total x.", f"# TYPE vllm:spec_decode_num_{name}_total counter",
                f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="tunelab-tiny"}} {v}']
    return "\n".join(out) + "\n"


def test_spec_decode_rows_and_acceptance_where_the_server_exposes_them():
    before = (FIX / "vllm-v0.32_before.prom").read_text()
    after = (FIX / "vllm-v0.32_after.prom").read_text()
    rows = window_rows(snapshot(_with_spec(before, 10, 30, 12)), snapshot(_with_spec(after, 110, 330, 237)), IDENT)
    assert [r["metric"] for r in rows] == [*CANONICAL_METRICS, *SPEC_DECODE_METRICS]
    got = {r["metric"]: r["value"] for r in rows if r["metric"] in SPEC_DECODE_METRICS}
    assert got == {"spec_decode_drafts": 100.0, "spec_decode_draft_tokens": 300.0, "spec_decode_accepted_tokens": 225.0}
    acc = spec_decode_acceptance(rows)
    assert acc["acceptance_rate"] == pytest.approx(225 / 300)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 225 / 100)


def test_no_spec_decode_rows_without_speculative_decoding():
    rows = window_rows(snapshot((FIX / "vllm-v0.32_before.prom").read_text()),
                       snapshot((FIX / "vllm-v0.32_after.prom").read_text()), IDENT)
    assert [r["metric"] for r in rows] == list(CANONICAL_METRICS)
    assert spec_decode_acceptance(rows) == {"acceptance_rate": None, "mean_acceptance_length": None}


@pytest.mark.runtime
def test_ngram_speculative_decoding_on_the_real_cpu_runtime_stores_its_acceptance(tmp_path, tiny_model):
    import os
    import subprocess
    import sys

    import duckdb
    import yaml

    repo = Path(__file__).resolve().parent.parent
    plan = yaml.safe_load((repo / "tests" / "plans" / "spec_decode.yaml").read_text())
    plan["model"] = str(tiny_model)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    env = dict(os.environ, TUNELAB_DB=str(tmp_path / "wh.duckdb"), TUNELAB_RESULTS=str(tmp_path / "results"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(tmp_path / "plan.yaml")], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    assert con.execute("SELECT bool_and(ok), count(*) FROM requests").fetchall() == [(True, 4)]
    rows = [{"metric": m, "value": v} for m, v in con.execute(
        "SELECT metric, value FROM server_metrics WHERE metric LIKE 'spec_decode_%'").fetchall()]
    assert sorted(r["metric"] for r in rows) == sorted(SPEC_DECODE_METRICS)
    acc = spec_decode_acceptance(rows)
    assert acc["acceptance_rate"] is not None and 0 <= acc["acceptance_rate"] <= 1
    assert acc["mean_acceptance_length"] >= 1
