"""Reports from a synthetic warehouse: quality summary, per-trial table, sweep markdown, A/B markdown, plots and
`tunelab report --plots`. No server, no Prefect API."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
SWEEP = "20260101T000000Z-syn-0001"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    """One sweep, 2 configs x 2 boots at two load levels, plus a boot failure, with known verdicts and checks;
    and a second sweep on another vLLM version for the version plot."""
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    tmp = tmp_path_factory.mktemp("wh")
    res, db = tmp / "results", tmp / "wh.duckdb"
    rng = np.random.default_rng(3)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    verdicts = {("a", 0): "pass", ("a", 1): "warn", ("b", 0): "fail", ("b", 1): "pass"}
    for (key, rep), verdict in verdicts.items():
        s = synthetic_trial(sweep_id=SWEEP, config_key=key, replicate=rep, config_label=f"cfg-{key}",
                            loads=(("concurrency", 1.0), ("concurrency", 4.0)), effect_rel=0.2 if key == "b" else 0,
                            quality_verdict=verdict, started_at=t0, rng=rng)
        tid = s.trial["trial_id"]
        checks = [{"trial_id": tid, "suite": "requests", "expectation": "no_failed_requests", "success": True,
                   "severity": "fail", "observed": "0", "threshold": "0"}]
        if verdict == "warn":
            checks.append({"trial_id": tid, "suite": "measurements", "expectation": "repeat_cv_small",
                           "success": False, "severity": "warn", "observed": "0.31", "threshold": "<= 0.1",
                           "detail": "failing: chat/concurrency/4/1"})
        if verdict == "fail":
            checks.append({"trial_id": tid, "suite": "requests", "expectation": "output_length_exact",
                           "success": False, "severity": "fail", "observed": "7", "threshold": "== 8"})
        s.tables["quality_checks"] = pd.DataFrame(checks)
        write_bundle(res, s.sweep, s.trial, s.tables)
    bad = synthetic_trial(sweep_id=SWEEP, config_key="c", config_label="cfg-c", started_at=t0, rng=rng,
                          status="boot_failed", quality_verdict="unvalidated")
    bad.trial.update(failure_class="oom_kv_cache", failure_reason="No available memory for the cache blocks")
    write_bundle(res, bad.sweep, bad.trial, {})
    for key in ("a", "b"):
        for rep in range(2):
            s = synthetic_trial(sweep_id="20260108T000000Z-syn-0002", config_key=key, replicate=rep,
                                config_label=f"cfg-{key}", vllm_version="0.33.0", started_at=t0 + dt.timedelta(days=7),
                                rng=rng)
            write_bundle(res, s.sweep, s.trial, s.tables)
    load_pending(db, res)
    return db


def test_quality_summary_counts_and_reasons(warehouse):
    from tunelab.reports.report import quality_summary, sweep_quality_markdown

    q = quality_summary(warehouse, SWEEP)
    assert q["counts"] == {"pass": 2, "warn": 1, "fail": 1, "unvalidated": 1}
    reasons = q["reasons"].set_index("expectation")
    assert set(reasons.index) == {"repeat_cv_small", "output_length_exact"}
    assert reasons.loc["output_length_exact", "severity"] == "fail" and reasons.loc["repeat_cv_small", "trials"] == 1
    # each check once, naming its trials (the check's outcome is its severity, worded by quality_check_lines)
    assert reasons.loc["output_length_exact", "which"] == "cfg-b r0"
    assert reasons.loc["repeat_cv_small", "which"] == "cfg-a r1"
    assert list(q["unvalidated"]["failure_class"]) == ["oom_kv_cache"]
    md = sweep_quality_markdown(q)
    assert "**fail** 1" in md and "output_length_exact" in md and "oom_kv_cache" in md


def test_a_warn_check_in_a_failed_trial_reads_as_a_warning(tmp_path):
    """A trial that one fail check failed and one warn check warned: the warn check's line says it warned and
    carries no 'fail' (the trial's verdict beside it read as if the warn check had failed the trial)."""
    from tunelab.core.bundle import write_bundle
    from tunelab.reports.report import quality_check_lines, quality_summary
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    res, db = tmp_path / "results", tmp_path / "wh.duckdb"
    s = synthetic_trial(sweep_id=SWEEP, config_key="a", replicate=0, config_label="cfg-a", quality_verdict="fail",
                        started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), rng=np.random.default_rng(5))
    tid = s.trial["trial_id"]
    s.tables["quality_checks"] = pd.DataFrame([
        {"trial_id": tid, "suite": "measurements", "expectation": "repeat_cv_small", "success": False,
         "severity": "warn", "observed": "0.31", "threshold": "<= 0.1"},
        {"trial_id": tid, "suite": "requests", "expectation": "output_length_exact", "success": False,
         "severity": "fail", "observed": "7", "threshold": "== 8"}])
    write_bundle(res, s.sweep, s.trial, s.tables)
    load_pending(db, res)
    lines = quality_check_lines(quality_summary(db, SWEEP))
    warn = [x for x in lines if "repeat_cv_small" in x]
    hard = [x for x in lines if "output_length_exact" in x]
    assert len(warn) == 1 and len(hard) == 1
    assert " warned (severity warn) in 1 trial(s): cfg-a r0;" in warn[0] and "fail" not in warn[0]
    assert " failed (severity fail) in 1 trial(s): cfg-a r0;" in hard[0]


