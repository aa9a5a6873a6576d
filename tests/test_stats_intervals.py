"""Log-scale A/B intervals with borrowed variance and their MDE (tunelab/stats/intervals.py, used by
warehouse.compare.compare). The regression case is the H200 one of issue 14: eager vs CUDA graphs, 2 vs 2 boots,
p50 TPOT +215 % .. +338 % in four cells, each called "no significant change" by Welch on raw boot means."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tunelab.stats.intervals import eb_prior, effective_pooled_df, log_ab_intervals, mde_rel, paired_log_intervals
from tunelab.warehouse.compare import compare
from tunelab.warehouse.loader import insert_trial_tables
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.synthetic import synthetic_trial

# Per cell (2 boots per side), p50 TPOT in seconds; cells' ratios of means +215 %, +260 %, +300 %, +338 %.
EAGER_CASE = [
    ([1.50e-3, 1.70e-3], [4.00e-3, 6.08e-3]),
    ([2.10e-3, 1.70e-3], [5.50e-3, 8.18e-3]),
    ([1.20e-3, 1.44e-3], [4.40e-3, 6.16e-3]),
    ([0.90e-3, 1.10e-3], [3.60e-3, 5.16e-3]),
]


def test_eager_vs_cuda_graphs_2_vs_2_boots_is_called_worse_where_welch_saw_nothing():
    for b, c in EAGER_CASE:  # the old method: Welch on raw boot means, 1-2 df
        assert stats.ttest_ind(c, b, equal_var=False).pvalue > 0.05
    ivs = log_ab_intervals(EAGER_CASE)
    for iv, (b, c) in zip(ivs, EAGER_CASE):
        assert iv.rel_low > 0.3, iv  # TPOT up by at least 30 % with 95 % confidence: a call
        assert iv.rel_low < iv.rel < iv.rel_high
        assert iv.df > 2  # borrowed across cells
        assert 0 < iv.mde_rel < 2


def test_ratio_interval_never_crosses_minus_100_percent():
    # throughput dropped to a third with noisy boots: Welch's interval of the difference divided by the mean
    # reaches below -100 %; the log-scale interval cannot.
    b, c = [3000.0, 4800.0], [900.0, 1700.0]
    lo, _, _, _ = _welch_rel(b, c)
    assert lo < -1.0
    iv = log_ab_intervals([(b, c)], borrow=False)[0]
    assert -1.0 < iv.rel_low < iv.rel < 0 < iv.rel_high  # 2 df alone: no call, but a possible interval


def _welch_rel(b, c):
    b, c = np.asarray(b), np.asarray(c)
    vb, vc = b.var(ddof=1) / len(b), c.var(ddof=1) / len(c)
    df = (vb + vc) ** 2 / (vb**2 / (len(b) - 1) + vc**2 / (len(c) - 1))
    hw = stats.t.ppf(0.975, df) * math.sqrt(vb + vc)
    d = c.mean() - b.mean()
    return (d - hw) / b.mean(), (d + hw) / b.mean(), d, df


def test_eb_prior_pools_equal_cells_and_keeps_different_cells_apart():
    rng = np.random.default_rng(0)
    same = [rng.chisquare(4) / 4 * 0.01 for _ in range(40)]
    s0, d0 = eb_prior(same, [4] * 40)
    assert d0 > 30 and s0 == pytest.approx(0.01, rel=0.2)
    spread = [0.01 * 10 ** rng.uniform(-1.5, 1.5) * rng.chisquare(4) / 4 for _ in range(40)]
    assert eb_prior(spread, [4] * 40)[1] < 5
    assert eb_prior([0.01, 0.02], [2, 2]) == (pytest.approx(math.nan, nan_ok=True), 0.0)  # < 3 cells


def test_effective_df_of_correlated_cells():
    assert effective_pooled_df([2, 2, 2, 2], corr=0.0) == 8
    assert effective_pooled_df([2, 2, 2, 2], corr=0.6) == pytest.approx(8 / (1 + 3 * 0.36))


@pytest.mark.parametrize("sds,limit", [((0.10, 0.10, 0.10, 0.10), 0.05), ((0.05, 0.05, 0.08, 0.08), 0.075)])
def test_aa_false_call_rate_with_2_vs_2_boots_and_borrowing(sds, limit):
    # cells share each boot's factor (correlation 0.6, as on the H200); 3,000 A/A comparisons of 2 vs 2 boots.
    # Equal cell CVs: at most alpha. Cell CVs 1.6x apart: 4 cells of 2 df cannot show the difference, the
    # noisier cells borrow a too-small variance and reach ~7 % (the known cost of cross-cell borrowing without
    # history, docs/statistics.md; the per-cell history prior has no such cost).
    rng = np.random.default_rng(1)
    k, reps, rho = len(sds), 3000, 0.6
    calls = np.zeros(k)
    for _ in range(reps):
        def side():
            z = math.sqrt(rho) * rng.normal(size=(2, 1)) + math.sqrt(1 - rho) * rng.normal(size=(2, k))
            return np.exp(z * np.asarray(sds))
        b, c = side(), side()
        ivs = log_ab_intervals([(b[:, j], c[:, j]) for j in range(k)])
        calls += [iv.rel_low > 0 or iv.rel_high < 0 for iv in ivs]
    assert (calls / reps).max() <= limit + 3 * math.sqrt(0.05 * 0.95 / reps)


def test_history_prior_narrows_the_interval_and_is_used_with_its_df():
    b, c = [100.0, 110.0], [120.0, 128.0]
    alone = log_ab_intervals([(b, c)], borrow=False)[0]
    hist = log_ab_intervals([(b, c)], prior_var=[0.05**2], prior_df=[20])[0]
    assert hist.df == 22 and "history" in hist.source
    assert hist.rel_high - hist.rel_low < 0.5 * (alone.rel_high - alone.rel_low)
    assert hist.mde_rel < alone.mde_rel


def test_mde_formula():
    se, df = 0.05, 10
    assert mde_rel(se, df) == pytest.approx(math.expm1((stats.t.ppf(0.975, 10) + stats.t.ppf(0.8, 10)) * se))
    assert mde_rel(math.nan, 3) == math.inf


def test_bad_values_name_the_cell():
    with pytest.raises(ValueError, match="cell 1: candidate"):
        log_ab_intervals([([1.0, 2.0], [1.0, 2.0]), ([1.0, 2.0], [0.0, 2.0])])


# --- paired boots (an interleaved sweep: boot r of A and of B ran one after the other) ---------------------------

def _paired_streams(rng, *, k, n, sd_boot, drift_sd, effect=0.0, rho=0.6):
    """(baseline, candidate) log values, shape (n, k): per pair a drift both boots share (a random walk over the
    pairs, the same in every cell: the host), per boot a factor shared by its cells (correlation rho) and a
    cell's own noise."""
    drift = np.cumsum(rng.normal(0.0, drift_sd, size=(n, 1)), axis=0)

    def side():
        z = math.sqrt(rho) * rng.normal(size=(n, 1)) + math.sqrt(1 - rho) * rng.normal(size=(n, k))
        return drift + sd_boot * z
    return side(), side() + math.log1p(effect)


