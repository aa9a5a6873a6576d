"""Import of `vllm bench serve --save-result` files (tunelab/warehouse/vllm_bench_import.py).

The fixtures use the key set written by vllm/benchmarks/serve.py; their numbers are synthetic
but internally consistent (summary stats computed from the per-request arrays).
"""

import json
from pathlib import Path

import duckdb
import pytest

from tunelab.core.bundle import BundleError
from tunelab.warehouse.query import run_query
from tunelab.warehouse.vllm_bench_import import import_vllm_bench

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_bench"
DETAILED = FIXTURES / "vllm-inf-qps-concurrency4-tiny-llama-20261128-141503.json"
SUMMARY = FIXTURES / "vllm-2.0qps-tiny-llama-20261128-141503.json"


def test_import_detailed_file(tmp_path):
    db = tmp_path / "wh.duckdb"
    (res,) = import_vllm_bench(db, [DETAILED], runtime_name="cpu")
    src = json.loads(DETAILED.read_text())
    assert res.status == "loaded" and res.rows["requests"] == len(src["ttfts"])
    con = duckdb.connect(str(db), read_only=True)
    t = con.execute("SELECT status, quality_verdict, runtime_name, vllm_version, vllm_pre, model FROM trials").fetchall()
    assert t == [("ok", "unvalidated", "cpu", "0.11.0rc1", "rc1", src["model_id"])]
    assert con.execute("SELECT source FROM sweeps").fetchall() == [("vllm-bench-import",)]
    m = con.execute(
        "SELECT load_kind, load_value, completed, failed, output_tokens_per_s, ttft_p99_s, tpot_p50_s, e2el_mean_s "
        "FROM measurements"
    ).fetchall()[0]
    assert m[:4] == ("concurrency", 4.0, src["completed"], src["failed"])
    assert m[4] == pytest.approx(src["output_throughput"])
    assert m[5] == pytest.approx(src["p99_ttft_ms"] / 1000)  # ms -> s
    assert m[6] == pytest.approx(src["median_tpot_ms"] / 1000)
    assert m[7] == pytest.approx(src["mean_e2el_ms"] / 1000)
    reqs = con.execute(
        "SELECT ok, error IS NOT NULL, ttft_s, e2el_s, len(chunk_offsets_s), output_tokens FROM requests "
        "ORDER BY request_index"
    ).fetchall()
    failed = [i for i, e in enumerate(src["errors"]) if e]
    assert [i for i, r in enumerate(reqs) if not r[0]] == failed
    ok0 = reqs[0]
    assert ok0[2] == pytest.approx(src["ttfts"][0])
    assert ok0[3] == pytest.approx(src["latencies"][0])
    assert ok0[4] == len(src["itls"][0]) + 1 and ok0[5] == src["output_lens"][0]
    con.close()


def test_import_is_idempotent_and_summary_files_work(tmp_path):
    db = tmp_path / "wh.duckdb"
    assert [r.status for r in import_vllm_bench(db, [DETAILED, SUMMARY])] == ["loaded", "loaded"]
    assert [r.status for r in import_vllm_bench(db, [DETAILED, SUMMARY])] == ["skipped", "skipped"]
    con = duckdb.connect(str(db))
    assert con.execute("SELECT count(*) FROM trials").fetchall() == [(2,)]
    assert con.execute("SELECT load_kind, load_value FROM measurements ORDER BY load_kind").fetchall() == [
        ("concurrency", 4.0), ("rate", 2.0)]
    latest = run_query(con, "latest_per_config", config_key=None, metric="output_tokens_per_s")
    assert len(latest) == 2 and set(latest.quality_verdict) == {"unvalidated"}
    con.close()


def test_not_a_bench_file_is_refused(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(BundleError, match="x.json"):
        import_vllm_bench(tmp_path / "wh.duckdb", [bad])


def test_tables_have_their_records_columns():
    """The import's rows go through tunelab.core.records like the trial flow's: every column of each table's
    record, in the record's order (None where the file has no value)."""
    from tunelab.core import records as R
    from tunelab.warehouse.vllm_bench_import import vllm_bench_tables

    _, tables, _ = vllm_bench_tables(DETAILED, runtime_name="cpu")
    for name, record in (("sweep", R.Sweep), ("trial", R.TrialRow), ("measurements", R.Measurement),
                         ("requests", R.Request)):
        assert list(tables[name].columns) == list(R.columns(record)), name
    assert tables["measurements"]["warmup_requests"].isna().all()  # a column the file cannot fill


def test_a_value_of_the_wrong_type_is_refused_before_the_warehouse_opens(tmp_path):
    from tunelab.core.records import RecordError

    src = json.loads(DETAILED.read_text())
    src["completed"] = "all of them"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(src))
    db = tmp_path / "wh.duckdb"
    with pytest.raises(RecordError, match="measurements.completed"):
        import_vllm_bench(db, [bad])
    assert not db.exists()


@pytest.mark.parametrize("text", ["", "\n\n", "[]"])
def test_an_empty_file_is_a_clear_error_with_exit_2(tmp_path, text):
    """Issue 29 item 19: an empty result file raised IndexError (exit 1, a traceback); it is a bad input."""
    from typer.testing import CliRunner

    from tunelab.cli import app

    empty = tmp_path / "empty.json"
    empty.write_text(text)
    with pytest.raises(BundleError, match=r"empty\.json: empty: no result records"):
        import_vllm_bench(tmp_path / "wh.duckdb", [empty])
    r = CliRunner().invoke(app, ["import", "vllm-bench", str(empty), "--db", str(tmp_path / "wh.duckdb")])
    assert r.exit_code == 2, r.output
    assert "no result records" in " ".join(r.output.split())
    assert "Traceback" not in r.output and "IndexError" not in r.output
