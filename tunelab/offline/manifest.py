"""The offline bundle formats and defaults: the manifest and runtime record models, what a runtime bundle
leaves out or takes from the host image, the prune rules, and the errors. Pure data: no I/O. See the
package docstring (``tunelab.offline``) for the record format and the sources of the defaults.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field



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

#: Requirements the measured H200 image does not meet, with which vLLM imported and served all the same
#: (vLLM 0.21.0 and 0.25.1, 2026-11-29 and 2026-12-01): name -> the host version seen serving. The install
#: check still records them as not met; it marks them ``served_on_measured_image`` so a reader can tell a
#: known, harmless gap from a new one. A different installed version is not marked.
SERVED_DESPITE_PIN: dict[str, str] = {
    "numba": "0.68.0",        # vLLM pins ==0.65.0
    "numpy": "2.5.2",         # vLLM, xgrammar, mistral-common: <2.4
    "setuptools": "81.0.0",   # vLLM, model-hosting-container-standards: <81.0.0
    "transformers": "5.17.0",  # vLLM 0.21.0 and 0.25.1 declare <5 through xgrammar / compressed-tensors
}

#: Largest bundle part, MiB. A part travels together with the repository checkout (about 14 MiB of tracked
#: files, growing as GPU-run evidence is committed) and its manifest; 40 MiB leaves room for both within a
#: 64 MiB transfer, with the checkout allowed to reach about 23 MiB. tests/test_offline.py fails when the checkout
#: outgrows that room. A bundle built with larger parts is re-split (``python -m tunelab.offline resplit``), not rebuilt.
DEFAULT_PART_SIZE_MIB = 40


def annotate_host_checks(checks: list[dict]) -> list[dict]:
    """Mark each not-met host requirement that the measured image is known to serve with.

    Args:
        checks: the install check's ``host_checks`` (dicts with ``name``, ``installed``, ``ok``).
    Returns:
        the same dicts (copies) with ``served_on_measured_image`` true where ``ok`` is false and the installed
        version is the one in :data:`SERVED_DESPITE_PIN`, else false.
    """
    out = []
    for c in checks:
        c = dict(c)
        c["served_on_measured_image"] = (not c.get("ok")) and SERVED_DESPITE_PIN.get(c.get("name")) == c.get("installed")
        out.append(c)
    return out


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


class OfflineBundleError(RuntimeError):
    """A bundle could not be built, joined, unpacked or checked; the message says which step and why."""


class PartChecksumError(OfflineBundleError):
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
        """Read a manifest file, or ``manifest.json`` inside a folder. Raises OfflineBundleError if absent/invalid."""
        path = Path(path)
        if path.is_dir():
            path = path / "manifest.json"
        if not path.is_file():
            raise OfflineBundleError(f"manifest not found: {path} (give the manifest.json or its folder)")
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as e:
            raise OfflineBundleError(f"manifest {path} is not a valid bundle manifest: {e}") from e


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
