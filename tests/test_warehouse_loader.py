"""Bundle loader (tunelab/warehouse/loader.py): idempotence, rollback, lock handling, corrupted bundles."""

import subprocess
import sys

import duckdb
import pytest

import tunelab.warehouse.loader as loader
from tunelab.core.bundle import BundleError, update_bundle_table, read_bundle, write_bundle
from tunelab.warehouse.loader import BundleLoadError, WarehouseLocked, load_bundle, load_pending
from tunelab.warehouse.synthetic import synthetic_trial

TABLES = ("sweeps", "trials", "boot_phases", "measurements", "requests", "quality_checks", "loaded_bundles")


def _counts(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES}
    finally:
        con.close()


def _bundle(results, config_key="cfg1", replicate=0, **kw):
    st = synthetic_trial(sweep_id="sw1", config_key=config_key, replicate=replicate, requests_per_repeat=4,
                         vllm_version="0.10.2.dev123+g1a2b3c4", **kw)
    return write_bundle(results, st.sweep, st.trial, st.tables), st


def test_load_twice_changes_nothing(tmp_path):
    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    path, st = _bundle(results)
    first = load_bundle(db, path)
    assert first.status == "loaded"
    assert first.rows["requests"] == len(st.tables["requests"])
    counts = _counts(db)
    assert counts["trials"] == 1 and counts["requests"] == 12
    second = load_bundle(db, path)
    assert second.status == "skipped"
    assert _counts(db) == counts
    # a changed bundle (quality verdict added after validation) replaces the trial's rows, no duplicates
    trial = read_bundle(path)["trial"]
    trial.loc[0, "quality_verdict"] = "fail"
    update_bundle_table(path, "trial", trial)
    assert load_bundle(db, path).status == "loaded"
    assert _counts(db) == counts
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT quality_verdict FROM trials").fetchall() == [("fail",)]
    con.close()


def test_version_columns_filled_at_load(tmp_path):
    db = tmp_path / "wh.duckdb"
    path, _ = _bundle(tmp_path / "results")
    load_bundle(db, path)
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute(
        "SELECT vllm_release, vllm_release_minor, vllm_dev, vllm_commit, vllm_local, vllm_version_key FROM trials"
    ).fetchall()[0]
    con.close()
    assert row[:5] == ("0.10.2", 10, 123, "1a2b3c4", "g1a2b3c4")
    assert row[5].startswith("000000.000010.000002")


def test_interrupted_load_leaves_db_unchanged(tmp_path, monkeypatch):
    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    other, _ = _bundle(results, config_key="cfg0")
    load_bundle(db, other)
    path, _ = _bundle(results, config_key="cfg1")
    before = _counts(db)
    real = loader._insert_parquet

    def fail_on_requests(con, schema, table, p, source, trial_id):
        n = real(con, schema, table, p, source, trial_id)  # trials/measurements rows are already inserted by now
        if table == "requests":
            raise RuntimeError("power cut (injected)")
        return n

    monkeypatch.setattr(loader, "_insert_parquet", fail_on_requests)
    with pytest.raises(BundleLoadError, match="rolled back"):
        load_bundle(db, path)
    assert _counts(db) == before
    assert (path / "manifest.json").is_file()  # bundle untouched
    monkeypatch.setattr(loader, "_insert_parquet", real)
    assert load_bundle(db, path).status == "loaded"
    assert _counts(db)["trials"] == before["trials"] + 1


def test_locked_db_raises_warehouse_locked(tmp_path):
    db = tmp_path / "wh.duckdb"
    path, _ = _bundle(tmp_path / "results")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(60)",
         str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(WarehouseLocked) as err:
            load_bundle(db, path, lock_timeout_s=0.5)
        msg = str(err.value)
        assert str(db) in msg and "stay on disk" in msg and "tunelab load" in msg
        assert err.value.holder_pid == holder.pid and f"PID {holder.pid}" in msg  # DuckDB names the holder
    finally:
        holder.kill()
        holder.wait()
    assert load_bundle(db, path, lock_timeout_s=5).status == "loaded"


