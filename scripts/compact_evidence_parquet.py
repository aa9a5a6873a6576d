"""Rewrite committed evidence Parquet as brotli with Parquet's version-2 encodings, losing nothing.

Why: every GPU call carries the repository with one bundle part under a 64 MiB limit
(tests/test_offline.py::test_default_part_plus_repository_fits_one_64_mib_transfer), and the evidence folders are
most of the repository. Float columns (request timestamps, chunk offsets) are most of their bytes; the
version-2 encodings (byte-stream-split floats, delta-coded integers) shrink them about 40 % more than brotli
alone. New folders get this form from ``tunelab export --compression brotli``; this script brings older ones to it.

A file is replaced only when DuckDB's rewrite is smaller and pyarrow reads it back equal to the original
(``pa.Table.equals``: same schema, types and values); otherwise it is left as it is and the line says why.

Usage: ``python scripts/compact_evidence_parquet.py [FOLDER ...]`` (default: ``evidence/``). Prints one line per
file changed or kept, then the bytes before and after.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent


def compact(path: Path, tmpdir: Path) -> tuple[int, int, str]:
    """Rewrite one Parquet file in place if that is smaller and equal. Returns (bytes before, after, what happened)."""
    before = path.stat().st_size
    out = tmpdir / path.name
    con = duckdb.connect()
    try:
        con.execute("COPY (SELECT * FROM read_parquet(?)) TO ? (FORMAT parquet, COMPRESSION brotli, "
                    "PARQUET_VERSION V2)", [str(path), str(out)])
    finally:
        con.close()
    after = out.stat().st_size
    if after >= before:
        return before, before, "kept (not smaller)"
    if not pq.read_table(out).equals(pq.read_table(path)):
        return before, before, "kept (DuckDB's rewrite reads back different: types or values)"
    shutil.move(out, path)  # not Path.replace: the temporary folder may be on another file system
    return before, after, "rewritten"


def main(folders: list[str]) -> int:
    roots = [Path(f) for f in folders] or [ROOT / "evidence"]
    total_before = total_after = 0
    with tempfile.TemporaryDirectory() as tmp:
        for root in roots:
            for path in sorted(root.rglob("*.parquet")):
                before, after, what = compact(path, Path(tmp))
                total_before, total_after = total_before + before, total_after + after
                print(f"{path}: {before} -> {after} bytes, {what}")
    print(f"total {total_before} -> {total_after} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
