"""Env vars a runtime's vLLM does not know are reported before any server starts (tunelab.host.runtime.vllm_env_names,
tunelab.core.plan.unknown_env_warnings). The names are read by the runtime's own interpreter (tests/test_runtime_facts.py
covers the probe and its cache)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tunelab.core.plan import Plan, unknown_env_warnings
from tunelab.host.runtime import Runtime


def _fake_runtime(tmp_path: Path, envs_py: str | None, version: str = "0.21.0") -> Runtime:
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    if envs_py is not None:
        (site / "vllm" / "envs.py").write_text(textwrap.dedent(envs_py))
    return Runtime(name="old", python="/usr/bin/python3", pythonpath=[str(site)], versions={"vllm": version})


OLD_ENVS = """
    import os
    from typing import Any, Callable
    environment_variables: dict[str, Callable[[], Any]] = {
        "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
        "VLLM_USE_FLASHINFER_SAMPLER": lambda: os.getenv("VLLM_USE_FLASHINFER_SAMPLER"),
    }
"""


def _plan(tmp_path: Path) -> Plan:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return Plan.model_validate({
        "name": "p", "model": str(model), "runtimes": ["old"],
        "variants": [{"name": "default"}, {"env": {"VLLM_USE_FASTOKENS": 1}},
                     {"env": {"VLLM_USE_FLASHINFER_SAMPLER": 0, "OMP_NUM_THREADS": 2}}],
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
        "concurrency": [1], "replicates": 2,
    })


def test_env_names_are_the_keys_of_the_runtimes_envs_module(tmp_path):
    rt = _fake_runtime(tmp_path, OLD_ENVS)
    assert rt.vllm_env_names() == {"VLLM_HOST_IP", "VLLM_USE_FLASHINFER_SAMPLER"}


def test_unknown_vllm_env_is_warned_once_per_runtime_and_known_or_foreign_ones_are_not(tmp_path):
    rt = _fake_runtime(tmp_path, OLD_ENVS)
    msgs = unknown_env_warnings(_plan(tmp_path), {"old": rt})
    assert len(msgs) == 1, msgs  # two replicates, one warning
    assert "VLLM_USE_FASTOKENS" in msgs[0] and "0.21.0" in msgs[0] and "'old'" in msgs[0]
    assert "not be applied" in msgs[0]


def test_no_envs_py_or_unparsable_means_no_claim(tmp_path):
    assert _fake_runtime(tmp_path / "a", None).vllm_env_names() is None
    broken = _fake_runtime(tmp_path / "b", "environment_variables = {\n")
    assert broken.vllm_env_names() is None
    assert unknown_env_warnings(_plan(tmp_path), {"old": broken}) == []


@pytest.mark.runtime
def test_real_cpu_runtime_knows_fastokens_but_not_a_typo(cpu_runtime):
    names = cpu_runtime.vllm_env_names()
    assert names is not None and len(names) > 100
    assert "VLLM_USE_FASTOKENS" in names and "VLLM_CPU_KVCACHE_SPACE" in names
    assert "VLLM_USE_FASTOKEN" not in names


def test_warning_names_every_config_the_unknown_variable_reaches_and_suggests_the_known_name(tmp_path):
    rt = _fake_runtime(tmp_path, OLD_ENVS.replace('"VLLM_HOST_IP"', '"VLLM_USE_FASTOKENS"'), version="0.25.1")
    model = tmp_path / "model"
    model.mkdir()
    plan = Plan.model_validate({
        "name": "p", "model": str(model), "runtimes": ["old"], "env": {"VLLM_USE_FASTOKEN": 1},
        "variants": [{"name": "default"}, {"engine_args": {"enforce-eager": True}}],
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
        "concurrency": [1],
    })
    (msg,) = unknown_env_warnings(plan, {"old": rt})
    labels = [t.label for t in plan.trials()]
    assert len(set(labels)) == 2 and all(repr(x) in msg for x in labels), (msg, labels)
    assert "did you mean VLLM_USE_FASTOKENS?" in msg


def _typo_plan(tmp_path: Path, **extra) -> Plan:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return Plan.model_validate({
        "name": "p", "model": str(model), "runtimes": ["old"],
        "variants": [{"name": "default"}, {"env": {"VLLM_USE_FASTOKNS": 1}}],
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
        "concurrency": [1], **extra,
    })


def test_a_misspelt_vllm_env_name_no_runtime_knows_is_a_plan_error_with_the_closest_name(tmp_path):
    """Issue 29 item 19: VLLM_USE_FASTOKNS was a warning and the run booted without the setting."""
    from tunelab.core.plan import runtime_checks

    rt = _fake_runtime(tmp_path, OLD_ENVS.replace('"VLLM_HOST_IP"', '"VLLM_USE_FASTOKENS"'))
    errors, warnings = runtime_checks(_typo_plan(tmp_path), {"old": rt})
    (msg,) = errors
    assert msg.startswith("variants[1].env: VLLM_USE_FASTOKNS") and "did you mean VLLM_USE_FASTOKENS?" in msg
    assert "allow_unknown_env" in msg
    assert not any("VLLM_USE_FASTOKNS" in w for w in warnings)  # one error, not also a warning


def test_an_unknown_vllm_env_name_the_plan_allows_stays_a_warning(tmp_path):
    from tunelab.core.plan import runtime_checks

    rt = _fake_runtime(tmp_path, OLD_ENVS.replace('"VLLM_HOST_IP"', '"VLLM_USE_FASTOKENS"'))
    errors, warnings = runtime_checks(_typo_plan(tmp_path, allow_unknown_env=["VLLM_USE_FASTOKNS"]), {"old": rt})
    assert errors == []
    assert len(warnings) == 1 and "VLLM_USE_FASTOKNS" in warnings[0] and "not be applied" in warnings[0]


def test_a_name_one_runtime_knows_is_a_warning_for_the_other_not_an_error(tmp_path):
    from tunelab.core.plan import runtime_checks

    old = _fake_runtime(tmp_path / "o", OLD_ENVS)
    new = _fake_runtime(tmp_path / "n", OLD_ENVS.replace('"VLLM_HOST_IP"', '"VLLM_USE_FASTOKENS"'), version="0.25.1")
    model = tmp_path / "model"
    model.mkdir()
    plan = Plan.model_validate({
        "name": "p", "model": str(model), "runtimes": ["old", "new"], "env": {"VLLM_USE_FASTOKENS": 1},
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
    })
    errors, warnings = runtime_checks(plan, {"old": old, "new": new})
    assert errors == [] and len(warnings) == 1 and "'old'" in warnings[0]
