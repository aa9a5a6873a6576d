"""The sequential A/B rule (tunelab/stats/sequential.py) on many seeded simulated streams.

Noise levels from the H200 evidence (docs/statistics.md): between-boot SD of log values about 5 % at c=32 and
10 % at c=1 (a pair's log ratio has sqrt(2) times that). Simulation error: with 20,000 streams the SE of a
rate of 0.05 is 0.0015, so "<= alpha" is checked as "<= alpha + 3 SE".
"""

import math

import numpy as np
import pytest

from tunelab.stats.sequential import SequentialVerdict, confidence_sequence_log, sequential_ab
from tunelab.stats.simulate import fixed_welch, sequential_rule, simulate_pairs, welch_every_look

STREAMS = 20_000
TOL = 3 * math.sqrt(0.05 * 0.95 / STREAMS)


@pytest.mark.parametrize("sd,drift", [(0.05, 0.0), (0.10, 0.0), (0.10, 0.05)])
def test_aa_false_call_rate_is_at_most_alpha_with_a_look_after_every_pair(sd, drift):
    b, c = simulate_pairs(effect_rel=0.0, sd_boot_log=sd, n_pairs=40, streams=STREAMS, seed=1, drift_sd_log=drift)
    out = sequential_rule(b, c, alpha=0.05)
    assert out.called.mean() <= 0.05 + TOL
    assert (out.pairs == 40).mean() > 0.9  # no effect: nearly every stream runs to the budget


def test_aa_false_call_rate_with_a_correct_history_prior():
    b, c = simulate_pairs(effect_rel=0.0, sd_boot_log=0.08, n_pairs=30, streams=STREAMS, seed=2)
    out = sequential_rule(b, c, alpha=0.05, prior_sd=0.08, prior_df=8)
    assert out.called.mean() <= 0.05 + TOL


def test_welch_after_every_boot_exceeds_alpha_in_the_same_simulation():
    b, c = simulate_pairs(effect_rel=0.0, sd_boot_log=0.10, n_pairs=40, streams=STREAMS, seed=1)
    naive = welch_every_look(b, c, alpha=0.05)
    once = fixed_welch(b, c, boots=4, alpha=0.05)
    assert once.called.mean() <= 0.05 + TOL  # one look: at most the nominal rate (Welch on 4 boots: ~4 %)
    assert naive.called.mean() > 0.15  # a look after every pair: several times alpha
    assert sequential_rule(b, c).called.mean() <= 0.05 + TOL


def test_power_for_a_5_percent_effect_at_c32_noise():
    # boot SD 5 % (c=32 on the H200): +5 % throughput found within 30 pairs in >= 70 % of streams (simulated:
    # 73.8 %; a fixed 30-pair paired t-test would have ~99 %, the price of looking after every pair), always in
    # the right direction, and before the budget on average.
    b, c = simulate_pairs(effect_rel=0.05, sd_boot_log=0.05, n_pairs=30, streams=STREAMS, seed=3)
    out = sequential_rule(b, c, alpha=0.05)
    assert out.called.mean() >= 0.70
    assert (out.direction[out.called] == 1).mean() > 0.999
    assert out.pairs.mean() < 25


def test_a_3x_effect_stops_after_a_few_pairs():
    b, c = simulate_pairs(effect_rel=2.0, sd_boot_log=0.15, n_pairs=10, streams=2000, seed=4)
    out = sequential_rule(b, c)
    assert out.called.all() and np.median(out.pairs) <= 5 and out.pairs.max() <= 8


def test_equivalence_within_margin_is_called_and_rarely_when_the_effect_is_outside():
    b, c = simulate_pairs(effect_rel=0.0, sd_boot_log=0.02, n_pairs=40, streams=4000, seed=5)
    assert sequential_rule(b, c, margin=0.03).equivalent.mean() > 0.8
    b, c = simulate_pairs(effect_rel=0.03, sd_boot_log=0.02, n_pairs=40, streams=STREAMS, seed=6)
    assert sequential_rule(b, c, margin=0.03).equivalent.mean() <= 0.05 + TOL


def test_sequential_ab_matches_the_vectorised_rule_and_states_its_resolution():
    b, c = simulate_pairs(effect_rel=0.05, sd_boot_log=0.05, n_pairs=30, streams=50, seed=7)
    out = sequential_rule(b, c)
    for i in range(50):
        v = None
        for n in range(1, 31):
            v = sequential_ab(b[i, :n], c[i, :n], higher_is_better=True)
            if v.decided:
                break
        assert v.n_pairs == out.pairs[i] and (v.call == "better") == (out.called[i] and out.direction[i] > 0)
        assert v.ci_low > -1 and v.ci_low <= v.rel_change <= v.ci_high
        assert v.mde > 0


def test_verdict_fields_direction_and_the_interval_stays_above_minus_100_percent():
    base = [1.0, 1.1, 0.95, 1.05, 1.0, 0.9, 1.02]
    v = sequential_ab(base, [3.3 * x for x in base[:6]] + [3.0], higher_is_better=False)  # latency tripled
    assert isinstance(v, SequentialVerdict) and v.call == "worse" and v.decided
    assert v.ci_low > 1.5 and v.n_pairs == 7 and "always-valid" in v.method
    down = sequential_ab(base, [x / 3.3 for x in base], higher_is_better=True)
    assert down.call == "worse" and -1 < down.ci_low < down.ci_high < 0


def test_one_pair_without_history_is_undecided_and_history_decides_a_3x_change_at_two_pairs():
    v = sequential_ab([1.0], [3.0], higher_is_better=False)
    assert v.call == "undecided" and v.ci_low == -1.0 and v.ci_high == math.inf and v.mde == math.inf
    # Eager vs CUDA graphs on the H200: p50 TPOT +215 % .. +338 %, 2 boots per side. With the history's
    # between-boot SD (16 %, 12 df) the sequential rule calls it after two pairs.
    v2 = sequential_ab([1.60e-3, 1.45e-3], [5.9e-3, 5.2e-3], higher_is_better=False, prior_sd=0.16, prior_df=12)
    assert v2.call == "worse" and v2.ci_low > 0.5


def test_mde_shrinks_with_pairs():
    rng = np.random.default_rng(0)
    b = np.exp(rng.normal(0, 0.05, 40))
    c = np.exp(rng.normal(0, 0.05, 40))
    mdes = [sequential_ab(b[:n], c[:n], higher_is_better=True).mde for n in (8, 20, 40)]
    assert mdes[0] > mdes[1] > mdes[2] > 0


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="candidate"):
        sequential_ab([1.0, 2.0], [1.0, -2.0], higher_is_better=True)
    with pytest.raises(ValueError, match="margin"):
        sequential_ab([1.0], [1.0], higher_is_better=True, margin=2.0)
    with pytest.raises(ValueError, match="alpha"):
        confidence_sequence_log([0.1, 0.2], alpha=1.5)
