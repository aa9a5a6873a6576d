"""Arrival schedules: seeding, mean rate, burstiness (gamma shape) and argument checks."""

import math

import numpy as np
import pytest

from tunelab.core.load_profiles import arrival_offsets

N = 20000


def _gap_cv(offsets: np.ndarray) -> float:
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    return float(np.std(gaps) / np.mean(gaps))


def test_same_seed_same_schedule_other_seed_differs():
    a = arrival_offsets(500, 4.0, burstiness=0.5, seed=7)
    b = arrival_offsets(500, 4.0, burstiness=0.5, seed=7)
    c = arrival_offsets(500, 4.0, burstiness=0.5, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_shape_and_monotonic_and_first_request_waits_one_gap():
    off = arrival_offsets(1000, 50.0, seed=1)
    assert off.shape == (1000,) and off.dtype == np.float64
    assert np.all(np.diff(off) >= 0)
    assert off[0] > 0  # vLLM's schedule: the first request also waits one gap


@pytest.mark.parametrize("rate", [2.0, 10.0, 300.0])
@pytest.mark.parametrize("burstiness", [1.0, 0.5, 3.0])
def test_mean_rate_within_statistical_tolerance(rate, burstiness):
    off = arrival_offsets(N, rate, burstiness=burstiness, seed=123)
    realised = N / off[-1]
    # sum of N gaps: relative standard error = CV / sqrt(N) = 1 / sqrt(N * shape); allow 5 sigma
    tol = 5.0 / math.sqrt(N * burstiness)
    assert abs(realised / rate - 1.0) < tol


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_burstiness_sets_gap_cv_to_one_over_sqrt_shape(shape):
    cv = _gap_cv(arrival_offsets(N, 5.0, burstiness=shape, seed=3))
    assert cv == pytest.approx(1.0 / math.sqrt(shape), rel=0.08)


def test_burstier_schedule_has_larger_gap_cv():
    bursty = _gap_cv(arrival_offsets(N, 5.0, burstiness=0.3, seed=11))
    poisson = _gap_cv(arrival_offsets(N, 5.0, burstiness=1.0, seed=11))
    regular = _gap_cv(arrival_offsets(N, 5.0, burstiness=5.0, seed=11))
    assert bursty > poisson > regular


def test_infinite_rate_sends_everything_at_zero():
    off = arrival_offsets(10, float("inf"), burstiness=0.5, seed=0)
    assert np.array_equal(off, np.zeros(10))


def test_infinite_burstiness_gives_constant_gaps():
    off = arrival_offsets(5, 4.0, burstiness=float("inf"))
    assert np.allclose(off, [0.25, 0.5, 0.75, 1.0, 1.25])


def test_match_total_duration_rescales_to_n_over_rate():
    off = arrival_offsets(200, 8.0, burstiness=0.7, seed=5, match_total_duration=True)
    raw = arrival_offsets(200, 8.0, burstiness=0.7, seed=5)
    assert off[-1] == pytest.approx(200 / 8.0)
    assert np.allclose(off / off[-1], raw / raw[-1])  # same shape of schedule, only rescaled


def test_zero_requests_gives_empty_array():
    assert arrival_offsets(0, 1.0).shape == (0,)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n=-1, rate_per_s=1.0), "n"),
        (dict(n=2.5, rate_per_s=1.0), "n"),
        (dict(n=True, rate_per_s=1.0), "n"),
        (dict(n=3, rate_per_s=0.0), "rate_per_s"),
        (dict(n=3, rate_per_s=-2.0), "rate_per_s"),
        (dict(n=3, rate_per_s=float("nan")), "rate_per_s"),
        (dict(n=3, rate_per_s="5"), "rate_per_s"),
        (dict(n=3, rate_per_s=1.0, burstiness=0.0), "burstiness"),
        (dict(n=3, rate_per_s=1.0, burstiness=-1.0), "burstiness"),
        (dict(n=3, rate_per_s=1.0, seed=1.5), "seed"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        arrival_offsets(**kwargs)
