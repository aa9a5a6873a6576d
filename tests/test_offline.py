"""Tests for tunelab.offline: manifests, part splitting/joining with sha256 checks, requirement
filtering and closure walking, pruning, import scanning, and a full install of a synthetic bundle
with this interpreter. Nothing is downloaded."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

from tunelab import offline as off
from tunelab.offline.manifest import MIB
from tunelab.offline import (
    OfflineBundleError,
    BundleManifest,
    PartChecksumError,
    PartInfo,
    install_bundle,
    join_parts,
    split_file,
    split_requirements,
    target_marker_environment,
)


def _tarball(tmp_path: Path, files: dict[str, bytes], top: str = "site") -> Path:
    """A real .tar.xz with ``top/<name>`` members."""
    out = tmp_path / "bundle.tar.xz"
    with tarfile.open(out, "w:xz") as t:
        for name, data in files.items():
            ti = tarfile.TarInfo(f"{top}/{name}")
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return out


def _manifest_for(archive: Path, parts: list[PartInfo], sha: str, total: int, **kw) -> BundleManifest:
    base = dict(kind="orchestrator", name="synthetic", python_version="3.12", platform="manylinux_2_31_x86_64",
                archive_name=archive.name, archive_sha256=sha, archive_bytes=total, unpacked_bytes=0,
                parts=parts, wheels=["fakepkg==1.0"], import_check=["fakepkg"])
    base.update(kw)
    return BundleManifest(**base)


def _split(tmp_path: Path, part_size: int = 700):
    payload = {"fakepkg/__init__.py": b"__version__ = '1.0'\nVALUE = 42\n",
               "fakepkg/blob.bin": os.urandom(3000)}  # random: incompressible, so several parts
    arc = _tarball(tmp_path, payload)
    parts_dir = tmp_path / "parts"
    parts, sha, total = split_file(arc, parts_dir, part_size)
    return arc, parts_dir, parts, sha, total


# ----------------------------------------------------------------------------- manifest


def test_manifest_round_trip(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    m = _manifest_for(arc, parts, sha, total, required_env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                      host_provided=[off.HostRequirement(name="torch", specifier="==2.11.0", required_by=["vllm"],
                                                         image_version="2.11.0", image_ok=True)])
    path = m.save(tmp_path / "manifest.json")
    assert BundleManifest.load(path) == m
    assert BundleManifest.load(tmp_path) == m  # folder form
    assert json.loads(path.read_text())["parts"][0]["name"] == "bundle.tar.xz.part00"


def test_manifest_load_errors_name_the_file(tmp_path):
    with pytest.raises(OfflineBundleError, match="manifest not found"):
        BundleManifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text('{"kind": "nonsense"}')
    with pytest.raises(OfflineBundleError, match="not a valid bundle manifest"):
        BundleManifest.load(tmp_path / "manifest.json")


# ----------------------------------------------------------------------------- parts


def test_split_sizes_and_join_roundtrip(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path, part_size=700)
    data = arc.read_bytes()
    assert total == len(data)
    assert len(parts) == -(-len(data) // 700)
    assert all(p.size_bytes == 700 for p in parts[:-1]) and 0 < parts[-1].size_bytes <= 700
    m = _manifest_for(arc, parts, sha, total)
    joined = join_parts(m, [parts_dir], tmp_path / "joined.tar.xz")
    assert joined.read_bytes() == data


def test_split_exact_multiple_has_no_empty_part(tmp_path):
    src = tmp_path / "x.bin"
    src.write_bytes(b"a" * 2000)
    parts, _, total = split_file(src, tmp_path / "p", 1000)
    assert [p.size_bytes for p in parts] == [1000, 1000] and total == 2000


def test_corrupted_part_is_named(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    m = _manifest_for(arc, parts, sha, total)
    victim = parts_dir / parts[1].name
    raw = bytearray(victim.read_bytes())
    raw[10] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(PartChecksumError) as ei:
        join_parts(m, [parts_dir], tmp_path / "j.tar.xz")
    assert ei.value.part == parts[1].name
    assert parts[1].name in str(ei.value) and "sha256" in str(ei.value)


def test_missing_and_truncated_parts_are_named(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    m = _manifest_for(arc, parts, sha, total)
    last = parts_dir / parts[-1].name
    last.write_bytes(last.read_bytes()[:-1])
    with pytest.raises(PartChecksumError, match="bytes, manifest says") as ei:
        join_parts(m, [parts_dir], tmp_path / "j.tar.xz")
    assert ei.value.part == parts[-1].name
    last.unlink()
    with pytest.raises(PartChecksumError, match="missing") as ei:
        join_parts(m, [parts_dir], tmp_path / "j.tar.xz")
    assert ei.value.part == parts[-1].name


def test_parts_from_different_builds_fail_on_archive_hash(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    m = _manifest_for(arc, parts, "0" * 64, total)
    with pytest.raises(PartChecksumError, match="joined archive sha256") as ei:
        join_parts(m, [parts_dir], tmp_path / "j.tar.xz")
    assert ei.value.part == arc.name


def test_parts_found_in_subfolders_of_several_dirs(tmp_path):
    """On the GPU host parts arrive in separate per-call folders."""
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    a, b = tmp_path / "call1" / "x", tmp_path / "call2"
    a.mkdir(parents=True), b.mkdir()
    for i, p in enumerate(parts):
        (parts_dir / p.name).rename((a if i % 2 else b) / p.name)
    m = _manifest_for(arc, parts, sha, total)
    assert join_parts(m, [tmp_path / "call1", b], tmp_path / "j.tar.xz").read_bytes() == arc.read_bytes()


# ----------------------------------------------------------------------------- re-split


def _bundle_dir(tmp_path: Path, part_size: int = 700) -> tuple[Path, Path, BundleManifest]:
    """A bundle folder as the bundlers leave it: manifest.json, the parts and a build.log."""
    arc, parts_dir, parts, sha, total = _split(tmp_path, part_size)
    m = _manifest_for(arc, parts, sha, total)
    m.save(parts_dir / "manifest.json")
    (parts_dir / "build.log").write_text("built\n")
    return arc, parts_dir, m


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def test_resplit_roundtrip_new_sizes_same_archive_old_parts_gone(tmp_path):
    arc, bdir, old = _bundle_dir(tmp_path, part_size=700)
    assert len(old.parts) >= 5
    new = off.resplit_bundle(bdir, part_size_bytes=1500)
    assert new == BundleManifest.load(bdir)  # saved
    assert len(new.parts) == -(-arc.stat().st_size // 1500) < len(old.parts)
    assert all(p.size_bytes <= 1500 for p in new.parts) and all(p.size_bytes == 1500 for p in new.parts[:-1])
    assert [p.name for p in new.parts] == [f"{arc.name}.part{i:02d}" for i in range(len(new.parts))]
    assert new.model_dump(exclude={"parts"}) == old.model_dump(exclude={"parts"})  # archive sha256 etc. unchanged
    joined = join_parts(new, [bdir], tmp_path / "j" / arc.name)
    assert joined.read_bytes() == arc.read_bytes()
    on_disk = sorted(f.name for f in bdir.iterdir())
    assert on_disk == sorted([p.name for p in new.parts] + ["manifest.json", "build.log"])  # surplus parts gone
    assert (bdir / "build.log").read_text() == "built\n"
    assert not list(tmp_path.glob(".parts.resplit-*"))  # no work folder left
    # and back to smaller parts: more parts than before, still the same bytes
    again = off.resplit_bundle(bdir, part_size_bytes=400)
    assert len(again.parts) == -(-arc.stat().st_size // 400) and max(p.size_bytes for p in again.parts) == 400
    assert join_parts(again, [bdir], tmp_path / "k" / arc.name).read_bytes() == arc.read_bytes()


def test_resplit_corrupted_part_refused_and_bundle_unchanged(tmp_path):
    arc, bdir, m = _bundle_dir(tmp_path)
    victim = bdir / m.parts[2].name
    raw = bytearray(victim.read_bytes())
    raw[5] ^= 0x01
    victim.write_bytes(bytes(raw))
    before = _snapshot(bdir)
    with pytest.raises(PartChecksumError) as ei:
        off.resplit_bundle(bdir, part_size_bytes=1500)
    assert ei.value.part == m.parts[2].name and m.parts[2].name in str(ei.value) and "sha256" in str(ei.value)
    assert _snapshot(bdir) == before  # same files, same manifest bytes
    # work folder removed; the lock file stays (see parts._resplit_lock)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [".parts.resplit.lock"]


def test_resplit_missing_part_refused_with_its_name(tmp_path):
    arc, bdir, m = _bundle_dir(tmp_path)
    (bdir / m.parts[1].name).unlink()
    before = _snapshot(bdir)
    with pytest.raises(PartChecksumError, match="missing") as ei:
        off.resplit_bundle(bdir, part_size_bytes=1500)
    assert ei.value.part == m.parts[1].name and m.parts[1].name in str(ei.value)
    assert _snapshot(bdir) == before


def _run_cli(*args: str):
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "tunelab.offline", *args], capture_output=True, text=True, env=env)


def _interrupt_between_renames(bdir: Path, monkeypatch) -> None:
    """Leave the state of a re-split killed between its two renames: no bundle folder, work/old and work/new."""
    real_rename, calls = os.rename, []

    def rename(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        off.resplit_bundle(bdir, part_size_bytes=1500)
    monkeypatch.setattr(os, "rename", real_rename)
    assert not bdir.exists()


def test_resplit_interrupted_between_renames_is_reported_not_lost(tmp_path, monkeypatch):
    """If the process dies between the two renames, both complete copies stay in the work folder."""
    arc, bdir, m = _bundle_dir(tmp_path)
    _interrupt_between_renames(bdir, monkeypatch)
    (work,) = tmp_path.glob(".parts.resplit-*")
    assert BundleManifest.load(work / "old") == m
    assert join_parts(BundleManifest.load(work / "new"), [work / "new"], tmp_path / "j" / arc.name
                      ).read_bytes() == arc.read_bytes()
    with pytest.raises(OfflineBundleError, match="interrupted re-split left") as ei:
        off.resplit_bundle(bdir, part_size_bytes=1500)
    assert str(work) in str(ei.value)


def test_resplit_cli_exit_codes(tmp_path):
    arc, bdir, m = _bundle_dir(tmp_path)
    r = _run_cli("resplit", str(bdir), "--part-size-mib", "1")
    assert r.returncode == 0, r.stderr
    new = BundleManifest.load(bdir)
    assert len(new.parts) == 1 and new.parts[0].size_bytes == arc.stat().st_size  # a few KB fit one 1 MiB part
    assert f"{len(m.parts)} parts" in r.stdout and "-> 1 parts" in r.stdout
    assert join_parts(new, [bdir], tmp_path / "j" / arc.name).read_bytes() == arc.read_bytes()
    r = _run_cli("resplit", str(tmp_path / "no-such-bundle"))
    assert r.returncode == 2 and "no-such-bundle" in r.stderr
    (bdir / new.parts[0].name).write_bytes(b"x")
    r = _run_cli("resplit", str(bdir))
    assert r.returncode == 2 and new.parts[0].name in r.stderr and "copy it again" in r.stderr


def test_resplit_cli_prints_the_recovery_hint_of_an_interrupted_resplit(tmp_path, monkeypatch):
    arc, bdir, m = _bundle_dir(tmp_path)
    _interrupt_between_renames(bdir, monkeypatch)
    (work,) = tmp_path.glob(".parts.resplit-*")
    for arg in (bdir, bdir / "manifest.json"):
        r = _run_cli("resplit", str(arg), "--part-size-mib", "1")
        assert r.returncode == 2, r.stderr
        assert "interrupted re-split left" in r.stderr and str(work) in r.stderr and "move its 'new'" in r.stderr, r.stderr
        assert "manifest not found" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not bdir.exists() and BundleManifest.load(work / "old") == m  # both copies still there
    assert BundleManifest.load(work / "new").parts != m.parts


def test_resplit_accepts_the_manifest_json_path(tmp_path):
    arc, bdir, m = _bundle_dir(tmp_path)
    new = off.resplit_bundle(bdir / "manifest.json", part_size_bytes=1500)
    assert new == BundleManifest.load(bdir) and new.parts != m.parts
    assert join_parts(new, [bdir], tmp_path / "j" / arc.name).read_bytes() == arc.read_bytes()
    r = _run_cli("resplit", str(bdir / "manifest.json"), "--part-size-mib", "1")
    assert r.returncode == 0, r.stderr
    one = BundleManifest.load(bdir)
    assert len(one.parts) == 1 and f"{len(new.parts)} parts" in r.stdout and "-> 1 parts" in r.stdout, r.stdout
    assert f"manifest rewritten: {bdir / 'manifest.json'}" in r.stdout, r.stdout
    assert join_parts(one, [bdir], tmp_path / "k" / arc.name).read_bytes() == arc.read_bytes()
    assert sorted(f.name for f in bdir.iterdir()) == sorted([one.parts[0].name, "manifest.json", "build.log"])


def test_second_resplit_while_one_runs_is_refused_and_touches_nothing(tmp_path, monkeypatch):
    """A run paused after its join (work folder full) holds the lock: a second run refuses at once, naming the
    first one's pid, and neither deletes that work folder nor changes the bundle; the first then finishes."""
    import threading

    from tunelab.offline import parts as parts_mod

    arc, bdir, m = _bundle_dir(tmp_path)
    before = _snapshot(bdir)
    real_split, paused, go = parts_mod.split_file, threading.Event(), threading.Event()

    def split_file(*a, **kw):
        if not paused.is_set():  # only the first run pauses (a second one, if let through, must not hang)
            paused.set()
            assert go.wait(30)
        return real_split(*a, **kw)

    monkeypatch.setattr(parts_mod, "split_file", split_file)
    result: dict = {}

    def first():
        try:
            result["m"] = off.resplit_bundle(bdir, part_size_bytes=1500)
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            result["e"] = e

    t = threading.Thread(target=first)
    t.start()
    try:
        assert paused.wait(30)
        (work,) = tmp_path.glob(".parts.resplit-*")
        work_before = _snapshot(work)
        assert work_before  # the joined archive is in it
        with pytest.raises(OfflineBundleError, match="another resplit of .* is running") as ei:
            off.resplit_bundle(bdir, part_size_bytes=400)
        assert f"pid {os.getpid()}" in str(ei.value) and "wait for it to end" in str(ei.value)
        assert _snapshot(bdir) == before and work.is_dir() and _snapshot(work) == work_before
    finally:
        go.set()
        t.join(30)
    assert "e" not in result, result.get("e")
    assert result["m"] == BundleManifest.load(bdir) and max(p.size_bytes for p in result["m"].parts) == 1500
    assert not list(tmp_path.glob(".parts.resplit-*"))


