"""Noise model: variance components of a metric per cell, by the method of moments (Kalibera and Jones 2013).

A cell is (runtime, config, workload, load level, metric). Its measurements are nested: boots (server starts)
> windows of a boot (repeats) > requests of a window. On the log scale (so components are relative: an SD of
0.05 is about a 5 % CV) the model is ``y_kj = mu + b_k + w_kj`` with ``b_k ~ (0, var_boot)`` and
``w_kj ~ (0, var_window)``; ``var_window`` includes the sampling noise of the window's requests,
``var_request_part = f * var_request / m`` (``m`` requests per window, ``var_request`` the variance of one
request's log latency, ``f`` = 1 for a mean, pi/2 for a median, ``p(1-p)/phi(z_p)^2`` for a p-quantile of a
log-normal), and the rest, ``var_window_slow``, is slow drift within a boot that a longer window does not
average away.

Estimator: one-way nested ANOVA (unbalanced), ``var_window = MSW`` on ``sum(n_k - 1)`` df and
``var_boot = max(0, (MSB - MSW) / n0)`` on ``K - 1`` df with ``n0 = (N - sum n_k^2 / N) / (K - 1)`` (Searle,
Casella and McCulloch, "Variance Components", 1992, ch. 3; Kalibera and Jones, "Rigorous benchmarking in
reasonable time", ISMM 2013, use the balanced form). Why not statsmodels' MixedLM: a cell has 2-4 boots, and
REML with so few groups often stops at the boundary or does not converge, while the moment estimator is closed
form, unbiased and defined from 2 boots; a negative estimate is truncated at 0 (reported, not hidden:
``var_boot_raw``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["quantile_factor", "request_components", "variance_components"]


def quantile_factor(metric: str) -> float:
    """Sampling-variance factor ``f`` of a window statistic of ``m`` requests: Var(log stat) ~ f var / m.

    ``*_mean_s`` -> 1, ``*_p50_s`` -> pi/2, ``*_pNN_s`` -> p(1-p)/phi(z_p)^2 (normal theory on log values);
    anything else (throughput) -> nan (no request-level model). Source: the asymptotic variance of a sample
    quantile, ``p(1-p) / (m f(q_p)^2)``.
    """
    if metric.endswith("_mean_s"):
        return 1.0
    parts = metric.rsplit("_", 2)
    if len(parts) == 3 and parts[2] == "s" and parts[1].startswith("p") and parts[1][1:].isdigit():
        p = int(parts[1][1:]) / 100.0
        return p * (1 - p) / stats.norm.pdf(stats.norm.ppf(p)) ** 2
    return math.nan


def variance_components(windows: pd.DataFrame, keys: Sequence[str], *, boot: str = "trial_id",
                        value: str = "value") -> pd.DataFrame:
    """Between-boot and between-window variance of log values per cell.

    Args:
        windows: one row per measured window: the ``keys`` columns, the boot id column ``boot`` and the
            window's metric value ``value`` (> 0; others are dropped). Optional columns, averaged per cell
            when present: ``window_s`` (window seconds), ``boot_s`` (boot seconds, one per boot).
        keys: columns naming a cell (e.g. runtime_name, config_key, workload, load_kind, load_value, metric).

    Returns:
        One row per cell: the keys, ``boots``, ``windows``, ``mean_value`` (geometric mean, metric unit),
        ``var_boot``, ``var_boot_raw`` (before truncation at 0), ``var_window``, ``df_boot``, ``df_window``,
        ``sd_boot_rel`` / ``sd_window_rel`` (sqrt of the log variances: about the CV), ``window_s``, ``boot_s``.
        Cells with one boot have ``var_boot`` nan; cells without repeats have ``var_window`` nan.

    Raises:
        ValueError: a missing column (named).
    """
    need = [*keys, boot, value]
    missing = [c for c in need if c not in windows.columns]
    if missing:
        raise ValueError(f"windows: missing columns {missing}; need the cell keys, {boot!r} and {value!r}")
    df = windows[np.isfinite(windows[value].astype(float)) & (windows[value].astype(float) > 0)].copy()
    df["_y"] = np.log(df[value].astype(float))
    rows = []
    for cell, g in df.groupby(list(keys), sort=True, dropna=False):
        by = g.groupby(boot)["_y"]
        n_k = by.size().to_numpy(float)
        m_k = by.mean().to_numpy(float)
        big_k, big_n = len(n_k), float(n_k.sum())
        grand = float(g["_y"].mean())
        dfw = float((n_k - 1).sum())
        ssw = float(((g["_y"] - by.transform("mean")) ** 2).sum())
        msw = ssw / dfw if dfw > 0 else math.nan
        if big_k >= 2:
            msb = float((n_k * (m_k - grand) ** 2).sum() / (big_k - 1))
            n0 = (big_n - float((n_k**2).sum()) / big_n) / (big_k - 1)
            raw = (msb - (msw if dfw > 0 else 0.0)) / n0
        else:
            raw = math.nan
        var_boot = max(raw, 0.0) if math.isfinite(raw) else math.nan
        rows.append({
            **dict(zip(keys, cell if isinstance(cell, tuple) else (cell,))),
            "boots": big_k, "windows": int(big_n), "mean_value": math.exp(grand),
            "var_boot": var_boot, "var_boot_raw": raw, "var_window": msw,
            "df_boot": float(big_k - 1), "df_window": dfw,
            "sd_boot_rel": math.sqrt(var_boot) if math.isfinite(var_boot) else math.nan,
            "sd_window_rel": math.sqrt(msw) if math.isfinite(msw) else math.nan,
            "window_s": float(g["window_s"].mean()) if "window_s" in g else math.nan,
            "boot_s": float(g.groupby(boot)["boot_s"].first().mean()) if "boot_s" in g else math.nan,
        })
    cols = [*keys, "boots", "windows", "mean_value", "var_boot", "var_boot_raw", "var_window", "df_boot",
            "df_window", "sd_boot_rel", "sd_window_rel", "window_s", "boot_s"]
    return pd.DataFrame(rows, columns=cols)


def request_components(requests: pd.DataFrame, keys: Sequence[str], column: str, *,
                       window: Sequence[str] = ("trial_id", "repeat")) -> pd.DataFrame:
    """Within-window variance of one request's log value (e.g. ``tpot_s``) per cell, and requests per window.

    Args:
        requests: one row per ok request with the ``keys``, the ``window`` columns and ``column`` (> 0).
        keys: cell columns (without the metric).
        column: the request-level quantity (``ttft_s``, ``tpot_s``, ``e2el_s``, ``itl_mean_s``).

    Returns:
        keys, ``var_request`` (pooled within-window variance of log values), ``df_request``,
        ``requests_per_window`` (mean).

    Raises:
        ValueError: a missing column (named).
    """
    missing = [c for c in [*keys, *window, column] if c not in requests.columns]
    if missing:
        raise ValueError(f"requests: missing columns {missing}")
    r = requests[np.isfinite(requests[column].astype(float)) & (requests[column].astype(float) > 0)].copy()
    r["_y"] = np.log(r[column].astype(float))
    rows = []
    for cell, g in r.groupby(list(keys), sort=True, dropna=False):
        w = g.groupby(list(window))["_y"]
        dfr = float((w.size() - 1).clip(lower=0).sum())
        ss = float(((g["_y"] - w.transform("mean")) ** 2).sum())
        rows.append({**dict(zip(keys, cell if isinstance(cell, tuple) else (cell,))),
                     "var_request": ss / dfr if dfr > 0 else math.nan, "df_request": dfr,
                     "requests_per_window": float(w.size().mean())})
    return pd.DataFrame(rows, columns=[*keys, "var_request", "df_request", "requests_per_window"])
