"""Change points on synthetic series with known change positions: false alarms and detection, by simulation.

The bounds are the rates stated in docs/statistics.md ("Change points of a release series"), checked with a
binomial margin so that a correct detector passes with seeds fixed and a wrong one (no permutation test, a
test that does not control alpha, a detector blind to a 3-sigma step) fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tunelab.stats.changepoints import detect_changepoints, split_statistic


def _upper(rate: float, n: int, z: float = 2.6) -> float:
    """One-sided ~99.5 % binomial upper margin of an observed rate around ``rate``."""
    return rate + z * math.sqrt(rate * (1 - rate) / n)


def test_false_alarm_rate_on_series_without_change_is_at_most_alpha():
    rng = np.random.default_rng(11)
    reps, alpha = 400, 0.05
    alarms = sum(bool(detect_changepoints(rng.normal(size=30), alpha=alpha, n_permutations=99, seed=r))
                 for r in range(reps))
    assert alarms / reps <= _upper(alpha, reps), f"{alarms} of {reps} null series alarmed"


def test_a_looser_alpha_alarms_more_often_on_the_same_null_series():
    # The test is not vacuous: alpha is what sets the rate.
    rng = np.random.default_rng(12)
    series = [rng.normal(size=24) for _ in range(150)]
    strict = sum(bool(detect_changepoints(x, alpha=0.02, n_permutations=99, seed=i)) for i, x in enumerate(series))
    loose = sum(bool(detect_changepoints(x, alpha=0.3, n_permutations=99, seed=i)) for i, x in enumerate(series))
    assert loose > strict
    assert loose / 150 > 0.15


def test_a_three_sigma_step_is_found_at_its_position_with_its_size():
    rng = np.random.default_rng(13)
    reps, found, covered, extra = 200, 0, 0, 0
    for r in range(reps):
        x = rng.normal(size=30)
        x[15:] += 3.0
        cps = detect_changepoints(x, n_permutations=99, seed=r)
        hit = [c for c in cps if abs(c.index - 15) <= 1]
        found += bool(hit)
        extra += len(cps) - len(hit)
        covered += bool(hit) and hit[0].ci_low <= 3.0 <= hit[0].ci_high
    assert found / reps >= 0.9, f"detected {found} of {reps}"
    # Extra alarms after a true change: each of the two halves is searched at alpha again (docs: about alpha a segment).
    assert extra / reps <= 2 * 0.05 + 0.1
    # The Welch interval of the shift covers the true step in most detected cases (optimistic after the search).
    assert covered / found >= 0.85


def test_two_steps_are_both_found():
    rng = np.random.default_rng(14)
    reps, both = 120, 0
    for r in range(reps):
        x = rng.normal(size=30)
        x[10:] += 3.0
        x[20:] += 3.0
        idx = [c.index for c in detect_changepoints(x, n_permutations=99, seed=r)]
        both += any(abs(i - 10) <= 1 for i in idx) and any(abs(i - 20) <= 1 for i in idx)
    assert both / reps >= 0.75, f"both steps in {both} of {reps}"


def test_alarm_fields_and_relative_change():
    x = np.log(np.r_[np.full(6, 100.0), np.full(6, 90.0)]) + np.tile([0.001, -0.001], 6)
    (cp,) = detect_changepoints(x, n_permutations=199)
    assert cp.index == 6 and cp.n_before == 6 and cp.n_after == 6
    assert cp.p_value <= 0.05
    assert cp.rel_change == pytest.approx(-0.10, abs=0.002)
    lo, hi = cp.rel_ci
    assert lo < cp.rel_change < hi < 0


def test_short_series_and_bad_input():
    assert detect_changepoints([1.0, 2.0, 3.0, 4.0, 5.0]) == []
    with pytest.raises(ValueError, match="NaN"):
        detect_changepoints([1.0, float("nan")] * 5)
    with pytest.raises(ValueError, match="alpha"):
        detect_changepoints(np.arange(10.0), alpha=1.5)
    with pytest.raises(ValueError, match="min_size"):
        detect_changepoints(np.arange(10.0), min_size=1)


def test_split_statistic_matches_the_l2_cost_drop():
    rng = np.random.default_rng(3)
    x = rng.normal(size=12)
    s = split_statistic(x, 2)
    for j, k in enumerate(range(2, 11)):
        drop = ((x - x.mean()) ** 2).sum() - ((x[:k] - x[:k].mean()) ** 2).sum() - ((x[k:] - x[k:].mean()) ** 2).sum()
        assert s[j] == pytest.approx(drop)
