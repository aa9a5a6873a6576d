"""Release series from the warehouse: anchor adjustment, ordering, change-point alarms and the event's gate."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest

from tunelab.warehouse.migrate import connect

SWEEPS = 12
DROP_AT = 7  # sweeps 7.. run vLLM 0.31.0, 10 % slower than 0.30.0


def _series_warehouse(path, results, drop: float = -0.10, boot_sd: float = 0.005, anchor_key: str = "anc"):
    """``cfg`` (0.30.0, then 0.31.0 from sweep ``DROP_AT``) and the anchor ``anc`` (pinned 0.29.0) in every sweep;
    each sweep moves both by a shared factor of up to +-12 % (the machine), which only the anchor removes."""
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    rng = np.random.default_rng(5)
    shared = rng.uniform(-0.12, 0.12, size=SWEEPS)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for s in range(SWEEPS):
        version = "0.31.0" if s >= DROP_AT else "0.30.0"
        for key, eff, ver in (("cfg", (1 + shared[s]) * (1 + (drop if s >= DROP_AT else 0.0)) - 1, version),
                              (anchor_key, shared[s], "0.29.0")):
            for rep in range(2):
                t = synthetic_trial(sweep_id=f"s{s:02d}", config_key=key, replicate=rep, vllm_version=ver,
                                    runtime_name=f"rt-{ver}", effect_rel=eff, boot_sd_rel=boot_sd,
                                    repeat_sd_rel=0.002, started_at=t0 + dt.timedelta(days=s, minutes=rep), rng=rng)
                write_bundle(results, t.sweep, t.trial, t.tables)
    load_pending(path, results)
    return shared


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    d = tmp_path_factory.mktemp("series")
    shared = _series_warehouse(d / "wh.duckdb", d / "results")
    con = connect(d / "wh.duckdb", read_only=True)
    yield con, shared
    con.close()


def test_series_is_one_point_per_sweep_in_time_order_and_anchor_adjusted(wh):
    from tunelab.warehouse.series import release_series

    con, shared = wh
    raw = release_series(con, "output_tokens_per_s", config_key="cfg")
    adj = release_series(con, "output_tokens_per_s", config_key="cfg", anchor_key="anc")
    assert list(raw["sweep_id"]) == [f"s{s:02d}" for s in range(SWEEPS)]
    assert raw["boots"].eq(2).all() and not raw["anchored"].any() and adj["anchored"].all()
    assert "anc" not in set(release_series(con, "output_tokens_per_s", anchor_key="anc")["config_key"])
    # adjusted = log(cfg) - log(anchor) of the same sweep: the shared factor cancels
    np.testing.assert_allclose(adj["adjusted_log_value"], adj["log_value"] - adj["anchor_log_value"])
    before = adj["series_log_value"].iloc[:DROP_AT]
    assert before.std() < 0.3 * raw["series_log_value"].iloc[:DROP_AT].std()
    assert math.expm1(adj["series_log_value"].iloc[DROP_AT:].mean() - before.mean()) == pytest.approx(-0.10, abs=0.02)


def test_release_order_and_errors(wh):
    from tunelab.warehouse.series import release_series

    con, _ = wh
    rel = release_series(con, "ttft_p50_s", config_key="cfg", order="release")
    assert list(rel["vllm_version"]) == ["0.30.0"] * DROP_AT + ["0.31.0"] * (SWEEPS - DROP_AT)
    with pytest.raises(ValueError, match="order"):
        release_series(con, "output_tokens_per_s", order="alphabetical")
    with pytest.raises(ValueError, match="not comparable"):
        release_series(con, "no_such_metric")


def test_anchored_series_alarms_at_the_release_that_moved_with_its_size(wh):
    from tunelab.warehouse.series import release_series, series_alarms

    con, _ = wh
    adj = series_alarms(release_series(con, "output_tokens_per_s", config_key="cfg", anchor_key="anc"))
    assert len(adj) == 1, adj
    a = adj.iloc[0]
    assert a["sweep_id"] == f"s{DROP_AT:02d}" and a["vllm_version"] == "0.31.0" and a["prev_vllm_version"] == "0.30.0"
    assert a["direction"] == "worse" and a["p_value"] <= 0.05
    assert a["rel_ci_low"] <= -0.10 <= a["rel_ci_high"] and a["rel_ci_high"] < 0
    # latency moves the other way and is also worse
    lat = series_alarms(release_series(con, "ttft_p50_s", config_key="cfg", anchor_key="anc"))
    assert list(lat["direction"]) == ["worse"] and lat.iloc[0]["rel_change"] > 0
    # the anchor alone has no change
    assert series_alarms(release_series(con, "output_tokens_per_s", config_key="anc")).empty


def test_confirm_by_alarm_gates_rule_regressions(wh):
    from tunelab.warehouse.series import confirm_by_alarm

    con, _ = wh
    facts = con.execute("SELECT DISTINCT vllm_public_version, vllm_version_key, gpu_name FROM trial_facts").fetchdf()
    key_of = dict(zip(facts["vllm_public_version"], facts["vllm_version_key"]))
    cell = {"config_key": "cfg", "gpu_name": facts["gpu_name"].iloc[0], "workload": "chat",
            "load_kind": "concurrency", "load_value": 4.0}
    reg = pd.DataFrame([
        # a rule regression starting at 0.30.0: the change point lies later (0.31.0) -> not confirmed
        {**cell, "vllm_version_key": key_of["0.30.0"], "status": "regression", "regression_start": True},
        # a rule regression at 0.31.0, where the anchored series has a worse change point -> stays
        {**cell, "vllm_version_key": key_of["0.31.0"], "status": "regression", "regression_start": True},
        {**cell, "vllm_version_key": key_of["0.31.0"], "status": "ok", "regression_start": False},
        # a series that is not in the warehouse: too short for the test, the rule decides alone
        {**cell, "config_key": "other", "vllm_version_key": key_of["0.31.0"], "status": "regression",
         "regression_start": True},
    ])
    out = confirm_by_alarm(con, reg, "output_tokens_per_s", anchor_key="anc")
    assert list(out["status"]) == ["regression_no_alarm", "regression", "ok", "regression"]
    assert out["alarm"].iloc[0] == "no change point" and out["alarm"].iloc[1].startswith("change point p=")
    assert out["alarm"].iloc[3].startswith("series too short") and out["alarm"].iloc[2] == ""
    # without the anchor the shared +-12 % sweep factor hides the 10 % step: the gate does not confirm it
    assert confirm_by_alarm(con, reg, "output_tokens_per_s")["status"].iloc[1] == "regression_no_alarm"


def test_series_markdown_marks_the_change_point_row(wh):
    from tunelab.reports.series import CHANGE_MARK, series_report

    con, _ = wh
    series, alarms, md = series_report(con, "output_tokens_per_s", config_key="cfg", anchor_key="anc")
    rows = [ln for ln in md.splitlines() if ln.startswith("| s")]
    assert len(rows) == SWEEPS
    marked = [ln for ln in rows if CHANGE_MARK in ln]
    assert len(marked) == 1 and marked[0].startswith(f"| s{DROP_AT:02d} ") and "worse" in marked[0]
    assert "anchored on config `anc`" in md and "vs anchor" in md
    # unanchored: said so, and the anchor's column is absent
    _, _, md2 = series_report(con, "output_tokens_per_s", config_key="cfg")
    assert "not anchored" in md2 and "vs anchor" not in md2


def test_an_anchor_runtime_the_anchor_never_ran_on_is_an_error_naming_its_runtimes(wh):
    from tunelab.reports.series import series_report

    con, _ = wh
    with pytest.raises(ValueError, match="--anchor-runtime 'nosuch': no ok trial of the anchor anc ran on that "
                                         "runtime; it ran on: rt-0.29.0"):
        series_report(con, "output_tokens_per_s", config_key="cfg", anchor_key="anc", anchor_runtime="nosuch")
    series, _, _ = series_report(con, "output_tokens_per_s", config_key="cfg", anchor_key="anc",
                                 anchor_runtime="rt-0.29.0")
    assert series["adjusted_log_value"].notna().all()


def test_series_names_what_exists_for_a_key_anchor_or_workload_that_matches_nothing(wh):
    """Found by a fresh user: ``--anchor bogus`` printed "anchored on config bogus" over rows that each said "no
    anchor", and ``--key`` with a label gave "no points". A label is accepted as ``compare`` accepts it."""
    from tunelab.reports.series import series_report

    con, _ = wh
    for kw, option in (({"config_key": "nosuch"}, "--key"), ({"anchor_key": "bogus"}, "--anchor")):
        with pytest.raises(ValueError, match=f"{option} '.+': no ok trial has that config key or label; configs: .*cfg"):
            series_report(con, "output_tokens_per_s", **kw)
    with pytest.raises(ValueError, match="--workload 'nosuch': no measurement of that workload; workloads: chat"):
        series_report(con, "output_tokens_per_s", workload="nosuch")