def test_sweep_markdown_has_trials_quality_comparison_and_plots(warehouse, tmp_path):
    from tunelab.reports.report import comparison_frame, quality_summary, sweep_markdown

    comp = comparison_frame(warehouse, SWEEP)
    statuses = [{"trial_id": f"{SWEEP}/synthetic/a/r0", "config": "cfg-a", "config_key": "a", "runtime": "synthetic",
                 "replicate": 0, "device": "gpu1", "status": "ok", "boot_s": 30.2, "compile_cache": "warm",
                 "verdict": "pass"}]
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    md = sweep_markdown(comp, SWEEP, statuses, quality_summary(warehouse, SWEEP), plots=[png], interleave="shuffle",
                        config_settings={"a": "--enforce-eager --max-model-len 2048"})
    assert "shuffle" in md and "| gpu1 |" in md and "## Quality" in md and "c=4" in md
    # the plot is embedded (a data URI shows in the Prefect UI; a file:// link opened nothing there)
    assert "](data:image/png;base64," in md and "file://" not in md and f"`{png}`" in md
    assert md.count("cfg-b") >= 4  # two load levels of config b, in the throughput and the latency table
    # the config key with its full settings, next to the label
    assert "| `a` | cfg-a | `--enforce-eager --max-model-len 2048` |" in md
    # no table wider than 11 columns (the Prefect UI cut a 13-column comparison at 1600 px)
    assert max(line.count("|") - 1 for line in md.splitlines() if line.startswith("|")) <= 11


def test_settings_text_and_shorten():
    from tunelab.core.markdown import shorten
    from tunelab.reports.report import settings_text

    assert settings_text('{"max-model-len": 2048, "enforce-eager": true, "dtype": "bfloat16", "x": false}',
                         {"VLLM_USE_FASTOKENS": "1"}) == \
        "--dtype bfloat16 --enforce-eager --max-model-len 2048; env VLLM_USE_FASTOKENS=1"
    assert settings_text({}, {}) == "(vLLM defaults)"
    reason = "ValueError: User-specified max_model_len (99999) is greater than the derived max_model_len (2048)"
    cut = shorten(reason, 60)
    assert len(cut) <= 60 and cut.endswith(" …") and reason.startswith(cut[:-2])
    assert cut[:-2].split()[-1] in reason.split()  # ends on a whole word
    assert shorten("a\n\nb   c", 60) == "a b c" and shorten(None) == ""


def test_trial_table_rows(warehouse):
    from tunelab.core.bundle import list_bundles, read_bundle
    from tunelab.reports.report import trial_table

    res = warehouse.parent / "results"
    by_key = {}
    for b in list_bundles(res):
        t = read_bundle(b)
        by_key[t["trial"]["trial_id"].iloc[0]] = t
    rows = trial_table(by_key[f"{SWEEP}/synthetic/a/r0"])
    assert len(rows) == 2 * 3  # 2 load levels x 3 repeats
    assert {r["load"] for r in rows} == {"c=1", "c=4"} and all(float(r["output tok/s"]) > 0 for r in rows)
    # one row per window with only the window's columns: the trial's facts are in the description
    assert set(rows[0]) == {"workload", "load", "repeat", "output tok/s", "TTFT p50 ms", "TPOT p50 ms", "ITL p50 ms",
                            "E2EL p95 ms", "completed", "failed"}
    failed = trial_table(by_key[f"{SWEEP}/synthetic/c/r0"])
    assert len(failed) == 1 and failed[0]["status"] == "boot_failed" and "oom_kv_cache" in failed[0]["failure"]


