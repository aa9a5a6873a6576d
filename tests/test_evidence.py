"""The committed H200 evidence re-creates its report from the Parquet files (tunelab.reports.evidence), including the
cross-version A/B and the not-applied case on real data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import duckdb

from tunelab.reports.evidence import evidence_report

REPO = Path(__file__).resolve().parent.parent
VERSIONS = REPO / "evidence" / "h200-2026-11-29-versions"


def _section(report: str, title: str) -> str:
    start = report.index(f"### {title}\n")
    nxt = report.find("\n### ", start + 1)
    return report[start: nxt if nxt > 0 else None]


def test_versions_evidence_report_is_recreated_from_parquet(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(VERSIONS / "warehouse", run / "warehouse")
    db = tmp_path / "w.duckdb"
    report = evidence_report(run, keep_db=db).read_text()

    # 16 boots, every one with a compile-cache record; the four 0.21.0 fastokens boots did not apply the variable
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("""SELECT runtime_name, config_label, count(*), count(compile_cache),
                                 count(*) FILTER (WHERE json_array_length(env_not_applied) > 0)
                          FROM trials GROUP BY ALL ORDER BY ALL""").fetchall()
    con.close()
    assert rows == [("gpu-0.21.0", "VLLM_USE_FASTOKENS=1", 4, 4, 4), ("gpu-0.21.0", "default", 4, 4, 0),
                    ("gpu-0.25.1", "VLLM_USE_FASTOKENS=1", 4, 4, 0), ("gpu-0.25.1", "default", 4, 4, 0)]

    # within 0.21.0 the setting was never applied: every cell is not_applied, none gets an effect verdict
    s = _section(report, "VLLM_USE_FASTOKENS=1 vs default on gpu-0.21.0")
    verdicts = re.findall(r"\*\*([a-z_]+)\*\*", s)
    # 12 rows, each with its per-cell verdict and its headline (the family-adjusted verdict, stats.family)
    assert len(verdicts) == 2 * 12 and set(verdicts) == {"not_applied"}
    # on 0.25.1 it was applied: ordinary verdicts
    s = _section(report, "VLLM_USE_FASTOKENS=1 vs default on gpu-0.25.1")
    assert "not_applied" not in s and len(re.findall(r"\*\*([a-z_]+)\*\*", s)) == 2 * 12
    # across releases, the same config, 4 vs 4 boots; the long-prompt c=32 throughput row is 'better'
    s = _section(report, "default: gpu-0.25.1 vs gpu-0.21.0")
    row = next(line for line in s.splitlines() if line.startswith("| long_summary | c=32 ") and "4 vs 4" in line)
    assert "**better**" in row
    assert "VLLM_USE_FASTOKENS=1 (not applied: VLLM_USE_FASTOKENS)" in report
    # two releases: the across-versions plots are written and linked
    for m in ("output_tokens_per_s", "ttft_p50_s"):
        assert (run / f"version_{m}.png").stat().st_size > 10_000 and f"(version_{m}.png)" in report


def test_evidence_report_reads_the_folder_tunelab_export_wrote(tmp_path):
    """`tunelab export --out DIR` writes DIR/*.parquet; `tunelab evidence-report DIR` reads it as it is (a fresh
    user's export then report on one folder failed with "no <table>.parquet files in DIR/warehouse")."""
    flat = tmp_path / "export"
    shutil.copytree(VERSIONS / "warehouse", flat)
    report = evidence_report(flat).read_text()
    nested = tmp_path / "run"
    shutil.copytree(VERSIONS / "warehouse", nested / "warehouse")
    assert report == evidence_report(nested).read_text() and "VLLM_USE_FASTOKENS=1 vs default" in report
