"""What the Prefect UI shows of a sweep, read back through Prefect's API from a real local Prefect server:
trial run states and tags, where the artifacts hang, the sweep run's name, the progress artifact, the order of
a failed trial's log lines; and the event and state of a comparison that confirms a regression.

The sweep runs the real ``tuning_sweep`` and ``trial`` flows; only the engine is a FAKE (``FakeEngine``: no
``vllm serve``; one config "fails to boot" the way vLLM does when ``max-model-len`` exceeds the model's
positions, the other "boots" and its measurement is synthetic). No vLLM, a few seconds per sweep.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


# The real Prefect server of tests/test_flows.py (one fixture, not a copy of it).
from test_flows import prefect_server  # noqa: E402,F401


# -- a FAKE engine under the real trial flow --------------------------------------------------------------------
_TOO_LONG = 99999
_VLLM_ERROR = (f"ValueError: User-specified max_model_len ({_TOO_LONG}) is greater than the derived max_model_len "
               "(max_position_embeddings=2048 or model_max_length=None in model's config.json).")


class FakeEngine:
    """FAKE ``EngineServer``: no process. ``max-model-len`` above 2048 fails to boot with vLLM's own log line
    (so the real classifier says ``invalid_config``); anything else is ready at once."""

    def __init__(self, trial, log_path: Path):
        self.trial, self.log_path = trial, Path(log_path)
        self.base_url, self.api_key, self.served_model_name, self.proc = "http://127.0.0.1:9", "k", "m", None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fails = int(self.trial.engine_args.get("max-model-len", 0)) > 2048
        self.log_path.write_text("INFO vllm serve starting (FAKE)\n" + (
            f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{_VLLM_ERROR}\n" if fails else ""))

    def wait_ready(self):
        from tunelab.tasks.engine import BootFailed

        if int(self.trial.engine_args.get("max-model-len", 0)) > 2048:
            raise BootFailed("died", "vllm serve exited with status 1 after 2.0 s", 1, self.log_path, 2.0)
        return SimpleNamespace(boot_s=1.23456, health_s=0.1, port=9)

    def stop(self):
        return SimpleNamespace(total_s=0.01, clean=True, detail="")

    def redacted_command(self) -> str:
        return "vllm serve (FAKE)"


def _fake_measurement(*args, **kwargs):
    from tunelab.tasks.measure import MeasureResult
    from tunelab.warehouse.synthetic import synthetic_trial

    syn = synthetic_trial(sweep_id="fake", config_key="fake", requests_per_repeat=4, chunk_offsets=4)
    t = {k: v.drop(columns=["trial_id"], errors="ignore") for k, v in syn.tables.items()}
    import pandas as pd

    return MeasureResult(requests=t["requests"], measurements=t["measurements"],
                         server_metrics=t.get("server_metrics", pd.DataFrame()),
                         notes=["chat c=4 #1: client-bound: FAKE note"])


@pytest.fixture
def fake_engine(monkeypatch):
    import tunelab.flows.sweep as S
    import tunelab.flows.trial as T
    import tunelab.tasks.steps.measure_windows as MW
    from tunelab.host.runtime import Runtime
    from tunelab.tasks.gpu import Inventory

    rt = Runtime(name="cpu-fake", device="cpu", python=sys.executable, versions={"vllm": "0.32.0"})
    monkeypatch.setattr(T, "_boot_once", lambda trial, runtime, plan, log_path, *a, **k: FakeEngine(trial, log_path))
    monkeypatch.setattr(MW, "measure_server", _fake_measurement)
    monkeypatch.setattr(S, "inventory", lambda: Inventory(False, reason="no GPU (FAKE inventory)"))
    monkeypatch.setattr(S, "preflight", lambda plan: {"cpu-fake": rt})
    return rt


def _plan(path: Path, name: str) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": name, "model": "fake-model", "runtime": "cpu-fake",
        "engine_args": {"max-model-len": [2048, _TOO_LONG]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 4}],
        "concurrency": [4], "repeats": 3, "eager_diagnosis": False}))
    return path


def _logs(client, flow_run_id) -> list:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    logs: list = []
    for _ in range(40):  # the log worker sends in batches
        logs = client.read_logs(log_filter=flt, sort=LogSort.TIMESTAMP_ASC)
        if any("boot failed" in lg.message for lg in logs) and any("Finished in state" in lg.message for lg in logs):
            break
        time.sleep(0.25)
    return logs


def test_failed_trial_is_a_failed_run_with_tags_its_artifact_and_a_completed_sweep(prefect_server, fake_engine,
                                                                                     tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from tunelab.flows.sweep import tuning_sweep

    plan = _plan(tmp_path / "plan.yaml", "views-fake")
    out = tuning_sweep(str(plan), db=str(tmp_path / "wh.duckdb"), results=str(tmp_path / "results"), plots=True)
    by_status = {t["status"]: t for t in out.trials}
    assert set(by_status) == {"ok", "boot_failed"} and by_status["boot_failed"]["failure_class"] == "invalid_config"
    with get_client(sync_client=True) as c:
        # the sweep run: named after the plan's name (not its path), Completed although a trial failed
        sweeps = c.read_flow_runs(flow_run_filter=FlowRunFilter(name={"any_": ["sweep views-fake"]}))
        assert len(sweeps) == 1 and sweeps[0].state.type.value == "COMPLETED", sweeps
        sweep_run = sweeps[0]
        kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[sweep_run.id])))
        assert len(kids) == 2
        failed = next(k for k in kids if "99999" in k.name)
        ok = next(k for k in kids if k is not failed)
        # the failed trial is Failed at a glance, its failure class leading the state message
        assert failed.state.type.value == "FAILED" and failed.state.name == "BootFailed"
        assert failed.state.message.startswith("invalid_config: ") and "max_model_len" in failed.state.message
        assert ok.state.type.value == "COMPLETED"
        key_failed = by_status["boot_failed"]["config_key"]
        assert set(failed.tags) >= {f"config_key:{key_failed}", "runtime:cpu-fake", "vllm:0.32.0", "status:boot_failed"}
        assert "status:ok" in ok.tags and f"config_key:{by_status['ok']['config_key']}" in ok.tags
        # each trial's table artifact hangs on its own run, one row per window, facts in the description
        arts = c.read_artifacts()
        trial_arts = {a.flow_run_id: a for a in arts if a.key and a.key.startswith("trial-views-fake-")}
        assert set(trial_arts) == {failed.id, ok.id}
        ok_art = trial_arts[ok.id]
        import json

        rows = json.loads(ok_art.data) if isinstance(ok_art.data, str) else ok_art.data
        assert rows and "config" not in rows[0] and "TTFT p50 ms" in rows[0]
        assert "--max-model-len 2048" in ok_art.description and "boot 1.2 s" in ok_art.description
        assert "invalid_config" in trial_arts[failed.id].description
        # the sweep's own artifacts: Prefect's progress artifact at 100 %, the report with the plot embedded
        prog = [a for a in arts if a.key == "sweep-progress-views-fake"]
        assert prog and prog[0].type == "progress" and float(prog[0].data) == 100.0
        assert prog[0].flow_run_id == sweep_run.id
        report = next(a for a in arts if a.key == "sweep-report-views-fake")
        assert "](data:image/png;base64," in report.data and "file://" not in report.data
        assert f"--max-model-len {_TOO_LONG}" in report.data  # the key's full settings
        trials_art = next(a for a in arts if a.key == "sweep-trials-views-fake")
        trows = json.loads(trials_art.data) if isinstance(trials_art.data, str) else trials_art.data
        assert {r["boot s"] for r in trows} >= {"1.2"} and all("\n" not in v for r in trows for v in r.values())
        # the failed trial's log leads with the one-line reason; no traceback of Prefect's frames
        logs = _logs(c, failed.id)
    msgs = [lg.message for lg in logs]
    first_bad = next(m for lg, m in zip(logs, msgs) if lg.level >= 30)
    assert first_bad.startswith("boot failed (invalid_config): ") and "max_model_len" in first_bad, msgs
    assert not any("Traceback" in m for m in msgs), [m for m in msgs if "Traceback" in m][0][:2000]


# -- a comparison that confirms a regression ---------------------------------------------------------------------
def _regressing_warehouse(path: Path, results: Path) -> None:
    """Synthetic boots over three vLLM versions: ``cfgseries`` is 20 % slower from 0.9.2 on (two violations in a
    row along versions: a confirmed series regression), ``cfgab`` 30 % slower in 0.10.0 only (an A/B 'worse'
    of latest vs previous), ``cfgsame`` unchanged."""
    import numpy as np

    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    rng = np.random.default_rng(11)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    effects = {"cfgseries": (0.0, -0.2, -0.2), "cfgab": (0.0, 0.0, -0.3), "cfgsame": (0.0, 0.0, 0.0)}
    for vi, version in enumerate(["0.9.0", "0.9.2", "0.10.0"]):
        for key, eff in effects.items():
            for rep in range(3):
                s = synthetic_trial(sweep_id=f"s{vi}", config_key=key, replicate=rep, vllm_version=version,
                                    runtime_name=f"rt-{version}", effect_rel=eff[vi], boot_sd_rel=0.01,
                                    repeat_sd_rel=0.01, started_at=t0 + dt.timedelta(days=vi), rng=rng)
                write_bundle(results, s.sweep, s.trial, s.tables)
    load_pending(path, results)


def test_confirmed_regression_emits_an_event_ends_in_its_state_and_calls_the_webhook(prefect_server, tmp_path):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    from tunelab.flows.compare import REGRESSION_EVENT, compare, regression_webhook

    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        # the documented set-up (docs/prefect.md): a webhook block and an automation on the event
        block_id, auto = regression_webhook(f"http://127.0.0.1:{httpd.server_port}/hook")
        assert auto.trigger.expect == {REGRESSION_EVENT} and auto.actions[0].block_document_id == block_id
        db = tmp_path / "wh.duckdb"
        _regressing_warehouse(db, tmp_path / "results")
        out = compare({"vllm_version": "previous"}, {"vllm_version": "latest"}, db=str(db),
                      artifact_key="ab-regression-test")
        kinds = {(c["kind"], c["config_key"]) for c in out["confirmed"]}
        assert ("series", "cfgseries") in kinds and ("ab_worse", "cfgab") in kinds
        assert not any(c["config_key"] == "cfgsame" for c in out["confirmed"])
        with get_client(sync_client=True) as c:
            run = c.read_flow_runs(flow_run_filter=FlowRunFilter(name={"any_": ["compare output_tokens_per_s"]}))[0]
        assert run.state.type.value == "COMPLETED" and run.state.name == "Regression"
        assert run.state.message.startswith("tunelab: 2 confirmed regression(s) of output_tokens_per_s")
        # the event, read back from the server's event store, names the flow run
        events: list = []
        for _ in range(60):
            r = httpx.post(prefect_server + "/events/filter",
                           json={"filter": {"event": {"name": [REGRESSION_EVENT]}}, "limit": 10}, timeout=10)
            events = r.json()["events"]
            if events:
                break
            time.sleep(0.5)
        assert len(events) == 1, events
        ev = events[0]
        assert ev["resource"]["prefect.resource.id"] == "tunelab.metric.output_tokens_per_s"
        assert ev["payload"]["candidate"] == {"vllm_version": "0.10.0"} and len(ev["payload"]["confirmed"]) == 2
        assert any(rr["prefect.resource.id"] == f"prefect.flow-run.{run.id}" for rr in ev["related"])
        # the automation calls the webhook with the summary
        for _ in range(120):
            if received:
                break
            time.sleep(0.5)
        assert received, "the webhook was not called within 60 s"
        assert received[0]["text"] == run.state.message or received[0]["text"].startswith("tunelab: 2 confirmed")
        assert received[0]["flow_run"] == str(run.id) and len(received[0]["confirmed"]) == 2
        # a comparison without a confirmed regression emits nothing and ends Completed
        out2 = compare({"config_key": "cfgsame", "vllm_version": "0.9.0"},
                       {"config_key": "cfgsame", "vllm_version": "0.9.2"}, db=str(db), with_regressions=False,
                       artifact_key="ab-no-regression-test")
        assert out2["confirmed"] == []
    finally:
        httpd.shutdown()


def test_compare_cli_writes_the_html_report(prefect_server, tmp_path):
    db = tmp_path / "wh.duckdb"
    _regressing_warehouse(db, tmp_path / "results")
    out = tmp_path / "compare.html"
    env = dict(os.environ, PREFECT_API_URL=prefect_server, COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "compare", "--baseline", "version=previous",
                        "--candidate", "version=latest", "--db", str(db), "--html", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'src="data:image/png;base64,' in page and "<script" not in page
    assert "cfgab" in page and "<strong>worse</strong>" in page and "Regressions along vLLM versions" in page


# -- the states that say how a trial and a sweep ended (issue 29 items 12 and 18) ----------------------------------
def _flow_runs(c, name: str) -> tuple:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    (sweep,) = c.read_flow_runs(flow_run_filter=FlowRunFilter(name={"any_": [name]}))
    kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[sweep.id])))
    return sweep, kids


def test_a_trial_that_fails_the_quality_gate_says_so_in_its_state_and_tag(prefect_server, fake_engine, tmp_path,
                                                                          monkeypatch):
    """A trial that ran but failed the quality gate is not a green 'Completed' with only ``status:ok``: its run ends
    in the COMPLETED-type state ``QualityFailed`` naming the failed check, tagged ``quality:fail``; a trial that
    passed keeps Completed and is tagged ``quality:pass``."""
    import dataclasses

    from prefect.client.orchestration import get_client

    import tunelab.tasks.quality as Q
    from tunelab.flows.sweep import tuning_sweep

    real = Q.validate_trial

    def gate(tables, trial, *a, **k):  # FAKE gate: the real checks' rows; max-model-len=2048's first fails, 1024 passes
        res = real(tables, trial, *a, **k)
        if "2048" not in str(trial.get("config_label")):
            return dataclasses.replace(res, verdict="pass")
        checks = res.checks.copy()
        checks.loc[checks.index[0], ["success", "severity"]] = [False, "fail"]
        return dataclasses.replace(res, verdict="fail", checks=checks)

    monkeypatch.setattr(Q, "validate_trial", gate)
    plan = tmp_path / "plan.yaml"
    import yaml

    plan.write_text(yaml.safe_dump({
        "name": "views-quality", "model": "fake-model", "runtime": "cpu-fake",
        "engine_args": {"max-model-len": [2048, 1024]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 4}],
        "concurrency": [4], "repeats": 3, "eager_diagnosis": False}))
    out = tuning_sweep(str(plan), db=str(tmp_path / "wh.duckdb"), results=str(tmp_path / "results"), plots=False)
    verdicts = {t["config"]: t["verdict"] for t in out.trials}
    assert verdicts == {"max-model-len=2048": "fail", "max-model-len=1024": "pass"}, verdicts
    with get_client(sync_client=True) as c:
        sweep, kids = _flow_runs(c, "sweep views-quality")
        bad = next(k for k in kids if "max-model-len=2048" in k.name)
        good = next(k for k in kids if k is not bad)
        assert bad.state.type.value == "COMPLETED" and bad.state.name == "QualityFailed", bad.state
        first = read_first_check(out, "max-model-len=2048")
        assert bad.state.message.startswith("quality gate: fail (") and first in bad.state.message, bad.state
        assert "quality:fail" in bad.tags and "status:ok" in bad.tags
        assert good.state.name == "Completed" and "quality:pass" in good.tags
        assert sweep.state.type.value == "COMPLETED" and "status:all_failed" not in sweep.tags


def read_first_check(out, config: str) -> str:
    """``suite/expectation`` of the check the FAKE gate failed, from the trial's bundle."""
    from tunelab.core.bundle import read_bundle

    from tunelab.core.bundle import bundle_dir_for

    t = next(t for t in out.trials if t["config"] == config)
    qc = read_bundle(bundle_dir_for(Path(out.results), out.sweep_id, t["trial_id"]), verify=False)["quality_checks"]
    row = qc[(qc["success"] == False) & (qc["severity"] == "fail")].iloc[0]  # noqa: E712
    return f"{row['suite']}/{row['expectation']}"


