"""An installed offline vLLM bundle becomes a tunelab runtime that the engine launches with the host's python."""

from __future__ import annotations

import json
import sys

import pytest

from tunelab.host.offline_register import register_offline
from tunelab.host.runtime import load_runtime


def test_register_offline_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    rec = {
        "format_version": 1, "kind": "vllm-runtime", "name": "vllm-0.25.1", "python": sys.executable,
        "pythonpath": [str(tmp_path / "site")], "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
        "serve_argv": [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"],
        "versions": {"vllm": "0.25.1", "torch": "2.11.0", "transformers": "5.17.0", "fastokens": "0.3.5"},
        "manifest": "m", "site": str(tmp_path / "site"), "installed_at": "2026-11-29T00:00:00+00:00",
    }
    (tmp_path / "runtime.json").write_text(json.dumps(rec))
    rt = register_offline(tmp_path / "runtime.json")
    assert rt.name == "gpu-0.25.1" and rt.device == "cuda" and rt.kind == "host-python"
    again = load_runtime("gpu-0.25.1")
    assert again.serve_command() == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    env = again.launch_env({"X": "1"})
    assert env["PYTHONPATH"] == str(tmp_path / "site")
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["X"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # CPU defaults stay off a CUDA runtime


def test_orchestrator_record_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    (tmp_path / "runtime.json").write_text(json.dumps({"kind": "orchestrator"}))
    with pytest.raises(ValueError, match="not a vLLM runtime record"):
        register_offline(tmp_path / "runtime.json")
