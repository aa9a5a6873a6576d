"""A/B comparison and regression detection on synthetic data with known effects (tunelab/warehouse/compare.py).

Synthetic data come from warehouse.synthetic: each value = base * (1 + effect) * boot factor * repeat factor.
"""

import numpy as np
import pytest
from scipy import stats

from tunelab.warehouse.compare import compare, regressions
from tunelab.warehouse.query import run_query
from warehouse_rows import add, con  # noqa: F401 - the shared in-memory warehouse fixture and its loader


def add_pair(con, effect, boots=3, boot_sd=0.01, repeat_sd=0.01, seed=0, **kw):
    rng = np.random.default_rng(seed)
    for r in range(boots):
        add(con, config_key="A", replicate=r, boot_sd_rel=boot_sd, repeat_sd_rel=repeat_sd, rng=rng, **kw)
        add(con, config_key="B", replicate=r, effect_rel=effect, boot_sd_rel=boot_sd, repeat_sd_rel=repeat_sd,
            rng=rng, **kw)


def test_known_improvement_is_better_in_both_directions_of_metric(con):
    add_pair(con, effect=0.10)
    r = compare(con, {"config_key": "A"}, {"config_key": "B"}, "output_tokens_per_s").iloc[0]
    assert r.verdict == "better"
    assert 0.07 < r.rel_diff < 0.13 and r.rel_ci_low > 0
    assert (r.baseline_boots, r.candidate_boots, r.baseline_repeats) == (3, 3, 9)
    # latency is lower-is-better: the faster config is better on TTFT too, and A is worse than B
    assert compare(con, {"config_key": "A"}, {"config_key": "B"}, "ttft_p50_s").iloc[0].verdict == "better"
    assert compare(con, {"config_key": "B"}, {"config_key": "A"}, "output_tokens_per_s").iloc[0].verdict == "worse"


def test_known_regression_is_worse(con):
    add_pair(con, effect=-0.08, seed=1)
    assert compare(con, {"config_key": "A"}, {"config_key": "B"}).iloc[0].verdict == "worse"


def test_no_effect_is_no_significant_change(con):
    add_pair(con, effect=0.0, boot_sd=0.03, repeat_sd=0.02, seed=2)
    r = compare(con, {"config_key": "A"}, {"config_key": "B"}).iloc[0]
    assert r.verdict == "no_significant_change"
    assert r.ci_low < 0 < r.ci_high


def test_boot_noise_is_not_called_an_effect(con):
    # Boot factors chosen by hand: the sides differ by ~6 % by chance of boot, repeats are tight (0.5 %).
    for r, f in enumerate([0.92, 1.04, 0.98]):
        add(con, config_key="A", replicate=r, effect_rel=f - 1, repeats=5, repeat_sd_rel=0.005,
            rng=np.random.default_rng(r))
    for r, f in enumerate([1.06, 0.97, 1.10]):
        add(con, config_key="B", replicate=r, effect_rel=f - 1, repeats=5, repeat_sd_rel=0.005,
            rng=np.random.default_rng(10 + r))
    # treating the 15 repeats per side as independent samples would call this significant ...
    rep = con.execute("SELECT config_key, output_tokens_per_s FROM measurement_facts").fetchdf()
    naive = stats.ttest_ind(rep[rep.config_key == "B"].output_tokens_per_s,
                            rep[rep.config_key == "A"].output_tokens_per_s, equal_var=False)
    assert naive.pvalue < 0.01
    # ... but across boots it is not
    r = compare(con, {"config_key": "A"}, {"config_key": "B"}).iloc[0]
    assert r.verdict == "no_significant_change"
    assert r.rel_diff > 0.05


def test_one_boot_per_side_is_inconclusive(con):
    add_pair(con, effect=0.20, boots=1)
    r = compare(con, {"config_key": "A"}, {"config_key": "B"}).iloc[0]
    assert r.verdict == "inconclusive"
    assert "1 boot" in r.reason and "unit of replication" in r.reason
    assert np.isnan(r.ci_low) and r.rel_diff == pytest.approx(0.2, abs=0.05)