def test_lock_holder_parsed_from_duckdb_message_with_fallback():
    from tunelab.warehouse.loader import lock_holder

    msg = ('IO Error: Could not set lock on file "/x/wh.duckdb": Conflicting lock is held in '
           "/usr/lib/my python/bin/python3.11 (PID 4148). See also https://duckdb.org/docs/current/connect/concurrency")
    assert lock_holder(msg) == (4148, "/usr/lib/my python/bin/python3.11")
    assert lock_holder(duckdb.IOException(msg)) == (4148, "/usr/lib/my python/bin/python3.11")
    # a DuckDB that does not name the holder: no guess
    assert lock_holder('IO Error: Could not set lock on file "/x/wh.duckdb": Resource temporarily unavailable') == (None, None)
    e = WarehouseLocked("locked", db_path="/x/wh.duckdb")
    assert e.holder_pid is None and e.holder == "another process"


def test_load_command_on_a_locked_warehouse_exits_3_with_one_line(tmp_path):
    """`tunelab load` while another process writes the warehouse: exit 3 (results on disk, not loaded), one line
    naming the holder's PID and the command to run later, no traceback; the bundle loads once the holder is gone."""
    import os

    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    _bundle(results)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(60)",
         str(db)], stdout=subprocess.PIPE, text=True)
    env = dict(os.environ, TUNELAB_DB=str(db), TUNELAB_RESULTS=str(results), COLUMNS="100")
    cmd = [sys.executable, "-m", "tunelab.cli", "load", "--lock-timeout-s", "0.5"]
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if f"PID {holder.pid}" in ln]
    assert len(lines) == 1 and "`tunelab load`" in lines[0] and str(db) in lines[0], out
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 bundle(s) loaded" in r.stdout, r.stdout + r.stderr


def test_bundles_warehouse_gives_the_same_report_as_the_file(tmp_path):
    """The in-memory warehouse of a sweep's bundles (what a sweep reports from when its warehouse file is
    locked) gives the same comparison and quality summary as the file after `tunelab load`."""
    import pandas as pd

    from tunelab.reports.report import comparison_frame, quality_summary
    from tunelab.warehouse.loader import bundles_warehouse

    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    paths = [_bundle(results, config_key=k, replicate=r, effect_rel=e, repeat_sd_rel=0.05)[0]
             for k, e in (("fast", 0.2), ("base", 0.0)) for r in (0, 1)]
    load_pending(db, results)
    con = bundles_warehouse(paths)
    try:
        mem, mem_q = comparison_frame(con, "sw1"), quality_summary(con, "sw1")
    finally:
        con.close()
    disk, disk_q = comparison_frame(db, "sw1"), quality_summary(db, "sw1")
    assert len(disk) == 2
    pd.testing.assert_frame_equal(mem, disk)
    assert mem_q["counts"] == disk_q["counts"]


