"""Everyday use of the command line (issue 20): reading results and the interfaces people expect.

A synthetic warehouse (no server): an older sweep with two configs, a boot failure with a long reason and its
server log, and repeated measurement notes; a later sweep whose label ``cfg-a`` names another config key (one
more env var); and the latest sweep, cancelled before it measured anything. The commands run in-process
(typer's CliRunner) except ``compare``, which runs its Prefect flow in a subprocess.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "vllm_bench"
OLD, MIX, CANCELLED = "20260101T000000Z-syn-0001", "20260102T000000Z-syn-0002", "20260103T000000Z-syn-0003"
LONG_REASON = ("vllm serve exited with code 1 during boot: ValueError: " + "the model's max seq len is larger "
               "than the KV cache can hold; " * 8 + "END-OF-REASON")
NOTES_A = ("chat c=4 #0: client-bound: load generator loop used 0.95 of a core (1 process(es)); raise the plan's "
           "load_processes\nchat c=4 #1: client-bound: load generator loop used 0.97 of a core (1 process(es)); "
           "raise the plan's load_processes\nchat c=4 #2: /metrics could not be scraped")
NOTES_A1 = ("chat c=4 #0: client-bound: load generator loop used 0.91 of a core (1 process(es)); raise the plan's "
            "load_processes")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> tuple[Path, Path]:
    """(warehouse file, server log of the failed boot)."""
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    tmp = tmp_path_factory.mktemp("everyday")
    res, db = tmp / "results", tmp / "wh.duckdb"
    log = tmp / "logs" / "boot-failed.log"
    rng = np.random.default_rng(5)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for key, effect in (("a", 0.0), ("b", 0.2)):
        for rep in range(2):
            s = synthetic_trial(sweep_id=OLD, config_key=key, replicate=rep, config_label=f"cfg-{key}",
                                effect_rel=effect, boot_sd_rel=0.01, started_at=t0, rng=rng)
            if key == "a":
                s.trial["measurement_notes"] = NOTES_A if rep == 0 else NOTES_A1
            write_bundle(res, s.sweep, s.trial, s.tables)
    bad = synthetic_trial(sweep_id=OLD, config_key="c", config_label="cfg-c", started_at=t0, rng=rng,
                          status="boot_failed", quality_verdict="unvalidated")
    bad.trial.update(failure_class="invalid_config", failure_reason=LONG_REASON, log_path=str(log))
    write_bundle(res, bad.sweep, bad.trial, {})
    for rep in range(2):  # the same label, another config key (the plan had one more env var)
        s = synthetic_trial(sweep_id=MIX, config_key="a2", replicate=rep, config_label="cfg-a", boot_sd_rel=0.01,
                            started_at=t0 + dt.timedelta(days=1), rng=rng)
        write_bundle(res, s.sweep, s.trial, s.tables)
    c = synthetic_trial(sweep_id=CANCELLED, config_key="a", config_label="cfg-a", started_at=t0 + dt.timedelta(days=2),
                        rng=rng, status="cancelled", quality_verdict="unvalidated")
    c.trial.update(failure_reason="KeyboardInterrupt: ")
    write_bundle(res, c.sweep, c.trial, {})
    assert all(r.status == "loaded" for r in load_pending(db, res))
    return db, log


def cli(*args: str):
    from tunelab.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


# -- 10: interfaces ------------------------------------------------------------------------------------------------
def test_version_flag():
    import tunelab

    r = cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"tunelab {tunelab.__version__}", r.output


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_export_formats_into_a_folder_with_a_quote(warehouse, tmp_path, fmt):
    db, _ = warehouse
    out = tmp_path / "it's here"
    r = cli("export", "--out", str(out), "--db", str(db), "--format", fmt, "--sweep", OLD)
    assert r.exit_code == 0, r.output
    f = out / f"trials.{fmt}"
    trials = {"parquet": pd.read_parquet, "csv": pd.read_csv, "json": lambda p: pd.DataFrame(json.loads(p.read_text()))}[fmt](f)
    assert set(trials["sweep_id"]) == {OLD} and len(trials) == 5
    m = {"parquet": pd.read_parquet, "csv": pd.read_csv,
         "json": lambda p: pd.DataFrame(json.loads(p.read_text()))}[fmt](out / f"measurements.{fmt}")
    assert set(m["trial_id"]) <= set(trials["trial_id"]) and len(m) > 0


def test_export_refuses_an_unknown_format(warehouse, tmp_path):
    r = cli("export", "--out", str(tmp_path / "x"), "--db", str(warehouse[0]), "--format", "xlsx")
    assert r.exit_code == 2 and "xlsx" in r.output


def test_export_parquet_compression_is_the_codec_asked_for_and_loses_nothing(warehouse, tmp_path):
    import pyarrow.parquet as pq

    db, _ = warehouse
    tables = {}
    for codec in ("zstd", "brotli", "snappy"):
        args = ("--compression", codec) if codec != "zstd" else ()  # zstd is the default
        r = cli("export", "--out", str(tmp_path / codec), "--db", str(db), *args)
        assert r.exit_code == 0, r.output
        f = pq.ParquetFile(tmp_path / codec / "measurements.parquet")
        assert f.metadata.row_group(0).column(0).compression == codec.upper()
        tables[codec] = f.read()
    assert tables["zstd"].equals(tables["brotli"]) and tables["zstd"].equals(tables["snappy"])
    assert tables["zstd"].num_rows > 0


def test_export_refuses_an_unknown_compression_by_name(warehouse, tmp_path):
    r = cli("export", "--out", str(tmp_path / "x"), "--db", str(warehouse[0]), "--compression", "lzma")
    assert r.exit_code != 0 and "--compression 'lzma'" in r.output and "brotli" in r.output
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_load_from_a_missing_results_folder_is_bad_input(tmp_path):
    missing = tmp_path / "no-such-results"
    r = cli("load", "--db", str(tmp_path / "wh.duckdb"), "--results", str(missing))
    assert r.exit_code == 2, r.output
    assert str(missing) in r.output.replace("\n", "") and "--results" in r.output


def test_import_vllm_bench_files(tmp_path):
    import duckdb

    db = tmp_path / "wh.duckdb"
    files = sorted(str(p) for p in FIXTURES.glob("*.json"))
    r = cli("import", "vllm-bench", *files, "--db", str(db), "--runtime", "cpu")
    assert r.exit_code == 0, r.output
    assert "2 file(s) imported" in r.output
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT DISTINCT runtime_name FROM trials").fetchall() == [("cpu",)]
    con.close()
    r = cli("import", "vllm-bench", *files, "--db", str(db), "--runtime", "cpu")
    assert r.exit_code == 0 and "0 file(s) imported, 2 already" in r.output, r.output
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    r = cli("import", "vllm-bench", str(bad), "--db", str(db))
    assert r.exit_code == 2 and "x.json" in r.output


def test_report_json(warehouse):
    r = cli("report", "--db", str(warehouse[0]), "--sweep", OLD, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sweep_id"] == OLD and doc["status"] == "finished"
    assert {row["config"] for row in doc["comparison"]} == {"cfg-a", "cfg-b"}
    (failed,) = doc["failed_trials"]
    assert failed["failure_reason"] == LONG_REASON  # whole, not cut
    assert {g["cause"] for g in doc["notes"]} == {"client-bound", "/metrics could not be scraped"}


# -- 3: cancelled sweeps in the report --------------------------------------------------------------------------------
def test_report_defaults_to_the_latest_sweep_with_results_and_names_the_cancelled_one(warehouse):
    r = cli("report", "--db", str(warehouse[0]))
    assert r.exit_code == 0, r.output
    out = r.output.replace("\n", " ")
    assert f"sweep {MIX}" in out
    assert CANCELLED in out and "cancelled" in out and f"--sweep {CANCELLED}" in out


def test_sweep_latest_in_a_selector_is_the_latest_sweep_with_results(warehouse):
    """Found by a fresh user: `report` skipped the cancelled sweep but `compare ... sweep=latest` chose it and
    failed ("selects no trial with results"). Both now mean the latest sweep with an ok trial."""
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.selection import resolve_selector

    con = connect(str(warehouse[0]), read_only=True)
    try:
        assert resolve_selector(con, {"sweep": "latest"}) == {"sweep_id": MIX}
        assert resolve_selector(con, {"sweep": "previous"})["sweep_id"] not in (MIX, CANCELLED)
    finally:
        con.close()


def test_report_of_a_cancelled_sweep_says_cancelled(warehouse):
    r = cli("report", "--db", str(warehouse[0]), "--sweep", CANCELLED)
    assert r.exit_code == 0, r.output
    assert f"sweep {CANCELLED} (cancelled" in r.output.replace("\n", " ")
    doc = json.loads(cli("report", "--db", str(warehouse[0]), "--sweep", CANCELLED, "--json").stdout)
    assert doc["status"] == "cancelled" and doc["comparison"] == []


def test_report_of_a_sweep_stopped_between_trials_says_incomplete(tmp_path):
    """No trial was running when the sweep stopped, so none is cancelled: the plan's 3 trials against the 1 recorded
    tell it (a plan decided while it runs, replicates: auto or search:, has no such count)."""
    import yaml

    from tunelab.warehouse.loader import insert_trial_tables
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.synthetic import synthetic_trial

    db = tmp_path / "wh.duckdb"
    plan = {"name": "stopped", "model": "m", "runtime": "cpu", "engine_args": {"max-num-seqs": [1, 2, 4]},
            "workloads": [{"name": "chat", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 4}]}
    st = synthetic_trial(sweep_id="20260101T000000Z-stopped-0001", config_key="k1", boot_sd_rel=0.01,
                         rng=np.random.default_rng(1))
    st.sweep["plan_yaml"] = yaml.safe_dump(plan)
    con = connect(db)
    con.execute("BEGIN")
    insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]),
                                                    "trial": pd.DataFrame([st.trial]), **st.tables}, source="test")
    con.execute("COMMIT")
    con.close()
    doc = json.loads(cli("report", "--db", str(db), "--json").stdout)
    assert doc["status"] == "incomplete" and doc["trials"] == 1 and doc["planned_trials"] == 3, doc
    r = cli("report", "--db", str(db))
    assert "(incomplete: 1 of 3 planned trial(s) recorded" in r.output.replace("\n", " "), r.output
    # said once: the status line and the table's title had both said it
    assert r.exit_code == 0 and r.output.count("incomplete") == 1, r.output
    assert "sweep 20260101T000000Z-stopped-0001" in r.output  # the table still names its sweep


# -- 7: failure reasons --------------------------------------------------------------------------------------------
def test_report_shortens_a_long_failure_reason_with_a_pointer_and_the_log(warehouse):
    db, log = warehouse
    r = cli("report", "--db", str(db), "--sweep", OLD)
    out = r.output.replace("\n", " ")
    assert "END-OF-REASON" not in out  # shortened for display ...
    assert "trials.failure_reason" in out and "--json" in out  # ... with a pointer to the whole reason
    assert f"server log: {log}" in out


# -- 9: notes grouped by cause -------------------------------------------------------------------------------------
def test_notes_are_grouped_one_line_per_cause(warehouse):
    r = cli("report", "--db", str(warehouse[0]), "--sweep", OLD)
    lines = [ln for ln in r.output.splitlines() if "client-bound" in ln]
    assert len(lines) == 1, r.output
    assert "3 window(s)" in lines[0] and "2 trial(s)" in lines[0]
    assert sum("could not be scraped" in ln for ln in r.output.splitlines()) == 1


def test_group_notes_unit():
    from tunelab.reports.notes import group_notes

    groups = group_notes([("cfg-a", 0, NOTES_A), ("cfg-a", 1, NOTES_A1), ("cfg-b", 0, None)])
    assert [(g.cause, g.windows, g.trials) for g in groups] == [("client-bound", 3, 2),
                                                              ("/metrics could not be scraped", 1, 1)]
    assert groups[0].example.startswith("chat c=4 #0: client-bound")


# -- 5: never mix config keys silently ----------------------------------------------------------------------------------
def test_compare_frames_refuses_a_label_that_names_two_config_keys(warehouse):
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.selection import MixedConfigKeys, compare_frames

    con = connect(warehouse[0], read_only=True)
    try:
        with pytest.raises(MixedConfigKeys) as ei:
            compare_frames(con, {"config_label": "cfg-a"}, {"config_label": "cfg-b"})
        msg = str(ei.value)
        assert "baseline" in msg and "'a'" in msg and "'a2'" in msg and MIX in msg and "--mix-keys" in msg
        # one key per side: fine; mixing asked for explicitly: pooled, and said so
        assert len(compare_frames(con, {"config_label": "cfg-a", "sweep_id": OLD}, {"config_label": "cfg-b"}))
        df = compare_frames(con, {"config_label": "cfg-a"}, {"config_label": "cfg-b"}, mixed_keys=True)
        assert df.attrs["mixed_keys"] == {"baseline": ["a", "a2"]}
    finally:
        con.close()


def _compare(db: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    env.pop("PREFECT_API_URL", None)
    return subprocess.run([sys.executable, "-m", "tunelab.cli", "compare", "--db", str(db), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_compare_cli_mixed_keys_exit_2_then_json_with_mix_keys(warehouse):
    db = warehouse[0]
    r = _compare(db, "--baseline", "config=cfg-a", "--candidate", "config=cfg-b")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "'a2'" in r.stderr and "Traceback" not in r.stderr
    r = _compare(db, "--baseline", "config=cfg-a", "--candidate", "config=cfg-b", "--mix-keys", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["mixed_keys"] == {"baseline": ["a", "a2"]} and doc["rows"][0]["verdict"]
    r = _compare(db, "--baseline", "sweep=no-such-sweep", "--candidate", "config=cfg-b")
    assert r.returncode == 2 and OLD in r.stderr  # nothing matched: exit 2, listing what exists


def test_compare_cli_paired_pairs_boots_of_one_sweep_and_replicate(warehouse):
    db = warehouse[0]
    r = _compare(db, "--baseline", f"sweep={OLD},config=cfg-a", "--candidate", "config=cfg-b", "--paired", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(r.stdout)["rows"][0]
    assert "2 vs 2 boots, as pairs" in row["reason"] and "paired (2 pairs)" in row["variance_source"], row


# -- 3: the closing line of a cancelled `tunelab run` -----------------------------------------------------------------
@pytest.mark.parametrize("sig,code,how,kept", [("SIGINT", 130, "Ctrl-C", False), ("SIGTERM", 143, "SIGTERM", False),
                                              ("SIGINT", 130, "Ctrl-C", True)])
def test_cancelled_run_prints_what_finished_what_was_cancelled_and_where_the_data_is(tmp_path, sig, code, how, kept):
    """Real `tunelab run` and sweep flow (ephemeral Prefect); FAKE trial bodies (tests/fakes/fake_sweep_cli.py): the
    first trial finishes, the second blocks until the signal, the third never starts. ``kept``: the second had kept
    its windows (an ``incomplete`` bundle) and is interrupted before its final bundle, as in its teardown: it is
    recorded ``cancelled``, not left reading "killed or its host lost", and the report calls the sweep cancelled."""
    import signal

    import yaml
    from fakes.cancel_run import run_until_blocked_then_signal

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "name": "fake-cancel", "model": "fake-model", "runtime": "gpu-fake",
        "engine_args": {"max-model-len": [128, 256, 512]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 6}],
        "concurrency": [4], "repeats": 3}))
    db, res, mark = tmp_path / "wh.duckdb", tmp_path / "results", tmp_path / "blocking"
    env = dict(os.environ, TUNELAB_DB=str(db), TUNELAB_RESULTS=str(res), TUNELAB_HOME=str(tmp_path / "home"),
               FAKE_BLOCK_FROM="1", FAKE_BLOCK_MARK=str(mark), COLUMNS="400", FAKE_BLOCK_KEPT="1" if kept else "0")
    env.pop("PREFECT_API_URL", None)
    rc, out, errs = run_until_blocked_then_signal(plan, env, getattr(signal, sig), "the second trial")
    assert rc == code, errs[-3000:]
    (line,) = [ln for ln in errs.splitlines() if "cancelled (" in ln and "not started" in ln]
    sweep_id = line.split()[1]
    assert f"cancelled ({how}" in line
    assert "1 of 3 trial(s) finished (ok 1), 1 cancelled while running, 1 not started" in line
    assert str(res / sweep_id) in line and str(db) in line and f"--sweep {sweep_id}" in line
    assert "Traceback" not in errs.split(line)[-1]  # nothing after the closing line
    if kept:
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        try:
            rows = con.execute("SELECT status, failure_reason FROM trials WHERE sweep_id = ? ORDER BY started_at",
                               [sweep_id]).fetchall()
        finally:
            con.close()
        assert [r[0] for r in rows] == ["ok", "cancelled"], rows
        assert rows[1][1].startswith("cancelled while running (the trial then saw incomplete"), rows
        rep = subprocess.run([sys.executable, "-m", "tunelab.cli", "report", "--db", str(db), "--sweep", sweep_id,
                              "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0 and json.loads(rep.stdout)["status"] == "cancelled", rep.stdout[-2000:]


# -- 8: plots ----------------------------------------------------------------------------------------------------------
def test_version_plot_only_with_two_versions_and_legends_off_the_data(warehouse, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from tunelab.reports import plots

    db = warehouse[0]
    assert plots.version_plot(db, tmp_path) is None  # every trial ran vLLM 0.32.0: one column of dots, not drawn
    assert [p.name for p in plots.write_plots(db, OLD, tmp_path)] == [f"latency_throughput_{OLD}.png"]
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))  # keep the figure to inspect it
    assert plots.latency_throughput_plot(db, OLD, tmp_path)
    (fig,) = figs
    fig.canvas.draw()
    for ax in fig.axes:
        leg = ax.get_legend()
        assert leg is not None and not leg.get_window_extent().overlaps(ax.get_window_extent())


# -- found by a new user's try-out ------------------------------------------------------------------------------------
def test_note_cause_reads_as_text():
    from tunelab.reports.notes import note_cause

    assert note_cause("chat c=4 #1: 3.7% of inter-chunk gaps fell inside one read (0 s ITL): ...") == \
        "N% of inter-chunk gaps fell inside one read"


def test_default_warehouse_file_is_warehouse_duckdb_in_the_home(tmp_path, monkeypatch):
    """README and docs name `<home>/warehouse.duckdb`; an existing warehouse there must keep being found."""
    from tunelab.host import paths

    monkeypatch.delenv("TUNELAB_DB", raising=False)
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    assert paths.db_path() == paths.home() / "warehouse.duckdb"


def test_error_text_is_not_taken_for_rich_markup(tmp_path):
    """A YAML error quotes the line ('{dtype: [bfloat16, float32}') and a selector error lists config keys
    ('[bc24dfb25695]'): printed as markup, both vanished."""
    bad = tmp_path / "y.yaml"
    bad.write_text("name: x\nmodel: m\nengine_args: {dtype: [bfloat16, float32}\n")
    r = cli("plan", "check", str(bad))
    assert r.exit_code == 2
    assert "[bfloat16, float32}" in r.output


def test_compare_html_with_rows_below_the_minimum_boots(warehouse, tmp_path):
    """Rows with fewer boots than needed have no interval (None): the HTML report still draws them."""
    from tunelab.reports.plots import ab_interval_plot

    rows = [{"rel_diff": -0.15, "rel_ci_low": None, "rel_ci_high": None, "verdict": "inconclusive",
             "workload": "chat", "load_kind": "concurrency", "load_value": 4, "metric": "output_tokens_per_s"},
            {"rel_diff": 0.1, "rel_ci_low": 0.02, "rel_ci_high": 0.2, "verdict": "better",
             "workload": "chat", "load_kind": "concurrency", "load_value": 1, "metric": "output_tokens_per_s"}]
    out = ab_interval_plot(rows, tmp_path)
    assert out is not None and out.stat().st_size > 0


def test_report_html_into_a_new_folder(warehouse, tmp_path):
    target = tmp_path / "new" / "dir" / "r.html"
    r = cli("report", "--db", str(warehouse[0]), "--html", str(target))
    assert r.exit_code == 0, r.output
    assert target.read_text().lstrip().lower().startswith("<!doctype html")


def test_the_cancel_line_names_recheck_when_finished_trials_were_not_yet_judged(tmp_path):
    """A cancel that comes while the quality gate is still to run leaves finished trials ``unvalidated``: reports
    leave them out, and the closing line says how to judge them (`tunelab recheck`). Bundles from the synthetic
    warehouse generator (plan name ``synthetic``); nothing runs."""
    import time
    from types import SimpleNamespace

    from tunelab.core.bundle import write_bundle
    from tunelab.cli import cancelled_sweep_line
    from tunelab.warehouse.synthetic import synthetic_trial

    res, sweep_id = tmp_path / "results", "20261202T000000Z-synthetic-abcd"
    for rep, verdict in ((0, "pass"), (1, "unvalidated"), (2, "unvalidated")):
        st = synthetic_trial(sweep_id=sweep_id, config_key="c0ffee000000", replicate=rep, quality_verdict=verdict)
        write_bundle(res, st.sweep, st.trial, st.tables)
    plan = SimpleNamespace(name="synthetic", search=None, trials=lambda: [None] * 4)
    line = cancelled_sweep_line(plan, res, tmp_path / "wh.duckdb", time.time() - 60, "Ctrl-C")
    assert "3 of 4 trial(s) finished (ok 3)" in line, line
    assert "2 finished trial(s) were not yet judged by the quality gate" in line
    assert f"`tunelab recheck --sweep {sweep_id}` judges them" in line
    # all judged: no such sentence
    for rep in (1, 2):
        st = synthetic_trial(sweep_id=sweep_id, config_key="c0ffee000000", replicate=rep, quality_verdict="warn")
        write_bundle(res, st.sweep, st.trial, st.tables)
    assert "recheck" not in cancelled_sweep_line(plan, res, tmp_path / "wh.duckdb", time.time() - 60, "Ctrl-C")


def test_export_and_report_say_what_is_wrong_instead_of_a_traceback(warehouse, tmp_path):
    """A corrupt file, a file where a folder goes, an unknown sweep id, a warehouse a writer holds: each an exit-2
    message naming the option and the fix, nothing half-written (found by a fresh user)."""
    import subprocess
    import sys

    db, _ = warehouse
    bad = tmp_path / "corrupt.duckdb"
    bad.write_bytes(b"\x00not a database" * 300)
    r = cli("export", "--db", str(bad), "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "not a tunelab warehouse (DuckDB file)" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()
    r = cli("report", "--db", str(bad))
    assert r.exit_code == 2 and "not a tunelab warehouse" in r.output and "try again" not in r.output
    afile = tmp_path / "afile"
    afile.write_text("")
    for args in (("export", "--db", str(db), "--out", str(afile)), ("report", "--db", str(db), "--plots", str(afile))):
        r = cli(*args)
        assert r.exit_code == 2 and f"{afile}: a file is there; give a folder" in r.output, r.output
    r = cli("export", "--db", str(db), "--out", str(tmp_path / "y"), "--sweep", "nosuch")
    assert r.exit_code == 2 and "--sweep: nosuch not in" in r.output and OLD in r.output
    assert not (tmp_path / "y").exists()
    r = cli("export", "--db", str(db), "--out", str(tmp_path / "y"), "--sweep", OLD)
    assert r.exit_code == 0 and (tmp_path / "y" / "trials.parquet").exists()
    # another process holds the file open for writing (as a sweep's load does)
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = cli("export", "--db", str(db), "--out", str(tmp_path / "z"))
        assert r.exit_code == 2 and "another process writes to it" in r.output and "try again when it ends" in r.output
    finally:
        holder.kill()
        holder.wait()


def test_compare_rejects_an_unknown_metric_before_its_flow_starts(warehouse):
    db, _ = warehouse
    r = cli("compare", "--db", str(db), "--baseline", "config=cfg-a", "--candidate", "config=cfg-b",
            "--metric", "nosuch_metric")
    assert r.exit_code == 2, r.output
    assert "--metric: metric 'nosuch_metric' is not comparable; use one of" in r.output
    assert "flow run" not in r.output.lower() and "Traceback" not in r.output


def test_compare_names_the_closest_metrics_for_a_typo(warehouse):
    db, _ = warehouse
    r = cli("compare", "--db", str(db), "--baseline", "config=cfg-a", "--candidate", "config=cfg-b",
            "--metric", "output_token_per_s")
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "--metric: metric 'output_token_per_s' is not comparable (did you mean 'output_tokens_per_s'" in out
    assert "flow run" not in r.output.lower() and "Traceback" not in r.output


def test_compare_selector_that_matches_nothing_names_the_key_value_and_what_exists(warehouse, monkeypatch):
    """Found by a fresh user: `--baseline config=nosuch` said only "no measurements match" with the whole
    warehouse listed; now the failing key=value, the values of that key and a near one. `gpu=` takes a part of the
    GPU name."""
    _no_temporary_server(monkeypatch)
    db, _ = warehouse
    r = cli("compare", "--db", str(db), "--baseline", f"sweep={OLD},config=nosuch", "--candidate", "config=cfg-b")
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert (f"error: no measurements match both selectors: the baseline selector 'sweep={OLD},config=nosuch' "
            "selects no trial with results: no ok trial has config=nosuch; config values in the warehouse: cfg-a, "
            "cfg-b") in out, out
    r = cli("compare", "--db", str(db), "--baseline", "config=cfg-a", "--candidate", "runtime=synthetik,config=cfg-b")
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "the candidate selector 'runtime=synthetik,config=cfg-b'" in out, out
    assert "no ok trial has runtime=synthetik; did you mean runtime=synthetic? runtime values" in out
    r = cli("compare", "--db", str(db), "--baseline", f"sweep={OLD},config=cfg-a", "--candidate",
            f"sweep={OLD},config=cfg-b,gpu=SYNTH", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["candidate"]["gpu_name"] == "synthetic"


def test_compare_anchor_that_is_a_compared_side_is_refused_naming_the_side(warehouse, monkeypatch):
    """`--anchor <a compared config's key>` (any case) said "... give one config key"; the anchor cannot be a
    compared side: the message names the side and what can serve (here nothing: both sweeps share no other
    config, so `--anchor none`)."""
    _no_temporary_server(monkeypatch)
    db, _ = warehouse
    r = cli("compare", "--db", str(db), "--baseline", f"sweep={OLD},config=cfg-a", "--candidate",
            f"sweep={MIX},config=cfg-a", "--anchor", "A")
    assert r.exit_code == 2, (r.output, r.exception)
    out = " ".join(r.output.split())
    assert ("error: --anchor 'A' names the baseline (synthetic/a 'cfg-a'): the anchor cannot be one of the compared "
            "sides") in out, out
    assert (f"no other config was measured in every compared sweep ({OLD}, {MIX}), so none can serve as anchor: "
            "use --anchor none") in out
    assert "give one config key" not in out and "Traceback" not in out


def test_plan_check_names_the_resolved_model_path_of_a_copied_plan(tmp_path):
    """experiments/demo.yaml copied elsewhere: its relative model path is read from the new folder, and the message
    shows where that is and the rule (found by a fresh user who copied the demo plan to another folder)."""
    plan = tmp_path / "plans" / "demo.yaml"
    plan.parent.mkdir()
    plan.write_text((Path(__file__).resolve().parent.parent / "experiments" / "demo.yaml").read_text())
    r = cli("plan", "check", str(plan))
    flat = " ".join(r.output.split())
    assert f"({tmp_path / '.tunelab' / 'models' / 'tiny-llama'}) is not a model folder" in flat, r.output
    assert "read from the plan's folder first, then the current folder" in flat


def test_report_of_a_sweep_cancelled_mid_window_says_its_windows_are_stored_not_compared(tmp_path):
    """A sweep cancelled while its only trial measured: its windows are in the warehouse but a cancelled trial is
    never compared. Its report says so and how to get them; the default report shows the latest sweep with a
    completed trial and names the cancelled one."""
    import yaml

    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    res, db = tmp_path / "results", tmp_path / "wh.duckdb"
    rng = np.random.default_rng(9)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    ok = synthetic_trial(sweep_id=OLD, config_key="a", config_label="cfg-a", started_at=t0, rng=rng)
    write_bundle(res, ok.sweep, ok.trial, ok.tables)
    c = synthetic_trial(sweep_id=CANCELLED, config_key="a", config_label="cfg-a", started_at=t0 + dt.timedelta(days=1),
                        rng=rng, repeats=2, status="cancelled", quality_verdict="unvalidated")
    c.trial.update(failure_reason="TerminationSignal (signal 15: SIGTERM or a cancel through Prefect)")
    c.sweep["plan_yaml"] = yaml.safe_dump({  # two configs: the second never started
        "name": "cancelled", "model": "m", "runtime": "cpu", "engine_args": {"max-num-seqs": [1, 2]},
        "workloads": [{"name": "chat", "prompt_tokens": 8, "output_tokens": 4, "num_requests": 4}]})
    write_bundle(res, c.sweep, c.trial, c.tables)
    load_pending(db, res)
    r = cli("report", "--db", str(db), "--sweep", CANCELLED)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert f"sweep {CANCELLED} (cancelled: 1 of 1 trial(s) cancelled; 1 more planned trial(s) never started)" in out
    assert "no measurements" not in out
    assert "nothing to compare: no trial ended ok (1 cancelled)" in out
    assert f"the 2 window(s) they measured are stored, not compared: `tunelab export --sweep {CANCELLED}`" in out
    r = cli("report", "--db", str(db))
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and f"sweep {OLD}" in out and f"sweep {CANCELLED} is later but cancelled" in out, out


def _no_temporary_server(monkeypatch) -> None:
    """Make any start of Prefect's temporary API server fail loudly in this process."""
    from prefect.server.api.server import SubprocessASGIServer

    def refuse(self, timeout=None):
        raise AssertionError("a Prefect temporary server was started")

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(SubprocessASGIServer, "start", refuse)


