"""The A/B report as a family (warehouse.selection.report_family, flows.compare.confirmed_regressions, a plan's
``primary:``) and the token-count check across runtimes (issue 29 item 3), on synthetic warehouse rows."""

import math
import textwrap

import numpy as np
import pandas as pd
import pytest

from tunelab.flows.compare import confirmed_regressions
from tunelab.core.plan import PlanError, load_plan
from tunelab.reports.report import ab_markdown
from tunelab.stats.verdict import ABRecord
from tunelab.warehouse.compare import compare
from tunelab.warehouse.selection import compare_frames
from warehouse_rows import add, con  # noqa: F401 - the shared in-memory warehouse fixture and its loader


def two_runtimes(con, boots=3, **kw):
    rng = np.random.default_rng(3)
    for r in range(boots):
        for rt, ver in (("cpu-old", "0.25.1"), ("cpu-new", "0.26.0")):
            add(con, config_key="A", runtime_name=rt, vllm_version=ver, replicate=r, boot_sd_rel=0.02,
                repeat_sd_rel=0.01, requests_per_repeat=8, rng=rng,
                workloads=("short", "long"), loads=(("concurrency", 1.0), ("concurrency", 8.0)), **kw)


def test_a_tokenizer_change_across_runtimes_is_flagged_with_its_size(con):
    two_runtimes(con)
    same = compare(con, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})
    assert (same["token_change"] == "").all() and (same["baseline_prompt_tokens"] == 64).all()
    # the new release's tokenizer adds a special token: one more prompt token on every request of one workload
    con.execute("UPDATE requests SET prompt_tokens = prompt_tokens + 1 WHERE workload = 'short' AND trial_id IN "
                "(SELECT trial_id FROM trials WHERE runtime_name = 'cpu-new')")
    df = compare(con, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})
    short, long_ = df[df.workload == "short"], df[df.workload == "long"]
    assert (short["token_change"] == "prompt tokens 64.0 -> 65.0 a request (+1.6%)").all()
    assert (short["candidate_prompt_tokens"] == 65).all() and (long_["token_change"] == "").all()
    md = ab_markdown(df, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})
    assert "Token counts differ between the sides" in md and "short c=1: prompt tokens 64.0 -> 65.0" in md


def test_output_token_counts_are_checked_too_and_noise_is_not_a_change(con):
    two_runtimes(con)
    rng = np.random.default_rng(0)
    # lengths that vary by request on both sides (a length distribution): different requests, same distribution
    ids = con.execute("SELECT rowid FROM requests").fetchall()
    for (rid,) in ids:
        con.execute("UPDATE requests SET output_tokens = ? WHERE rowid = ?", [int(rng.integers(100, 157)), rid])
    assert (compare(con, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})["token_change"] == "").all()
    con.execute("UPDATE requests SET output_tokens = output_tokens + 40 WHERE trial_id IN "
                "(SELECT trial_id FROM trials WHERE runtime_name = 'cpu-new')")
    df = compare(con, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})
    assert df["token_change"].str.startswith("output tokens ").all()


def test_the_ab_record_is_typed_with_a_description_per_field_and_a_plain_welch_column(con):
    two_runtimes(con)
    df = compare(con, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})
    assert list(df.columns) == ABRecord.columns()
    assert all(f.description for f in ABRecord.model_fields.values())
    ABRecord(**df.iloc[0].to_dict())  # every row is a valid record
    from scipy import stats
    r = df.iloc[0]
    vals = con.execute("SELECT t.runtime_name, avg(m.output_tokens_per_s) FROM measurements m JOIN trials t "
                       "USING (trial_id) WHERE m.workload = ? AND m.load_value = ? GROUP BY t.trial_id, "
                       "t.runtime_name", [r.workload, r.load_value]).fetchall()
    b = [v for k, v in vals if k == "cpu-old"]
    c = [v for k, v in vals if k == "cpu-new"]
    ci = stats.ttest_ind(c, b, equal_var=False).confidence_interval(0.95)
    assert (r.welch_ci_low, r.welch_ci_high) == pytest.approx((ci.low, ci.high))


def test_a_report_is_one_family_with_primary_and_secondary_rows(con):
    two_runtimes(con)
    df = compare_frames(con, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"},
                        primary={"metrics": ["output_tokens_per_s"], "loads": ["c=8"]})
    assert set(df.loc[df.load_value == 8, "family_role"]) == {"primary"}
    assert set(df.loc[df.load_value == 1, "family_role"]) == {"secondary"}
    assert (df.loc[df.family_role == "primary", "family_method"] == "holm over 2 primary verdicts at 0.05").all()
    assert "per cell" in df.attrs["family"] and "unadjusted" in df.attrs["family"]
    md = ab_markdown(df, {"runtime_name": "cpu-old"}, {"runtime_name": "cpu-new"})
    assert "headline" in md and "(secondary)" in md and "Holm" in md


def test_the_regression_state_follows_the_family_verdict_not_the_per_cell_one():
    row = {"config_key": "k", "workload": "short", "load_kind": "concurrency", "load_value": 8.0, "rel_diff": -0.04,
           "rel_ci_low": -0.07, "rel_ci_high": -0.01, "verdict": "worse", "p_value": 0.02}
    ab = pd.DataFrame([{**row, "family_role": "primary", "p_family": 0.08, "family_verdict": "no_significant_change"},
                       {**row, "workload": "long", "family_role": "secondary", "p_family": 0.001,
                        "family_verdict": "worse"},
                       {**row, "workload": "mid", "family_role": "primary", "p_family": 0.001,
                        "family_verdict": "worse"}])
    out = confirmed_regressions(ab, pd.DataFrame())
    assert [c["workload"] for c in out] == ["mid"] and out[0]["p_family"] == 0.001


GOOD = """
name: t
model: /models/tiny
engine_args:
  enforce-eager: [false, true]
workloads:
  - {name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}
concurrency: [1, 4]
replicates: 2
"""


def test_a_plan_names_its_primary_verdicts_and_a_wrong_name_fails_before_any_boot(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text(textwrap.dedent(GOOD + "primary: {metrics: [output_tokens_per_s], loads: [c=4]}\n"))
    assert load_plan(p).primary.loads == ["c=4"]
    for bad, field in (("{metrics: [output_tokens_per_s], loads: [c=8]}", "primary.loads[0]"),
                       ("{metrics: [tokens_per_sec]}", "primary.metrics"),
                       ("{metrics: [output_tokens_per_s], workloads: [long]}", "primary.workloads[0]")):
        p.write_text(textwrap.dedent(GOOD + f"primary: {bad}\n"))
        with pytest.raises(PlanError, match=field.replace("[", r"\[").replace("]", r"\]")):
            load_plan(p)
