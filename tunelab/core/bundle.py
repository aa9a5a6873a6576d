"""Result bundles: one trial's results as files on disk, written before anything touches DuckDB.

A bundle is the folder ``<results_dir>/<sweep_id>/<trial_id with '/' -> '__'>/`` holding one
Parquet file per table (``trial``, ``sweep``, ``boot_phases``, ``measurements``, ``requests``,
``server_metrics``, ``gpu_samples``, ``quality_checks``; missing tables are simply absent) and
``manifest.json``, which lists every file with its row count and sha256.

Why: the warehouse is a single-writer DuckDB file that may be busy, on another host, or
broken; a trial must never lose its numbers because of that. Bundles are the durable record;
``warehouse.loader`` ingests them later, idempotently, and never deletes them.

Atomicity: a new bundle is written into a hidden temporary folder (``.tmp-*``), manifest last,
and renamed into place in one step, so a reader never sees a half-written bundle. An update
(``update_bundle_table``) writes the new table under a new file name and then replaces the
manifest with ``os.replace``; the manifest is the commit point and always names complete
files whose hashes match.

Columns and their types come from the table's record (``tunelab/core/records.py``): every Parquet file is
written with the record's Arrow types (``records.arrow_schema``), never with types inferred from the values.
Seconds in ``*_s``, tokens as integers. In ``sweep``/``trial`` dicts, dict/list values (the JSON columns
``engine_args``, ``env``, ``env_not_applied``, ``effective_config``) are stored as JSON text.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tunelab.core import records

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_TABLES",
    "MANIFEST_NAME",
    "TABLE_TO_WAREHOUSE",
    "BundleError",
    "bundle_dir_for",
    "list_bundles",
    "read_bundle",
    "read_manifest",
    "update_bundle_table",
    "write_sweep_row",
    "verify_bundle",
    "write_bundle",
]

BUNDLE_FORMAT = 1
MANIFEST_NAME = "manifest.json"
#: Bundle tables in order, one per record of ``tunelab/core/records.py`` (``trial``, ``sweep``, ``boot_phases``,
#: ``measurements``, ``requests``, ``server_metrics``, ``gpu_samples``, ``quality_checks``).
BUNDLE_TABLES = tuple(records.RECORDS)
# bundle table name -> warehouse table name
TABLE_TO_WAREHOUSE = {name: rec.TABLE for name, rec in records.RECORDS.items()}
_TRIAL_KEYED = tuple(t for t in BUNDLE_TABLES if t != "sweep")


class BundleError(ValueError):
    """A bundle is missing, malformed or corrupted; the message names the folder or file and the fix."""


def _safe_name(value: str, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise BundleError(f"{field} must be a non-empty string, got {value!r}")
    name = value.replace("/", "__")
    if name in (".", "..") or name.startswith(".") or "\\" in name or "\x00" in name:
        raise BundleError(f"{field} {value!r} cannot be used as a folder name (no leading '.', no '\\')")
    return name


def bundle_dir_for(results_dir: Path, sweep_id: str, trial_id: str) -> Path:
    """The folder of the bundle of ``trial_id``: ``results_dir/<sweep_id>/<trial_id, '/' -> '__'>``."""
    return Path(results_dir) / _safe_name(sweep_id, "sweep_id") / _safe_name(trial_id, "trial_id")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _row_frame(row: dict, field: str) -> pd.DataFrame:
    if not isinstance(row, dict):
        raise BundleError(f"{field} must be a dict of the {TABLE_TO_WAREHOUSE[field]} columns, got {type(row).__name__}")
    return pd.DataFrame([{k: _jsonable(v) for k, v in row.items()}])


def _arrow_table(df: pd.DataFrame, name: str) -> pa.Table:
    """``df`` as an Arrow table whose columns have the types of the table's record (``records.arrow_schema``),
    so a column's type never depends on its values (an all-None column, ints read back as floats). Columns
    the record does not have keep the type pyarrow infers; the loader refuses them by name."""
    record = records.RECORDS[name]
    arrays, fields = [], []
    for col in df.columns:
        series = df[col]
        if col in record.model_fields:
            field = records.arrow_schema(record, [col]).field(0)
            try:
                arr = pa.array(series, type=field.type, from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
                raise BundleError(
                    f"table {name!r}: column {col!r} cannot be stored as {field.type} "
                    f"(tunelab/core/records.py {record.__name__}): {exc}"
                ) from exc
        else:
            arr = pa.array(series, from_pandas=True)
            field = pa.field(str(col), arr.type)
        arrays.append(arr)
        fields.append(field)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    # The table name is the file name's first part: <name>.parquet, or <name>.<generation>.parquet.
    pq.write_table(_arrow_table(df.reset_index(drop=True), path.name.split(".")[0]), path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _file_entry(path: Path, rows: int) -> dict:
    return {"file": path.name, "rows": int(rows), "bytes": path.stat().st_size, "sha256": _sha256_file(path)}


def _write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / f".{MANIFEST_NAME}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST_NAME)
    _fsync_dir(folder)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def _check_trial_ids(name: str, df: pd.DataFrame, trial_id: str) -> pd.DataFrame:
    if name not in _TRIAL_KEYED:
        return df
    if "trial_id" not in df.columns:
        df = df.copy()
        df.insert(0, "trial_id", trial_id)
        return df
    bad = df["trial_id"].isna() | (df["trial_id"] != trial_id)
    if bool(bad.any()):
        others = sorted(map(str, df.loc[bad, "trial_id"].unique()))[:3]
        raise BundleError(
            f"table {name!r}: {int(bad.sum())} rows have trial_id {others} instead of {trial_id!r}; "
            "a bundle holds exactly one trial"
        )
    return df


_KEYS = {
    "requests": ("workload", "load_kind", "load_value", "repeat", "request_index"),
    "measurements": ("workload", "load_kind", "load_value", "repeat"),
    "boot_phases": ("phase",),
    "window_diagnoses": ("workload", "load_kind", "load_value", "repeat", "bottleneck"),
    "sla_searches": ("workload",),
}


def _check_unique(name: str, df: pd.DataFrame) -> None:
    keys = [k for k in _KEYS.get(name, ()) if k in df.columns]
    if keys and len(keys) == len(_KEYS[name]) and bool(df.duplicated(subset=keys).any()):
        dup = df[df.duplicated(subset=keys, keep=False)][keys].head(2).to_dict("records")
        raise BundleError(f"table {name!r}: duplicate rows for key {keys}, e.g. {dup}; each key must occur once")


def write_bundle(results_dir: Path, sweep: dict | records.Sweep, trial: dict | records.TrialRow,
                 tables: dict[str, pd.DataFrame]) -> Path:
    """Write one trial's results as a bundle, atomically.

    Args:
        results_dir: root of all bundles (created if missing).
        sweep: the ``sweeps`` row as a ``records.Sweep`` or a dict (needs ``sweep_id``).
        trial: the ``trials`` row as a ``records.TrialRow`` or a dict (needs ``trial_id``, and ``sweep_id`` equal
            to the sweep's). A record is written with all its columns; a dict with the columns it has.
            JSON columns may be dicts/lists; they are stored as JSON text.
        tables: any of ``boot_phases``, ``measurements``, ``requests``, ``server_metrics``,
            ``gpu_samples``, ``quality_checks`` as DataFrames with warehouse column names.
            ``trial_id`` may be omitted (it is filled in); if present it must equal the trial's.
            Empty or missing tables are allowed.

    Returns:
        The bundle folder ``results_dir/<sweep_id>/<trial_id with '/' replaced by '__'>``.
        An existing bundle of the same trial is replaced (the old one stays readable until
        the new one is complete).

    Raises:
        BundleError: on a missing id, mismatched ids, an unknown table name or a non-DataFrame.
    """
    # Records (tunelab/core/records.py) are written with every column, None where not set.
    sweep = sweep.model_dump() if isinstance(sweep, records.Record) else sweep
    trial = trial.model_dump() if isinstance(trial, records.Record) else trial
    sweep_id = sweep.get("sweep_id") if isinstance(sweep, dict) else None
    trial_id = trial.get("trial_id") if isinstance(trial, dict) else None
    final = bundle_dir_for(Path(results_dir), sweep_id, trial_id)
    if trial.get("sweep_id", sweep_id) != sweep_id:
        raise BundleError(f"trial.sweep_id {trial.get('sweep_id')!r} differs from sweep.sweep_id {sweep_id!r}")
    unknown = set(tables) - set(BUNDLE_TABLES) - {"trial", "sweep"}
    if unknown:
        raise BundleError(f"unknown bundle tables {sorted(unknown)}; allowed: {list(BUNDLE_TABLES)}")
    if "trial" in tables or "sweep" in tables:
        raise BundleError("pass the trial and sweep rows as the `trial` and `sweep` dicts, not in `tables`")
    trial = {**trial, "sweep_id": sweep_id}

    frames: dict[str, pd.DataFrame] = {"sweep": _row_frame(sweep, "sweep"), "trial": _row_frame(trial, "trial")}
    for name in BUNDLE_TABLES[2:]:
        df = tables.get(name)
        if df is None:
            continue
        if not isinstance(df, pd.DataFrame):
            raise BundleError(f"table {name!r} must be a pandas DataFrame, got {type(df).__name__}")
        if len(df.columns) == 0:
            continue
        frames[name] = _check_trial_ids(name, df, trial_id)
        _check_unique(name, frames[name])

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = {}
        for name, df in frames.items():
            path = tmp / f"{name}.parquet"
            _write_parquet(df, path)
            files[name] = _file_entry(path, len(df))
        manifest = {
            "bundle_format": BUNDLE_FORMAT,
            "sweep_id": sweep_id,
            "trial_id": trial_id,
            "created_at": _now(),
            "updated_at": None,
            "generation": 0,
            "files": files,
        }
        _write_manifest(tmp, manifest)  # last
        _fsync_dir(tmp)
        if final.exists():
            old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_manifest(path: Path) -> dict:
    """The parsed ``manifest.json`` of the bundle folder ``path``.

    Raises:
        BundleError: no manifest (the bundle was never completed: write it again), unreadable
            JSON, or an unsupported ``bundle_format``.
    """
    mpath = Path(path) / MANIFEST_NAME
    if not mpath.is_file():
        raise BundleError(
            f"bundle {path} has no {MANIFEST_NAME}: it is incomplete (interrupted write?) and cannot be "
            "loaded; re-run the trial or write the bundle again"
        )
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BundleError(f"bundle {path}: {MANIFEST_NAME} is not valid JSON ({exc})") from exc
    fmt = manifest.get("bundle_format")
    if fmt != BUNDLE_FORMAT:
        raise BundleError(
            f"bundle {path}: bundle_format {fmt!r} is not supported (this tunelab reads format {BUNDLE_FORMAT})"
        )
    for key in ("sweep_id", "trial_id", "files"):
        if key not in manifest:
            raise BundleError(f"bundle {path}: {MANIFEST_NAME} lacks {key!r}")
    return manifest


def verify_bundle(path: Path) -> dict:
    """Check that every file the manifest names exists and has the recorded sha256.

    Returns:
        The manifest (as ``read_manifest``), plus ``"manifest_sha256"``: the hash of the
        manifest file's bytes, which identifies this exact bundle content.

    Raises:
        BundleError: naming the first missing or mismatching file and both hashes.
    """
    path = Path(path)
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        fpath = path / entry["file"]
        if not fpath.is_file():
            raise BundleError(f"bundle {path}: file {entry['file']} (table {name}) listed in the manifest is missing")
        actual = _sha256_file(fpath)
        if actual != entry["sha256"]:
            raise BundleError(
                f"bundle {path}: file {entry['file']} (table {name}) is corrupted: sha256 {actual} "
                f"does not match the manifest's {entry['sha256']}; restore it or re-run the trial"
            )
    manifest["manifest_sha256"] = _sha256_file(path / MANIFEST_NAME)
    return manifest


def read_bundle(path: Path, *, verify: bool = True) -> dict[str, pd.DataFrame]:
    """Read a bundle's tables.

    Args:
        path: the bundle folder.
        verify: check file hashes first (``verify_bundle``).

    Returns:
        ``{table name: DataFrame}`` for the tables present (``trial`` and ``sweep`` have one
        row; JSON columns are JSON text).

    Raises:
        BundleError: see ``read_manifest`` / ``verify_bundle``.
    """
    path = Path(path)
    manifest = verify_bundle(path) if verify else read_manifest(path)
    return {name: pd.read_parquet(path / entry["file"]) for name, entry in manifest["files"].items()}


def update_bundle_table(path: Path, name: str, df: pd.DataFrame) -> Path:
    """Replace (or add) one table of an existing bundle, atomically.

    Used after validation to add ``quality_checks`` and to set ``trial.quality_verdict``
    (pass the whole one-row ``trial`` frame, e.g. from ``read_bundle``).

    The new table is written as ``<name>.<generation>.parquet``, then the manifest is replaced
    in one ``os.replace``; the previous file is removed afterwards. A crash at any point leaves
    either the old or the new bundle, both complete.

    Returns:
        The bundle folder.

    Raises:
        BundleError: unknown table, bad bundle, or rows of another trial.
    """
    path = Path(path)
    if name not in BUNDLE_TABLES:
        raise BundleError(f"unknown bundle table {name!r}; allowed: {list(BUNDLE_TABLES)}")
    if not isinstance(df, pd.DataFrame):
        raise BundleError(f"table {name!r} must be a pandas DataFrame, got {type(df).__name__}")
    manifest = verify_bundle(path)
    manifest.pop("manifest_sha256", None)
    trial_id = manifest["trial_id"]
    if name in ("trial", "sweep"):
        if len(df) != 1:
            raise BundleError(f"table {name!r} must have exactly one row, got {len(df)}")
        df = pd.DataFrame([{k: _jsonable(v) for k, v in df.iloc[0].to_dict().items()}])
        key = "trial_id" if name == "trial" else "sweep_id"
        if df.at[0, key] != manifest[key]:
            raise BundleError(f"table {name!r}: {key} {df.at[0, key]!r} differs from the bundle's {manifest[key]!r}")
    else:
        df = _check_trial_ids(name, df, trial_id)
    generation = int(manifest.get("generation", 0)) + 1
    new_file = path / f"{name}.{generation}.parquet"
    _write_parquet(df, new_file)
    old_entry = manifest["files"].get(name)
    manifest["files"][name] = _file_entry(new_file, len(df))
    manifest["generation"] = generation
    manifest["updated_at"] = _now()
    _write_manifest(path, manifest)
    if old_entry and old_entry["file"] != new_file.name:
        try:
            (path / old_entry["file"]).unlink()
        except FileNotFoundError:
            pass
    return path


def write_sweep_row(sweep: records.Sweep, bundles: list[Path | None]) -> None:
    """Write the sweep's record into the ``sweep`` table of every bundle of the sweep (None: a trial without one).

    The loader upserts the ``sweeps`` row from the bundles, so what a sweep learns after its trials (its end, an
    A/B's outcome, a search's summary) reaches the warehouse only through this.

    Raises:
        BundleError: see :func:`update_bundle_table`.
    """
    row = records.frame(records.Sweep, pd.DataFrame([records.to_row(records.Sweep, sweep)]))
    for b in bundles:
        if b is not None:
            update_bundle_table(b, "sweep", row)


def list_bundles(results_dir: Path) -> list[Path]:
    """Every complete bundle (a folder with ``manifest.json``) under ``results_dir``, sorted by path.

    Hidden folders (temporary writes in progress, replaced bundles) are skipped. A missing
    ``results_dir`` gives an empty list.
    """
    root = Path(results_dir)
    if not root.is_dir():
        return []
    out = []
    for sweep_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for trial_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if (trial_dir / MANIFEST_NAME).is_file():
                out.append(trial_dir)
    return out