def test_compare_without_a_prefect_server_starts_none(warehouse, monkeypatch):
    """Issue 29 items 15/17: `compare` needs no Prefect run without PREFECT_API_URL, so it starts no temporary
    server (16-123 s under load, and a raw traceback when it started too slowly)."""
    _no_temporary_server(monkeypatch)
    db = warehouse[0]
    r = cli("compare", "--db", str(db), "--baseline", f"sweep={OLD},config=cfg-a", "--candidate",
            f"sweep={OLD},config=cfg-b", "--json")
    assert r.exit_code == 0, (r.output, r.exception)
    assert json.loads(r.stdout)["rows"][0]["verdict"]


def test_clean_on_a_clean_host_starts_no_server_keeps_brackets_and_counts_devices_only(tmp_path, monkeypatch):
    """Issue 29 item 15: `clean` read "[config_key]" in run names as rich markup (gone), counted compile-cache
    locks as device locks, and started a temporary Prefect server even with nothing to put right."""
    import tunelab.flows.clean as clean_mod

    _no_temporary_server(monkeypatch)
    home, locks = tmp_path / "home", tmp_path / "host-locks"
    monkeypatch.setenv("TUNELAB_HOME", str(home))
    monkeypatch.setenv("TUNELAB_LOCK_DIR", str(locks))
    (home / "state" / "locks").mkdir(parents=True)
    (home / "state" / "locks" / "compile-cpu-abc.lock").touch()  # a compile-cache lock: not a device
    locks.mkdir()
    (locks / "tunelab-h-cpu0.lock").touch()
    (locks / "compile-cpu-def.lock").touch()  # an older tunelab's compile lock in the same folder
    monkeypatch.setattr(clean_mod, "_runs", lambda rep, log, start: log(
        "flow run trial cfg-a [bc24dfb25695] r0 (0000): Running -> Crashed"))
    r = cli("clean")
    assert r.exit_code == 0, (r.output, r.exception)
    assert "cfg-a [bc24dfb25695] r0" in r.output
    assert "device locks: 1 free, 0 held" in r.output


