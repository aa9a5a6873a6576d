"""Make a random-weight Llama-architecture model (bf16 safetensors) on a GPU host, with no download: the config
(llama-1b: via the host's transformers, hand-written if that fails; llama-3.1-8b: hand-written in the layout of
Meta's own config.json), weights drawn with torch on the GPU (seed 0), tokenizer files copied from TOKDIR (made by
gpu/make_tokenizer.py).

Shapes (--shape):
  llama-1b      (default; the measured H200 runs'): ~1.1B parameters, hidden 2048, 16 layers, 32 heads / 8 KV
                heads, head_dim 64, FFN 8192, vocab 32000, max_position_embeddings 4096 (env MAX_POS overrides),
                rope_theta 10000; one model.safetensors (2.2 GB)
  llama-3.1-8b  the Llama-3.1-8B architecture: ~8.03B parameters, hidden 4096, 32 layers, 32 heads / 8 KV heads,
                head_dim 128, FFN 14336, vocab 128256, rope_theta 500000 with llama3 rope scaling (factor 8,
                original 8192), max_position_embeddings 131072 (MAX_POS overrides); 16.1 GB written as shards
                model-0000k-of-0000n.safetensors of at most --shard-gb (default 2) plus model.safetensors.index.json
The weights are drawn and written shard by shard: host memory holds one shard (about twice its size while it is
serialised), never the whole model. The tokenizer must have as many tokens as the embedding has rows (the script
stops otherwise; gpu/make_tokenizer.py --vocab 128256 for the 8B shape; its docstring says why).
Random weights: for checking the pipeline and relative figures, not for output quality.

usage: python3 gpu/make_model.py [--shape llama-1b|llama-3.1-8b] [--dry-run] [--shard-gb G] [--device cuda|cpu]
                                 [--layers N] OUTDIR TOKDIR
  --dry-run    write config.json only and print the tensors, shards, bytes and peak host memory it would write
               (no torch, no GPU; TOKDIR is checked when it holds a tokenizer.json)
  --device     cpu draws the weights with torch on the CPU (slow: for tests of the script, with --layers)
  --layers N   fewer decoder layers than the shape has (tests only: the model is no longer the shape)
"""
import argparse
import json
import os
import shutil
import sys
import time

#: name -> (vocab, hidden, intermediate, layers, heads, kv heads, head_dim, max_position_embeddings)
SHAPES = {
    "llama-1b": dict(V=32000, H=2048, I=8192, L=16, NH=32, NKV=8, HD=64, MAXPOS=4096),
    "llama-3.1-8b": dict(V=128256, H=4096, I=14336, L=32, NH=32, NKV=8, HD=128, MAXPOS=131072),
}
#: Meta's Llama-3.1 RoPE: theta and the llama3 frequency scaling (as in meta-llama/Llama-3.1-8B's config.json).
LLAMA31_ROPE_THETA = 500000.0
LLAMA31_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192, "rope_type": "llama3"}
BYTES_BF16 = 2


