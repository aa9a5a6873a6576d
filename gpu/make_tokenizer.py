"""Train a real byte-level BPE tokenizer (vocab 32000) on local text: the Python standard library's
sources. Needs only the `tokenizers` package (the H200 image has it); no network.

usage: python3 gpu/make_tokenizer.py OUTDIR
Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into OUTDIR.
Special tokens: <unk>=0, <s>=1 (bos), </s>=2 (eos), <pad>=3, matching gpu/make_model.py's config.
"""
import glob
import json
import os
import sys
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB = 32000
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def main(out: str) -> None:
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
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def texts():
        for f in files:
            try:
                with open(f, encoding="utf-8", errors="ignore") as fh:
                    yield fh.read()
            except OSError:
                pass

    tok.train_from_iterator(texts(), trainer=trainer)
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
    main(sys.argv[1] if len(sys.argv) > 1 else "tok")