@pytest.mark.parametrize("args", [["compare", "--baseline", "config=a", "--candidate", "config=b"], ["report"],
                                  ["tuning-report"], ["recheck"]])
def test_a_mistyped_db_path_is_named_with_the_fix(tmp_path, args):
    """A --db that does not exist: exit 2, the option and the path named, the fix first (a fresh user mistyped the
    path and was told to run a sweep)."""
    from typer.testing import CliRunner

    from tunelab.cli import app

    missing = tmp_path / "nosuch.duckdb"
    out = CliRunner().invoke(app, [*args, "--db", str(missing)], env={"COLUMNS": "400"})
    text = " ".join(out.output.split())
    assert out.exit_code == 2, text
    assert f"--db: no warehouse at {missing}; check the path" in text, text


# -- a new user's report and series (--series checked first, names with runtimes, one status line, note headings) --
TWO_RT = "20260201T000000Z-twin-0001"
GAP_NOTES = ("short c=1 #0: 2.5% of inter-chunk gaps fell inside one read (0 s ITL): the server sent those chunks "
             "together\nshort c=32 #0: 26% of inter-chunk gaps fell inside one read (0 s ITL): the server sent those "
             "chunks together")


@pytest.fixture(scope="module")
def two_runtimes(tmp_path_factory) -> Path:
    """One sweep that ran config ``twin`` (and ``anchor``) on two runtimes: each trial warned one quality check,
    has a note and a flagged bottleneck; one more boot of ``twin`` failed on rt-b."""
    import json as _json

    from tunelab.core import records as R
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    tmp = tmp_path_factory.mktemp("two-runtimes")
    res, db = tmp / "results", tmp / "wh.duckdb"
    rng = np.random.default_rng(3)
    t0 = dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc)
    for i, (key, label, rt) in enumerate((("k-anc", "anchor", "rt-a"), ("k-twin", "twin", "rt-a"),
                                          ("k-twin", "twin", "rt-b"))):
        s = synthetic_trial(sweep_id=TWO_RT, config_key=key, config_label=label, runtime_name=rt, boot_sd_rel=0.01,
                            started_at=t0 + dt.timedelta(minutes=i), rng=rng, quality_verdict="warn")
        s.trial["measurement_notes"] = GAP_NOTES
        tid = s.trial["trial_id"]
        s.tables["quality_checks"] = pd.concat([s.tables["quality_checks"], pd.DataFrame([
            {"trial_id": tid, "suite": "aggregates", "expectation": "repeats_for_cv", "success": False,
             "severity": "warn", "observed": "1 repeat", "threshold": ">= 2 repeats"}])], ignore_index=True)
        s.tables["window_diagnoses"] = R.frame(R.WindowDiagnosis, pd.DataFrame([dict(
            trial_id=tid, workload="chat", load_kind="concurrency", load_value=4.0, repeat=0, bottleneck="gpu_floor",
            flagged=True, metric="tpot_over_floor", value=1.4, threshold=1.5, summary="TPOT at the floor",
            evidence=_json.dumps({"tpot_over_floor": 1.4}), remedy="fewer weight bytes", sources="nvml")]))
        write_bundle(res, s.sweep, s.trial, s.tables)
    bad = synthetic_trial(sweep_id=TWO_RT, config_key="k-twin", config_label="twin", runtime_name="rt-b", replicate=1,
                          started_at=t0 + dt.timedelta(minutes=5), rng=rng, status="boot_failed",
                          quality_verdict="unvalidated")
    bad.trial.update(failure_class="invalid_config", failure_reason="vllm serve exited with code 1")
    write_bundle(res, bad.sweep, bad.trial, {})
    assert all(r.status == "loaded" for r in load_pending(db, res))
    return db


