"""An overloaded open-loop window (measurements.overloaded, tasks.metrics.overload) is left out of comparisons:
compare's boot values and the automatic A/B's, as an SLA search's windows are."""

from __future__ import annotations

import pandas as pd

from tunelab.core.load_profiles import load_label


def test_compare_boot_values_leave_overloaded_windows_out(tmp_path):
    from tunelab.warehouse.compare import _boot_values
    from tunelab.warehouse.migrate import connect

    con = connect(tmp_path / "wh.duckdb")
    try:
        con.execute("""INSERT INTO measurements (trial_id, workload, load_kind, load_value, repeat,
                                                 output_tokens_per_s, overloaded)
                       VALUES ('t', 'w', 'rate', 8, 0, 100.0, false), ('t', 'w', 'rate', 8, 1, 100.0, NULL),
                              ('t', 'w', 'rate', 20, 0, 40.0, true)""")
        bv = _boot_values(con, ["t"], "output_tokens_per_s")
    finally:
        con.close()
    assert list(bv["load_value"]) == [8.0] and list(bv["repeats"]) == [2], bv


def test_ab_boot_value_leaves_overloaded_windows_out():
    from tunelab.flows.ab_auto import ABCell, boot_value

    m = pd.DataFrame({"workload": ["w"] * 3, "load_kind": ["rate"] * 3, "load_value": [20.0] * 3,
                      "repeat": [0, 1, 2], "output_tokens_per_s": [100.0, 10.0, 10.0],
                      "overloaded": [False, True, True]})
    cell = ABCell(workload="w", load=load_label("rate", 20.0), metric="output_tokens_per_s")
    assert boot_value(m, cell) == 100.0
