"""Offline runtimes for air-gapped GPU hosts: bundle wheels here, install them there.

Why: a GPU host may have Python, torch and transformers in its image but no network, no vLLM
and no Prefect/DuckDB/great-expectations. What it lacks has to travel as files, and each
transfer may be small (our GPU runs carry at most 64 MiB per call). This module packs a
pinned, pre-installed ``site-packages`` tree into an xz-compressed tar archive split into
parts of at most ``part_size_mib`` MiB, with a JSON manifest (:class:`BundleManifest`), and
installs such a bundle on the host (:func:`install_bundle`) as "host python + PYTHONPATH".

Three kinds of public names:

* bundling (needs the package index): :func:`bundle_runtime` (a CUDA vLLM wheel plus what
  the host image lacks), :func:`bundle_orchestrator` (tunelab's own dependencies);
* installing (no network): :func:`install_bundle`, :func:`join_parts`, :func:`load_runtime_record`;
* the pieces they are made of, public so tests and the CLI can use them:
  :func:`split_requirements`, :func:`target_marker_environment`, :func:`platform_tags`,
  :func:`split_stream`, :func:`split_file`, :func:`scan_module_level_imports`, :func:`prune_site`.

Runtime record (``runtime.json``, written by :func:`install_bundle`; model :class:`RuntimeRecord`).
The CPU runtimes of ``tunelab runtime create`` are venvs; an installed offline runtime is the
host's own interpreter with a ``PYTHONPATH``. An engine launcher starts vLLM from a record as::

    env = os.environ | record.env | {"PYTHONPATH": os.pathsep.join(record.pythonpath)}
    argv = record.serve_argv + ["MODEL_DIR", "--port", "8000", ...]
    # == [record.python, "-m", "vllm.entrypoints.cli.main", "serve", "MODEL_DIR", ...]
    subprocess.Popen(argv, env=env, start_new_session=True)

``vllm.entrypoints.cli.main`` is the module behind vLLM's console script
(``vllm = vllm.entrypoints.cli.main:main`` in the wheels' entry_points.txt) and has an
``if __name__ == "__main__": main()`` guard in 0.21.0 and 0.25.1 (checked in both wheels), so
``python -m vllm.entrypoints.cli.main serve ...`` equals ``vllm serve ...``; the console
script itself is not installed (``bin/`` is pruned: its shebang names the bundling machine's
interpreter). Fields of the record::

    {
      "format_version": 1,
      "kind": "vllm-runtime" | "orchestrator",
      "name": "vllm-0.25.1",                       # bundle name, also the install folder name
      "python": "/usr/bin/python3",                # host interpreter that passed the import check
      "pythonpath": ["/tmp/tunelab-rt/vllm-0.25.1/site"],   # prepend to PYTHONPATH
      "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", ...},  # set for every start
      "forbidden_env": {"VLLM_USE_RUST_FRONTEND": "why it must stay unset"},
      "serve_argv": ["/usr/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve"],  # [] for orchestrator
      "versions": {"vllm": "0.25.1", "torch": "2.11.0+cu130", "transformers": "5.17.0",
                   "fastokens": "0.3.5" | null, "python": "3.12.3"},
      "import_check_s": 27.4,                      # wall time of the import check on the host
      "host_checks": [{"name": "torch", "specifier": "==2.11.0", "required_by": ["vllm"],
                       "installed": "2.11.0+cu130", "ok": true}, ...],
      "manifest": "/path/to/manifest.json", "site": "/tmp/tunelab-rt/vllm-0.25.1/site",
      "installed_at": "2026-11-29T09:00:00+00:00"
    }

Sources: the wheel set, exclusions, xgrammar pin problem, FlashInfer sampler pitfall and the
host image's package versions come from the measured H200 run of vLLM 0.25.1 (our research
notes); ``Requires-Dist``/markers follow PEP 508 via ``packaging``; the resolver is pip's
(``pip install --dry-run --report``, report format 1).
"""

from __future__ import annotations

import datetime as _dt
import email.parser
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_HOST_PROVIDED",
    "DEFAULT_ORCHESTRATOR_HOST_PROVIDED",
    "DEFAULT_PRUNE",
    "H200_IMAGE_VERSIONS",
    "ORCHESTRATOR_IMPORTS",
    "BundleError",
    "PartChecksumError",
    "PartInfo",
    "HostRequirement",
    "PrunedPath",
    "PruneRule",
    "BundleManifest",
    "RuntimeRecord",
    "RequirementSplit",
    "normalize_name",
    "platform_tags",
    "target_marker_environment",
    "split_requirements",
    "walk_closure",
    "wheel_metadata",
    "split_stream",
    "split_file",
    "join_parts",
    "prune_site",
    "scan_module_level_imports",
    "bundle_runtime",
    "bundle_orchestrator",
    "install_bundle",
    "load_runtime_record",
]

