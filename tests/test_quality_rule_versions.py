"""Quality rules are versioned (issue 28.7): the version is stamped on quality_checks rows, recheck shows the
verdict under the stored version and today's (and under an earlier version's thresholds on request), and the
sweep report names the version that judged it."""

from __future__ import annotations

import subprocess
import sys


import pytest

from test_recheck import _load, _rows, _trial  # the H200 frontend-lag trial the old rule failed
from tunelab.flows.recheck import recheck
from tunelab.core.quality_thresholds import (RULE_VERSIONS, RULES_VERSION, QualityThresholds, rule_version_label,
                                        thresholds_for_version)


def test_todays_defaults_are_the_latest_versions_own():
    # A default changed after data were judged must come with a new RuleVersion (docs/quality.md).
    today = QualityThresholds().model_dump()
    recorded = RULE_VERSIONS[-1].defaults
    changed = {k: (recorded[k], today.get(k)) for k in recorded if today.get(k) != recorded[k]}
    assert not changed, f"defaults changed without a new rule version: {changed}"
    assert [v.version for v in RULE_VERSIONS] == sorted({v.version for v in RULE_VERSIONS})
    assert RULES_VERSION == RULE_VERSIONS[-1].version


def test_thresholds_of_earlier_versions_undo_the_later_changes():
    assert thresholds_for_version(RULES_VERSION) == QualityThresholds()
    v2 = thresholds_for_version(2)
    assert v2.attribute_frontend_lag is False and v2.max_client_cpu_frac == 0.8
    v1 = thresholds_for_version(1)
    assert v1.max_client_cpu_frac == 0.9 and v1.attribute_frontend_lag is False
    # a plan's own threshold stays on top
    assert thresholds_for_version(1, {"max_client_cpu_frac": 0.5}).max_client_cpu_frac == 0.5
    with pytest.raises(ValueError, match="rule version 99: unknown"):
        thresholds_for_version(99)
    assert rule_version_label(None) == "unversioned" and rule_version_label(3) == "v3"


def test_recheck_stamps_todays_version_and_shows_the_verdict_under_an_earlier_one(tmp_path):
    st = _trial("sw1")
    db, _, _ = _load(tmp_path, st)
    (row,) = recheck(db, rules=2)
    # stored rows were judged before versions were stamped; today's rules warn, version 2's strict check fails
    assert row.old_rule_version is None and row.new_rule_version == RULES_VERSION
    assert (row.old_verdict, row.new_verdict, row.rules_version, row.rules_verdict) == ("fail", "warn", 2, "fail")
    assert "server_client_itl_agree" in row.rules_failed
    assert _rows(db, "SELECT DISTINCT rule_version FROM quality_checks") == [(RULES_VERSION,)]
    (again,) = recheck(db)
    assert again.old_rule_version == RULES_VERSION and again.rules_verdict is None and not again.changed
    with pytest.raises(ValueError, match="unknown"):
        recheck(db, rules=99)


def test_cli_recheck_names_both_versions(tmp_path):
    db, _, _ = _load(tmp_path, _trial("sw1"))
    cmd = [sys.executable, "-m", "tunelab.cli", "recheck", "--db", str(db), "--dry-run"]
    r = subprocess.run(cmd + ["--rules", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "verdict fail -> warn" in r.stdout and f"rules unversioned -> v{RULES_VERSION}" in r.stdout
    assert "under rules v2: verdict fail" in r.stdout
    bad = subprocess.run(cmd + ["--rules", "99"], capture_output=True, text=True)
    assert bad.returncode == 2 and "rule version 99" in bad.stdout + bad.stderr


def test_cli_recheck_prints_a_summary_under_the_rules_also_when_nothing_changed(tmp_path):
    """Judged by today's rules, and today's thresholds asked for: no verdict changes, and the command still says
    how many trials it re-judged, how many changed, and under which versions (it printed no 'under rules vN')."""
    from typer.testing import CliRunner

    from tunelab.cli import app

    db, _, _ = _load(tmp_path, _trial("sw1"))
    recheck(db)  # stamped with today's rules: nothing left to change
    r = CliRunner().invoke(app, ["recheck", "--db", str(db), "--dry-run", "--rules", str(RULES_VERSION)])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert (f"1 measured trial(s) re-judged under today's quality rules v{RULES_VERSION}: 0 changed; "
            f"under rules v{RULES_VERSION}: 0 verdict(s) differ from today's") in out
    assert "verdict " not in out.replace("verdict(s)", "")  # no per-trial line: nothing changed


def test_sweep_report_names_the_rule_version(tmp_path):
    from tunelab.reports.report import quality_summary, sweep_quality_markdown

    db, _, _ = _load(tmp_path, _trial("sw1"))
    assert "Judged by quality rules unversioned" in sweep_quality_markdown(quality_summary(db, "sw1"))
    recheck(db)
    q = quality_summary(db, "sw1")
    assert q["rule_versions"] == [RULES_VERSION]
    assert f"Judged by quality rules v{RULES_VERSION}" in sweep_quality_markdown(q)


def test_the_terminal_report_names_the_rule_version(tmp_path):
    """docs/quality.md: a report names the version that judged it; `tunelab report` on a terminal did not."""
    from typer.testing import CliRunner

    from tunelab.cli import app

    db, _, _ = _load(tmp_path, _trial("sw1"))
    recheck(db)
    r = CliRunner().invoke(app, ["report", "--db", str(db), "--sweep", "sw1"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert f"judged by quality rules v{RULES_VERSION} (docs/quality.md, 'Rule versions'" in out
    assert "quality: pass " in out


def test_validate_trial_stamps_the_version(tmp_path):
    from tunelab.core.bundle import read_bundle
    from tunelab.tasks.quality import validate_trial

    st = _trial("sw1")
    _, _, (path,) = _load(tmp_path, st)
    res = validate_trial({**read_bundle(path), "trial": None}, {**st.trial, "status": "ok"})
    assert set(res.checks["rule_version"]) == {RULES_VERSION}
    bad = validate_trial({}, {"trial_id": "x", "status": "ok"})
    assert bad.verdict == "unvalidated" and set(bad.checks["rule_version"]) == {RULES_VERSION}