def test_trial_facts_and_trials_table(warehouse):
    from tunelab.core.bundle import list_bundles, read_bundle
    from tunelab.reports.report import trial_facts_markdown, trials_table

    tables = {read_bundle(b)["trial"]["trial_id"].iloc[0]: read_bundle(b) for b in list_bundles(warehouse.parent / "results")}
    facts = trial_facts_markdown(tables[f"{SWEEP}/synthetic/c/r0"])
    assert "key `c`" in facts and "**boot_failed** (oom_kv_cache" in facts and "vLLM" in facts
    rows = trials_table([{"trial_id": "s/x", "config": "eager", "config_key": "k1", "replicate": 0, "device": "cpu0",
                          "status": "ok", "failure_class": None, "boot_s": 23.456789, "compile_cache": "warm",
                          "verdict": "pass", "measurement_notes": "w1: client-bound\nw2: client-bound\n"}])
    assert rows == [{"#": "1", "config": "eager", "key": "k1", "boot": "r0", "device": "cpu0", "status": "ok",
                     "failure": "", "boot s": "23.5", "compile cache": "warm", "verdict": "pass", "notes": "2"}]


def _ab_of(warehouse, ab_markdown):
    """``compare()`` of config a against b in the fixture's sweep (every quality verdict) and its markdown."""
    from tunelab.warehouse.compare import compare
    from tunelab.warehouse.migrate import connect

    con = connect(warehouse, read_only=True)
    try:
        df = compare(con, {"config_key": "a", "sweep_id": SWEEP}, {"config_key": "b", "sweep_id": SWEEP},
                     quality=("pass", "warn", "fail"))
    finally:
        con.close()
    return df, ab_markdown(df, {"config_key": "a"}, {"config_key": "b"})


def test_ab_markdown_from_compare(warehouse):
    from tunelab.reports.report import ab_markdown
    df, md = _ab_of(warehouse, ab_markdown)
    assert "`config_key=a`" in md and "c=4" in md and "2 vs 2" in md
    assert any(v in md for v in ("**better**", "**no_significant_change**", "**worse**"))
    # every verdict states its resolution: the MDE column holds a percentage for each row
    header = next(line for line in md.splitlines() if "verdict" in line and "MDE" in line)
    col = [c.strip() for c in header.split("|")].index("MDE")
    table = [line for line in md.splitlines() if line.startswith("|")]
    rows = table[table.index(header) + 2:]
    assert rows and all(re.fullmatch(r"-\d+\.\d%/\+\d+\.\d%", [c.strip() for c in r.split("|")][col]) for r in rows)


def test_the_compare_table_shows_the_plain_welch_interval_beside_the_products(warehouse):
    """`tunelab compare` prints ab_markdown: a column 'Welch on boot means' (the ABRecord's welch_ci_low/high, in
    the metric's unit) beside CI, as the A/B lines give it."""
    from tunelab.reports.report import ab_markdown
    df, md = _ab_of(warehouse, ab_markdown)
    header = next(line for line in md.splitlines() if "verdict" in line and "CI" in line)
    cols = [c.strip() for c in header.split("|")]
    # the column names its unit (found by a fresh user: two 'Welch' columns, one in tokens/s and one in %)
    name = f"Welch on boot means (tokens/s)" if df["metric"].iloc[0].endswith("tokens_per_s") else None
    assert name is not None and cols.index(name) == cols.index("CI") + 1, cols
    table = [line for line in md.splitlines() if line.startswith("|")]
    rows = [[c.strip() for c in r.split("|")] for r in table[table.index(header) + 2:]]
    assert len(rows) == len(df)
    for r, rec in zip(rows, df.itertuples(index=False)):
        assert r[cols.index(name)] == f"[{rec.welch_ci_low:+.4g}, {rec.welch_ci_high:+.4g}]"
    assert "Welch on boot means: the plain Welch t interval of candidate - baseline" in md


