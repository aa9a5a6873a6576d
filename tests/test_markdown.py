"""tunelab.core.markdown: the one markdown table writer of the reports and artifacts (pandas ``to_markdown``)."""

from __future__ import annotations

import math

import pandas as pd

from tunelab.core.markdown import markdown_cell, markdown_table


def _cells(line: str) -> list[str]:
    """The cells of one table line, split on unescaped pipes, stripped."""
    import re

    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_rows_of_dicts_keep_order_text_and_escape_pipes_and_newlines():
    lines = markdown_table([{"config": "a|b", "boot s": "12.50", "why": "line one\nline two"},
                            {"config": "c", "boot s": "3.0", "why": None}])
    assert len(lines) == 4
    assert _cells(lines[0]) == ["config", "boot s", "why"]
    assert set(lines[1]) <= {"|", "-"}  # the separator line
    # numbers stay as the caller formatted them ("12.50", not 12.5); a pipe cannot split a row
    assert _cells(lines[2]) == ["a\\|b", "12.50", "line one line two"]
    assert _cells(lines[3]) == ["c", "3.0", ""]


def test_dataframe_missing_values_are_empty_and_floats_are_str():
    df = pd.DataFrame({"tokens": [1234.0, math.nan], "phase": ["kv_cache", None],
                       "n": pd.array([1, None], dtype="Int64")})
    lines = markdown_table(df)
    assert _cells(lines[0]) == ["tokens", "phase", "n"]
    assert _cells(lines[2]) == ["1234.0", "kv_cache", "1"]
    assert _cells(lines[3]) == ["", "", ""]


def test_cells_are_not_padded_to_the_column_width():
    lines = markdown_table([{"device": "gpu1", "reason": "x" * 50}])
    assert lines[2] == "| gpu1 | " + "x" * 50 + " |"


def test_empty_input_gives_the_empty_line():
    assert markdown_table([]) == ["_none_"]
    assert markdown_table(pd.DataFrame(columns=["a"]), empty="_no rows_") == ["_no rows_"]


def test_cell_rule():
    assert markdown_cell(pd.NA) == "" and markdown_cell(pd.NaT) == "" and markdown_cell(float("nan")) == ""
    assert markdown_cell(0) == "0" and markdown_cell(False) == "False"
    assert markdown_cell("a|b\r\nc") == "a\\|b c"
