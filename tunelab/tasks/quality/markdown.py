"""Markdown of one trial's quality result, for a Prefect artifact."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from tunelab.tasks.quality.catalogue import QualityResult


def _md_cell(v: Any) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v).replace("|", "\\|").replace("\n", " ")


def quality_markdown(result: QualityResult) -> str:
    """Markdown for a Prefect artifact: the verdict, the summary line, and a table of the
    checks that failed or warned (skipped checks are counted, not listed).

    Args:
        result: a ``QualityResult`` from ``validate_trial``.

    Returns:
        Markdown text (GitHub table syntax, ``|`` in cells escaped).
    """
    c = result.checks
    lines = [f"**Quality: {result.verdict.upper()}** - {_md_cell(result.summary)}", ""]
    bad = c[c["success"] == False]  # noqa: E712
    if len(bad):
        bad = bad.assign(_o=bad["severity"].map({"fail": 0, "warn": 1}).fillna(2))
        bad = bad.sort_values("_o", kind="stable")
        lines += ["| severity | suite | check | observed | threshold | detail |",
                  "|---|---|---|---|---|---|"]
        for r in bad.itertuples(index=False):
            lines.append("| " + " | ".join(_md_cell(x) for x in (
                r.severity, r.suite, r.expectation, r.observed, r.threshold, r.detail)) + " |")
    else:
        lines.append("No check failed or warned.")
    n_skip = int(c["success"].isna().sum())
    if n_skip:
        skipped = ", ".join(c.loc[c["success"].isna(), "expectation"].astype(str))
        lines += ["", f"Skipped ({n_skip}): {skipped}"]
    return "\n".join(lines) + "\n"
