"""The GPU host's model scripts without a GPU: gpu/make_model.py's shapes (config.json, tensors, shards) through its
--dry-run, the tokenizer-size check, and how gpu/host_setup.sh (MODEL_SHAPE) and gpu/run_sweep.sh (the llama-8b
link) place the models. Nothing here draws weights or needs torch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAKE_MODEL = REPO / "gpu" / "make_model.py"


def _load_make_model():
    spec = importlib.util.spec_from_file_location("make_model", MAKE_MODEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tokenizer(d: Path, n: int) -> Path:
    """A tokenizer.json with ``n`` ids (4 added specials + BPE vocabulary), as gpu/make_tokenizer.py writes it."""
    d.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {s: i for i, s in enumerate(specials)} | {f"t{i}": i for i in range(4, n)}
    (d / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": i, "content": s, "special": True} for i, s in enumerate(specials)],
        "model": {"type": "BPE", "vocab": vocab, "merges": []}}))
    return d


def _dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(MAKE_MODEL), "--dry-run", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)


def test_8b_shape_config_is_llama_3_1_8b(tmp_path):
    tok = _tokenizer(tmp_path / "tok", 128256)
    r = _dry_run(tmp_path, "--shape", "llama-3.1-8b", str(tmp_path / "m"), str(tok))
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]) == (4096, 32, 32, 8, 14336, 128256, 128)
    assert cfg["rope_theta"] == 500000.0
    assert cfg["rope_scaling"] == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert cfg["max_position_embeddings"] == 131072 and cfg["torch_dtype"] == "bfloat16"
    assert cfg["tie_word_embeddings"] is False and cfg["rms_norm_eps"] == 1e-5
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 3)  # make_tokenizer's ids
    assert "8.030 B params" in r.stdout and "16.06 GB" in r.stdout and "9 file(s)" in r.stdout
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json"]  # no weights in a dry run


def test_8b_shape_tensors_and_shards():
    mm = _load_make_model()
    s = mm.SHAPES["llama-3.1-8b"]
    tensors = mm.tensor_plan(s)
    n = sum(mm.numel(t[1]) for t in tensors)
    assert n == 8_030_261_248  # Llama-3.1-8B's parameter count (untied embedding and LM head)
    shards = mm.shard_plan(tensors, int(2e9))
    assert [t for sh in shards for t in sh] == tensors  # every tensor once, in order
    assert all(sum(mm.numel(t[1]) for t in sh) * 2 <= 2e9 for sh in shards)
    names = mm.shard_names(len(shards))
    assert names[0] == "model-00001-of-00009.safetensors" and names[-1] == "model-00009-of-00009.safetensors"
    assert mm.shard_names(1) == ["model.safetensors"]


def test_default_shape_is_unchanged(tmp_path):
    mm = _load_make_model()
    s = mm.SHAPES["llama-1b"]
    assert (s["V"], s["H"], s["I"], s["L"], s["NH"], s["NKV"], s["HD"], s["MAXPOS"]) == \
        (32000, 2048, 8192, 16, 32, 8, 64, 4096)
    assert len(mm.shard_plan(mm.tensor_plan(s), None)) == 1  # one model.safetensors, as before
    tok = _tokenizer(tmp_path / "tok", 32000)
    r = _dry_run(tmp_path, str(tmp_path / "m"), str(tok))  # no --shape: llama-1b
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["max_position_embeddings"]) == \
        (32000, 2048, 16, 4096)
    assert "rope_scaling" not in cfg and "1.104 B params" in r.stdout and "model.safetensors" in r.stdout


@pytest.mark.parametrize("n", [32000, 200000])
def test_a_tokenizer_of_another_size_than_the_embedding_is_refused(tmp_path, n):
    tok = _tokenizer(tmp_path / "tok", n)
    r = _dry_run(tmp_path, "--shape", "llama-3.1-8b", str(tmp_path / "m"), str(tok))
    assert r.returncode != 0
    assert f"has {n} tokens" in r.stderr and "128256" in r.stderr
    assert not (tmp_path / "m").exists()


def _fake_python(tmp_path: Path) -> Path:
    """A PYTHON for the scripts that logs calls of gpu/make_*.py (and writes the files that mark a build done)
    and runs everything else with this interpreter."""
    log = tmp_path / "calls.log"
    w = tmp_path / "py"
    w.write_text(f"""#!/bin/bash
case "$1" in
  *make_tokenizer.py) echo "tok $*" >> {log}; mkdir -p "$2"; echo '{{}}' > "$2/tokenizer.json";;
  *make_model.py) echo "model $*" >> {log}; d="${{@: -2:1}}"; mkdir -p "$d"
                  case "$*" in *llama-3.1-8b*) : > "$d/model.safetensors.index.json";; *) : > "$d/model.safetensors";; esac;;
  *) exec {sys.executable} "$@";;