def test_corrupted_bundle_is_refused(tmp_path):
    db = tmp_path / "wh.duckdb"
    path, _ = _bundle(tmp_path / "results")
    data = bytearray((path / "measurements.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "measurements.parquet").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"measurements\.parquet"):
        load_bundle(db, path)
    assert not db.exists() or _counts(db)["trials"] == 0


def test_unknown_column_is_refused_with_its_name(tmp_path):
    db = tmp_path / "wh.duckdb"
    st = synthetic_trial(sweep_id="sw1", config_key="c")
    m = st.tables["measurements"].assign(ttft_p42_s=1.0)
    path = write_bundle(tmp_path / "results", st.sweep, st.trial, {"measurements": m})
    with pytest.raises(BundleError, match="ttft_p42_s"):
        load_bundle(db, path)


def test_load_pending_loads_only_new_bundles_and_reports_failures(tmp_path):
    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    a, _ = _bundle(results, config_key="a")
    b, _ = _bundle(results, config_key="b")
    assert [r.status for r in load_pending(db, results)] == ["loaded", "loaded"]
    assert load_pending(db, results) == []
    c, _ = _bundle(results, config_key="c")
    (c / "requests.parquet").write_bytes(b"broken")
    d, _ = _bundle(results, config_key="d")
    res = {r.bundle_dir.name: r for r in load_pending(db, results)}
    assert res[c.name].status == "failed" and "requests.parquet" in res[c.name].error
    assert res[d.name].status == "loaded"
    assert c.exists()  # never deleted
    assert _counts(db)["trials"] == 3


def test_interrupted_load_of_a_large_bundle_leaves_db_unchanged(tmp_path, monkeypatch):
    # more request rows than the loader's row group size: DuckDB writes them into the file before COMMIT
    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    n = loader.LOADER_ROW_GROUP_SIZE // 3 + 100
    st = synthetic_trial(sweep_id="sw1", config_key="big", requests_per_repeat=n)
    write_bundle(results, st.sweep, st.trial, st.tables)
    assert len(st.tables["requests"]) > loader.LOADER_ROW_GROUP_SIZE
    real = loader._insert_parquet

    def fail_after_requests(con, schema, table, p, source, trial_id):
        got = real(con, schema, table, p, source, trial_id)
        if table == "requests":
            raise RuntimeError("power cut (injected)")
        return got

    monkeypatch.setattr(loader, "_insert_parquet", fail_after_requests)
    assert load_pending(db, results)[0].status == "failed"
    assert set(_counts(db).values()) == {0}
    monkeypatch.setattr(loader, "_insert_parquet", real)
    assert [r.status for r in load_pending(db, results)] == ["loaded"]
    assert _counts(db)["requests"] == len(st.tables["requests"])
    assert load_pending(db, results) == []


def test_load_pending_merges_a_sweep_row_that_changed_between_bundles(tmp_path):
    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    a = synthetic_trial(sweep_id="sw1", config_key="a")
    b = synthetic_trial(sweep_id="sw1", config_key="b")
    write_bundle(results, {**a.sweep, "plan_yaml": None}, a.trial, a.tables)
    write_bundle(results, {**b.sweep, "plan_yaml": "plan: 1"}, b.trial, b.tables)
    c = synthetic_trial(sweep_id="sw1", config_key="c")
    write_bundle(results, {**c.sweep, "plan_yaml": None}, c.trial, c.tables)
    assert [r.status for r in load_pending(db, results)] == ["loaded"] * 3
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), any_value(plan_yaml) FROM sweeps").fetchall() == [(1, "plan: 1")]
    con.close()


def _table_digest(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for t in TABLES:
            cols = [c for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {t})").fetchall()
                    if c not in ("loaded_at", "bundle_path")]  # when and where it was loaded from differ
            out[t] = con.execute(f"SELECT count(*), sum(hash({', '.join(cols)})) FROM {t}").fetchall()[0]
        return out
    finally:
        con.close()


def test_parallel_load_equals_serial_load(tmp_path, monkeypatch):
    # Sweep swA: every bundle carries the same sweep row (bundles load side by side). Sweep swB: each bundle
    # carries a different sweep row (finished_at moves on), so the row that stays must be the last bundle's in
    # path order, as in a one-at-a-time load: those load alone, in order. The result must equal a serial load.
    import datetime as dt
    import threading

    results = tmp_path / "results"
    for sw in ("swA", "swB"):
        for i in range(6):
            st = synthetic_trial(sweep_id=sw, config_key=f"c{i}", requests_per_repeat=50)
            sweep = dict(st.sweep, finished_at=st.sweep["finished_at"] + dt.timedelta(seconds=i if sw == "swB" else 0))
            write_bundle(results, sweep, st.trial, st.tables)
    serial = load_pending(tmp_path / "serial.duckdb", results, workers=1)
    threads = []
    real = loader._load_one
    monkeypatch.setattr(loader, "_load_one", lambda *a, **k: threads.append(threading.current_thread()) or real(*a, **k))
    parallel = load_pending(tmp_path / "parallel.duckdb", results, workers=4)
    assert [r.status for r in parallel] == ["loaded"] * 12
    assert any(t is not threading.main_thread() for t in threads)  # the side-by-side path ran
    assert [r.bundle_dir for r in parallel] == [r.bundle_dir for r in serial]  # path order
    d = _table_digest(tmp_path / "parallel.duckdb")
    assert d == _table_digest(tmp_path / "serial.duckdb")
    assert d["trials"][0] == 12 and d["sweeps"][0] == 2 and d["requests"][0] == 12 * 150
    assert load_pending(tmp_path / "parallel.duckdb", results, workers=4) == []  # idempotent
