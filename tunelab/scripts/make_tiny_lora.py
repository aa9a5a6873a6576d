#!/usr/bin/env python3
"""Build a tiny random LoRA adapter (PEFT format) for the tiny Llama of make_tiny_model.py, offline.

Runs INSIDE a runtime's interpreter (needs torch and safetensors, which every vLLM runtime has). Called by
``tunelab model tiny-lora PATH``. Writes ``adapter_config.json`` and ``adapter_model.safetensors`` with
rank-``r`` A/B matrices for ``q_proj`` and ``v_proj`` of every layer, the key names and shapes PEFT writes
(``base_model.model.model.layers.<i>.self_attn.<proj>.lora_A.weight``: ``(r, in)``; ``lora_B``: ``(out, r)``),
which is what ``vllm serve --enable-lora --lora-modules NAME=PATH`` loads. Deterministic: seed 0, fixed shapes.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--base", default="tiny-llama", help="base_model_name_or_path recorded in adapter_config.json")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--kv-dim", type=int, default=128, help="kv_heads x head_dim of the base (v_proj's output)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(a.layers):
        for proj, out_dim in (("q_proj", a.hidden), ("v_proj", a.kv_dim)):
            pre = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{pre}.lora_A.weight"] = (torch.randn(a.rank, a.hidden, generator=g) * 0.02).contiguous()
            tensors[f"{pre}.lora_B.weight"] = (torch.randn(out_dim, a.rank, generator=g) * 0.02).contiguous()
    save_file(tensors, os.path.join(a.out, "adapter_model.safetensors"))
    cfg = {"base_model_name_or_path": a.base, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
           "lora_alpha": 2 * a.rank, "lora_dropout": 0.0, "peft_type": "LORA", "r": a.rank,
           "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps({"out": a.out, "rank": a.rank, "tensors": len(tensors)}))


if __name__ == "__main__":
    main()
