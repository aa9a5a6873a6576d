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

Modules by job: ``manifest`` (formats, defaults, errors), ``resolve`` (requirements, pip, closure),
``parts`` (split/join archives), ``pack`` (prune, scan, bundle), ``install`` (install on the host, runtime
record), ``cli`` (``python -m tunelab.offline``). The public names below are re-exported here.
Imports only the standard library, ``packaging`` and ``pydantic`` (what the host has before any venv),
never another tunelab module (an import contract in pyproject.toml keeps it so).
"""

from __future__ import annotations

from tunelab.offline.manifest import (
    BundleManifest,
    DEFAULT_EXCLUDE,
    DEFAULT_PART_SIZE_MIB,
    SERVED_DESPITE_PIN,
    annotate_host_checks,
    DEFAULT_HOST_PROVIDED,
    DEFAULT_ORCHESTRATOR_HOST_PROVIDED,
    DEFAULT_PRUNE,
    H200_IMAGE_VERSIONS,
    HostRequirement,
    ORCHESTRATOR_IMPORTS,
    OfflineBundleError,
    PartChecksumError,
    PartInfo,
    PruneRule,
    PrunedPath,
    RequirementSplit,
    RuntimeRecord,
)
from tunelab.offline.resolve import (
    normalize_name,
    platform_tags,
    split_requirements,
    target_marker_environment,
    walk_closure,
    wheel_metadata,
)
from tunelab.offline.parts import (
    join_parts,
    resplit_bundle,
    split_file,
    split_stream,
)
from tunelab.offline.pack import (
    bundle_orchestrator,
    bundle_runtime,
    prune_site,
    scan_module_level_imports,
)
from tunelab.offline.install import (
    install_bundle,
    load_runtime_record,
)
from tunelab.offline.cli import (
    main,
)

__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_HOST_PROVIDED",
    "DEFAULT_PART_SIZE_MIB",
    "SERVED_DESPITE_PIN",
    "annotate_host_checks",
    "DEFAULT_ORCHESTRATOR_HOST_PROVIDED",
    "DEFAULT_PRUNE",
    "H200_IMAGE_VERSIONS",
    "ORCHESTRATOR_IMPORTS",
    "OfflineBundleError",
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
    "resplit_bundle",
    "prune_site",
    "scan_module_level_imports",
    "bundle_runtime",
    "bundle_orchestrator",
    "install_bundle",
    "load_runtime_record",
    "main",
]