def test_resplit_cli_refuses_while_the_lock_is_held_even_between_renames(tmp_path, monkeypatch):
    """Lock held by another process (here: this test, as fcntl.flock on the same lock file) with the bundle
    folder moved into a work folder, as between the renames of a live run: exit 2 with "another resplit",
    no recovery hint (the folder comes back by itself), nothing moved or deleted."""
    import fcntl

    arc, bdir, m = _bundle_dir(tmp_path)
    _interrupt_between_renames(bdir, monkeypatch)  # what a live run between its two renames looks like
    (work,) = tmp_path.glob(".parts.resplit-*")
    work_before = _snapshot(work)
    with open(tmp_path / ".parts.resplit.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.seek(0)
        fh.truncate()  # the interrupted run above left its pid in it
        fh.write("4242\n")
        fh.flush()
        r = _run_cli("resplit", str(bdir), "--part-size-mib", "1")
        assert r.returncode == 2 and "another resplit of" in r.stderr and "(pid 4242)" in r.stderr, r.stderr
        assert "interrupted re-split" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not bdir.exists() and _snapshot(work) == work_before
        # with the folder back but the lock still held: the work folder is not taken for a leftover and removed
        os.rename(work / "old", bdir)
        bdir_before, work_before = _snapshot(bdir), _snapshot(work)
        r = _run_cli("resplit", str(bdir), "--part-size-mib", "1")
        assert r.returncode == 2 and "another resplit of" in r.stderr, r.stderr
        assert _snapshot(bdir) == bdir_before and _snapshot(work) == work_before
    # lock released: the same call now cleans the leftover and re-splits
    r = _run_cli("resplit", str(bdir), "--part-size-mib", "1")
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob(".parts.resplit-*")) and len(BundleManifest.load(bdir).parts) == 1


