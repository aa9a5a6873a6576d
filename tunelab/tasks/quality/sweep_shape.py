"""Sweep-level quality checks of the data's shape: a trend of the anchor's boots over the sweep
(``anchor_drift``) and multimodal / phase-locked windows per metric (``windows_multimodal``).

Why: the anchored comparison (``stats.anchored``) assumes the anchor's boots differ only by noise and, at most, a
drift it models; a steady trend of the anchor over the sweep says the host drifted, and a balanced order
(``trial_order``) is what keeps it out of the verdicts. Windows of one cell that fall into two clusters (equal-length
requests under a closed loop run in lockstep waves, and a short window lands in one phase or the other: on the
H200 p50 TTFT ~920 ms with TPOT 11.8 ms or ~600-770 ms with 12.5 ms) carry a variance two windows a boot cannot
estimate; it is named so a reader does not take a phase for an effect.

Both are pure functions over frames (pandas, scipy; no great-expectations, which the per-trial suites use):
they judge several trials of a sweep together, which the per-trial validation does not see. Each returns one row
per checked group with ``check, label, success, observed, threshold, detail`` (``success`` None: skipped, with
the reason in ``detail``), the shape of ``quality_checks`` rows.

Error rates (``tests/test_sweep_shape.py``, seeded simulations):

* ``anchor_drift``: OLS slope of the anchor's log boot values on boot order per (cell, metric), two-sided t test;
  the p-values of the sweep's cells x metrics are adjusted by Holm (statsmodels ``multipletests``), so a sweep
  without drift is flagged in at most ``alpha`` (5 %) of sweeps whatever the number of cells (under independent
  or positively dependent cells Holm's family-wise bound holds). Needs >= 4 anchor boots.
* ``windows_multimodal``: per (config, cell, metric), the log window values split into two groups at the widest
  gap of their sorted values; the statistic is Ashman's D = sqrt(2) |m1 - m2| / sqrt(s1^2 + s2^2) (Ashman, Bird
  and Zepeda 1994: D > 2 for a clean separation) of the best split with >= 2 windows a side; the threshold is the
  95th percentile of that statistic on normal samples of the same size (seeded Monte Carlo), so unimodal
  normal windows are flagged in 5 % of groups. Needs >= 6 windows.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

__all__ = ["anchor_drift", "ashman_d", "windows_multimodal"]

_OUT = ["check", "label", "success", "observed", "threshold", "detail"]


def anchor_drift(rows: pd.DataFrame, *, alpha: float = 0.05, min_boots: int = 4) -> pd.DataFrame:
    """Flag a trend of the anchor's boots over one sweep.

    Args:
        rows: the anchor's boots of one sweep, one row per (boot, cell, metric): ``order`` (boot position in the
            sweep), ``cell`` (a label, e.g. ``short_chat c=32``), ``metric``, ``value`` (> 0, the boot's value).
        alpha: family-wise false-alarm rate of the sweep (Holm over cells x metrics).
        min_boots: fewest anchor boots a trend is tested on.

    Returns:
        One row per (cell, metric): ``success`` False where the Holm-adjusted p < alpha; ``observed`` the log
        change from the first to the last boot of the sweep (slope x order span); ``threshold`` alpha.

    Raises:
        ValueError: a missing column (named).
    """
    missing = [c for c in ("order", "cell", "metric", "value") if c not in rows.columns]
    if missing:
        raise ValueError(f"anchor_drift: rows miss columns {missing}; need order, cell, metric, value per anchor boot")
    out, pvals, idx = [], [], []
    for (cell, metric), g in rows.groupby(["cell", "metric"], sort=True):
        g = g[np.isfinite(g["value"].astype(float)) & (g["value"].astype(float) > 0)]
        label = f"anchor {cell} {metric}"
        if len(g) < min_boots or g["order"].nunique() < 2:
            out.append(["anchor_drift", label, None, math.nan, alpha,
                        f"skipped: {len(g)} anchor boot(s), a trend needs {min_boots}"])
            continue
        x, y = g["order"].to_numpy(float), np.log(g["value"].to_numpy(float))
        fit = stats.linregress(x, y)
        p = float(fit.pvalue) if np.isfinite(fit.pvalue) else 1.0
        change = float(fit.slope * (x.max() - x.min()))
        out.append(["anchor_drift", label, True, change, alpha, f"{change:+.1%} over the sweep, p = {p:.3g}"])
        pvals.append(p)
        idx.append(len(out) - 1)
    if pvals:
        reject, adj, _, _ = multipletests(pvals, alpha=alpha, method="holm")
        for i, r, pa in zip(idx, reject, adj):
            out[i][2] = not bool(r)
            out[i][5] += f", Holm-adjusted p = {pa:.3g} ({'trend' if r else 'no trend'} at {alpha:g} over "\
                         f"{len(pvals)} cell x metric)"
    return pd.DataFrame(out, columns=_OUT)


def ashman_d(values: np.ndarray) -> float:
    """Ashman's D of the best two-group split of ``values`` (sorted, >= 2 a side): the largest
    ``sqrt(2) |m1 - m2| / sqrt(s1^2 + s2^2)`` over split points (sample SDs; a side with no spread counts its
    SD as 1e-12 of the scale). nan for fewer than 4 values."""
    v = np.sort(np.asarray(values, float))
    n = len(v)
    if n < 4:
        return math.nan
    best = 0.0
    floor = 1e-12 * max(abs(v).max(), 1e-300)
    for k in range(2, n - 1):
        a, b = v[:k], v[k:]
        s = math.sqrt(a.var(ddof=1) + b.var(ddof=1)) or floor
        best = max(best, math.sqrt(2) * abs(b.mean() - a.mean()) / s)
    return best


@lru_cache(maxsize=64)
def _null_quantile(n: int, q: float = 0.95, sims: int = 2000) -> float:
    """The ``q`` quantile of :func:`ashman_d` on ``n`` standard normal values (seeded, so stable)."""
    rng = np.random.default_rng(20261203 + n)
    return float(np.quantile([ashman_d(rng.standard_normal(n)) for _ in range(sims)], q))


def windows_multimodal(windows: pd.DataFrame, *, min_windows: int = 6) -> pd.DataFrame:
    """Flag groups of windows whose values fall into two clusters (lockstep phases, two modes).

    Args:
        windows: one row per measured window: ``group`` (a label: config, cell; the windows of all boots of one
            config in one cell), ``metric`` and ``value`` (> 0).
        min_windows: fewest windows a group is tested on.

    Returns:
        One row per (group, metric): ``success`` False when Ashman's D of the best split exceeds the 95th
        percentile under normal windows of that count (``threshold``); ``observed`` that D; ``detail`` names
        the two modes (geometric means and window counts).

    Raises:
        ValueError: a missing column (named).
    """
    missing = [c for c in ("group", "metric", "value") if c not in windows.columns]
    if missing:
        raise ValueError(f"windows_multimodal: windows miss columns {missing}; need group, metric, value per window")
    out = []
    for (group, metric), g in windows.groupby(["group", "metric"], sort=True):
        v = g["value"].astype(float).to_numpy()
        v = np.log(v[np.isfinite(v) & (v > 0)])
        label = f"{group} {metric}"
        if len(v) < min_windows:
            out.append(["windows_multimodal", label, None, math.nan, math.nan,
                        f"skipped: {len(v)} window(s), a shape needs {min_windows}"])
            continue
        d, thr = ashman_d(v), _null_quantile(len(v))
        s = np.sort(v)
        k = int(np.argmax(np.diff(s))) + 1
        lo, hi = s[:k], s[k:]
        detail = (f"Ashman's D {d:.2f} vs {thr:.2f} (5 % of normal samples of {len(v)}); widest gap splits "
                  f"{len(lo)} windows near {math.exp(lo.mean()):.4g} from {len(hi)} near {math.exp(hi.mean()):.4g}")
        out.append(["windows_multimodal", label, not d > thr, d, thr,
                    ("two modes (multimodal or phase-locked windows): " if d > thr else "one mode: ") + detail])
    return pd.DataFrame(out, columns=_OUT)
