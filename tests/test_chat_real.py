"""Chat on the real CPU runtime (issue 16, item 3): the tiny model carries a chat template, and
experiments/demo_chat.yaml runs /v1/chat/completions through `tunelab run` into the warehouse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "experiments" / "demo_chat.yaml"

pytestmark = pytest.mark.runtime


def test_tiny_model_has_its_chat_template_in_tokenizer_config_and_builds_deterministically(tmp_path, cpu_runtime):
    from tunelab.host.models import build_tiny_model, has_chat_template

    a = build_tiny_model(cpu_runtime, tmp_path / "a", log=lambda *_: None)
    cfg = json.loads((a / "tokenizer_config.json").read_text())
    # The ChatML template, the same one transformers saved as chat_template.jinja.
    assert "<|im_start|>" in cfg["chat_template"] and "add_generation_prompt" in cfg["chat_template"]
    assert cfg["chat_template"] == (a / "chat_template.jinja").read_text() and has_chat_template(a)
    # A folder built before (no template in tokenizer_config.json) is rebuilt, to the same bytes.
    (a / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "chat_template"}))
    assert not has_chat_template(a)
    b = build_tiny_model(cpu_runtime, tmp_path / "b", log=lambda *_: None)
    build_tiny_model(cpu_runtime, a, log=lambda *_: None)
    for f in sorted(p.name for p in b.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_demo_chat_plan_runs_chat_on_the_cpu_runtime_into_the_warehouse(tmp_path, tiny_model):
    import yaml

    plan = yaml.safe_load(PLAN.read_text())
    plan["model"] = str(tiny_model)  # the installed tiny model (the plan's relative path assumes the checkout's home)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    env = dict(os.environ, TUNELAB_DB=str(tmp_path / "wh.duckdb"), TUNELAB_RESULTS=str(tmp_path / "results"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(tmp_path / "plan.yaml")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    assert con.execute("SELECT status FROM trials").fetchall() == [("ok",)]
    w = plan["workloads"][0]
    rows = con.execute("SELECT count(*), bool_and(ok), min(prompt_tokens), max(prompt_tokens), min(output_tokens), "
                       "max(output_tokens), bool_and(ttfc_s = ttft_s), sum(reasoning_chunks) FROM requests "
                       "WHERE workload = ?", [w["name"]]).fetchall()[0]
    n, ok, pmin, pmax, omin, omax, ttfc_is_ttft, reasoning = rows
    assert n == w["num_requests"] * len(plan["concurrency"]) and ok
    # The chat template wraps the user message: the server counts more prompt tokens than the message's own.
    assert pmin == pmax > w["prompt_tokens"]
    assert omin == omax == w["output_tokens"]
    assert ttfc_is_ttft and reasoning == 0  # no reasoning parser: the first token is visible content
