"""Register installed offline vLLM bundles (``tunelab.offline`` records) as tunelab runtimes.

``python -m tunelab.offline_register DEST`` reads every ``DEST/vllm-*/runtime.json`` written by
``tunelab.offline.install_bundle`` and writes ``<tunelab home>/runtimes/gpu-<vLLM version>/runtime.json``
(kind ``host-python``, device ``cuda``): the host's interpreter with the bundle on PYTHONPATH and the env the
bundle needs (e.g. ``VLLM_USE_FLASHINFER_SAMPLER=0`` when FlashInfer was left out).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tunelab import paths
from tunelab.runtime import Runtime

__all__ = ["register_offline"]


def register_offline(record_path: Path, name: str | None = None) -> Runtime:
    """Turn one offline runtime record into a tunelab runtime (see module docstring).

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
    return rt


def main(argv: list[str]) -> int:
    dest = Path(argv[1] if len(argv) > 1 else "/tmp/tunelab-rt")
    recs = sorted(dest.glob("vllm-*/runtime.json"))
    if not recs:
        print(f"no installed vLLM bundle under {dest}", file=sys.stderr)
        return 1
    for r in recs:
        rt = register_offline(r)
        print(f"registered runtime {rt.name}: {rt.versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
