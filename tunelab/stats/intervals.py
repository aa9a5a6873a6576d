"""Fixed-design A/B intervals of a relative effect on the log scale, with borrowed variance and the MDE.

Method (``docs/statistics.md``):

* Each boot is one value per cell (workload x load level) of one metric: the mean of its windows. The effect
  is the ratio candidate/baseline, estimated on the log scale: ``diff_log = mean(log c) - mean(log b)``, the
  ratio of geometric means; the interval ``exp(diff_log +- t se) - 1`` never reaches -100 %.
* Variance: the two sides' log values are pooled within a cell (``s2`` on ``n_b + n_c - 2`` df: one CV per
  cell, the same on both sides, which is what the log scale assumes). With 2 boots per side that is 2 df, too
  few: the cells of one comparison borrow from each other by empirical Bayes (Smyth, "Linear models and
  empirical Bayes methods for assessing differential expression", SAGMB 2004; limma's moderated t): the cells'
  ``s2`` are modelled as draws around a common ``s0^2`` with prior df ``d0`` estimated from their spread, the
  posterior variance is ``(d0 s0^2 + d s2) / (d0 + d)`` and the t quantile has ``d0 + d`` df, capped at the
  effective df of all cells: the cells share boots (a fast boot is fast everywhere, correlation 0.4-0.76 on the
  H200), so their variances are not independent and ``sum(d) / (1 + (k - 1) rho^2)`` df is what they carry. Heterogeneous cells give a small ``d0`` (little borrowing), homogeneous ones a large
  ``d0`` (close to one pooled variance). A history prior from the noise model can replace the cross-cell
  prior (``prior_var``, ``prior_df``).
* Paired (``paired_log_intervals``): where boot i of A and boot i of B ran one after the other (an interleaved
  sweep), the effect is the mean of the pairs' log ratios ``d_i = log c_i - log b_i`` and its variance that of
  ``d`` (``n - 1`` df), moderated across cells the same way. Slow drift of the host that both boots of a pair
  share cancels in ``d``: on the H200 the deviations of adjacent A and B boots correlated 0.4-0.7
  (evidence/h200-2026-12-02-side-by-side), so ``var(d) = 2 var (1 - rho)`` is about half the unpaired
  ``2 var``. It costs degrees of freedom (``n - 1`` per cell instead of ``2n - 2``) and takes no history prior
  (history holds single boots' variance, not that of pair differences): it pays from about 3 pairs and 3 cells.
  Choose it by the design (``compare(paired=True)``, ``tunelab compare --paired``), before looking at the data.
* MDE: the smallest true ratio change detected with 80 % power at this design,
  ``exp((t_{1-alpha/2} + t_{0.8}) se) - 1`` (the same on the log scale both ways: ``1/(1+mde) - 1`` downwards).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from tunelab.stats.bounds import t_half_width

__all__ = ["CELL_RESIDUAL_CORR", "LogInterval", "eb_prior", "effective_pooled_df", "log_ab_intervals", "mde_rel",
           "mde_text", "paired_log_intervals"]

#: Correlation of one boot's deviations across the cells of a sweep (a fast boot is fast in every workload and
#: load level): 0.4-0.76 for output tokens/s and 0.15-0.68 for p50 TPOT on the H200 evidence
#: (evidence/h200-2026-11-29-versions, 16 boots). Correlated cells carry less information about the variance
#: than independent ones, so the degrees of freedom borrowed across cells are cut by this (see
#: :func:`effective_pooled_df`); 0.6 is at the upper end, i.e. conservative.
CELL_RESIDUAL_CORR = 0.6


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (Newton's method as in limma's trigammaInverse)."""
    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        dif = tri * (1.0 - tri / x) / float(special.polygamma(2, y))
        y += dif
        if -dif / y < 1e-8:
            break
    return y


def eb_prior(s2: Sequence[float], df: Sequence[float]) -> tuple[float, float]:
    """(s0^2, d0): the prior variance and its degrees of freedom from cell variances (Smyth 2004, fitFDist).

    ``s2``: sample variances (> 0) of the cells; ``df``: their degrees of freedom (> 0). Needs >= 3 usable
    cells; returns ``(nan, 0)`` with fewer (nothing to borrow from). ``d0`` is ``inf`` when the cells' spread
    is no larger than sampling alone explains (then the cells share one variance).
    """
    s2a, dfa = np.asarray(s2, float), np.asarray(df, float)
    ok = (s2a > 0) & (dfa > 0) & np.isfinite(s2a)
    s2a, dfa = s2a[ok], dfa[ok]
    if len(s2a) < 3:
        return math.nan, 0.0
    e = np.log(s2a) - special.digamma(dfa / 2) + np.log(dfa / 2)
    emean = float(e.mean())
    evar = float(((e - emean) ** 2).sum() / (len(e) - 1) - special.polygamma(1, dfa / 2).mean())
    if evar <= 0:
        return math.exp(emean), math.inf
    d0 = 2.0 * _trigamma_inverse(evar)
    return math.exp(emean + special.digamma(d0 / 2) - math.log(d0 / 2)), d0


