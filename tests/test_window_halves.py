"""benchmarks/window_halves.py: slices of a window reproduce its measurement, and the split of the variance into
within-window and between-boot parts recovers known components (and ignores a pattern in time that every boot
shares, which a slice-against-slice estimate would call noise)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "window_halves.py"
EVIDENCE = ROOT / "evidence" / "h100-2026-12-07-versions-anchored"


@pytest.fixture(scope="module")
def wh():
    spec = importlib.util.spec_from_file_location("window_halves", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_one_slice_is_the_measurement_itself(wh):
    trials, meas, req = wh.load(EVIDENCE)
    s = wh.slices(trials, req, 1)
    got = s.pivot_table(index=wh.WINDOW, columns="metric", values="value").reset_index()
    j = got.merge(meas[wh.WINDOW + list(wh.METRICS)], on=wh.WINDOW, suffixes=("_slice", ""))
    assert len(j) == len(meas) == 24
    for m in wh.METRICS:
        assert np.allclose(j[f"{m}_slice"], j[m], rtol=1e-9), m


def test_slices_add_up_to_the_window(wh):
    """Two halves' tokens make the window's tokens (rates weighted by their seconds)."""
    trials, _, req = wh.load(EVIDENCE)
    full = wh.slices(trials, req, 1)
    halves = wh.slices(trials, req, 2)
    tok = "output_tokens_per_s"
    f = full[full.metric == tok].set_index(wh.WINDOW)
    h = halves[halves.metric == tok].assign(tokens=lambda d: d.value * d.seconds).groupby(wh.WINDOW).tokens.sum()
    assert np.allclose(h.loc[f.index], f.value * f.seconds, rtol=1e-9)


def _simulated(sd_between: float, sd_within: float, boots: int, pattern: float, seed: int = 7) -> dict:
    """Slices of one cell: log value = boot effect + a pattern by position that every boot shares + white noise in
    time (8 fine pieces a window, so a full window's within-window SD is ``sd_within``)."""
    rng = np.random.default_rng(seed)
    fine = 8
    shape = pattern * np.linspace(-1, 1, fine)  # e.g. slower early in every window (the ramp's prefills)
    by_k = {}
    b = rng.normal(0, sd_between, boots)
    pieces = rng.normal(0, sd_within * math.sqrt(fine), (boots, fine)) + shape + b[:, None]
    for k in (1, 2, 4):
        rows = []
        for i in range(boots):
            for j, part in enumerate(np.split(pieces[i], k)):
                rows.append({"sweep_id": "s", "runtime_name": "r", "config_label": "c", "workload": "w",
                             "load_value": 32.0, "metric": "output_tokens_per_s", "trial_id": f"t{i}", "repeat": 0,
                             "slice": j, "value": math.exp(part.mean())})
        by_k[k] = pd.DataFrame(rows)
    return by_k


@pytest.mark.parametrize("sd_between,sd_within", [(0.03, 0.01), (0.005, 0.02)])
def test_split_recovers_known_components(wh, sd_between, sd_within):
    by_k = _simulated(sd_between, sd_within, boots=1500, pattern=0.2)
    r = wh.split_variance(by_k).iloc[0]
    assert r.boots == 1500
    assert r.sd_between_boots == pytest.approx(sd_between, rel=0.25, abs=0.003)
    assert r.sd_within_window == pytest.approx(sd_within, rel=0.25, abs=0.003)
    # the shared pattern (+-20 % by position) is no noise: a slice-to-slice estimate within windows would say so
    half = by_k[2].assign(y=lambda d: np.log(d.value)).pivot(index="trial_id", columns="slice", values="y")
    naive_within = math.sqrt(float((half[0] - half[1]).var(ddof=1)) / 4 + float((half[0] - half[1]).mean()) ** 2 / 4)
    assert naive_within > 3 * sd_within


def test_projection_matches_the_formula_and_rejects_bad_designs(wh):
    hw = wh.projected_half_width(0.02**2, 0.01**2, 3, 2.0)
    from scipy import stats
    se = math.sqrt(4 * (0.02**2 + 0.01**2 / 2) / 3)
    assert hw == pytest.approx(math.expm1(stats.t.ppf(0.975, 8) * se))
    assert wh.projected_half_width(0.02**2, 0.01**2, 5, 1.0) < wh.projected_half_width(0.02**2, 0.01**2, 3, 1.0)
    with pytest.raises(ValueError, match="boots must be >= 2"):
        wh.projected_half_width(0.01, 0.01, 1, 1.0)


def test_the_report_prints_both_tables(wh):
    text = wh.report(EVIDENCE)
    assert "| short c=32 | output_tokens_per_s |" in text and "GPU-minutes a sweep" in text
    assert text.count("| 20261207T023752 |") == 24  # 3 (runtime, config) x 4 cells x 2 metrics


def test_direct_window_noise_removes_the_repeats_mix_and_recovers_the_window_sd(wh):
    """Synthetic windows: 12 boots x 3 repeats, repeat effects 0 / +4 % / +13 % (the seeded mix, the same in every
    boot), window noise 1 %, boot SD 2 %. Ignoring the repeat reads the mix as noise (SD > 5 %); with it the window
    SD comes back near 1 %, and the boot means' SD near sqrt(2^2 + 1^2 / 3) %."""
    rng = np.random.default_rng(3)
    rep_effect = np.log([1.0, 1.04, 1.13])
    rows, trials = [], []
    for b in range(12):
        u = rng.normal(0, 0.02)
        trials.append({"trial_id": f"t{b}"})
        for r in range(3):
            y = math.log(1400) + rep_effect[r] + u + rng.normal(0, 0.01)
            rows.append({"trial_id": f"t{b}", "workload": "long", "load_value": 32.0, "repeat": r,
                         "output_tokens_per_s": math.exp(y), "tpot_p50_s": math.exp(-y) * 20})
    d = wh.direct_window_noise(pd.DataFrame(trials), pd.DataFrame(rows))
    r = d.set_index("metric").loc["output_tokens_per_s"]
    assert r.df_window == 36 - 12 - 2 and r.boots == 12
    assert r.sd_window_ignoring_repeat > 0.05
    assert 0.007 < r.sd_window < 0.014, r.sd_window
    assert 0.10 < r.repeat_range < 0.13
    assert 0.012 < r.sd_boot_means < 0.035
    # one window a boot: nothing to measure directly
    one = pd.DataFrame(rows)
    assert wh.direct_window_noise(pd.DataFrame(trials), one[one.repeat == 0]).empty
