"""The design protocol (tunelab.designs): a design answers "which trials next, given the results so far"; the sweep's
one loop (flows.sweep ``_SweepTrials.run_design``) runs what it answers. Here each design is driven by that loop
reduced to the protocol (no devices, no Prefect): a simulated objective stands in for the trials (as in
tests/test_search.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from tunelab.designs import Design, TrialResult, TrialSpec
from tunelab.designs.grid import FixedGrid
from tunelab.designs.config_search import SearchDesign
from tunelab.designs.sequential_ab import SequentialAB
from test_search import SEARCH, _boot_sim, _plan, _search, _sim, _windows


def test_every_design_speaks_the_protocol_and_no_side_channel_is_left():
    import tunelab.flows.trial as T

    plan = _plan(SEARCH, engine_args={"max-num-seqs": 64})
    assert isinstance(FixedGrid(plan.trials()), Design)
    assert isinstance(SearchDesign(plan, _Log()), Design)
    assert SequentialAB.gate_each_trial and SearchDesign.gate_each_trial and not FixedGrid.gate_each_trial
    # per-trial window checks travel with the trial's spec, not through a module-level dict of the trial flow
    assert not hasattr(T, "WINDOW_CHECKS")
    assert "window_check" in T.run_trial.fn.__code__.co_varnames[:T.run_trial.fn.__code__.co_argcount]


def test_the_fixed_grid_asks_for_every_trial_at_once_in_plan_order():
    plan = _plan(None, engine_args={"max-num-seqs": [8, 16]}, replicates=2)
    g = FixedGrid(plan.trials())
    first = g.next_trials([])
    assert [s.trial for s in first] == plan.trials() and all(s.window_check is None for s in first)
    assert g.trials_total == len(plan.trials()) == 4
    assert g.next_trials([TrialResult(s, f"t{i}", {"status": "ok"}, None) for i, s in enumerate(first)]) == []


class _Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg, *args):
        self.lines.append(msg % args if args else msg)

    warning = info


def _drive(design, monkeypatch, stop_after: int | None = None):
    """The sweep's loop reduced to the protocol: each spec 'runs' on the simulated objective, its window check
    called after each window as the trial flow does; a result per spec goes back to the design."""
    tables: dict[str, pd.DataFrame] = {}
    monkeypatch.setattr(TrialResult, "tables", lambda self: {"measurements": tables.get(self.trial_id)})
    done: list[TrialResult] = []
    asked: list[TrialSpec] = []
    while specs := design.next_trials(done):
        assert len(specs) == 1  # a search boots one config at a time
        (spec,) = specs
        asked.append(spec)
        if stop_after is not None and len(asked) > stop_after:
            design.interrupted(KeyboardInterrupt())
            return asked, done
        tput, ttft = _sim(spec.trial.engine_args, spec.trial.env)
        status, fc, meas = "ok", None, None
        for meas in _windows(tput, ttft, 2):
            if spec.window_check is not None and spec.window_check(meas):
                status, fc = "failed", "pruned"
                break
        tid = f"t{len(done)}"
        tables[tid] = meas
        done.append(TrialResult(spec, tid, {"status": status, "failure_class": fc,
                                            "verdict": "pass" if status == "ok" else "unvalidated"}, None, 1.0))
    return asked, done


def test_the_search_design_asks_for_the_boots_run_search_makes_one_at_a_time(monkeypatch):
    plan = _plan(SEARCH, engine_args={"max-num-seqs": 64})
    direct = _search(plan, _boot_sim([]))
    design = SearchDesign(plan, _Log())
    asked, done = _drive(design, monkeypatch)
    out = design.outcome
    assert [(r.engine_args, r.env, r.state) for r in out.records] == \
        [(r.engine_args, r.env, r.state) for r in direct.records]
    assert out.boots == len(asked) == len(done) == direct.boots and out.stop_reason == direct.stop_reason
    assert asked[0].trial == plan.trials()[0]  # the default first, the plan's own trial
    assert all(callable(s.window_check) for s in asked)  # the prune rule travels with each spec
    assert [r.trial_id for r in out.records] == [r.trial_id for r in done]
    assert design.next_trials(done) == []  # and stays ended


def test_an_interrupted_search_design_records_the_boot_it_ended_cancelled(monkeypatch):
    plan = _plan(SEARCH, engine_args={"max-num-seqs": 64})
    design = SearchDesign(plan, _Log())
    asked, done = _drive(design, monkeypatch, stop_after=3)
    out = design.outcome
    assert len(done) == 3 and out.boots == 4 and out.stop_reason == "interrupted"
    assert out.records[-1].state == "cancelled" and out.records[-1].engine_args == dict(asked[-1].trial.engine_args)


def test_the_search_design_raises_what_the_search_raised(monkeypatch):
    import tunelab.designs.config_search as DS

    def broken(*a, **k):
        raise ValueError("optuna said no")

    monkeypatch.setattr(DS, "run_search", broken)
    with pytest.raises(ValueError, match="optuna said no"):
        SearchDesign(_plan(SEARCH, engine_args={"max-num-seqs": 64}), _Log()).next_trials([])
