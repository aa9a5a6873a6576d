"""Installing a bundle on the host, without network: join and verify the parts, unpack, run the import check
with the host's interpreter, write the runtime record (:func:`install_bundle`, :func:`load_runtime_record`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


from tunelab.offline.manifest import (
    BundleManifest,
    OfflineBundleError,
    RuntimeRecord,
    annotate_host_checks,
)
from tunelab.offline.parts import (
    _unpack,
    join_parts,
)


# --------------------------------------------------------------------------- installing

_CHECK_SNIPPET = r"""
import importlib, json, sys, time
from importlib import metadata
mods, dists, host = sys.argv[1].split(","), sys.argv[2].split(","), json.loads(sys.argv[3])
t = time.time()
for m in mods:
    if m:
        importlib.import_module(m)
out = {"import_check_s": round(time.time() - t, 2), "versions": {"python": sys.version.split()[0]},
       "executable": sys.executable}
for d in dists:
    try:
        out["versions"][d] = metadata.version(d)
    except metadata.PackageNotFoundError:
        out["versions"][d] = None
checks = []
try:
    from packaging.specifiers import SpecifierSet
except ImportError:
    SpecifierSet = None
for h in host:
    try:
        have = metadata.version(h["name"])
    except metadata.PackageNotFoundError:
        have = None
    ok = have is not None
    if ok and SpecifierSet is not None and h["specifier"]:
        ok = SpecifierSet(h["specifier"]).contains(have.split("+")[0], prereleases=True)
    checks.append({"name": h["name"], "specifier": h["specifier"], "required_by": h["required_by"],
                   "installed": have, "ok": ok})
out["host_checks"] = checks
print("TUNELAB_CHECK " + json.dumps(out))
"""


def install_bundle(
    manifest_or_dir: Path,
    dest: Path,
    parts_dirs: list[Path] | None = None,
    python: str = sys.executable,
    keep_archive: bool = False,
    compile_bytecode: bool = True,
) -> Path:
    """Install a bundle on this (air-gapped) host and write its runtime record.

    ``manifest_or_dir``: a manifest.json or the folder holding it. Parts are looked up in
    ``parts_dirs`` (default: the manifest's folder), also in their subfolders. The bundle is
    unpacked to ``dest/<name>/site``; the parts' sha256 are verified first
    (:class:`PartChecksumError` names a bad part). Then ``python`` (the host interpreter that
    vLLM/tunelab will run under) imports the manifest's ``import_check`` modules with
    PYTHONPATH=site and the bundle's required env; a failed import raises OfflineBundleError with the
    tail of its stderr. Returns the path of ``dest/<name>/runtime.json`` (:class:`RuntimeRecord`).
    After unpacking, ``compile_bytecode`` runs ``python -m compileall -j 0`` over the site with the
    host interpreter (bundles carry no .pyc; errors from files for other Python versions are
    ignored). Already installed (same archive sha256 recorded in ``dest/<name>/.archive_sha256``):
    skips the unpack and only re-runs the check.
    """
    mpath = Path(manifest_or_dir)
    m = BundleManifest.load(mpath)
    mfile = mpath / "manifest.json" if mpath.is_dir() else mpath
    dirs = [Path(d) for d in parts_dirs] if parts_dirs else [mfile.parent]
    root = Path(dest) / m.name
    site = root / m.top_dir
    stamp = root / ".archive_sha256"
    if not (stamp.is_file() and stamp.read_text().strip() == m.archive_sha256 and site.is_dir()):
        root.mkdir(parents=True, exist_ok=True)
        if site.exists():
            shutil.rmtree(site)
        archive = join_parts(m, dirs, root / m.archive_name)
        t = time.time()
        _unpack(archive, root)
        if not keep_archive:
            archive.unlink()
        if not site.is_dir():
            raise OfflineBundleError(f"{m.archive_name} did not contain {m.top_dir}/ as its top folder")
        if compile_bytecode:  # bundles are packed without .pyc; compiling once saves every later import
            subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(site)], capture_output=True)
        stamp.write_text(m.archive_sha256 + "\n")
        unpack_s = round(time.time() - t, 2)
    else:
        unpack_s = 0.0
    env = dict(os.environ)
    env.update(m.required_env)
    for k in m.forbidden_env:
        env.pop(k, None)
    env["PYTHONPATH"] = str(site)
    dists = ["vllm", "torch", "transformers", "tokenizers", "fastokens", "triton", "numpy"] \
        if m.kind == "vllm-runtime" else ["prefect", "great-expectations", "duckdb", "pandas", "numpy",
                                          "pyarrow", "scipy", "openai", "pydantic"]
    host = [h.model_dump(include={"name", "specifier", "required_by"}) for h in m.host_provided]
    res = subprocess.run([python, "-c", _CHECK_SNIPPET, ",".join(m.import_check), ",".join(dists), json.dumps(host)],
                         env=env, capture_output=True, text=True)
    line = next((l for l in res.stdout.splitlines() if l.startswith("TUNELAB_CHECK ")), None)
    if res.returncode != 0 or line is None:
        raise OfflineBundleError(f"import check of {m.name} with {python} failed (rc={res.returncode}); "
                          f"PYTHONPATH={site}\n{res.stderr[-4000:]}")
    chk = json.loads(line.split(" ", 1)[1])
    python = chk.get("executable") or python  # the real interpreter, not a shim or a relative name
    rec = RuntimeRecord(
        kind=m.kind, name=m.name, python=python, pythonpath=[str(site)], env=m.required_env,
        forbidden_env=m.forbidden_env,
        serve_argv=[python, "-m", "vllm.entrypoints.cli.main", "serve"] if m.kind == "vllm-runtime" else [],
        versions=chk["versions"], import_check_s=chk["import_check_s"], host_checks=annotate_host_checks(chk["host_checks"]),
        manifest=str(mfile.resolve()), site=str(site.resolve()),
        installed_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    out = root / "runtime.json"
    out.write_text(rec.model_dump_json(indent=1) + "\n")
    (root / "unpack_s.txt").write_text(f"{unpack_s}\n")
    return out


def load_runtime_record(path: Path) -> RuntimeRecord:
    """Read a ``runtime.json`` (or the folder holding it). Raises OfflineBundleError if absent or invalid."""
    path = Path(path)
    if path.is_dir():
        path = path / "runtime.json"
    if not path.is_file():
        raise OfflineBundleError(f"runtime record not found: {path} (run install_bundle / `tunelab runtime install` first)")
    try:
        return RuntimeRecord.model_validate_json(path.read_text())
    except ValueError as e:
        raise OfflineBundleError(f"{path} is not a valid runtime record: {e}") from e
