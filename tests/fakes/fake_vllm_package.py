"""A FAKE `vllm` package on disk: the entry module of vLLM's CLI (``vllm.entrypoints.cli.main:main``) and, if
given, ``vllm/envs.py``, so that tunelab's probes of a runtime (engine-arg names and choices, env names) run
against a parser a test controls. It is not vLLM: nothing here serves or imports torch."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tunelab.host import paths
from tunelab.host.runtime import Runtime


def fake_vllm_runtime(site: Path, name: str, version: str, cli: str, envs: str | None = None,
                      register: bool = False) -> Runtime:
    """Write the fake package under ``site`` and return a Runtime of this interpreter with ``site`` on its path.

    Args:
        site: folder to create (must not exist); it becomes the runtime's PYTHONPATH.
        name, version: the runtime's name and the vLLM version it reports.
        cli: source of ``vllm/entrypoints/cli/main.py`` (dedented).
        envs: source of ``vllm/envs.py`` (dedented), or None for none.
        register: also write ``runtime.json`` under the test home's runtimes folder, so the facts cache of the
            runtime is written beside it.
    """
    pkg = site / "vllm" / "entrypoints" / "cli"
    pkg.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "main.py").write_text(textwrap.dedent(cli))
    if envs is not None:
        (site / "vllm" / "envs.py").write_text(textwrap.dedent(envs))
    # The orchestrator's own interpreter has no vLLM: only the fake on PYTHONPATH can answer.
    rt = Runtime(name=name, python=sys.executable, pythonpath=[str(site)], versions={"vllm": version})
    if register:
        d = paths.runtimes_dir() / name
        d.mkdir(parents=True)
        (d / "runtime.json").write_text(rt.model_dump_json())
    return rt
