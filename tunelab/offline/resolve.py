"""Which wheels a bundle carries: PEP 508 requirement filtering for the target interpreter and platform, pip's
resolver (``pip install --dry-run --report``), the dependency closure walk that splits carried from
host-provided packages, and the download/install of the pinned wheels into a site tree.
"""

from __future__ import annotations

import email.parser
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tunelab.offline.manifest import (
    H200_IMAGE_VERSIONS,
    HostRequirement,
    OfflineBundleError,
    RequirementSplit,
)


# --------------------------------------------------------------------------- requirements


def normalize_name(name: str) -> str:
    """PEP 503 normalised distribution name ('Foo_Bar.baz' -> 'foo-bar-baz')."""
    return canonicalize_name(name)


def platform_tags(platform: str) -> list[str]:
    """All wheel platform tags a host of ``platform`` accepts, newest first.

    ``manylinux_2_31_x86_64`` -> manylinux_2_31..manylinux_2_5 plus the legacy aliases
    manylinux2014 (= 2_17), manylinux2010 (= 2_12), manylinux1 (= 2_5) (PEP 600). Any other
    tag is returned alone. pip's ``--platform`` does not expand these by itself.
    """
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    if glibc < 5:
        raise ValueError(f"platform={platform!r}: glibc minor must be >= 5 (e.g. manylinux_2_31_x86_64)")
    tags = [f"manylinux_2_{i}_{arch}" for i in range(glibc, 4, -1)]
    for alias, minor in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        if glibc >= minor:
            tags.append(f"{alias}_{arch}")
    return tags


def target_marker_environment(python_version: str = "3.12", platform: str = "manylinux_2_31_x86_64") -> dict[str, str]:
    """PEP 508 marker environment of the target host (Linux, CPython), for evaluating Requires-Dist markers.

    ``python_version`` is 'X.Y' (full version taken as 'X.Y.0'); raises ValueError otherwise.
    """
    if not re.fullmatch(r"3\.\d+", python_version):
        raise ValueError(f"python_version={python_version!r}: give 'X.Y', e.g. '3.12'")
    m = re.search(r"(x86_64|aarch64|ppc64le|s390x|i686)$", platform)
    machine = m.group(1) if m else "x86_64"
    return {
        "implementation_name": "cpython", "implementation_version": python_version + ".0",
        "os_name": "posix", "platform_machine": machine, "platform_release": "",
        "platform_system": "Linux", "platform_version": "", "python_full_version": python_version + ".0",
        "platform_python_implementation": "CPython", "python_version": python_version, "sys_platform": "linux",
    }


def _marker_true(req: Requirement, env: dict[str, str], extras: Iterable[str]) -> bool:
    if req.marker is None:
        return True
    extras = list(extras) or [""]
    return any(req.marker.evaluate(env | {"extra": e}) for e in extras)


def split_requirements(
    requires_dist: Iterable[str],
    *,
    env: dict[str, str],
    extras: Iterable[str] = (),
    exclude: Iterable[str] = (),
    host_provided: Iterable[str] = (),
) -> RequirementSplit:
    """Sort ``Requires-Dist`` strings into bundle / host / excluded / inactive.

    A requirement is inactive when its marker is false for ``env`` with every extra in
    ``extras`` (no extras: only ``extra == ""``, so extra-only requirements are inactive).
    Names are compared after PEP 503 normalisation. Raises ValueError naming the bad string.
    """
    ex = {normalize_name(n) for n in exclude}
    host = {normalize_name(n) for n in host_provided}
    out = RequirementSplit()
    for s in requires_dist:
        try:
            req = Requirement(s)
        except InvalidRequirement as e:
            raise ValueError(f"Requires-Dist entry {s!r} is not a valid PEP 508 requirement: {e}") from e
        name = normalize_name(req.name)
        if not _marker_true(req, env, extras):
            out.inactive.append(s)
        elif name in ex:
            out.excluded.append(s)
        elif name in host:
            out.host.append(s)
        else:
            out.bundle.append(s)
    return out


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist list) read from a wheel's ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(wheel) as z:
        metas = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not metas:
            raise OfflineBundleError(f"{wheel}: no .dist-info/METADATA inside; is it a wheel?")
        msg = email.parser.BytesParser().parsebytes(z.read(metas[0]))
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


# --------------------------------------------------------------------------- pip