esac
""")
    w.chmod(0o755)
    return w


def _host_setup(tmp_path: Path, dest: Path, shape: str | None) -> str:
    env = {**os.environ, "PYTHON": str(_fake_python(tmp_path))}
    env.pop("OUT", None)
    if shape is not None:
        env["MODEL_SHAPE"] = shape
    parts = tmp_path / "parts"
    parts.mkdir(exist_ok=True)
    r = subprocess.run(["bash", str(REPO / "gpu" / "host_setup.sh"), str(parts), str(dest)], env=env,
                       capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


def test_host_setup_builds_the_shapes_asked_for(tmp_path):
    dest = tmp_path / "rt"
    (dest / "vllm-0.25.1").mkdir(parents=True)
    (dest / "vllm-0.25.1" / "runtime.json").write_text("{}")
    _host_setup(tmp_path, dest, None)  # default: the ~1.1B model only, as before
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == [f"tok {REPO}/gpu/make_tokenizer.py {dest}/tok --vocab 32000",
                     f"model {REPO}/gpu/make_model.py --shape llama-1b {dest}/model {dest}/tok"]
    out = _host_setup(tmp_path, dest, "llama-1b llama-3.1-8b")
    calls = (tmp_path / "calls.log").read_text().splitlines()[2:]
    assert "model llama-1b built already" in out
    assert calls == [f"tok {REPO}/gpu/make_tokenizer.py {dest}/tok-128256 --vocab 128256",
                     f"model {REPO}/gpu/make_model.py --shape llama-3.1-8b {dest}/model-llama-3.1-8b {dest}/tok-128256"]
    out = _host_setup(tmp_path, dest, "llama-3.1-8b bogus")
    assert "model llama-3.1-8b built already" in out and "unknown shape 'bogus'" in out
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 4


def test_run_sweep_links_the_8b_model_when_it_is_built(tmp_path):
    dest, home = tmp_path / "rt", tmp_path / "home"
    env = {**os.environ, "DEST": str(dest), "TUNELAB_HOME": str(home), "PYTHON": sys.executable}
    (dest / "sweep").mkdir(parents=True)
    (dest / "sweep" / "pid").write_text("999999999\n")
    run = ["bash", str(REPO / "gpu" / "run_sweep.sh"), "wait", "0"]
    subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert not (home / "models" / "llama-8b").exists()  # not built: no link
    m8 = dest / "model-llama-3.1-8b"
    m8.mkdir()
    (m8 / "model.safetensors.index.json").write_text("{}")
    subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    link = home / "models" / "llama-8b"
    assert link.is_symlink() and link.resolve() == m8.resolve()


def test_run_sweep_stop_ends_the_sweeps_process_group(tmp_path):
    """`run_sweep.sh stop` ends the detached job's whole process group (a stand-in sweep: a sleeping shell in a
    session of its own) and says so; the caller's own shell survives (a `pkill -f` on a typed pattern would not)."""
    dest = tmp_path / "rt"
    (dest / "sweep").mkdir(parents=True)
    job = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    (dest / "sweep" / "pid").write_text(f"{job.pid}\n")
    env = {**os.environ, "DEST": str(dest), "TUNELAB_HOME": str(tmp_path / "home"), "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(REPO / "gpu" / "run_sweep.sh"), "stop"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "SWEEP STOPPED" in out.stdout, out.stdout + out.stderr
    assert job.wait(timeout=10) is not None


def test_run_sweep_wait_collects_what_finished_when_out_is_set(tmp_path):
    """A machine can be given back between two calls: `wait` with OUT set packs what has finished so far into
    $OUT/evidence.tar.gz (the sweep log here); without OUT it leaves nothing behind, as before."""
    import tarfile
    dest, out = tmp_path / "rt", tmp_path / "out"
    (dest / "sweep").mkdir(parents=True)
    (dest / "sweep" / "pid").write_text("999999999\n")  # no such process: the sweep has ended
    (dest / "sweep" / "sweep.log").write_text("trial 1/6 anchor: ok\n")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(DEST=str(dest), TUNELAB_HOME=str(tmp_path / "home"), PYTHON=sys.executable, RESULTS="0")
    run = ["bash", str(REPO / "gpu" / "run_sweep.sh"), "wait", "0"]
    r = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert "SWEEP DONE" in r.stdout and not out.exists()
    out.mkdir()
    r = subprocess.run(run, env={**env, "OUT": str(out)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with tarfile.open(out / "evidence.tar.gz") as tar:
        names = tar.getnames()
        log = tar.extractfile("evidence/sweep.log").read().decode()
    assert "evidence/sweep.log" in names and "trial 1/6 anchor: ok" in log
