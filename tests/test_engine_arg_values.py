"""Engine-arg values that `vllm serve` would reject are found before any server starts (tunelab.core.engine_arg_values,
tunelab.core.plan.bad_engine_arg_values, flows.sweep.preflight, `tunelab plan check`): in a ``search:`` space, in the
fixed engine args and in variants. The allowed values come from the runtime's facts (the choices of vLLM's own
parser, read by a FAKE vLLM CLI here) when they were read, else from tunelab's table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fakes.fake_vllm_package import fake_vllm_runtime
from tunelab.host import paths
from tunelab.host import runtime as runtime_mod
from tunelab.core.engine_arg_values import ENUM_CHOICES, value_problem
from tunelab.core.plan import Plan, PlanError, bad_engine_arg_values, load_plan, runtime_checks
from tunelab.host.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]

# A FAKE `vllm` CLI laid out like vLLM's, whose --dtype has other choices than tunelab's table (fp13 is allowed,
# bfloat16 is not), so a test can tell which source judged a value.
FAKE_CLI = """
    import argparse
    def main():
        p = argparse.ArgumentParser(prog="vllm")
        sub = p.add_subparsers(dest="cmd")
        s = sub.add_parser("serve")
        for f in ("--max-num-seqs", "--max-model-len", "--tensor-parallel-size", "--port",
                  "--gpu-memory-utilization"):
            s.add_argument(f)
        s.add_argument("--enforce-eager", action="store_true")
        s.add_argument("--dtype", choices=["auto", "float16", "fp13"])
        p.parse_args()
        raise SystemExit("the probe must stop at parse_args")