# ----------------------------------------------------------------------------- install


def test_install_bundle_end_to_end(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    m = _manifest_for(arc, parts, sha, total, required_env={"TUNELAB_TEST_FLAG": "1"},
                      forbidden_env={"VLLM_USE_RUST_FRONTEND": "pruned"},
                      host_provided=[off.HostRequirement(name="pytest", specifier=">=1", required_by=["x"]),
                                     off.HostRequirement(name="surely-not-installed-xyz", required_by=["x"])])
    m.save(parts_dir / "manifest.json")
    rec_path = install_bundle(parts_dir, tmp_path / "rt", python=sys.executable)
    rec = off.load_runtime_record(rec_path)
    site = tmp_path / "rt" / "synthetic" / "site"
    assert rec.pythonpath == [str(site.resolve())]
    assert (site / "fakepkg" / "__init__.py").is_file()
    assert rec.env == {"TUNELAB_TEST_FLAG": "1"} and rec.serve_argv == []
    assert rec.python == sys.executable
    checks = {c["name"]: c for c in rec.host_checks}
    assert checks["pytest"]["ok"] is True and checks["surely-not-installed-xyz"]["installed"] is None
    env = rec.launch_env({"VLLM_USE_RUST_FRONTEND": "1", "PYTHONPATH": "/old"})
    assert "VLLM_USE_RUST_FRONTEND" not in env
    assert env["PYTHONPATH"].split(os.pathsep) == [str(site.resolve()), "/old"]
    assert not (tmp_path / "rt" / "synthetic" / arc.name).exists()  # joined archive removed
    assert list((site / "fakepkg" / "__pycache__").glob("__init__.*.pyc"))  # byte-compiled once
    # second install: same archive hash, no unpack, check again
    (site / "fakepkg" / "marker").write_text("kept")
    install_bundle(parts_dir / "manifest.json", tmp_path / "rt", python=sys.executable)
    assert (site / "fakepkg" / "marker").read_text() == "kept"


def test_install_bundle_failed_import_raises(tmp_path):
    arc, parts_dir, parts, sha, total = _split(tmp_path)
    m = _manifest_for(arc, parts, sha, total, import_check=["fakepkg", "module_that_is_not_there_xyz"])
    m.save(parts_dir / "manifest.json")
    with pytest.raises(OfflineBundleError, match="import check of synthetic") as ei:
        install_bundle(parts_dir, tmp_path / "rt", python=sys.executable)
    assert "module_that_is_not_there_xyz" in str(ei.value)


def test_runtime_record_missing(tmp_path):
    with pytest.raises(OfflineBundleError, match="runtime record not found"):
        off.load_runtime_record(tmp_path)


# ----------------------------------------------------------------------------- requirements

REQUIRES = [
    "torch==2.11.0",
    "Flashinfer_Python==0.6.13",
    "regex",
    "six>=1.16.0; python_version > \"3.11\"",
    "setuptools<81.0.0,>=77.0.3; python_version > \"3.11\"",
    "tokenspeed-mla==0.1.2; platform_system == \"Linux\"",
    "llguidance<1.8.0,>=1.7.0; platform_machine == \"x86_64\" or platform_machine == \"arm64\"",
    "pywin32; sys_platform == \"win32\"",
    "zentorch==2.11.0.0; extra == \"zen\"",
    "pandas; extra == \"bench\"",
    "xgrammar<1.0.0,>=0.2.1",
]


def test_split_requirements_markers_extras_exclusions_host():
    env = target_marker_environment("3.12", "manylinux_2_31_x86_64")
    s = split_requirements(REQUIRES, env=env, exclude=["flashinfer-python", "tokenspeed_mla"],
                           host_provided=["torch", "regex", "six", "setuptools", "pandas"])
    assert s.excluded == ["Flashinfer_Python==0.6.13", REQUIRES[5]]
    assert s.host == ["torch==2.11.0", "regex", REQUIRES[3], REQUIRES[4]]
    assert s.bundle == [REQUIRES[6], "xgrammar<1.0.0,>=0.2.1"]
    assert set(s.inactive) == {REQUIRES[7], REQUIRES[8], REQUIRES[9]}
    assert len(s.bundle + s.host + s.excluded + s.inactive) == len(REQUIRES)


def test_split_requirements_python_version_and_extras_change_the_answer():
    env311 = target_marker_environment("3.11")
    s = split_requirements(REQUIRES, env=env311, extras=["bench"])
    assert REQUIRES[3] in s.inactive and REQUIRES[4] in s.inactive
    assert "pandas; extra == \"bench\"" in s.bundle and REQUIRES[8] in s.inactive
    aarch = target_marker_environment("3.12", "manylinux_2_31_s390x")
    assert REQUIRES[6] in split_requirements(REQUIRES, env=aarch).inactive


def test_split_requirements_bad_entry_is_named():
    with pytest.raises(ValueError, match="not a valid PEP 508"):
        split_requirements(["ok", "bad req ==="], env=target_marker_environment())


def test_platform_tags_and_bad_python_version():
    tags = off.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_5_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags and "manylinux2014_x86_64" in tags
    assert off.platform_tags("manylinux_2_12_x86_64")[-2:] == ["manylinux2010_x86_64", "manylinux1_x86_64"]
    with pytest.raises(ValueError, match="python_version"):
        target_marker_environment("312")


def _item(name, version, *reqs):
    return {"metadata": {"name": name, "version": version, "requires_dist": list(reqs)}}


def test_walk_closure_stops_at_host_and_excluded_and_follows_extras():
    items = [
        _item("fastapi", "0.136.3", "starlette>=1.0", "pydantic>=2", "uvicorn[standard]; extra == 'standard'",
              "fastapi-cli[standard]; extra == 'standard'", "jinja2; extra == 'standard'"),
        _item("starlette", "1.10.0", "anyio>=3.6"),
        _item("pydantic", "2.14.4", "pydantic-core==2.50.5", "typing-extensions>=4.16.0"),
        _item("pydantic-core", "2.50.5", "typing-extensions>=4.14"),
        _item("uvicorn", "0.54.0", "h11>=0.8", "httptools>=0.6; extra == 'standard'",
              "colorama; sys_platform == 'win32'"),
        _item("httptools", "0.9.0"),
        _item("xgrammar", "0.2.5.post1", "transformers<5,>=4.38.0", "apache-tvm-ffi==0.1.9"),
        _item("apache-tvm-ffi", "0.1.9"),
        _item("transformers", "4.57.6", "huggingface-hub<1.0"),
        _item("anyio", "4.16.0"), _item("typing-extensions", "4.16.0"), _item("h11", "0.16.0"),
    ]
    carried, host, excluded, kept = off.walk_closure(
        ["fastapi[standard]<0.137", "xgrammar>=0.2.1"], items, target_marker_environment(),
        exclude=["fastapi-cli"], host_provided=["anyio", "typing-extensions", "h11", "transformers", "jinja2"],
        root_owner="vllm")
    assert carried == {"fastapi": "0.136.3", "starlette": "1.10.0", "pydantic": "2.14.4", "pydantic-core": "2.50.5",
                       "uvicorn": "0.54.0", "httptools": "0.9.0", "xgrammar": "0.2.5.post1",
                       "apache-tvm-ffi": "0.1.9"}
    assert [e.split(" ")[0] for e in excluded] == ["fastapi-cli[standard];"] and kept == []
    assert host["typing-extensions"].required_by == ["pydantic", "pydantic-core"]
    assert SpecifierSetEq(host["typing-extensions"].specifier, ">=4.16.0,>=4.14")
    # image (transformers 5.17.0) does not meet xgrammar's <5 pin: reported, not hidden
    assert host["transformers"].image_version == "5.17.0" and host["transformers"].image_ok is False
    assert host["h11"].image_ok is True
    assert "huggingface-hub" not in carried  # behind a host-provided package


def SpecifierSetEq(a: str, b: str) -> bool:
    from packaging.specifiers import SpecifierSet
    return SpecifierSet(a) == SpecifierSet(b)


def test_walk_closure_unresolved_requirement_is_named():
    with pytest.raises(OfflineBundleError, match="not-resolved-pkg"):
        off.walk_closure(["a"], [_item("a", "1", "not-resolved-pkg>=1")], target_marker_environment(), [], [], "x")


# ----------------------------------------------------------------------------- pruning, scanning


def test_prune_site(tmp_path):
    site = tmp_path / "site"
    files = ["bin/vllm", "xgrammar/lib/libxgrammar.a", "xgrammar/lib/libxgrammar_bindings.so",
             "vllm/vllm-rs", "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
             "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", "vllm/_C.abi3.so"]
    for f in files:
        (site / f).parent.mkdir(parents=True, exist_ok=True)
        (site / f).write_bytes(b"x" * 10)
    removed = off.prune_site(site, off.DEFAULT_PRUNE, "3.12")
    gone = {r.path for r in removed}
    assert gone == {"bin", "xgrammar/lib/libxgrammar.a", "vllm/vllm-rs",
                    "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so"}
    assert all(r.size_bytes == 10 and r.reason for r in removed)
    for keep in ("vllm/_C.abi3.so", "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so",
                 "xgrammar/lib/libxgrammar_bindings.so"):
        assert (site / keep).is_file()


def test_scan_module_level_imports(tmp_path):
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "a.py").write_text("import os\nfrom flashinfer import sampling\n")
    (pkg / "b.py").write_text("try:\n    import flashinfer\nexcept ImportError:\n    pass\n"
                              "def f():\n    import anthropic\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from anthropic import X\nimport anthropic_not_the_same\n")
    (tmp_path / "other.py").write_text("import flashinfer\n")
    hits = off.scan_module_level_imports(tmp_path, ["flashinfer", "anthropic"], packages=["vllm"])
    assert hits == ["vllm/a.py:2: from flashinfer import sampling"]


