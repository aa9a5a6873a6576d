"""How tunelab's Prefect artifacts lay out their tables, so that what matters is on screen.

The Prefect UI does not wrap table cells: a row is as wide as its text, and the artifact frame (about 1,028 px in
a 1,600 px window, less at 1,280 x 800) cuts the rest off without a scroll hint. The A/B artifact was a
3,585 px wide table with its verdict and its reason in the last two columns, off screen. So an artifact leads
with a narrow table of the answer (what was compared, the verdict, the change and a reason cut at a word
boundary) and puts the wide detail in a second table, with the whole reasons as a list below (list items wrap).
The terminal and the HTML report keep their own layout (``reports.report``, ``reports.html``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from tunelab.core.load_profiles import load_label
from tunelab.core.markdown import markdown_table, shorten
from tunelab.stats.intervals import mde_text

__all__ = ["REASON_CHARS", "ab_artifact_markdown", "narrow_ab_tables"]

#: A reason in a table cell is cut here (at a word boundary); the whole text follows in a list.
REASON_CHARS = 70


def _pct(x: Any) -> str:
    return "-" if x is None or pd.isna(x) else f"{x * 100:+.1f}%"


def _cell(r: Any, by_config: bool) -> str:
    what = f"{r.workload} {load_label(r.load_kind, r.load_value)}"
    return f"{r.config_label} `{r.config_key}` · {what}" if by_config else what


def narrow_ab_tables(df: pd.DataFrame) -> list[str]:
    """Markdown lines of an A/B result (``warehouse.compare.compare``'s rows): first "Verdicts" (what, verdict,
    change with its 95 % interval, the reason cut at :data:`REASON_CHARS`; 4 columns), then "Detail" (what, both
    means, boots per side, the minimum detectable effect; 5 columns), then the whole reasons as a list."""
    if df.empty:
        return ["_no measurements match both selectors_"]
    by_config = "config_key" in df.columns and (df["config_key"].astype(str) != "").any()
    rows = list(df.itertuples(index=False))
    lines = ["## Verdicts", ""] + markdown_table([{
        "what": _cell(r, by_config), "verdict": f"**{r.verdict}**",
        "change [95% CI]": f"{_pct(r.rel_diff)} [{_pct(r.rel_ci_low)}, {_pct(r.rel_ci_high)}]",
        "why": shorten(r.reason, REASON_CHARS)} for r in rows])
    lines += ["", "## Detail", ""] + markdown_table([{
        "what": _cell(r, by_config),
        "baseline": "-" if pd.isna(r.baseline_mean) else f"{r.baseline_mean:.4g}",
        "candidate": "-" if pd.isna(r.candidate_mean) else f"{r.candidate_mean:.4g}",
        "boots": f"{r.baseline_boots} vs {r.candidate_boots}",
        "MDE": "-" if pd.isna(getattr(r, "mde_rel", None)) else mde_text(r.mde_rel)} for r in rows])
    cut = [r for r in rows if len(" ".join(str(r.reason or "").split())) > REASON_CHARS]
    if cut:
        lines += ["", "Reasons in full:", ""] + [f"- {_cell(r, by_config)}: {r.reason}" for r in cut]
    return lines


def ab_artifact_markdown(df: pd.DataFrame, markdown: str) -> str:
    """The A/B artifact: ``markdown`` (``reports.report.ab_markdown`` and what the compare flow appends) with its
    one wide table replaced by :func:`narrow_ab_tables`; everything before and after it (selectors, method, trials
    left out, regressions) is kept. A text without a table is returned with the narrow tables after its heading."""
    lines = markdown.split("\n")
    start = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if start is None:
        head, tail = lines[:1], lines[1:]
    else:
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        head, tail = lines[:start], lines[end:]
    return "\n".join([*head, *narrow_ab_tables(df), *tail])
