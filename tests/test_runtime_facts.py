"""Runtime facts (`vllm serve` option names, VLLM_* variable names) are read once, in the runtime's own interpreter,
and cached beside the runtime; the checks that use them never parse anything in the orchestrator and never stop a
sweep or a plan check (tunelab.host.runtime.Runtime.facts, tunelab.core.plan.runtime_checks, flows.sweep.preflight,
`tunelab plan check`).

Why: a sweep once died at its start with ``SystemError: AST constructor recursion depth mismatch`` from
``ast.parse(vllm/envs.py)`` run inside the Prefect flow (CPython 3.11.0-3.11.7 / 3.12.0-3.12.1 share the AST
builder's recursion counter between threads, gh-106905). The runtimes here are FAKE vLLM packages (a tiny argparse
CLI laid out like vLLM's and an ``envs.py``), run by this interpreter, so no test imports vLLM.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakes.fake_vllm_package import fake_vllm_runtime
from tunelab.host import paths
from tunelab.host import runtime as runtime_mod
from tunelab.core.plan import Plan, runtime_checks, unknown_env_warnings
from tunelab.host.runtime import Runtime

FAKE_CLI = """
    import argparse
    def main():
        p = argparse.ArgumentParser(prog="vllm")
        sub = p.add_subparsers(dest="cmd")
        s = sub.add_parser("serve")
        for f in ("--max-num-seqs", "--max-model-len", "--enforce-eager", "--tensor-parallel-size", "--port"):
            s.add_argument(f)
        p.parse_args()
        raise SystemExit("the probe must stop at parse_args")
"""

FAKE_ENVS = """
    import os
    environment_variables = {
        "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
        "VLLM_USE_FASTOKENS": lambda: os.getenv("VLLM_USE_FASTOKENS", "0"),
    }