"""

SEARCH = {"objective": {"maximize": "output_tokens_per_s"}, "budget": {"boots": 4}}


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(runtime_mod, "_FACTS_MEMO", {})


def _fake_runtime(tmp_path: Path, name: str, version: str = "0.99.0") -> Runtime:
    """A FAKE runtime registered in the test home, so its facts file is written beside it."""
    return fake_vllm_runtime(tmp_path / f"site-{name}", name, version, FAKE_CLI, register=True)


def _plan_data(tmp_path: Path, runtime: str = "not-here", **kw) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return {"name": "v", "model": str(model), "runtime": runtime, "concurrency": [2], "slo": {"ttft_s": 5.0},
            "workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 2}], **kw}


def _plan_file(tmp_path: Path, **kw) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(_plan_data(tmp_path, **kw)))
    return p


# -- the table ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, value, words", [
    ("dtype", "fp13", "'fp13' is not one of: auto, bfloat16"),
    ("dtype", True, "True is not one of"),  # a bare --dtype
    ("kv-cache-dtype", "fp9", "'fp9' is not one of"),
    ("performance-mode", "fast", "'fast' is not one of: balanced, interactivity, throughput"),
    ("gpu-memory-utilization", 0, "out of range: a number in (0, 1]"),
    ("gpu-memory-utilization", 1.5, "out of range: a number in (0, 1]"),
    ("gpu-memory-utilization", "most", "'most' is not a number in (0, 1]"),
    ("max-num-seqs", 0, "out of range: an integer >= 1"),
    ("max-num-seqs", 2.5, "2.5 is not an integer >= 1"),
    ("max-num-seqs", True, "True is not an integer"),
    ("max-model-len", "long", "'long' is not an integer >= 1 (or a size such as 32k, or auto)"),
])
def test_the_table_rejects_bad_values_saying_what_is_allowed(flag, value, words):
    why = value_problem(flag, value)
    assert why is not None and words in why, why


@pytest.mark.parametrize("flag, value", [
    ("dtype", "bfloat16"), ("kv-cache-dtype", "fp8"), ("gpu-memory-utilization", 1),
    ("gpu-memory-utilization", 0.9), ("max-num-seqs", 256), ("max-num-seqs", "64"), ("max-model-len", "32k"),
    ("max-model-len", "auto"), ("dtype", None), ("dtype", False),  # null / false omit the flag
    ("enforce-eager", True), ("some-flag-the-table-does-not-know", "anything"),
])
def test_the_table_accepts_good_values_and_what_it_does_not_judge(flag, value):
    assert value_problem(flag, value) is None


# -- plan check and run, without a runtime on this machine (the table) ---------------------------------------------
def test_plan_check_rejects_a_bad_search_value_naming_field_value_and_allowed_values(tmp_path):
    from tunelab.cli import app

    plan = _plan_file(tmp_path, search={**SEARCH, "space": {"engine_args": {"dtype": ["bfloat16", "fp13"]}}})
    r = CliRunner().invoke(app, ["plan", "check", str(plan)])
    out = " ".join(r.output.split())  # rich wraps long lines
    assert r.exit_code == 2, out
    assert "search.space.engine_args.dtype[1]: 'fp13' is not one of: " + ", ".join(ENUM_CHOICES["dtype"]) in out, out
    assert "vllm serve --help=all` of vLLM 0.32.0" in out, out


def test_ranges_fixed_args_and_variants_are_checked_too_and_named_by_field(tmp_path):
    plan = Plan.model_validate(_plan_data(
        tmp_path, engine_args={"gpu-memory-utilization": 1.5, "max-num-seqs": [8, 0]},
        variants=[{"name": "a"}, {"name": "b", "engine_args": {"kv-cache-dtype": "fp9"}}]))
    errors, warnings = bad_engine_arg_values(plan, {})
    assert warnings == []
    assert [e.split(":")[0] for e in errors] == ["engine_args.gpu-memory-utilization", "engine_args.max-num-seqs[1]",
                                                 "variants[1].engine_args.kv-cache-dtype"], errors
    ranged = Plan.model_validate(_plan_data(
        tmp_path, search={**SEARCH, "space": {"engine_args": {"gpu-memory-utilization": {"low": 0.5, "high": 1.2}}}}))
    (msg,) = runtime_checks(ranged, {})[0]
    assert msg.startswith("search.space.engine_args.gpu-memory-utilization.high: 1.2 is out of range"), msg
    good = Plan.model_validate(_plan_data(
        tmp_path, engine_args={"gpu-memory-utilization": 0.9, "dtype": "bfloat16", "enforce-eager": True},
        search={**SEARCH, "space": {"engine_args": {"max-num-seqs": {"low": 8, "high": 64}, "dtype": ["auto", "half"]}}}))
    assert bad_engine_arg_values(good, {}) == ([], [])


def test_plan_check_rejects_a_range_whose_step_gives_non_integers_for_an_integer_option(tmp_path):
    """Found by a new user: ``max-num-seqs: {low: 2, high: 3, step: 0.5}`` passed plan check (only its ends, both
    integers, were judged) and every boot but the default failed with ``invalid int value``. The values the range
    steps through are judged too."""
    from tunelab.cli import app

    plan = _plan_file(tmp_path, search={**SEARCH, "space": {
        "engine_args": {"max-num-seqs": {"low": 2, "high": 3, "step": 0.5}}}})
    r = CliRunner().invoke(app, ["plan", "check", str(plan)])
    out = " ".join(r.output.split())  # rich wraps long lines
    assert r.exit_code == 2, out
    assert "search.space.engine_args.max-num-seqs: the range {low: 2, high: 3, step: 0.5} steps through 2.5" in out, out
    assert "2.5 is not an integer >= 1" in out and "give integer low, high and step" in out, out
    # a continuous float range on an integer option, a step that skips an enumerated option's choices
    errors, _ = bad_engine_arg_values(Plan.model_validate(_plan_data(tmp_path, search={**SEARCH, "space": {
        "engine_args": {"max-num-seqs": {"low": 2.0, "high": 8.0}, "max-lora-rank": {"low": 8, "high": 64,
                                                                                     "step": 8}}}})), {})
    assert [e.split(":")[0] for e in errors] == ["search.space.engine_args.max-num-seqs",
                                                 "search.space.engine_args.max-lora-rank"], errors
    assert "takes any number between its ends, e.g. 2.5" in errors[0]
    assert "steps through 24, 40, 48, 56" in errors[1] and "24 is not one of: 1, 8, 16, 32, 64" in errors[1], errors[1]
    # integral floats (2.0, 3.0, 4.0: passed as 2, 3, 4) and a float option's float steps are fine
    fine = Plan.model_validate(_plan_data(tmp_path, search={**SEARCH, "space": {"engine_args": {
        "max-num-seqs": {"low": 2.0, "high": 4.0, "step": 1.0},
        "gpu-memory-utilization": {"low": 0.8, "high": 0.95, "step": 0.05}}}}))
    assert bad_engine_arg_values(fine, {}) == ([], [])


def test_run_preflight_rejects_a_bad_value_before_any_server_starts(tmp_path, monkeypatch):
    from tunelab.flows import sweep as S

    rt = _fake_runtime(tmp_path, f"pre-{tmp_path.name}")
    monkeypatch.setattr(S, "load_runtime", lambda name: rt)
    plan = load_plan(_plan_file(tmp_path, runtime=rt.name,
                                search={**SEARCH, "space": {"engine_args": {"max-num-seqs": [8, 0]}}}))
    with pytest.raises(PlanError, match=r"search\.space\.engine_args\.max-num-seqs\[1\]: 0 is out of range"):
        S.preflight(plan)


# -- the runtime's facts replace the table --------------------------------------------------------------------------
def test_the_runtime_facts_choices_replace_the_table_and_are_cached(tmp_path, monkeypatch):
    rt = _fake_runtime(tmp_path, f"facts-{tmp_path.name}")
    assert rt.serve_choices()["dtype"] == ("auto", "float16", "fp13")
    rec = json.loads((paths.runtimes_dir() / rt.name / "runtime_facts.json").read_text())
    assert rec["serve_choices"]["dtype"] == ["auto", "float16", "fp13"]
    runtime_mod._FACTS_MEMO.clear()  # a new process reads the file, never probes again

    def no_probe(*a, **k):
        raise AssertionError("probed although the facts are cached")

    monkeypatch.setattr(runtime_mod.subprocess, "run", no_probe)
    fp13 = Plan.model_validate(_plan_data(tmp_path, runtime=rt.name,
                                          search={**SEARCH, "space": {"engine_args": {"dtype": ["float16", "fp13"]}}}))
    assert bad_engine_arg_values(fp13, {rt.name: rt}) == ([], [])  # the table would reject fp13
    bf16 = Plan.model_validate(_plan_data(tmp_path, runtime=rt.name, engine_args={"dtype": "bfloat16"}))
    (msg,) = bad_engine_arg_values(bf16, {rt.name: rt})[0]
    assert msg == (f"engine_args.dtype: 'bfloat16' is not one of: auto, float16, fp13 (vLLM 0.99.0 of runtime "
                   f"{rt.name!r})"), msg
    # Options without choices in the parser keep their numeric rules.
    gmu = Plan.model_validate(_plan_data(tmp_path, runtime=rt.name, engine_args={"gpu-memory-utilization": 2}))
    (msg,) = bad_engine_arg_values(gmu, {rt.name: rt})[0]
    assert "2 is out of range: a number in (0, 1]" in msg


def test_facts_written_before_choices_were_read_fall_back_to_the_table_without_a_probe(tmp_path, monkeypatch):
    rt = _fake_runtime(tmp_path, f"old-{tmp_path.name}")
    f = paths.runtimes_dir() / rt.name / "runtime_facts.json"
    rt.facts()
    rec = json.loads(f.read_text())
    del rec["serve_choices"]
    f.write_text(json.dumps(rec))
    runtime_mod._FACTS_MEMO.clear()
    monkeypatch.setattr(runtime_mod.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probed")))
    assert rt.serve_choices() is None and "max-num-seqs" in rt.serve_flags()
    plan = Plan.model_validate(_plan_data(tmp_path, runtime=rt.name, engine_args={"dtype": "fp13"}))
    (msg,) = bad_engine_arg_values(plan, {rt.name: rt})[0]
    assert "'fp13' is not one of: auto, bfloat16" in msg and "tunelab's table" in msg, msg


def test_a_value_one_runtime_accepts_and_another_rejects_is_a_warning(tmp_path):
    rt = _fake_runtime(tmp_path, f"two-{tmp_path.name}")
    other = f"other-{tmp_path.name}"  # not registered here: judged by the table, which rejects fp13
    plan = Plan.model_validate(_plan_data(tmp_path, runtimes=[rt.name, other], engine_args={"dtype": "fp13"}))
    errors, warnings = bad_engine_arg_values(plan, {rt.name: rt})
    assert errors == [] and len(warnings) == 1 and f"accepted by {rt.name!r}" in warnings[0], warnings


def test_the_plans_in_experiments_have_no_bad_values():
    plans = sorted((REPO / "experiments").glob("*.yaml"))
    assert plans
    for p in plans:
        assert bad_engine_arg_values(load_plan(p), {}) == ([], []), p