def test_a_sweep_whose_every_trial_failed_ends_failed_and_still_returns_its_summary(prefect_server, fake_engine,
                                                                                    tmp_path):
    """Every trial failed (``tunelab run`` exits 1): the sweep run is no longer Completed but the FAILED-type state
    ``AllTrialsFailed`` with the tag ``status:all_failed``; a Python caller still gets the summary."""
    import yaml
    from prefect.client.orchestration import get_client

    from tunelab.flows.sweep import tuning_sweep

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "name": "views-all-failed", "model": "fake-model", "runtime": "cpu-fake",
        "engine_args": {"max-model-len": [_TOO_LONG, _TOO_LONG + 1]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 4}],
        "concurrency": [4], "repeats": 3, "eager_diagnosis": False}))
    out = tuning_sweep(str(plan), db=str(tmp_path / "wh.duckdb"), results=str(tmp_path / "results"), plots=False)
    assert [t["status"] for t in out.trials] == ["boot_failed", "boot_failed"]
    with get_client(sync_client=True) as c:
        sweep, kids = _flow_runs(c, "sweep views-all-failed")
        assert sweep.state.type.value == "FAILED" and sweep.state.name == "AllTrialsFailed", sweep.state
        assert "no trial of this sweep ended ok" in sweep.state.message
        assert "status:all_failed" in sweep.tags
        assert len(kids) == 2 and all(k.state.name == "BootFailed" for k in kids)