def test_bundle_runtime_rejects_unpinned_spec(tmp_path):
    with pytest.raises(ValueError, match="vllm_spec"):
        off.bundle_runtime("vllm>=0.25", tmp_path)
    with pytest.raises(ValueError, match="part_size_mib"):
        off.bundle_runtime("vllm==0.25.1", tmp_path, part_size_mib=0)


def test_guarded_prune_skipped_when_the_token_is_used(tmp_path):
    site = tmp_path / "site"
    (site / "pycountry" / "locales" / "de").mkdir(parents=True)
    (site / "pycountry" / "locales" / "de" / "iso3166-1.mo").write_bytes(b"m" * 5)
    (site / "pycountry" / "__init__.py").write_text("LOCALES_DIR = 'locales'\n")
    (site / "pycountry" / "tests").mkdir()
    (site / "pycountry" / "tests" / "test_general.py").write_text("assert pycountry.LOCALES_DIR\n")
    assert [r.path for r in off.prune_site(site, off.DEFAULT_PRUNE, "3.12")] == ["pycountry/locales"]
    (site / "pycountry" / "locales" / "de").mkdir(parents=True)
    (site / "pycountry" / "locales" / "de" / "iso3166-1.mo").write_bytes(b"m" * 5)
    (site / "user.py").write_text("import gettext, pycountry\ngettext.translation('x', pycountry.LOCALES_DIR)\n")
    assert off.prune_site(site, off.DEFAULT_PRUNE, "3.12") == []
    assert (site / "pycountry" / "locales" / "de" / "iso3166-1.mo").is_file()


