"""Register installed offline vLLM bundles (``tunelab.offline`` records) as tunelab runtimes.

``python -m tunelab.host.offline_register DEST`` reads every ``DEST/vllm-*/runtime.json`` written by
``tunelab.offline.install_bundle`` and writes ``<tunelab home>/runtimes/gpu-<vLLM version>/runtime.json``
(kind ``host-python``, device ``cuda``): the host's interpreter with the bundle on PYTHONPATH and the env the
bundle needs (e.g. ``VLLM_USE_FLASHINFER_SAMPLER=0`` when FlashInfer was left out). Registering also reads the
runtime facts (``Runtime.facts``: ``vllm serve`` options and ``VLLM_*`` names, read by the host interpreter with the
bundle on PYTHONPATH) into ``runtime_facts.json`` beside the record, so plan checks and sweeps on the host only read
that file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tunelab.host import paths
from tunelab.host.runtime import Runtime

__all__ = ["register_offline"]


def register_offline(record_path: Path, name: str | None = None, read_facts: bool = True) -> Runtime:
    """Turn one offline runtime record into a tunelab runtime (see module docstring).

    Args:
        record_path: ``runtime.json`` written by ``tunelab.offline.install_bundle``.
        name: runtime name (default ``gpu-<vLLM version>``).
        read_facts: read the runtime facts now (imports vLLM's CLI once, ~10-60 s); a probe that fails leaves
            the facts unread (the checks that need them skip this runtime) and does not fail the registration.

    Raises:
        ValueError: the record is not a vLLM runtime record.
    """
    rec = json.loads(Path(record_path).read_text())
    if rec.get("kind") != "vllm-runtime":
        raise ValueError(f"{record_path}: kind {rec.get('kind')!r} is not a vLLM runtime record")
    versions = rec.get("versions", {})
    name = name or f"gpu-{versions.get('vllm')}"
    rt = Runtime(
        name=name,
        kind="host-python",
        spec=f"vllm=={versions.get('vllm')} (offline bundle {rec.get('name')})",
        device="cuda",
        python=rec["python"],
        pythonpath=rec["pythonpath"],
        env=rec.get("env", {}),
        versions={k: versions.get(k) for k in ("vllm", "torch", "transformers", "fastokens")},
        created_at=rec.get("installed_at", ""),
    )
    d = paths.runtimes_dir() / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "runtime.json").write_text(rt.model_dump_json(indent=2))
    if read_facts:
        rt.facts()
    return rt


def main(argv: list[str]) -> int:
    dest = Path(argv[1] if len(argv) > 1 else "/tmp/tunelab-rt")
    recs = sorted(dest.glob("vllm-*/runtime.json"))
    if not recs:
        print(f"no installed vLLM bundle under {dest}", file=sys.stderr)
        return 1
    for r in recs:
        rt = register_offline(r)
        facts = rt.facts()  # cached by register_offline: a file read
        print(f"registered runtime {rt.name}: {rt.versions}; "
              f"{len(facts.serve_flags) if facts.serve_flags else 'unknown'} vllm serve options, "
              f"{len(facts.env_names) if facts.env_names else 'unknown'} VLLM_* variables")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
