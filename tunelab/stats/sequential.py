"""Sequential A/B of boots (``replicates: auto``): paired log ratios and an always-valid confidence sequence.

Method (``docs/statistics.md`` has the derivation, the assumptions and the simulated error rates):

* Data: per boot, one summary value of one metric in one cell (workload x load level), e.g. the boot's mean
  output tokens/s. Boots run interleaved A, B, A, B, ...; boot i of A and boot i of B are a pair, and the
  statistic is the log ratio ``d_i = log(candidate_i) - log(baseline_i)``. Slow drift of the machine (the H200
  host drifts over tens of seconds to minutes) is shared by the two boots of a pair and cancels.
* Model: ``d_i ~ N(mu, sigma^2)`` independent, sigma unknown. ``exp(mu) - 1`` is the relative effect.
* Interval: the confidence sequence of Lai (1976) for a normal mean with unknown variance, i.e. the set of
  ``mu0`` whose scale-invariant Gaussian-mixture Bayes factor stays below ``1/alpha``:
  ``BF_n(mu0) = (1 + n g)^(-1/2) * (Q0 / Q1)^(N/2)`` with ``Q0 = S_hist + sum (d_i - mu0)^2``,
  ``Q1 = Q0 - g n^2 (mean(d) - mu0)^2 / (1 + n g)``, ``N = n + d0``; the standardised effect ``(mu - mu0)/sigma``
  is mixed over ``N(0, g)`` and sigma over the right-Haar prior ``1/sigma`` (Rouder et al. 2009 give the same
  closed form for ``d0 = 0``). Under ``mu = mu0`` this is a nonnegative martingale for every sigma (it is a
  likelihood ratio of the scale-invariant reduction of the data; Perez-Ortiz, Lardy, de Heide and Grunwald,
  "E-statistics, group invariance and anytime-valid testing", Ann. Statist. 2024; Wang and Ramdas, "Anytime-valid
  t-tests and confidence sequences for Gaussian means with unknown variance", 2023), so by Ville's inequality
  ``P(exists n: mu not in CS_n) <= alpha``: the interval holds at every look at once, and stopping whenever it
  decides keeps the error rate at ``alpha``.
* History (``prior_sd``): ``d0`` degrees of freedom of past residuals with the same sigma enter as
  ``S_hist = d0 * 2 * prior_sd^2`` (a log ratio of two boots has twice a boot's variance; pairing can only lower
  it, so a prior from unpaired history is conservative). Assumption: the history's between-boot SD is not
  smaller than today's; if it is, the error rate grows (``docs/statistics.md`` shows by how much).
* Calls: ``better``/``worse`` when the interval excludes 0 (direction from ``higher_is_better``),
  ``equivalent`` when it lies inside ``[-margin, +margin]`` (relative), else ``undecided``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import optimize

from tunelab.stats.bounds import POWER_Z80, interval_call

__all__ = ["MIXTURE_G", "MIXTURE_GS", "MIXTURE_WEIGHTS", "SequentialVerdict", "boundary_u", "first_finite_pair", "confidence_sequence_log",
           "halfwidth_log", "sequential_ab"]

#: Variance of the standardised effect (mu / sigma of a pair's log ratio) in the mixture. 0.5 puts the
#: boundary's tightest point near 10-30 pairs for effects of 0.3-0.7 sigma (a +5 % effect at the pair SDs of
#: 7-14 % measured on the H200); chosen by the power simulation in benchmarks/calibration.py, fixed before use.
MIXTURE_G = 0.5
#: Mixture components: the standardised effect is mixed over N(0, g) for each g, with these weights. A mixture
#: of e-processes is an e-process; the wide component (g = 100) lets a very large effect (a 3x TPOT change)
#: be decided after 3 pairs without history instead of 6, at a small cost in power for 5 % effects.
MIXTURE_GS = (MIXTURE_G, 100.0)
MIXTURE_WEIGHTS = (0.8, 0.2)
#: Prior degrees of freedom given to ``prior_sd`` when the caller does not state them (a few boots of history).
DEFAULT_PRIOR_DF = 4.0


@dataclass(frozen=True)
class SequentialVerdict:
    """The state of a sequential A/B after ``n_pairs`` pairs of boots.

    Attributes:
        call: ``better`` / ``worse`` (interval excludes 0), ``equivalent`` (interval inside +-margin) or
            ``undecided``.
        rel_change: candidate/baseline - 1 from the mean log ratio (a ratio of geometric means).
        ci_low, ci_high: always-valid ``1 - alpha`` interval of candidate/baseline - 1; never below -1;
            ``-1``/``inf`` while the data cannot bound it (one pair and no history).
        n_pairs: pairs used.
        mde: minimum detectable relative effect at 80 % power at this design (this many pairs, this variance):
            the true effect whose estimate would fall outside this look's interval with probability 0.8.
        sd_log: SD of a pair's log ratio used (pooled with the history's degrees of freedom).
        df: degrees of freedom behind ``sd_log`` (pairs - 1 + prior_df).
        method: how it was computed.
    """

    call: Literal["better", "worse", "equivalent", "undecided"]
    rel_change: float
    ci_low: float
    ci_high: float
    n_pairs: int
    mde: float
    method: str
    sd_log: float = math.nan
    df: float = 0.0

    @property
    def decided(self) -> bool:
        """True unless the call is ``undecided``."""
        return self.call != "undecided"


def confidence_sequence_log(d: Sequence[float] | np.ndarray, *, alpha: float = 0.05, s_hist: float = 0.0,
                            d0: float = 0.0) -> tuple[float, float, float]:
    """(mean, half_width, pooled_sd) of the always-valid interval for the mean of ``d`` (any units, e.g. log ratios).

    The interval is ``mean +- half_width``; ``half_width`` is ``inf`` when the boundary is not yet finite (one
    observation without history). ``s_hist``: sum of squares of ``d0`` history residuals with the same variance.
    Raises ValueError for alpha outside (0, 1), g <= 0 or negative history.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if s_hist < 0 or d0 < 0:
        raise ValueError(f"need s_hist >= 0 and d0 >= 0, got s_hist={s_hist}, d0={d0}")
    x = np.asarray(d, dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.inf, math.nan
    mean = float(x.mean())
    ss = float(((x - mean) ** 2).sum())
    a = s_hist + ss
    big_n = n + d0
    pooled_sd = math.sqrt(a / (big_n - 1)) if big_n > 1 else math.nan
    if a <= 0.0:
        # Identical values and no history: the scale is unknown (0 or not), no finite statement is valid.
        return mean, math.inf, pooled_sd
    return mean, float(halfwidth_log(n, ss, s_hist=s_hist, d0=d0, alpha=alpha)), pooled_sd


def _log_bf_sup(u: float, n: float, big_n: float, gs: tuple[float, ...], ws: tuple[float, ...]) -> float:
    """log of the mixture Bayes factor at ``u = D / a`` (scale-free), D = n (mean - mu0)^2, a = sum of squares."""
    terms = [math.log(w) - 0.5 * math.log1p(n * g)
             + 0.5 * big_n * (math.log1p(u) - math.log1p(u / (1.0 + n * g))) for g, w in zip(gs, ws)]
    m = max(terms)
    return m + math.log(sum(math.exp(t - m) for t in terms))


def boundary_u(n: float, big_n: float, alpha: float, gs: tuple[float, ...] = MIXTURE_GS,
               ws: tuple[float, ...] = MIXTURE_WEIGHTS) -> float:
    """The u = n (mean - mu0)^2 / a at which the mixture Bayes factor reaches 1/alpha; inf if it never does.

    The Bayes factor depends on the data only through u (it is scale-invariant), so the boundary is a fixed
    function of (n, N, alpha): ``half_width = sqrt(a u / n)``.
    """
    target = -math.log(alpha)
    # As u grows each term tends to w c^((N-1)/2): if even that stays below 1/alpha no finite boundary exists.
    sup = _log_bf_sup(1e300, n, big_n, gs, ws)
    if sup <= target + 1e-12:
        return math.inf
    hi = 1.0
    while _log_bf_sup(hi, n, big_n, gs, ws) < target:
        hi *= 4.0
    return float(optimize.brentq(lambda u: _log_bf_sup(u, n, big_n, gs, ws) - target, 0.0, hi, xtol=1e-12, rtol=1e-10))


def first_finite_pair(alpha: float, max_pairs: int = 200) -> int | None:
    """The fewest pairs after which the confidence sequence of :func:`sequential_ab` *without* a prior can have
    a finite interval at error rate ``alpha`` (the cell's share): before it no data can decide the cell. ``None``
    when not within ``max_pairs``. With a prior (history) the interval is finite from the first pair.

    Example: alpha 0.05 -> 3 pairs; 0.0125 (0.05 over 4 cells) -> 4 pairs.
    """
    for k in range(1, max_pairs + 1):
        if math.isfinite(boundary_u(float(k), float(k), alpha)):
            return k
    return None


def halfwidth_log(n, ss, *, s_hist: float = 0.0, d0: float = 0.0, alpha: float = 0.05,
                  gs: tuple[float, ...] = MIXTURE_GS, ws: tuple[float, ...] = MIXTURE_WEIGHTS):
    """Half-width of the confidence sequence after ``n`` observations with centred sum of squares ``ss``.

    Vectorised over numpy arrays ``n`` (>= 1) and ``ss`` (>= 0) of one shape (the simulations call it for many
    streams and looks at once); returns ``inf`` where no finite boundary exists yet. Units: those of ``d``.
    """
    n = np.asarray(n, dtype=float)
    a = s_hist + np.asarray(ss, dtype=float)
    uniq = np.unique(n)
    u_of = {float(k): boundary_u(float(k), float(k) + d0, alpha, gs, ws) for k in uniq}
    u = np.vectorize(u_of.__getitem__, otypes=[float])(n)
    with np.errstate(invalid="ignore"):
        hw = np.sqrt(a * u / n)
    return np.where(np.isfinite(u) & (a > 0), hw, np.inf)

def sequential_ab(baseline: Sequence[float], candidate: Sequence[float], *, higher_is_better: bool,
                  alpha: float = 0.05, margin: float | None = None, prior_sd: float | None = None,
                  prior_df: float | None = None) -> SequentialVerdict:
    """Always-valid A/B verdict from per-boot values in boot order (call after every pair; stop when decided).

    Args:
        baseline, candidate: per-boot summary values (same metric, workload and load level; positive, in the
            metric's unit) in boot order; boot i of each side form a pair (adjacent boots of an interleaved
            A, B, A, B sequence). Pairs beyond the shorter side wait for their partner.
        higher_is_better: True for throughput (``*_per_s``), False for latency (``*_s``).
        alpha: error rate over all looks together (the interval fails to cover at any look with prob <= alpha).
        margin: equivalence margin on the relative scale (0.02 = +-2 %); None: no ``equivalent`` call.
        prior_sd: between-boot SD of log values from the noise model (history of the config); stabilises the
            variance with few pairs.
        prior_df: degrees of freedom of ``prior_sd`` (the noise model's ``df_boot``; default 4 when a
            ``prior_sd`` is given).

    Returns:
        SequentialVerdict (relative change, interval, call, MDE at this design).

    Raises:
        ValueError: a value that is not positive and finite (field named), alpha outside (0, 0.5], margin
            outside (0, 1), a negative prior.
    """
    if not 0.0 < alpha <= 0.5:
        raise ValueError(f"alpha must be in (0, 0.5], got {alpha}")
    if margin is not None and not 0.0 < margin < 1.0:
        raise ValueError(f"margin is a relative equivalence margin in (0, 1), e.g. 0.02; got {margin}")
    if prior_sd is not None and (not math.isfinite(prior_sd) or prior_sd < 0):
        raise ValueError(f"prior_sd must be a finite SD >= 0 of log boot values, got {prior_sd}")
    if prior_df is not None and prior_df < 0:
        raise ValueError(f"prior_df must be >= 0, got {prior_df}")
    xs = {}
    for name, vals in (("baseline", baseline), ("candidate", candidate)):
        arr = np.asarray(list(vals), dtype=float)
        bad = ~np.isfinite(arr) | (arr <= 0)
        if bad.any():
            raise ValueError(f"{name}: boot values must be positive and finite (a ratio is taken), "
                             f"got {arr[bad][:3].tolist()} at positions {np.flatnonzero(bad)[:3].tolist()}")
        xs[name] = arr
    n = min(len(xs["baseline"]), len(xs["candidate"]))
    d = np.log(xs["candidate"][:n]) - np.log(xs["baseline"][:n])
    d0 = 0.0 if prior_sd is None else (DEFAULT_PRIOR_DF if prior_df is None else float(prior_df))
    s_hist = d0 * 2.0 * (prior_sd or 0.0) ** 2
    mean, hw, sd = confidence_sequence_log(d, alpha=alpha, s_hist=s_hist, d0=d0)
    method = (f"paired log ratio of adjacent boots; always-valid {1 - alpha:.0%} confidence sequence (Lai 1976: "
              f"scale-invariant normal mixture over g={MIXTURE_GS}) on {n} pair{'s' if n != 1 else ''}"
              + (f" + history sd {prior_sd:.3g} on {d0:g} df" if prior_sd is not None else ""))
    if n == 0:
        return SequentialVerdict("undecided", math.nan, -1.0, math.inf, 0, math.inf, method, sd, d0)
    lo_log, hi_log = mean - hw, mean + hw
    ci_low = math.expm1(lo_log) if math.isfinite(lo_log) else -1.0
    ci_high = math.expm1(hi_log) if math.isfinite(hi_log) else math.inf
    if math.isfinite(hw) and math.isfinite(sd):
        mde = math.expm1(hw + POWER_Z80 * sd / math.sqrt(n))
    else:
        mde = math.inf
    # The rule every A/B shares (stats.bounds.interval_call), here on the log scale with the margin's logs.
    call: Literal["better", "worse", "equivalent", "undecided"] = interval_call(
        lo_log, hi_log, higher_is_better,
        None if margin is None else (math.log1p(-margin), math.log1p(margin))) or "undecided"
    return SequentialVerdict(call, math.expm1(mean), ci_low, ci_high, n, mde, method, sd, d0 + n - 1)
