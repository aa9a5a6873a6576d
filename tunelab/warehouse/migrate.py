"""Open the warehouse and bring its schema up to date.

Migrations are the files ``tunelab/warehouse/schema/NNN_<what>.sql`` (NNN = version, applied in
ascending order). Each is applied in its own transaction together with its row in
``schema_migrations(version, name, sha256, applied_at)``, so a failed migration leaves the
database at the previous version. ``connect`` is what every module uses to open the DB.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

__all__ = ["Migration", "SCHEMA_DIR", "applied_versions", "connect", "list_migrations", "migrate"]

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"


def _refill_version_columns(con: duckdb.DuckDBPyConnection) -> None:
    from tunelab.warehouse.versions import refill_version_columns

    refill_version_columns(con)


#: Python steps run right after a migration's SQL, in its transaction, for what SQL cannot derive (version ->
#: Python callable taking the connection). Only for files of SCHEMA_DIR.
_PYTHON_STEPS = {6: _refill_version_columns}
_NAME = re.compile(r"^(\d{3})_([A-Za-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One schema file: ``version`` (int from NNN), ``name`` (the file name), ``sql`` text, ``sha256``."""

    version: int
    name: str
    sql: str
    sha256: str


def list_migrations(schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """All migrations in ``schema_dir``, sorted by version.

    Raises:
        ValueError: on a ``.sql`` file not named ``NNN_<what>.sql`` or on two files with the
            same version number (rename one).
    """
    out: dict[int, Migration] = {}
    for p in sorted(Path(schema_dir).glob("*.sql")):
        m = _NAME.match(p.name)
        if not m:
            raise ValueError(f"schema file {p}: name must be NNN_<what>.sql (e.g. 003_add_views.sql)")
        version = int(m.group(1))
        if version in out:
            raise ValueError(f"schema files {out[version].name} and {p.name} share version {version}")
        text = p.read_text(encoding="utf-8")
        out[version] = Migration(version, p.name, text, hashlib.sha256(text.encode()).hexdigest())
    return [out[v] for v in sorted(out)]


def _ensure_table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """CREATE TABLE IF NOT EXISTS schema_migrations (
               version    INTEGER PRIMARY KEY,
               name       VARCHAR NOT NULL,
               sha256     VARCHAR NOT NULL,
               applied_at TIMESTAMPTZ DEFAULT current_timestamp
           )"""
    )


def applied_versions(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Versions recorded in ``schema_migrations`` (empty list for a fresh database)."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
    ).fetchall()[0][0]
    if not exists:
        return []
    return [r[0] for r in con.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()]


def migrate(
    con: duckdb.DuckDBPyConnection,
    *,
    target_version: int | None = None,
    schema_dir: Path = SCHEMA_DIR,
) -> list[int]:
    """Apply every not-yet-applied migration up to ``target_version`` (default: all).

    Each migration runs in one transaction with its ``schema_migrations`` row (and its Python step,
    ``_PYTHON_STEPS``, if it has one); on error the transaction is rolled back and a RuntimeError names the file.

    Returns:
        The versions applied by this call, ascending (empty when already up to date).
    """
    _ensure_table(con)
    done = set(applied_versions(con))
    applied: list[int] = []
    for mig in list_migrations(schema_dir):
        if mig.version in done or (target_version is not None and mig.version > target_version):
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(mig.sql)
            if schema_dir == SCHEMA_DIR and mig.version in _PYTHON_STEPS:
                _PYTHON_STEPS[mig.version](con)
            con.execute(
                "INSERT INTO schema_migrations (version, name, sha256) VALUES (?, ?, ?)",
                [mig.version, mig.name, mig.sha256],
            )
            con.execute("COMMIT")
        except Exception as exc:
            con.execute("ROLLBACK")
            raise RuntimeError(
                f"migration {mig.name} failed and was rolled back (database stays at "
                f"version {max(done | set(applied), default=0)}): {exc}"
            ) from exc
        applied.append(mig.version)
    return applied


def connect(
    db_path: str | Path,
    *,
    read_only: bool = False,
    target_version: int | None = None,
    row_group_size: int | None = None,
) -> duckdb.DuckDBPyConnection:
    """Open the warehouse DuckDB file and apply pending migrations.

    Args:
        db_path: the DuckDB file (created, with its parent folder, if missing); ``":memory:"``
            for a throwaway database.
        read_only: open read-only (no migrations are applied; several readers may share it).
        target_version: stop at this schema version (used by tests of the upgrade path).
        row_group_size: rows per row group for data written through this connection (DuckDB's
            default is 122,880). The file is then attached under the name ``warehouse`` to an
            in-memory connection, because DuckDB takes this setting only as an ATTACH option;
            it is not stored in the file, and row groups of any size read the same.

    Returns:
        An open ``duckdb.DuckDBPyConnection``; the caller closes it.

    Raises:
        duckdb.IOException: when another process holds the file (see ``warehouse.loader``,
            which waits and raises ``WarehouseLocked``).
        RuntimeError: when a migration fails (rolled back).
    """
    if str(db_path) != ":memory:":
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    if row_group_size and not read_only and str(db_path) != ":memory:":
        con = duckdb.connect()
        try:
            quoted = str(db_path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS warehouse (ROW_GROUP_SIZE {int(row_group_size)})")
            con.execute("USE warehouse")
        except Exception:
            con.close()
            raise
    else:
        con = duckdb.connect(str(db_path), read_only=read_only)
    if not read_only:
        try:
            migrate(con, target_version=target_version)
        except Exception:
            con.close()
            raise
    return con
