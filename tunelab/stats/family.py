"""Family error control of an A/B report: the headline verdicts of a report's cells x metrics together.

A report prints many verdicts at once (4 cells x 4 metrics = 16, times the candidates), and a reader acts on any
of them; with each at 5 % the chance that at least one of 16 A/A verdicts is a false call is up to
``1 - 0.95^16 = 56 %`` (less when cells correlate; 40 % of the H200 A/A reports had one). So the headline
verdict of each row is judged with the family's p-values adjusted by Holm's step-down method (Holm 1979; via
``statsmodels.stats.multitest.multipletests``), which keeps the probability of any false headline call at or
below alpha for any dependence between the tests. The per-cell interval and per-cell verdict stay on the row,
unadjusted, and say so (``docs/statistics.md``, "The family of verdicts").

Families: the rows a plan names primary (``primary:``: its metrics, workloads and load levels; every row when it
names none) form the headline family; the rest are secondary and adjusted among themselves, labelled so. A row
enters its family when it has a p-value (inconclusive rows have none and stay inconclusive; a row whose side did
not apply the setting stays ``not_applied`` but counts as a test, which can only make the others more careful).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

__all__ = ["FAMILY_METHODS", "family_adjust"]

#: Adjustments offered: ``holm`` (family-wise error rate, the default) and ``fdr_bh`` (Benjamini-Hochberg, the
#: false discovery rate: the expected share of false calls among the calls; for exploratory scorecards).
FAMILY_METHODS = ("holm", "fdr_bh")
_DECISIVE = ("better", "worse")


def family_adjust(rows: pd.DataFrame, *, alpha: float = 0.05, method: str = "holm",
                  primary: Sequence[bool] | None = None) -> pd.DataFrame:
    """Add the family-adjusted headline verdict to A/B rows (``stats.verdict.ABRecord``).

    Args:
        rows: one row per cell x metric (x config) of one report, with ``verdict`` and ``p_value`` (per cell).
        alpha: the family's error rate (1 - the per-cell interval's confidence).
        method: one of :data:`FAMILY_METHODS`.
        primary: per row, True when it is a headline (primary) verdict; None: every row is primary.

    Returns:
        A copy with ``family_role`` (primary | secondary), ``p_family`` (the adjusted p-value; NaN without a
        test), ``family_verdict`` (better/worse only when the per-cell verdict is and ``p_family < alpha``;
        ``no_significant_change`` for the other tested rows; ``inconclusive``/``not_applied`` kept) and
        ``family_method`` (the adjustment, the family and its size).

    Raises:
        ValueError: an unknown method, alpha outside (0, 1), a primary mask of another length.
    """
    if method not in FAMILY_METHODS:
        raise ValueError(f"family method {method!r} is unknown; use one of {list(FAMILY_METHODS)}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    out = rows.copy()
    mask = np.ones(len(out), bool) if primary is None else np.asarray(list(primary), bool)
    if len(mask) != len(out):
        raise ValueError(f"primary: {len(mask)} flags for {len(out)} rows")
    out["family_role"] = np.where(mask, "primary", "secondary")
    out["p_family"] = math.nan
    out["family_verdict"] = out["verdict"]
    out["family_method"] = ""
    for role in ("primary", "secondary"):
        idx = out.index[(out["family_role"] == role).to_numpy()]
        p = pd.to_numeric(out.loc[idx, "p_value"], errors="coerce").to_numpy(float)
        tested = idx[np.isfinite(p)]
        if not len(tested):
            continue
        adj = multipletests(p[np.isfinite(p)], alpha=alpha, method=method)[1]
        out.loc[tested, "p_family"] = adj
        v = out.loc[tested, "verdict"].to_numpy(object)
        holds = np.array([x in _DECISIVE for x in v]) & (adj < alpha)
        out.loc[tested, "family_verdict"] = np.where(
            holds, v, np.where(np.isin(v, [*_DECISIVE, "no_significant_change"]), "no_significant_change", v))
        out.loc[tested, "family_method"] = f"{method} over {len(tested)} {role} verdicts at {alpha:g}"
    return out