MIB = 1024 * 1024
FORMAT_VERSION = 1

#: vLLM ``Requires-Dist`` entries left out of a runtime bundle. The first twelve were not
#: needed by vLLM 0.25.1 serving a Llama text model on an H200 (measured: import, boot, serve with
#: CUDA graphs, eager and fastokens); ``anthropic`` is never imported by vLLM's source. mcp,
#: opentelemetry-*, fastapi-cli (and, through it, fastapi-cloud-cli) and email-validator were
#: carried as an unused fallback in that run: the import succeeded without them. Entries are
#: names or fnmatch patterns. An excluded name is still carried when a carried package other than
#: vLLM requires it without an extra (fastapi >= 0.16x imports opentelemetry-api at module level).
DEFAULT_EXCLUDE: list[str] = [
    "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "tilelang", "pynvvideocodec",
    "humming-kernels", "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "fastsafetensors",
    "torchcodec", "nvidia-cudnn-frontend", "anthropic",
    "mcp", "opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp",
    "opentelemetry-semantic-conventions-ai", "opentelemetry-*", "fastapi-cli", "email-validator",
    "fastar",  # fastapi[standard] extra for `fastapi deploy` archives; fastapi itself never imports it
]

#: Package versions seen on the H200 host image (Python 3.12.3, torch 2.11.0+cu130), from the
#: measured run's ``pip list``. Used to report, at bundle time, which host-provided
#: requirements the image is known to meet.
H200_IMAGE_VERSIONS: dict[str, str] = {
    "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0", "tokenizers": "0.23.2",
    "numpy": "2.5.2", "numba": "0.68.0", "protobuf": "7.36.2", "safetensors": "0.8.0",
    "aiohttp": "3.14.3", "uvloop": "0.23.0", "httpx": "0.28.1", "huggingface-hub": "1.33.0",
    "setuptools": "81.0.0", "typing-extensions": "4.16.0", "anyio": "4.15.1", "h11": "0.16.0",
    "idna": "3.19",
}

#: Packages a runtime bundle takes from the host image instead of carrying them: those named in
#: :data:`H200_IMAGE_VERSIONS`, plus every package of vLLM 0.25.1's dependency closure that the
#: measured bundle did not carry although vLLM imported and served (so the image had them), plus
#: torch's companions. :func:`install_bundle` checks each against the host and records the result.
DEFAULT_HOST_PROVIDED: list[str] = sorted(set(H200_IMAGE_VERSIONS) | {
    "torchaudio", "torchvision", "llvmlite", "pandas", "pyarrow",
    "regex", "psutil", "sentencepiece", "requests", "urllib3", "certifi", "charset-normalizer",
    "tqdm", "py-cpuinfo", "pillow", "tiktoken", "filelock", "fsspec", "pyyaml", "six", "einops",
    "cloudpickle", "ninja", "opencv-python-headless", "prometheus-client", "jinja2", "markupsafe",
    "packaging", "sympy", "mpmath", "networkx", "attrs", "annotated-doc", "click", "rich",
    "pygments", "markdown-it-py", "mdurl", "httpcore", "hf-xet",
    "aiosignal", "aiohappyeyeballs", "frozenlist", "multidict", "yarl", "propcache",
})

#: The orchestrator bundle takes only these large scientific packages from the host image.
DEFAULT_ORCHESTRATOR_HOST_PROVIDED: list[str] = ["numpy", "pandas", "pyarrow"]

#: Modules the orchestrator bundle's import check loads (tunelab's run-time imports).
ORCHESTRATOR_IMPORTS: list[str] = [
    "prefect", "great_expectations", "duckdb", "openai", "httpx", "prometheus_client", "pynvml",
    "pydantic", "typer", "rich", "yaml", "scipy", "matplotlib", "pandas", "pyarrow", "numpy",
]

_ENV_OFFLINE = {
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
}


class BundleError(RuntimeError):
    """A bundle could not be built, joined, unpacked or checked; the message says which step and why."""


