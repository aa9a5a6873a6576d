"""Synthetic trials written straight into a warehouse connection, shared by the tests that compare them
(``test_warehouse_compare``, ``test_ab_family_tokens``): an in-memory warehouse fixture and :func:`add`."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tunelab.warehouse.loader import insert_trial_tables
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.synthetic import synthetic_trial

__all__ = ["add", "con"]


@pytest.fixture
def con():
    """An empty in-memory warehouse (schema migrated), closed after the test."""
    c = connect(":memory:")
    yield c
    c.close()


def add(con, **kw):
    """One ``synthetic_trial(**kw)`` (sweep ``sw`` unless given) inserted into ``con`` in one transaction, as the
    loader would; returns the synthetic trial."""
    kw.setdefault("sweep_id", "sw")
    st = synthetic_trial(**kw)
    trial = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in st.trial.items()}
    con.execute("BEGIN")
    insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]), "trial": pd.DataFrame([trial]),
                                                    **st.tables}, source="test")
    con.execute("COMMIT")
    return st