def test_report_checks_series_and_anchor_before_it_prints_anything(warehouse):
    """Found by a new user: `tunelab report --series nosuch` printed the whole report, then the error."""
    db = str(warehouse[0])
    for args, said in ((["--series", "nosuch"], ["'nosuch'", "output_tokens_per_s", "tpot_p50_s"]),
                       (["--series", "output_tokens_per_s", "--anchor", "bogus"], ["'bogus'", "cfg-a", "cfg-b"]),
                       (["--anchor", "a"], ["--anchor", "--series"])):
        r = cli("report", "--db", db, "--sweep", OLD, *args)
        text = " ".join(r.output.split())
        assert r.exit_code == 2, text
        assert all(s in text for s in said), text
        assert f"sweep {OLD}" not in text and "quality:" not in text and "cfg-c r0" not in text, text  # nothing else


def test_report_names_trials_with_their_runtime_where_the_sweep_ran_on_two(two_runtimes, warehouse):
    r = cli("report", "--db", str(two_runtimes))
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    quality = next(ln for ln in r.output.splitlines() if "repeats_for_cv" in ln)
    assert "anchor r0 on rt-a, twin r0 on rt-a, twin r0 on rt-b" in quality, quality  # quality check line
    assert "(anchor r0 on rt-a, twin r0 on rt-a, twin r0 on rt-b)" in out, out  # the note's trials
    for name in ("anchor r0 on rt-a", "twin r0 on rt-a", "twin r0 on rt-b"):  # bottlenecks
        assert f"gpu_floor {name} chat c=4 #1" in out, out
    assert "twin r1 on rt-b: boot_failed" in out, out  # failed trials
    doc = json.loads(cli("report", "--db", str(two_runtimes), "--json").stdout)
    assert {f["trial"] for f in doc["window_findings"]} == {"anchor r0 on rt-a", "twin r0 on rt-a", "twin r0 on rt-b"}
    # one runtime: the names stay short
    one = " ".join(cli("report", "--db", str(warehouse[0]), "--sweep", OLD).output.split())
    assert "cfg-c r0: boot_failed" in one and "(cfg-a r0, cfg-a r1)" in one and " on synthetic" not in one, one


