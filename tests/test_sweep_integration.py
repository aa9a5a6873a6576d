"""End to end on the real CPU runtime: `tunelab run` of a one-trial plan, then the rows in DuckDB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "tests" / "plans" / "one_trial.yaml"

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cpu_runtime, tiny_model):
    import yaml

    out = tmp_path_factory.mktemp("sweep")
    plan = yaml.safe_load(PLAN.read_text())
    plan["model"] = str(tiny_model)  # the installed tiny model (the plan's relative path assumes the checkout's home)
    plan["load_processes"] = 2  # the plan's setting reaches the load generator (and the warehouse)
    (out / "plan.yaml").write_text(yaml.safe_dump(plan))
    env = dict(os.environ, TUNELAB_DB=str(out / "wh.duckdb"), TUNELAB_RESULTS=str(out / "results"),
               PREFECT_HOME=str(out / "prefect"))
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "run", str(out / "plan.yaml")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r.stdout + r.stderr


def _read(out: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the sweep's warehouse. Close it (``with``): an open one, kept alive by a failed
    assertion's traceback, made the next test's write attach fail ("Unique file handle conflict")."""
    return duckdb.connect(str(out / "wh.duckdb"), read_only=True)


def test_rows_in_duckdb(sweep):
    out, _ = sweep
    with _read(out) as con:
        _check_rows(con, sweep[1])


def _check_rows(con: duckdb.DuckDBPyConnection, out: str) -> None:
    trials = con.execute("SELECT status, runtime_name, vllm_version, config_label, boot_s, teardown_s, "
                         "quality_verdict, engine_args FROM trials").fetchall()
    assert len(trials) == 1
    status, runtime, version, label, boot_s, teardown_s, verdict, engine_args = trials[0]
    assert status == "ok" and runtime == "cpu" and version.startswith("0.")
    assert label == "default" and json.loads(engine_args)["enforce-eager"] is True
    assert boot_s > 0 and teardown_s is not None
    assert verdict in ("pass", "warn", "fail")  # validated, whatever the noise of the box
    # 1 workload x 1 load level x 2 repeats
    meas = con.execute("SELECT repeat, completed, failed, output_tokens_per_s, ttft_p50_s, tpot_p50_s, rx_stamps, "
                       "read_delay_p99_s, loop_lag_p99_s, load_processes FROM measurements ORDER BY repeat").fetchall()
    assert [m[0] for m in meas] == [0, 1]
    for _, completed, failed, tps, ttft, tpot, rx, delay, lag, processes in meas:
        # TPOT >= 0, not > 0: on a starved box the server sent all 8 tokens in the first chunk once (TPOT 0.0)
        assert completed == 4 and failed == 0 and tps > 0 and 0 < ttft and tpot >= 0 and processes == 2
        # the real server's chunks were stamped by the kernel on arrival (Linux), with the client's lateness kept
        assert rx == "kernel" and delay is not None and delay >= 0 and lag is not None
    # every measured request, none of the warm-up ones; exact output length under ignore_eos
    reqs = con.execute("SELECT count(*), bool_and(ok), min(output_tokens), max(output_tokens), "
                       "min(ttft_s), bool_and(ttft_s <= e2el_s) FROM requests").fetchall()[0]
    assert reqs[0] == 8 and reqs[1] and reqs[2] == reqs[3] == 8 and reqs[4] > 0 and reqs[5]
    # server-side counters of the windows: the server generated what the client received
    gen = con.execute("SELECT sum(value) FROM server_metrics WHERE metric = 'generation_tokens'").fetchall()[0][0]
    assert gen == 2 * 4 * 8
    phases = con.execute("SELECT count(*) FROM boot_phases").fetchall()[0][0]
    assert phases >= 1
    checks = con.execute("SELECT count(*) FROM quality_checks").fetchall()[0][0]
    assert checks > 0
    # measurement notes (a busy box may or may not produce any) are not failures, and the run prints them
    notes, reason = con.execute("SELECT measurement_notes, failure_reason FROM trials").fetchall()[0]
    assert reason is None
    if notes:
        # the run prints one line per cause, headed by the cause with its numbers' range in place of each N
        # ("note 10.7% of inter-chunk gaps fell inside one read: 1 window(s) in 1 trial(s) (...); e.g. <a note>");
        # the cause itself ("N% of ...") is only the grouping key, so a note with a number printed no "note N%"
        from tunelab.reports.notes import group_notes

        groups = group_notes([(label, 1, notes)])
        assert sum(g.windows for g in groups) == len(notes.splitlines())
        for g in groups:
            assert f"note {g.heading}: {g.windows} window(s) in 1 trial(s)" in out, (g.heading, out[-3000:])


def test_no_server_left_behind(sweep):
    out, _ = sweep
    with _read(out) as con:
        trial_id, command = con.execute("SELECT trial_id, command FROM trials").fetchall()[0]
    from tunelab.tasks.engine import tracked_servers

    state = tracked_servers()
    assert not [e for e in state if e["trial_id"] == trial_id]
    argv = command.split()
    port = argv[argv.index("--port") + 1]
    served = argv[argv.index("--served-model-name") + 1]
    assert "***" in command  # the API key is redacted
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if served in line or f"--port {port} " in line]


def test_loading_twice_changes_nothing(sweep):
    out, _ = sweep
    from tunelab.warehouse.loader import load_pending

    def counts():
        con = duckdb.connect(str(out / "wh.duckdb"), read_only=True)
        try:
            return [con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                    for t in ("trials", "measurements", "requests", "server_metrics", "quality_checks")]
        finally:
            con.close()

    before = counts()
    load_pending(out / "wh.duckdb", out / "results")
    assert counts() == before


def test_report_prints_comparison(sweep):
    _, output = sweep
    # The table, or (when the trial failed its quality gate on a busy box) the line saying it was left out.
    assert ("output tok/s" in output and "TTFT p50 ms" in output) or "left out:" in output


def test_the_real_bundle_has_the_record_columns(sweep):
    """The bundle of a real vLLM trial (real /metrics, real boot log) has every column of every record with its
    type; a CPU host has no GPU samples (tests/test_records.py covers those with the FAKE NVML)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tunelab.core import records as R
    from tunelab.core.bundle import list_bundles, read_manifest

    out, _ = sweep
    (bundle,) = list_bundles(out / "results")
    files = read_manifest(bundle)["files"]
    assert set(files) == set(R.RECORDS) - {"gpu_samples"}

    def norm(t):  # Parquet names a list's item 'element', Arrow 'item': the same type
        return f"list<{t.value_type}>" if pa.types.is_list(t) else str(t)

    for name, entry in files.items():
        got = [(f.name, norm(f.type)) for f in pq.read_schema(bundle / entry["file"])]
        assert got == [(f.name, norm(f.type)) for f in R.arrow_schema(R.RECORDS[name])], name
