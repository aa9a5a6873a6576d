"""Boot orders (tunelab.core.trial_order) and the plan's anchor: field: balanced by default, the anchor in every round."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tunelab.core.plan import PlanError, load_plan
from tunelab.core.trial_order import boot_order

PLAN = """
name: t
model: /models/tiny
runtimes: [cpu, new]
engine_args:
  max-model-len: 2048
variants:
  - {name: base}
  - {name: eager, engine_args: {enforce-eager: true}}
workloads:
  - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
concurrency: [1]
replicates: 4
"""


def _plan(tmp_path, extra=""):
    p = tmp_path / "plan.yaml"
    p.write_text(textwrap.dedent(PLAN) + textwrap.dedent(extra))
    return load_plan(p)


def _mean_positions(order):
    pos: dict = {}
    for i, u in enumerate(order):
        pos.setdefault(u, []).append(i)
    return {u: float(np.mean(v)) for u, v in pos.items()}


def test_balanced_is_abba_and_cancels_linear_drift():
    order = boot_order([["A", "B", "C"]] * 4)
    assert order == ["A", "B", "C", "C", "B", "A", "A", "B", "C", "C", "B", "A"]
    # every unit's mean position is the same: a linear drift adds the same to each unit's mean
    assert len(set(_mean_positions(order).values())) == 1
    rr = boot_order([["A", "B", "C"]] * 4, "round_robin")
    assert len(set(_mean_positions(rr).values())) == 3  # round robin favours the late unit


def test_anchor_sits_between_candidates_and_shuffle_is_seeded():
    assert boot_order([["A", "B", "X"]] * 2, anchor="X") == ["A", "X", "B", "B", "X", "A"]
    a = boot_order([list("ABCDE")] * 3, "shuffle", seed=7)
    assert a == boot_order([list("ABCDE")] * 3, "shuffle", seed=7) != boot_order([list("ABCDE")] * 3, "shuffle", seed=8)
    with pytest.raises(ValueError, match="interleave: 'zigzag' is not a boot order"):
        boot_order([["A"]], "zigzag")


def test_plan_default_order_is_balanced(tmp_path):
    trials = _plan(tmp_path).trials()
    units = [(t.runtime, t.label) for t in trials]
    assert units[:4] == units[4:8][::-1]  # round 2 is round 1 reversed
    assert [t.replicate for t in trials] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert len(set(_mean_positions(units).values())) == 1


def test_plan_anchor_boots_once_per_round_between_candidates(tmp_path):
    plan = _plan(tmp_path, "anchor: {runtime: cpu, name: pinned, engine_args: {max-model-len: 2048, max-num-seqs: 8}}\n")
    trials = plan.trials()
    assert len(trials) == 4 * 5
    anchors = [i for i, t in enumerate(trials) if t.label == "pinned"]
    assert anchors == [2, 7, 12, 17]  # the middle of every round of five
    assert {trials[i].runtime for i in anchors} == {"cpu"} and "--max-num-seqs" in trials[2].serve_args()
    # an anchor that launches one of the plan's configs is that config: no extra boot
    same = _plan(tmp_path, "anchor: {runtime: new, engine_args: {max-model-len: 2048}}\n").trials()
    assert len(same) == 16


@pytest.mark.parametrize("extra, msg", [
    ("anchor: {runtime: gpu-9, engine_args: {}}\n", r"anchor.runtime: 'gpu-9' is not one of the plan's runtimes"),
    ("anchor: {runtime: cpu, engine_args: {max-model-len: [1, 2]}}\n", r"anchor"),
    ("anchor: {runtime: cpu, colour: red}\n", r"anchor.*colour"),
])
def test_bad_anchor_fails_with_the_field(tmp_path, extra, msg):
    with pytest.raises(PlanError, match=msg):
        _plan(tmp_path, extra)
