"""Archives in parts: split a stream into parts of at most N MiB with sha256s, join and verify them, unpack.
Both the packing (``pack``) and the installing (``install``) side use these.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO


from tunelab.offline.manifest import (
    BundleManifest,
    MIB,
    OfflineBundleError,
    PartChecksumError,
    PartInfo,
)


# --------------------------------------------------------------------------- parts


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def split_stream(stream: BinaryIO, out_dir: Path, archive_name: str, part_size_bytes: int) -> tuple[list[PartInfo], str, int]:
    """Copy ``stream`` into ``out_dir/archive_name.partNN`` files of at most ``part_size_bytes``.

    Returns (parts, sha256 of the whole stream, total bytes). An empty stream gives no parts.
    Raises ValueError if ``part_size_bytes`` < 1.
    """
    if part_size_bytes < 1:
        raise ValueError(f"part_size_bytes={part_size_bytes}: must be >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    total_h = hashlib.sha256()
    parts: list[PartInfo] = []
    total = 0
    buf = b""
    idx = 0
    eof = False
    while not eof:
        name = f"{archive_name}.part{idx:02d}"
        h = hashlib.sha256()
        written = 0
        f = None
        while written < part_size_bytes:
            if not buf:
                buf = stream.read(min(MIB, part_size_bytes))
                if not buf:
                    eof = True
                    break
            take = buf[: part_size_bytes - written]
            buf = buf[len(take):]
            if f is None:
                f = open(out_dir / name, "wb")
            f.write(take)
            h.update(take)
            total_h.update(take)
            written += len(take)
        if f is not None:
            f.close()
            parts.append(PartInfo(name=name, size_bytes=written, sha256=h.hexdigest()))
            total += written
            idx += 1
    return parts, total_h.hexdigest(), total


def split_file(path: Path, out_dir: Path, part_size_bytes: int) -> tuple[list[PartInfo], str, int]:
    """:func:`split_stream` over the file at ``path``; parts are named after the file."""
    with open(path, "rb") as f:
        return split_stream(f, out_dir, Path(path).name, part_size_bytes)


def _find_part(name: str, dirs: Sequence[Path]) -> Path | None:
    for d in dirs:
        for cand in (Path(d) / name, *Path(d).glob(f"**/{name}")):
            if cand.is_file():
                return cand
    return None


def join_parts(manifest: BundleManifest, parts_dirs: Sequence[Path], dest_file: Path) -> Path:
    """Verify every part's size and sha256, concatenate them into ``dest_file``, verify the whole.

    Parts are looked up by name in each of ``parts_dirs`` (and below them). Raises
    :class:`PartChecksumError` naming the first missing or corrupted part, or the archive if
    the joined sha256 differs. Returns ``dest_file``.
    """
    dirs = [Path(d) for d in parts_dirs]
    found: list[Path] = []
    missing = []
    for p in manifest.parts:
        f = _find_part(p.name, dirs)
        if f is None:
            missing.append(p.name)
        found.append(f)  # type: ignore[arg-type]
    if missing:
        raise PartChecksumError(missing[0], f"bundle {manifest.name}: {len(missing)} of {len(manifest.parts)} "
                                f"parts missing, first {missing[0]} (looked in {', '.join(map(str, dirs))}); "
                                "copy all parts listed in manifest.json there")
    for p, f in zip(manifest.parts, found):
        size = f.stat().st_size
        if size != p.size_bytes:
            raise PartChecksumError(p.name, f"part {p.name} ({f}) has {size} bytes, manifest says {p.size_bytes}: "
                                    "the copy is truncated or from another build; copy it again")
        got = _hash_file(f)
        if got != p.sha256:
            raise PartChecksumError(p.name, f"part {p.name} ({f}) sha256 {got} != manifest {p.sha256}: "
                                    "corrupted or from another build; copy it again")
    h = hashlib.sha256()
    dest_file = Path(dest_file)
    dest_file.parent.mkdir(parents=True, exist_ok=True)
    with open(dest_file, "wb") as out:
        for f in found:
            with open(f, "rb") as src:
                for chunk in iter(lambda: src.read(MIB), b""):
                    out.write(chunk)
                    h.update(chunk)
    if h.hexdigest() != manifest.archive_sha256:
        raise PartChecksumError(manifest.archive_name, f"joined archive sha256 {h.hexdigest()} != manifest "
                                f"{manifest.archive_sha256}: parts are from different builds")
    return dest_file


def _unpack(archive: Path, dest: Path) -> None:
    """Unpack a .tar.xz into ``dest`` (xz binary with 2 threads if present, else Python's lzma)."""
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("xz") and shutil.which("tar"):
        xz = subprocess.Popen(["xz", "-dc", "-T2", str(archive)], stdout=subprocess.PIPE)
        tar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=xz.stdout)
        xz.stdout.close()  # type: ignore[union-attr]
        if xz.wait() != 0 or tar.returncode != 0:
            raise OfflineBundleError(f"unpacking {archive} into {dest} failed (xz rc={xz.returncode}, tar rc={tar.returncode})")
        return
    with tarfile.open(archive, "r:xz") as t:
        if sys.version_info >= (3, 12):
            t.extractall(dest, filter="data")
        else:  # pragma: no cover - 3.11 without the filter argument backport
            t.extractall(dest)
