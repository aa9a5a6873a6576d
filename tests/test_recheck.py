"""`tunelab recheck` (tunelab/flows/recheck.py): stored trials re-judged with today's quality rules and diagnosis.

The case is the one that made the command: on an H200 a server with one API-server process delivered tokens late
from its frontend (client mean ITL 26.2 ms against vLLM's engine-side 9.27 ms) while the client was healthy; the
rule of that day failed the trial (server_client_itl_agree), today's attributes the gap to the server
(server_frontend_lag, warn). The trial rows here are synthetic (``warehouse.synthetic``) with those figures put in;
the rules, the warehouse, the bundles and the loader are the real code.
"""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import pandas as pd
import pytest
import yaml

from tunelab.core.bundle import read_bundle, verify_bundle, write_bundle
from tunelab.flows.recheck import recheck
from tunelab.tasks.quality import validate_trial
from tunelab.warehouse.loader import load_bundle, load_pending
from tunelab.warehouse.synthetic import synthetic_trial

CLIENT_ITL_S, ENGINE_ITL_S = 0.0262, 0.00927  # the H200 window (default config, tiny prompts, c=256)


def _trial(sweep_id: str, quality: dict | None = None, *, client_bound: bool = False):
    st = synthetic_trial(sweep_id=sweep_id, config_key="cfg1", requests_per_repeat=8, repeats=2,
                         quality_verdict="fail")
    m = st.tables["measurements"]
    m["tpot_p50_s"] = m["tpot_mean_s"]
    m["itl_mean_s"] = CLIENT_ITL_S
    st.tables["requests"]["itl_mean_s"] = CLIENT_ITL_S  # the agree check reads every request of the window
    m["achieved_concurrency"] = m["load_value"]
    m["client_cpu_frac"] = 0.07
    m["client_bound"] = client_bound
    m["same_read_itl_frac"] = 0.0
    m["loop_lag_p99_s"] = 0.0011
    key = m[["trial_id", "workload", "load_kind", "load_value", "repeat"]]
    st.tables["server_metrics"] = key.assign(metric="server_itl", kind="histogram", value=ENGINE_ITL_S)
    # the judgement of the day the trial ran: a failed agreement check (what the old rule said)
    st.tables["quality_checks"] = pd.DataFrame([{
        "trial_id": st.trial["trial_id"], "suite": "server_vs_client", "expectation": "server_client_itl_agree",
        "success": False, "severity": "fail", "observed": "client 0.0262 s vs server 0.00927 s",
        "threshold": "<= max(0.5 x server, 0.001 s)", "detail": None}])
    st.sweep["plan_yaml"] = yaml.safe_dump({"name": "h200-like", "quality": quality or {}})
    return st


def _load(tmp_path, *trials):
    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    paths = [write_bundle(results, st.sweep, st.trial, st.tables) for st in trials]
    for p in paths:
        assert load_bundle(db, p).status == "loaded"
    return db, results, paths


