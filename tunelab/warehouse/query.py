"""Run the named SQL questions in ``tunelab/warehouse/queries/*.sql`` with parameters.

Each file answers one question, says so in its header comment and lists its ``$name``
parameters (DuckDB prepared-statement parameters). ``run_query`` fills them from keyword
arguments; pass ``None`` where a header says "NULL for all".
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pandas as pd

__all__ = ["QUERY_DIR", "list_queries", "query_params", "query_sql", "run_query"]

QUERY_DIR = Path(__file__).resolve().parent / "queries"
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def list_queries() -> list[str]:
    """Names of the available queries (file names without ``.sql``)."""
    return sorted(p.stem for p in QUERY_DIR.glob("*.sql"))


def query_sql(name: str) -> str:
    """The SQL text of query ``name``. Raises ValueError naming the available queries."""
    path = QUERY_DIR / f"{name}.sql"
    if not path.is_file():
        raise ValueError(f"no query {name!r}; available: {list_queries()}")
    return path.read_text(encoding="utf-8").strip().rstrip(";")


def query_params(name: str) -> list[str]:
    """The ``$name`` parameters query ``name`` uses (comments excluded)."""
    code = "\n".join(line.split("--", 1)[0] for line in query_sql(name).splitlines())
    return sorted(set(_PARAM.findall(code)))


def run_query(con: duckdb.DuckDBPyConnection, name: str, **params) -> pd.DataFrame:
    """Run query ``name`` with ``params`` and return the result as a DataFrame.

    Raises:
        ValueError: unknown query, or missing / unexpected parameters (named).
    """
    sql = query_sql(name)
    wanted = set(query_params(name))
    missing, extra = wanted - set(params), set(params) - wanted
    if missing or extra:
        raise ValueError(
            f"query {name!r} takes parameters {sorted(wanted)}; missing {sorted(missing)}, unexpected {sorted(extra)}"
        )
    return con.execute(sql, params).fetchdf()