def _calls_and_widths(rng, reps, **kw):
    k = 4
    calls = np.zeros((2, k))
    hw = np.zeros(2)
    for _ in range(reps):
        lb, lc = _paired_streams(rng, k=k, **kw)
        cells = [(np.exp(lb[:, j]), np.exp(lc[:, j])) for j in range(k)]
        for m, ivs in enumerate((paired_log_intervals(cells), log_ab_intervals(cells))):
            calls[m] += [iv.rel_low > 0 or iv.rel_high < 0 for iv in ivs]
            hw[m] += np.mean([(iv.rel_high - iv.rel_low) / 2 for iv in ivs])
    return calls / reps, hw / reps


def test_paired_aa_false_call_rate_holds_under_drift_and_correlated_cells():
    # 3,000 A/A comparisons of 4 pairs in 4 cells, boots' cells correlated 0.6, drift as large as the boot noise
    reps = 3000
    rates, _ = _calls_and_widths(np.random.default_rng(11), reps, n=4, sd_boot=0.05, drift_sd=0.05)
    assert rates[0].max() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), rates


def test_pairs_cancel_shared_drift_and_cost_df_without_it():
    # drift twice the boot noise, 4 pairs: the paired interval is narrower and calls a +10 % effect more often
    rates, hw = _calls_and_widths(np.random.default_rng(12), 600, n=4, sd_boot=0.04, drift_sd=0.08, effect=0.10)
    assert hw[0] < 0.7 * hw[1] and rates[0].mean() > rates[1].mean() + 0.2, (hw, rates)
    # no drift, 3 pairs: pairing only halves the df (3.85 effective against 7.7): wider on average
    _, hw = _calls_and_widths(np.random.default_rng(13), 600, n=3, sd_boot=0.05, drift_sd=0.0)
    assert hw[0] > hw[1], hw