class PartChecksumError(BundleError):
    """A part file is missing, has the wrong size or the wrong sha256; ``part`` names it."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part


class PartInfo(BaseModel):
    """One part file of a split archive."""

    name: str = Field(description="file name, e.g. 'vllm-0.25.1.tar.xz.part00'")
    size_bytes: int = Field(ge=0, description="size in bytes")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex sha256 of the part's bytes")


class HostRequirement(BaseModel):
    """A requirement the bundle leaves to the host image."""

    name: str = Field(description="normalised distribution name (PEP 503)")
    specifier: str = Field(default="", description="merged PEP 440 specifier of all requirers, '' if none")
    required_by: list[str] = Field(default_factory=list, description="bundled packages that require it")
    image_version: str | None = Field(default=None, description="version seen on the H200 image, if known")
    image_ok: bool | None = Field(default=None, description="image_version satisfies specifier; None if unknown")


class PrunedPath(BaseModel):
    """A file or folder removed from the installed tree before packing, and why it is unused."""

    path: str = Field(description="path relative to the site folder")
    size_bytes: int = Field(ge=0, description="bytes removed")
    reason: str


class PruneRule(BaseModel):
    """Remove paths matching ``pattern`` (fnmatch on the path relative to site) before packing."""

    pattern: str
    reason: str
    forbidden_env: dict[str, str] = Field(
        default_factory=dict, description="env vars that would need the removed file: name -> why")
    guard_token: str | None = Field(
        default=None, description="prune only if no *.py in the site mentions this token, outside guard_exempt")
    guard_exempt: list[str] = Field(
        default_factory=list, description="fnmatch patterns of files allowed to mention guard_token (its definition)")


#: Cuts that are shown unused on the target. ``{other_abi}`` rules are added per target Python.
DEFAULT_PRUNE: list[PruneRule] = [
    PruneRule(pattern="bin", reason="console scripts: their shebang names the bundling machine's "
              "interpreter; vLLM is started as `python -m vllm.entrypoints.cli.main`"),
    PruneRule(pattern="xgrammar/lib/libxgrammar.a", reason="static archive, only for linking C++ "
              "programs; never loaded by Python (removed in the measured H200 run)"),
    PruneRule(pattern="pycountry/locales", reason="gettext catalogs (.mo) for translated country/language "
              "names; pycountry only defines LOCALES_DIR, its lookups read pycountry/databases, and no carried "
              "module mentions LOCALES_DIR (checked at bundle time)",
              guard_token="LOCALES_DIR", guard_exempt=["pycountry/__init__.py", "pycountry/tests/*"]),
    PruneRule(pattern="vllm/third_party/fmha_sm100", reason="SM100 (Blackwell) sparse-attention kernels and "
              "CUTLASS headers, imported only, lazily, by vllm/models/minimax_m3 (MiniMax M3 models); "
              "no other carried module mentions fmha_sm100 (checked at bundle time)",
              guard_token="fmha_sm100", guard_exempt=["vllm/third_party/fmha_sm100/*", "vllm/models/minimax_m3/*"]),
    PruneRule(pattern="vllm/vllm-rs", reason="Rust frontend binary; vllm/envs.py resolves it only "
              "when VLLM_USE_RUST_FRONTEND=1 (default 0)",
              forbidden_env={"VLLM_USE_RUST_FRONTEND": "the vllm-rs binary was pruned from this bundle"}),
]


class BundleManifest(BaseModel):
    """What a bundle holds and what the host must provide. Saved as ``manifest.json`` next to the parts."""

    format_version: int = FORMAT_VERSION
    kind: Literal["vllm-runtime", "orchestrator"]
    name: str = Field(description="bundle name, e.g. 'vllm-0.25.1'; also the install folder name")
    vllm_version: str | None = Field(default=None, description="vLLM version inside, None for orchestrator")
    python_version: str = Field(description="target Python 'X.Y'")
    platform: str = Field(description="highest manylinux tag allowed, e.g. manylinux_2_31_x86_64")
    archive_name: str = Field(description="name of the joined archive, e.g. 'vllm-0.25.1.tar.xz'")
    archive_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    archive_bytes: int = Field(ge=0)
    unpacked_bytes: int = Field(ge=0, description="bytes of the site tree before packing")
    top_dir: str = Field(default="site", description="the archive's single top-level folder")
    parts: list[PartInfo]
    wheels: list[str] = Field(description="carried distributions as 'name==version'")
    excluded: list[str] = Field(default_factory=list, description="requirements left out on purpose")
    host_provided: list[HostRequirement] = Field(default_factory=list)
    pruned: list[PrunedPath] = Field(default_factory=list)
    required_env: dict[str, str] = Field(default_factory=dict, description="set for every start")
    forbidden_env: dict[str, str] = Field(default_factory=dict, description="must stay unset: name -> why")
    import_check: list[str] = Field(description="modules imported by the post-install check")
    excluded_imported_at_module_level: list[str] = Field(
        default_factory=list, description="'vllm/file.py: pkg, ...' for each vllm module that imports an excluded "
        "package at column 0: that module cannot be imported on the host. Expected for optional backends (e.g. "
        "vllm/v1/attention/backends/flashinfer.py); a hit in a module on the serve path would be a bug")
    kept_despite_exclude: list[str] = Field(
        default_factory=list, description="excluded names carried anyway: 'name (required by X)' where a carried "
        "package other than vLLM requires them without an extra")
    created_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))

    def save(self, path: Path) -> Path:
        """Write the manifest as indented JSON to ``path`` (a file) and return it."""
        path = Path(path)
        path.write_text(self.model_dump_json(indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> BundleManifest:
        """Read a manifest file, or ``manifest.json`` inside a folder. Raises BundleError if absent/invalid."""
        path = Path(path)
        if path.is_dir():
            path = path / "manifest.json"
        if not path.is_file():
            raise BundleError(f"manifest not found: {path} (give the manifest.json or its folder)")
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as e:
            raise BundleError(f"manifest {path} is not a valid bundle manifest: {e}") from e


class RuntimeRecord(BaseModel):
    """An installed offline runtime (see the module docstring for the JSON form and how to launch)."""

    format_version: int = FORMAT_VERSION
    kind: Literal["vllm-runtime", "orchestrator"]
    name: str
    python: str = Field(description="host interpreter path")
    pythonpath: list[str] = Field(description="folders to put first on PYTHONPATH")
    env: dict[str, str] = Field(default_factory=dict)
    forbidden_env: dict[str, str] = Field(default_factory=dict)
    serve_argv: list[str] = Field(default_factory=list, description="argv prefix of `vllm serve`; [] if none")
    versions: dict[str, str | None] = Field(default_factory=dict)
    import_check_s: float | None = Field(default=None, description="seconds the import check took")
    host_checks: list[dict] = Field(default_factory=list)
    manifest: str
    site: str
    installed_at: str

    def launch_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess: ``base`` (default os.environ) + env + PYTHONPATH; forbidden vars removed."""
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        for k in self.forbidden_env:
            env.pop(k, None)
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(self.pythonpath + ([old] if old else []))
        return env