def test_excluded_trials_are_reported(con):
    add_pair(con, effect=0.10)
    add(con, config_key="B", replicate=7, status="boot_failed", rng=np.random.default_rng(5))
    add(con, config_key="B", replicate=8, quality_verdict="fail", effect_rel=-0.5, rng=np.random.default_rng(6))
    out = compare(con, {"config_key": "A"}, {"config_key": "B"})
    assert out.iloc[0].verdict == "better" and out.iloc[0].candidate_boots == 3
    assert out.iloc[0].candidate_trials_excluded == 2
    reasons = dict(zip(out.attrs["excluded"].trial_id, out.attrs["excluded"].reason))
    assert reasons == {"sw/synthetic/B/r7": "status=boot_failed", "sw/synthetic/B/r8": "quality_verdict=fail"}
    # opting in to failed-quality trials pulls the candidate down
    wider = compare(con, {"config_key": "A"}, {"config_key": "B"}, quality=("pass", "warn", "fail"))
    assert wider.iloc[0].candidate_boots == 4


def test_selector_errors(con):
    add_pair(con, effect=0.0, boots=2)
    with pytest.raises(ValueError, match="unknown"):
        compare(con, {"config": "A"}, {"config_key": "B"})
    with pytest.raises(ValueError, match="both match"):
        compare(con, {"config_key": ["A", "B"]}, {"config_key": "B"})
    with pytest.raises(ValueError, match="not comparable"):
        compare(con, {"config_key": "A"}, {"config_key": "B"}, metric="replicate")


def test_sql_ab_comparison_agrees_with_python(con):
    add_pair(con, effect=0.10)
    sql = run_query(con, "ab_comparison", metric="output_tokens_per_s", baseline_config_key="A",
                    baseline_runtime=None, candidate_config_key="B", candidate_runtime=None)
    py = compare(con, {"config_key": "A"}, {"config_key": "B"})
    assert list(sql.verdict) == list(py.verdict) == ["better"]
    assert sql.candidate_mean.iloc[0] == pytest.approx(py.candidate_mean.iloc[0])


VERSIONS = ["0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.11.0rc1", "0.11.0", "0.12.0"]


def _series(con, effects, boots=2, seed=0):
    rng = np.random.default_rng(seed)
    for i, (v, e) in enumerate(zip(VERSIONS, effects)):
        for r in range(boots):
            add(con, sweep_id=f"sw{i}", config_key="A", replicate=r, vllm_version=v, effect_rel=e,
                boot_sd_rel=0.01, repeat_sd_rel=0.01, rng=rng)


def test_persistent_drop_is_a_regression_at_the_right_version(con):
    _series(con, [0, 0, 0, 0, -0.15, -0.15, -0.15])
    out = regressions(con, "output_tokens_per_s", threshold_rel=0.05, consecutive=2)
    assert list(out.point) == VERSIONS  # PEP 440 order, not string order
    assert list(out.status) == ["baseline", "ok", "ok", "ok", "regression", "regression", "regression"]
    assert list(out.point[out.regression_start]) == ["0.11.0rc1"]
    sql = run_query(con, "regressions", metric="output_tokens_per_s", threshold_rel=0.05, noise_k=2.0,
                    config_key=None)
    assert list(sql.vllm_version[sql.regression_start.fillna(False)]) == ["0.11.0rc1"]


def test_single_dip_is_not_confirmed_and_noise_is_not_flagged(con):
    _series(con, [0, 0, -0.15, 0, 0, 0.02, -0.02], seed=3)
    out = regressions(con, "output_tokens_per_s", threshold_rel=0.05, consecutive=2)
    assert out.set_index("point").status["0.10.0"] == "violation_unconfirmed"
    assert not out.regression_start.any()
    assert set(out.status) <= {"baseline", "ok", "violation_unconfirmed"}


def test_latency_regression_direction(con):
    _series(con, [0, 0, 0, 0, 0, -0.2, -0.2], seed=4)  # slower -> TTFT up
    out = regressions(con, "ttft_p50_s", threshold_rel=0.05)
    assert list(out.point[out.regression_start]) == ["0.11.0"]


