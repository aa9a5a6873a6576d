"""benchmarks/aa_anchored_report.py on the committed H200 A/A with an anchor (evidence/h200-2026-12-03-aa-anchored):
the across-sweep rows go through the recorded anchor (fixed sweep effects), every row carries the plain Welch
interval on boot means, and the comparison the issue asks for (twin in sweep 2 against twin in sweep 1) calls
nothing and confirms no regression."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "evidence" / "h200-2026-12-03-aa-anchored"


@pytest.fixture(scope="module")
def text():
    spec = importlib.util.spec_from_file_location("aa_anchored_report", ROOT / "benchmarks" / "aa_anchored_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.tables(FOLDER)


def test_across_sweeps_is_anchored_and_calls_nothing(text):
    across = text.split("### across sweeps")[1].split("###")[0]
    rows = [ln for ln in across.splitlines() if ln.startswith("| ") and "c=" in ln]
    assert len(rows) == 16  # 4 metrics x 4 cells
    assert all("(fixed sweep effects)" in r for r in rows)  # through the anchor, not unanchored
    assert all(r.split("|")[7].strip().startswith("no significant change") for r in rows)
    assert "confirmed regressions (what raises the Prefect state Regression): none" in across


def test_every_row_has_welch_beside_it_and_false_calls_are_counted(text):
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "c=" in ln]
    assert len(rows) == 48 and all("(" in r.split("|")[8] for r in rows)  # Welch: difference (relative)
    assert "| across sweeps: twin in sweep 2 vs twin in sweep 1 | anchored | 16 | 0 |" in text
