"""Cross-check on the real CPU runtime: tunelab's load generator and `vllm bench serve` on the same server.

Boots one real ``vllm serve`` (tasks.engine.EngineServer, runtime ``cpu``, the tiny local model,
``--max-model-len 2048``), then for each concurrency level runs, back to back on that server:
tunelab (A), ``vllm bench serve`` (B), tunelab again (A'), with the same workload (random-word prompts of
exactly ``--input-len`` tokens, ``--output-len`` tokens with ignore_eos, ``--num-prompts`` requests), and
compares p50/p99 TTFT, TPOT, ITL, E2EL and output tokens/s.

Agreement rule (stated in docs/measurement.md, where the justification is):

* p50 of TTFT, TPOT, ITL, E2EL: |ours - vllm| <= max(10 % of vllm's, 1 ms, 2 x |A - A'|);
* p99 of the same: |ours - vllm| <= max(25 % of vllm's, 3 ms, 2 x |A - A'|);
* output tokens/s: within max(10 %, 2 x |A - A'| relative).

``ours`` is the mean of A and A' (they bracket B in time, so a slow drift of the shared box cancels to
first order); |A - A'| is our own run-to-run spread on this box, measured in the same run.

It also checks that every prompt tunelab sent had exactly ``--input-len`` tokens as the server counted them
(``usage.prompt_tokens`` minus the special tokens the server adds, measured on a 1-word prompt).

Usage:
    .venv/bin/python benchmarks/crosscheck_vllm_bench.py [--runtime cpu] [--runtime-dir .tunelab/runtimes/cpu]
        [--model .tunelab/models/tiny-llama] [--levels 1,4] [--input-len 256] [--output-len 64] [--num-prompts 32]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tasks import metrics as M  # noqa: E402
from tasks.engine import EngineServer  # noqa: E402
from tasks.loadgen import PromptBuilder, make_client, run_level  # noqa: E402
from tunelab.runtime import load_runtime  # noqa: E402

__all__ = ["main", "agreement"]

METRICS = ("ttft", "tpot", "itl", "e2el")


async def _ours(base_url: str, key: str, model: str, c: int, n: int, in_len: int, out_len: int, seed: int) -> dict:
    async with make_client(base_url, key, c + 8) as client:
        b = PromptBuilder(client, model, verify="all")
        t0 = time.perf_counter()
        prompts = await b.many(n, in_len, random.Random(seed))
        build_s = time.perf_counter() - t0
        warm = await b.many(min(c, 4), in_len, random.Random(seed + 10_000))
        await run_level(client, model, warm, out_len, "concurrency", min(c, 4))
        res = await run_level(client, model, prompts, out_len, "concurrency", c)
        probe = await run_level(client, model, ["Hello"], 1, "concurrency", 1)
        hello_tokens = await b.count("Hello")
    rows = [M.derive_request({**r, "workload": "x", "load_kind": "concurrency", "load_value": float(c), "repeat": 0,
                              "request_index": i, "requested_output_tokens": out_len, "ignore_eos": True})
            for i, r in enumerate(res.records)]
    agg = M.aggregate(pd.DataFrame(rows), None, client_cpu_frac=res.client_cpu_frac, target=c)
    special = (probe.records[0]["prompt_tokens"] or 0) - hello_tokens
    lens = {int(r["prompt_tokens"]) - special for r in res.records if r["prompt_tokens"] is not None}
    out = {f"{m}_p{q}_ms": float("nan") if agg[f"{m}_p{q}_s"] is None else agg[f"{m}_p{q}_s"] * 1e3
           for m in METRICS for q in (50, 99)}
    out.update(output_tokens_per_s=agg["output_tokens_per_s"], completed=agg["completed"], failed=agg["failed"],
               client_cpu_frac=res.client_cpu_frac, client_bound=agg["client_bound"], prompt_lengths=sorted(lens),
               prompt_build_s=build_s, tokenize_calls=b.stats["tokenize_calls"], adjusted=b.stats["adjusted"],
               special_tokens=special)
    return out


def _vllm_bench(rt, base_url: str, key: str, model: str, tokenizer: Path, c: int, n: int,
                in_len: int, out_len: int, workdir: Path, seed: int) -> dict:
    name = f"vb-c{c}.json"
    # The runtime's own interpreter and env (a venv on CPU, host python + PYTHONPATH for an offline GPU bundle).
    argv = [*rt.bench_command(),
            "--backend", "vllm", "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(in_len), "--random-output-len", str(out_len),
            "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
            "--save-result", "--result-dir", str(workdir), "--result-filename", name]
    env = rt.launch_env({"OPENAI_API_KEY": key})
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    r = json.loads((workdir / name).read_text())
    out = {f"{m}_p{q}_ms": float(r[f"p{q}_{m}_ms"]) for m in METRICS for q in (50, 99)}
    out.update(output_tokens_per_s=float(r["output_throughput"]), completed=r["completed"], failed=r["failed"])
    return out


def agreement(a: dict, a2: dict, v: dict) -> list[dict]:
    """Per metric: ours (mean of A and A'), vllm's, the difference, the tolerance, and whether it holds."""
    rows = []
    for m in METRICS:
        for q, rel, floor in ((50, 0.10, 1.0), (99, 0.25, 3.0)):
            k = f"{m}_p{q}_ms"
            ours = (a[k] + a2[k]) / 2
            spread = abs(a[k] - a2[k])
            tol = max(rel * v[k], floor, 2 * spread)
            rows.append({"metric": k, "tunelab_A": a[k], "vllm_bench": v[k], "tunelab_A2": a2[k], "diff": ours - v[k],
                         "tolerance": tol, "agree": abs(ours - v[k]) <= tol})
    k = "output_tokens_per_s"
    ours = (a[k] + a2[k]) / 2
    tol = max(0.10 * v[k], 2 * abs(a[k] - a2[k]))
    rows.append({"metric": k, "tunelab_A": a[k], "vllm_bench": v[k], "tunelab_A2": a2[k], "diff": ours - v[k],
                 "tolerance": tol, "agree": abs(ours - v[k]) <= tol})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Boot, measure, compare, print; returns 0 when everything agrees, 1 otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--runtime-dir", type=Path, default=Path(".tunelab/runtimes/cpu"))
    ap.add_argument("--model", type=Path, default=Path(".tunelab/models/tiny-llama"))
    ap.add_argument("--serve-args", default="--max-model-len 2048")
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    rt = load_runtime(a.runtime)
    started = dt.datetime.now(dt.timezone.utc)
    all_rows: list[dict] = []
    health: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tl-xcheck-") as td:
        server = EngineServer(runtime=rt, model=str(a.model.resolve()), serve_args=a.serve_args.split(), env={},
                              log_path=Path(td) / "server.log", boot_timeout_s=900, trial_id="crosscheck")
        with server:
            print(f"server up in {server.boot.boot_s:.1f} s at {server.base_url} (vLLM {rt.vllm_version})", flush=True)
            for c in [int(x) for x in a.levels.split(",") if x]:
                args = (server.base_url, server.api_key, server.served_model_name, c, a.num_prompts, a.input_len,
                        a.output_len)
                A = asyncio.run(_ours(*args, seed=1000 + c))
                print(f"c={c} tunelab A done", flush=True)
                V = _vllm_bench(rt, server.base_url, server.api_key, server.served_model_name,
                                a.model, c, a.num_prompts, a.input_len, a.output_len, Path(td), seed=c)
                print(f"c={c} vllm bench done", flush=True)
                A2 = asyncio.run(_ours(*args, seed=2000 + c))
                print(f"c={c} tunelab A' done", flush=True)
                for r in agreement(A, A2, V):
                    all_rows.append({"concurrency": c, **r})
                health.append({"concurrency": c, "loadavg_1min": round(os.getloadavg()[0], 2), **{k: A[k] for k in ("completed", "failed", "client_cpu_frac",
                              "client_bound", "prompt_lengths", "prompt_build_s", "tokenize_calls", "adjusted",
                              "special_tokens")}, "vllm_completed": V["completed"], "vllm_failed": V["failed"]})
    df = pd.DataFrame(all_rows)
    print()
    print(f"Cross-check, {started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPU cores, vLLM {rt.vllm_version}, "
          f"model {a.model.name}, {a.input_len} in / {a.output_len} out tokens, {a.num_prompts} requests per run")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print()
    for h in health:
        print(h)
    ok = bool(df["agree"].all()) and all(h["prompt_lengths"] == [a.input_len] for h in health)
    print("\nALL AGREE" if ok else "\nDISAGREEMENT (see rows with agree=False)")
    if a.json:
        a.json.write_text(json.dumps({"rows": all_rows, "health": health}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