"""

AST_RACE = "AST constructor recursion depth mismatch (before=72, after=78)"


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(runtime_mod, "_FACTS_MEMO", {})


def _install_fake(tmp_path: Path, name: str, version: str = "0.21.0") -> Runtime:
    """A FAKE runtime registered in the test home (runtime.json in its folder), so the facts cache is written."""
    return fake_vllm_runtime(tmp_path / f"site-{name}", name, version, FAKE_CLI, FAKE_ENVS, register=True)


def _plan_file(tmp_path: Path, runtime: str) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    p = tmp_path / "plan.yaml"
    p.write_text(json.dumps({
        "name": "p", "model": str(model), "runtimes": [runtime],
        "variants": [{"name": "default"}, {"env": {"VLLM_USE_FASTOKEN": 1}}],
        # Meant here: these tests are about the check's warning path (a name no runtime knows and the plan does
        # not allow is a plan error: tests/test_env_names.py).
        "allow_unknown_env": ["VLLM_USE_FASTOKEN"],
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
    }))
    return p


def _no_parsing_no_probing(monkeypatch) -> None:
    """From here on, an ``ast.parse`` in this process fails as in the race, and no runtime may be probed."""
    def racing_parse(*a, **k):
        raise SystemError(AST_RACE)

    def no_probe(*a, **k):
        raise AssertionError("the runtime was probed again although its facts are cached")

    monkeypatch.setattr(ast, "parse", racing_parse)
    monkeypatch.setattr(runtime_mod.subprocess, "run", no_probe)


def test_one_probe_reads_both_facts_in_the_runtime_interpreter_and_caches_them(tmp_path, monkeypatch):
    rt = _install_fake(tmp_path, f"facts-{tmp_path.name}")
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(runtime_mod.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    facts = rt.facts()
    assert len(calls) == 1  # one process for both facts
    assert facts.env_names == {"VLLM_HOST_IP", "VLLM_USE_FASTOKENS"}
    assert {"max-num-seqs", "enforce-eager", "port"} <= facts.serve_flags
    rec = json.loads((paths.runtimes_dir() / rt.name / "runtime_facts.json").read_text())
    assert rec["vllm"] == "0.21.0" and rec["python"] == sys.executable and rec["pythonpath"] == rt.pythonpath
    assert sorted(rec["env_names"]) == ["VLLM_HOST_IP", "VLLM_USE_FASTOKENS"]


def test_env_check_parses_nothing_in_the_orchestrator_once_the_facts_are_cached(tmp_path, monkeypatch):
    rt = _install_fake(tmp_path, f"cached-{tmp_path.name}")
    rt.facts()  # what `tunelab runtime create` / `runtime install` do once
    runtime_mod._FACTS_MEMO.clear()  # a new process (the sweep)
    _no_parsing_no_probing(monkeypatch)
    plan = Plan.model_validate(json.loads(_plan_file(tmp_path, rt.name).read_text()))
    (msg,) = unknown_env_warnings(plan, {rt.name: rt})
    assert "VLLM_USE_FASTOKEN:" in msg and "did you mean VLLM_USE_FASTOKENS?" in msg


def test_sweep_preflight_and_plan_check_proceed_while_ast_parse_races(tmp_path, monkeypatch):
    from tunelab.flows.sweep import preflight
    from tunelab.cli import app
    from tunelab.core.plan import load_plan

    rt = _install_fake(tmp_path, f"race-{tmp_path.name}")
    rt.facts()
    runtime_mod._FACTS_MEMO.clear()
    plan_path = _plan_file(tmp_path, rt.name)
    plan = load_plan(plan_path)
    # Warm the libraries `plan check` imports lazily (scipy's first import parses signatures with ast.parse via
    # numpy.ma / inspect): the race under test is in tunelab's checks, not in a library's first import, and with
    # this the test passes alone as well as after others.
    CliRunner().invoke(app, ["plan", "check", str(plan_path)])
    runtime_mod._FACTS_MEMO.clear()  # the facts come from the cache file again, as in a fresh process
    _no_parsing_no_probing(monkeypatch)
    assert set(preflight(plan)) == {rt.name}
    errors, warnings = runtime_checks(plan, {rt.name: rt})
    assert errors == [] and len(warnings) == 1 and "VLLM_USE_FASTOKEN:" in warnings[0]
    r = CliRunner().invoke(app, ["plan", "check", str(plan_path)])
    out = " ".join(r.output.split())
    assert r.exit_code == 0, out
    assert "unknown to vLLM 0.21.0" in out and "runnable here" in out


def test_a_fact_that_raises_is_a_warning_and_the_plan_still_runs(tmp_path, monkeypatch):
    from tunelab.flows.sweep import preflight
    from tunelab.core.plan import load_plan

    rt = _install_fake(tmp_path, f"raises-{tmp_path.name}")
    plan = load_plan(_plan_file(tmp_path, rt.name))

    def broken(self, timeout_s=180.0):
        raise SystemError(AST_RACE)

    monkeypatch.setattr(Runtime, "facts", broken)
    assert set(preflight(plan)) == {rt.name}  # no PlanError, no SystemError
    errors, warnings = runtime_checks(plan, {rt.name: rt})
    assert errors == []
    assert len(warnings) == 2, warnings  # one per fact the checks needed
    assert all(rt.name in w and "SystemError" in w and "skipped" in w for w in warnings)


def test_a_check_that_raises_is_skipped_with_a_warning(tmp_path, monkeypatch):
    import tunelab.core.plan as plan_mod

    rt = _install_fake(tmp_path, f"check-{tmp_path.name}")
    plan = Plan.model_validate(json.loads(_plan_file(tmp_path, rt.name).read_text()))

    def boom(*a, **k):
        raise RuntimeError("a bug in the check")

    monkeypatch.setattr(plan_mod, "unknown_env_warnings", boom)
    monkeypatch.setattr(plan_mod, "unknown_engine_args", boom)
    errors, warnings = runtime_checks(plan, {rt.name: rt})
    assert errors == []
    assert [w.split(" (")[0] for w in warnings] == ["engine-arg name check skipped", "VLLM_* env name check skipped"]
    assert all("a bug in the check" in w for w in warnings)


def test_a_cache_of_another_vllm_version_or_pythonpath_is_not_used(tmp_path):
    rt = _install_fake(tmp_path, f"stale-{tmp_path.name}")
    assert rt.facts().env_names is not None
    runtime_mod._FACTS_MEMO.clear()
    (Path(rt.pythonpath[0]) / "vllm" / "envs.py").write_text("environment_variables = {'VLLM_NEW': None}\n")
    newer = rt.model_copy(update={"versions": {"vllm": "0.22.0"}})
    assert newer.facts().env_names == {"VLLM_NEW"}  # probed again, not the 0.21.0 record


def test_register_offline_reads_the_facts_and_a_failed_probe_does_not_fail_it(tmp_path, monkeypatch):
    from tunelab.host.offline_register import register_offline

    rt = _install_fake(tmp_path, "unused")
    rec = {"kind": "vllm-runtime", "name": "vllm-0.21.0", "python": sys.executable, "pythonpath": rt.pythonpath,
           "versions": {"vllm": "0.21.0"}, "installed_at": ""}
    (tmp_path / "runtime.json").write_text(json.dumps(rec))
    reg = register_offline(tmp_path / "runtime.json", name=f"gpu-{tmp_path.name}")
    cached = json.loads((paths.runtimes_dir() / reg.name / "runtime_facts.json").read_text())
    assert "VLLM_USE_FASTOKENS" in cached["env_names"] and "max-num-seqs" in cached["serve_flags"]

    rec["pythonpath"] = [str(tmp_path / "nothing-here")]
    (tmp_path / "runtime.json").write_text(json.dumps(rec))
    broken = register_offline(tmp_path / "runtime.json", name=f"gpu-broken-{tmp_path.name}")
    assert broken.facts().serve_flags is None
    assert not (paths.runtimes_dir() / broken.name / "runtime_facts.json").exists()  # retried next time
