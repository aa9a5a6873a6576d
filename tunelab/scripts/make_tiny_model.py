#!/usr/bin/env python3
"""Build a tiny random-weight Llama model + a real, locally trained byte-level BPE tokenizer
(with a ChatML chat template) that `vllm serve` can load offline.

Runs INSIDE a runtime's interpreter (it needs torch, transformers and tokenizers, which every vLLM
runtime has); tunelab's orchestrator never imports them. Called by `tunelab model tiny PATH`.

Deterministic: the tokenizer is trained on the interpreter's own standard-library sources (always
present, sorted order) and the weights use seed 0, so two builds with the same Python and library
versions are byte-identical. head_dim 64 is one that vLLM's CPU attention backend supports.
"""
import argparse
import glob
import json
import os
import sysconfig
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus_files(max_bytes=6_000_000):
    """Python stdlib sources: always present, deterministic order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files, total = [], 0
    for f in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        total += os.path.getsize(f)
        files.append(f)
        if total >= max_bytes:
            break
    return files


def build_tokenizer(out_dir, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token=None,
        pad_token="<|endoftext|>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)  # tokenizer.json + tokenizer_config.json (+ chat_template.jinja)
    # transformers >= 4.47 saves the template only as chat_template.jinja; a runtime whose transformers reads
    # only tokenizer_config.json's "chat_template" would then have none and refuse /v1/chat/completions. Put it
    # in tokenizer_config.json too (the same string, keys sorted as saved: the file stays deterministic).
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    return fast


def build_model(out_dir, tok, dtype, layers, hidden, inter, heads, kv_heads):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),  # base vocab + specials
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,  # 64: supported by vLLM's CPU attention backend
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype=dtype,
    )
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config.bos_token_id = cfg.bos_token_id
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    tok = build_tokenizer(a.out, a.vocab)
    t1 = time.time()
    model = build_model(a.out, tok, a.dtype, a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads)
    t2 = time.time()
    n = sum(p.numel() for p in model.parameters())
    # quick sanity check: round-trip + chat template render
    ids = tok("def hello(world):\n    return 42\n")["input_ids"]
    assert tok.decode(ids) == "def hello(world):\n    return 42\n", tok.decode(ids)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    print(json.dumps({
        "out": a.out, "vocab": len(tok), "params": n, "dtype": a.dtype,
        "tokenizer_s": round(t1 - t0, 2), "model_s": round(t2 - t1, 2),
        "files": sorted(os.listdir(a.out)), "chat_sample": chat,
    }, indent=1))


if __name__ == "__main__":
    main()
