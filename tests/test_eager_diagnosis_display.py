"""The eager diagnostic re-boot (plan ``eager_diagnosis: true``), issue 29 item 14: what it found is said in a log
line, in the trial's artifact description, in `tunelab report` (terminal, --json, --html) beside the failure,
and a re-boot that timed out too is not called a memory or configuration problem."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

SWEEP = "20260105T000000Z-eager-0001"
FOUND = "eager boots (12.3 s): graph capture / compile problem"


def test_an_eager_reboot_that_timed_out_too_blames_neither_graphs_nor_memory(tmp_path, monkeypatch):
    import tunelab.flows.trial as T
    from tunelab.core.plan import Trial
    from tunelab.tasks.engine import BootFailed

    class TimesOut:  # a FAKE server whose boot times out
        def __enter__(self):
            raise BootFailed("timeout", "not ready within 600 s", None, tmp_path / "x.eager.log", 600.0)

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(T, "_boot_once", lambda *a, **k: TimesOut())
    said: list[str] = []

    class Log:  # the run logger, recording what is said
        def warning(self, msg, *args):
            said.append(msg % args)

    monkeypatch.setattr(T, "get_run_logger", Log)
    trial = Trial(runtime="cpu", model="m", model_id="m", engine_args={}, env={})
    found = T._eager_diagnosis(trial, None, None, tmp_path / "x.log", "S/cpu/k/r0", None)
    assert "timed out" in found and "memory sizing" not in found and "boot timeout" in found
    assert said == [f"eager diagnosis of S/cpu/k/r0: {found}"]


def _warehouse(tmp_path: Path) -> Path:
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    res, db = tmp_path / "results", tmp_path / "wh.duckdb"
    rng = np.random.default_rng(3)
    t0 = pd.Timestamp("2026-01-05", tz="UTC")
    ok = synthetic_trial(sweep_id=SWEEP, config_key="a", config_label="cfg-a", started_at=t0, rng=rng)
    write_bundle(res, ok.sweep, ok.trial, ok.tables)
    bad = synthetic_trial(sweep_id=SWEEP, config_key="c", config_label="cfg-c", started_at=t0, rng=rng,
                          status="boot_failed", quality_verdict="unvalidated")
    bad.trial.update(failure_class="crash", failure_reason="vllm serve exited with code 1 during boot",
                     eager_diagnosis=FOUND)
    write_bundle(res, bad.sweep, bad.trial, {})
    load_pending(db, res)
    return db


def test_report_terminal_json_and_html_show_what_the_eager_reboot_found(tmp_path):
    from tunelab.cli import app

    db = _warehouse(tmp_path)
    run = CliRunner()
    r = run.invoke(app, ["report", "--db", str(db), "--sweep", SWEEP], env={"COLUMNS": "200"})
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"eager re-boot: {FOUND}" in r.stdout
    r = run.invoke(app, ["report", "--db", str(db), "--sweep", SWEEP, "--json"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, (r.output, r.exception)
    (failed,) = json.loads(r.stdout)["failed_trials"]
    assert failed["eager_diagnosis"] == FOUND
    html = tmp_path / "r.html"
    r = run.invoke(app, ["report", "--db", str(db), "--sweep", SWEEP, "--html", str(html)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, (r.output, r.exception)
    assert "eager re-boot" in html.read_text() and "graph capture / compile problem" in html.read_text()


def test_the_trial_artifact_description_says_what_the_eager_reboot_found(tmp_path):
    from tunelab.core.bundle import list_bundles, read_bundle
    from tunelab.reports.report import trial_facts_markdown

    _warehouse(tmp_path)
    texts = [trial_facts_markdown(read_bundle(b, verify=False)) for b in list_bundles(tmp_path / "results")]
    assert sum(FOUND in t for t in texts) == 1