def test_paired_needs_equal_sides_and_two_pairs():
    with pytest.raises(ValueError, match="cell 0: pairs need as many"):
        paired_log_intervals([([1.0, 2.0], [1.0])])
    one, two = paired_log_intervals([([100.0], [110.0]), ([100.0, 104.0], [110.0, 113.0])], borrow=False)
    assert one is None and two.df == 1 and "paired (2 pairs)" in two.source
    assert two.rel == pytest.approx(math.expm1(np.mean(np.log([1.10, 113 / 104]))))


# --- through warehouse.compare.compare -----------------------------------------------------------------------

@pytest.fixture
def con():
    c = connect(":memory:")
    yield c
    c.close()


def _add(con, **kw):
    st = synthetic_trial(sweep_id=kw.pop("sweep_id", "sw"), **kw)
    trial = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in st.trial.items()}
    con.execute("BEGIN")
    insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]), "trial": pd.DataFrame([trial]),
                                                    **st.tables}, source="test")
    con.execute("COMMIT")


def test_compare_calls_a_3x_latency_change_on_2_vs_2_boots_with_history_and_states_the_mde(con):
    rng = np.random.default_rng(3)
    loads = (("concurrency", 1.0), ("concurrency", 32.0))
    kw = dict(workloads=("short", "long"), loads=loads, boot_sd_rel=0.15, repeat_sd_rel=0.05, rng=rng)
    for r in range(2):
        _add(con, config_key="graphs", replicate=r, **kw)
        _add(con, config_key="eager", replicate=r, effect_rel=-0.7, **kw)  # latencies x3.3
    alone = compare(con, {"config_key": "graphs"}, {"config_key": "eager"}, "ttft_p50_s", history=False, borrow=False)
    assert (alone.verdict == "no_significant_change").all() and (alone.df == 2).all()  # 2 df: no call
    for cfg in ("mnbt", "fastokens"):  # the config's history: other configs of earlier sweeps, same cells
        for r in range(3):
            _add(con, config_key=cfg, replicate=r, sweep_id="earlier", **kw)
    out = compare(con, {"config_key": "graphs"}, {"config_key": "eager"}, "ttft_p50_s")
    assert len(out) == 4 and (out.verdict == "worse").all(), out[["rel_ci_low", "rel_ci_high", "df"]]
    assert (out.df == 2 + 4).all() and (out.rel_ci_low > 0.5).all()
    assert (out.mde_rel < alone.mde_rel).all() and out.reason.str.contains("detectable at 80 % power").all()


