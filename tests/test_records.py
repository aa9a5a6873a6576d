"""The records of tunelab/core/records.py are the one source of columns: every record, every table of a bundle that the
trial flow writes, and every warehouse table after all migrations have the same columns (and types).

The bundle comes from the trial flow's own code (``flows.trial.run_trial``, the bundle writer, then the sweep's
validation step) run without Prefect's machinery, against the FAKE timed OpenAI server (tests/fakes/), with the
FAKE NVML and crafted vLLM /metrics pages, so every table of a trial is written in a few seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tunelab.core import records as R
from tunelab.core.bundle import read_manifest
from tunelab.warehouse.migrate import connect

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(Path(__file__).parent / "fakes"))

# Warehouse bookkeeping, not result tables: no record, no bundle file.
BOOKKEEPING = {"loaded_bundles", "schema_migrations"}


def _sql_tables() -> dict[str, dict[str, str]]:
    """{table: {column: DuckDB type}} of the base tables of a warehouse after every migration."""
    con = connect(":memory:")
    try:
        rows = con.execute(
            "SELECT c.table_name, c.column_name, c.data_type FROM duckdb_columns() c "
            "JOIN duckdb_tables() t ON t.table_name = c.table_name AND t.schema_name = c.schema_name "
            "WHERE c.schema_name = 'main' ORDER BY c.table_name, c.column_index"
        ).fetchall()
    finally:
        con.close()
    out: dict[str, dict[str, str]] = {}
    for table, col, typ in rows:
        out.setdefault(table, {})[col] = typ
    return out


def _diff(a: dict, b: dict, a_name: str, b_name: str) -> list[str]:
    out = [f"{c} only in {a_name}" for c in a if c not in b] + [f"{c} only in {b_name}" for c in b if c not in a]
    out += [f"{c}: {a[c]} in {a_name}, {b[c]} in {b_name}" for c in a if c in b and a[c] != b[c]]
    return out


def test_every_record_matches_its_warehouse_table_after_all_migrations():
    sql = _sql_tables()
    assert set(sql) - BOOKKEEPING == {r.TABLE for r in R.RECORDS.values()}, "a table without a record, or back"
    problems = {}
    for record in R.RECORDS.values():
        rec = {c: R.sql_type(record, c) for c in R.columns(record)}
        d = _diff(rec, sql[record.TABLE], f"tunelab/core/records.py {record.__name__}", "the SQL schema")
        if d:
            problems[record.TABLE] = d
    assert not problems, problems


def test_every_column_has_a_description():
    missing = [f"{r.__name__}.{c}" for r in R.RECORDS.values() for c, f in r.model_fields.items() if not f.description]
    assert not missing


# ---------------------------------------------------------------- a bundle written by the trial flow


class FakeEngine:
    """FAKE stand-in for ``tasks.engine.EngineServer``: 'boots' by writing a real vLLM boot log (a fixture) and
    serves through the FAKE timed OpenAI server."""

    def __init__(self, fake, log_path: Path):
        self.fake, self.log_path, self.proc = fake, Path(log_path), None
        self.base_url, self.api_key, self.served_model_name = fake.base_url, "k", "fake-model"

    def start(self) -> None:
        shutil.copy(FIXTURES / "bootlogs" / "cpu_0.32.0_cold.log", self.log_path)

    def wait_ready(self):
        return SimpleNamespace(boot_s=0.2, health_s=0.1, port=0)

    def stop(self):
        return SimpleNamespace(total_s=0.01, clean=True, detail="")

    def redacted_command(self) -> str:
        return "vllm serve fake-model --api-key ***"


@pytest.fixture(scope="module")
def trial_bundle(tmp_path_factory) -> Path:
    from fake_nvml import FakeGpu, FakeNvml
    from timed_openai_server import FakeServerProcess, FakeTiming

    import tunelab.flows.trial as T
    import tunelab.tasks.measure as MS
    from tunelab.tasks.steps.validate import validate_task
    import tunelab.tasks.steps.clean_gpu as CG
    import tunelab.tasks.steps.measure_windows as MW
    from tunelab.core.plan import Plan, Trial, Workload
    from tunelab.host.runtime import Runtime
    from tunelab.tasks import gpu as G
    from tunelab.tasks.server_metrics import snapshot

    out = tmp_path_factory.mktemp("records")
    pages = [snapshot((FIXTURES / "metrics" / f"vllm-v0.32_{w}.prom").read_text()) for w in ("before", "after")]
    scrapes = [0]

    async def fake_scrape(client):  # the FAKE server has no /metrics: vLLM's pages, before then after
        scrapes[0] += 1
        return pages[(scrapes[0] - 1) % 2]

    nvml = FakeNvml(gpus=[FakeGpu()])
    mp = pytest.MonkeyPatch()
    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002, tokens_per_chunk=1), model="fake-model") as fake:
        try:
            mp.setattr(MS, "_scrape", fake_scrape)
            mp.setattr(MW, "GpuSampler", lambda index: G.GpuSampler(index, interval_s=0.05, nvml=nvml))
            mp.setattr(CG, "check_clean", lambda *a, **k: G.check_clean(*a, nvml=nvml, **k))
            mp.setattr(T, "get_run_logger", lambda: logging.getLogger("test_records"))
            mp.setattr(T, "_boot_once", lambda *a, **k: FakeEngine(fake, a[3]))
            for name in ("clean_gpu_task", "boot_task", "measure_task", "teardown_task"):
                mp.setattr(T, name, getattr(T, name).fn)  # the task bodies, without Prefect's task runs
            plan = Plan(name="records", model="unused", seed=7, repeats=1, warmup_requests=2, concurrency=[2],
                        workloads=[Workload(name="w", prompt_tokens=24, output_tokens=4, num_requests=4)])
            trial = Trial(runtime="fake-rt", model="unused", model_id="unused", engine_args={"enforce-eager": True},
                          env={})
            runtime = Runtime(name="fake-rt", device="cuda", python=sys.executable, versions={"vllm": "0.32.0"})
            started = dt.datetime.now(dt.timezone.utc)
            sweep_id = R.sweep_id(started, plan.name)
            sweep = R.Sweep(sweep_id=sweep_id, plan_name=plan.name, host="fake-host", started_at=started)
            (out / "logs").mkdir()
            ctx = T.TrialContext(sweep=sweep, results_dir=str(out / "results"), logs_dir=str(out / "logs"),
                                 gpu_index=0, gpu_indices=(0,), gpu_name="NVIDIA H200", gpu_baseline_mib=0.0)
            trial_id = R.trial_id(sweep_id, trial.config_key, runtime.name, 0)
            bundle = T.run_trial.fn(trial, trial_id, plan, runtime, ctx)
            assert validate_task.fn(bundle, plan) in ("pass", "warn", "fail")
        finally:
            mp.undo()
    return bundle


def _arrow_type(t: pa.DataType) -> str:
    # Parquet names a list's item 'element', Arrow 'item': the same type.
    return f"list<{t.value_type}>" if pa.types.is_list(t) else str(t)


def test_a_bundle_of_the_trial_flow_has_every_record_column_with_its_type(trial_bundle):
    manifest = read_manifest(trial_bundle)
    assert set(manifest["files"]) == set(R.RECORDS), "the trial flow left a table out"
    problems = {}
    for name, record in R.RECORDS.items():
        schema = pq.read_schema(trial_bundle / manifest["files"][name]["file"])
        got = {f.name: _arrow_type(f.type) for f in schema}
        want = {f.name: _arrow_type(f.type) for f in R.arrow_schema(record)}
        d = _diff(got, want, "the bundle", f"tunelab/core/records.py {record.__name__}")
        if d:
            problems[name] = d
        elif list(got) != list(want):
            problems[name] = [f"column order {list(got)} is not the record's {list(want)}"]
    assert not problems, problems
    rows = {name: e["rows"] for name, e in manifest["files"].items()}
    assert rows["trial"] == rows["sweep"] == 1 and rows["requests"] == 4 and rows["measurements"] == 1
    assert rows["boot_phases"] > 0 and rows["server_metrics"] > 0 and rows["gpu_samples"] > 0
    assert rows["quality_checks"] > 0


def test_the_bundle_of_the_trial_flow_loads(trial_bundle, tmp_path):
    from tunelab.warehouse.loader import load_bundle

    res = load_bundle(tmp_path / "wh.duckdb", trial_bundle)
    assert res.status == "loaded" and res.rows["requests"] == 4 and res.rows["gpu_samples"] > 0


# ---------------------------------------------------------------- ids


def test_trial_id_keeps_the_sweeps_format():
    assert R.trial_id("20261129T091500Z-demo-3f2a", "3f2a9c1b0d4e", "cpu", 2) == \
        "20261129T091500Z-demo-3f2a/cpu/3f2a9c1b0d4e/r2"
    with pytest.raises(R.RecordError, match="config_key"):
        R.trial_id("s", "a/b", "cpu", 0)
    with pytest.raises(R.RecordError, match="replicate"):
        R.trial_id("s", "c", "cpu", -1)


def test_sweep_id_and_measurement_key():
    t = dt.datetime(2026, 11, 29, 9, 15, tzinfo=dt.timezone.utc)
    assert R.sweep_id(t, "demo", token="3f2a") == "20261129T091500Z-demo-3f2a"
    with pytest.raises(R.RecordError, match="timezone"):
        R.sweep_id(dt.datetime(2026, 11, 29), "demo")
    assert R.measurement_key("w", "rate", 2, 1) == {"workload": "w", "load_kind": "rate", "load_value": 2.0,
                                                     "repeat": 1}
    assert R.import_sweep_id("vllm-bench-import", "ab" * 32) == "vllm-bench-import-abababababab"


def test_a_row_with_an_unknown_column_is_refused_with_its_name():
    with pytest.raises(R.RecordError, match="ttft_p42_s"):
        R.to_row(R.Measurement, {"trial_id": "t", "workload": "w", "load_kind": "rate", "load_value": 1.0,
                                 "repeat": 0, "ttft_p42_s": 1.0})
    row = R.TrialRow(trial_id="t", sweep_id="s", config_key="c", replicate=0, status="ok")
    with pytest.raises(R.RecordError, match="boot_seconds"):
        row.update(boot_seconds=3.0)
    row.update(boot_s=3, engine_args={"b": 1, "a": True})
    assert row.boot_s == 3.0 and row.engine_args == '{"a": true, "b": 1}'
