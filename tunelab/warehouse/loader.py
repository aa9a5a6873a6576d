"""Load result bundles into the DuckDB warehouse: transactional, idempotent, never deleting bundles.

One bundle (one trial, see ``tunelab.core.bundle``) is loaded in one transaction:

1. the bundle is verified first (manifest present, every file's sha256 matches);
2. if ``loaded_bundles`` already holds this trial with the same manifest sha256, nothing is
   done (``status="skipped"``);
3. otherwise every row of that ``trial_id`` is deleted and the bundle's rows inserted
   (delete-then-insert), the sweep row is upserted (non-NULL values win), the
   ``vllm_release*`` columns are filled from ``vllm_version`` when NULL, row counts are
   checked against the manifest, and ``loaded_bundles`` is updated; then COMMIT.

Any exception rolls the transaction back, so the database is unchanged and the bundle stays
on disk for a later ``tunelab load``. DuckDB allows one writing process per file: when the
file is locked, the loader waits with exponential backoff and then raises ``WarehouseLocked``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import duckdb
import pandas as pd
import pyarrow.parquet as pq

from tunelab.core import records
from tunelab.core.bundle import BUNDLE_TABLES, TABLE_TO_WAREHOUSE, BundleError, list_bundles, verify_bundle
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.versions import version_columns

__all__ = [
    "LoadResult",
    "WarehouseLocked",
    "BundleLoadError",
    "bundles_warehouse",
    "load_bundle",
    "lock_holder",
    "load_pending",
    "open_warehouse",
    "insert_trial_tables",
    "DEFAULT_LOCK_TIMEOUT_S",
]

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_S = 60.0
# Write-ahead log size at which DuckDB checkpoints during ``load_pending`` (see there).
CHECKPOINT_THRESHOLD = "1GB"
# Row group size of the loader's connection. A bundle whose table has at least this many rows
# is written by DuckDB straight into the database file, compressed, before COMMIT ("optimistic
# write"); the write-ahead log then only references those blocks. Smaller bundles go through
# the log. 32,768 (DuckDB's default is 122,880) makes a bundle of ~50,000 request rows take
# the direct path; scans of the views were not slower with it (benchmarks/warehouse_ingest.py).
LOADER_ROW_GROUP_SIZE = 32_768
_TRIAL_TABLES = tuple(r.TABLE for r in records.RECORDS.values() if r is not records.Sweep)
_VERSION_COLUMNS = tuple(version_columns(None))


class WarehouseLocked(RuntimeError):
    """The warehouse file is held by another process for longer than the lock timeout.

    Nothing was written; bundles stay on disk and a later ``tunelab load`` picks them up.

    Attributes:
        db_path: the DuckDB file.
        holder_pid: PID of the process holding DuckDB's lock on it, from DuckDB's message
            (``Conflicting lock is held in <exe> (PID N)``, see :func:`lock_holder`); None when the message
            does not name it.
        holder_exe: that process's executable as DuckDB names it, or None.
        waited_s: how long the loader waited for the lock, seconds.
        pending_dir: where the bundles that were not loaded are (None when not known).
    """

    def __init__(self, message: str, *, db_path: str | Path | None = None, holder_pid: int | None = None,
                 holder_exe: str | None = None, waited_s: float = 0.0, pending_dir: str | Path | None = None):
        super().__init__(message)
        self.db_path = db_path
        self.holder_pid = holder_pid
        self.holder_exe = holder_exe
        self.waited_s = waited_s
        self.pending_dir = pending_dir

    @property
    def holder(self) -> str:
        """``PID 4148 (/usr/bin/python3.11)``, or ``another process`` when DuckDB did not name it."""
        if self.holder_pid is None:
            return "another process"
        return f"PID {self.holder_pid}" + (f" ({self.holder_exe})" if self.holder_exe else "")


# DuckDB's message for a file another process holds: 'IO Error: Could not set lock on file "X": Conflicting
# lock is held in /usr/bin/python3.11 (PID 4148). See also ...' (DuckDB 1.1 - 2.0; on Windows it may carry no PID).
_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.*?) \(PID (?P<pid>\d+)\)")


def lock_holder(error: BaseException | str) -> tuple[int | None, str | None]:
    """(PID, executable) of the process holding a DuckDB file, parsed from DuckDB's lock error (an exception
    or its text); (None, None) when the message does not name it (another DuckDB version or platform)."""
    m = _LOCK_HOLDER.search(str(error))
    if not m:
        return None, None
    return int(m.group("pid")), (m.group("exe").strip() or None)


class BundleLoadError(RuntimeError):
    """Loading one bundle failed; the transaction was rolled back and the bundle left on disk."""


@dataclass
class LoadResult:
    """Outcome of loading one bundle.

    Attributes:
        bundle_dir: the bundle folder.
        trial_id, sweep_id: from the manifest (None if the manifest was unreadable).
        status: ``loaded`` | ``skipped`` (same manifest sha256 already loaded) | ``failed``
            (only from ``load_pending``, which carries on with the other bundles).
        rows: rows inserted per warehouse table (empty when skipped).
        manifest_sha256: hash of the bundle's manifest file.
        seconds: wall time of this load.
        error: why it failed (``status == "failed"``).
    """

    bundle_dir: Path
    trial_id: str | None
    sweep_id: str | None
    status: str
    rows: dict[str, int] = field(default_factory=dict)
    manifest_sha256: str | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def total_rows(self) -> int:
        """All rows inserted, over all tables."""
        return sum(self.rows.values())


def _is_lock_error(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


def open_warehouse(
    db_path: str | Path,
    *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    initial_backoff_s: float = 0.05,
    max_backoff_s: float = 2.0,
    pending_dir: str | Path | None = None,
) -> duckdb.DuckDBPyConnection:
    """Open the warehouse read-write (applying migrations), waiting while another process holds it.

    Retries ``duckdb.IOException`` "Could not set lock on file ..." with exponential backoff
    (``initial_backoff_s`` doubling up to ``max_backoff_s``) until ``lock_timeout_s`` has passed.

    Raises:
        WarehouseLocked: naming the file, the time waited, and saying that bundles (in
            ``pending_dir`` when given) stay on disk for a later ``tunelab load``.
    """
    deadline = time.monotonic() + max(0.0, lock_timeout_s)
    delay = initial_backoff_s
    attempts = 0
    while True:
        attempts += 1
        try:
            return connect(db_path, row_group_size=LOADER_ROW_GROUP_SIZE)
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                where = f" in {pending_dir}" if pending_dir is not None else ""
                pid, exe = lock_holder(exc)
                who = f"PID {pid}" if pid is not None else "another process"
                raise WarehouseLocked(
                    f"warehouse {db_path} is locked by {who} (gave up after {lock_timeout_s:g} s, "
                    f"{attempts} attempts): {exc}. Nothing was loaded; the bundles stay on disk{where} and a "
                    "later `tunelab load` picks them up.",
                    db_path=db_path, holder_pid=pid, holder_exe=exe, waited_s=lock_timeout_s, pending_dir=pending_dir,
                ) from exc
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, max_backoff_s)


def _schema_columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    """{table: columns} of the main schema, read once per bundle."""
    rows = con.execute(
        "SELECT table_name, list(column_name) FROM information_schema.columns "
        "WHERE table_schema = 'main' GROUP BY table_name"
    ).fetchall()
    return {t: set(cols) for t, cols in rows}


def _parquet_columns(path: Path) -> list[str]:
    return pq.read_schema(path).names


def _check_columns(schema: dict[str, set[str]], table: str, cols, source: str) -> None:
    """Refuse columns that the table's record (``tunelab/core/records.py``) or the warehouse does not have, naming
    them: the record is the source of the columns, the SQL schema must agree with it (tests/test_records.py)."""
    record = records.record_for(table)
    unknown = sorted(set(cols) - set(record.model_fields))
    if unknown:
        raise BundleError(
            f"{source}: columns {unknown} are not columns of {table!r} (tunelab/core/records.py {record.__name__}); "
            "fix the writer, or add them to the record and in a new tunelab/warehouse/schema migration"
        )
    missing = sorted(set(cols) - schema.get(table, set()))
    if missing:
        raise BundleError(
            f"{source}: columns {missing} do not exist in warehouse table {table!r}: the warehouse lacks a "
            "tunelab/warehouse/schema migration that adds them"
        )


def _upsert_sweep(con, schema, sweep: pd.DataFrame, source: str) -> int:
    _check_columns(schema, "sweeps", sweep.columns, source)
    row = sweep.iloc[0].to_dict()
    cur = con.execute("SELECT * FROM sweeps WHERE sweep_id = ?", [row["sweep_id"]])
    found = cur.fetchall()
    frame = sweep
    if found:
        old = dict(zip([d[0] for d in cur.description], found[0]))
        new = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and pd.isna(v))}
        if all(str(old.get(k)) == str(v) or (k in old and _same_time(old[k], v)) for k, v in new.items()):
            return 0  # nothing new about this sweep (the usual case: its other trials loaded it)
        frame = pd.DataFrame([{**old, **new}])
        con.execute("DELETE FROM sweeps WHERE sweep_id = ?", [row["sweep_id"]])
    con.register("_tl_sweep", frame)
    try:
        con.execute("INSERT INTO sweeps BY NAME SELECT * FROM _tl_sweep")
    finally:
        con.unregister("_tl_sweep")
    return 1


def _same_time(a, b) -> bool:
    try:
        return pd.Timestamp(a) == pd.Timestamp(b)
    except (ValueError, TypeError):
        return False


def _prepare_trial(trial: pd.DataFrame) -> pd.DataFrame:
    trial = trial.copy()
    raw = trial.at[0, "vllm_version"] if "vllm_version" in trial.columns else None
    if raw is None or (isinstance(raw, float) and pd.isna(raw)):
        return trial
    cols = version_columns(str(raw))
    for k, v in cols.items():
        if k not in trial.columns or pd.isna(trial.at[0, k]):
            trial[k] = pd.Series([v], dtype=object)
    return trial


def _read_one_row(con, path: Path, where: str) -> dict:
    """The single row of a one-row Parquet file (``trial``/``sweep``) as a dict, read by DuckDB."""
    cur = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
    found = cur.fetchall()
    if len(found) != 1:
        raise BundleError(f"{where}: must have exactly one row, has {len(found)}")
    return dict(zip([d[0] for d in cur.description], found[0]))


def _insert_trial_row(con, schema, row: dict, source: str) -> None:
    """Insert one ``trials`` row given as a dict, filling the version columns that are NULL."""
    raw = row.get("vllm_version")
    if raw is not None:
        for k, v in version_columns(str(raw)).items():
            if row.get(k) is None:
                row[k] = v
    _check_columns(schema, "trials", row, source)
    cols = list(row)
    con.execute(
        f"INSERT INTO trials ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [row[c] for c in cols]
    )


def _insert_frame(con, schema, table: str, df: pd.DataFrame, source: str) -> int:
    _check_columns(schema, table, df.columns, source)
    con.register("_tl_frame", df)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _tl_frame")
    finally:
        con.unregister("_tl_frame")
    return len(df)


def _insert_parquet(con, schema, table: str, path: Path, source: str, trial_id: str) -> int:
    """Insert the rows of ``path`` that carry ``trial_id``; returns how many were inserted.

    The file's columns (from its Parquet footer, no data read) are checked against the record first; then
    DuckDB reads the Parquet file itself (no pandas/pyarrow copy).
    """
    _check_columns(schema or _schema_columns(con), table, _parquet_columns(path), source)
    return con.execute(
        f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet(?) WHERE trial_id = ?", [str(path), trial_id]
    ).fetchall()[0][0]


def _count(con, table: str, trial_id: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE trial_id = ?", [trial_id]).fetchall()[0][0]


def insert_trial_tables(
    con: duckdb.DuckDBPyConnection,
    trial_id: str,
    frames: dict[str, pd.DataFrame | Path],
    *,
    source: str,
    expected_rows: dict[str, int] | None = None,
    schema: dict[str, set[str]] | None = None,
) -> dict[str, int]:
    """Delete every row of ``trial_id`` and insert ``frames`` (bundle table name -> DataFrame or Parquet path).

    Runs inside the caller's transaction. ``sweep`` is upserted, ``trial`` gets its version
    columns filled. Row counts per table are checked against ``expected_rows`` (or the frame
    lengths), which also catches rows carrying another trial_id.

    Returns:
        Rows inserted per warehouse table.
    """
    if "trial" not in frames:
        raise BundleError(f"{source}: no trial table; a bundle must contain its trials row")
    known = con.execute(
        "SELECT (SELECT count(*) FROM trials WHERE trial_id = $1) + (SELECT count(*) FROM loaded_bundles "
        "WHERE bundle_id = $1)", [trial_id]
    ).fetchall()[0][0]
    if known:
        for table in _TRIAL_TABLES:
            con.execute(f"DELETE FROM {table} WHERE trial_id = ?", [trial_id])
    rows: dict[str, int] = {}
    schema = schema or _schema_columns(con)
    for name in BUNDLE_TABLES:
        if name not in frames:
            continue
        table = TABLE_TO_WAREHOUSE[name]
        item = frames[name]
        where = f"{source}: table {name}"
        if name == "trial" and isinstance(item, Path):
            row = _read_one_row(con, item, where)
            if row.get("trial_id") != trial_id:
                raise BundleError(f"{where}: trial_id {row.get('trial_id')!r} differs from {trial_id!r}")
            _insert_trial_row(con, schema, row, where)
            got = 1
        elif name in ("sweep", "trial"):
            df = pd.DataFrame(pq.read_table(item).to_pylist()) if isinstance(item, Path) else item
            if len(df) != 1:
                raise BundleError(f"{where}: must have exactly one row, has {len(df)}")
            if name == "sweep":
                rows[table] = _upsert_sweep(con, schema, df, where)
                continue
            if df.at[0, "trial_id"] != trial_id:
                raise BundleError(f"{where}: trial_id {df.at[0, 'trial_id']!r} differs from {trial_id!r}")
            _insert_frame(con, schema, table, _prepare_trial(df), where)
            got = 1
        elif isinstance(item, Path):
            got = _insert_parquet(con, schema, table, item, where, trial_id)
        else:
            _insert_frame(con, schema, table, item, where)
            got = _count(con, table, trial_id)
        want = (expected_rows or {}).get(name, None)
        if want is None and isinstance(item, pd.DataFrame):
            want = len(item)
        if want is not None and got != want:
            raise BundleError(
                f"{where}: {want} rows expected but {got} rows with trial_id {trial_id!r} were inserted; "
                "every row of a bundle must carry the bundle's trial_id"
            )
        rows[table] = got
    return rows


def _record_loaded(
    con, trial_id: str, sha: str, path: str | None, fmt: int | None, rows: int, *, replace: bool = True
) -> None:
    """Record the bundle in ``loaded_bundles``; ``replace=False`` when it is known to have no row yet."""
    if replace:
        con.execute("DELETE FROM loaded_bundles WHERE bundle_id = ?", [trial_id])
    con.execute(
        "INSERT INTO loaded_bundles (bundle_id, sha256, loaded_at, bundle_path, bundle_format, rows_loaded) "
        "VALUES (?, ?, current_timestamp, ?, ?, ?)",
        [trial_id, sha, path, fmt, rows],
    )


def _loaded_sha(con, trial_id: str) -> str | None:
    r = con.execute("SELECT sha256 FROM loaded_bundles WHERE bundle_id = ?", [trial_id]).fetchall()
    return r[0][0] if r else None


def _load_one(
    con: duckdb.DuckDBPyConnection,
    bundle_dir: Path,
    manifest: dict | None = None,
    schema: dict[str, set[str]] | None = None,
    *,
    loaded_sha: str | None = None,
    checked_sha: bool = False,
    sweeps_stored: set[tuple[str, str]] | None = None,
) -> LoadResult:
    """Load one verified bundle in one transaction.

    ``checked_sha``: the caller already read ``loaded_bundles`` for this trial (``loaded_sha``,
    None when it has no row) and found a different sha256.
    ``sweeps_stored``: (sweep_id, sha256 of the sweep file) pairs committed earlier on this
    connection; such a sweep row is not upserted again (it would change nothing). A pair is
    added only after COMMIT.
    """
    t0 = time.perf_counter()
    bundle_dir = Path(bundle_dir)
    manifest = manifest or verify_bundle(bundle_dir)
    trial_id, sweep_id, sha = manifest["trial_id"], manifest["sweep_id"], manifest["manifest_sha256"]
    if not checked_sha:
        loaded_sha = _loaded_sha(con, trial_id)
    if loaded_sha == sha:
        return LoadResult(bundle_dir, trial_id, sweep_id, "skipped", {}, sha, time.perf_counter() - t0)
    files = dict(manifest["files"])
    sweep_key = (sweep_id, files["sweep"]["sha256"]) if "sweep" in files else None
    if sweeps_stored is not None and sweep_key in sweeps_stored:
        del files["sweep"]
    frames = {name: bundle_dir / e["file"] for name, e in files.items()}
    expected = {name: int(e["rows"]) for name, e in files.items()}
    con.execute("BEGIN TRANSACTION")
    try:
        rows = insert_trial_tables(con, trial_id, frames, source=f"bundle {bundle_dir}", expected_rows=expected,
                                   schema=schema)
        _record_loaded(con, trial_id, sha, str(bundle_dir), manifest.get("bundle_format"), sum(rows.values()),
                       replace=loaded_sha is not None)
        con.execute("COMMIT")
        if sweeps_stored is not None and sweep_key is not None:
            sweeps_stored.add(sweep_key)
    except BaseException as exc:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        if isinstance(exc, (BundleError, KeyboardInterrupt, SystemExit)):
            raise
        raise BundleLoadError(
            f"loading bundle {bundle_dir} (trial {trial_id}) failed and was rolled back; the warehouse is "
            f"unchanged and the bundle stays on disk: {type(exc).__name__}: {exc}"
        ) from exc
    return LoadResult(bundle_dir, trial_id, sweep_id, "loaded", rows, sha, time.perf_counter() - t0)


def load_bundle(
    db_path: str | Path,
    bundle_dir: str | Path,
    *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> LoadResult:
    """Load one bundle into the warehouse at ``db_path`` (one transaction, idempotent).

    Args:
        db_path: DuckDB file (created and migrated if needed).
        bundle_dir: the bundle folder (``tunelab.core.bundle.write_bundle``'s return value).
        lock_timeout_s: how long to wait for another process holding the file.

    Returns:
        LoadResult with status ``loaded`` or ``skipped`` (same manifest already loaded).

    Raises:
        BundleError: no manifest, a file missing or with a wrong sha256 (named), unknown columns.
            Checked before the database is opened.
        WarehouseLocked: the file stayed locked for ``lock_timeout_s``.
        BundleLoadError: the insert failed; rolled back, database unchanged.
    """
    bundle_dir = Path(bundle_dir)
    manifest = verify_bundle(bundle_dir)
    con = open_warehouse(db_path, lock_timeout_s=lock_timeout_s, pending_dir=bundle_dir)
    try:
        return _load_one(con, bundle_dir, manifest)
    finally:
        con.close()


def bundles_warehouse(bundles: list[str | Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory warehouse holding only ``bundles``, loaded by the same code as the DuckDB file
    (:func:`warehouse.migrate.connect` on ``:memory:``, then one transaction per bundle), so that reports and
    queries read it as they read the file: what a sweep prints when its warehouse file is locked by another
    process (``tunelab.reports.report.comparison_frame`` accepts the connection).

    A bundle that does not load (corrupt, unknown columns) is logged and left out, as ``load_pending`` does.

    Returns:
        An open connection; the caller closes it.
    """
    con = connect(":memory:")
    try:
        schema = _schema_columns(con)
        for b in bundles:
            try:
                _load_one(con, Path(b), schema=schema)
            except (BundleError, BundleLoadError) as exc:
                log.error("bundle %s left out of the in-memory warehouse: %s", b, exc)
    except BaseException:
        con.close()
        raise
    return con


def load_pending(
    db_path: str | Path,
    results_dir: str | Path,
    *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    on_result: Callable[[LoadResult], None] | None = None,
    workers: int | None = None,
) -> list[LoadResult]:
    """Load every bundle under ``results_dir`` that is not loaded yet (or changed since).

    A bundle counts as loaded when ``loaded_bundles`` has its trial_id with the same manifest
    sha256; those are not reported. A bundle that fails (corrupt, bad columns, insert error)
    gets ``status="failed"`` with the reason and the others still load; the database holds
    the write lock for the whole call.

    Each bundle is still one transaction of its own. ``workers`` (default: the CPU count, at most 4)
    transactions run at once, each on its own cursor of the one connection: DuckDB runs concurrent
    transactions of one process in parallel and appends to the same table never conflict, while
    one transaction's insert runs on one core. The first bundle of each sweep loads alone first, so
    that the sweep row exists before bundles that share it run side by side; bundles whose sweep row
    differs, and the last bundle of each sweep, load alone at the end in path order, so the result equals
    a one-at-a-time load; a bundle whose transaction still hits a write-write conflict is rolled back and
    loaded again alone after the others.

    Returns:
        One LoadResult per bundle attempted, in path order.

    Raises:
        WarehouseLocked: see ``open_warehouse``; nothing is loaded then.
    """
    bundles = list_bundles(Path(results_dir))
    workers = max(1, workers if workers is not None else min(4, os.cpu_count() or 1))
    con = open_warehouse(db_path, lock_timeout_s=lock_timeout_s, pending_dir=results_dir)
    results: dict[Path, LoadResult] = {}
    try:
        # Each COMMIT appends its rows to the write-ahead log (written and fsynced: a committed
        # bundle survives a crash). With DuckDB's default threshold (16 MiB) nearly every
        # bundle's commit would also checkpoint, i.e. recompress the table's last row group
        # and rewrite the metadata; here the log grows to CHECKPOINT_THRESHOLD and the rows
        # are compressed into the file once, by the CHECKPOINT at the end.
        con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
        loaded = dict(con.execute("SELECT bundle_id, sha256 FROM loaded_bundles").fetchall())
        schema = _schema_columns(con)  # no DDL happens while loading
        catalog = con.execute("SELECT current_database()").fetchall()[0][0]
        sweeps_stored: set[tuple[str, str]] = set()

        def load(bundle: Path, cur: duckdb.DuckDBPyConnection, retry_conflict: bool) -> LoadResult | None:
            t0 = time.perf_counter()
            try:
                manifest = verify_bundle(bundle)
                if loaded.get(manifest["trial_id"]) == manifest["manifest_sha256"]:
                    return None
                result = _load_one(cur, bundle, manifest, schema, loaded_sha=loaded.get(manifest["trial_id"]),
                                   checked_sha=True, sweeps_stored=sweeps_stored)
                loaded[result.trial_id] = result.manifest_sha256
                return result
            except BundleLoadError as exc:
                if retry_conflict and isinstance(exc.__cause__, duckdb.TransactionException):
                    log.info("bundle %s: write-write conflict with a concurrent load; loading it again alone", bundle)
                    return _CONFLICT
                log.error("bundle %s not loaded: %s", bundle, exc)
                return LoadResult(bundle, None, None, "failed", seconds=time.perf_counter() - t0, error=str(exc))
            except BundleError as exc:
                log.error("bundle %s not loaded: %s", bundle, exc)
                return LoadResult(bundle, None, None, "failed", seconds=time.perf_counter() - t0, error=str(exc))

        def done(bundle: Path, result: LoadResult | None) -> None:
            if result is not None:
                results[bundle] = result
                if on_result:
                    on_result(result)

        # Order: the result must equal loading one bundle after the other in path order, where the sweep
        # row of the last bundle of a sweep is the one that stays. So the first bundle of each sweep loads
        # alone (its sweep row then exists), bundles whose sweep file equals that one's run side by side (their
        # sweep row changes nothing), and the others (a sweep row that differs) and the last bundle of each
        # sweep load alone at the end, in path order.
        first, parallel, serial, first_sha, last_of, shas = [], [], [], {}, {}, {}
        keys = {b: _manifest_sweep(b) for b in bundles}
        for bundle in bundles:
            last_of[keys[bundle][0]] = bundle
            shas.setdefault(keys[bundle][0], set()).add(keys[bundle][1])
        for bundle in bundles:
            sweep_id, sha = keys[bundle]
            if sweep_id not in first_sha:
                first_sha[sweep_id] = sha
                first.append(bundle)
            elif sha == first_sha[sweep_id] and sha is not None and (
                    bundle != last_of[sweep_id] or len(shas[sweep_id]) == 1):  # one sweep row: any order
                parallel.append(bundle)
            else:
                serial.append(bundle)
        for bundle in first:
            done(bundle, load(bundle, con, retry_conflict=False))
        conflicted = []
        if workers == 1 or len(parallel) < 2:
            serial = sorted(parallel + serial)
        else:
            cursors = [con.cursor() for _ in range(workers)]
            try:
                for cur in cursors:
                    cur.execute(f'USE "{catalog}"')  # a cursor starts in the default catalog
                free = list(cursors)
                lock = threading.Lock()

                def run(bundle: Path) -> LoadResult | None:
                    with lock:
                        cur = free.pop()
                    try:
                        return load(bundle, cur, retry_conflict=True)
                    finally:
                        with lock:
                            free.append(cur)

                with ThreadPoolExecutor(max_workers=workers) as pool:
                    futures = {pool.submit(run, b): b for b in parallel}
                    for fut in as_completed(futures):
                        r = fut.result()
                        if r is _CONFLICT:
                            conflicted.append(futures[fut])
                        else:
                            done(futures[fut], r)
            finally:
                for cur in cursors:
                    cur.close()
        for bundle in sorted(conflicted + serial):  # alone now, in path order: nothing left to conflict with
            done(bundle, load(bundle, con, retry_conflict=False))
        if any(r.status == "loaded" for r in results.values()):
            con.execute("CHECKPOINT")
    finally:
        con.close()
    return [results[b] for b in bundles if b in results]


_CONFLICT = LoadResult(Path(), None, None, "conflict")  # sentinel: a write-write conflict, load again alone


def _manifest_sweep(bundle: Path) -> tuple[str | None, str | None]:
    """(sweep_id, sha256 of the sweep file) of a bundle from its manifest, cheaply (no hashing); Nones when
    unreadable (the load itself then reports the bundle as failed)."""
    try:
        m = json.loads((Path(bundle) / "manifest.json").read_text())
        return m.get("sweep_id"), (m.get("files", {}).get("sweep") or {}).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None, None
