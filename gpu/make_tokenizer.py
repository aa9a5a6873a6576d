"""Train a real byte-level BPE tokenizer on local text: the Python standard library's sources. Needs only the
`tokenizers` package (the H200 image has it); no network.

usage: python3 gpu/make_tokenizer.py OUTDIR [--vocab N]
  --vocab N   tokens in all, the 4 special ones included (default 32000: the ~1.1B model's embedding; 128256 for
              the Llama-3.1-8B shape, whose embedding has that many rows: gpu/make_model.py --shape llama-3.1-8b)
Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into OUTDIR.
Special tokens: <unk>=0, <s>=1 (bos), </s>=2 (eos), <pad>=3, matching gpu/make_model.py's config.

Why the tokenizer's size should equal the embedding's: vLLM serves a model whose embedding has more rows than its
tokenizer has tokens (its input check takes the larger of the two, as for Qwen models), but an id the tokenizer
does not know decodes to no text (tokenizers' decode skips it), and tunelab times only streamed chunks that carry
text: with 32,000 tokens under a 128,256-row embedding about 3 of 4 random-weight tokens would be invisible to
TTFT and ITL. So the trainer is asked for exactly the embedding's size (above 32,000 it also merges pairs seen
once, as the standard library's text alone runs out of pairs seen twice near 78,000 tokens); if the corpus still
runs out of merges, plain (non-special) filler tokens make up the rest, each decoding to text of its own.
"""
import argparse
import glob
import json
import os
import sys
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB = 32000  # default: the ~1.1B model's vocabulary
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def main(out: str, vocab: int = VOCAB) -> None:
    os.makedirs(out, exist_ok=True)
    std = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(std, "**", "*.py"), recursive=True))
    files = [f for f in files if "site-packages" not in f and "dist-packages" not in f][:3000]
    if not files:
        sys.exit(f"no .py files under {std}: cannot train a tokenizer")
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2 if vocab <= VOCAB else 1, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def texts():
        for f in files:
            try:
                with open(f, encoding="utf-8", errors="ignore") as fh:
                    yield fh.read()
            except OSError:
                pass

    tok.train_from_iterator(texts(), trainer=trainer)
    trained = tok.get_vocab_size()
    if trained < vocab:  # the corpus ran out of merges: fill up with plain tokens that decode to text
        tok.add_tokens([f"<|filler_{i}|>" for i in range(vocab - trained)])
        print(f"tokenizer: BPE gave {trained} tokens; {vocab - trained} filler tokens added to reach {vocab}")
    if tok.get_vocab_size() != vocab:
        sys.exit(f"tokenizer has {tok.get_vocab_size()} tokens, asked for {vocab}")
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": False, "add_eos_token": False,
           "model_max_length": 4096, "clean_up_tokenization_spaces": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as fh:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, fh, indent=1)
    ids = [tok.token_to_id(s) for s in SPECIALS]
    if ids != [0, 1, 2, 3]:
        sys.exit(f"special token ids {ids} != [0, 1, 2, 3]: the model config would not match")
    print("tokenizer: vocab", tok.get_vocab_size(), "trained on", len(files), "files, specials", ids)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Train a byte-level BPE tokenizer on the standard library's sources.")
    ap.add_argument("out", nargs="?", default="tok", help="output folder")
    ap.add_argument("--vocab", type=int, default=VOCAB, help=f"tokens in all, specials included (default {VOCAB})")
    a = ap.parse_args()
    if a.vocab < 1000:
        sys.exit(f"--vocab {a.vocab}: too small for a byte-level BPE (256 byte tokens + merges); give >= 1000")
    main(a.out, a.vocab)