def test_series_accepts_a_config_label_and_refuses_one_that_names_two_keys(tmp_path):
    from tunelab.core.bundle import write_bundle
    from tunelab.reports.series import series_report
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    rng = np.random.default_rng(1)
    for s, (key, label) in enumerate((("k1", "pinned"), ("k2", "tonight"), ("k3", "tonight"))):
        t = synthetic_trial(sweep_id=f"s{s}", config_key=key, config_label=label, rng=rng)
        write_bundle(tmp_path / "r", t.sweep, t.trial, t.tables)
    load_pending(tmp_path / "w.duckdb", tmp_path / "r")
    con = connect(tmp_path / "w.duckdb", read_only=True)
    try:
        by_label, _, md = series_report(con, "output_tokens_per_s", config_key="pinned")
        by_key, _, _ = series_report(con, "output_tokens_per_s", config_key="k1")
        # a key is matched ignoring case, as `compare --anchor` matches it (a key pasted in upper case)
        by_upper, _, _ = series_report(con, "output_tokens_per_s", config_key="K1")
        with pytest.raises(ValueError, match="--anchor 'tonight': the label names 2 config keys \\(k2, k3\\)"):
            series_report(con, "output_tokens_per_s", anchor_key="tonight")
    finally:
        con.close()
    assert len(by_label) == len(by_key) == len(by_upper) == 1 and set(by_label.config_key) == set(by_upper.config_key) == {"k1"}
    # the series is headed by the plan's label with its key (a fresh user saw keys only)
    assert "**pinned** (`k1`)" in md and list(by_label.config_label) == ["pinned"]