def tensor_plan(s: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every weight in the order they are drawn: ``w`` = normal(0, 0.02), ``ones``."""
    V, H, I, L, NH, NKV, HD = (s[k] for k in ("V", "H", "I", "L", "NH", "NKV", "HD"))
    out = [("model.embed_tokens.weight", (V, H), "w")]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (NH * HD, H), "w"), (p + "self_attn.k_proj.weight", (NKV * HD, H), "w"),
                (p + "self_attn.v_proj.weight", (NKV * HD, H), "w"), (p + "self_attn.o_proj.weight", (H, NH * HD), "w"),
                (p + "mlp.gate_proj.weight", (I, H), "w"), (p + "mlp.up_proj.weight", (I, H), "w"),
                (p + "mlp.down_proj.weight", (H, I), "w"),
                (p + "input_layernorm.weight", (H,), "ones"), (p + "post_attention_layernorm.weight", (H,), "ones")]
    out += [("model.norm.weight", (H,), "ones"), ("lm_head.weight", (V, H), "w")]
    return out


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shard_plan(tensors: list, shard_bytes: int | None) -> list[list]:
    """Consecutive groups of ``tensors`` of at most ``shard_bytes`` each (a larger tensor alone); None: one group."""
    if shard_bytes is None:
        return [list(tensors)]
    shards, cur, size = [], [], 0
    for t in tensors:
        b = numel(t[1]) * BYTES_BF16
        if cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += b
    if cur:
        shards.append(cur)
    return shards


def shard_names(n: int) -> list[str]:
    """File names of ``n`` shards: ``model.safetensors`` for one, else HF's ``model-0000k-of-0000n.safetensors``."""
    return ["model.safetensors"] if n == 1 else [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]


def config_dict(shape: str, s: dict, maxpos: int) -> dict:
    """config.json of a shape written by hand: the 8B in the layout of Meta's Llama-3.1-8B config (so it loads as
    that checkpoint's does), with this repository's tokenizer's special ids (bos 1, eos 2, pad 3)."""
    d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": s["V"], "hidden_size": s["H"],
         "intermediate_size": s["I"], "num_hidden_layers": s["L"], "num_attention_heads": s["NH"],
         "num_key_value_heads": s["NKV"], "head_dim": s["HD"], "max_position_embeddings": maxpos,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
         "pad_token_id": 3, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         # as in Meta's file; without a transformers_version, transformers 5 takes a local config for a Mistral one
         # and warns that the tokenizer's regex is wrong (it is not: gpu/make_tokenizer.py's byte-level BPE)
         "transformers_version": "4.43.0.dev0"}
    if shape == "llama-3.1-8b":
        d.update({"rope_theta": LLAMA31_ROPE_THETA, "rope_scaling": dict(LLAMA31_ROPE_SCALING), "attention_bias": False,
                  "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1,
                  "use_cache": True})
    return d


