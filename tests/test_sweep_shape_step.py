"""The sweep runs the shape checks after validation (tunelab/tasks/quality/shape_checks.py, called by
flows/sweep.py): anchor_drift over the anchor's boots, windows_multimodal per config/cell/metric, as warn rows
of quality_checks in the bundles, shown in the sweep's quality lines."""

import datetime as dt
import logging

import numpy as np
import pandas as pd

from tunelab.core.bundle import read_bundle, write_bundle
from tunelab.core.quality_thresholds import RULES_VERSION
from tunelab.tasks.quality.shape_checks import SHAPE_SUITE, sweep_shape_step
from tunelab.warehouse.synthetic import synthetic_trial


def _bundles(tmp_path, *, drift, bimodal, rounds=5):
    rng = np.random.default_rng(3)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    out, statuses, i = [], [], 0
    for r in range(rounds):
        for rt, key in (("synthetic", "A"), ("pinned", "ANC")):
            eff = drift * r if key == "ANC" else 0.0
            st = synthetic_trial(sweep_id="sw", config_key=key, runtime_name=rt, replicate=r, effect_rel=eff,
                                 boot_sd_rel=0.002, repeat_sd_rel=0.002, repeats=8, rng=rng,
                                 started_at=t0 + dt.timedelta(minutes=10 * i))
            i += 1
            meas = st.tables["measurements"].copy()
            if bimodal and key == "A":  # lockstep phases: half the windows of every boot 30 % slower
                meas.loc[meas["repeat"] % 2 == 1, "ttft_p50_s"] *= 1.3
            trial = {**st.trial, "quality_verdict": "pass"}
            out.append(write_bundle(tmp_path / "results", st.sweep, trial, {**st.tables, "measurements": meas}))
            statuses.append({"trial_id": st.trial["trial_id"], "verdict": "pass"})
    return out, statuses


def _checks(bundles):
    q = pd.concat([read_bundle(b)["quality_checks"] for b in bundles if "quality_checks" in read_bundle(b)],
                  ignore_index=True)
    return q[q.suite == SHAPE_SUITE]


def test_shape_checks_flag_anchor_drift_and_two_mode_windows(tmp_path, caplog):
    bundles, statuses = _bundles(tmp_path, drift=0.05, bimodal=True)
    with caplog.at_level(logging.WARNING):
        sweep_shape_step(bundles, statuses, ("pinned", "ANC"), logging.getLogger("t"))
    q = _checks(bundles)
    assert set(q.severity) == {"warn"} and set(q.rule_version) == {RULES_VERSION}
    drift = q[(q.expectation == "anchor_drift") & (q.success == False)]  # noqa: E712
    assert len(drift) and drift.trial_id.str.contains("/pinned/ANC/").all()
    assert drift.detail.str.contains("anchor chat c=4 output_tokens_per_s").any()
    modes = q[(q.expectation == "windows_multimodal") & (q.success == False)]  # noqa: E712
    assert modes.detail.str.contains("ttft_p50_s").all() and len(modes)
    assert modes.trial_id.str.contains("/synthetic/A/").all() and "two modes" in modes.detail.iloc[0]
    assert {s["verdict"] for s in statuses} == {"warn"}
    assert {read_bundle(b)["trial"].iloc[0]["quality_verdict"] for b in bundles} == {"warn"}
    assert "sweep_shape/anchor_drift" in caplog.text and "sweep_shape/windows_multimodal" in caplog.text


def test_shape_checks_pass_a_steady_sweep_and_skip_drift_without_anchor(tmp_path):
    bundles, statuses = _bundles(tmp_path, drift=0.0, bimodal=False)
    sweep_shape_step(bundles, statuses, None, logging.getLogger("t"))
    q = _checks(bundles)
    assert "anchor_drift" not in set(q.expectation)
    assert (q.expectation == "windows_multimodal").any()
    assert {s["verdict"] for s in statuses} == {"pass"}


def test_the_sweep_calls_the_shape_step_after_validation():
    import inspect

    from tunelab.flows import sweep

    src = inspect.getsource(sweep._sweep)
    assert src.index("_validate_all(") < src.index("sweep_shape_step(") < src.index("load_task(")


def test_rule_version_4_lists_this_sessions_new_checks():
    from tunelab.core.quality_thresholds import RULE_VERSIONS, rule_version_label

    v4 = next(v for v in RULE_VERSIONS if v.version == 4)
    assert RULES_VERSION == RULE_VERSIONS[-1].version >= 5 and rule_version_label(RULES_VERSION) == f"v{RULES_VERSION}"
    names = " ".join(v4.code_changes)
    for check in ("cache_not_cold", "overloaded", "anchor_drift", "windows_multimodal"):
        assert check in names
    assert not v4.threshold_changes


