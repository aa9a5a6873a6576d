"""The boot-log parser and failure classifier on real H200 logs recorded by tunelab's own GPU sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.tasks.bootlog import classify_boot_failure, parse_boot_log

F = Path(__file__).resolve().parent / "fixtures" / "bootlogs"


@pytest.mark.parametrize(
    "name, expected, retryable",
    [
        ("gpu_h200_0.25.1_real_oom_kv_cache.log", "oom_kv_cache", False),
        ("gpu_h200_0.25.1_real_oom_kv_cache_eager.log", "oom_kv_cache", False),
        ("gpu_h200_0.25.1_real_invalid_max_model_len.log", "invalid_config", False),
    ],
)
def test_real_failures_are_classified(name, expected, retryable):
    text = (F / name).read_text(errors="replace")
    f = classify_boot_failure(text, returncode=1, timed_out=False)
    assert f.failure_class == expected, f.reason
    assert f.retryable is retryable


def test_real_eager_boot_has_no_compile_or_graph_phase():
    r = parse_boot_log((F / "gpu_h200_0.25.1_real_eager.log").read_text(errors="replace"))
    names = {p.phase for p in r.phases}
    assert r.vllm_version == "0.25.1"
    assert "graph_capture" not in names and "torch_compile" not in names
    assert r.effective_config.get("enforce_eager") is True
    assert r.kv_cache_tokens and r.kv_cache_tokens > 1_000_000  # ~125 GiB of KV cache on an H200


def test_real_0_21_0_boot_reports_fastokens_as_not_applied_and_a_warm_cache():
    cold = parse_boot_log((F / "gpu_h200_0.21.0_real_cold.log").read_text(errors="replace"))
    warm = parse_boot_log((F / "gpu_h200_0.21.0_real_fastokens_unknown_warm.log").read_text(errors="replace"))
    assert (cold.vllm_version, warm.vllm_version) == ("0.21.0", "0.21.0")
    assert cold.unknown_env == [] and warm.unknown_env == ["VLLM_USE_FASTOKENS"]
    # the unknown variable did not change the compile cache hash: the second boot loaded the first one's artefacts
    assert (cold.compile_cache, warm.compile_cache) == ("cold", "warm")
    tc = {p.phase: p.seconds for p in cold.phases}["torch_compile"]
    tw = {p.phase: p.seconds for p in warm.phases}["torch_compile"]
    assert tw < tc / 2