def _pip_platform_args(python_version: str, platform: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for t in platform_tags(platform):
        args += ["--platform", t]
    return args


def _run(cmd: list[str], what: str, log: Path | None = None, cwd: Path | None = None) -> None:
    cmd = ["nice", "-n", "10", *cmd] if shutil.which("nice") else cmd
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{res.stdout}\n{res.stderr}\nrc={res.returncode}\n")
    if res.returncode != 0:
        tail = "\n".join(l for l in res.stderr.splitlines() if "Location" not in l)[-3000:]
        raise OfflineBundleError(f"{what} failed (rc={res.returncode}):\n{tail}")


def _pip_resolve(roots: list[str], constraints: list[str], python_version: str, platform: str, work: Path,
                 log: Path) -> list[dict]:
    """pip's resolver for the target (metadata only, nothing installed). Returns report['install']."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "roots.txt").write_text("\n".join(roots) + "\n")
    (work / "constraints.txt").write_text("\n".join(constraints) + "\n")
    report = work / "report.json"
    _run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
          "--report", str(report), "--target", str(work / "never"),
          *_pip_platform_args(python_version, platform),
          "-r", str(work / "roots.txt"), "-c", str(work / "constraints.txt")],
         "pip resolution of " + ", ".join(roots[:5]) + ("..." if len(roots) > 5 else ""), log)
    return json.loads(report.read_text())["install"]


def walk_closure(roots: list[str], items: list[dict], env: dict[str, str], exclude: Iterable[str],
                  host_provided: Iterable[str], root_owner: str
                  ) -> tuple[dict[str, str], dict[str, HostRequirement], list[str], list[str]]:
    """Walk pip's resolution from ``roots``, stopping at host-provided and excluded names.

    ``items`` is the ``install`` list of a pip installation report (format 1: each item has
    ``metadata.name``, ``metadata.version``, ``metadata.requires_dist``). Markers are evaluated
    for ``env`` with the extras requested along the way. ``root_owner`` is recorded as the
    requirer of the roots. ``exclude`` holds names or fnmatch patterns; an excluded name is
    dropped when the root owner requires it or when it is reached through an extra, but carried
    when another carried package requires it unconditionally (its import would fail otherwise).
    Raises OfflineBundleError for a requirement absent from the resolution.
    Returns (carried name -> version, host name -> HostRequirement, excluded requirement strings,
    'name (required by X)' for excluded names carried anyway).
    """
    by_name = {normalize_name(i["metadata"]["name"]): i for i in items}
    ex = [normalize_name(n) for n in exclude]
    host = {normalize_name(n) for n in host_provided}
    carried: dict[str, str] = {}
    hostreq: dict[str, HostRequirement] = {}
    excluded: list[str] = []
    kept: list[str] = []
    extras_of: dict[str, set[str]] = {}
    queue: list[tuple[str, str]] = [(root_owner, r) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        owner, s = queue.pop(0)
        req = Requirement(s)
        name = normalize_name(req.name)
        if any(fnmatch.fnmatchcase(name, pat) for pat in ex):
            via_extra = req.marker is not None and "extra" in str(req.marker)
            if owner == root_owner or via_extra:
                excluded.append(f"{s} (from {owner})")
                continue
            note = f"{name} (required by {owner})"
            if note not in kept:
                kept.append(note)
        if name in host:
            h = hostreq.setdefault(name, HostRequirement(name=name, image_version=H200_IMAGE_VERSIONS.get(name)))
            if str(req.specifier):
                merged = SpecifierSet(h.specifier) & req.specifier
                h.specifier = str(merged)
            if owner not in h.required_by:
                h.required_by.append(owner)
            continue
        if name not in by_name:
            raise OfflineBundleError(f"{s} (required by {owner}) is not in pip's resolution; "
                              "add it to host_provided or exclude if the host has it")
        item = by_name[name]
        ext = extras_of.setdefault(name, set()) | set(req.extras)
        extras_of[name] = ext
        key = (name, frozenset(ext))
        if key in seen:
            continue
        seen.add(key)
        carried[name] = item["metadata"]["version"]
        for sub in item["metadata"].get("requires_dist", []) or []:
            r = Requirement(sub)
            if _marker_true(r, env, ext):
                queue.append((name, sub))
    for h in hostreq.values():
        if h.image_version is not None:
            try:
                h.image_ok = SpecifierSet(h.specifier).contains(Version(h.image_version), prereleases=True)
            except InvalidVersion:
                h.image_ok = None
    return carried, hostreq, excluded, kept


def _download_and_install(pins: dict[str, str], python_version: str, platform: str, wheel_dir: Path,
                          site: Path, log: Path, local_wheels: dict[str, Path] | None = None) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    local_wheels = local_wheels or {}
    specs = [f"{n}=={v}" for n, v in sorted(pins.items()) if n not in local_wheels]
    if specs:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheel_dir),
              *_pip_platform_args(python_version, platform), *specs], "pip download", log)
    wanted = set(pins)
    files = list(local_wheels.values())
    for w in wheel_dir.glob("*.whl"):
        n = normalize_name(w.name.split("-", 1)[0])
        v = w.name.split("-")[1]
        if n in wanted and n not in local_wheels and Version(v) == Version(pins[n]):
            files.append(w)
    got = {normalize_name(f.name.split("-", 1)[0]) for f in files} - set(local_wheels)
    if got != wanted:
        raise OfflineBundleError(f"wheels missing after download: {sorted(wanted - got)}")
    if site.exists():
        shutil.rmtree(site)
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--no-index",
          "--target", str(site), *_pip_platform_args(python_version, platform), *map(str, sorted(files))],
         "pip install --target", log)