def test_walk_closure_keeps_an_excluded_package_that_a_carried_one_imports():
    """fastapi 0.16x requires opentelemetry-api unconditionally (and imports it at module level)."""
    items = [
        _item("fastapi", "0.165.0", "opentelemetry-api>=1.44.0", "opentelemetry-sdk>=1.44; extra == 'standard'",
              "opentelemetry-exporter-otlp-proto-http>=1.44; extra == 'standard'"),
        _item("opentelemetry-api", "1.45.2", "importlib-metadata>=6"),
        _item("importlib-metadata", "8.0.0"),
        _item("opentelemetry-sdk", "1.45.2"), _item("opentelemetry-exporter-otlp-proto-http", "1.45.2"),
    ]
    carried, _, excluded, kept = off.walk_closure(
        ["fastapi[standard]", "opentelemetry-api>=1.27"], items, target_marker_environment(),
        exclude=["opentelemetry-*"], host_provided=[], root_owner="vllm")
    assert set(carried) == {"fastapi", "opentelemetry-api", "importlib-metadata"}
    assert kept == ["opentelemetry-api (required by fastapi)"]
    assert sorted(e.split(">")[0] for e in excluded) == [
        "opentelemetry-api", "opentelemetry-exporter-otlp-proto-http", "opentelemetry-sdk"]