def write_config(out: str, shape: str, s: dict, maxpos: int, use_transformers: bool = True) -> None:
    if shape == "llama-1b" and use_transformers:
        try:
            from transformers import LlamaConfig

            cfg = LlamaConfig(vocab_size=s["V"], hidden_size=s["H"], intermediate_size=s["I"],
                              num_hidden_layers=s["L"], num_attention_heads=s["NH"], num_key_value_heads=s["NKV"],
                              head_dim=s["HD"], max_position_embeddings=maxpos, rms_norm_eps=1e-5, bos_token_id=1,
                              eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
            cfg.architectures = ["LlamaForCausalLM"]
            try:
                cfg.dtype = "bfloat16"
            except Exception:
                cfg.torch_dtype = "bfloat16"
            cfg.save_pretrained(out)
            return
        except Exception as e:  # a transformers without LlamaConfig or with another API
            print("LlamaConfig failed, writing config by hand:", repr(e))
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(config_dict(shape, s, maxpos), fh, indent=1)


def tokenizer_size(tokdir: str) -> int | None:
    """Tokens of TOKDIR's tokenizer.json (model vocabulary + added tokens, by distinct id), read as JSON (no
    ``tokenizers`` import); None when there is none."""
    p = os.path.join(tokdir, "tokenizer.json")
    if not os.path.isfile(p):
        return None
    with open(p, encoding="utf-8") as fh:
        t = json.load(fh)
    ids = set((t.get("model") or {}).get("vocab", {}).values()) | {a["id"] for a in t.get("added_tokens") or []}
    return len(ids)


def check_tokenizer(tokdir: str, vocab: int, shape: str) -> None:
    n = tokenizer_size(tokdir)
    if n is None:
        return
    if n > vocab:
        sys.exit(f"{tokdir}/tokenizer.json has {n} tokens, more than the {shape} embedding's {vocab} rows: a prompt "
                 "could hold an id the model has no row for")
    if n < vocab:
        sys.exit(f"{tokdir}/tokenizer.json has {n} tokens, the {shape} embedding {vocab}: vLLM would serve it, but ids "
                 f"the tokenizer lacks decode to no text and tunelab times only chunks with text; make the tokenizer "
                 f"with gpu/make_tokenizer.py OUTDIR --vocab {vocab}")


def main() -> None:
    ap = argparse.ArgumentParser(usage="python3 gpu/make_model.py [--shape llama-1b|llama-3.1-8b] [--dry-run] "
                                       "[--shard-gb G] [--device cuda|cpu] [--layers N] OUTDIR TOKDIR")
    ap.add_argument("out")
    ap.add_argument("tokdir")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--shard-gb", type=float, default=None,
                    help="most GB per safetensors file (default: llama-1b one file, llama-3.1-8b 2)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args()
    t0 = time.time()
    s = dict(SHAPES[a.shape])
    if a.layers is not None:
        if not 1 <= a.layers <= s["L"]:
            sys.exit(f"--layers {a.layers}: between 1 and {s['L']}")
        s["L"] = a.layers
    maxpos = int(os.environ.get("MAX_POS", s["MAXPOS"]))
    shard_gb = a.shard_gb if a.shard_gb is not None else (None if a.shape == "llama-1b" else 2.0)
    if shard_gb is not None and shard_gb <= 0:
        sys.exit(f"--shard-gb {shard_gb}: give a positive size")
    tensors = tensor_plan(s)
    shards = shard_plan(tensors, None if shard_gb is None else int(shard_gb * 1e9))
    names = shard_names(len(shards))
    n_params = sum(numel(t[1]) for t in tensors)
    largest = max(sum(numel(t[1]) for t in sh) for sh in shards) * BYTES_BF16
    check_tokenizer(a.tokdir, s["V"], a.shape)
    os.makedirs(a.out, exist_ok=True)
    if a.dry_run:
        write_config(a.out, a.shape, s, maxpos, use_transformers=False)
        print(f"dry run, shape {a.shape}: {n_params / 1e9:.3f} B params, {n_params * BYTES_BF16 / 1e9:.2f} GB bf16 in "
              f"{len(shards)} file(s) ({', '.join(names[:2])}{', ...' if len(names) > 2 else ''}); largest "
              f"{largest / 1e9:.2f} GB; host memory peak about {2 * largest / 1e9:.1f} GB; tokenizer "
              f"{tokenizer_size(a.tokdir) or 'not checked'}; wrote {os.path.join(a.out, 'config.json')} only")
        return

    import torch
    from safetensors.torch import save_file

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: this script draws the weights on the GPU (--device cpu for a test build)")
    if not os.path.isfile(os.path.join(a.tokdir, "tokenizer.json")):
        sys.exit(f"{a.tokdir}/tokenizer.json missing: run gpu/make_tokenizer.py {a.tokdir} first")
    write_config(a.out, a.shape, s, maxpos)
    g = torch.Generator(device=a.device).manual_seed(0)

    def make(shape, init):
        if init == "ones":
            return torch.ones(*shape, device=a.device, dtype=torch.bfloat16)
        # as before: float32 normal draws x 0.02, then bf16 (the llama-1b weights stay the same as earlier runs')
        return (torch.randn(*shape, device=a.device, generator=g) * 0.02).to(torch.bfloat16)

    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        sd = {k: make(shape, init).cpu().contiguous() for k, shape, init in shard}
        path = os.path.join(a.out, name)
        save_file(sd, path, metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in sd.values())
        weight_map.update({k: name for k in sd})
        del sd
        if len(names) > 1:
            print(f"  {name}: {os.path.getsize(path) / 1e9:.2f} GB ({time.time() - t0:.0f} s)", flush=True)
    for f in os.listdir(a.tokdir):
        shutil.copy(os.path.join(a.tokdir, f), a.out)
    tc = os.path.join(a.out, "tokenizer_config.json")
    with open(tc) as fh:
        d = json.load(fh)
    d["model_max_length"] = maxpos  # keep the tokenizer in step with the model
    with open(tc, "w") as fh:
        json.dump(d, fh, indent=1)
    if len(names) > 1:  # written last: its presence says the build finished (gpu/host_setup.sh checks it)
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=1)
    size = sum(os.path.getsize(os.path.join(a.out, n)) for n in names)
    print(f"model ({a.shape}): {n_params / 1e9:.3f} B params, {size / 1e9:.2f} GB in {len(names)} file(s), made in "
          f"{time.time() - t0:.1f} s")
    try:
        from transformers import AutoTokenizer

        tk = AutoTokenizer.from_pretrained(a.out)
        ids = tk("def hello(world):\n    return 42\n")["input_ids"]
        print("AutoTokenizer:", type(tk).__name__, "vocab", len(tk), "roundtrip", repr(tk.decode(ids)))
    except Exception as e:  # reported, not fatal: vLLM loads tokenizer.json itself
        print("AutoTokenizer FAILED:", repr(e))


if __name__ == "__main__":
    main()
