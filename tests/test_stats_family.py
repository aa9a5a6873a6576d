"""Family error control of an A/B report (tunelab/stats/family.py): a simulation of A/A reports of 16 verdicts
(4 cells x 4 metrics, cells and metrics correlated within a boot, as on the H200) through the product's own
per-cell verdicts (stats.verdict.cell_verdicts), counting reports with any false headline call."""

import math

import numpy as np
import pandas as pd
import pytest

from tunelab.stats.family import family_adjust
from tunelab.stats.verdict import cell_verdicts

CELLS, METRICS, BOOTS = 4, 4, 3


def _aa_report(rng: np.random.Generator, rho: float = 0.6, sd: float = 0.05) -> pd.DataFrame:
    """One A/A report: per metric, 4 cells of 3 vs 3 boots; a boot's deviations share a factor (correlation rho)
    across every cell and metric, so the 16 verdicts are dependent."""
    rows = []
    for m in range(METRICS):
        sides = []
        for _ in range(2):
            shared = rng.normal(size=(BOOTS, 1))
            own = rng.normal(size=(BOOTS, CELLS))
            sides.append(np.exp(sd * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * own)) * 100.0)
        values = [(sides[0][:, c], sides[1][:, c]) for c in range(CELLS)]
        for c, v in enumerate(cell_verdicts(values, design="fixed", higher_is_better=True)):
            rows.append({"metric": f"m{m}", "cell": c, "verdict": v.verdict, "p_value": v.p_value})
    return pd.DataFrame(rows)


def test_holm_holds_the_family_wise_false_call_rate_of_16_aa_verdicts():
    rng = np.random.default_rng(20261203)
    n = 600
    any_raw = any_holm = 0
    for _ in range(n):
        rep = family_adjust(_aa_report(rng), alpha=0.05)
        assert len(rep) == CELLS * METRICS
        any_raw += rep["verdict"].isin(["better", "worse"]).any()
        any_holm += rep["family_verdict"].isin(["better", "worse"]).any()
    raw, holm = any_raw / n, any_holm / n
    se = math.sqrt(0.05 * 0.95 / n)
    # Holm: at most the nominal 5 % (within 2.5 simulation SEs); per-cell verdicts alone: clearly above it.
    assert holm <= 0.05 + 2.5 * se, f"family-wise false calls with Holm {holm:.3f}"
    assert raw >= 0.15 and raw > 3 * max(holm, 0.01), f"without adjustment {raw:.3f}, with Holm {holm:.3f}"


def test_holm_keeps_a_large_effect_and_labels_secondary_rows_apart():
    rows = pd.DataFrame({"verdict": ["worse", "worse", "no_significant_change", "inconclusive", "better"],
                         "p_value": [1e-6, 0.03, 0.5, math.nan, 0.001]})
    out = family_adjust(rows, alpha=0.05, primary=[True, True, True, True, False])
    # primary family: 3 tests (the inconclusive row has no p): 1e-6 -> 3e-6 kept; 0.03 -> 0.06 not kept
    assert out["family_verdict"].tolist() == ["worse", "no_significant_change", "no_significant_change",
                                              "inconclusive", "better"]
    assert out["p_family"].iloc[1] == pytest.approx(0.06)
    assert math.isnan(out["p_family"].iloc[3])
    assert out["family_role"].tolist() == ["primary"] * 4 + ["secondary"]
    assert out["family_method"].iloc[0] == "holm over 3 primary verdicts at 0.05"
    assert out["family_method"].iloc[4] == "holm over 1 secondary verdicts at 0.05"
    # a family of one is the per-cell verdict itself
    one = family_adjust(rows.iloc[[1]], alpha=0.05)
    assert one["family_verdict"].tolist() == ["worse"]


def test_family_adjust_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="family method 'bonf'"):
        family_adjust(pd.DataFrame({"verdict": [], "p_value": []}), method="bonf")