def test_compare_borrows_history_of_other_configs_for_the_same_cell(con):
    rng = np.random.default_rng(4)
    for r in range(2):
        _add(con, config_key="A", replicate=r, boot_sd_rel=0.05, rng=rng)
        _add(con, config_key="B", replicate=r, effect_rel=0.15, boot_sd_rel=0.05, rng=rng)
    without = compare(con, {"config_key": "A"}, {"config_key": "B"}).iloc[0]
    for cfg in ("H1", "H2", "H3"):  # history: three other configs, 4 boots each, on the same cell
        for r in range(4):
            _add(con, config_key=cfg, replicate=r, boot_sd_rel=0.05, rng=rng)
    with_hist = compare(con, {"config_key": "A"}, {"config_key": "B"}).iloc[0]
    assert without.df == 2 and with_hist.df == 2 + 9
    assert "history" in with_hist.variance_source
    assert with_hist.mde_rel < without.mde_rel


def test_regressions_carry_their_mde(con):
    from tunelab.warehouse.compare import regressions

    rng = np.random.default_rng(5)
    for i, v in enumerate(["0.9.1", "0.9.2", "0.10.0"]):
        for r in range(2):
            _add(con, sweep_id=f"s{i}", config_key="A", replicate=r, vllm_version=v, boot_sd_rel=0.02, rng=rng)
    reg = regressions(con, threshold_rel=0.05)
    later = reg[reg.status != "baseline"]
    assert len(later) == 2 and (later.mde_rel >= 0.05).all()
    se_rel = later.noise_band / 2.0 / later.baseline_value
    assert np.allclose(later.mde_rel, np.maximum(0.05, 2.0 * se_rel) + stats.norm.ppf(0.8) * se_rel)


def test_compare_paired_cancels_drift_between_replicates_and_leaves_out_unpartnered_boots(con):
    rng = np.random.default_rng(6)
    loads = tuple(("concurrency", c) for c in (1.0, 8.0, 32.0))
    for r, base in enumerate([800.0, 1150.0, 950.0, 1300.0, 700.0]):  # the host's speed drifts between rounds
        kw = dict(replicate=r, loads=loads, base_output_tokens_per_s=base, boot_sd_rel=0.02, rng=rng)
        _add(con, config_key="A", **kw)
        _add(con, config_key="B", effect_rel=0.10, **kw)
    _add(con, config_key="B", replicate=5, loads=loads, effect_rel=0.10, rng=rng)  # its partner never ran
    unpaired = compare(con, {"config_key": "A"}, {"config_key": "B"}, history=False)
    paired = compare(con, {"config_key": "A"}, {"config_key": "B"}, paired=True)
    assert (unpaired.verdict == "no_significant_change").all(), unpaired[["rel_ci_low", "rel_ci_high"]]
    assert (paired.verdict == "better").all(), paired[["rel_ci_low", "rel_ci_high"]]
    assert (paired.rel_ci_low > 0.03).all() and (paired.rel_ci_high < 0.17).all()
    assert (paired.candidate_boots == 5).all() and paired.reason.str.contains("as pairs").all()
    ex = paired.attrs["excluded"]
    assert list(ex.side) == ["candidate"] and ex.reason.str.contains("no partner").all()
    assert "paired by sweep and replicate" in paired.attrs["method"]
    with pytest.raises(ValueError, match="two boots of one sweep and replicate"):
        compare(con, {"config_key": ["A", "B"]}, {"config_key": "C"}, paired=True)


def test_the_mde_is_shown_both_ways_one_log_distance_apart():
    """A log-scale MDE of +378.8 % is a fall of -79.1 %, not of -378.8 % (no throughput falls by more than 100 %)."""
    import math

    from tunelab.stats.intervals import mde_rel, mde_text

    assert mde_text(3.788) == "-79.1%/+378.8%" and mde_text(0.05) == "-4.8%/+5.0%"
    assert mde_text(math.inf) == mde_text(None) == mde_text(math.nan) == "-"
    m = mde_rel(0.04, 6)
    fall, rise = (float(x.rstrip("%")) / 100 for x in mde_text(m, digits=6).split("/"))
    assert rise == pytest.approx(m, abs=1e-8) and math.log1p(fall) == pytest.approx(-math.log1p(rise), abs=1e-6)
