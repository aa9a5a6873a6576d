"""LoRA adapters (issue 16, item 7): a workload that names an adapter sends it as the request's model; on the
real CPU runtime, the tiny random adapter (tunelab.host.models.build_tiny_lora) is served with --enable-lora
--lora-modules and the measured requests target it (vLLM answers 404 for a model name it does not serve, so
ok requests under the adapter's name are requests to the adapter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from tunelab.core.plan import Plan, Workload  # noqa: E402
from tunelab.tasks.measure import measure_server  # noqa: E402
from timed_openai_server import FakeServerProcess, FakeTiming  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def test_an_adapter_workload_records_its_adapter():
    w = Workload(name="lora", adapter="tiny-lora", prompt_tokens=8, output_tokens=4, num_requests=2)
    assert w.record()["adapter"] == "tiny-lora"
    assert "adapter" not in Workload(name="base", prompt_tokens=8, output_tokens=4, num_requests=2).record()


def test_measured_and_warm_up_requests_name_the_adapter_as_their_model_on_the_fake_server():
    """Request shape, on the FAKE timed server (it logs each request's model): the adapter's name, for the
    warm-up and the window, while a base workload of the same plan names the served model."""
    plan = Plan(name="t", model="unused", concurrency=[2], warmup_requests=2, repeats=1, seed=1,
                workloads=[Workload(name="lora", adapter="tiny-lora", prompt_tokens=16, output_tokens=4,
                                    num_requests=3),
                           Workload(name="base", prompt_tokens=16, output_tokens=4, num_requests=3)])
    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002), model="fake-model") as fake:
        res = measure_server(fake.base_url, "k", "fake-model", plan)
        models = [e["model"] for e in fake.log()["log"]]
    assert res.requests["ok"].all() and len(res.requests) == 6
    assert models == ["tiny-lora"] * 5 + ["fake-model"] * 5  # 2 warm-up + 3 measured per workload


@pytest.mark.runtime
def test_requests_target_a_lora_adapter_on_the_real_cpu_runtime(tmp_path, cpu_runtime, tiny_model):
    import yaml

    from tunelab.host.models import build_tiny_lora

    adapter = build_tiny_lora(cpu_runtime, tmp_path / "tiny-lora", log=lambda *_: None)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8
    plan = yaml.safe_load((REPO / "tests" / "plans" / "lora.yaml").read_text())
    plan["model"] = str(tiny_model)
    plan["engine_args"]["lora-modules"] = f"tiny-lora={adapter}"
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    env = dict(os.environ, TUNELAB_DB=str(tmp_path / "wh.duckdb"), TUNELAB_RESULTS=str(tmp_path / "results"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(tmp_path / "plan.yaml")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    assert con.execute("SELECT status FROM trials").fetchall() == [("ok",)]
    n, ok, out = con.execute("SELECT count(*), bool_and(ok), min(output_tokens) FROM requests").fetchall()[0]
    assert n == 4 and ok and out == 8