def test_left_out_trials_are_named_with_their_runtime_where_the_sweep_ran_on_two():
    from tunelab.reports.report import left_out_lines

    assert left_out_lines([{"config": "twin", "replicate": 0, "runtime": "rt-b", "verdict": "fail",
                            "failed_checks": "x"}])[0].startswith("left out: twin r0 on rt-b (quality fail: x)")
    assert left_out_lines([{"config": "twin", "replicate": 0, "verdict": "fail",
                            "failed_checks": "x"}])[0].startswith("left out: twin r0 (quality fail: x)")


def test_a_note_heading_gives_the_range_of_its_numbers_not_n(two_runtimes):
    from tunelab.reports.notes import group_notes

    (g,) = group_notes([("twin", 0, GAP_NOTES), ("twin", 1, "short c=1 #0: 3.7% of inter-chunk gaps fell inside "
                                                            "one read (0 s ITL)")])
    assert g.cause == "N% of inter-chunk gaps fell inside one read"  # the grouping is kept
    assert g.heading == "2.5-26% of inter-chunk gaps fell inside one read" and (g.windows, g.trials) == (3, 2)
    (one,) = group_notes([("twin", 0, "chat c=4 #0: 3.7% of inter-chunk gaps fell inside one read (0 s ITL)")])
    assert one.heading == "3.7% of inter-chunk gaps fell inside one read"
    r = cli("report", "--db", str(two_runtimes))
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("note ")]
    assert line.startswith("note 2.5-26% of inter-chunk gaps fell inside one read: 6 window(s) in 3 trial(s)"), line
    assert "N%" not in r.output
