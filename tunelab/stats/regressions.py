"""Regressions along a series of points (vLLM releases or sweeps): the statistics behind
``warehouse.compare.regressions``, as pure functions over DataFrames of boot means.

Method (``docs/statistics.md``; PyTorch HUD, pytorch/test-infra ``benchmark_regression_summary_report``): a point's
value is the mean of its boots; the baseline is the boot-weighted mean of the last ``baseline_window`` points that
did not violate; a point *violates* when it is worse than the baseline by more than ``threshold_rel`` AND the
difference lies outside the noise band ``noise_k * sd_boot * sqrt(1/n_baseline + 1/n_point)`` (sd_boot pooled
across the series' boots); ``consecutive`` successive violations against one baseline confirm a regression.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tunelab.stats.bounds import POWER_Z80

__all__ = ["REGRESSION_COLUMNS", "mde_rel", "noise_band", "regression_table", "series_noise_sd", "series_points",
           "walk_series"]

#: The columns of a regression table after the series key, in order.
REGRESSION_COLUMNS = ["metric", "point", "vllm_version", "vllm_version_key", "first_run_at", "boots", "value",
                      "boot_sd", "noise_sd", "baseline_point", "baseline_value", "rel_change", "worse_rel",
                      "noise_band", "mde_rel", "violation", "status", "regression_start"]


def series_points(boots: pd.DataFrame, order_by: str) -> tuple[pd.DataFrame, dict]:
    """One series' boots (rows with ``boot_value`` in the metric's unit) reduced to its points in series order
    (by release key for ``order_by="version"``, by first start time for ``"date"``), each with ``boots``, ``value``
    (mean of boot values) and ``boot_sd``; and the boot values (numpy arrays) per point key."""
    if order_by == "version":
        # One point per release: builds that differ only in their local part (0.26.0, 0.26.0+empty) share
        # the key; the point is named by the release and lists its builds.
        pts = boots.groupby("vllm_version_key", sort=True).agg(
            point=("vllm_public_version", "first"),
            vllm_version=("vllm_version", lambda s: ", ".join(sorted(set(s)))),
            first_run_at=("run_at", "min"), boots=("boot_value", "size"),
            value=("boot_value", "mean"), boot_sd=("boot_value", lambda s: s.std(ddof=1)),
        ).reset_index()
        vals = {k: v["boot_value"].to_numpy(float) for k, v in boots.groupby("vllm_version_key")}
    else:
        pts = boots.groupby("sweep_id", sort=False).agg(
            vllm_version=("vllm_version", "first"), vllm_version_key=("vllm_version_key", "first"),
            first_run_at=("run_at", "min"), boots=("boot_value", "size"),
            value=("boot_value", "mean"), boot_sd=("boot_value", lambda s: s.std(ddof=1)),
        ).reset_index()
        pts = pts.sort_values(["first_run_at", "sweep_id"]).reset_index(drop=True)
        pts["point"] = pts["sweep_id"]
        vals = {k: v["boot_value"].to_numpy(float) for k, v in boots.groupby("sweep_id")}
    return pts, vals


def series_noise_sd(points: pd.DataFrame, values_by_point: dict) -> float:
    """Pooled boot-to-boot SD of a series (metric unit); falls back to a robust successive-difference estimate
    over >= 3 point values, else NaN."""
    num, den = 0.0, 0
    for vals in values_by_point.values():
        if len(vals) >= 2:
            num += float(np.var(vals, ddof=1)) * (len(vals) - 1)
            den += len(vals) - 1
    if den:
        return math.sqrt(num / den)
    means = points["value"].to_numpy(dtype=float)
    if len(means) >= 3:
        # median absolute successive difference / (0.6745 * sqrt(2)): SD of white noise,
        # robust to a few level shifts.
        return float(np.median(np.abs(np.diff(means))) / (0.6745 * math.sqrt(2)))
    return math.nan


def noise_band(sd: float, noise_k: float, base_n: int, point_n: int) -> float:
    """Noise band (metric unit) of a point against its baseline: ``noise_k * sd * sqrt(1/base_n + 1/point_n)``
    (n = boots); NaN when ``sd`` is unknown."""
    return noise_k * sd * math.sqrt(1.0 / base_n + 1.0 / point_n) if not math.isnan(sd) else math.nan


def mde_rel(band: float, noise_k: float, base_value: float, threshold_rel: float) -> float:
    """Relative worsening (fraction of the baseline) flagged with 80 % power: the flag threshold
    ``max(threshold_rel, band / baseline)`` plus 0.84 SE of the difference."""
    se_rel = band / noise_k / abs(base_value)
    return max(threshold_rel, noise_k * se_rel) + POWER_Z80 * se_rel


def walk_series(pts: pd.DataFrame, sd: float, direction: int, *, threshold_rel: float, consecutive: int,
                noise_k: float, baseline_window: int) -> tuple[list[dict], list[str]]:
    """Walk one series' points in order (``direction`` +1: higher is better, -1: lower is better) and return, per
    point, its comparison with the baseline (baseline, relative change, noise band, MDE, violation, regression
    start) and its status (``baseline`` | ``ok`` | ``violation_unconfirmed`` | ``regression`` |
    ``insufficient_data``) by the consecutive-violation rule."""
    accepted: list[int] = []
    run: list[int] = []
    statuses_out: list[str] = []
    info: list[dict] = []
    for i, p in pts.iterrows():
        rec = {"baseline_point": None, "baseline_value": math.nan, "rel_change": math.nan, "mde_rel": math.nan,
               "worse_rel": math.nan, "noise_band": math.nan, "violation": False, "regression_start": False}
        if not accepted:
            accepted.append(i)
            statuses_out.append("baseline")
            info.append(rec)
            continue
        window = pts.loc[accepted[-baseline_window:]]
        base_n = int(window["boots"].sum())
        base_value = float((window["value"] * window["boots"]).sum() / base_n)
        rel = (p["value"] - base_value) / base_value if base_value else math.nan
        worse = -direction * rel
        band = noise_band(sd, noise_k, base_n, p["boots"])
        rec.update(baseline_point=", ".join(map(str, window["point"])), baseline_value=base_value,
                   rel_change=rel, worse_rel=worse, noise_band=band)
        if not math.isnan(band) and base_value:
            # Resolution of this call: the true worsening flagged with 80 % power.
            rec["mde_rel"] = mde_rel(band, noise_k, base_value, threshold_rel)
        if math.isnan(band):
            statuses_out.append("insufficient_data")
            info.append(rec)
            continue
        violation = bool(worse > threshold_rel and abs(p["value"] - base_value) > band)
        rec["violation"] = violation
        info.append(rec)
        if violation:
            run.append(i)
            if len(run) == consecutive:
                info[run[0]]["regression_start"] = True
            statuses_out.append("regression" if len(run) >= consecutive else "violation_unconfirmed")
            if len(run) == consecutive:
                for j in run[:-1]:
                    statuses_out[j] = "regression"
        else:
            run = []
            accepted.append(i)
            statuses_out.append("ok")
    return info, statuses_out


def regression_table(boots: pd.DataFrame, series_keys: Sequence[str], metric: str, direction: int, *,
                     order_by: str, threshold_rel: float, consecutive: int, noise_k: float,
                     baseline_window: int) -> pd.DataFrame:
    """The regression table of ``warehouse.compare.regressions`` from its boot rows (one row per boot: the series
    key, ``trial_id``, ``sweep_id``, ``vllm_version``, ``vllm_version_key``, ``vllm_public_version``, ``run_at``,
    ``boot_value`` in the metric's unit): one row per point, columns ``series_keys + REGRESSION_COLUMNS``, the
    method in ``attrs["method"]``."""
    out_rows = []
    for skey, g in boots.groupby(list(series_keys), dropna=False, sort=True):
        pts, vals = series_points(g, order_by)
        sd = series_noise_sd(pts, vals)
        info, statuses_out = walk_series(pts, sd, direction, threshold_rel=threshold_rel, consecutive=consecutive,
                                         noise_k=noise_k, baseline_window=baseline_window)
        for i, p in pts.iterrows():
            out_rows.append({
                **dict(zip(series_keys, skey)), "metric": metric, "point": p["point"],
                "vllm_version": p["vllm_version"], "vllm_version_key": p["vllm_version_key"],
                "first_run_at": p["first_run_at"], "boots": int(p["boots"]), "value": float(p["value"]),
                "boot_sd": float(p["boot_sd"]) if pd.notna(p["boot_sd"]) else math.nan,
                "noise_sd": sd, **info[i], "status": statuses_out[i],
            })
    out = pd.DataFrame(out_rows, columns=list(series_keys) + REGRESSION_COLUMNS)
    out.attrs["method"] = (
        f"boot means per point; baseline = last {baseline_window} non-violating points; violation = worse by > "
        f"{threshold_rel:.1%} and outside {noise_k:g} x pooled boot SD band; {consecutive} consecutive violations "
        "confirm a regression (PyTorch HUD rule)"
    )
    return out
