"""Positive proof that an environment flag took effect in the running server.

Until 2026-12 a flag was only shown *not* applied, when the boot log named it unknown (``trials.env_not_applied``).
A flag vLLM knows can still do nothing (the package it needs missing, a code path not taken), and an A/B of it then
compares a config with itself. Where the server offers evidence, it is read from the live server and recorded per
trial (``trials.flag_proof``):

* ``VLLM_USE_FASTOKENS``: with ``1`` vLLM calls ``fastokens.patch_transformers()`` when it loads the tokenizer
  (``vllm/tokenizers/registry.py``, ``vllm/tokenizers/fastokens.py``; no release prints a log line for it), which
  loads the package's native extension (``fastokens/_native.abi3.so``). The API-server processes (the tokenizer's
  home: the root ``vllm serve`` and the ``APIServer`` processes of ``--api-server-count``;
  ``host_load.process_role``) are proven to run it when their ``/proc/<pid>/maps`` maps that shared object.

Per flag of the trial's env (``VLLM_*``) and per probed flag: ``status`` is ``proven`` (the evidence matches the value: loaded for
``1``, absent for ``0``), ``contradicted`` (it does not: the flag did not take effect, or took effect although
off), or ``unprovable`` (no probe for this flag, or no API-server process could be read); ``evidence`` says what was
seen. :func:`ab_flag_proof` says, for an A/B of one flag, whether its effect was proven on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.tasks import host_load

__all__ = ["FLAG_PROBES", "FlagProbe", "ab_flag_proof", "api_server_pids", "mapped_paths", "prove_flags"]

_PROC = Path("/proc")


@dataclass(frozen=True)
class FlagProbe:
    """Evidence of one flag: the shared object (a path fragment, e.g. ``fastokens/_native``) that the API-server
    processes map when the flag is on; ``source`` says where the rule comes from."""

    shared_object: str
    source: str

    def is_on(self, value: str) -> bool:
        """vLLM's reading of a boolean env flag: ``bool(int(value))`` (vllm/envs.py); unset or a non-integer is
        off."""
        try:
            return bool(int(str(value).strip()))
        except ValueError:
            return False


#: Flags tunelab can prove, by env name.
FLAG_PROBES: dict[str, FlagProbe] = {
    "VLLM_USE_FASTOKENS": FlagProbe(
        shared_object="fastokens/_native",
        source="vllm/tokenizers/fastokens.py apply_fastokens_patch: fastokens.patch_transformers() loads the "
               "native extension in the process that loads the tokenizer"),
}


def api_server_pids(server_pid: int) -> list[int]:
    """The server's API-server processes: its root and any ``APIServer`` process below it
    (``host_load.process_role``), sorted."""
    return sorted(p for p in host_load.descendants(server_pid) if host_load.process_role(p, server_pid) == "api_server")


def mapped_paths(pid: int, proc: Path = _PROC) -> set[str] | None:
    """Paths of the files mapped by process ``pid`` (``/proc/<pid>/maps``' last column), or None when unreadable
    (gone, or another user's process)."""
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return None
    out = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.add(parts[5].strip())
    return out


def prove_flags(env: Mapping[str, Any], server_pid: int | None) -> dict[str, dict[str, str]]:
    """Evidence for every ``VLLM_*`` flag of ``env`` in the running server.

    Args:
        env: the trial's env on top of the runtime's (``trials.env``).
        server_pid: the ``vllm serve`` root process (``EngineServer.proc.pid``); None: not running here.

    Returns:
        ``{flag: {"value", "status", "evidence"}}`` with ``status`` ``proven`` | ``contradicted`` | ``unprovable``
        (module docstring), e.g. ``{"VLLM_USE_FASTOKENS": {"value": "1", "status": "proven", "evidence":
        "fastokens/_native mapped in 1 of 1 API-server process(es) (pid 4242: .../fastokens/_native.abi3.so)"}}``.
        Every flag of :data:`FLAG_PROBES` is in it, with value ``'unset'`` (off) when ``env`` does not set it, so
        both sides of an A/B have evidence. Never raises: a process that cannot be read makes the flag
        unprovable.
    """
    flags = {k: str(v) for k, v in env.items() if k.startswith("VLLM_")}
    # A probed flag the env does not set is off (vLLM's default): its evidence is the other side of an A/B.
    flags.update({k: "unset" for k in FLAG_PROBES if k not in flags})
    out: dict[str, dict[str, str]] = {}
    pids = api_server_pids(server_pid) if flags and server_pid is not None else []
    maps = {p: mapped_paths(p) for p in pids}
    readable = {p: m for p, m in maps.items() if m is not None}
    for flag, value in sorted(flags.items()):
        probe = FLAG_PROBES.get(flag)
        if probe is None:
            out[flag] = {"value": value, "status": "unprovable",
                         "evidence": "tunelab has no probe for this flag (only the boot log's unknown-flag warning)"}
            continue
        if not readable:
            why = "the server is not running here" if server_pid is None else \
                f"no API-server process of pid {server_pid} could be read"
            out[flag] = {"value": value, "status": "unprovable", "evidence": why}
            continue
        hits = {p: sorted(x for x in m if probe.shared_object in x) for p, m in readable.items()}
        loaded = [p for p, h in hits.items() if h]
        on = probe.is_on(value)
        if loaded:
            first = hits[loaded[0]][0]
            evidence = (f"{probe.shared_object} mapped in {len(loaded)} of {len(readable)} API-server process(es) "
                        f"(pid {loaded[0]}: {first})")
        else:
            evidence = f"{probe.shared_object} mapped in none of {len(readable)} API-server process(es) {sorted(readable)}"
        proven = (len(loaded) == len(readable)) if on else not loaded
        out[flag] = {"value": value, "status": "proven" if proven else "contradicted", "evidence": evidence}
    return out


def ab_flag_proof(flag: str, proof_a: str | Mapping | None, proof_b: str | Mapping | None) -> str:
    """What can be said about an A/B of ``flag`` from the two sides' ``trials.flag_proof`` (JSON text or dict).

    Returns:
        ``'proven'`` when both sides' evidence matches their values; ``'contradicted: <side>: <evidence>'`` when a
        side's does not (the A/B did not compare what it says); ``'unprovable: <why>'`` otherwise (no probe for the
        flag, a side without a record, or its processes unreadable): the A/B then stands on the flag's name only.
    """
    sides = []
    for name, proof in (("A", proof_a), ("B", proof_b)):
        d = json.loads(proof) if isinstance(proof, str) else (proof or {})
        sides.append((name, (d or {}).get(flag)))
    for name, rec in sides:
        if rec and rec.get("status") == "contradicted":
            return f"contradicted: {name}: {rec.get('evidence')}"
    for name, rec in sides:
        if not rec:
            return (f"unprovable: side {name} has no evidence for {flag}"
                    + ("" if flag in FLAG_PROBES else " (tunelab has no probe for this flag)"))
        if rec.get("status") != "proven":
            return f"unprovable: {name}: {rec.get('evidence')}"
    return "proven"
