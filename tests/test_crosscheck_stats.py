"""The statistics of benchmarks/crosscheck_vllm_bench.py: paired relative differences, the t interval, the
equivalence verdict, the tolerance floor and the drift-cancelling ABBA order. Hand-computed inputs, no server."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "crosscheck_vllm_bench.py"
_spec = importlib.util.spec_from_file_location("crosscheck_vllm_bench", _PATH)
xc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(xc)

T_975_DF3 = 3.182446305284263  # Student t, 97.5th percentile, 3 degrees of freedom


def test_agreement_hand_computed_inconclusive_then_agree():
    # relative differences 0.10, 0.20, -0.05, 0.05: mean 0.075, sample sd sqrt(0.0325 / 3)
    ours, theirs = [11.0, 12.0, 9.5, 10.5], [10.0, 10.0, 10.0, 10.0]
    sd = math.sqrt(0.0325 / 3)
    half = T_975_DF3 * sd / 2
    r = xc.agreement(ours, theirs, tol=0.10)
    assert r["n"] == 4
    assert r["mean"] == pytest.approx(0.075)
    assert r["sd"] == pytest.approx(sd)
    assert r["lo"] == pytest.approx(0.075 - half)  # -0.0906
    assert r["hi"] == pytest.approx(0.075 + half)  # +0.2406
    assert r["verdict"] == "inconclusive"  # the CI straddles +10 %
    assert xc.agreement(ours, theirs, tol=0.25)["verdict"] == "agree"  # [-0.091, 0.241] inside +-0.25


def test_agreement_differ_when_the_whole_interval_is_outside():
    # relative differences 0.20, 0.22, 0.18, 0.20: mean 0.20, sd sqrt(0.0008 / 3), CI [0.174, 0.226]
    ours, theirs = [12.0, 12.2, 11.8, 12.0], [10.0] * 4
    half = T_975_DF3 * math.sqrt(0.0008 / 3) / 2
    r = xc.agreement(ours, theirs, tol=0.10)
    assert (r["lo"], r["hi"]) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    assert r["verdict"] == "differ"
    assert xc.agreement(ours, theirs, tol=0.20)["verdict"] == "inconclusive"
    assert xc.agreement(ours, theirs, tol=0.30)["verdict"] == "agree"
    # the sign matters: ours below theirs by the same amount also differs
    assert xc.agreement(theirs, [12.5] * 4, tol=0.10)["verdict"] == "differ"  # all -20 %, sd 0 -> CI [-0.2, -0.2]


def test_verdict_edges():
    assert xc.verdict(-0.05, 0.05, 0.05) == "agree"  # the band is inclusive
    assert xc.verdict(-0.0501, 0.05, 0.05) == "inconclusive"
    assert xc.verdict(0.06, 0.08, 0.05) == "differ"
    assert xc.verdict(-0.3, -0.2, 0.1) == "differ"
    assert xc.verdict(math.nan, math.nan, 0.1) == "inconclusive"


def test_pairs_without_a_usable_value_are_left_out_and_one_pair_is_not_enough():
    assert xc.relative_diffs([11.0, 5.0, None, math.nan], [10.0, 0.0, 3.0, 4.0]) == [pytest.approx(0.1)]
    r = xc.agreement([11.0, 5.0], [10.0, 0.0], tol=0.5)
    assert r["n"] == 1 and math.isnan(r["lo"]) and r["verdict"] == "inconclusive"
    with pytest.raises(ValueError):
        xc.relative_diffs([1.0], [1.0, 2.0])


def test_tolerance_floor_relative_to_vllm_median():
    # ttft_p50_ms: max(10 %, 2 ms / median)
    assert xc.tolerance("ttft_p50_ms", [10.0, 20.0, 30.0]) == pytest.approx(0.10)
    assert xc.tolerance("ttft_p50_ms", [10.0, 10.0, 10.0]) == pytest.approx(0.20)
    assert xc.tolerance("itl_p50_ms", [0.1, 0.1]) == pytest.approx(3.0)  # bursts: ITL near 0 -> the 0.3 ms floor
    assert xc.tolerance("output_tokens_per_s", [1.0]) == pytest.approx(0.05)  # no floor
    assert set(xc.GATED) <= set(xc.TOLERANCES)


def test_abba_order_cancels_a_linear_drift_in_the_pairs_and_the_controls():
    order = xc.schedule(2)
    assert order == "ABBAABBA"
    # a value that is just the round's position in time: pure linear drift, no difference between clients
    a = [float(i) for i, t in enumerate(order) if t == "A"]  # 0, 3, 4, 7
    b = [float(i) for i, t in enumerate(order) if t == "B"]  # 1, 2, 5, 6
    assert [x - y for x, y in zip(a, b)] == [-1.0, 1.0, -1.0, 1.0]  # adjacent pairs, alternating order
    x, y = xc.control_halves(a)
    assert (x, y) == ([0.0, 7.0], [3.0, 4.0])  # block 0: earlier first; block 1: later first
    assert sum(p - q for p, q in zip(x, y)) == 0.0
    assert xc.control_halves([1, 2, 3, 4, 5, 6, 7, 8]) == ([1, 4, 5, 8], [2, 3, 6, 7])
    with pytest.raises(ValueError):
        xc.control_halves([1, 2, 3])
    with pytest.raises(ValueError):
        xc.schedule(0)