class RequirementSplit(BaseModel):
    """Result of :func:`split_requirements`: each input requirement lands in exactly one list."""

    model_config = {"arbitrary_types_allowed": True}
    bundle: list[str] = Field(default_factory=list, description="to carry")
    host: list[str] = Field(default_factory=list, description="left to the host image")
    excluded: list[str] = Field(default_factory=list, description="dropped by name")
    inactive: list[str] = Field(default_factory=list, description="marker false on the target")


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
            raise BundleError(f"{wheel}: no .dist-info/METADATA inside; is it a wheel?")
        msg = email.parser.BytesParser().parsebytes(z.read(metas[0]))
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


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
            raise BundleError(f"unpacking {archive} into {dest} failed (xz rc={xz.returncode}, tar rc={tar.returncode})")
        return
    with tarfile.open(archive, "r:xz") as t:
        if sys.version_info >= (3, 12):
            t.extractall(dest, filter="data")
        else:  # pragma: no cover - 3.11 without the filter argument backport
            t.extractall(dest)


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
        raise BundleError(f"{what} failed (rc={res.returncode}):\n{tail}")


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
    Raises BundleError for a requirement absent from the resolution.
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
            raise BundleError(f"{s} (required by {owner}) is not in pip's resolution; "
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
        raise BundleError(f"wheels missing after download: {sorted(wanted - got)}")
    if site.exists():
        shutil.rmtree(site)
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--no-index",
          "--target", str(site), *_pip_platform_args(python_version, platform), *map(str, sorted(files))],
         "pip install --target", log)


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
        raise BundleError(f"packing {site} failed (tar rc={tar.returncode}, xz rc={xz.returncode})")
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
    part_size_mib: int = 60,
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
    bad argument (naming it) and BundleError when a step fails. ``required_env`` gets
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
        raise BundleError(f"{pyproject}: no [project] dependencies") from e


