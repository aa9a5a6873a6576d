"""Staggered closed-loop starts from the plan (issue 28.2): `closed_loop_start` and `tasks.measure.stagger_schedule`."""

from __future__ import annotations

import textwrap

import pytest

from tunelab.core.load_profiles import Schedule
from tunelab.core.plan import load_plan
from tunelab.tasks.measure import stagger_schedule


def _plan(tmp_path, extra=""):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""\
        name: t
        model: m
        runtime: cpu
        workloads: [{name: w, prompt_tokens: 32, output_tokens: 8, num_requests: 8}]
        concurrency: [1, 4]
        """) + extra)
    return load_plan(tmp_path / "p.yaml")


def test_default_staggers_a_closed_loop_over_one_request(tmp_path):
    plan = _plan(tmp_path)
    assert plan.closed_loop_start == "staggered"
    s = stagger_schedule(Schedule(16, slots=4), plan, pace_per_s=8.0, duration_s=None)
    assert s.stagger_s == pytest.approx(4 / 8.0)  # c / pace: one request's duration by Little's law
    # a count window of fewer than 4 waves would spend its requests joining: not staggered
    assert stagger_schedule(Schedule(15, slots=4), plan, 8.0, None).stagger_s == 0
    # at most half a duration window
    assert stagger_schedule(Schedule(8, slots=4), plan, 1.0, duration_s=2.0).stagger_s == pytest.approx(1.0)
    # one slot, no pace, an open loop: nothing to stagger
    assert stagger_schedule(Schedule(8, slots=1), plan, 8.0, None).stagger_s == 0
    assert stagger_schedule(Schedule(16, slots=4), plan, None, None).stagger_s == 0
    open_loop = Schedule(2, send_offsets_s=(0.0, 0.5))
    assert stagger_schedule(open_loop, plan, 8.0, None) is open_loop


def test_together_keeps_the_old_start_and_a_bad_value_names_the_field(tmp_path):
    plan = _plan(tmp_path, "closed_loop_start: together\n")
    assert stagger_schedule(Schedule(16, slots=4), plan, 8.0, None).stagger_s == 0
    with pytest.raises(ValueError, match="closed_loop_start: Input should be 'staggered' or 'together', got 'later'"):
        _plan(tmp_path, "closed_loop_start: later\n")  # the bad value echoed (found by a fresh user)


def test_a_staggered_ramp_is_not_read_as_a_client_that_fell_behind():
    """c=4, slots joining 0.75 s apart (staggered starts), then every slot busy until the last send: over the
    whole sending time the client would average 3.4 in flight (below the 0.9 x c the achieved_concurrency check
    needs); from the steady part's start, when all 4 were busy, it kept 4."""
    import numpy as np
    import pandas as pd

    from tunelab.tasks import metrics as M

    send, end = [], []
    for k in range(4):  # slot k: first request at 0.75 k, then back to back 2 s requests until t = 8
        t = 0.75 * k
        while t < 8.0:
            send.append(1000.0 + t)
            end.append(1000.0 + t + 2.0)
            t += 2.0
    _, whole = M.in_flight(send, end)
    iv = M.steady_interval(send, end, 4)
    _, steady = M.in_flight(send, end, from_ts=iv.start_ts)
    assert whole < 0.9 * 4 <= steady, (whole, steady)
    assert steady == pytest.approx(4.0, abs=0.05)
    # without a from_ts (or one outside the sends) nothing changes
    assert M.in_flight(send, end, from_ts=None)[1] == whole == M.in_flight(send, end, from_ts=0.0)[1]
    assert np.isfinite(whole) and isinstance(pd.Series(send).size, int)
