"""Make a random-weight Llama-architecture model (~1.1B parameters, bf16 safetensors) on a GPU host,
with no download: the config via the host's transformers (hand-written if that fails), weights drawn
with torch on the GPU (seed 0), tokenizer files copied from TOKDIR (made by gpu/make_tokenizer.py).

Shape (the measured H200 run's): hidden 2048, 16 layers, 32 heads / 8 KV heads, head_dim 64,
FFN 8192, vocab 32000, max_position_embeddings 4096 (env MAX_POS overrides).
Random weights: for checking the pipeline and relative figures, not for output quality.

usage: python3 gpu/make_model.py OUTDIR TOKDIR
"""
import json
import os
import shutil
import sys
import time

import torch
from safetensors.torch import save_file

V, H, I, L, NH, NKV, HD = 32000, 2048, 8192, 16, 32, 8, 64


def write_config(out: str, maxpos: int) -> None:
    try:
        from transformers import LlamaConfig

        cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                          num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                          max_position_embeddings=maxpos, rms_norm_eps=1e-5, bos_token_id=1,
                          eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
        cfg.architectures = ["LlamaForCausalLM"]
        try:
            cfg.dtype = "bfloat16"
        except Exception:
            cfg.torch_dtype = "bfloat16"
        cfg.save_pretrained(out)
    except Exception as e:  # a transformers without LlamaConfig or with another API
        print("LlamaConfig failed, writing config by hand:", repr(e))
        with open(os.path.join(out, "config.json"), "w") as fh:
            json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
                       "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
                       "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
                       "max_position_embeddings": maxpos, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                       "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
                       "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, fh, indent=1)


def main(out: str, tokdir: str) -> None:
    t0 = time.time()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this script draws the weights on the GPU")
    if not os.path.isfile(os.path.join(tokdir, "tokenizer.json")):
        sys.exit(f"{tokdir}/tokenizer.json missing: run gpu/make_tokenizer.py {tokdir} first")
    os.makedirs(out, exist_ok=True)
    maxpos = int(os.environ.get("MAX_POS", "4096"))
    write_config(out, maxpos)
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, device="cuda", dtype=torch.bfloat16)

    sd = {"model.embed_tokens.weight": w(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = w(NH * HD, H)
        sd[p + "self_attn.k_proj.weight"] = w(NKV * HD, H)
        sd[p + "self_attn.v_proj.weight"] = w(NKV * HD, H)
        sd[p + "self_attn.o_proj.weight"] = w(H, NH * HD)
        sd[p + "mlp.gate_proj.weight"] = w(I, H)
        sd[p + "mlp.up_proj.weight"] = w(I, H)
        sd[p + "mlp.down_proj.weight"] = w(H, I)
        sd[p + "input_layernorm.weight"] = ones(H)
        sd[p + "post_attention_layernorm.weight"] = ones(H)
    sd["model.norm.weight"] = ones(H)
    sd["lm_head.weight"] = w(V, H)
    n = sum(t.numel() for t in sd.values())
    path = os.path.join(out, "model.safetensors")
    save_file({k: v.cpu().contiguous() for k, v in sd.items()}, path, metadata={"format": "pt"})
    for f in os.listdir(tokdir):
        shutil.copy(os.path.join(tokdir, f), out)
    tc = os.path.join(out, "tokenizer_config.json")
    with open(tc) as fh:
        d = json.load(fh)
    d["model_max_length"] = maxpos  # keep the tokenizer in step with the model
    with open(tc, "w") as fh:
        json.dump(d, fh, indent=1)
    print(f"model: {n / 1e9:.3f} B params, {os.path.getsize(path) / 1e9:.2f} GB, made in {time.time() - t0:.1f} s")
    try:
        from transformers import AutoTokenizer

        tk = AutoTokenizer.from_pretrained(out)
        ids = tk("def hello(world):\n    return 42\n")["input_ids"]
        print("AutoTokenizer:", type(tk).__name__, "vocab", len(tk), "roundtrip", repr(tk.decode(ids)))
    except Exception as e:  # reported, not fatal: vLLM loads tokenizer.json itself
        print("AutoTokenizer FAILED:", repr(e))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