def test_env_var_not_applied_on_every_candidate_boot_gives_not_applied(con):
    # A/A in truth (effect 0): the candidate asked for VLLM_USE_FASTOKENS=1 but its vLLM reported the variable
    # as unknown on every boot, so whatever the numbers say, the comparison did not test the setting.
    add_pair(con, effect=0.0, seed=3)
    con.execute("""UPDATE trials SET env_not_applied = '["VLLM_USE_FASTOKENS"]' WHERE config_key = 'B'""")
    df = compare(con, {"config_key": "A"}, {"config_key": "B"})
    r = df.iloc[0]
    assert r.verdict == "not_applied"
    assert "candidate: VLLM_USE_FASTOKENS not applied on any boot" in r.reason
    assert "no_significant_change" in r.reason  # the numeric verdict is kept in the reason
    na = df.attrs["not_applied"]
    assert list(na.side) == ["candidate"] * 3 and set(na.env) == {"VLLM_USE_FASTOKENS"}
    # on the baseline side it is named as the baseline's
    rb = compare(con, {"config_key": "B"}, {"config_key": "A"}).iloc[0]
    assert rb.verdict == "not_applied" and rb.reason.startswith("baseline: VLLM_USE_FASTOKENS")


def test_env_var_not_applied_on_some_boots_keeps_the_verdict_and_lists_them(con):
    add_pair(con, effect=0.10, seed=4)
    con.execute("""UPDATE trials SET env_not_applied = '["VLLM_MY_TYPO"]' WHERE trial_id = 'sw/synthetic/B/r0'""")
    con.execute("""UPDATE trials SET env_not_applied = '[]' WHERE config_key = 'A'""")
    df = compare(con, {"config_key": "A"}, {"config_key": "B"})
    assert df.iloc[0].verdict == "better"
    assert df.attrs["not_applied"].to_dict("records") == [
        {"side": "candidate", "trial_id": "sw/synthetic/B/r0", "env": "VLLM_MY_TYPO"}]


# -- builds grouped by release (tunelab/warehouse/versions.py) -------------------------------------------------------------
def test_version_selector_takes_every_build_of_the_release(con):
    from tunelab.flows.compare import compare_frames, parse_selector

    rng = np.random.default_rng(7)
    for r, build in enumerate(["0.26.0", "0.26.0+empty", "0.26.0+empty"]):
        add(con, sweep_id="old", config_key="A", replicate=r, vllm_version=build, rng=rng, boot_sd_rel=0.01)
    for r in range(3):
        add(con, sweep_id="new", config_key="A", replicate=r, vllm_version="0.27.0+cu128", effect_rel=0.2, rng=rng,
            boot_sd_rel=0.01)
    add(con, sweep_id="dev", config_key="A", replicate=0, vllm_version="0.1.dev123+gabc1234", rng=rng)
    df = compare_frames(con, parse_selector("version=0.26.0"), parse_selector("version=0.27.0"))
    (row,) = df.itertuples()
    assert (row.baseline_boots, row.candidate_boots, row.verdict) == (3, 3, "better")
    # a build with its local part selects that build only; an untagged build by its exact string
    assert compare_frames(con, parse_selector("version=0.26.0+empty"), parse_selector("version=0.27.0")
                          ).baseline_boots.tolist() == [2]
    assert len(compare(con, {"vllm_version": "0.1.dev123+gabc1234"}, {"vllm_version": "0.27.0"}, min_boots=2)) == 1
    # latest/previous are releases, never the untagged build (PEP 440 would put 0.1.dev123 before all)
    from tunelab.flows.compare import resolve_selector

    assert resolve_selector(con, {"version": "latest"}) == {"vllm_version": "0.27.0"}
    assert resolve_selector(con, {"version": "previous"}) == {"vllm_version": "0.26.0"}


def test_a_selector_that_matches_nothing_names_the_item_and_the_values_there_are(con):
    """Found by a fresh user: a selector that matched nothing said only that, with everything the warehouse holds.
    Now the failing key=value is named with the values of that key, and a near one is suggested."""
    from tunelab.warehouse.selection import parse_selector, require_matches

    rng = np.random.default_rng(3)
    for key, sweep, rt in (("A", "s1", "gpu-0.25.1"), ("B", "s2", "gpu-0.26.0")):
        add(con, sweep_id=sweep, config_key=key, config_label=f"cfg-{key.lower()}", runtime_name=rt, rng=rng)

    def err(text, side="baseline"):
        with pytest.raises(ValueError) as e:
            require_matches(con, parse_selector(text), side, text)
        return str(e.value)

    assert require_matches(con, parse_selector("config=cfg-a"), "baseline") == {"config_label": "cfg-a"}
    assert err("sweep=s1,config=nosuch") == ("the baseline selector 'sweep=s1,config=nosuch' selects no trial with "
                                             "results: no ok trial has config=nosuch; config values in the "
                                             "warehouse: cfg-a, cfg-b")
    msg = err("runtime=gpu-9.9,config=cfg-b", "candidate")
    assert msg.startswith("the candidate selector 'runtime=gpu-9.9,config=cfg-b'") and "runtime=gpu-9.9" in msg
    assert "runtime values in the warehouse: gpu-0.25.1, gpu-0.26.0" in msg
    assert "did you mean config=cfg-b or config=cfg-a? config values in the warehouse" in err("config=cfg-bb")
    # each item matches trials, together they do not: the values there (within the items before it)
    assert err("sweep=s1,runtime=gpu-0.26.0").endswith(
        "runtime=gpu-0.26.0 matches none together with sweep=s1; did you mean runtime=gpu-0.25.1? runtime values "
        "there: gpu-0.25.1")