def effective_pooled_df(dfs: Sequence[float], corr: float = CELL_RESIDUAL_CORR) -> float:
    """Degrees of freedom of a variance pooled over cells whose residuals correlate with ``corr``.

    ``k`` cells of ``d`` df each share boots; squared deviations of correlated normals correlate with
    ``corr^2``, so the pooled variance has the precision of ``sum(d) / (1 + (k - 1) corr^2)`` independent df
    (the design effect of equally correlated estimates). Returns 0 for no cells.
    """
    d = [x for x in dfs if x and x > 0]
    if not d:
        return 0.0
    return float(sum(d) / (1.0 + (len(d) - 1) * corr**2))


def mde_rel(se_log: float, df: float, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable relative effect (two-sided test at ``alpha``, ``power``) for a log-scale SE on ``df``."""
    if not (math.isfinite(se_log) and df > 0):
        return math.inf
    return math.expm1((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se_log)


def mde_text(mde: float | None, digits: int = 1) -> str:
    """A log-scale minimum detectable effect as text, both ways: ``mde`` = expm1(k x SE) is the smallest detectable
    rise, and expm1(-k x SE) = -mde / (1 + mde) the smallest detectable fall, e.g. 0.05 -> ``-4.8%/+5.0%`` and
    3.788 -> ``-79.1%/+378.8%`` (a symmetric "+-378.8%" read as an impossible fall). ``-`` for None or not finite."""
    if mde is None or not math.isfinite(mde) or mde <= -1:
        return "-"
    return f"{-mde / (1 + mde):+.{digits}%}/{mde:+.{digits}%}"


@dataclass(frozen=True)
class LogInterval:
    """One cell's A/B on the log scale. ``rel_*`` are candidate/baseline - 1; ``df`` of the t quantile;
    ``var_log`` the variance of one boot's log value used; ``source`` says where it came from."""

    diff_log: float
    se_log: float
    df: float
    var_log: float
    rel: float
    rel_low: float
    rel_high: float
    p_value: float
    mde_rel: float
    source: str


def log_ab_intervals(cells: Sequence[tuple[Sequence[float], Sequence[float]]], *, confidence: float = 0.95,
                     borrow: bool = True, prior_var: Sequence[float] | None = None,
                     prior_df: Sequence[float] | None = None,
                     cell_corr: float = CELL_RESIDUAL_CORR) -> list[LogInterval | None]:
    """Log-scale A/B interval per cell, variances moderated across cells (or by a history prior).

    Args:
        cells: per cell ``(baseline_values, candidate_values)``, positive boot values in the metric's unit.
        confidence: two-sided level.
        borrow: moderate each cell's variance with the empirical-Bayes prior of all cells (>= 3 cells with
            variance); False: each cell on its own pooled variance.
        prior_var, prior_df: per cell, a variance of one boot's log value and its df from history (the noise
            model); when given for a cell it is the prior instead of the cross-cell one (NaN / 0: none).
        cell_corr: correlation of a boot's deviations across cells; the df borrowed across cells are capped
            at :func:`effective_pooled_df` (0: independent cells).

    Returns:
        One :class:`LogInterval` per cell, or None where no interval exists (a side without boots, or no
        degrees of freedom at all).

    Raises:
        ValueError: a non-positive or non-finite value (names the cell index), a bad confidence.
    """
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    alpha = 1.0 - confidence
    logs, s2, dfs = [], [], []
    for i, (b, c) in enumerate(cells):
        xb, xc = np.asarray(b, float), np.asarray(c, float)
        for side, x in (("baseline", xb), ("candidate", xc)):
            if len(x) and (~np.isfinite(x) | (x <= 0)).any():
                raise ValueError(f"cell {i}: {side} values must be positive and finite for a ratio, got {x.tolist()}")
        lb, lc = np.log(xb), np.log(xc)
        d = max(len(lb) - 1, 0) + max(len(lc) - 1, 0)
        ss = (((lb - lb.mean()) ** 2).sum() if len(lb) else 0.0) + (((lc - lc.mean()) ** 2).sum() if len(lc) else 0.0)
        logs.append((lb, lc))
        dfs.append(float(d))
        s2.append(ss / d if d else math.nan)
    variances = _moderated(s2, dfs, borrow, cell_corr, prior_var, prior_df)
    out: list[LogInterval | None] = []
    for (lb, lc), mv in zip(logs, variances):
        if not len(lb) or not len(lc) or mv is None:
            out.append(None)
            continue
        var, df_t, source = mv
        out.append(_interval(float(lc.mean() - lb.mean()), math.sqrt(var * (1 / len(lb) + 1 / len(lc))), df_t,
                             var, source, alpha))
    return out


def paired_log_intervals(cells: Sequence[tuple[Sequence[float], Sequence[float]]], *, confidence: float = 0.95,
                         borrow: bool = True, cell_corr: float = CELL_RESIDUAL_CORR) -> list[LogInterval | None]:
    """Log-scale A/B interval per cell from pairs of boots, variances of the pairs' log ratios moderated across
    cells (module doc, "Paired").

    Args:
        cells: per cell ``(baseline_values, candidate_values)`` of equal length, positive boot values in the
            metric's unit; element i of both is one pair (boots that ran one after the other).
        confidence: two-sided level.
        borrow: moderate each cell's variance with the empirical-Bayes prior of all cells (>= 3 cells with
            variance); False: each cell on its own ``n - 1`` df.
        cell_corr: correlation of a boot's deviations across cells; the df borrowed across cells are capped
            at :func:`effective_pooled_df`.

    Returns:
        One :class:`LogInterval` per cell (``var_log`` is half the variance of a pair's log ratio: the variance
        of one boot's log value that would give it without pairing), or None where a cell has fewer than 2
        pairs.

    Raises:
        ValueError: sides of unequal length, a non-positive or non-finite value (names the cell index), a bad
            confidence.
    """
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    diffs, s2, dfs = [], [], []
    for i, (b, c) in enumerate(cells):
        xb, xc = np.asarray(b, float), np.asarray(c, float)
        if len(xb) != len(xc):
            raise ValueError(f"cell {i}: pairs need as many baseline as candidate boots, got {len(xb)} and {len(xc)}")
        for side, x in (("baseline", xb), ("candidate", xc)):
            if len(x) and (~np.isfinite(x) | (x <= 0)).any():
                raise ValueError(f"cell {i}: {side} values must be positive and finite for a ratio, got {x.tolist()}")
        d = np.log(xc) - np.log(xb)
        diffs.append(d)
        dfs.append(float(max(len(d) - 1, 0)))
        s2.append(float(d.var(ddof=1)) if len(d) > 1 else math.nan)
    variances = _moderated(s2, dfs, borrow, cell_corr, None, None)
    out: list[LogInterval | None] = []
    for d, mv in zip(diffs, variances):
        if len(d) < 2 or mv is None:
            out.append(None)
            continue
        var, df_t, source = mv
        out.append(_interval(float(d.mean()), math.sqrt(var / len(d)), df_t, var / 2, f"paired ({len(d)} pairs): {source}",
                             1.0 - confidence))
    return out


def _moderated(s2: list[float], dfs: list[float], borrow: bool, cell_corr: float,
               prior_var: Sequence[float] | None, prior_df: Sequence[float] | None
               ) -> list[tuple[float, float, str] | None]:
    """Per cell (variance, df of the t quantile, source): a history prior where given, else the cells'
    empirical-Bayes prior (df capped at the cells' effective df), else the cell alone; None without any df."""
    s0, d0 = eb_prior(s2, dfs) if borrow else (math.nan, 0.0)
    pooled_df = effective_pooled_df(dfs, cell_corr)
    out: list[tuple[float, float, str] | None] = []
    for i, (v, d) in enumerate(zip(s2, dfs)):
        pv = prior_var[i] if prior_var is not None else math.nan
        pdf = prior_df[i] if prior_df is not None else 0.0
        if pv is not None and math.isfinite(pv) and pdf and pdf > 0:
            out.append(((pdf * pv + (d * v if d else 0.0)) / (pdf + d), pdf + d,
                        f"cell {d:g} df + history prior {pdf:g} df"))
        elif math.isfinite(s0) and d0 > 0:
            if math.isinf(d0):
                df_t = max(pooled_df, d)
                out.append((s0, df_t, f"pooled over cells: {df_t:.3g} effective df (cells' variances agree)"))
            else:
                out.append(((d0 * s0 + (d * v if d else 0.0)) / (d0 + d), max(min(d0 + d, pooled_df), d),
                            f"cell {d:g} df + cross-cell prior {d0:.3g} df (empirical Bayes)"))
        elif d:
            out.append((v, d, f"cell alone: {d:g} df"))
        else:
            out.append(None)
    return out


def _interval(diff: float, se: float, df_t: float, var: float, source: str, alpha: float) -> LogInterval:
    """The :class:`LogInterval` of a log difference ``diff`` with standard error ``se`` on ``df_t`` df."""
    if se == 0.0:
        lo = hi = diff
        p = 1.0 if diff == 0 else 0.0
    else:
        hw = t_half_width(se, df_t, 1 - alpha / 2)
        lo, hi = diff - hw, diff + hw
        p = float(2 * stats.t.sf(abs(diff) / se, df_t))
    return LogInterval(diff_log=diff, se_log=se, df=float(df_t), var_log=float(var), rel=math.expm1(diff),
                       rel_low=math.expm1(lo), rel_high=math.expm1(hi), p_value=p,
                       mde_rel=mde_rel(se, df_t, alpha=alpha), source=source)