def test_recheck_keeps_the_stored_shape_rows_and_their_warn():
    from tunelab.tasks.quality.catalogue import QualityResult
    from tunelab.tasks.quality.shape_checks import keep_shape_rows

    cols = ["trial_id", "suite", "expectation", "success", "severity", "observed", "threshold", "detail",
            "rule_version"]
    own = pd.DataFrame([["t", "requests", "no_errors", True, "fail", "0", "0", "", RULES_VERSION]], columns=cols)
    stored = pd.concat([own, pd.DataFrame([["t", SHAPE_SUITE, "windows_multimodal", False, "warn", "3.1", "2.4",
                                            "A chat c=4 ttft_p50_s: two modes", RULES_VERSION]], columns=cols)])
    res = keep_shape_rows(QualityResult("pass", own.assign(success=own.success.astype("boolean")), "pass"), stored)
    assert res.verdict == "warn" and list(res.checks.expectation) == ["no_errors", "windows_multimodal"]
    same = keep_shape_rows(QualityResult("pass", own, "pass"), own)
    assert same.verdict == "pass" and len(same.checks) == 1


def test_windows_multimodal_judges_each_boot_alone_so_boot_spread_is_not_two_modes(tmp_path):
    """Rule v5: two boots of one config 30 % apart, each with 8 steady windows: pooled (v4) the windows fall
    into modes by boot and were flagged; judged a boot at a time, neither is."""
    import numpy as np

    from tunelab.core.quality_thresholds import RULE_VERSIONS
    from tunelab.tasks.quality.sweep_shape import windows_multimodal

    rng = np.random.default_rng(3)
    rows = [{"group": f"A chat c=4 boot r{b}", "metric": "output_tokens_per_s", "value": level * (1 + 0.01 * z)}
            for b, level in enumerate((100.0, 130.0)) for z in rng.standard_normal(8)]
    per_boot = windows_multimodal(pd.DataFrame(rows))
    assert len(per_boot) == 2 and per_boot.success.all(), per_boot
    pooled = windows_multimodal(pd.DataFrame(rows).assign(group="A chat c=4"))
    assert not pooled.success.iloc[0]  # what v4 did: the boots' spread read as modes
    assert "each boot" in next(v for v in RULE_VERSIONS if v.version == 5).code_changes[0]



def test_the_run_says_which_shape_checks_ran_and_which_were_skipped_and_why(tmp_path, caplog):
    """3 anchor boots: anchor_drift needs 4, so it is skipped; the sweep's log says so (it was silent), and says
    windows_multimodal ran; without an anchor it says anchor_drift did not run and why."""
    bundles, statuses = _bundles(tmp_path / "a", drift=0.0, bimodal=False, rounds=3)
    with caplog.at_level(logging.INFO):
        sweep_shape_step(bundles, statuses, ("pinned", "ANC"), logging.getLogger("t"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shape check ")]
    drift = [x for x in lines if x.startswith("shape check anchor_drift:")]
    assert len(drift) == 1 and "ran on 0 cell x metric" in drift[0], lines
    assert "skipped on 2: 3 anchor boot(s), a trend needs 4" in drift[0]  # 1 cell x 2 metrics the synthetic has
    modes = [x for x in lines if x.startswith("shape check windows_multimodal:")]
    assert len(modes) == 1 and "ran on 12 boot x cell x metric (0 flagged)" in modes[0], lines  # 6 boots x 1 x 2
    caplog.clear()
    bundles, statuses = _bundles(tmp_path / "b", drift=0.0, bimodal=False, rounds=3)
    with caplog.at_level(logging.INFO):
        sweep_shape_step(bundles, statuses, None, logging.getLogger("t"))
    assert "shape check anchor_drift: not run (the plan has no anchor:)" in caplog.text


def test_the_report_says_which_shape_checks_ran(tmp_path):
    """The sweep report's Quality section carries the same lines, from the warehouse's rows."""
    from tunelab.reports.report import quality_summary, sweep_quality_markdown
    from tunelab.warehouse.loader import load_pending

    bundles, statuses = _bundles(tmp_path, drift=0.0, bimodal=False, rounds=3)
    sweep_shape_step(bundles, statuses, ("pinned", "ANC"), logging.getLogger("t"))
    load_pending(tmp_path / "w.duckdb", tmp_path / "results")
    q = quality_summary(tmp_path / "w.duckdb", "sw")
    md = sweep_quality_markdown(q)
    assert "shape check anchor_drift: ran on 0 cell x metric; skipped on 2: 3 anchor boot(s), a trend needs 4" in md
    assert "shape check windows_multimodal: ran on 12 boot x cell x metric (0 flagged)" in md


def test_plan_check_warns_when_the_anchor_gets_fewer_boots_than_anchor_drift_needs(tmp_path):
    from typer.testing import CliRunner

    from tunelab.cli import app

    def check(replicates):
        p = tmp_path / f"plan{replicates}.yaml"
        p.write_text(f"""
name: t
model: /models/tiny
runtimes: [cpu, new]
engine_args: {{max-model-len: 2048}}
workloads:
  - {{name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}}
concurrency: [1]
replicates: {replicates}
anchor: {{runtime: cpu, name: pinned, engine_args: {{max-model-len: 2048, max-num-seqs: 8}}}}
""")
        r = CliRunner().invoke(app, ["plan", "check", str(p)])
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split())

    out = check(3)
    assert "warning: anchor: the anchor gets 3 boot(s) in this sweep" in out
    assert "anchor_drift quality check needs 4 and will be skipped" in out and "replicates: 4 or more" in out
    assert "anchor_drift" not in check(4)
