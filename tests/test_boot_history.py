"""plan check's time estimate from this host's boots: the warehouse's measured warm boot replaces the typical one,
and a GPU runtime with an empty compile cache pays one cold compile (warehouse.boot_history, core.plan_cost,
tasks.compile_cache). The 2026-12-07 H100 sweep was estimated at 17 min 28 s and ran about 24 min."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tunelab.core.plan import load_plan
from tunelab.core.plan_cost import COLD_COMPILE_S, TYPICAL, plan_cost
from tunelab.reports.evidence import warehouse_from_parquet
from tunelab.tasks import compile_cache
from tunelab.warehouse.boot_history import BootHistory, boot_history

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "evidence" / "h100-2026-12-07-versions-anchored" / "warehouse"


def _plan(tmp_path: Path, runtimes: list[str]):
    doc = dict(name="p", model="unused", runtimes=runtimes, replicates=3,
               workloads=[dict(name="w", prompt_tokens=64, output_tokens=8, num_requests=10)],
               concurrency=[1], repeats=1, warmup_requests=0)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_plan(p)


def test_boot_history_reads_warm_and_cold_boots_per_runtime(tmp_path):
    db = warehouse_from_parquet(H100, tmp_path / "w.duckdb")
    h = boot_history(db)
    assert set(h) == {"gpu-0.25.1", "gpu-0.26.0"}
    a, b = h["gpu-0.25.1"], h["gpu-0.26.0"]
    # the committed run: 0.25.1 one cold boot (161.9 s) and three warm (108.5, 84.1, 80.8); 0.26.0 one of each
    assert (a.warm_boots, a.cold_boots, b.warm_boots, b.cold_boots) == (3, 1, 1, 1)
    assert a.warm_boot_s == pytest.approx((108.49 + 84.08 + 80.84) / 3, abs=0.05)
    assert a.cold_extra_s == pytest.approx(161.87 - a.warm_boot_s, abs=0.05)
    assert b.warm_boot_s == pytest.approx(115.23, abs=0.05) and b.cold_extra_s == pytest.approx(178.99 - 115.23, abs=0.05)


def test_no_warehouse_no_history(tmp_path):
    assert boot_history(None) == {} and boot_history(tmp_path / "nosuch.duckdb") == {}
    (tmp_path / "junk.duckdb").write_bytes(b"not a database")
    assert boot_history(tmp_path / "junk.duckdb") == {}


def test_estimate_uses_measured_boots_and_one_cold_compile_a_runtime(tmp_path):
    plan = _plan(tmp_path, ["gpu-a", "gpu-b"])  # 3 boots on each
    devices = {"gpu-a": "cuda", "gpu-b": "cuda"}
    typical = plan_cost(plan, devices)
    assert typical.boot_s == pytest.approx(6 * TYPICAL["cuda"].boot_s)
    assert "measured in this warehouse" not in typical.how

    hist = {"gpu-a": BootHistory(warm_boot_s=100.0, warm_boots=3, cold_extra_s=70.0, cold_boots=1)}
    c = plan_cost(plan, devices, hist)
    assert c.boot_s == pytest.approx(3 * 100.0 + 3 * TYPICAL["cuda"].boot_s)
    assert "boots measured in this warehouse: gpu-a ~100 s, the mean of 3 warm boot(s)" in c.how

    cold = plan_cost(plan, devices, hist, cold_runtimes=["gpu-a", "gpu-b"])
    # one compile each: gpu-a's from its own cold boots, gpu-b's the typical one
    assert cold.boot_s == pytest.approx(c.boot_s + 70.0 + COLD_COMPILE_S)
    assert ("first boot compiles, the compile cache being empty: gpu-a +70 s (cold minus warm boots here, 1 cold), "
            f"gpu-b +{COLD_COMPILE_S:.0f} s (typical)") in cold.how
    assert cold.estimate_s - c.estimate_s == pytest.approx(70.0 + COLD_COMPILE_S)


def test_the_cpu_runtime_pays_no_compile(tmp_path):
    plan = _plan(tmp_path, ["cpu"])
    assert plan_cost(plan, {"cpu": "cpu"}, cold_runtimes=["cpu"]).boot_s == pytest.approx(3 * TYPICAL["cpu"].boot_s)


def test_uncompiled_runtimes_are_the_gpu_ones_with_an_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    rts = {"gpu-a": SimpleNamespace(device="cuda"), "gpu-b": SimpleNamespace(device="cuda"),
           "cpu": SimpleNamespace(device="cpu")}
    assert compile_cache.uncompiled(rts) == ["gpu-a", "gpu-b"]
    d = compile_cache.cache_root("gpu-a") / "torch_compile_cache"
    d.mkdir(parents=True)
    assert not compile_cache.has_compiled("gpu-a")  # the folder alone is no artefact
    (d / "15ff2a838b").mkdir()
    assert compile_cache.has_compiled("gpu-a") and compile_cache.uncompiled(rts) == ["gpu-b"]