def test_plots_are_pngs(warehouse, tmp_path):
    from tunelab.reports.plots import latency_throughput_plot, version_plot

    p = latency_throughput_plot(warehouse, SWEEP, tmp_path)
    assert p and p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 5000
    v = version_plot(warehouse, tmp_path, "ttft_p50_s", quality=("pass", "warn", "fail"))
    assert v and v.name == "version_ttft_p50_s.png" and v.read_bytes()[:4] == b"\x89PNG"
    assert latency_throughput_plot(warehouse, "no-such-sweep", tmp_path) is None
    with pytest.raises(ValueError, match="latency"):
        latency_throughput_plot(warehouse, SWEEP, tmp_path, latency="ttft")
    with pytest.raises(ValueError, match="not comparable"):
        version_plot(warehouse, tmp_path, "trial_id; DROP TABLE trials")


def test_report_cli_writes_plots(warehouse, tmp_path):
    out = tmp_path / "plots"
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "report", "--sweep", SWEEP, "--db", str(warehouse),
                        "--plots", str(out)], cwd=REPO, env=dict(os.environ, COLUMNS="200"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == [f"latency_throughput_{SWEEP}.png", "version_output_tokens_per_s.png"]
    assert "cfg-a" in r.stdout and str(out) in r.stdout.replace("\n", "")


def test_config_cell_marks_env_not_applied():
    from tunelab.reports.report import _fmt_row

    row = pd.Series({"runtime": "gpu-0.21.0", "config": "VLLM_USE_FASTOKENS=1", "workload": "w",
                     "load_kind": "concurrency", "load_value": 1.0, "boots": 2, "repeats": 4,
                     "output_tokens_per_s": 1.0, "output_tps_cv": 0.1, "ttft_p50_s": 0.01, "tpot_p50_s": 0.01,
                     "itl_p50_s": 0.01, "e2el_p95_s": 0.1, "failed_requests": 0, "quality": "pass",
                     "env_not_applied": '["VLLM_USE_FASTOKENS"]'})
    assert _fmt_row(row)["config"] == "VLLM_USE_FASTOKENS=1 (not applied: VLLM_USE_FASTOKENS)"
    assert _fmt_row(row.drop("env_not_applied"))["config"] == "VLLM_USE_FASTOKENS=1"
    assert _fmt_row(pd.Series({**row.to_dict(), "env_not_applied": None}))["config"] == "VLLM_USE_FASTOKENS=1"


def _embedded_pngs(page: str) -> list[bytes]:
    import base64
    import re

    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_sweep_html_is_one_self_contained_file(warehouse, tmp_path):
    from typer.testing import CliRunner

    from tunelab.cli import app

    out = tmp_path / "sweep.html"
    r = CliRunner().invoke(app, ["report", "--sweep", SWEEP, "--db", str(warehouse), "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    pngs = _embedded_pngs(page)
    assert len(pngs) >= 1 and all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)  # latency vs throughput (+ versions)
    # nothing to fetch: no script, no link to a file or a server, every image inline
    assert "<script" not in page and "file://" not in page and 'src="http' not in page
    assert page.count("<table>") >= 4 and '<div class="table-wrap"><table>' in page  # wide tables scroll
    assert "cfg-a" in page and "oom_kv_cache" in page and "Failed trials (whole reasons)" in page
    assert "Config keys" in page and "<h3>Latency (ms)</h3>" in page


def test_compare_html_has_the_table_and_the_change_chart(warehouse, tmp_path):
    from tunelab.reports.html import compare_html
    from tunelab.reports.report import ab_markdown
    from tunelab.warehouse.compare import compare
    from tunelab.warehouse.migrate import connect

    con = connect(warehouse, read_only=True)
    try:
        df = compare(con, {"config_key": "a", "sweep_id": SWEEP}, {"config_key": "b", "sweep_id": SWEEP},
                     quality=("pass", "warn", "fail"))
    finally:
        con.close()
    result = {"rows": df.to_dict("records"), "markdown": ab_markdown(df, {"config_key": "a"}, {"config_key": "b"}),
              "baseline": {"config_key": "a"}, "candidate": {"config_key": "b"}}
    page = compare_html(result)
    assert "<title>tunelab compare: config_key=b vs config_key=a</title>" in page
    assert "<table>" in page and "c=4" in page and len(_embedded_pngs(page)) == 1
    assert "<script" not in page
    # markdown's raw HTML is escaped, not passed through
    result["markdown"] += "\n\n<script>alert(1)</script>"
    assert "<script>" not in compare_html(result)


def test_quality_cells_end_on_whole_words(warehouse):
    from tunelab.reports.report import quality_summary, sweep_quality_markdown

    q = quality_summary(warehouse, SWEEP)
    long = "word " * 60  # 300 characters of whole words
    q["reasons"] = q["reasons"].assign(detail=long + "tail", observed="observed " * 20)
    q["unvalidated"] = q["unvalidated"].assign(failure_reason="reason " * 40)
    md = sweep_quality_markdown(q)
    cells = [c.strip() for line in md.splitlines() if line.startswith("|") for c in line.split("|")]
    cut = [c for c in cells if c.endswith("…")]
    assert cut and all(c[:-1].strip().split()[-1] in ("word", "observed", "reason") for c in cut), cut
    # narrow tables: the Prefect UI does not wrap cells
    assert max(line.count("|") - 1 for line in md.splitlines() if line.startswith("|")) <= 5
    assert max(len(c) for c in cells) <= 100


def test_a_plain_sweep_with_an_slo_shows_goodput_and_the_share_in_slo(tmp_path, capsys):
    """A plan's ``slo:`` in a plain sweep (no sla_search): the comparison shows goodput and the share of completed
    requests that met every bound (goodput / request throughput, a ratio of sums of counts over windows), with the
    plan's bounds in a legend; a sweep without an slo shows neither."""
    from tunelab.core.bundle import write_bundle
    from tunelab.reports.report import comparison_frame, comparison_markdown, print_comparison
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    res, db, sweep = tmp_path / "results", tmp_path / "wh.duckdb", "20260102T000000Z-slo-0001"
    rng = np.random.default_rng(5)
    good_share = {"a": 0.9, "b": 0.5}
    for key, share in good_share.items():
        s = synthetic_trial(sweep_id=sweep, config_key=key, config_label=f"cfg-{key}", rng=rng)
        s.sweep["plan_yaml"] = "name: slo\nslo:\n  ttft_s: 0.5\n  tpot_s: 0.05\n"
        m = s.tables["measurements"]
        m["steady_state"], m["steady_s"] = False, None  # counted over the whole window
        m["request_throughput_per_s"] = 100 / m["duration_s"]
        m.loc[m.index[0], "request_throughput_per_s"] = 300 / m.loc[m.index[0], "duration_s"]  # a larger window
        m["goodput_per_s"] = share * m["request_throughput_per_s"]
        m.loc[m.index[0], "goodput_per_s"] = 0.0  # ... with nothing in the SLO: a ratio of sums, not of means
        write_bundle(res, s.sweep, s.trial, s.tables)
    load_pending(db, res)
    comp = comparison_frame(db, sweep).set_index("config")
    n = len(m)  # windows per config: one of 300 completed requests with none good, the rest of 100 at the share
    for key, share in good_share.items():
        assert comp.loc[f"cfg-{key}", "slo_attainment"] == pytest.approx(share * 100 * (n - 1) / (300 + 100 * (n - 1)))
    assert comp.attrs["slo"] == {"ttft_s": 0.5, "tpot_s": 0.05}
    print_comparison(comparison_frame(db, sweep), title="t")
    out = capsys.readouterr().out
    assert "TTFT <= 500 ms, TPOT <= 50 ms" in out and "goodput req/s" in out and "in SLO" in out
    assert f"{comp.loc['cfg-a', 'slo_attainment'] * 100:.0f}%" in out and "no completed request met" not in out
    md = comparison_markdown(comparison_frame(db, sweep), sweep)
    assert "| in SLO |" in md and "TTFT <= 500 ms" in md
    assert max(line.count("|") - 1 for line in md.splitlines() if line.startswith("|")) <= 11


def test_a_sweep_without_an_slo_shows_no_goodput_columns(warehouse, capsys):
    from tunelab.reports.report import comparison_frame, comparison_markdown, print_comparison

    comp = comparison_frame(warehouse, SWEEP)
    assert comp["goodput_per_s"].isna().all()
    print_comparison(comp, title="t")
    assert "in SLO" not in capsys.readouterr().out and "in SLO" not in comparison_markdown(comp, SWEEP)


def test_an_slo_no_request_met_is_said_in_words(tmp_path, capsys):
    from tunelab.core.bundle import write_bundle
    from tunelab.reports.report import comparison_frame, print_comparison
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    res, db, sweep = tmp_path / "results", tmp_path / "wh.duckdb", "20260102T000000Z-slo-0002"
    s = synthetic_trial(sweep_id=sweep, config_key="a", config_label="cfg-a")
    s.sweep["plan_yaml"] = "name: slo\nslo:\n  ttft_s: 0.000001\n"
    s.tables["measurements"]["goodput_per_s"] = 0.0
    write_bundle(res, s.sweep, s.trial, s.tables)
    load_pending(db, res)
    print_comparison(comparison_frame(db, sweep), title="t")
    out = " ".join(capsys.readouterr().out.split())
    assert "TTFT <= 0.001 ms" in out and "no completed request met the slo: at any config and load" in out


def test_latency_is_labelled_ok_only_with_the_failed_share_beside_it_and_goodput_as_a_percentage(tmp_path, capsys):
    """Issue 29 (also build): a config that fails a quarter of its requests must not read as fast: its latency
    percentiles say they are over the completed requests only, the failed share sits beside them, and goodput is
    also given as a share of every request sent (failed ones are not good), beside goodput/s."""
    from tunelab.core.bundle import write_bundle
    from tunelab.reports.report import comparison_frame, comparison_markdown, print_comparison
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    res, db, sweep = tmp_path / "results", tmp_path / "wh.duckdb", "20260103T000000Z-err-0001"
    rng = np.random.default_rng(7)
    for key, failed in (("a", 0), ("b", 25)):
        s = synthetic_trial(sweep_id=sweep, config_key=key, config_label=f"cfg-{key}", rng=rng)
        s.sweep["plan_yaml"] = "name: err\nslo:\n  ttft_s: 0.5\n"
        m = s.tables["measurements"]
        m["steady_state"], m["steady_s"] = False, None
        m["completed"], m["failed"] = 75 if failed else 100, failed
        m["request_throughput_per_s"] = m["completed"] / m["duration_s"]
        m["goodput_per_s"] = 0.8 * m["request_throughput_per_s"]  # 80 % of the completed ones met the SLO
        write_bundle(res, s.sweep, s.trial, s.tables)
    load_pending(db, res)
    comp = comparison_frame(db, sweep)
    print_comparison(comp, title="t")
    out = capsys.readouterr().out
    # the terminal table wraps its headers: the label is under each of the four latency columns
    assert out.count("(OK only)") >= 5 and "latency columns (OK only)" in out
    assert "failed %" in out and "goodput %" in out
    row_b = next(ln for ln in out.splitlines() if "cfg-b" in ln)
    assert "25.0%" in row_b and "60%" in row_b and "80%" in row_b  # failed share; goodput 0.8 x 75/100; in SLO
    row_a = next(ln for ln in out.splitlines() if "cfg-a" in ln)
    assert "0.0%" in row_a
    md = comparison_markdown(comp, sweep)
    assert "| TTFT p50 ms (OK only) |" in md and "failed %" in md and "| goodput % |" in md
    assert "percentiles over the completed requests only" in md


def test_the_ab_artifact_leads_with_verdict_and_reason_in_narrow_tables(warehouse):
    """Issue 29 item 13: the `ab-comparison` artifact was one 3,585 px table whose verdict and reason were the last
    columns, off screen in the Prefect UI (cells do not wrap). It leads with a 4-column table of verdict, change
    and reason, puts the means, boots and MDE in a second table, and keeps whole reasons as a list below."""
    from tunelab.reports.artifacts import REASON_CHARS, ab_artifact_markdown
    from tunelab.reports.report import ab_markdown, regressions_markdown
    from tunelab.warehouse.compare import compare, regressions
    from tunelab.warehouse.migrate import connect

    con = connect(warehouse, read_only=True)
    try:
        df = compare(con, {"config_key": "a", "sweep_id": SWEEP}, {"config_key": "b", "sweep_id": SWEEP},
                     quality=("pass", "warn", "fail"))
        reg = regressions(con, "output_tokens_per_s")
    finally:
        con.close()
    df.loc[df.index[0], "reason"] = "a long reason " * 20 + "END"
    md = ab_markdown(df, {"config_key": "a"}, {"config_key": "b"}) + "\n\n" + regressions_markdown(reg)
    art = ab_artifact_markdown(df, md)
    tables: list[list[str]] = []
    for ln in art.splitlines():
        if ln.startswith("|"):
            if not tables or not prev.startswith("|"):
                tables.append([])
            tables[-1].append(ln)
        prev = ln
    first = [c.strip() for c in tables[0][0].strip("|").split("|")]
    assert first[1] == "verdict" and first[3] == "why" and len(first) == 4
    assert [c.strip() for c in tables[1][0].strip("|").split("|")] == ["what", "baseline", "candidate", "boots", "MDE"]
    assert art.index("## Verdicts") < art.index("## Detail") < art.index("Method:")
    assert "Regressions along vLLM versions" in art  # what followed the wide table is kept
    cells = [c.strip() for ln in tables[0][2:] for c in ln.strip("|").split("|")]
    assert max(len(c) for c in cells) <= REASON_CHARS + 2 and "END" in art.split("Reasons in full:")[1]
    for t in tables[:2]:  # what fits a 1,028 px frame: about 150 characters of a row
        assert max(len(ln) for ln in t) <= 150, t


def test_the_sweep_report_artifact_shows_the_failure_cause_in_a_narrow_first_table(warehouse):
    """Issue 29 item 13: the report artifact's trial table (11 columns) cut the failure cause: only its class
    showed. The first table is the outcome (config, status, why: class and the reason cut at a word boundary,
    verdict); where and how each boot ran is a second table."""
    from tunelab.reports.report import sweep_markdown

    reason = "vllm serve exited with code 1 during boot: ValueError: max_model_len 99999 is too large " * 3
    statuses = [{"trial_id": f"{SWEEP}/synthetic/c/r0", "config": "cfg-c", "config_key": "c", "runtime": "synthetic",
                 "replicate": 0, "device": "gpu0", "status": "boot_failed", "failure_class": "invalid_config",
                 "failure_reason": reason, "boot_s": 3.0, "compile_cache": "cold", "verdict": "unvalidated"}]
    md = sweep_markdown(pd.DataFrame(), SWEEP, statuses, None)
    header = next(ln for ln in md.splitlines() if ln.startswith("|"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["#", "config", "status", "why", "verdict"]
    row = next(ln for ln in md.splitlines() if "cfg-c" in ln)
    assert "invalid_config: vllm serve exited with code 1 during boot: ValueError" in row and len(row) <= 150
    assert "| gpu0 |" in md and "| cold |" in md


def test_the_terminal_table_never_cuts_the_config_names(warehouse, capsys):
    """Found by a fresh user: with the SLO and failed-request columns the demo's two configs both read
    'max-num-se...' and the rows could not be told apart. The names keep their width; numeric headers wrap."""
    from tunelab.reports.report import comparison_frame, print_comparison

    comp = comparison_frame(warehouse, SWEEP)
    labels = sorted(set(comp["config"]))
    long = {lab: f"max-num-batched-tokens=16384+{lab}" for lab in labels}
    comp["config"] = comp["config"].map(long)
    for col in ("goodput_per_s", "slo_attainment"):  # the wide table of a sweep with an slo:
        comp[col] = 1.0
    comp.attrs["slo"] = {"ttft_s": 0.5}
    print_comparison(comp, title="t")
    out = capsys.readouterr().out
    assert all(name in out for name in long.values()), out
    assert "…" not in "".join(ln for ln in out.splitlines() if "max-num-batched" in ln)


def test_left_out_unvalidated_trials_name_the_recheck_that_judges_them():
    """Found by a fresh user: after a cancelled sweep its finished trials stayed 'unvalidated' and every report left
    them out with nothing saying how to judge them."""
    from tunelab.reports.report import left_out_lines

    lines = left_out_lines([{"config": "a", "replicate": 0, "verdict": None, "failed_checks": None, "sweep_id": "S"},
                            {"config": "b", "replicate": 1, "verdict": "fail", "failed_checks": "x", "sweep_id": "S"}])
    assert lines[0].startswith("left out: a r0 (quality unvalidated: not validated)")
    assert lines[-1].startswith("1 finished trial(s) were never judged") and "`tunelab recheck --sweep S`" in lines[-1]
    assert left_out_lines([{"config": "b", "replicate": 1, "verdict": "fail", "failed_checks": "x"}])[-1].startswith(
        "left out: b r1")


def test_the_terminal_tables_width_fits_the_quality_column(monkeypatch):
    """Found by a fresh user: the comparison table was cut at 200 columns ('pass,wa'), in a pipe or with COLUMNS=300."""
    from tunelab.reports.report import table_width

    monkeypatch.delenv("COLUMNS", raising=False)
    assert table_width() >= 250
    monkeypatch.setenv("COLUMNS", "320")
    assert table_width() == 320
