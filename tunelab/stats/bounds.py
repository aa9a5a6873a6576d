"""Bounds every verdict shares: the t half-width, Welch's interval, the 80 %-power z and the rule from an
interval to a call (``docs/statistics.md``, "The verdict"). scipy computes the quantiles and the Welch test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats

__all__ = ["POWER_Z80", "WelchInterval", "interval_call", "t_half_width", "welch_interval"]

#: The standard normal quantile of 80 % power (0.8416): a minimum detectable effect is the decision threshold
#: plus this many standard errors.
POWER_Z80 = float(stats.norm.ppf(0.8))

def t_half_width(se: float | np.ndarray, df: float | np.ndarray, level: float) -> float | np.ndarray:
    """Half-width ``t_{level}(df) x se`` of a t interval (``level`` is the one-sided quantile: 0.975 for a
    two-sided 95 % interval, 0.95 for a one-sided 95 % bound). Works element-wise on arrays."""
    q = stats.t.ppf(level, df)
    return float(q) * se if np.ndim(q) == 0 else q * se


def interval_call(low: float, high: float, higher_is_better: bool,
                  equivalence: tuple[float, float] | None = None) -> Literal["better", "worse", "equivalent"] | None:
    """The call an interval ``[low, high]`` of a change (candidate against baseline, on any scale where 0 is no
    change) supports: ``better``/``worse`` when it excludes 0 (strictly; the side that is better depends on
    ``higher_is_better``), ``equivalent`` when it lies strictly inside ``equivalence`` (low bound, high bound on
    the same scale), else None (no call)."""
    if low > 0 or high < 0:
        return "better" if (low > 0) == higher_is_better else "worse"
    if equivalence is not None and equivalence[0] < low and high < equivalence[1]:
        return "equivalent"
    return None


class WelchInterval(BaseModel):
    """Welch's t interval of ``mean(candidate) - mean(baseline)`` in the metric's unit."""

    model_config = ConfigDict(frozen=True)
    low: float = Field(description="lower end of the two-sided interval (metric unit)")
    high: float = Field(description="upper end of the two-sided interval (metric unit)")
    p_value: float = Field(description="two-sided p-value of Welch's t test")
    df: float = Field(description="Welch-Satterthwaite degrees of freedom")


def welch_interval(baseline: Sequence[float], candidate: Sequence[float], confidence: float) -> WelchInterval:
    """Welch's t interval (unequal variances; Welch 1947, scipy ``ttest_ind(equal_var=False)``) of
    ``mean(candidate) - mean(baseline)``.

    Args:
        baseline, candidate: >= 2 values each (boot means in the metric's unit).
        confidence: two-sided level, e.g. 0.95.

    Returns:
        :class:`WelchInterval`. Both sides without spread: the interval is the point difference (p 1 when it is
        0, else 0), on ``n_b + n_c - 2`` df.

    Raises:
        ValueError: a side with fewer than 2 values.
    """
    xb, xc = np.asarray(baseline, float), np.asarray(candidate, float)
    if len(xb) < 2 or len(xc) < 2:
        raise ValueError(f"welch_interval needs >= 2 values a side, got {len(xb)} and {len(xc)}")
    diff = float(xc.mean() - xb.mean())
    if xb.var(ddof=1) / len(xb) + xc.var(ddof=1) / len(xc) == 0.0:
        return WelchInterval(low=diff, high=diff, p_value=1.0 if diff == 0.0 else 0.0, df=float(len(xb) + len(xc) - 2))
    res = stats.ttest_ind(xc, xb, equal_var=False)
    ci = res.confidence_interval(confidence_level=confidence)
    return WelchInterval(low=float(ci.low), high=float(ci.high), p_value=float(res.pvalue), df=float(res.df))
