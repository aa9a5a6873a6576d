"""Engine-arg names that `vllm serve` would reject are found before any server starts
(tunelab.host.runtime.Runtime.serve_flags, tunelab.core.plan.unknown_engine_args, flows.sweep.preflight, `tunelab plan check`).

The unit tests run the probe against a FAKE vLLM CLI (a tiny argparse program laid out like vLLM's package) so that
they do not import vLLM; the runtime-marked tests read the real CPU runtime's parser.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fakes.fake_vllm_package import fake_vllm_runtime
from tunelab.host import runtime as runtime_mod
from tunelab.core.plan import Plan, PlanError, unknown_engine_args
from tunelab.host.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]

# A FAKE `vllm` CLI: the same entry module as vLLM's (vllm.entrypoints.cli.main:main), a `serve` subcommand
# with a handful of options, including a BooleanOptionalAction (which adds the --no-... spelling).
FAKE_CLI = """
    import argparse
    def main():
        p = argparse.ArgumentParser(prog="vllm")
        sub = p.add_subparsers(dest="cmd")
        s = sub.add_parser("serve")
        s.add_argument("model_tag", nargs="?")
        s.add_argument("--max-num-seqs", type=int)
        s.add_argument("--max-num-batched-tokens", type=int)
        s.add_argument("--enforce-eager", action="store_true")
        s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
        s.add_argument("--compilation-config", "-O")
        s.add_argument("--max-model-len", type=int)
        s.add_argument("--tensor-parallel-size", type=int)
        s.add_argument("--port", type=int)
        {extra}
        sub.add_parser("bench")
        p.parse_args()
        raise SystemExit("the probe must stop at parse_args")
"""


def _fake_runtime(tmp_path: Path, name: str = "fakecli", version: str = "0.0.1", extra: str = "",
                  cli: str | None = None) -> Runtime:
    return fake_vllm_runtime(tmp_path / f"site-{name}-{version}", name, version,
                             cli if cli is not None else FAKE_CLI.replace("{extra}", extra))


def _plan(tmp_path: Path, engine_args: dict, runtimes: list[str] | None = None) -> Plan:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return Plan.model_validate({
        "name": "p", "model": str(model), "runtimes": runtimes or ["fakecli"], "engine_args": engine_args,
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
    })


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(runtime_mod, "_FACTS_MEMO", {})


def test_probe_reads_the_serve_parser_and_caches_it_per_vllm_version(tmp_path):
    rt = _fake_runtime(tmp_path, name=f"fakecli-cached-{os.getpid()}-{tmp_path.name}")
    rt_dir = runtime_mod._runtime_dir(rt.name)
    rt_dir.mkdir(parents=True)  # only this test's runtime has a folder, so only it is cached
    flags = rt.serve_flags()
    assert flags is not None
    assert {"max-num-seqs", "enforce-eager", "enable-prefix-caching", "no-enable-prefix-caching",
            "compilation-config", "O", "help"} <= flags
    assert not any(f.startswith("-") for f in flags)
    assert "model_tag" not in flags  # positionals are not options
    assert (rt_dir / "runtime_facts.json").is_file()
    # Second call in a new process: the cache answers, the (now broken) CLI is not run.
    runtime_mod._FACTS_MEMO.clear()
    (Path(rt.pythonpath[0]) / "vllm" / "entrypoints" / "cli" / "main.py").write_text("raise SystemExit(3)\n")
    assert rt.serve_flags() == flags
    # Another vLLM version in the same folder is probed again (and now fails: no claim).
    runtime_mod._FACTS_MEMO.clear()
    newer = rt.model_copy(update={"versions": {"vllm": "0.0.2"}})
    assert newer.serve_flags() is None


def test_a_runtime_whose_parser_cannot_be_read_is_not_judged(tmp_path):
    broken = _fake_runtime(tmp_path, cli="raise ImportError('no torch here')\n")
    assert broken.serve_flags() is None
    assert unknown_engine_args(_plan(tmp_path, {"max-num-seq": 8}), {"fakecli": broken}) == ([], [])


def test_a_partial_parser_is_not_trusted(tmp_path):
    # A serve parser without the options every release has is not the one `vllm serve` uses: judging a plan
    # by it would reject valid flags.
    partial = _fake_runtime(tmp_path, cli=FAKE_CLI.replace("{extra}", "").replace(
        's.add_argument("--max-model-len", type=int)', "pass"))
    assert partial.serve_flags() is None
    assert unknown_engine_args(_plan(tmp_path, {"max-model-len": 64}), {"fakecli": partial}) == ([], [])


def test_a_typo_is_an_error_with_the_close_name_and_real_names_pass(tmp_path):
    rt = _fake_runtime(tmp_path)
    ok = _plan(tmp_path, {"max-num-seqs": [4, 8], "enforce-eager": [True, False], "enable-prefix-caching": False,
                          "compilation-config": '{"mode": 0}'})
    assert unknown_engine_args(ok, {"fakecli": rt}) == ([], [])
    bad = _plan(tmp_path, {"max-num-seq": 8, "enforce-eager": True})
    errors, warnings = unknown_engine_args(bad, {"fakecli": rt})
    assert warnings == []
    (msg,) = errors
    assert "engine_args: 'max-num-seq'" in msg and "did you mean 'max-num-seqs'" in msg and "0.0.1" in msg


def test_a_flag_one_release_lacks_is_a_warning_naming_that_runtime(tmp_path):
    old = _fake_runtime(tmp_path, name="old", version="0.1")
    new = _fake_runtime(tmp_path, name="new", version="0.2", extra='s.add_argument("--new-scheduler-knob")')
    plan = _plan(tmp_path, {"new-scheduler-knob": "x"}, runtimes=["old", "new"])
    errors, warnings = unknown_engine_args(plan, {"old": old, "new": new})
    assert errors == []
    (msg,) = warnings
    assert "'new-scheduler-knob'" in msg and "0.1" in msg and "'old'" in msg and "accepted by 'new'" in msg


@pytest.mark.runtime
def test_real_cpu_runtime_parser_knows_the_common_tuning_flags(cpu_runtime):
    flags = cpu_runtime.serve_flags()
    assert flags is not None and len(flags) > 100
    assert {"max-num-seqs", "max-num-batched-tokens", "enforce-eager", "enable-chunked-prefill",
            "no-enable-prefix-caching", "compilation-config", "max-model-len"} <= flags
    assert "max-num-seq" not in flags


@pytest.mark.runtime
def test_sweep_preflight_and_plan_check_reject_a_typo_before_any_server_starts(cpu_runtime, tiny_model, tmp_path):
    from tunelab.flows.sweep import preflight

    plan_path = tmp_path / "typo.yaml"
    plan_path.write_text(yaml.safe_dump({
        "name": "typo", "model": str(tiny_model), "runtime": "cpu",
        "engine_args": {"max_num_seq": [4, 8], "enforce-eager": True},
        "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}],
    }))
    from tunelab.core.plan import load_plan

    with pytest.raises(PlanError, match="did you mean 'max-num-seqs'"):
        preflight(load_plan(plan_path))
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "plan", "check", str(plan_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    out = " ".join((r.stdout + r.stderr).split())  # rich wraps long lines
    assert r.returncode == 2, out
    assert "'max-num-seq'" in out and "did you mean 'max-num-seqs'" in out, out
    # `tunelab run` refuses the same plan before Prefect or any server starts, and names the plan file as
    # `plan check` does (a fresh user saw the bare message from `run`)
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(plan_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2, out
    assert f"error: {plan_path}: " in out and "did you mean 'max-num-seqs'" in out, out
