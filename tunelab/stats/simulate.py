"""Seeded simulation of interleaved A/B boot streams, and the decision rules run on them (vectorised).

Used by the calibration benchmark (``benchmarks/calibration.py``) and the tests of the sequential rule: every
stream is a sequence of pairs of boots (A then B), each boot reduced to one summary value of one metric.

Model of a boot's log value (the noise levels of the H200 evidence, ``docs/statistics.md``):
``log y = log base + effect * [side is B] + drift_t + boot_noise``, with ``boot_noise ~ N(0, sd_boot_log^2)``
independent per boot and ``drift_t`` a random walk over pairs (step ``drift_sd_log``) shared by the two boots
of a pair: the slow host-side drift that adjacent boots share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tunelab.stats.sequential import DEFAULT_PRIOR_DF, halfwidth_log

__all__ = ["Outcome", "fixed_welch", "sequential_rule", "simulate_pairs", "welch_every_look"]


def simulate_pairs(*, effect_rel: float, sd_boot_log: float, n_pairs: int, streams: int, seed: int,
                   drift_sd_log: float = 0.0, base: float = 1000.0) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate): arrays of shape (streams, n_pairs) of positive boot values (metric units).

    ``effect_rel``: candidate/baseline - 1 (0 for A/A). ``sd_boot_log``: between-boot SD of log values (about
    the boot CV). Raises ValueError for sizes < 1, a negative SD or effect_rel <= -1.
    """
    if n_pairs < 1 or streams < 1:
        raise ValueError(f"n_pairs and streams must be >= 1, got {n_pairs}, {streams}")
    if sd_boot_log < 0 or drift_sd_log < 0 or effect_rel <= -1:
        raise ValueError("sd_boot_log and drift_sd_log must be >= 0 and effect_rel > -1")
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(0.0, drift_sd_log, size=(streams, n_pairs)), axis=1)
    lb = math.log(base) + drift + rng.normal(0.0, sd_boot_log, size=(streams, n_pairs))
    lc = math.log(base) + math.log1p(effect_rel) + drift + rng.normal(0.0, sd_boot_log, size=(streams, n_pairs))
    return np.exp(lb), np.exp(lc)


@dataclass(frozen=True)
class Outcome:
    """Per-stream result of a decision rule: ``called`` (an effect was called), ``direction`` (+1 candidate
    higher, -1 lower, 0 none), ``equivalent`` (called equivalent), ``pairs`` (pairs run when it stopped)."""

    called: np.ndarray
    direction: np.ndarray
    equivalent: np.ndarray
    pairs: np.ndarray


def sequential_rule(baseline: np.ndarray, candidate: np.ndarray, *, alpha: float = 0.05,
                    margin: float | None = None, prior_sd: float | None = None,
                    prior_df: float | None = None) -> Outcome:
    """Run :func:`tunelab.stats.sequential.sequential_ab`'s rule on every stream, looking after every pair.

    Vectorised equivalent of calling ``sequential_ab`` after each pair and stopping at the first decided call
    or at the last pair (the budget). Arrays: shape (streams, n_pairs), positive.
    """
    d = np.log(candidate) - np.log(baseline)
    streams, n_max = d.shape
    n = np.broadcast_to(np.arange(1, n_max + 1, dtype=float), d.shape)
    mean = np.cumsum(d, axis=1) / n
    ss = np.maximum(np.cumsum(d * d, axis=1) - n * mean**2, 0.0)
    d0 = 0.0 if prior_sd is None else (DEFAULT_PRIOR_DF if prior_df is None else float(prior_df))
    hw = halfwidth_log(n, ss, s_hist=d0 * 2.0 * (prior_sd or 0.0) ** 2, d0=d0, alpha=alpha)
    sig = np.abs(mean) > hw
    eq = np.zeros_like(sig)
    if margin is not None:
        eq = (mean - hw > math.log1p(-margin)) & (mean + hw < math.log1p(margin)) & ~sig
    stop = sig | eq
    any_stop = stop.any(axis=1)
    first = np.where(any_stop, stop.argmax(axis=1), n_max - 1)
    rows = np.arange(streams)
    called = sig[rows, first]
    return Outcome(called=called, direction=np.where(called, np.sign(mean[rows, first]), 0).astype(int),
                   equivalent=eq[rows, first], pairs=first + 1)


def _welch_stat(b: np.ndarray, c: np.ndarray, n: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(significant, diff sign) of Welch's two-sided test on cumulative moments; arrays of looks."""
    mb, mc = b[0] / n, c[0] / n
    with np.errstate(divide="ignore", invalid="ignore"):  # n = 1: no variance, masked by the callers
        vb = np.maximum(b[1] - n * mb**2, 0.0) / (n - 1)
        vc = np.maximum(c[1] - n * mc**2, 0.0) / (n - 1)
        se2 = (vb + vc) / n
        df = se2**2 / ((vb / n) ** 2 / (n - 1) + (vc / n) ** 2 / (n - 1))
        t = (mc - mb) / np.sqrt(se2)
    crit = stats.t.ppf(1 - alpha / 2, np.nan_to_num(df, nan=1.0))
    return np.abs(t) > crit, np.sign(mc - mb)


def welch_every_look(baseline: np.ndarray, candidate: np.ndarray, *, alpha: float = 0.05) -> Outcome:
    """The unsound rule: Welch's fixed-sample test on the boot values after every pair from 2 pairs on, stop at
    the first significant look. Shows why a fixed-sample test must not be repeated (its error rate grows)."""
    streams, n_max = baseline.shape
    n = np.broadcast_to(np.arange(1, n_max + 1, dtype=float), baseline.shape)
    b = (np.cumsum(baseline, axis=1), np.cumsum(baseline**2, axis=1))
    c = (np.cumsum(candidate, axis=1), np.cumsum(candidate**2, axis=1))
    sig, sign = _welch_stat(b, c, n, alpha)
    sig[:, 0] = False  # one boot per side: no variance
    any_sig = sig.any(axis=1)
    first = np.where(any_sig, sig.argmax(axis=1), n_max - 1)
    rows = np.arange(streams)
    return Outcome(called=any_sig, direction=np.where(any_sig, sign[rows, first], 0).astype(int),
                   equivalent=np.zeros(streams, bool), pairs=first + 1)


def fixed_welch(baseline: np.ndarray, candidate: np.ndarray, *, boots: int, alpha: float = 0.05) -> Outcome:
    """Today's fixed design: Welch's interval on ``boots`` boots per side (raw values), one look at the end."""
    if boots < 2 or boots > baseline.shape[1]:
        raise ValueError(f"boots must be in [2, {baseline.shape[1]}], got {boots}")
    b, c = baseline[:, :boots], candidate[:, :boots]
    n = np.full((b.shape[0],), float(boots))
    sig, sign = _welch_stat((b.sum(1), (b**2).sum(1)), (c.sum(1), (c**2).sum(1)), n, alpha)
    return Outcome(called=sig, direction=np.where(sig, sign, 0).astype(int), equivalent=np.zeros(len(sig), bool),
                   pairs=np.full(len(sig), boots))
