"""Open the warehouse and bring its schema up to date.

Migrations are the files ``tunelab/warehouse/schema/NNN_<what>.sql`` (NNN = version, applied in
ascending order). Each is applied in its own transaction together with its row in
``schema_migrations(version, name, sha256, applied_at)``, so a failed migration leaves the
database at the previous version. ``connect`` is what every module uses to open the DB.

Applied migrations are immutable. Before applying anything, :func:`migrate` compares the sha256 of every
applied migration's file with the recorded one and raises :class:`MigrationError` naming the file when they
differ (a change goes into a new migration). Two files were edited before this check existed; their earlier
hashes are listed in :data:`HISTORICAL_SHA256` with what differs, and accepted. After migrating, every view
of the database must still bind (``SELECT * FROM view LIMIT 0``); one that does not is a MigrationError
naming the view.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

__all__ = [
    "HISTORICAL_SHA256",
    "Migration",
    "MigrationError",
    "SCHEMA_DIR",
    "applied_versions",
    "check_applied",
    "check_views",
    "connect",
    "list_migrations",
    "migrate",
]

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"


def _refill_version_columns(con: duckdb.DuckDBPyConnection) -> None:
    from tunelab.warehouse.versions import refill_version_columns

    refill_version_columns(con)


#: Python steps run right after a migration's SQL, in its transaction, for what SQL cannot derive (version ->
#: Python callable taking the connection). Only for files of SCHEMA_DIR.
_PYTHON_STEPS = {6: _refill_version_columns}

#: Earlier contents of migrations of SCHEMA_DIR that were edited after being committed, before the runner
#: compared hashes (file name -> {sha256 of the earlier text: what differs from today's file}). A warehouse
#: that recorded one of these hashes is accepted. Source: ``git log --follow`` of each file (commit named).
#: Closed list: a new edit of an applied migration is an error, never a new entry here.
HISTORICAL_SHA256: dict[str, dict[str, str]] = {
    "001_init.sql": {
        "32509c4734f3c6b1dbffc8fe85e20ce5bcc8120f49283739a324c87beaa745fb": (
            "as first committed (3ac450f): requests declared PRIMARY KEY (trial_id, workload, load_kind, load_value, "
            "repeat, request_index), dropped in db24770 for ingest speed; such a warehouse keeps the key: same "
            "columns and rows, slower loads"),
    },
    "004_receive_stamps.sql": {
        "8a9d0137f82d00cd85e6235b10753fa6ec488486f8347b310c97956badcdc289": (
            "as first committed (3d4dd94): without same_read_itl_frac, load_processes and trials.measurement_notes; "
            "migration 007 adds them"),
        "39c32169cbbb97107b441ce835671a631e3588129b25226e43acef04d9ce7991": (
            "as of 030a9ac: without load_processes and trials.measurement_notes; migration 007 adds them"),
        "e2d24833b3564c847b6c98bb4fb50a773c874d65620240b9427634d8b7ccd695": (
            "as of 34786d3: without trials.measurement_notes; migration 007 adds it"),
    },
}


class MigrationError(RuntimeError):
    """The schema cannot be trusted: an applied migration's file changed, a recorded migration has no file,
    a migration failed (rolled back), or a view no longer binds. The message names the file or view and the fix."""
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
    ``_PYTHON_STEPS``, if it has one); on error the transaction is rolled back and a :class:`MigrationError`
    names the file. Before: :func:`check_applied`; after: :func:`check_views`.

    Returns:
        The versions applied by this call, ascending (empty when already up to date).
    """
    _ensure_table(con)
    migrations = list_migrations(schema_dir)
    check_applied(con, migrations, historical=HISTORICAL_SHA256 if Path(schema_dir) == SCHEMA_DIR else {})
    done = set(applied_versions(con))
    applied: list[int] = []
    for mig in migrations:
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
            raise MigrationError(
                f"migration {mig.name} failed and was rolled back (database stays at "
                f"version {max(done | set(applied), default=0)}): {exc}"
            ) from exc
        applied.append(mig.version)
    check_views(con)
    return applied


def check_applied(con: duckdb.DuckDBPyConnection, migrations: list[Migration],
                  historical: dict[str, dict[str, str]] | None = None) -> None:
    """Every migration recorded in ``schema_migrations`` still has its file, with the recorded sha256.

    Args:
        migrations: the files (:func:`list_migrations`).
        historical: accepted earlier hashes per file name (:data:`HISTORICAL_SHA256` for SCHEMA_DIR).

    Raises:
        MigrationError: a recorded version without a file (the database was migrated by a newer tunelab), or a
            file whose sha256 differs from the recorded one and is not a listed earlier version; names the file.
    """
    by_version = {m.version: m for m in migrations}
    historical = historical or {}
    rows = con.execute("SELECT version, name, sha256 FROM schema_migrations ORDER BY version").fetchall()
    for version, name, sha in rows:
        mig = by_version.get(version)
        if mig is None:
            raise MigrationError(
                f"schema_migrations records version {version} ({name}), and this tunelab has no such file: the "
                f"warehouse was migrated by a newer tunelab; use that version (or a copy of the database)")
        if sha != mig.sha256 and sha not in historical.get(mig.name, {}):
            raise MigrationError(
                f"migration {mig.name} was changed after it was applied to this warehouse (recorded sha256 "
                f"{sha[:12]}..., file now {mig.sha256[:12]}...). Applied migrations are immutable: restore the file "
                f"(git log -- {mig.name}) and put the change in a new migration "
                f"{max(by_version) + 1:03d}_<what>.sql")


def check_views(con: duckdb.DuckDBPyConnection) -> None:
    """Every view of the current database's ``main`` schema binds: ``SELECT * FROM view LIMIT 0`` runs.

    Raises:
        MigrationError: naming the view and DuckDB's error (a column or table it reads is gone or renamed).
    """
    views = [r[0] for r in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
        "AND database_name = current_database() ORDER BY view_name").fetchall()]
    for v in views:
        try:
            con.execute(f'SELECT * FROM "{v}" LIMIT 0')
        except duckdb.Error as exc:
            raise MigrationError(f"view {v} no longer binds after migrating: {exc}; fix it in a new migration "
                                 f"(CREATE OR REPLACE VIEW {v} ...)") from exc


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
        MigrationError (a RuntimeError): a migration failed (rolled back), an applied migration's file
            changed, or a view does not bind; see :func:`migrate`.
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
