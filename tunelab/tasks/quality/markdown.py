"""Markdown of one trial's quality result, for a Prefect artifact."""

from __future__ import annotations

from tunelab.core.markdown import markdown_cell, markdown_table
from tunelab.tasks.quality.catalogue import QualityResult


def quality_markdown(result: QualityResult) -> str:
    """Markdown for a Prefect artifact: the verdict, the summary line, and a table of the
    checks that failed or warned (skipped checks are counted, not listed).

    Args:
        result: a ``QualityResult`` from ``validate_trial``.

    Returns:
        Markdown text (GitHub table syntax, ``|`` in cells escaped).
    """
    c = result.checks
    lines = [f"**Quality: {result.verdict.upper()}** - {markdown_cell(result.summary)}", ""]
    bad = c[c["success"] == False]  # noqa: E712
    if len(bad):
        bad = bad.assign(_o=bad["severity"].map({"fail": 0, "warn": 1}).fillna(2))
        bad = bad.sort_values("_o", kind="stable")
        lines += markdown_table(bad[["severity", "suite", "expectation", "observed", "threshold", "detail"]]
                                .rename(columns={"expectation": "check"}))
    else:
        lines.append("No check failed or warned.")
    n_skip = int(c["success"].isna().sum())
    if n_skip:
        skipped = ", ".join(c.loc[c["success"].isna(), "expectation"].astype(str))
        lines += ["", f"Skipped ({n_skip}): {skipped}"]
    return "\n".join(lines) + "\n"
