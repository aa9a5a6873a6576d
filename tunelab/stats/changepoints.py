"""Change points of a release series: where a metric's level moved, with a stated false-alarm rate.

A scheduled sweep adds one point per (config, workload, load level, metric) and run: the mean of the boots' log
values, less the anchor's mean of the same sweep where the plan has an anchor (``warehouse.series``). This module
finds where such a series moves and says by how much.

Method: hierarchical binary segmentation for shifts of the mean (the "E-divisive means" family that MongoDB's
performance CI and Apache Otava use, Daly et al., ICPE 2020; Matteson and James, JASA 2014, for E-divisive).

1. In a segment of ``n`` points, the candidate split is the one that most reduces the sum of squared deviations
   from the segment means (ruptures' ``Binseg`` with the ``l2`` cost, ``n_bkps=1``). Its statistic is that
   reduction, ``k (n - k) / n * (mean_left - mean_right)^2``, which has the same null variance at every ``k``.
2. A permutation test decides whether the split is real: the same maximum over all allowed splits is computed
   for ``n_permutations`` shuffles of the segment; ``p = (1 + #{perm >= observed}) / (1 + n_permutations)``.
3. When ``p <= alpha`` the split is kept and both halves are searched again (each half only after its parent
   was significant), until no segment of at least ``2 * min_size`` points splits.

Why mean shifts (l2) rather than the energy distance of E-divisive proper: a nightly series has 10-60 points, and
what a person acts on is a level change of a latency or a throughput; the energy statistic also reacts to changes of
spread alone (e.g. a noisier week), which is not a regression. Why ruptures: the packages built for this,
``apache-otava`` (pins ``numpy==2.2.0``) and MongoDB's ``signal-processing-algorithms`` (needs ``numpy<2``), cannot
be installed beside this project's numpy; ruptures is well kept and has no such pins. Otava itself replaced the
permutation test by a Student t test for speed; at the lengths here the permutation test costs milliseconds and
needs no normality.

False-alarm rate: on a series with no change (points exchangeable), an alarm needs the first test to reject, so
the probability of *any* alarm in the series is at most ``alpha`` (the permutation p-value is valid for
exchangeable data). After a true change each further segment is tested at ``alpha`` again, so a series with
changes can carry extra false alarms at about ``alpha`` per segment searched. Measured by simulation in
``tests/test_changepoints.py`` and reported in ``docs/statistics.md``.

Assumptions: points independent and of one variance within a segment (the permutation test needs exchangeability).
A slow drift or autocorrelated points (a machine that gets slower week by week without an anchor) break it and are
reported as one or more steps; the anchor adjustment removes what all configs of a sweep share.

The magnitude of an alarm: the difference of the segment means after and before the change point (the segments
between neighbouring change points), with Welch's interval (``scipy.stats.ttest_ind(equal_var=False)``). After
the search the interval is optimistic (the split was chosen where the difference is largest), so it is a
description of the size, not a test; the test is the permutation p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import ruptures as rpt
from scipy import stats

__all__ = ["ChangePoint", "detect_changepoints", "split_statistic"]


@dataclass(frozen=True)
class ChangePoint:
    """One change of the series level.

    Attributes:
        index: position of the first point of the new level (0-based; the points ``index-1`` and ``index`` are on
            either side of the change).
        p_value: permutation p-value of the split in the segment where it was found.
        before_mean, after_mean: means of the segments before and after (between neighbouring change points), in
            the series' units (log units for a ``warehouse.series`` series).
        shift: ``after_mean - before_mean``.
        ci_low, ci_high: Welch interval of ``shift`` at ``confidence`` (NaN when a side has one point).
        n_before, n_after: points in those segments.
        confidence: level of the interval.
    """

    index: int
    p_value: float
    before_mean: float
    after_mean: float
    shift: float
    ci_low: float
    ci_high: float
    n_before: int
    n_after: int
    confidence: float

    @property
    def rel_change(self) -> float:
        """``exp(shift) - 1``: the relative change when the series is on the log scale."""
        return math.expm1(self.shift)

    @property
    def rel_ci(self) -> tuple[float, float]:
        """The interval of :attr:`rel_change` (``exp(ci) - 1``)."""
        return math.expm1(self.ci_low), math.expm1(self.ci_high)


def split_statistic(x: np.ndarray, min_size: int) -> np.ndarray:
    """Mean-shift statistic of every allowed split, for one or many series.

    Args:
        x: shape ``(n,)`` or ``(m, n)`` (``m`` series of ``n`` points).
        min_size: points each side of a split must keep (>= 1).

    Returns:
        shape ``(..., n - 2 * min_size + 1)``: for split ``k`` in ``min_size .. n - min_size`` (first point of the
        right part), ``k (n - k) / n * (mean(x[:k]) - mean(x[k:]))^2`` (the drop of the l2 cost; the cost that
        ruptures' ``CostL2`` sums).

    Raises:
        ValueError: fewer than ``2 * min_size`` points.
    """
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    if n < 2 * min_size:
        raise ValueError(f"a split needs at least 2 * min_size = {2 * min_size} points; got {n}")
    c = np.cumsum(x, axis=-1)
    k = np.arange(min_size, n - min_size + 1)
    left = c[..., k - 1] / k
    right = (c[..., -1:] - c[..., k - 1]) / (n - k)
    return k * (n - k) / n * (left - right) ** 2


def _best_split(seg: np.ndarray, min_size: int) -> int:
    """Where ruptures' binary segmentation (l2 cost) puts one change point in ``seg`` (relative index)."""
    algo = rpt.Binseg(model="l2", min_size=min_size, jump=1).fit(seg.reshape(-1, 1))
    return int(algo.predict(n_bkps=1)[0])


def detect_changepoints(values: Sequence[float], alpha: float = 0.05, min_size: int = 3, n_permutations: int = 499,
                        confidence: float = 0.95, seed: int | None = 0) -> list[ChangePoint]:
    """Change points of the mean of one series, each with its permutation p-value, shift and Welch interval.

    Args:
        values: the series in time (or release) order, shape ``(n,)``; NaN not allowed. Use log values for a
            relative shift (``warehouse.series`` does).
        alpha: significance of each split test; the chance of any alarm on a series without change is at most
            ``alpha`` (module docstring).
        min_size: least points of a segment on either side of a change (>= 2, so both sides have a spread).
        n_permutations: shuffles per test (>= 19 so that ``p`` can reach 0.05).
        confidence: level of the Welch interval of each shift.
        seed: random seed of the permutations (same input and seed, same answer).

    Returns:
        the change points, ordered by ``index``; empty when the series is shorter than ``2 * min_size``.

    Raises:
        ValueError: NaN or infinite values, ``alpha`` not in (0, 1), ``min_size < 2`` or ``n_permutations < 19``.
    """
    x = np.asarray(values, dtype=float).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError("values: the series has NaN or infinite points; drop them before detection")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha}: give a significance level in (0, 1), e.g. 0.05")
    if min_size < 2:
        raise ValueError(f"min_size={min_size}: each side of a change needs at least 2 points for a spread")
    if n_permutations < 19:
        raise ValueError(f"n_permutations={n_permutations}: at least 19 so that p can reach 0.05")
    rng = np.random.default_rng(seed)
    found: list[tuple[int, float]] = []
    todo = [(0, len(x))]
    while todo:
        lo, hi = todo.pop()
        seg = x[lo:hi]
        if len(seg) < 2 * min_size or np.ptp(seg) == 0:
            continue
        k = _best_split(seg, min_size)
        obs = split_statistic(seg, min_size)[k - min_size]
        perms = rng.permuted(np.broadcast_to(seg, (n_permutations, len(seg))), axis=1)
        null = split_statistic(perms, min_size).max(axis=1)
        # A tiny tolerance: a permutation equal to the data must count as ">=" despite rounding.
        p = (1 + int(np.sum(null >= obs * (1 - 1e-12)))) / (1 + n_permutations)
        if p <= alpha:
            found.append((lo + k, p))
            todo += [(lo, lo + k), (lo + k, hi)]
    found.sort()
    bounds = [0] + [i for i, _ in found] + [len(x)]
    out = []
    for j, (i, p) in enumerate(found):
        before, after = x[bounds[j]:i], x[i:bounds[j + 2]]
        lo_ci, hi_ci = _welch_interval(before, after, confidence)
        out.append(ChangePoint(index=i, p_value=p, before_mean=float(before.mean()), after_mean=float(after.mean()),
                               shift=float(after.mean() - before.mean()), ci_low=lo_ci, ci_high=hi_ci,
                               n_before=len(before), n_after=len(after), confidence=confidence))
    return out


def _welch_interval(before: np.ndarray, after: np.ndarray, confidence: float) -> tuple[float, float]:
    if len(before) < 2 or len(after) < 2:
        return math.nan, math.nan
    if np.ptp(before) == 0 and np.ptp(after) == 0:  # no spread at all: the shift is exact
        d = float(after.mean() - before.mean())
        return d, d
    ci = stats.ttest_ind(after, before, equal_var=False).confidence_interval(confidence)
    return float(ci.low), float(ci.high)
