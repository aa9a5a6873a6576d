"""Locally built models. ``build_tiny_model`` makes the deterministic tiny Llama that the CPU runtime serves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tunelab.host.runtime import Runtime, RuntimeError_

__all__ = ["build_tiny_lora", "build_tiny_model", "has_chat_template", "is_model_dir"]

_SCRIPT = Path(__file__).parents[1] / "scripts" / "make_tiny_model.py"
_LORA_SCRIPT = Path(__file__).parents[1] / "scripts" / "make_tiny_lora.py"


def is_model_dir(path: Path) -> bool:
    """True when ``path`` holds a config.json, weights and a tokenizer."""
    return (path / "config.json").exists() and (path / "tokenizer.json").exists() and any(path.glob("*.safetensors"))


def has_chat_template(path: Path) -> bool:
    """True when the model's ``tokenizer_config.json`` carries a ``chat_template`` (what
    ``/v1/chat/completions`` renders the messages with; tiny models built before 2026-12 kept it only in
    ``chat_template.jinja``, which older transformers releases do not read)."""
    try:
        return bool(json.loads((path / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def build_tiny_model(runtime: Runtime, out: Path, force: bool = False, log=print) -> Path:
    """Build the tiny random-weight Llama (4 layers, hidden 256, 7.3 M params, bf16) with a locally trained
    8192-token byte-level BPE tokenizer and a ChatML chat template into ``out``, using the runtime's
    interpreter (~5 s, no network).

    Reuses an existing model folder unless ``force`` or its tokenizer_config.json has no chat template (then
    it is rebuilt: the build is deterministic, so only that file changes).

    Raises:
        RuntimeError_: the build script failed (its stderr tail is in the message).
    """
    out = out.resolve()
    if is_model_dir(out) and has_chat_template(out) and not force:
        log(f"model {out} exists; reusing it")
        return out
    out.mkdir(parents=True, exist_ok=True)
    env = runtime.launch_env()
    r = subprocess.run([runtime.python, str(_SCRIPT), str(out)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError_(f"building the tiny model failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    info = json.loads(r.stdout[r.stdout.index("{"):])
    log(f"tiny model built in {out}: {info['params']:,} params, vocab {info['vocab']}")
    return out


def build_tiny_lora(runtime: Runtime, out: Path, log=print) -> Path:
    """Build a tiny random LoRA adapter (rank 8 on q_proj and v_proj, PEFT format, seed 0) for the tiny model
    into ``out`` with the runtime's interpreter (< 5 s, no network); serve it with the engine args
    ``enable-lora: true`` and ``lora-modules: NAME=PATH``.

    Raises:
        RuntimeError_: the build script failed (its stderr tail is in the message).
    """
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([runtime.python, str(_LORA_SCRIPT), str(out)], capture_output=True, text=True,
                       env=runtime.launch_env())
    if r.returncode != 0:
        raise RuntimeError_(f"building the tiny LoRA adapter failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    log(f"tiny LoRA adapter built in {out}")
    return out
