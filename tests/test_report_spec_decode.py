"""Speculative-decoding acceptance next to TPOT in the sweep report (issue 16, item 7): the comparison frame sums the
windows' spec-decode counter deltas (server_metrics) per config/workload/load level; the terminal table, the markdown
(artifact and HTML) and `report --json` show the acceptance rate and mean acceptance length only when some row has
them. Synthetic warehouse, no server."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SWEEP = "20260201T000000Z-syn-spec"

# (replicate, repeat) -> (drafts, draft_tokens, accepted_tokens) of the window of config "spec"; sums over the four
# windows: drafts 400, draft tokens 1200, accepted 780 -> rate 0.65, mean length 1 + 780/400 = 2.95 (the ratio of
# sums, as vLLM's cumulative counters give; the mean of the per-window ratios would be 0.675 and 3.025).
WINDOWS = {(0, 0): (100, 300, 150), (0, 1): (50, 150, 120), (1, 0): (150, 450, 270), (1, 1): (100, 300, 240)}


def _spec_rows(trial_id: str, replicate: int) -> pd.DataFrame:
    rows = []
    for rep in (0, 1):  # synthetic_trial numbers its repeats from 0
        for metric, v in zip(("spec_decode_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens"),
                             WINDOWS[(replicate, rep)]):
            rows.append({"trial_id": trial_id, "workload": "chat", "load_kind": "concurrency", "load_value": 4.0,
                         "repeat": rep, "metric": metric, "kind": "counter_delta", "value": float(v),
                         "count": None, "sum": None, "null_reason": None,
                         "source_name": f"vllm:{metric.replace('spec_decode_', 'spec_decode_num_')}_total"})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    """One sweep: config "spec" (2 boots x 2 repeats, spec-decode server_metrics rows) and config "base" (none)."""
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    tmp = tmp_path_factory.mktemp("wh")
    res, db = tmp / "results", tmp / "wh.duckdb"
    rng = np.random.default_rng(7)
    t0 = dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc)
    for key in ("base", "spec"):
        for rep in range(2):
            s = synthetic_trial(sweep_id=SWEEP, config_key=key, replicate=rep, config_label=f"cfg-{key}",
                                repeats=2, started_at=t0, rng=rng)
            if key == "spec":
                s.tables["server_metrics"] = _spec_rows(s.trial["trial_id"], rep)
            write_bundle(res, s.sweep, s.trial, s.tables)
    load_pending(db, res)
    return db


def test_frame_sums_the_windows_deltas(warehouse):
    from tunelab.reports.report import comparison_frame

    df = comparison_frame(warehouse, SWEEP).set_index("config")
    assert len(df) == 2 and df.loc["cfg-spec", "repeats"] == 4  # the join did not multiply measurements
    assert df.loc["cfg-spec", "spec_acceptance_rate"] == pytest.approx(780 / 1200)
    assert df.loc["cfg-spec", "spec_mean_acceptance_length"] == pytest.approx(1 + 780 / 400)
    assert pd.isna(df.loc["cfg-base", "spec_acceptance_rate"])
    assert pd.isna(df.loc["cfg-base", "spec_mean_acceptance_length"])


def _header_and_row(md: str, config: str) -> tuple[list[str], list[str]]:
    lat = md.split("### Latency", 1)[1].splitlines()
    table = [ln for ln in lat if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in table]
    return cells[0], next(c for c in cells if c[0] == config)


def test_markdown_shows_both_figures_right_after_tpot(warehouse):
    from tunelab.reports.report import comparison_frame, comparison_markdown

    md = comparison_markdown(comparison_frame(warehouse, SWEEP), SWEEP)
    header, row = _header_and_row(md, "cfg-spec")
    i = header.index("TPOT p50 ms")
    assert header[i + 1:i + 3] == ["spec accept rate", "spec accept len"]
    assert row[i + 1:i + 3] == ["65.0%", "2.95"]
    assert _header_and_row(md, "cfg-base")[1][i + 1:i + 3] == ["-", "-"]


def test_no_spec_columns_without_spec_decode_rows(warehouse):
    from tunelab.reports.report import comparison_frame, comparison_markdown, print_comparison

    df = comparison_frame(warehouse, SWEEP)
    df = df[df["config"] == "cfg-base"]
    md = comparison_markdown(df, SWEEP)
    assert "TPOT p50 ms" in md and "spec accept" not in md
    header, _ = _header_and_row(md, "cfg-base")
    assert header[header.index("TPOT p50 ms") + 1] == "ITL p50 ms"


def test_terminal_table_json_and_html_show_them(warehouse, tmp_path):
    from typer.testing import CliRunner

    from tunelab.cli import app

    r = CliRunner().invoke(app, ["report", "--sweep", SWEEP, "--db", str(warehouse)], terminal_width=200)
    assert r.exit_code == 0, r.output
    head = next(ln for ln in r.output.splitlines() if "TPOT" in ln)
    # A header may wrap over two lines (the table grew a failed % column); its columns stay aligned.
    spec_head = next(ln for ln in r.output.splitlines() if "spec accept" in ln)
    assert head.index("TPOT") < spec_head.index("spec accept") < head.index("ITL")
    spec_line = next(ln for ln in r.output.splitlines() if "cfg-spec" in ln)
    assert "65.0%" in spec_line and "2.95" in spec_line

    r = CliRunner().invoke(app, ["report", "--sweep", SWEEP, "--db", str(warehouse), "--json"])
    assert r.exit_code == 0, r.output
    rows = {c["config"]: c for c in json.loads(r.output)["comparison"]}
    assert rows["cfg-spec"]["spec_acceptance_rate"] == pytest.approx(0.65)
    assert rows["cfg-spec"]["spec_mean_acceptance_length"] == pytest.approx(2.95)
    assert rows["cfg-base"]["spec_acceptance_rate"] is None

    from tunelab.reports.html import sweep_html

    html = sweep_html(warehouse, SWEEP)
    assert "spec accept rate" in html and "65.0%" in html and "2.95" in html
