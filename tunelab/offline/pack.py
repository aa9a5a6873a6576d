"""Building a bundle: prune the installed site tree, scan it for module-level imports, pack it into an xz
archive in parts with its manifest (:func:`bundle_runtime`, :func:`bundle_orchestrator`). Needs the
package index.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tunelab.offline.manifest import (
    BundleManifest,
    DEFAULT_EXCLUDE,
    DEFAULT_HOST_PROVIDED,
    DEFAULT_ORCHESTRATOR_HOST_PROVIDED,
    DEFAULT_PART_SIZE_MIB,
    DEFAULT_PRUNE,
    H200_IMAGE_VERSIONS,
    HostRequirement,
    MIB,
    ORCHESTRATOR_IMPORTS,
    OfflineBundleError,
    PartInfo,
    PruneRule,
    PrunedPath,
    _ENV_OFFLINE,
)
from tunelab.offline.resolve import (
    _download_and_install,
    _pip_platform_args,
    _pip_resolve,
    _run,
    normalize_name,
    split_requirements,
    target_marker_environment,
    walk_closure,
    wheel_metadata,
)
from tunelab.offline.parts import (
    split_stream,
)


# --------------------------------------------------------------------------- site tree


def prune_site(site: Path, rules: Iterable[PruneRule], python_version: str) -> list[PrunedPath]:
    """Delete paths under ``site`` that match ``rules``, plus CPython extension modules built for
    another Python (``*.cpython-3XY-*.so`` with 3XY != target): a ``python_version`` interpreter
    cannot load them. A rule with ``guard_token`` is skipped when any ``*.py`` in the site outside
    its ``guard_exempt`` files mentions the token (something may use the files). Returns what was
    removed, with sizes and reasons."""
    site = Path(site)
    tag = "cpython-" + python_version.replace(".", "")
    removed: list[PrunedPath] = []

    def size(p: Path) -> int:
        if p.is_file() or p.is_symlink():
            return p.lstat().st_size
        return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file())

    rules = list(rules)
    guarded = [r for r in rules if r.guard_token]
    if guarded:
        users: dict[str, list[str]] = {r.guard_token: [] for r in guarded}  # type: ignore[misc]
        for f in site.rglob("*.py"):
            rel = f.relative_to(site).as_posix()
            text = f.read_text(encoding="utf-8", errors="replace")
            for r in guarded:
                if r.guard_token in text and not any(fnmatch.fnmatchcase(rel, g) for g in r.guard_exempt):
                    users[r.guard_token].append(rel)  # type: ignore[index]
        rules = [r for r in rules if not r.guard_token or not users[r.guard_token]]
    for p in sorted(site.rglob("*")):
        if not (p.exists() or p.is_symlink()):
            continue  # inside a folder already removed
        rel = p.relative_to(site).as_posix()
        reason = next((r.reason for r in rules if fnmatch.fnmatchcase(rel, r.pattern)), None)
        m = re.search(r"\.(cpython-3\d+)-[^/]*\.so$", rel)
        if reason is None and m and m.group(1) != tag:
            reason = f"extension module for {m.group(1)}; a {tag} interpreter never loads it"
        if reason is None:
            continue
        removed.append(PrunedPath(path=rel, size_bytes=size(p), reason=reason))
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return removed


_IMPORT_RE = re.compile(r"^(?:import|from)\s+([A-Za-z_][\w]*)")


def scan_module_level_imports(site: Path, modules: Iterable[str], packages: Iterable[str] | None = None) -> list[str]:
    """Find ``import X`` / ``from X ...`` statements at column 0 (executed when the module is
    imported, not guarded by try/if/def) of any top-level module in ``modules``.

    Scans ``*.py`` under ``site/<pkg>`` for each of ``packages`` (default: every folder).
    Returns 'relative/path.py:LINE: text' strings. A hit means that importing the file fails
    without the excluded package; an empty list is evidence (not proof: lazy imports inside
    functions are allowed) that the exclusion is safe.
    """
    mods = set(modules)
    site = Path(site)
    roots = [site / p for p in packages] if packages is not None else [site]
    hits: list[str] = []
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            try:
                lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            in_type_checking = False
            for i, line in enumerate(lines, 1):
                if line.startswith("if TYPE_CHECKING") or line.startswith("if typing.TYPE_CHECKING"):
                    in_type_checking = True
                    continue
                if line and not line[0].isspace():
                    in_type_checking = False
                m = _IMPORT_RE.match(line)
                if m and m.group(1) in mods and not in_type_checking:
                    hits.append(f"{f.relative_to(site).as_posix()}:{i}: {line.strip()}")
    return hits


def _du(path: Path) -> int:
    return sum(f.lstat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink())


def _pack(site: Path, out_dir: Path, name: str, part_size_mib: int, xz_preset: str, xz_threads: int) -> tuple[list[PartInfo], str, int]:
    """tar the site folder (as ``site/``), compress with xz, write parts directly (no full-size temp file)."""
    for old in out_dir.glob(f"{name}.tar.xz.part*"):
        old.unlink()
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    tar = subprocess.Popen([*nice, "tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
                            "-C", str(site.parent), "-cf", "-", site.name], stdout=subprocess.PIPE)
    xz = subprocess.Popen([*nice, "xz", f"-{xz_preset}", f"-T{xz_threads}", "-c"], stdin=tar.stdout,
                          stdout=subprocess.PIPE)
    tar.stdout.close()  # type: ignore[union-attr]
    try:
        parts, sha, total = split_stream(xz.stdout, out_dir, f"{name}.tar.xz", part_size_mib * MIB)  # type: ignore[arg-type]
    finally:
        xz.stdout.close()  # type: ignore[union-attr]
    if tar.wait() != 0 or xz.wait() != 0:
        raise OfflineBundleError(f"packing {site} failed (tar rc={tar.returncode}, xz rc={xz.returncode})")
    return parts, sha, total


def _finish(kind, name, vllm_version, python_version, platform, site, out_dir, part_size_mib, xz_preset,
            xz_threads, carried, excluded, hostreq, pruned, required_env, forbidden_env, import_check,
            scan_hits, kept=()) -> BundleManifest:
    unpacked = _du(site)
    parts, sha, total = _pack(site, out_dir, name, part_size_mib, xz_preset, xz_threads)
    m = BundleManifest(
        kind=kind, name=name, vllm_version=vllm_version, python_version=python_version, platform=platform,
        archive_name=f"{name}.tar.xz", archive_sha256=sha, archive_bytes=total, unpacked_bytes=unpacked,
        parts=parts, wheels=[f"{n}=={v}" for n, v in sorted(carried.items())], excluded=sorted(set(excluded)),
        host_provided=sorted(hostreq.values(), key=lambda h: h.name), pruned=pruned, required_env=required_env,
        forbidden_env=forbidden_env, import_check=import_check, excluded_imported_at_module_level=scan_hits,
        kept_despite_exclude=list(kept))
    m.save(out_dir / "manifest.json")
    return m


# --------------------------------------------------------------------------- bundling


def bundle_runtime(
    vllm_spec: str,
    out_dir: Path,
    python_version: str = "3.12",
    platform: str = "manylinux_2_31_x86_64",
    exclude: list[str] = DEFAULT_EXCLUDE,
    extra: list[str] = ["fastokens"],  # noqa: B006 - typer needs a literal default; never mutated
    reuse_host: list[str] = DEFAULT_HOST_PROVIDED,
    part_size_mib: int = DEFAULT_PART_SIZE_MIB,
    wheel_dir: Path | None = None,
    xz_preset: str = "9",
    xz_threads: int = 2,
) -> BundleManifest:
    """Build an offline CUDA vLLM runtime bundle for a host whose image provides torch & co.

    Steps: download the vLLM wheel (``vllm_spec``, e.g. ``vllm==0.25.1``, a pinned spec is
    required) for CPython ``python_version`` on ``platform`` and older manylinux tags; take its
    ``Requires-Dist`` minus ``exclude`` minus ``reuse_host`` (host-provided) plus ``extra`` as
    roots; resolve them with pip's resolver (which settles pins such as apache-tvm-ffi==0.1.9 ->
    xgrammar 0.2.5.post1); carry the closure except host-provided/excluded names; install with
    ``pip install --no-deps --target``; remove :data:`DEFAULT_PRUNE` paths and other-ABI
    extensions; tar + ``xz -{xz_preset} -T{xz_threads}`` (under ``nice -n 10``) split into parts of
    at most ``part_size_mib`` MiB; write ``out_dir/manifest.json``.

    Returns the manifest. Needs the package index, ``tar`` and ``xz``. Raises ValueError for a
    bad argument (naming it) and OfflineBundleError when a step fails. ``required_env`` gets
    ``VLLM_USE_FLASHINFER_SAMPLER=0`` when flashinfer is excluded (vLLM's TopKTopPSampler imports
    flashinfer when that variable is 1, its default in 0.21-0.25).
    """
    if not re.fullmatch(r"vllm==\d+\.\d+\.\d+(\.post\d+)?", vllm_spec.strip()):
        raise ValueError(f"vllm_spec={vllm_spec!r}: give an exact pin such as 'vllm==0.25.1'")
    if not 1 <= part_size_mib <= 4096:
        raise ValueError(f"part_size_mib={part_size_mib}: must be within 1..4096")
    version = vllm_spec.split("==")[1]
    name = f"vllm-{version}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = target_marker_environment(python_version, platform)
    with tempfile.TemporaryDirectory(prefix=f"tunelab-{name}-") as tmp:
        tmpd = Path(tmp)
        log = out_dir / "build.log"
        log.write_text("")
        wdir = Path(wheel_dir) if wheel_dir else tmpd / "whl"
        wdir.mkdir(parents=True, exist_ok=True)
        vw = sorted(wdir.glob(f"vllm-{version}-*.whl"))
        if not vw:
            _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wdir),
                  *_pip_platform_args(python_version, platform), vllm_spec], f"download {vllm_spec}", log)
            vw = sorted(wdir.glob(f"vllm-{version}-*.whl"))
        _, _, requires = wheel_metadata(vw[0])
        split = split_requirements(requires, env=env, exclude=exclude, host_provided=reuse_host)
        roots = split.bundle + list(extra)
        torch_pin = [r for r in split.host if normalize_name(Requirement(r).name) == "torch"]
        items = _pip_resolve(roots, [re.sub(r"\s*;.*", "", t) for t in torch_pin], python_version, platform,
                             tmpd / "resolve", log)
        carried, hostreq, excluded, kept = walk_closure(roots, items, env, exclude, reuse_host, "vllm")
        # vLLM's own direct host/excluded requirements
        for s in split.host:
            r = Requirement(s)
            n = normalize_name(r.name)
            h = hostreq.setdefault(n, HostRequirement(name=n, image_version=H200_IMAGE_VERSIONS.get(n)))
            h.specifier = str(SpecifierSet(h.specifier) & r.specifier)
            if "vllm" not in h.required_by:
                h.required_by.insert(0, "vllm")
            if h.image_version:
                h.image_ok = SpecifierSet(h.specifier).contains(Version(h.image_version), prereleases=True)
        excluded = [f"{s} (from vllm)" for s in split.excluded] + excluded
        site = tmpd / "site"
        _download_and_install(carried, python_version, platform, wdir, site, log, {"vllm": vw[0]})
        carried["vllm"] = version
        pruned = prune_site(site, DEFAULT_PRUNE, python_version)
        forbidden = {k: v for r in DEFAULT_PRUNE for k, v in r.forbidden_env.items()
                     if any(fnmatch.fnmatchcase(p.path, r.pattern) for p in pruned)}
        ex_names = {normalize_name(Requirement(s.split(" (from")[0]).name) for s in excluded}
        ex_mods = sorted({m for n in ex_names for m in _EXCLUDED_MODULES.get(n, [n.replace("-", "_")])})
        by_file: dict[str, set[str]] = {}
        for hit in scan_module_level_imports(site, ex_mods, packages=["vllm"]):
            path, _, text = hit.split(":", 2)
            by_file.setdefault(path, set()).add(_IMPORT_RE.match(text.strip()).group(1))  # type: ignore[union-attr]
        scan = [f"{path}: {', '.join(sorted(mods))}" for path, mods in sorted(by_file.items())]
        required_env = dict(_ENV_OFFLINE)
        if any(n.startswith("flashinfer") for n in ex_names):
            required_env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
        return _finish("vllm-runtime", name, version, python_version, platform, site, out_dir, part_size_mib,
                       xz_preset, xz_threads, carried, excluded, hostreq, pruned, required_env, forbidden,
                       ["vllm", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"], scan, kept)


#: import names of excluded distributions whose module name differs from the dist name
_EXCLUDED_MODULES: dict[str, list[str]] = {
    "flashinfer-python": ["flashinfer"], "flashinfer-cubin": ["flashinfer_cubin"],
    "flashinfer-jit-cache": ["flashinfer_jit_cache"], "pynvvideocodec": ["PyNvVideoCodec"],
    "humming-kernels": ["humming"], "nvidia-cutlass-dsl": ["cutlass"], "quack-kernels": ["quack"],
    "tokenspeed-mla": ["tokenspeed_mla"], "nvidia-cudnn-frontend": ["cudnn"],
    "opentelemetry-sdk": ["opentelemetry"], "opentelemetry-api": ["opentelemetry"],
    "opentelemetry-exporter-otlp": ["opentelemetry"], "opentelemetry-semantic-conventions-ai": ["opentelemetry"],
    "fastapi-cli": ["fastapi_cli"], "email-validator": ["email_validator"],
}


def _project_dependencies(pyproject: Path) -> list[str]:
    import tomllib

    data = tomllib.loads(Path(pyproject).read_text())
    try:
        return list(data["project"]["dependencies"])
    except KeyError as e:
        raise OfflineBundleError(f"{pyproject}: no [project] dependencies") from e


def bundle_orchestrator(
    out_dir: Path,
    python_version: str = "3.12",
    platform: str = "manylinux_2_31_x86_64",
    host_provided: list[str] = DEFAULT_ORCHESTRATOR_HOST_PROVIDED,
    part_size_mib: int = DEFAULT_PART_SIZE_MIB,
    pyproject: Path | None = None,
    wheel_dir: Path | None = None,
    xz_preset: str = "9",
    xz_threads: int = 2,
) -> BundleManifest:
    """Bundle tunelab's own dependencies (``[project] dependencies`` of ``pyproject``, default the
    repository's) for the host's Python, leaving ``host_provided`` (default numpy, pandas,
    pyarrow) to the image. The tunelab source is not bundled: it travels with the checkout
    (put the checkout on PYTHONPATH after the bundle's site). Same packing, manifest and errors
    as :func:`bundle_runtime`; the bundle is named ``orchestrator-py{X.Y}``.
    """
    if not 1 <= part_size_mib <= 4096:
        raise ValueError(f"part_size_mib={part_size_mib}: must be within 1..4096")
    pyproject = Path(pyproject) if pyproject else Path(__file__).resolve().parents[2] / "pyproject.toml"
    name = f"orchestrator-py{python_version}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = target_marker_environment(python_version, platform)
    deps = _project_dependencies(pyproject)
    split = split_requirements(deps, env=env, host_provided=host_provided)
    with tempfile.TemporaryDirectory(prefix="tunelab-orch-") as tmp:
        tmpd = Path(tmp)
        log = out_dir / "build.log"
        log.write_text("")
        items = _pip_resolve(split.bundle + split.host, [], python_version, platform, tmpd / "resolve", log)
        carried, hostreq, excluded, kept = walk_closure(split.bundle, items, env, [], host_provided, "tunelab")
        for s in split.host:
            r = Requirement(s)
            n = normalize_name(r.name)
            h = hostreq.setdefault(n, HostRequirement(name=n, image_version=H200_IMAGE_VERSIONS.get(n)))
            h.specifier = str(SpecifierSet(h.specifier) & r.specifier)
            h.required_by.insert(0, "tunelab")
        site = tmpd / "site"
        _download_and_install(carried, python_version, platform, Path(wheel_dir) if wheel_dir else tmpd / "whl",
                              site, log)
        pruned = prune_site(site, DEFAULT_PRUNE, python_version)
        return _finish("orchestrator", name, None, python_version, platform, site, out_dir, part_size_mib,
                       xz_preset, xz_threads, carried, excluded, hostreq, pruned,
                       {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}, {},
                       ORCHESTRATOR_IMPORTS, [])
