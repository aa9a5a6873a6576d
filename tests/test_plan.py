"""Plan validation, matrix expansion and config-key stability."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tunelab.core.plan import Plan, PlanError, config_key, load_plan

GOOD = """
name: t
model: /models/tiny
engine_args:
  max-model-len: 2048
  enforce-eager: [false, true]
env:
  VLLM_USE_FASTOKENS: [0, 1]
workloads:
  - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
concurrency: [1, 4]
repeats: 2
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_good_plan_expands_to_matrix(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    trials = plan.trials()
    assert len(trials) == 4  # 2 eager values x 2 env values
    labels = {t.label for t in trials}
    assert labels == {"enforce-eager VLLM_USE_FASTOKENS=1", "enforce-eager VLLM_USE_FASTOKENS=0",
                      "no enforce-eager VLLM_USE_FASTOKENS=1", "no enforce-eager VLLM_USE_FASTOKENS=0"}
    eager = [t for t in trials if t.engine_args.get("enforce-eager")][0]
    assert "--enforce-eager" in eager.serve_args()
    plain = [t for t in trials if not t.engine_args.get("enforce-eager")][0]
    assert "--enforce-eager" not in plain.serve_args()
    assert plain.serve_args()[:2] == ["--max-model-len", "2048"]
    assert len({t.config_key for t in trials}) == 4


def test_replicates_interleave_configs(tmp_path):
    plan = load_plan(write(tmp_path, GOOD + "replicates: 2\ninterleave: round_robin\n"))
    keys = [t.config_key for t in plan.trials()]
    assert len(keys) == 8
    # A B C D A B C D: every config's first boot comes before any config's second boot.
    assert keys[:4] == keys[4:] and len(set(keys[:4])) == 4


def test_shuffle_is_seeded(tmp_path):
    a = load_plan(write(tmp_path, GOOD + "replicates: 3\ninterleave: shuffle\nseed: 7\n")).trials()
    b = load_plan(write(tmp_path, GOOD + "replicates: 3\ninterleave: shuffle\nseed: 7\n")).trials()
    assert [t.config_key for t in a] == [t.config_key for t in b]


def test_config_key_independent_of_order_spelling_and_machine():
    k1 = config_key("tiny", {"max-model-len": 2048, "enforce-eager": True}, {"A": "1", "B": "x"})
    k2 = config_key("tiny", {"enforce_eager": True, "--max-model-len": 2048}, {"B": "x", "A": "1"})
    assert k1 == k2
    # false/absent flags are the same launched config
    assert config_key("tiny", {"enforce-eager": False}, {}) == config_key("tiny", {}, {})
    # ... but a different value is a different config
    assert k1 != config_key("tiny", {"max-model-len": 4096, "enforce-eager": True}, {"A": "1", "B": "x"})
    assert k1 != config_key("other", {"max-model-len": 2048, "enforce-eager": True}, {"A": "1", "B": "x"})


def test_config_key_uses_model_folder_name_not_path(tmp_path):
    p1 = Plan.model_validate({"name": "a", "model": "/x/y/tiny", "workloads": [
        {"name": "w", "prompt_tokens": 4, "output_tokens": 4, "num_requests": 1}]})
    p2 = p1.model_copy(update={"model": "/elsewhere/tiny"})
    assert p1.trials()[0].config_key == p2.trials()[0].config_key


def test_env_bool_becomes_int_string(tmp_path):
    plan = load_plan(write(tmp_path, GOOD.replace("[0, 1]", "[false, true]")))
    assert {t.env["VLLM_USE_FASTOKENS"] for t in plan.trials()} == {"0", "1"}


@pytest.mark.parametrize(
    "patch, field, hint",
    [
        ("prompt_tokens: 32", "workloads[0].prompt_tokens", "greater than 0"),
        ("concurrency: [1, 4]", "concurrency", ">= 1"),
        ("repeats: 2", "repeats", "greater than or equal to 1"),
        ("max-model-len: 2048", "engine_args", "set by tunelab"),
        ("name: t\n", "workloadz", "unknown field"),
        ("repeats: 2\n", "load_processes", "greater than or equal to 1"),
    ],
)
def test_bad_plans_name_the_field(tmp_path, patch, field, hint):
    bad = {
        "prompt_tokens: 32": "prompt_tokens: 0",
        "concurrency: [1, 4]": "concurrency: [0, 4]",
        "repeats: 2": "repeats: 0",
        "max-model-len: 2048": "port: 8000",
        "name: t\n": "name: t\nworkloadz: []\n",
        "repeats: 2\n": "repeats: 2\nload_processes: 0\n",
    }[patch]
    with pytest.raises(PlanError) as ei:
        load_plan(write(tmp_path, GOOD.replace(patch, bad, 1)))
    msg = str(ei.value)
    assert "plan.yaml" in msg and field in msg and hint in msg, msg


@pytest.mark.parametrize("yaml_line, field", [
    ("load_processes: true", "load_processes"),
    ("replicates: yes", "replicates"),
    ("warmup_requests: 2.5", "warmup_requests"),
])
def test_a_boolean_or_fraction_where_a_count_belongs_is_an_error(tmp_path, yaml_line, field):
    # pydantic's lax mode would read `true` as 1 and 2.0 as 2; a count field takes only an integer.
    with pytest.raises(PlanError) as ei:
        load_plan(write(tmp_path, GOOD + yaml_line + "\n"))
    assert field in str(ei.value) and "valid integer" in str(ei.value), str(ei.value)
    with pytest.raises(PlanError, match=r"concurrency\.0.*valid integer|concurrency\[0\].*valid integer"):
        load_plan(write(tmp_path, GOOD.replace("concurrency: [1, 4]", "concurrency: [true, 4]")))


@pytest.mark.parametrize("old, new, field, hint", [
    ("concurrency: [1, 4]", "concurrency: [2, 2]", "concurrency", "distinct"),
    ("concurrency: [1, 4]", "concurrency: [1]\nrequest_rates: [.nan]", "request_rates", "finite"),
    ("concurrency: [1, 4]", "concurrency: [1]\nrequest_rates: [2, 2.0]", "request_rates", "distinct"),
    ("repeats: 2", "repeats: 2\nrequest_timeout_s: .inf", "request_timeout_s", "finite"),
])
def test_load_levels_are_distinct_finite_and_timeouts_finite(tmp_path, old, new, field, hint):
    # A level given twice produced two windows with one key, and the trial's bundle could not be written.
    with pytest.raises(PlanError) as ei:
        load_plan(write(tmp_path, GOOD.replace(old, new, 1)))
    assert field in str(ei.value) and hint in str(ei.value), str(ei.value)


def test_missing_required_field_and_bad_yaml(tmp_path):
    with pytest.raises(PlanError, match=r"workloads: required field is missing"):
        load_plan(write(tmp_path, "name: t\nmodel: m\n"))
    with pytest.raises(PlanError, match="not valid YAML"):
        load_plan(write(tmp_path, "name: [unclosed\n"))
    with pytest.raises(PlanError, match="cannot read plan file"):
        load_plan(tmp_path / "nope.yaml")


def test_misspelled_quality_threshold_is_an_error(tmp_path):
    with pytest.raises(PlanError, match=r"quality\.max_error_rat"):
        load_plan(write(tmp_path, GOOD + "quality:\n  max_error_rat: 0.1\n"))


def test_demo_plan_is_valid():
    repo = Path(__file__).resolve().parent.parent
    plan = load_plan(repo / "experiments" / "demo.yaml")
    assert len(plan.trials()) >= 2 and len(plan.concurrency) >= 2 and plan.repeats >= 2


VARIANTS = """
name: v
model: /models/tiny
runtimes: [a, b]
engine_args: {max-model-len: 4096}
variants:
  - {}
  - {engine_args: {enforce-eager: true}}
  - {env: {VLLM_USE_FASTOKENS: 1}}
  - {engine_args: {max-num-batched-tokens: 2048}, runtimes: [a]}
workloads:
  - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
replicates: 2
"""


def test_variants_change_one_thing_at_a_time(tmp_path):
    plan = load_plan(write(tmp_path, VARIANTS))
    trials = plan.trials()
    # runtime a: 4 variants, runtime b: 3 (the last is restricted to a); x 2 replicates
    assert len(trials) == 2 * (4 + 3)
    a = [t for t in trials if t.runtime == "a" and t.replicate == 0]
    assert sorted(t.label for t in a) == sorted(
        ["default", "enforce-eager", "VLLM_USE_FASTOKENS=1", "max-num-batched-tokens=2048"])
    assert all(t.engine_args["max-model-len"] == 4096 for t in trials)
    # the same variant has the same config key on both runtimes: comparable across releases
    keys_a = {t.label: t.config_key for t in a}
    keys_b = {t.label: t.config_key for t in trials if t.runtime == "b" and t.replicate == 0}
    assert keys_b["VLLM_USE_FASTOKENS=1"] == keys_a["VLLM_USE_FASTOKENS=1"]


def test_variant_for_unknown_runtime_is_an_error(tmp_path):
    with pytest.raises(PlanError, match=r"variants\[3\]\.runtimes: 'a' is not one of"):
        load_plan(write(tmp_path, VARIANTS.replace("runtimes: [a, b]", "runtime: c")))


def test_plan_name_cannot_escape_folders(tmp_path):
    with pytest.raises(PlanError, match=r"name: use letters"):
        load_plan(write(tmp_path, GOOD.replace("name: t", 'name: "../../escape"')))


def test_workload_longer_than_context_is_rejected(tmp_path):
    with pytest.raises(PlanError, match=r"exceeds max-model-len 2048"):
        load_plan(write(tmp_path, GOOD.replace("prompt_tokens: 32", "prompt_tokens: 5000")))


def test_runtime_list_hints_runtimes_and_non_utf8_is_named(tmp_path):
    with pytest.raises(PlanError, match="use `runtimes: \\[a, b\\]`"):
        load_plan(write(tmp_path, GOOD + "runtime: [cpu, cpu2]\n"))
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: t\nmodel: caf\xe9\n".encode("latin-1"))
    with pytest.raises(PlanError, match="not UTF-8"):
        load_plan(p)


def test_variants_are_validated_like_the_matrix(tmp_path):
    with pytest.raises(PlanError, match=r"set by tunelab for every boot"):
        load_plan(write(tmp_path, VARIANTS.replace("{engine_args: {enforce-eager: true}}", "{engine_args: {port: 1}}")))
    with pytest.raises(PlanError, match=r"not a valid environment variable name"):
        load_plan(write(tmp_path, VARIANTS.replace("VLLM_USE_FASTOKENS: 1", "BAD-NAME: 1")))


def test_two_configs_that_launch_the_same_server_are_an_error_before_any_boot(tmp_path):
    """They share a config key, so their boots would write one bundle and the second would replace the first."""
    with pytest.raises(PlanError, match=r"two configs launch the same server on runtime 'cpu'.*remove the repeat"):
        load_plan(write(tmp_path, GOOD.replace("enforce-eager: [false, true]", "enforce-eager: [true, true]")))
    # false launches no flag, as null does: the same server
    with pytest.raises(PlanError, match=r"two configs launch the same server"):
        load_plan(write(tmp_path, GOOD.replace("enforce-eager: [false, true]", "enforce-eager: [false, null]")))
    # two variants with the same overrides, on runtime b only (the repeat is restricted to it)
    text = VARIANTS.replace("  - {engine_args: {max-num-batched-tokens: 2048}, runtimes: [a]}",
                            "  - {engine_args: {enforce-eager: true}, runtimes: [b]}")
    with pytest.raises(PlanError, match=r"on runtime 'b' \('max-model-len=4096 enforce-eager=True' and"):
        load_plan(write(tmp_path, text))
    # the same config on two runtimes is the point of a cross-release plan, and distinct values pass
    assert len(load_plan(write(tmp_path, VARIANTS)).trials()) == 14
    assert len(load_plan(write(tmp_path, GOOD)).trials()) == 4


def test_a_union_field_error_is_one_line_without_pydantic_member_names(tmp_path):
    with pytest.raises(PlanError) as e:
        load_plan(write(tmp_path, GOOD + "replicates: 0\n"))
    msg = str(e.value)
    assert "invalid plan (1 problem(s))" in msg
    assert "  - replicates: Input should be greater than or equal to 1; or Input should be 'auto'" in msg
    assert "constrained-int" not in msg and "literal[" not in msg


def test_a_check_across_fields_names_its_field_not_the_whole_plan(tmp_path):
    """A model validator has no location in pydantic's error; its message leads with the field it is about."""
    text = GOOD + "\nslo: {}\nsla_search: {load: concurrency, start: 1, max: 8}\n"
    with pytest.raises(PlanError) as ei:
        load_plan(write(tmp_path, text))
    msg = str(ei.value)
    assert "  - sla_search: needs a latency bound" in msg and "<plan>" not in msg and "Value error" not in msg


@pytest.mark.parametrize("where,text", [
    ("engine_args", """
        name: t
        model: /models/tiny
        engine_args:
          max-num-seqs: 8
          enforce-eager: true
          max-num-seqs: 16
        workloads:
          - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
        """),
    ("top level", """
        name: t
        model: /models/tiny
        concurrency: [1]
        workloads:
          - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
        concurrency: [4]
        """),
])
def test_a_key_written_twice_is_refused_naming_the_key_and_both_lines(tmp_path, where, text):
    """Issue 29 item 19: PyYAML keeps the last of two equal keys silently, so a plan swept only one value."""
    with pytest.raises(PlanError) as e:
        load_plan(write(tmp_path, text))
    msg = str(e.value)
    key, lines = ("max-num-seqs", "lines 5 and 7") if where == "engine_args" else ("concurrency", "lines 4 and 7")
    assert f"key {key!r} is written twice ({lines})" in msg and "plan.yaml" in msg


def test_yaml_merge_keys_and_equal_keys_in_different_mappings_are_not_duplicates(tmp_path):
    plan = load_plan(write(tmp_path, """
        name: t
        model: /models/tiny
        engine_args: &base
          max-num-seqs: 8
        variants:
          - {name: a, engine_args: {<<: *base, enforce-eager: true}}
          - {name: b, engine_args: {max-num-seqs: 16}}
        workloads:
          - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
          - {name: long, prompt_tokens: 64, output_tokens: 8, num_requests: 4}
        """))
    assert [w.name for w in plan.workloads] == ["short", "long"]