def test_an_interrupted_sweep_and_its_trial_end_cancelled_not_crashed(prefect_server, fake_engine, tmp_path,
                                                                     monkeypatch):
    """Ctrl-C during a measurement (nobody cancelled through Prefect): the CLI says cancelled (exit 130), and the
    runs now say so too: the sweep and its trial end Cancelled, not Crashed ("Crash detected!")."""
    import yaml
    from prefect.client.orchestration import get_client

    import tunelab.tasks.steps.measure_windows as MW
    from tunelab.flows.sweep import tuning_sweep

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(MW, "measure_server", interrupted)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "name": "views-interrupted", "model": "fake-model", "runtime": "cpu-fake",
        "engine_args": {"max-model-len": [2048]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 4}],
        "concurrency": [4], "repeats": 3, "eager_diagnosis": False}))
    with pytest.raises(KeyboardInterrupt):
        tuning_sweep(str(plan), db=str(tmp_path / "wh.duckdb"), results=str(tmp_path / "results"), plots=False)
    with get_client(sync_client=True) as c:
        sweep, kids = _flow_runs(c, "sweep views-interrupted")
        assert sweep.state.type.value == "CANCELLED", sweep.state
        assert len(kids) == 1 and kids[0].state.type.value == "CANCELLED", kids[0].state
        assert "interrupt" in kids[0].state.message