# -- what one transfer carries, and pins the measured image is known to serve with ----------------------------

def test_default_part_plus_repository_fits_one_64_mib_transfer():
    """A part travels with the repository checkout and its manifest: the default (40 MiB) must leave room for
    both. Fails when the tracked files outgrow the room (about 23 MiB): then lower DEFAULT_PART_SIZE_MIB and the
    docs, and re-split built bundles with `python -m tunelab.offline resplit`."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        files = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    tracked = sum((repo / f).stat().st_size for f in files.decode().split("\0") if f and (repo / f).is_file())
    manifest_allowance = 1 << 20
    assert off.DEFAULT_PART_SIZE_MIB * MIB + tracked + manifest_allowance <= 64 * MIB, (
        f"part {off.DEFAULT_PART_SIZE_MIB} MiB + repository {tracked / MIB:.1f} MiB + 1 MiB manifest exceeds 64 MiB: "
        "lower DEFAULT_PART_SIZE_MIB (and docs/gpu_hosts.md), then `python -m tunelab.offline resplit` built bundles")


def test_cli_and_api_share_the_default_part_size(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tunelab.cli import app

    seen = {}
    monkeypatch.setattr(off, "bundle_orchestrator", lambda out, **kw: seen.update(kw) or (_ for _ in ()).throw(
        off.OfflineBundleError("stop here")))
    CliRunner().invoke(app, ["runtime", "bundle", str(tmp_path / "b"), "--orchestrator"])
    assert seen.get("part_size_mib") == off.DEFAULT_PART_SIZE_MIB
    import inspect

    assert inspect.signature(off.bundle_runtime).parameters["part_size_mib"].default == off.DEFAULT_PART_SIZE_MIB


def test_known_pins_of_the_measured_image_are_marked_and_new_gaps_are_not():
    checks = [
        {"name": "numpy", "specifier": "<2.4", "installed": "2.5.2", "ok": False},
        {"name": "numpy", "specifier": "<2.4", "installed": "2.6.0", "ok": False},  # not the version seen serving
        {"name": "setuptools", "specifier": "<81.0.0", "installed": "81.0.0", "ok": False},
        {"name": "aiohttp", "specifier": ">=3.13.3", "installed": "3.14.3", "ok": True},
        {"name": "regex", "specifier": ">=2024", "installed": "2023.1", "ok": False},
    ]
    marked = [c["served_on_measured_image"] for c in off.annotate_host_checks(checks)]
    assert marked == [True, False, True, False, False]
    assert "served_on_measured_image" not in checks[0]  # the input is not modified
