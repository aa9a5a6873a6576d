"""`tunelab report --json` carries the sweep's SLA searches (table ``sla_searches``, migration 017) and its window
diagnoses (table ``window_diagnoses``, view ``window_findings``) under stable keys (reports.report.SLA_SEARCH_KEYS,
WINDOW_DIAGNOSIS_KEYS; docs/sla_search.md, docs/measurement.md). The warehouse is loaded from a bundle written here."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from tunelab.core import records as R
from tunelab.reports.report import SLA_SEARCH_KEYS, WINDOW_DIAGNOSIS_KEYS

TRIAL = "s1/rt/k/r0"


def _warehouse(tmp_path, *, with_sections: bool = True):
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_bundle

    sweep = R.Sweep(sweep_id="s1", plan_name="p")
    trial = R.TrialRow(trial_id=TRIAL, sweep_id="s1", config_key="k", config_label="max-num-seqs=64", replicate=0,
                    status="ok", runtime_name="rt")
    tables = {}
    if with_sections:
        diag = [dict(trial_id=TRIAL, workload="chat", load_kind="concurrency", load_value=8.0, repeat=0,
                     bottleneck=b, flagged=b == "kv_cache", metric=m, value=v, threshold=t, summary=f"{b} summary",
                     evidence=json.dumps({m: v}), remedy=f"{b} remedy", sources="vllm:num_preemptions_total")
                for b, m, v, t in [("kv_cache", "preemptions", 3.0, 0.0), ("client", "client_cpu_frac", 0.1, 0.9)]]
        tables["window_diagnoses"] = R.frame(R.WindowDiagnosis, pd.DataFrame(diag))
        levels = [{"level": 8, "verdict": "pass"}, {"level": 16, "verdict": "fail"}]
        sla = [dict(trial_id=TRIAL, workload="chat", load_kind="concurrency", verdict="found", max_load=12.0,
                    max_load_shown=True, first_fail=13.0, goodput_per_s=9.5, request_throughput_per_s=10.0,
                    output_tokens_per_s=1280.0, knee_load=8.0, knee_request_throughput_per_s=7.0,
                    limits=json.dumps({"ttft_p99_s": 0.5}), spec=json.dumps({"load": "concurrency"}),
                    levels=json.dumps(levels), levels_tried=2, windows=4,
                    summary="max load under SLO c=12, c=13 fails")]
        tables["sla_searches"] = R.frame(R.SlaSearch, pd.DataFrame(sla))
    bundle = write_bundle(tmp_path / "results", sweep, trial, tables)
    db = tmp_path / "wh.duckdb"
    load_bundle(db, bundle)
    return db


def _report_json(db) -> dict:
    from tunelab.cli import app

    r = CliRunner().invoke(app, ["report", "--db", str(db), "--sweep", "s1", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_report_json_has_the_sla_searches_and_the_window_diagnoses_with_stable_keys(tmp_path):
    doc = _report_json(_warehouse(tmp_path))
    (sla,) = doc["sla_searches"]
    assert tuple(sla) == SLA_SEARCH_KEYS
    assert (sla["trial_id"], sla["config_label"], sla["runtime_name"], sla["workload"], sla["verdict"]) == \
        (TRIAL, "max-num-seqs=64", "rt", "chat", "found")
    assert (sla["max_load"], sla["first_fail"], sla["goodput_per_s"], sla["max_load_shown"]) == (12.0, 13.0, 9.5, True)
    assert sla["limits"] == {"ttft_p99_s": 0.5} and [x["level"] for x in sla["levels"]] == [8, 16]  # JSON, not text
    diags = doc["window_diagnoses"]
    assert [tuple(d) for d in diags] == [WINDOW_DIAGNOSIS_KEYS] * 2
    assert {d["bottleneck"]: d["flagged"] for d in diags} == {"client": False, "kv_cache": True}
    kv = next(d for d in diags if d["bottleneck"] == "kv_cache")
    assert kv["evidence"] == {"preemptions": 3.0} and kv["config_label"] == "max-num-seqs=64" and kv["repeat"] == 0
    (finding,) = doc["window_findings"]  # the flagged ones only (view window_findings)
    assert (finding["bottleneck"], finding["metric"], finding["value"], finding["remedy"]) == \
        ("kv_cache", "preemptions", 3.0, "kv_cache remedy")


def test_report_json_of_a_sweep_without_them_has_empty_lists(tmp_path):
    doc = _report_json(_warehouse(tmp_path, with_sections=False))
    assert doc["sla_searches"] == [] and doc["window_diagnoses"] == [] and doc["window_findings"] == []
