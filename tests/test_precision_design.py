"""Design from the noise model (issue 14 items 3 and 7): ``precision:`` in a plan, the design chosen from a synthetic
warehouse with known noise (``tunelab.reports.design_plan``), the pilot without history, the warning when the precision
cannot be reached, and the sequential rule's history prior (``prior_sd``) read from the noise model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tunelab.reports.design_plan import (ab_lines, apply_design, design_for_plan, precision_warnings, resolve_precision,
                                 sweep_ab_rows)
from tunelab.core.plan import Plan, PlanError, load_plan
from tunelab.stats.design import optimal_design
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.noise_history import noise_model
from tunelab.warehouse.synthetic import synthetic_trial


def _plan_dict(**over) -> dict:
    d = {"name": "prec", "model": "fake-model", "runtime": "synthetic",
         "engine_args": {"max-num-batched-tokens": [8192, 2048]},
         "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 6}],
         "concurrency": [4, 32],
         "precision": {"metric": "output_tokens_per_s", "half_width": 0.05, "loads": ["c=32"]}}
    d.update(over)
    return d


def _load(tmp_path, d: dict) -> Plan:
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(d))
    return load_plan(p)


def _insert(con, st) -> None:
    from tunelab.warehouse.loader import insert_trial_tables

    trial = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in st.trial.items()}
    con.execute("BEGIN")
    insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]), "trial": pd.DataFrame([trial]),
                                                    **st.tables}, source="test")
    con.execute("COMMIT")


def _history(con, plan: Plan, *, boots: int, windows: int, sd: dict[int, tuple[float, float]], sweep_id="hist",
             effect: dict[int, float] | None = None, seed: int = 1) -> None:
    """``boots`` boots of ``windows`` windows for each config i of the plan with (boot SD, window SD) ``sd[i]``."""
    rng = np.random.default_rng(seed)
    for i, t in enumerate(plan._round(0)):
        if i not in sd:
            continue
        for r in range(boots):
            _insert(con, synthetic_trial(sweep_id=sweep_id, config_key=t.config_key, replicate=r,
                                         runtime_name=t.runtime, config_label=t.label, workloads=("chat",),
                                         loads=(("concurrency", 4.0), ("concurrency", 32.0)), repeats=windows,
                                         boot_sd_rel=sd[i][0], repeat_sd_rel=sd[i][1],
                                         effect_rel=(effect or {}).get(i, 0.0), rng=rng))


# -- the plan ------------------------------------------------------------------------------------------------------
def test_a_precision_plan_validates_and_leaves_the_counts_to_the_design(tmp_path):
    plan = _load(tmp_path, _plan_dict())
    assert plan.precision.half_width == 0.05 and plan.precision.loads == ["c=32"]
    assert plan.replicates == 1 and plan.repeats == 2  # placeholders until the design sets them


@pytest.mark.parametrize("change, message", [
    ({"replicates": 3}, r"precision: tunelab chooses boots per config \(replicates\).*remove replicates \(replicates: 3\)"),
    ({"repeats": 4}, r"remove repeats \(repeats: 4\), or remove precision"),
    ({"replicates": 2, "repeats": 2}, "remove replicates and repeats"),
    ({"replicates": "auto", "ab": {"metrics": ["output_tokens_per_s"], "budget": {"boots": 8}}},
     "replicates: auto stops by its own sequential rule"),
    ({"precision": {"metric": "output_tokens_ps", "half_width": 0.03}}, "did you mean 'output_tokens_per_s'"),
    ({"precision": {"half_width": 0.03, "loads": ["c=8"]}},
     r"precision.loads\[0\]: 'c=8' is not a load level of the plan; use one of \['c=4', 'c=32'\]"),
    ({"precision": {"half_width": 0.03, "workloads": ["summary"]}}, r"precision.workloads\[0\]: 'summary'"),
    ({"precision": {"half_width": 0.0}}, "half_width"),
    ({"precision": {"half_width": 3}}, "half_width"),
    ({"precision": {"metric": "output_tokens_per_s"}}, "half_width"),
])
def test_precision_errors_name_the_field_and_the_fix(tmp_path, change, message):
    with pytest.raises(PlanError, match=message):
        _load(tmp_path, _plan_dict(**change))


# -- the design from the warehouse ---------------------------------------------------------------------------------
def test_design_from_a_synthetic_warehouse_is_optimal_design_of_its_noise_model():
    plan = Plan.model_validate(_plan_dict())
    con = connect(":memory:")
    # config 0: boot SD 6 %, window SD 3 %; config 1: boot SD 4 %, window SD 5 % (known components)
    _history(con, plan, boots=12, windows=4, sd={0: (0.06, 0.03), 1: (0.04, 0.05)})
    design = design_for_plan(plan, con)
    assert not design.design.pilot and design.cell == "chat c=32"
    nm = noise_model(con, "output_tokens_per_s")
    nm = nm[nm.load_value == 32.0]
    assert len(nm) == 2
    # the synthetic components are recovered (12 boots: loose) and the design is optimal_design of them
    a = nm.set_index("config_key").loc[plan._round(0)[0].config_key]
    assert 0.03 < a.sd_boot_rel < 0.10 and 0.02 < a.sd_window_rel < 0.045
    want = optimal_design(nm.var_boot.max(), nm.var_window.max(), nm.boot_s.mean(), nm.window_s.mean(), 0.05)
    assert (design.design.boots_per_config, design.design.windows_per_boot) == (want.boots_per_config,
                                                                                want.windows_per_boot)
    assert design.design.half_width == pytest.approx(want.half_width) and design.design.half_width <= 0.05
    planned = apply_design(plan, design)
    assert planned.replicates == want.boots_per_config and planned.repeats == want.windows_per_boot
    assert len(planned.trials()) == 2 * want.boots_per_config
    text = "\n".join(design.lines())
    assert f"{want.boots_per_config} boots x {want.windows_per_boot} windows per config" in text
    assert f"predicted +-{want.half_width:.1%}" in text and "GPU-minutes" in text
    assert design.warnings() == []
    con.close()


def test_the_binding_cell_decides_and_a_tighter_target_costs_more():
    plan = Plan.model_validate(_plan_dict(precision={"half_width": 0.05}))  # both levels must reach it
    con = connect(":memory:")
    _history(con, plan, boots=10, windows=3, sd={0: (0.05, 0.04), 1: (0.05, 0.04)})
    loose = design_for_plan(plan, con)
    tight = design_for_plan(Plan.model_validate(_plan_dict(precision={"half_width": 0.03})), con)
    assert loose.cell in ("chat c=4", "chat c=32")
    assert tight.design.gpu_s_per_config > loose.design.gpu_s_per_config
    con.close()


def test_a_config_without_history_gets_a_pilot_and_the_sweep_says_so(tmp_path):
    plan = Plan.model_validate(_plan_dict())
    con = connect(":memory:")
    d = design_for_plan(plan, con)  # empty warehouse
    assert d.design.pilot and sorted(d.no_history) == sorted(t.label for t in plan._round(0))
    p = apply_design(plan, d)
    assert (p.replicates, p.repeats) == (3, 3)
    assert "pilot, no history for max-num-batched-tokens=8192, max-num-batched-tokens=2048" in d.lines()[0]
    # one config with history, the other without: a pilot that names only the one without
    _history(con, plan, boots=4, windows=3, sd={0: (0.05, 0.04)})
    d = design_for_plan(plan, con)
    assert d.design.pilot and d.no_history == ["max-num-batched-tokens=2048"]
    con.close()
    # a plan check on a machine with no warehouse file: a pilot too
    p2, d2 = resolve_precision(plan, tmp_path / "none.duckdb")
    assert d2.design.pilot and p2.replicates == 3
    # plans without precision pass through
    q = Plan.model_validate({k: v for k, v in _plan_dict().items() if k != "precision"})
    assert resolve_precision(q, tmp_path / "none.duckdb") == (q, None)


def test_an_unreachable_precision_warns_and_a_reachable_one_does_not():
    plan = Plan.model_validate(_plan_dict(precision={"half_width": 0.01, "loads": ["c=32"]}))
    con = connect(":memory:")
    _history(con, plan, boots=6, windows=3, sd={0: (0.15, 0.05), 1: (0.15, 0.05)})
    d = design_for_plan(plan, con)
    assert not d.design.reachable
    (w,) = d.warnings()
    assert "output_tokens_per_s at chat c=32" in w and "+-1.0% cannot be reached" in w and "out of reach" in w
    assert any(line.startswith("warning: output_tokens_per_s") for line in d.lines())
    ok = design_for_plan(Plan.model_validate(_plan_dict(precision={"half_width": 0.5, "loads": ["c=32"]})), con)
    assert ok.design.reachable and ok.warnings() == []
    con.close()


def test_the_design_reads_only_trusted_history_and_says_how_much():
    plan = Plan.model_validate(_plan_dict(precision={"half_width": 0.1, "loads": ["c=32"]}))
    con = connect(":memory:")
    _history(con, plan, boots=4, windows=3, sd={0: (0.03, 0.02), 1: (0.03, 0.02)})
    clean = design_for_plan(plan, con)
    # one broken unvalidated demo boot (throughput -97 %) and a failed one: left out of the design
    for i, q in ((90, "unvalidated"), (91, "fail")):
        _insert(con, synthetic_trial(sweep_id="demo", config_key=plan._round(0)[0].config_key, replicate=i,
                                     runtime_name="synthetic", workloads=("chat",),
                                     loads=(("concurrency", 4.0), ("concurrency", 32.0)), repeats=3,
                                     effect_rel=-0.97, quality_verdict=q))
    d = design_for_plan(plan, con)
    assert d.design.reachable and (d.design.boots_per_config, d.design.windows_per_boot) == (
        clean.design.boots_per_config, clean.design.windows_per_boot)
    assert all(c.boots == 4 for c in d.cells) and (d.history_boots, d.history_sweeps) == (8, 1)
    assert "from the noise model of 8 boots in 1 sweep of trusted history (quality pass/warn, status ok)" in d.lines()[0]
    con.close()


def test_run_refuses_an_unreachable_design_unless_the_plan_caps_the_boots(tmp_path):
    from typer.testing import CliRunner

    from tunelab.cli import app

    d = _plan_dict(precision={"half_width": 0.01, "loads": ["c=32"]})
    plan = Plan.model_validate(d)
    db = tmp_path / "w.duckdb"
    con = connect(str(db))
    _history(con, plan, boots=6, windows=3, sd={0: (0.15, 0.05), 1: (0.15, 0.05)})
    des = design_for_plan(plan, con)
    msg = des.refusal()
    assert msg and "+-1.0% at chat c=32 is out of reach" in msg and f"reach +-{des.design.half_width:.1%}" in msg
    assert "the target would take" in msg and "set precision.max_boots" in msg
    capped = design_for_plan(Plan.model_validate(_plan_dict(precision={"half_width": 0.01, "loads": ["c=32"],
                                                                       "max_boots": 6})), con)
    assert not capped.design.reachable and capped.design.boots_per_config == 6 and capped.refusal() is None
    assert capped.warnings()  # still warned
    con.close()
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(d))
    r = CliRunner().invoke(app, ["run", str(tmp_path / "plan.yaml"), "--db", str(db)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert "is out of reach" in r.output and "the target would take" in r.output
    # plan check still shows the design
    r = CliRunner().invoke(app, ["plan", "check", str(tmp_path / "plan.yaml")], env={"COLUMNS": "300"})
    assert "precision output_tokens_per_s +-1.0%" in r.output

def test_the_sweep_end_says_what_it_could_detect_and_warns_when_the_precision_was_not_reached():
    plan = Plan.model_validate(_plan_dict(precision={"half_width": 0.02, "loads": ["c=32"]}))
    plan = plan.model_copy(update={"replicates": 3, "repeats": 3})
    con = connect(":memory:")
    # a noisy sweep (boot SD 8 %): +-2 % is not reached; the candidate is 30 % slower
    _history(con, plan, boots=3, windows=3, sd={0: (0.08, 0.02), 1: (0.08, 0.02)}, sweep_id="noisy",
             effect={1: -0.3})
    rows = sweep_ab_rows(con, plan, "noisy")
    assert {(r["workload"], r["load_value"]) for r in rows} == {("chat", 4.0), ("chat", 32.0)}
    lines = ab_lines(rows)
    assert all(re.search(r"detectable at this design \(3 vs 3 boots\): -\d+\.\d%/\+\d+\.\d%", x) for x in lines)
    # the plain Welch interval on boot means beside the product's (per cell, nothing borrowed)
    # (in the metric's unit: a plain difference interval on 2-3 boots can reach below minus the baseline's mean)
    assert all(re.search(r"; Welch on boot means: difference \[[-+][\d.e+]+, [-+][\d.e+]+\] tokens/s", x)
               for x in lines), lines  # with its unit (found by a fresh user)
    # the interval is the row's Welch interval (stats.verdict.ABRecord.welch_ci_*), not a percentage of the mean
    r0 = rows[0]
    assert f"[{r0['welch_ci_low']:+.4g}, {r0['welch_ci_high']:+.4g}]" in lines[0] and "%]" not in lines[0].split("Welch")[1]
    assert any("worse" in x for x in lines)
    (w,) = precision_warnings(plan, rows)  # only c=32 is in the precision
    assert w.startswith("precision not reached: output_tokens_per_s at chat c=32")
    assert "the plan asks +-2.0%" in w and "it would take" in w
    # a quiet sweep (boot SD 0.2 %; its own warehouse: the noisy sweep would be its history) reaches +-2 %
    con.close()
    con = connect(":memory:")
    _history(con, plan, boots=3, windows=3, sd={0: (0.002, 0.001), 1: (0.002, 0.001)}, sweep_id="quiet")
    assert precision_warnings(plan, sweep_ab_rows(con, plan, "quiet")) == []
    # no precision, no warning (the A/B lines still say what it could detect)
    q = Plan.model_validate({k: v for k, v in _plan_dict().items() if k != "precision"})
    assert precision_warnings(q, rows) == []
    # a boot the quality gate left out is named on its cell's line
    st = synthetic_trial(sweep_id="quiet", config_key=plan._round(0)[1].config_key, replicate=9,
                         runtime_name="synthetic", loads=(("concurrency", 32.0),), quality_verdict="fail")
    _insert(con, st)
    assert all("left out (quality gate or status): 1 candidate boot" in x
               for x in ab_lines(sweep_ab_rows(con, plan, "quiet")))
    con.close()


def _auto_plan() -> Plan:
    """The precision plan of this file as ``replicates: auto`` (3 windows per boot, the A/B at c=32, 8 boots)."""
    d = _plan_dict(replicates="auto", repeats=3, ab={"metrics": ["output_tokens_per_s"], "loads": ["c=32"],
                                                     "budget": {"boots": 8}})
    del d["precision"]
    return Plan.model_validate(d)


# -- the sequential rule's history ---------------------------------------------------------------------------------
def test_ab_priors_come_from_the_noise_model_of_both_configs(tmp_path):
    from tunelab.flows.ab_auto import ab_cells, ab_priors

    plan = _auto_plan()
    db = tmp_path / "w.duckdb"
    assert ab_priors(plan, db) == {}  # no warehouse: no history
    con = connect(db)
    _history(con, plan, boots=5, windows=3, sd={0: (0.06, 0.03), 1: (0.06, 0.03)})
    nm = noise_model(con, "output_tokens_per_s")
    con.close()
    nm = nm[nm.load_value == 32.0]
    (cell,) = ab_cells(plan)
    sd, df = ab_priors(plan, db)[cell]
    want = (nm.df_boot * (nm.var_boot + nm.var_window / 3)).sum() / nm.df_boot.sum()
    assert df == 8 and sd == pytest.approx(math.sqrt(want))


def test_run_auto_ab_passes_the_prior_to_the_sequential_rule(monkeypatch, tmp_path):
    import tunelab.designs.sequential_ab as A

    seen = []

    real = A.sequential_ab

    def fake(b, c, **kw):
        seen.append(kw)
        return real(b, c, **kw)

    monkeypatch.setattr(A, "sequential_ab", fake)
    d = _plan_dict(replicates="auto", repeats=2, ab={"metrics": ["output_tokens_per_s"], "loads": ["c=32"],
                                                     "budget": {"boots": 4}})
    del d["precision"]
    plan = Plan.model_validate(d)
    (cell,) = A.ab_cells(plan)
    run = _FakeRun(plan, tmp_path)
    import logging

    out = run.run_design(A.SequentialAB(plan, logging.getLogger("t"), priors={cell: (0.07, 8.0)}))
    assert out.pairs == 2 and seen and all(kw["prior_sd"] == 0.07 and kw["prior_df"] == 8.0 for kw in seen)
    assert "history sd 0.07 on 8 df" in out.verdicts[0]["method"]


class _FakeRun:
    """The sweep's trial runner, reduced to its one loop (``flows.sweep._SweepTrials.run_design``) over jobs in plan
    order, with a synthetic bundle per trial."""

    def run_design(self, design):
        from tunelab.designs import TrialResult

        done, k = [], 0
        while specs := design.next_trials(done):
            for spec in specs:
                job = self.jobs[k]
                assert job.trial == spec.trial
                self.run_one(job, ["dev"])
                done.append(TrialResult(spec, f"t{k}", self.statuses[k], self.bundles[k], gpu_minutes=1.0))
                k += 1
        return design.outcome

    def __init__(self, plan: Plan, bundle_dir: Path):
        from types import SimpleNamespace

        self.plan = plan
        self.bundle_dir = bundle_dir
        self.jobs = [SimpleNamespace(index=i, trial=t, need=1, pool="cpu") for i, t in enumerate(plan.trials())]
        self.bundles = [None] * len(self.jobs)
        self.statuses = [None] * len(self.jobs)
        self.timings = [{"slot_at": 0.0, "end_at": 60.0} for _ in self.jobs]
        self.rng = np.random.default_rng(3)
        self.on_skip = self.on_interrupt = self.usable = None

    def run_one(self, job, devices):
        from tunelab.core.bundle import write_bundle

        t = job.trial
        st = synthetic_trial(sweep_id="auto", config_key=t.config_key, replicate=t.replicate, runtime_name=t.runtime,
                             loads=(("concurrency", 32.0),), repeats=2, boot_sd_rel=0.03, rng=self.rng,
                             effect_rel=-0.5 if t.label.endswith("2048") else 0.0)
        d = self.bundle_dir / f"bundle-{job.index}"
        d.mkdir()
        self.bundles[job.index] = write_bundle(d, st.sweep, st.trial, st.tables)
        self.statuses[job.index] = {"status": "ok", "verdict": "pass"}


def test_aa_false_call_rate_holds_with_a_prior_estimated_from_history():
    """The prior is an estimate (the noise model's SD from a few boots of history), not the true SD: draw it per
    batch of streams as ab_priors would get it (chi-square on 8 df), run the A/A streams with it, and the
    false-call rate over all batches stays at most alpha (+ 3 simulation SEs)."""
    from tunelab.stats.simulate import sequential_rule, simulate_pairs

    sd, df, batches, per = 0.08, 8.0, 100, 200
    rng = np.random.default_rng(11)
    called = too_small = 0
    for k in range(batches):
        est = sd * math.sqrt(rng.chisquare(df) / df)
        b, c = simulate_pairs(effect_rel=0.0, sd_boot_log=sd, n_pairs=20, streams=per, seed=100 + k)
        called += int(sequential_rule(b, c, alpha=0.05, prior_sd=est, prior_df=df).called.sum())
        if k < 20:  # the same streams with a history SD a third of the truth: the rate the test would catch
            too_small += int(sequential_rule(b, c, alpha=0.05, prior_sd=est / 3, prior_df=df).called.sum())
    n = batches * per
    assert called / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n)  # simulated: 1.1 %
    assert too_small / (20 * per) > 0.10  # simulated: about 21 %


# -- SLA-search windows are not noise --------------------------------------------------------------------------------
def _sla_boot(con, plan: Plan, i: int, *, sweep_id: str, replicate: int, rng) -> None:
    """A trusted boot of config i whose every window is an SLA-search window (019) far off the plan's values."""
    t = plan._round(0)[i]
    st = synthetic_trial(sweep_id=sweep_id, config_key=t.config_key, replicate=replicate, runtime_name=t.runtime,
                         config_label=t.label, workloads=("chat",), loads=(("concurrency", 4.0), ("concurrency", 32.0)),
                         repeats=3, effect_rel=-0.8, repeat_sd_rel=0.3, requests_per_repeat=10, rng=rng)
    st.tables["measurements"]["sla_search_window"] = True
    _insert(con, st)


def test_sla_search_windows_do_not_feed_the_design_or_its_history_count():
    plan = Plan.model_validate(_plan_dict(precision={"half_width": 0.1, "loads": ["c=32"]}))
    con = connect(":memory:")
    _history(con, plan, boots=4, windows=3, sd={0: (0.03, 0.02), 1: (0.03, 0.02)})
    clean = design_for_plan(plan, con)
    rng = np.random.default_rng(7)
    for i in (0, 1):  # one overloaded boot per config, each in its own sweep: only SLA-search windows
        _sla_boot(con, plan, i, sweep_id=f"sla{i}", replicate=10, rng=rng)
    # a trusted boot of config 0 with no window at the precision's cell (c=4 only): not behind the design either
    t0 = plan._round(0)[0]
    _insert(con, synthetic_trial(sweep_id="c4only", config_key=t0.config_key, replicate=20, runtime_name=t0.runtime,
                                 workloads=("chat",), loads=(("concurrency", 4.0),), repeats=3, rng=rng))
    nm = noise_model(con, "output_tokens_per_s")
    assert set(nm[nm.load_value == 32.0].boots) == {4}
    d = design_for_plan(plan, con)
    assert [(c.var_boot, c.var_window, c.boots) for c in d.cells] == [
        (c.var_boot, c.var_window, c.boots) for c in clean.cells]
    assert (d.design.boots_per_config, d.design.windows_per_boot) == (clean.design.boots_per_config,
                                                                      clean.design.windows_per_boot)
    assert (d.history_boots, d.history_sweeps) == (8, 1)
    assert "from the noise model of 8 boots in 1 sweep of trusted history" in d.lines()[0]
    con.close()


def test_ab_priors_leave_sla_search_windows_out(tmp_path):
    from tunelab.flows.ab_auto import ab_cells, ab_priors

    plan = _auto_plan()
    db = tmp_path / "w.duckdb"
    con = connect(db)
    _history(con, plan, boots=3, windows=3, sd={0: (0.04, 0.02), 1: (0.04, 0.02)})
    con.close()
    (cell,) = ab_cells(plan)
    before = ab_priors(plan, db)[cell]
    con = connect(db)
    rng = np.random.default_rng(3)
    for i in (0, 1):
        _sla_boot(con, plan, i, sweep_id="sla", replicate=10, rng=rng)
    con.close()
    assert ab_priors(plan, db)[cell] == pytest.approx(before)


def test_a_sweep_that_decided_nothing_on_a_busy_machine_says_so_and_names_the_load():
    """Issue 29 item 20: under load every demo cell read "no significant change" (MDE -92 %/+1,151 %). The A/B ends
    with a line that says the machine was too busy, naming the other processes' CPU share over the windows; it is
    silent when a cell was decided or when the windows saw an idle machine."""
    import duckdb

    from tunelab.reports.design_plan import busy_line

    con = duckdb.connect()  # the two columns of each table that the line reads
    con.execute("CREATE TABLE trials AS SELECT * FROM (VALUES ('s1/a/r0', 's1'), ('s1/b/r0', 's1'), ('s2/a/r0', 's2'))"
                " t(trial_id, sweep_id)")
    con.execute("CREATE TABLE measurements AS SELECT * FROM (VALUES ('s1/a/r0', 0.7), ('s1/b/r0', 0.5), "
                "('s2/a/r0', 0.05)) m(trial_id, host_other_cpu_frac)")
    undecided = [{"verdict": "no_significant_change", "mde_rel": 11.51}, {"verdict": "inconclusive", "mde_rel": None}]
    line = busy_line(con, "s1", undecided, "load now 9.0 on 2 cores: expect longer")
    assert line is not None and "too busy to decide" in line and "60% of the CPU" in line, line
    assert "2 measured windows" in line and "-92.0%/+1151.0%" in line and "load now 9.0 on 2 cores" in line
    decided = undecided + [{"verdict": "worse", "mde_rel": 0.3}]
    assert busy_line(con, "s1", decided) is None
    assert busy_line(con, "s2", undecided) is None  # an idle machine: the design was too small, not the box busy
    assert busy_line(con, "s1", []) is None
