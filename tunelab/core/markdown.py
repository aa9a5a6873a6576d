"""Markdown tables (GitHub pipe syntax) for the reports and the Prefect artifacts, built with pandas'
``DataFrame.to_markdown`` (which uses the ``tabulate`` package).

One rule for every cell, whoever writes the table: a missing value (None, NaN, NA, NaT) is an empty cell;
anything else is ``str(value)`` with ``|`` escaped as ``\\|`` and line breaks made spaces, so a failure
reason or a log line cannot split a row. Numbers are written as the caller formatted them (tabulate's own
number parsing is off: ``"12.50"`` stays ``12.50``, a float stays ``str(float)``), and cells are not padded
to the column's width (a 300-character failure reason would otherwise widen every row of its column).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd

__all__ = ["markdown_cell", "markdown_table", "shorten"]


def markdown_cell(value: Any) -> str:
    """The text of one table cell: ``""`` for a missing value (None, NaN, ``pd.NA``, NaT), else
    ``str(value)`` with ``|`` escaped and ``\\r``/``\\n`` replaced by spaces."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return ""
    return str(value).replace("|", "\\|").replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def markdown_table(rows: pd.DataFrame | Iterable[Mapping[str, Any]], empty: str = "_none_") -> list[str]:
    """A markdown table as a list of lines: the header (column names), the separator, one line per row.

    Args:
        rows: a DataFrame (its columns in order, the index left out), or dicts of column name to value
            (the first dict's keys are the columns, in their order; every dict must have them).
        empty: the one line returned instead of a table when there are no rows.

    Returns:
        Lines without trailing newline, e.g. ``["| a | b |", "|-----|-----|", "| 1 | x\\|y |"]``; each
        cell as :func:`markdown_cell` writes it.

    Raises:
        KeyError: a dict lacks a column of the first dict.
    """
    if isinstance(rows, pd.DataFrame):
        df = rows
    else:
        dicts = list(rows)
        cols = list(dicts[0]) if dicts else []
        df = pd.DataFrame([[d[c] for c in cols] for d in dicts], columns=cols, dtype=object)
    if df.empty:
        return [empty]
    text = df.astype(object).map(markdown_cell).to_markdown(
        index=False, tablefmt="pipe", disable_numparse=True, stralign=None)
    return text.splitlines()


def shorten(text: Any, width: int = 160) -> str:
    """``text`` on one line (whitespace collapsed), at most ``width`` characters, cut at a word boundary with
    ``" …"`` (``textwrap.shorten``): a cell or a state message never ends in the middle of a word. A missing
    value is ``""``; a single word longer than ``width`` is cut at ``width - 2`` characters and marked ``…``."""
    import textwrap

    if text is None or (pd.api.types.is_scalar(text) and pd.isna(text)):
        return ""
    s = " ".join(str(text).split())
    if len(s) <= width:
        return s
    out = textwrap.shorten(s, width=width, placeholder=" …")
    return out if out != "…" else s[: width - 2] + " …"  # textwrap gives only "…" when the first word is too long