def _rows(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def test_recheck_replaces_an_old_verdict_in_the_warehouse_and_the_bundle(tmp_path):
    st = _trial("sw1")
    db, results, (path,) = _load(tmp_path, st)
    tid = st.trial["trial_id"]
    expected = validate_trial({**read_bundle(path), "trial": None}, {**st.trial, "status": "ok"}).verdict
    assert expected == "warn"  # today's rule: the gap is the server's frontend, the client was healthy

    rows = recheck(db)
    assert [(r.trial_id, r.old_verdict, r.new_verdict) for r in rows] == [(tid, "fail", "warn")]
    assert rows[0].old_failed == ["server_client_itl_agree"]
    assert "server_frontend_lag" in rows[0].new_failed and "server_client_itl_agree" not in rows[0].new_failed
    assert rows[0].bundle == "updated"
    assert _rows(db, "SELECT quality_verdict FROM trials WHERE trial_id = ?", [tid]) == [("warn",)]
    failed = {r[0] for r in _rows(db, "SELECT expectation FROM quality_checks WHERE trial_id = ? AND NOT success",
                                  [tid])}
    assert failed == set(rows[0].new_failed)
    # the bundle holds the same judgement, and the loader sees it as already loaded
    b = read_bundle(path)
    assert b["trial"].at[0, "quality_verdict"] == "warn"
    assert set(b["quality_checks"].loc[b["quality_checks"]["success"] == False, "expectation"]) == failed  # noqa: E712
    assert _rows(db, "SELECT sha256 FROM loaded_bundles WHERE bundle_id = ?", [tid]) == [
        (verify_bundle(path)["manifest_sha256"],)]
    assert [r.status for r in load_pending(db, results) if r.status != "skipped"] == []
    # a second recheck changes nothing
    again = recheck(db)
    assert [r.changed for r in again] == [False] and again[0].bundle == "unchanged"


def test_recheck_uses_the_plans_own_thresholds(tmp_path):
    # a plan that turned the attribution off keeps the strict agreement check: fail stays fail
    strict, lenient = _trial("strict", {"attribute_frontend_lag": False}), _trial("lenient")
    db, _, _ = _load(tmp_path, strict, lenient)
    by_sweep = {r.sweep_id: r for r in recheck(db)}
    assert by_sweep["strict"].new_verdict == "fail"
    assert by_sweep["strict"].new_failed == by_sweep["strict"].old_failed == ["server_client_itl_agree"]
    assert by_sweep["lenient"].new_verdict == "warn"


def test_a_bound_client_still_fails(tmp_path):
    st = _trial("sw1", client_bound=True)
    db, _, _ = _load(tmp_path, st)
    (row,) = recheck(db)
    assert row.new_verdict == "fail" and "server_client_itl_agree" in row.new_failed


def test_dry_run_writes_nothing_and_a_missing_bundle_updates_the_warehouse_alone(tmp_path):
    st = _trial("sw1")
    db, _, (path,) = _load(tmp_path, st)
    before = _rows(db, "SELECT * FROM quality_checks ORDER BY expectation")
    (row,) = recheck(db, dry_run=True)
    assert row.changed and row.new_verdict == "warn"
    assert _rows(db, "SELECT * FROM quality_checks ORDER BY expectation") == before
    assert _rows(db, "SELECT quality_verdict FROM trials") == [("fail",)]
    # a warehouse whose bundles are gone (rebuilt from exported Parquet) is updated in place
    import shutil
    shutil.rmtree(path)
    (row,) = recheck(db)
    assert row.bundle == "absent" and _rows(db, "SELECT quality_verdict FROM trials") == [("warn",)]


def test_unknown_sweep_is_refused_by_name(tmp_path):
    db, _, _ = _load(tmp_path, _trial("sw1"))
    with pytest.raises(ValueError, match="--sweep nope: not in .*sw1"):
        recheck(db, ["nope"])
    assert _rows(db, "SELECT quality_verdict FROM trials") == [("fail",)]


def test_cli_recheck_prints_the_change_and_exits_2_on_a_bad_sweep(tmp_path):
    db, _, _ = _load(tmp_path, _trial("sw1"))
    cmd = [sys.executable, "-m", "tunelab.cli", "recheck", "--db", str(db)]
    bad = subprocess.run(cmd + ["--sweep", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--sweep nope" in bad.stdout + bad.stderr
    dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "verdict fail -> warn" in dry.stdout and "1 changed (dry run: nothing written)" in dry.stdout
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0 and "bundle updated" in run.stdout
    assert _rows(db, "SELECT quality_verdict FROM trials") == [("warn",)]


def test_a_search_boot_the_old_rule_left_out_gets_its_value_and_can_become_the_best(tmp_path):
    # the H200 search: the default's boot was left out (state fail, no value) by the old agreement rule
    objective = {"metric": "output_tokens_per_s", "direction": "maximize", "workload": "chat",
                 "load": "c=4", "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "e2el_s": None}, "slo_percentile": 90}
    st = _trial("search1")
    m = st.tables["measurements"]
    m["ttft_p90_s"], m["tpot_p90_s"] = [0.712, 1.073], [0.0249, 0.0227]  # the H200 default's two windows
    st.trial.update(search_role="default", search_state="fail", search_value=None, search_slo_violation=None)
    st.sweep.update(search_objective=json.dumps(objective),
                    search_best_config_key=None, search_boots=1)
    db, _, (path,) = _load(tmp_path, st)

    (row,) = recheck(db)
    assert (row.old_search_state, row.new_search_state) == ("fail", "complete")
    # the search's own rule: mean of the windows; SLO met on average (-29 % and +7 % over TTFT 1 s)
    assert row.new_search_value == pytest.approx(float(m["output_tokens_per_s"].mean()))
    (state, value, violation), = _rows(db, "SELECT search_state, search_value, search_slo_violation FROM trials")
    assert state == "complete" and value == pytest.approx(row.new_search_value)
    assert violation == pytest.approx(((0.712 - 1) + (1.073 - 1)) / 2)
    # the only complete boot is now the best, in the warehouse and in the sweep row of the bundle
    assert _rows(db, "SELECT search_best_config_key FROM sweeps") == [(st.trial["config_key"],)]
    assert read_bundle(path)["sweep"].at[0, "search_best_config_key"] == st.trial["config_key"]
    assert read_bundle(path)["trial"].at[0, "search_state"] == "complete"
    assert _rows(db, "SELECT sha256 FROM loaded_bundles") == [(verify_bundle(path)["manifest_sha256"],)]


def test_findings_the_rerun_cannot_judge_keep_their_stored_rows(tmp_path):
    # an exported warehouse whose requests.chunk_offsets_s were nulled to keep it small: the stored
    # prefill_interference judgement (made when the offsets were there) and the gpu_floor rows survive a recheck
    st = _trial("sw1")
    key = st.tables["measurements"][["trial_id", "workload", "load_kind", "load_value", "repeat"]]
    stored = pd.concat([key.assign(bottleneck="prefill_interference", flagged=True, metric="itl_p99_over_p50",
                                   value=7.5, threshold=3.0, summary="stored when the offsets were there"),
                        key.assign(bottleneck="gpu_floor", flagged=False, metric="tpot_over_floor", value=12.1,
                                   threshold=1.25, summary="floor 0.46 ms")], ignore_index=True)
    st.tables["window_diagnoses"] = stored.assign(evidence="{}", remedy="", sources="")
    db, _, _ = _load(tmp_path, st)
    (row,) = recheck(db)
    assert row.new_flagged == {"api_server": 2, "prefill_interference": 2}
    got = _rows(db, "SELECT bottleneck, flagged, summary FROM window_diagnoses WHERE bottleneck IN "
                    "('prefill_interference', 'gpu_floor') ORDER BY 1, repeat")
    assert got == [("gpu_floor", False, "floor 0.46 ms")] * 2 + [
        ("prefill_interference", True, "stored when the offsets were there")] * 2
    # every check still has one row per window (nothing doubled, nothing lost)
    assert _rows(db, "SELECT count(*), count(DISTINCT (workload, load_kind, load_value, repeat, bottleneck)) "
                     "FROM window_diagnoses") == [(10, 10)]


def test_rows_with_new_evidence_but_the_same_judgement_are_rewritten(tmp_path):
    # the stored api_server rows already flagged, by a rule of the day whose summary had no ITL ratio: the judgement
    # is the same today (not "changed"), but the rows get today's figures
    st = _trial("sw1")
    key = st.tables["measurements"][["trial_id", "workload", "load_kind", "load_value", "repeat"]]
    st.tables["window_diagnoses"] = key.assign(
        bottleneck="api_server", flagged=True, metric="api_server_busiest_thread", value=0.95, threshold=0.9,
        summary="old text", evidence="{}", remedy="", sources="")
    today = validate_trial({k: v for k, v in st.tables.items() if k != "quality_checks"}, {**st.trial, "status": "ok"})
    st.tables["quality_checks"], st.trial["quality_verdict"] = today.checks, today.verdict  # today's, already
    db, _, (path,) = _load(tmp_path, st)
    (row,) = recheck(db)
    assert not row.changed  # same verdict, same failed checks, same flagged windows
    summaries = {r[0] for r in _rows(db, "SELECT summary FROM window_diagnoses WHERE bottleneck = 'api_server'")}
    assert summaries and all("the engine's" in x for x in summaries)  # today's text (client ITL vs the engine's)
    assert row.bundle == "updated"
    assert all("the engine's" in x for x in read_bundle(path)["window_diagnoses"].query(
        "bottleneck == 'api_server'")["summary"])


def test_a_bundle_that_cannot_be_written_leaves_its_trial_as_it_was_and_the_others_go_on(tmp_path, monkeypatch):
    import tunelab.flows.recheck as rc

    a, b = _trial("swA"), _trial("swB")
    db, results, (pa, pb) = _load(tmp_path, a, b)
    real = rc.update_bundle_table

    def refuse_a(path, name, df):  # FAULT INJECTION: swA's bundle is not writable (read-only disk, gone, ...)
        if str(path) == str(pa):
            raise OSError(30, "Read-only file system", str(path))
        return real(path, name, df)
    monkeypatch.setattr(rc, "update_bundle_table", refuse_a)
    by = {r.sweep_id: r for r in recheck(db)}
    assert by["swA"].bundle.startswith("not updated (OSError") and by["swB"].bundle == "updated"
    verdicts = dict(_rows(db, "SELECT sweep_id, quality_verdict FROM trials"))
    assert verdicts == {"swA": "fail", "swB": "warn"}  # swA as it was, in the warehouse ...
    assert read_bundle(pa)["trial"].at[0, "quality_verdict"] == "fail"  # ... and in its bundle
    # so the loader has nothing to bring back, and a later recheck (bundle writable again) finishes the job
    assert [r.status for r in load_pending(db, results) if r.status != "skipped"] == []
    monkeypatch.setattr(rc, "update_bundle_table", real)
    assert {r.sweep_id: r.new_verdict for r in recheck(db) if r.changed} == {"swA": "warn"}
    assert dict(_rows(db, "SELECT sweep_id, quality_verdict FROM trials")) == {"swA": "warn", "swB": "warn"}


def test_cli_bad_warehouse_file_unwritable_bundle_and_invalid_plan_thresholds(tmp_path):
    cmd = [sys.executable, "-m", "tunelab.cli", "recheck"]
    text = tmp_path / "notes.duckdb"
    text.write_text("not a database\n")
    bad = subprocess.run(cmd + ["--db", str(text)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a tunelab warehouse" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr and text.read_text() == "not a database\n"
    # a bundle path that is no bundle: exit 1, the trial named, left as it was
    st = _trial("sw1", {"attribute_frontend_lagg": True})  # a typo in the stored plan's quality section
    db, _, _ = _load(tmp_path, st)
    empty = tmp_path / "empty"
    empty.mkdir()
    con = duckdb.connect(str(db))
    con.execute("UPDATE loaded_bundles SET bundle_path = ?", [str(empty)])
    con.close()
    run = subprocess.run(cmd + ["--db", str(db)], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "bundle not updated (BundleError" in run.stdout and "1 left as they were" in run.stdout
    assert "quality: section is not valid today" in run.stderr and "default quality thresholds used" in run.stderr
    assert _rows(db, "SELECT quality_verdict FROM trials") == [("fail",)]
