"""The regression rule as pure functions over DataFrames (tunelab.stats.regressions), without a warehouse."""

import math

import pandas as pd

from tunelab.stats.regressions import mde_rel, noise_band, walk_series


def _points(values, boots=3):
    return pd.DataFrame({"point": [f"v{i}" for i in range(len(values))], "value": values, "boots": [boots] * len(values)})


def test_two_consecutive_violations_confirm_a_regression_from_the_first():
    pts = _points([100.0, 101.0, 99.0, 80.0, 79.0])
    info, status = walk_series(pts, sd=1.0, direction=+1, threshold_rel=0.05, consecutive=2, noise_k=2.0,
                               baseline_window=3)
    assert status == ["baseline", "ok", "ok", "regression", "regression"]
    assert [r["regression_start"] for r in info] == [False, False, False, True, False]
    assert info[3]["baseline_point"] == "v0, v1, v2" and info[3]["baseline_value"] == 100.0


def test_one_violation_stays_unconfirmed_and_lower_is_better_flips_the_side():
    info, status = walk_series(_points([1.0, 1.0, 1.3]), sd=0.01, direction=-1, threshold_rel=0.05, consecutive=2,
                               noise_k=2.0, baseline_window=3)
    assert status == ["baseline", "ok", "violation_unconfirmed"] and info[2]["worse_rel"] > 0
    _, status = walk_series(_points([1.0, 1.0, 0.7]), sd=0.01, direction=-1, threshold_rel=0.05, consecutive=2,
                            noise_k=2.0, baseline_window=3)
    assert status == ["baseline", "ok", "ok"]


def test_no_noise_estimate_is_insufficient_data_and_the_mde_grows_with_the_band():
    _, status = walk_series(_points([100.0, 50.0]), sd=math.nan, direction=+1, threshold_rel=0.05, consecutive=1,
                            noise_k=2.0, baseline_window=3)
    assert status == ["baseline", "insufficient_data"]
    narrow, wide = noise_band(1.0, 2.0, 3, 3), noise_band(10.0, 2.0, 3, 3)
    assert wide > narrow and mde_rel(wide, 2.0, 100.0, 0.05) > mde_rel(narrow, 2.0, 100.0, 0.05) > 0.05
