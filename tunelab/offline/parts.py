"""Archives in parts: split a stream into parts of at most N MiB with sha256s, join and verify them, unpack.
Both the packing (``pack``) and the installing (``install``) side use these.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO


from tunelab.offline.manifest import (
    BundleManifest,
    DEFAULT_PART_SIZE_MIB,
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


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def bundle_dir_of(path: Path) -> Path:
    """The bundle folder that ``path`` names: ``path`` itself, or the folder of a ``.../manifest.json`` path
    (which need not exist: after an interrupted re-split the folder is absent). Used by :func:`resplit_bundle`
    and the ``resplit`` command, so both take the same arguments."""
    path = Path(path)
    return path.parent if path.name == "manifest.json" and not path.is_dir() else path


@contextlib.contextmanager
def _resplit_lock(bundle_dir: Path):
    """Hold ``<parent>/.<bundle>.resplit.lock`` (flock, exclusive, non-blocking) for the ``with`` body; the
    holder's pid is written into it. Raises OfflineBundleError at once if another process holds it.

    The lock file is left in place afterwards: removing it would let a third run lock a new file of the same
    name while a second still waits on (or holds) the unlinked one, i.e. two re-splits at once again.
    """
    lock_path = bundle_dir.parent / f".{bundle_dir.name}.resplit.lock"
    try:
        fh = open(lock_path, "a+")  # "a+", not "w": truncating before holding the lock would erase the holder's pid
    except OSError as e:
        raise OfflineBundleError(f"cannot open the re-split lock file {lock_path}: {e}") from e
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            pid = fh.read().strip()
            raise OfflineBundleError(
                f"another resplit of {bundle_dir} is running{f' (pid {pid})' if pid.isdigit() else ''}; "
                f"wait for it to end (lock file {lock_path}). Nothing was changed") from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def resplit_bundle(bundle_dir: Path, part_size_mib: int = DEFAULT_PART_SIZE_MIB, *,
                   part_size_bytes: int | None = None) -> BundleManifest:
    """Re-split an existing bundle folder into parts of a new size, without rebuilding it.

    Args:
        bundle_dir: a bundle folder as written by ``bundle-runtime`` / ``bundle-orchestrator``:
            ``manifest.json`` and the parts ``<archive_name>.partNN`` directly inside it; or the path of
            that ``manifest.json`` (its folder is meant).
        part_size_mib: largest new part, MiB (1..4096, like the bundlers).
        part_size_bytes: largest new part in bytes (>= 1); overrides ``part_size_mib`` (for tests).
    Returns:
        the rewritten manifest (also saved as ``bundle_dir/manifest.json``): only ``parts`` differs;
        ``archive_sha256`` / ``archive_bytes`` stay the same because the joined bytes are the same.
    Raises:
        OfflineBundleError: no or invalid ``manifest.json``; ``bundle_dir`` is missing (the message
            names the work folder an interrupted earlier re-split left behind, if any); another re-split of
            the same bundle is running (nothing is touched then).
        PartChecksumError: a listed part is missing from ``bundle_dir``, or has the wrong size or sha256,
            or the joined archive's sha256 differs; ``.part`` names it. The bundle is then left unchanged.
        ValueError: a part size out of range.

    The archive is joined (every part and the whole checked by :func:`join_parts`) into a work folder
    ``.<bundle>.resplit-*`` next to ``bundle_dir``, split with :func:`split_file`, and the new bundle
    folder (new parts, new manifest, hard links to the folder's other files such as ``build.log``;
    part files not in the new list are left out) replaces ``bundle_dir`` by two renames.
    Needs free space for about twice the archive on ``bundle_dir``'s file system while it runs.
    The whole run holds an exclusive lock ``.<bundle>.resplit.lock`` next to ``bundle_dir``; a second run on
    the same bundle meanwhile raises at once.
    """
    bundle_dir = bundle_dir_of(Path(bundle_dir)).resolve()  # a symlinked folder: swap the real one, the link keeps pointing at it
    if part_size_bytes is None:
        if not 1 <= part_size_mib <= 4096:
            raise ValueError(f"part_size_mib={part_size_mib}: must be within 1..4096")
        part_size_bytes = part_size_mib * MIB
    elif part_size_bytes < 1:
        raise ValueError(f"part_size_bytes={part_size_bytes}: must be >= 1")
    parent = bundle_dir.parent
    prefix = f".{bundle_dir.name}.resplit-"
    if not parent.is_dir() or not (bundle_dir.is_dir() or any(parent.glob(prefix + "*"))):
        raise OfflineBundleError(f"bundle folder not found: {bundle_dir}")  # nothing to lock (nor a lock file to leave)
    # The lock is held before anything is looked at: while another run is between its two renames the bundle
    # folder is absent and its work folder holds both copies; without the lock, this run would tell the user to
    # move one back (or, with the folder back, delete that run's work folder as a "leftover" under its feet).
    with _resplit_lock(bundle_dir):
        return _resplit_locked(bundle_dir, prefix, part_size_bytes)


def _resplit_locked(bundle_dir: Path, prefix: str, part_size_bytes: int) -> BundleManifest:
    """:func:`resplit_bundle`'s work, called with the bundle's re-split lock held."""
    parent = bundle_dir.parent
    leftovers = sorted(parent.glob(prefix + "*"))
    if not bundle_dir.is_dir():
        hint = (f"; an interrupted re-split left {', '.join(map(str, leftovers))}: move its 'new' (or 'old') "
                f"folder back to {bundle_dir}") if leftovers else ""
        raise OfflineBundleError(f"bundle folder not found: {bundle_dir}{hint}")
    m = BundleManifest.load(bundle_dir / "manifest.json")
    # With bundle_dir present, work folders of an earlier interrupted run hold only redundant copies. Only
    # removed here, with the lock held: then no other re-split is running, so none of them is a live run's
    # work folder (removing one of those would break that run or, between its renames, lose the bundle).
    for old_work in leftovers:
        shutil.rmtree(old_work, ignore_errors=True)
    for p in m.parts:  # only the folder itself: join_parts would also search subfolders (e.g. a work folder)
        if not (bundle_dir / p.name).is_file():
            raise PartChecksumError(p.name, f"bundle {bundle_dir}: part {p.name} listed in manifest.json is missing; "
                                    "copy it back from where the bundle was built (or rebuild the bundle), "
                                    "then re-split. Nothing was changed")
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        joined = join_parts(m, [bundle_dir], work / "joined" / m.archive_name)
        new_dir = work / "new"
        parts, sha, total = split_file(joined, new_dir, part_size_bytes)
        joined.unlink()
        if sha != m.archive_sha256 or total != m.archive_bytes:
            raise OfflineBundleError(f"re-split of {bundle_dir}: split archive sha256 {sha} / {total} bytes != manifest "
                                     f"{m.archive_sha256} / {m.archive_bytes} bytes (archive_bytes in manifest.json wrong?)")
        new_m = m.model_copy(update={"parts": parts})
        new_m.save(new_dir / "manifest.json")
        # Everything else in the folder comes along (hard links, so no copy of large files); old parts do not.
        skip = {"manifest.json"} | {p.name for p in m.parts}
        for entry in bundle_dir.iterdir():
            if entry.name in skip or entry.name.startswith(f"{m.archive_name}.part"):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.copytree(entry, new_dir / entry.name, symlinks=True, copy_function=_link_or_copy)
            elif entry.is_symlink():
                os.symlink(os.readlink(entry), new_dir / entry.name)
            else:
                _link_or_copy(str(entry), str(new_dir / entry.name))
        shutil.copymode(bundle_dir, new_dir)
        # Why a folder swap and not moving parts in one by one: the new parts reuse the old names
        # (<archive>.part00, ...), so while files were being moved bundle_dir would hold a manifest and
        # parts from different splits (the host would reject them as corrupt). Here bundle_dir is always
        # either the complete old bundle or the complete new one; if the process dies between the two renames,
        # bundle_dir is absent and both complete copies are in the work folder (work/old, work/new), which a
        # later call names.
        os.rename(bundle_dir, work / "old")
        os.rename(new_dir, bundle_dir)
    finally:
        if bundle_dir.is_dir():
            shutil.rmtree(work, ignore_errors=True)
    return new_m


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
