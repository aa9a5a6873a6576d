"""The A/B verdict of one cell: the one rule that turns an interval into a call, and the typed A/B record.

Every A/B path builds its verdict here (``docs/statistics.md``, "The verdict"):

* ``stats.bounds.interval_call`` - the call from an interval of the change: ``better`` / ``worse`` when it excludes 0
  (direction-aware: throughput higher is better, latency lower is better), ``equivalent`` when it lies inside
  an equivalence margin, else None. The fixed and paired designs (:func:`cell_verdicts`), the Welch fallback
  and the sequential design (``stats.sequential.sequential_ab``) all call it.
* :func:`cell_verdicts` - the verdicts of a comparison's cells for the ``fixed`` design (log-scale t interval,
  variance pooled with history or moderated across cells: ``stats.intervals.log_ab_intervals``) and the
  ``paired`` design (mean of the pairs' log ratios: ``stats.intervals.paired_log_intervals``); a cell with a
  value <= 0 (no ratio) falls back to Welch's interval of the difference in the metric's unit.
* ``stats.bounds.welch_interval`` - Welch's t interval of a difference of means (scipy's ``ttest_ind(equal_var=False)``),
  also given on every row beside the product's method (``welch_ci_low`` / ``welch_ci_high``), since the
  project reports both.
* ``stats.bounds.t_half_width`` - the half-width ``t_{level, df} x se`` that every t interval uses.
* :func:`token_change` - whether the two sides ran the same work: their token counts per request (issue 29).
* :class:`ABRecord` - one row of an A/B comparison, typed, with each field described.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from tunelab.stats.bounds import interval_call, welch_interval
from tunelab.stats.intervals import LogInterval, log_ab_intervals, mde_text, paired_log_intervals

__all__ = ["ABRecord", "CellVerdict", "TOKEN_CHANGE_MIN", "TOKEN_CHANGE_SE", "cell_verdicts", "token_change"]

Verdict = Literal["better", "worse", "no_significant_change", "inconclusive", "not_applied"]


class CellVerdict(BaseModel):
    """The verdict of one cell (one workload and load level of one metric) with the interval behind it."""

    verdict: Verdict = Field(description="better | worse (the per-cell interval excludes 0), no_significant_change, "
                                         "inconclusive (too few boots or no variance), not_applied")
    reason: str = Field(description="why, in one line: the interval, its scale, the boots and the variance used")
    rel_diff: float = Field(math.nan, description="candidate/baseline - 1 (ratio of geometric means of the boot "
                                                  "values; NaN when not computed here: the caller's arithmetic one)")
    rel_ci_low: float = Field(math.nan, description="lower end of the per-cell interval of rel_diff")
    rel_ci_high: float = Field(math.nan, description="upper end of the per-cell interval of rel_diff")
    ci_low: float = Field(math.nan, description="lower end of the per-cell interval of the change (metric unit)")
    ci_high: float = Field(math.nan, description="upper end of the per-cell interval of the change (metric unit)")
    p_value: float = Field(math.nan, description="two-sided p-value of no change, per cell (unadjusted)")
    df: float = Field(math.nan, description="degrees of freedom of the t quantile (cell + borrowed)")
    se_log: float = Field(math.nan, description="standard error of the log ratio")
    mde_rel: float = Field(math.nan, description="relative effect detectable with 80 % power at this design")
    variance_source: str = Field("", description="where the variance came from")


def cell_verdicts(values: Sequence[tuple[np.ndarray, np.ndarray]], *, design: Literal["fixed", "paired"],
                  higher_is_better: bool, confidence: float = 0.95, min_boots: int = 2, borrow: bool = True,
                  prior_var: Sequence[float] | None = None, prior_df: Sequence[float] | None = None,
                  not_applied_sides: Sequence[str] = (), not_applied_names: Sequence[str] = ()) -> list[CellVerdict]:
    """The verdicts of a comparison's cells (one metric), fixed or paired design.

    Args:
        values: per cell ``(baseline, candidate)`` boot values (one mean per boot, metric unit); for
            ``paired`` element i of both sides is one pair (equal lengths).
        design: ``fixed`` (independent boots: ``log_ab_intervals``) or ``paired`` (``paired_log_intervals``).
        higher_is_better: the metric's direction.
        confidence: two-sided level of the per-cell intervals.
        min_boots: boots (pairs) a side needs for a verdict other than ``inconclusive``.
        borrow: moderate the cells' variances across cells (empirical Bayes).
        prior_var, prior_df: per cell, the history prior of a boot's log variance (fixed design only; NaN/0:
            none).
        not_applied_sides: the sides none of whose boots applied the compared setting; the verdict is then
            ``not_applied`` (the numbers alone stay in the reason).
        not_applied_names: the env var names that were not applied, for the reason.

    Returns:
        One :class:`CellVerdict` per cell, in order.

    Raises:
        ValueError: see ``stats.intervals.log_ab_intervals`` / ``paired_log_intervals``.
    """
    paired = design == "paired"
    pct = f"{confidence:.0%}"
    positive = [bool(len(xb) and len(xc) and (xb > 0).all() and (xc > 0).all()) for xb, xc in values]
    log_cells = [i for i, ok in enumerate(positive) if ok]
    if paired:
        ivs = paired_log_intervals([values[i] for i in log_cells], confidence=confidence, borrow=borrow)
    else:
        pv = [prior_var[i] for i in log_cells] if prior_var is not None else None
        pd_ = [prior_df[i] for i in log_cells] if prior_df is not None else None
        ivs = log_ab_intervals([values[i] for i in log_cells], confidence=confidence, borrow=borrow,
                               prior_var=pv, prior_df=pd_)
    log_iv: dict[int, LogInterval | None] = dict(zip(log_cells, ivs))
    out = []
    for i, (xb, xc) in enumerate(values):
        v = _one_cell(xb, xc, log_iv.get(i), paired=paired, higher_is_better=higher_is_better, pct=pct,
                      confidence=confidence, min_boots=min_boots)
        if not_applied_sides and v.verdict != "inconclusive":
            v = v.model_copy(update={
                "verdict": "not_applied",
                "reason": (f"{' and '.join(not_applied_sides)}: {', '.join(not_applied_names)} not applied on any "
                           f"boot (its vLLM reported it unknown and ran without it), so the difference is not an "
                           f"effect of it; the numbers alone: {v.verdict}, {v.reason}")})
        out.append(v)
    return out


def _one_cell(xb: np.ndarray, xc: np.ndarray, iv: LogInterval | None, *, paired: bool, higher_is_better: bool,
              pct: str, confidence: float, min_boots: int) -> CellVerdict:
    """One cell's verdict: too few boots, the log-scale interval, or Welch's interval for values <= 0."""
    short = [f"{side} has {n} boot{'s' if n != 1 else ''}" for side, n in (("baseline", len(xb)), ("candidate", len(xc)))
             if n < min_boots]
    if paired and short:
        short = [f"{min(len(xb), len(xc))} pair(s) of boots"]
    mb = float(xb.mean()) if len(xb) else math.nan
    if short:
        return CellVerdict(verdict="inconclusive", reason=(
            f"{' and '.join(short)}; need >= {min_boots} boots per side because the boot, not the "
            "repeat, is the unit of replication (boot-to-boot noise is unknown from one boot)"))
    if iv is not None:
        # Relative effect = ratio of geometric means; the unit interval scales it by the baseline mean.
        call = interval_call(iv.rel_low, iv.rel_high, higher_is_better)
        return CellVerdict(
            verdict=call or "no_significant_change", rel_diff=iv.rel, rel_ci_low=iv.rel_low, rel_ci_high=iv.rel_high,
            p_value=iv.p_value, df=iv.df, se_log=iv.se_log, mde_rel=iv.mde_rel, variance_source=iv.source,
            ci_low=iv.rel_low * abs(mb), ci_high=iv.rel_high * abs(mb),
            reason=(f"{pct} interval of the ratio [{iv.rel_low:+.1%}, {iv.rel_high:+.1%}] "
                    f"{'excludes' if call else 'contains'} 0 (log scale, {len(xb)} vs {len(xc)} boots"
                    f"{', as pairs' if paired else ''}, variance: {iv.source}); detectable at 80 % power: "
                    f"{mde_text(iv.mde_rel)}"))
    if len(xb) >= 2 and len(xc) >= 2:
        w = welch_interval(xb, xc, confidence)
        call = interval_call(w.low, w.high, higher_is_better)
        rel = {"rel_ci_low": w.low / abs(mb), "rel_ci_high": w.high / abs(mb)} if mb else {}
        return CellVerdict(
            verdict=call or "no_significant_change", ci_low=w.low, ci_high=w.high, p_value=w.p_value, df=w.df,
            variance_source="Welch (values <= 0: no ratio)", **rel,
            reason=(f"{pct} Welch interval of the difference [{w.low:.4g}, {w.high:.4g}] "
                    f"{'excludes' if call else 'contains'} 0 ({len(xb)} vs {len(xc)} boots; values <= 0, so no "
                    "log-scale ratio)"))
    return CellVerdict(verdict="inconclusive",
                       reason="no variance estimate for this cell (no degrees of freedom on either side or in other cells)")


class ABRecord(BaseModel):
    """One row of an A/B comparison (``warehouse.compare.compare``): one cell (workload x load level) of one
    metric, candidate against baseline. Boots are the unit of replication: repeats are averaged per boot first."""

    workload: str = Field(description="workload name of the plan")
    load_kind: str = Field(description="concurrency | rate (the load level's kind)")
    load_value: float = Field(description="the load level (concurrent requests, or requests/s)")
    metric: str = Field(description="the measurements column compared, e.g. output_tokens_per_s")
    higher_is_better: bool = Field(description="True for throughput (*_per_s), False for latency (*_s)")
    baseline_boots: int = Field(description="boots (trials) of the baseline in this cell")
    candidate_boots: int = Field(description="boots (trials) of the candidate in this cell")
    baseline_repeats: int = Field(description="windows (repeats) of the baseline, over its boots")
    candidate_repeats: int = Field(description="windows (repeats) of the candidate, over its boots")
    baseline_mean: float = Field(description="mean of the baseline's boot means (metric unit)")
    candidate_mean: float = Field(description="mean of the candidate's boot means (metric unit)")
    baseline_boot_sd: float = Field(description="SD of the baseline's boot means (NaN below 2 boots)")
    candidate_boot_sd: float = Field(description="SD of the candidate's boot means (NaN below 2 boots)")
    diff: float = Field(description="candidate_mean - baseline_mean (metric unit)")
    rel_diff: float = Field(description="candidate/baseline - 1: the ratio of geometric means where the interval "
                                        "is on the log scale, else diff / baseline_mean")
    ci_low: float = Field(description="per-cell interval of the change, lower end (metric unit; unadjusted)")
    ci_high: float = Field(description="per-cell interval of the change, upper end (metric unit; unadjusted)")
    rel_ci_low: float = Field(description="per-cell interval of rel_diff, lower end (never below -1; unadjusted)")
    rel_ci_high: float = Field(description="per-cell interval of rel_diff, upper end (unadjusted)")
    p_value: float = Field(description="two-sided p-value of no change, this cell alone (unadjusted)")
    df: float = Field(description="degrees of freedom of the t quantile (cell + borrowed)")
    se_log: float = Field(description="standard error of the log ratio")
    mde_rel: float = Field(description="relative effect detectable with 80 % power at this design")
    variance_source: str = Field(description="where the variance came from (cell, history prior, cross-cell "
                                             "prior, pairs, Welch)")
    verdict: Verdict = Field(description="the per-cell verdict (see CellVerdict.verdict)")
    reason: str = Field(description="why, in one line")
    baseline_trials_excluded: int = Field(0, description="baseline trials left out (status, quality, no values)")
    candidate_trials_excluded: int = Field(0, description="candidate trials left out (status, quality, no values)")
    welch_ci_low: float = Field(math.nan, description="plain Welch t interval of diff on the boot means, lower end "
                                                      "(metric unit; per cell, no borrowing), beside the product's "
                                                      "method")
    welch_ci_high: float = Field(math.nan, description="plain Welch t interval of diff on the boot means, upper end")

    family_role: Literal["primary", "secondary"] = Field(
        "primary", description="primary: a headline verdict of the report (the plan's primary metric and cells, "
                               "or every row when none is named); secondary: labelled so, adjusted in its own family")
    p_family: float = Field(math.nan, description="p-value adjusted over the row's family (family_method)")
    family_verdict: Verdict = Field("inconclusive", description="the headline verdict: better/worse only when the "
                                                                "family-adjusted p-value is below alpha")
    family_method: str = Field("", description="the adjustment and the family's size, e.g. 'holm over 16 primary'")
    baseline_prompt_tokens: float = Field(math.nan, description="mean prompt tokens per ok request (server usage)")
    candidate_prompt_tokens: float = Field(math.nan, description="mean prompt tokens per ok request (server usage)")
    baseline_output_tokens: float = Field(math.nan, description="mean output tokens per ok request (server usage)")
    candidate_output_tokens: float = Field(math.nan, description="mean output tokens per ok request (server usage)")
    token_change: str = Field("", description="empty when the workload's token counts match on both sides; else "
                                              "what changed and by how much (the sides did not run the same work)")

    @classmethod
    def columns(cls) -> list[str]:
        """The record's field names in order: the columns of ``compare``'s DataFrame."""
        return list(cls.model_fields)


#: A token count change is flagged when the mean per request moved by at least this many tokens ...
TOKEN_CHANGE_MIN = 0.5
#: ... and by more than this many standard errors of the difference of means (different windows hold different
#: requests of a length distribution; fixed-length prompts have no spread, so there any change counts).
TOKEN_CHANGE_SE = 4.0


def token_change(what: str, baseline: tuple[int, float, float], candidate: tuple[int, float, float]) -> str:
    """Whether a workload's token count per request (``what``: ``prompt`` or ``output``) differs between the
    sides of a comparison, as text; empty when it matches or a side has no counts.

    Two vLLM releases may tokenise the same prompt text differently (a tokenizer release that adds special
    tokens: 33 vs 34 prompt tokens a request), and then the sides did not run the same work. Flagged when the
    means differ by >= :data:`TOKEN_CHANGE_MIN` tokens and by more than :data:`TOKEN_CHANGE_SE` standard errors
    (Welch's SE of the difference of means of the ok requests' counts from the server's usage).

    Args:
        baseline, candidate: ``(requests, mean tokens, variance)`` of the side's ok requests in the cell.

    Returns:
        e.g. ``"prompt tokens 33.0 -> 34.0 a request (+3.0%)"``, or ``""``.
    """
    (nb, mb, vb), (nc, mc, vc) = baseline, candidate
    if not (nb and nc) or not (math.isfinite(mb) and math.isfinite(mc)):
        return ""
    diff = mc - mb
    se = math.sqrt((vb if math.isfinite(vb) else 0.0) / nb + (vc if math.isfinite(vc) else 0.0) / nc)
    if abs(diff) < TOKEN_CHANGE_MIN or abs(diff) <= TOKEN_CHANGE_SE * se:
        return ""
    rel = f" ({diff / mb:+.1%})" if mb else ""
    return f"{what} tokens {mb:.1f} -> {mc:.1f} a request{rel}"