def test_gpu_selector_takes_a_part_of_one_gpu_name(con):
    """``gpu=`` needed the whole name ("NVIDIA H100 80GB HBM3"); a case-insensitive part of one name now works, a
    part of several names is an error naming them."""
    from tunelab.warehouse.selection import parse_selector, require_matches, resolve_selector

    rng = np.random.default_rng(4)
    add(con, sweep_id="s1", config_key="A", rng=rng)
    add(con, sweep_id="s2", config_key="A", rng=rng)
    con.execute("UPDATE trials SET gpu_name = CASE sweep_id WHEN 's1' THEN 'NVIDIA H100 80GB HBM3' "
                "ELSE 'NVIDIA H200' END")
    assert resolve_selector(con, parse_selector("gpu=h100")) == {"gpu_name": "NVIDIA H100 80GB HBM3"}
    assert resolve_selector(con, {"gpu": "nvidia h200"}) == {"gpu_name": "NVIDIA H200"}
    assert resolve_selector(con, {"gpu": "NVIDIA H200"}) == {"gpu_name": "NVIDIA H200"}
    assert resolve_selector(con, parse_selector("gpu=H100|h200")) == {"gpu_name": ["NVIDIA H100 80GB HBM3",
                                                                                   "NVIDIA H200"]}
    sel = require_matches(con, parse_selector("gpu=h200,config=A"), "candidate")
    assert sel["gpu_name"] == "NVIDIA H200"
    with pytest.raises(ValueError, match=r"gpu='nvidia' matches 2 GPU names in the warehouse: "
                                         r"'NVIDIA H100 80GB HBM3', 'NVIDIA H200'; give a part"):
        resolve_selector(con, {"gpu": "nvidia"})
    with pytest.raises(ValueError, match=r"^the baseline selector 'gpu=nvidia': gpu='nvidia' matches 2"):
        require_matches(con, parse_selector("gpu=nvidia"), "baseline", "gpu=nvidia")
    with pytest.raises(ValueError, match=r"no ok trial has gpu=a100; gpu values in the warehouse: "
                                         r"NVIDIA H100 80GB HBM3, NVIDIA H200"):
        require_matches(con, parse_selector("gpu=a100"), "baseline")


def test_version_series_has_one_point_per_release_and_no_untagged_build(con):
    rng = np.random.default_rng(8)
    for i, build in enumerate(["0.25.1", "0.26.0", "0.26.0+empty", "0.1.dev123+gabc1234", "0.27.0"]):
        for r in range(2):
            add(con, sweep_id=f"sw{i}", config_key="A", replicate=r, vllm_version=build, rng=rng, boot_sd_rel=0.01)
    out = regressions(con, "output_tokens_per_s")
    assert list(out.point) == ["0.25.1", "0.26.0", "0.27.0"]
    assert out.set_index("point").loc["0.26.0", "boots"] == 4
    assert out.set_index("point").loc["0.26.0", "vllm_version"] == "0.26.0, 0.26.0+empty"
    sql = run_query(con, "regressions", metric="output_tokens_per_s", threshold_rel=0.05, noise_k=2.0, config_key=None)
    assert list(sql.vllm_version) == ["0.25.1", "0.26.0", "0.27.0"]
    assert list(sql.builds[1]) == ["0.26.0", "0.26.0+empty"]
    series = run_query(con, "version_series", config_key="A", metric="output_tokens_per_s", workload=None)
    assert "0.1.dev123" not in " ".join(series.vllm_version)
    assert series.groupby("vllm_version").boots.sum().to_dict() == {"0.25.1": 2, "0.26.0": 4, "0.27.0": 2}
