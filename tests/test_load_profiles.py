"""Load profiles (tunelab/core/load_profiles.py): each profile's label, schedule, deadline, warm-up size and
validation, and the plan's YAML fields expanding into the same levels and labels as before the profiles."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tunelab.core.load_profiles import (
    LOAD_KINDS,
    ConcurrencyProfile,
    RateProfile,
    Schedule,
    arrival_offsets,
    concurrency_target_kinds,
    load_label,
    profile_class,
    profile_for,
    profiles_from_levels,
)
from tunelab.core.plan import PlanError, load_plan, requests_for_level

PLAN = """\
name: t
model: m
workloads:
  - {name: chat, prompt_tokens: 8, output_tokens: 4, num_requests: 5}
repeats: 2
request_timeout_s: 10
"""


def _plan(tmp_path: Path, extra: str):
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN + extra)
    return load_plan(p)


# -- fixed concurrency ----------------------------------------------------------------------------------


def test_concurrency_label_schedule_and_target():
    p = ConcurrencyProfile(concurrency=4)
    assert (p.kind, p.value, p.label) == ("concurrency", 4.0, "c=4")
    s = p.schedule(10, seed=1)
    assert s.closed_loop and s.slots == 4 and s.send_offsets_s is None and s.n_requests == 10
    assert p.target_concurrency == 4.0 and p.plot_marker == "o"


def test_concurrency_deadline_warmup_and_measured_requests():
    p = ConcurrencyProfile(concurrency=8)
    assert p.window_deadline_s(request_timeout_s=10.0, repeats=2) == 30.0
    assert p.warmup_requests(4) == 8  # c requests in flight at once before the window
    assert ConcurrencyProfile(concurrency=2).warmup_requests(4) == 4  # the plan's count is a minimum
    assert p.warmup_requests(0) == 0  # off stays off
    assert p.measured_requests(5, requests_per_concurrency=0) == 5
    assert p.measured_requests(5, requests_per_concurrency=3) == 24


@pytest.mark.parametrize("bad", [0, -2])
def test_concurrency_validation_names_the_field_and_the_fix(bad):
    with pytest.raises(ValueError) as ei:
        profiles_from_levels(ConcurrencyProfile, [1, bad])
    msg = str(ei.value)
    assert "concurrency[1]" in msg and ">= 1" in msg and "e.g. concurrency: [1, 4]" in msg, msg


# -- request rate with its arrival process ----------------------------------------------------------------


def test_rate_label_and_schedule_follow_the_arrival_process():
    p = RateProfile(rate_per_s=2.5, burstiness=0.5)
    assert (p.kind, p.value, p.label, p.arrival_process) == ("rate", 2.5, "2.5 req/s", "gamma")
    s = p.schedule(50, seed=7)
    assert not s.closed_loop and s.slots is None
    assert np.array_equal(np.array(s.send_offsets_s), arrival_offsets(50, 2.5, 0.5, seed=7))
    assert RateProfile(rate_per_s=1.0).arrival_process == "poisson"
    const = RateProfile(rate_per_s=4.0, burstiness=math.inf)
    assert const.arrival_process == "constant"
    assert np.allclose(np.diff(const.schedule(5, seed=0).send_offsets_s), 0.25)
    assert p.target_concurrency is None and p.plot_marker == "s"


def test_rate_deadline_warmup_and_measured_requests():
    p = RateProfile(rate_per_s=10.5)
    assert p.window_deadline_s(request_timeout_s=10.0, repeats=2) == 30.0
    assert p.warmup_requests(4) == 11  # one second of arrivals
    assert RateProfile(rate_per_s=0.5).warmup_requests(4) == 4
    assert p.warmup_requests(0) == 0
    assert p.measured_requests(5, requests_per_concurrency=3) == 5  # requests_per_concurrency is for concurrency


@pytest.mark.parametrize("bad, hint", [(math.nan, "finite"), (math.inf, "finite"), (0.0, "> 0"), (-1.0, "> 0")])
def test_rate_validation_names_the_field_and_the_fix(bad, hint):
    with pytest.raises(ValueError) as ei:
        profiles_from_levels(RateProfile, [2.0, bad])
    msg = str(ei.value)
    assert "request_rates[1]" in msg and hint in msg and "e.g. request_rates:" in msg, msg


def test_rate_schedule_needs_offsets_or_a_seed():
    with pytest.raises(ValueError, match="arrival_offsets_s"):
        RateProfile(rate_per_s=1.0).schedule(3)
    given = RateProfile(rate_per_s=1.0).schedule(3, send_offsets_s=[0.0, 0.5, 2.0])
    assert given.send_offsets_s == (0.0, 0.5, 2.0)
    with pytest.raises(ValueError, match="one offset"):
        RateProfile(rate_per_s=1.0).schedule(3, send_offsets_s=[0.0])


def test_levels_given_twice_are_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"request_rates levels must be distinct.*repeats"):
        profiles_from_levels(RateProfile, [2, 2.0])
    with pytest.raises(ValueError, match=r"concurrency levels must be distinct"):
        profiles_from_levels(ConcurrencyProfile, [4, 4])


def test_schedule_has_exactly_one_shape():
    with pytest.raises(ValueError, match="either slots"):
        Schedule(2)
    with pytest.raises(ValueError, match="either slots"):
        Schedule(2, slots=1, send_offsets_s=(0.0, 1.0))


# -- warehouse keys -----------------------------------------------------------------------------------------


def test_warehouse_keys_map_to_profiles_and_labels():
    assert LOAD_KINDS == ("concurrency", "rate", "trace") and concurrency_target_kinds() == ("concurrency",)
    assert profile_for("concurrency", 4.0) == ConcurrencyProfile(concurrency=4)
    assert profile_for("rate", 2.0, burstiness=0.5) == RateProfile(rate_per_s=2.0, burstiness=0.5)
    assert profile_class("rate") is RateProfile
    # Rows imported from `vllm bench serve` may carry rate inf: labelled, not validated.
    assert load_label("rate", math.inf) == "inf req/s" and load_label("concurrency", 16.0) == "c=16"
    for fn in (lambda: profile_for("qps", 1.0), lambda: load_label("qps", 1.0)):
        with pytest.raises(ValueError, match=r"load_kind must be one of \['concurrency', 'rate', 'trace'\]"):
            fn()
    with pytest.raises(ValueError, match=r"load_value \(concurrency\)"):
        profile_for("concurrency", 0.0)


def test_seed_key_keeps_the_former_prompt_seeds():
    # measure seeds prompts and arrivals with the level's former dataclass repr; keeping it keeps a plan's
    # prompts and schedules identical to those of earlier tunelab releases.
    assert ConcurrencyProfile(concurrency=4).seed_key == "LoadLevel(kind='concurrency', value=4.0)"
    assert RateProfile(rate_per_s=0.5, burstiness=2.0).seed_key == "LoadLevel(kind='rate', value=0.5)"


# -- the plan's YAML fields ---------------------------------------------------------------------------------


def test_plan_yaml_fields_expand_to_the_same_levels_and_labels_as_before(tmp_path):
    plan = _plan(tmp_path, "concurrency: [1, 4]\nrequest_rates: [0.5, 2]\nburstiness: 0.7\n"
                           "requests_per_concurrency: 2\n")
    profiles = plan.load_profiles()
    assert profiles == [ConcurrencyProfile(concurrency=1), ConcurrencyProfile(concurrency=4),
                        RateProfile(rate_per_s=0.5, burstiness=0.7), RateProfile(rate_per_s=2.0, burstiness=0.7)]
    # The labels the CLI printed before the profiles: f"c={c}" and f"{r:g} req/s".
    before = [f"c={c}" for c in plan.concurrency] + [f"{r:g} req/s" for r in plan.request_rates]
    assert [p.label for p in profiles] == before == ["c=1", "c=4", "0.5 req/s", "2 req/s"]
    # The warehouse keys are those measure wrote before: (kind, float value).
    assert [(p.kind, p.value) for p in profiles] == [("concurrency", 1.0), ("concurrency", 4.0), ("rate", 0.5),
                                                     ("rate", 2.0)]
    w = plan.workloads[0]
    assert [requests_for_level(plan, w, p) for p in profiles] == [5, 8, 5, 5]
    # The default plan: one level, c=1.
    assert [p.label for p in _plan(tmp_path, "").load_profiles()] == ["c=1"]


def test_plan_level_errors_name_the_field(tmp_path):
    with pytest.raises(PlanError) as ei:
        _plan(tmp_path, "request_rates: [1, .inf]\n")
    assert "request_rates" in str(ei.value) and "finite" in str(ei.value), str(ei.value)
    with pytest.raises(PlanError) as ei:
        _plan(tmp_path, "concurrency: [0]\n")
    assert "concurrency" in str(ei.value) and ">= 1" in str(ei.value), str(ei.value)


def test_duration_window_schedules_and_deadline():
    from tunelab.core.load_profiles import ConcurrencyProfile, RateProfile, WindowSpec, arrival_offsets

    c = ConcurrencyProfile(concurrency=4)
    s = c.duration_schedule(10.0, seed=1, requests_per_s=20.0)
    assert s.slots == 4 and s.send_until_s == 10.0 and s.n_requests == 1.5 * 20 * 10 + 4
    assert c.duration_schedule(10.0, seed=1, requests_per_s=None).n_requests == 64 * 4  # pace unknown
    r = RateProfile(rate_per_s=5.0)
    s = r.duration_schedule(10.0, seed=3)
    assert s.send_until_s == 10.0 and max(s.send_offsets_s) < 10.0
    # The same draws as a count window of the same seed, cut at the duration.
    assert s.send_offsets_s == tuple(arrival_offsets(s.n_requests, 5.0, seed=3))
    assert 25 < s.n_requests < 80
    assert c.window_deadline_s(120.0, 2, 10.0) == c.window_deadline_s(120.0, 2) + 10.0
    with pytest.raises(ValueError, match="duration_s must be a finite number of seconds > 0.*window:"):
        WindowSpec(duration_s=0)
    from tunelab.core.plan import Plan

    plan = Plan(name="p", model="m", workloads=[{"name": "w", "prompt_tokens": 8, "output_tokens": 4,
                                                "num_requests": 4}], window={"duration_s": 5})
    assert plan.window.duration_s == 5.0
    assert Plan(name="p", model="m", workloads=plan.workloads).window is None  # default: request-count windows