def bundle_orchestrator(
    out_dir: Path,
    python_version: str = "3.12",
    platform: str = "manylinux_2_31_x86_64",
    host_provided: list[str] = DEFAULT_ORCHESTRATOR_HOST_PROVIDED,
    part_size_mib: int = 60,
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
    pyproject = Path(pyproject) if pyproject else Path(__file__).resolve().parent.parent / "pyproject.toml"
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
    PYTHONPATH=site and the bundle's required env; a failed import raises BundleError with the
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
            raise BundleError(f"{m.archive_name} did not contain {m.top_dir}/ as its top folder")
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
        raise BundleError(f"import check of {m.name} with {python} failed (rc={res.returncode}); "
                          f"PYTHONPATH={site}\n{res.stderr[-4000:]}")
    chk = json.loads(line.split(" ", 1)[1])
    python = chk.get("executable") or python  # the real interpreter, not a shim or a relative name
    rec = RuntimeRecord(
        kind=m.kind, name=m.name, python=python, pythonpath=[str(site)], env=m.required_env,
        forbidden_env=m.forbidden_env,
        serve_argv=[python, "-m", "vllm.entrypoints.cli.main", "serve"] if m.kind == "vllm-runtime" else [],
        versions=chk["versions"], import_check_s=chk["import_check_s"], host_checks=chk["host_checks"],
        manifest=str(mfile.resolve()), site=str(site.resolve()),
        installed_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    out = root / "runtime.json"
    out.write_text(rec.model_dump_json(indent=1) + "\n")
    (root / "unpack_s.txt").write_text(f"{unpack_s}\n")
    return out


def load_runtime_record(path: Path) -> RuntimeRecord:
    """Read a ``runtime.json`` (or the folder holding it). Raises BundleError if absent or invalid."""
    path = Path(path)
    if path.is_dir():
        path = path / "runtime.json"
    if not path.is_file():
        raise BundleError(f"runtime record not found: {path} (run install_bundle / `tunelab runtime install` first)")
    try:
        return RuntimeRecord.model_validate_json(path.read_text())
    except ValueError as e:
        raise BundleError(f"{path} is not a valid runtime record: {e}") from e


def main(argv: list[str] | None = None) -> int:
    """Minimal command line for hosts without the tunelab CLI's dependencies and for build scripts::

        python -m tunelab.offline install MANIFEST_OR_DIR DEST [--parts-dir DIR ...] [--python PY]
        python -m tunelab.offline bundle-runtime vllm==0.25.1 OUT_DIR [--no-fastokens] [--wheel-dir DIR]
        python -m tunelab.offline bundle-orchestrator OUT_DIR [--python-version 3.12]

    Prints the runtime record path or the manifest summary; returns a process exit code.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tunelab.offline")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("install")
    a.add_argument("manifest")
    a.add_argument("dest")
    a.add_argument("--parts-dir", action="append", default=None)
    a.add_argument("--python", default=sys.executable)
    b = sub.add_parser("bundle-runtime")
    b.add_argument("vllm_spec")
    b.add_argument("out_dir")
    b.add_argument("--python-version", default="3.12")
    b.add_argument("--no-fastokens", action="store_true")
    b.add_argument("--wheel-dir", default=None)
    b.add_argument("--part-size-mib", type=int, default=60)
    c = sub.add_parser("bundle-orchestrator")
    c.add_argument("out_dir")
    c.add_argument("--python-version", default="3.12")
    c.add_argument("--wheel-dir", default=None)
    c.add_argument("--part-size-mib", type=int, default=60)
    ns = ap.parse_args(argv)
    try:
        if ns.cmd == "install":
            rec = install_bundle(Path(ns.manifest), Path(ns.dest), [Path(d) for d in ns.parts_dir or []] or None,
                                 python=ns.python)
            print(rec)
            print(rec.read_text())
            return 0
        if ns.cmd == "bundle-runtime":
            m = bundle_runtime(ns.vllm_spec, Path(ns.out_dir), python_version=ns.python_version,
                               extra=[] if ns.no_fastokens else ["fastokens"], part_size_mib=ns.part_size_mib,
                               wheel_dir=Path(ns.wheel_dir) if ns.wheel_dir else None)
        else:
            m = bundle_orchestrator(Path(ns.out_dir), python_version=ns.python_version, part_size_mib=ns.part_size_mib,
                                    wheel_dir=Path(ns.wheel_dir) if ns.wheel_dir else None)
    except (BundleError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{m.name}: {len(m.wheels)} wheels, {m.unpacked_bytes / MIB:.1f} MiB unpacked -> "
          f"{m.archive_bytes / MIB:.2f} MiB xz in {len(m.parts)} parts: "
          + ", ".join(f"{p.name} {p.size_bytes / MIB:.2f} MiB" for p in m.parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