def test_series_cli_json_and_report_option(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    db = tmp_path / "wh.duckdb"
    _series_warehouse(db, tmp_path / "results")
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(repo))
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "series", "--key", "cfg", "--anchor", "anc",
                        "--db", str(db), "--json"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert len(doc["points"]) == SWEEPS and [a["sweep_id"] for a in doc["alarms"]] == [f"s{DROP_AT:02d}"]
    bad = subprocess.run([sys.executable, "-m", "tunelab.cli", "series", "--order", "alphabetical", "--db", str(db)],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "order" in bad.stderr
    rep = subprocess.run([sys.executable, "-m", "tunelab.cli", "report", "--db", str(db), "--series",
                          "output_tokens_per_s", "--anchor", "anc"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "Release series: output_tokens_per_s" in rep.stdout and "◆" in rep.stdout


def test_an_anchor_that_is_the_same_config_on_a_pinned_runtime(tmp_path):
    from tunelab.warehouse.series import release_series, series_alarms

    db = tmp_path / "wh.duckdb"
    _series_warehouse(db, tmp_path / "results", anchor_key="cfg")  # cfg on rt-0.29.0 is the anchor
    con = connect(db, read_only=True)
    try:
        s = release_series(con, "output_tokens_per_s", config_key="cfg", anchor_key="cfg", anchor_runtime="rt-0.29.0")
        assert len(s) == SWEEPS and s["anchor_boots"].eq(2).all() and set(s["vllm_version"]) == {"0.30.0", "0.31.0"}
        (a,) = series_alarms(s).itertuples(index=False)
        assert a.sweep_id == f"s{DROP_AT:02d}" and a.direction == "worse"
    finally:
        con.close()


def test_the_anchor_key_is_said_to_be_left_out_of_anchored_series_with_the_fix(wh, tmp_path):
    """Found by a new user: `tunelab series --key <the anchor's key>` said "no ok trials" although the key had
    them (anchored series leave the anchor out)."""
    from typer.testing import CliRunner

    from tunelab.cli import app
    from tunelab.reports.series import series_report

    con, _ = wh
    with pytest.raises(ValueError, match=r"--key 'anc' is the anchor: anchored series leave the anchor out.*"
                                         r"`--key anc --anchor none`"):
        series_report(con, config_key="anc", anchor_key="anc")
    with pytest.raises(ValueError, match=r"is the anchor on runtime rt-0\.29\.0.*it ran only on rt-0\.29\.0"):
        series_report(con, config_key="anc", anchor_key="anc", anchor_runtime="rt-0.29.0")
    assert len(series_report(con, config_key="anc")[0]) == SWEEPS  # --anchor none: its plain series
    # the same config on a pinned runtime as the anchor: its other runtimes are the series (no error)
    db = tmp_path / "pinned.duckdb"
    _series_warehouse(db, tmp_path / "results", anchor_key="cfg")
    s, _, _ = series_report(db, config_key="cfg", anchor_key="cfg", anchor_runtime="rt-0.29.0")
    assert len(s) == SWEEPS
    r = CliRunner().invoke(app, ["series", "--db", str(db), "--key", "cfg", "--anchor", "cfg"],
                           env={"COLUMNS": "200"})
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "is the anchor" in text and "--anchor none" in text and "no ok trials" not in text, text
