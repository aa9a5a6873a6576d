"""Cross-check on the real CPU runtime: tunelab's load generator and `vllm bench serve` on the same server.

Boots one real ``vllm serve`` (tasks.engine.EngineServer, runtime ``cpu``, the tiny local model,
``--max-model-len 2048 --no-enable-prefix-caching``). For each concurrency level it runs many short rounds of
the same workload, alternating the two clients in ABBA blocks: tunelab (A), ``vllm bench serve`` (B), B, A,
then the next block. Every round: ``--num-prompts`` fresh prompts of exactly ``--input-len`` tokens,
``--output-len`` tokens with ignore_eos, greedy, at a fixed concurrency, after the same warm-up for both
clients (``--num-warmups`` = concurrency requests of the same shape, at that concurrency).

Per round each client gives its p50 (and p99) of TTFT, TPOT, ITL, E2EL and its output tokens/s. The
comparison is paired: round i of tunelab with the vllm bench round next to it in time, as the relative
difference (ours - vllm) / vllm. Within a block the order alternates (A B | B A), so a linear drift of the
shared machine cancels in the mean. The 95 % confidence interval of the mean relative difference (t
interval over the pairs) is then checked against a tolerance stated in advance (TOLERANCES below; the
justification is in docs/measurement.md):

* **agree**: the whole CI lies inside [-tol, +tol] (an equivalence check);
* **differ**: the whole CI lies outside it;
* **inconclusive**: otherwise (too noisy to tell, with this many rounds on this machine).

A control says what "no difference" looks like on this machine in the same run: tunelab's rounds split into
two interleaved halves (the earlier A of a block goes to one half in odd blocks and to the other in even
blocks, so linear drift cancels there too), compared with the same statistic and tolerance; likewise
vllm bench against itself (its two adjacent B rounds of each block).

Two diagnostics use the server's own ``/metrics`` histograms, scraped before and after every round: the
server's means under tunelab vs under vllm bench (did the server itself behave differently for the two
clients?), and the paired comparison after dividing each round's client value by the server's mean of that
round (the machine's speed in that round drops out, what is left is the clients' difference).

``vllm bench serve`` runs by default in one long-lived process of the runtime's interpreter, through vLLM's
own CLI entry function with the same argv, once per round (``--bench-process persistent``): its imports take
about 9 s on 2 cores, and paid between two compared rounds they would put 9 s of drift into every pair.
``--bench-process fresh`` runs the CLI as a new process per round. Either way its numbers come from its
result file, which covers only its measured window.

The p50 rows and output tokens/s decide the exit code; the p99 rows are printed with a verdict against their
own tolerance but do not gate (a p99 of a few dozen requests is close to the maximum).

It also checks that every prompt tunelab sent had exactly ``--input-len`` tokens as the server counted them
(``usage.prompt_tokens`` minus the special tokens the server adds, measured on a 1-word prompt), and reports
the lengths the server counted for vllm bench's prompts (``--save-detailed``'s ``input_lens``).

Exit code 0 when every gated metric agrees at every level, every request of both clients completed (a request
whose tokens all decode to empty text is failed ``no_text`` by tunelab's definition and only reported) and
every tunelab prompt was exact; 1 otherwise ("inconclusive" is not "agree").

Usage:
    .venv/bin/python benchmarks/crosscheck_vllm_bench.py [--runtime cpu] [--model DIR] [--levels 1,4,8]
        [--blocks 8] [--input-len 256] [--output-len 64] [--num-prompts 16,32,48]
        [--bench-process persistent|fresh] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from tunelab.tasks import metrics as M  # noqa: E402
from tunelab.tasks import server_metrics as SM  # noqa: E402
from tunelab.tasks.engine import EngineServer  # noqa: E402
from tunelab.tasks.loadgen import PromptBuilder, make_client, run_level  # noqa: E402
from tunelab.host import paths  # noqa: E402
from tunelab.host.runtime import load_runtime  # noqa: E402

__all__ = ["main", "agreement", "verdict", "tolerance", "relative_diffs", "control_halves", "schedule",
           "TOLERANCES", "GATED"]

LATENCIES = ("ttft", "tpot", "itl", "e2el")
#: metric -> (relative tolerance, absolute floor in the metric's unit or None). The tolerance for a level is
#: max(rel, floor / median of vllm bench's rounds), i.e. a relative band that is never narrower than the floor.
TOLERANCES: dict[str, tuple[float, float | None]] = {
    "ttft_p50_ms": (0.10, 2.0),
    "tpot_p50_ms": (0.05, 0.1),
    "itl_p50_ms": (0.10, 0.3),
    "e2el_p50_ms": (0.05, 2.0),
    "output_tokens_per_s": (0.05, None),
    "ttft_p99_ms": (0.25, 3.0),
    "tpot_p99_ms": (0.25, 0.5),
    "itl_p99_ms": (0.25, 3.0),
    "e2el_p99_ms": (0.25, 3.0),
}
#: The metrics whose verdicts decide the exit code.
GATED = ("ttft_p50_ms", "tpot_p50_ms", "itl_p50_ms", "e2el_p50_ms", "output_tokens_per_s")


# --------------------------------------------------------------------------- statistics (pure)


def schedule(blocks: int) -> str:
    """Order of the rounds of one level: ``'ABBA'`` repeated ``blocks`` times (A = tunelab, B = vllm bench)."""
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    return "ABBA" * blocks


def relative_diffs(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Per pair, (ours - theirs) / theirs; a pair with a missing value or theirs <= 0 is left out."""
    if len(ours) != len(theirs):
        raise ValueError(f"paired samples differ in length: {len(ours)} vs {len(theirs)}")
    out = []
    for o, t in zip(ours, theirs):
        if o is None or t is None or not math.isfinite(o) or not math.isfinite(t) or t <= 0:
            continue
        out.append((o - t) / t)
    return out


def tolerance(metric: str, reference: Sequence[float]) -> float:
    """The relative tolerance of ``metric`` for a level: max(rel, floor / median(reference)) (TOLERANCES)."""
    rel, floor = TOLERANCES[metric]
    ref = [x for x in reference if x is not None and math.isfinite(x) and x > 0]
    if floor is None or not ref:
        return rel
    return max(rel, floor / statistics.median(ref))


def verdict(lo: float, hi: float, tol: float) -> str:
    """Equivalence verdict of a confidence interval [lo, hi] against the band [-tol, +tol]:
    'agree' (CI inside the band), 'differ' (CI entirely outside it), else 'inconclusive'."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if -tol <= lo and hi <= tol:
        return "agree"
    if hi < -tol or lo > tol:
        return "differ"
    return "inconclusive"


def agreement(ours: Sequence[float], theirs: Sequence[float], tol: float, conf: float = 0.95) -> dict[str, Any]:
    """Paired comparison of two clients' per-round values of one metric.

    Args:
        ours, theirs: per-round values, paired by position (round i of one with round i of the other).
        tol: relative tolerance (0.05 = 5 %).
        conf: confidence level of the t interval.

    Returns:
        dict: ``n`` (pairs used), ``mean`` (mean relative difference (ours - theirs) / theirs), ``sd``,
        ``lo``/``hi`` (the ``conf`` t interval of the mean; NaN with fewer than 2 pairs), ``tol`` and
        ``verdict`` (see :func:`verdict`).
    """
    d = relative_diffs(ours, theirs)
    n = len(d)
    mean = float(np.mean(d)) if n else math.nan
    sd = float(np.std(d, ddof=1)) if n >= 2 else math.nan
    if n >= 2:
        half = float(stats.t.ppf(0.5 + conf / 2, n - 1)) * sd / math.sqrt(n)
        lo, hi = mean - half, mean + half
    else:
        lo = hi = math.nan
    return {"n": n, "mean": mean, "sd": sd, "lo": lo, "hi": hi, "tol": tol, "verdict": verdict(lo, hi, tol)}


def control_halves(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Split one client's rounds (time order, two per ABBA block) into two interleaved halves for an
    A-vs-A control: of block k's two rounds, the earlier goes to the first half when k is even and to the
    second when k is odd, so a linear drift cancels over each two blocks. Returns (first half, second half),
    paired by block."""
    if len(values) % 2:
        raise ValueError(f"need two rounds per block, got {len(values)} rounds")
    x, y = [], []
    for k in range(len(values) // 2):
        early, late = values[2 * k], values[2 * k + 1]
        if k % 2 == 0:
            x.append(early)
            y.append(late)
        else:
            x.append(late)
            y.append(early)
    return x, y


# --------------------------------------------------------------------------- the two clients


def _bench_features(rt) -> dict[str, bool]:
    """Which ``vllm bench serve`` flags this runtime's vLLM has, read from its source (no import, no process)."""
    roots = [Path(p) for p in rt.pythonpath]
    roots += sorted(Path(rt.python).parent.parent.glob("lib/python3*/site-packages"))
    text = ""
    for root in roots:
        for rel in ("vllm/benchmarks/serve.py", "vllm/benchmarks/datasets/datasets.py", "vllm/benchmarks/datasets.py"):
            f = root / rel
            if f.is_file():
                text += f.read_text(errors="replace")
        if text:
            break
    flags = ("--num-warmups", "--temperature", "--save-detailed", "--ready-check-timeout-sec", "--random-range-ratio")
    return {f: f'"{f}"' in text for f in flags}


async def _ours(base_url: str, key: str, model: str, c: int, n: int, in_len: int, out_len: int, seed: int,
                warmups: int, initial_test: bool, special: int) -> dict:
    cpu0 = time.process_time()
    async with make_client(base_url, key, c + 8) as client:
        b = PromptBuilder(client, model, verify="all")
        prompts = await b.many(n, in_len, random.Random(seed))
        warm = await b.many(warmups + int(initial_test), in_len, random.Random(seed + 500_000))
        before = SM.snapshot((await client.get("/metrics")).text)
        # The same warm-up as vllm bench gets: its initial test request (older vLLM) alone, then its
        # --num-warmups requests at the level's concurrency.
        if initial_test:
            await run_level(client, model, warm[:1], out_len, "concurrency", 1)
        if warmups:
            await run_level(client, model, warm[int(initial_test):], out_len, "concurrency", c)
        res = await run_level(client, model, prompts, out_len, "concurrency", c)
        after = SM.snapshot((await client.get("/metrics")).text)
    cpu = time.process_time() - cpu0
    rows = [M.derive_request({**r, "workload": "x", "load_kind": "concurrency", "load_value": float(c), "repeat": 0,
                              "request_index": i, "requested_output_tokens": out_len, "ignore_eos": True})
            for i, r in enumerate(res.records)]
    df = pd.DataFrame(rows)
    # Whole window, as vllm bench serve counts it (tunelab's sweeps count the steady part only).
    agg = M.aggregate(df, None, client_cpu_frac=res.client_cpu_frac, target=c, steady_state=False)
    out: dict[str, Any] = {f"{m}_p{q}_ms": math.nan if agg[f"{m}_p{q}_s"] is None else agg[f"{m}_p{q}_s"] * 1e3
                           for m in LATENCIES for q in (50, 99)}
    gaps = M.itl_values(df)
    ok = df[df["ok"]]
    out.update(output_tokens_per_s=agg["output_tokens_per_s"] or math.nan, completed=agg["completed"],
               failed=agg["failed"], client_cpu_frac=res.client_cpu_frac, rx_stamps=res.rx_stamps,
               read_delay_p99_ms=math.nan if res.read_delay_p99_s is None else res.read_delay_p99_s * 1e3,
               prompt_lengths=sorted({int(r["prompt_tokens"]) - special for r in res.records
                                      if r["prompt_tokens"] is not None}),
               prompts_verified=b.stats["verified"], prompts_adjusted=b.stats["adjusted"],
               chunks_per_request=float(np.mean([len(x) for x in ok["chunk_offsets_s"]])) if len(ok) else math.nan,
               tokens_per_request=float(ok["output_tokens"].mean()) if len(ok) else math.nan,
               zero_gap_frac=float(np.mean(gaps == 0)) if gaps.size else math.nan,
               errors=sorted({f"{e[:160]} ({t} tokens, finish_reason {f})" for e, t, f
                              in zip(df["error"], df["output_tokens"], df["finish_reason"]) if isinstance(e, str)}),
               client_cpu_s=cpu, **_server_side(before, after))
    return out


def _server_side(before: SM.Snapshot, after: SM.Snapshot) -> dict[str, float]:
    """The server's own means (ms) over a round (its warm-up requests included), from /metrics histograms."""
    rows = {r["metric"]: r["value"] for r in SM.window_rows(before, after, {})}
    return {f"server_{m}_mean_ms": math.nan if rows.get(f"server_{m}") is None else rows[f"server_{m}"] * 1e3
            for m in LATENCIES}


def _scrape(base_url: str, key: str) -> SM.Snapshot:
    r = httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    return SM.snapshot(r.text)


# The runtime's interpreter runs `vllm bench serve` through vLLM's own CLI entry function, with the same argv,
# once per line of stdin (a JSON argv list), and answers on the file descriptor given as its argument. Its
# imports (about 9 s on 2 cores) are paid once, not between two rounds that are compared.
_DRIVER = r'''
import json, os, sys
reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
import vllm.benchmarks.serve, vllm.entrypoints.cli.benchmark.main
from vllm.entrypoints.cli.main import main
reply.write("ready\n")
for line in sys.stdin:
    sys.argv = ["vllm", "bench", "serve", *json.loads(line)]
    try:
        main()
        reply.write("ok\n")
    except BaseException as e:
        reply.write("error " + json.dumps(f"{type(e).__name__}: {e}") + "\n")
'''


class BenchRunner:
    """Runs ``vllm bench serve`` with a given argv: in one long-lived process of the runtime's interpreter
    (``persistent``, through vLLM's CLI entry function) or as a fresh CLI process per round (``fresh``).
    Either way the numbers come from its result file, so start-up is outside its measured window."""

    def __init__(self, rt, env: dict[str, str], log_path: Path, mode: str) -> None:
        if mode not in ("persistent", "fresh"):
            raise ValueError(f"bench process mode must be 'persistent' or 'fresh', got {mode!r}")
        self.rt, self.env, self.log_path, self.mode = rt, env, log_path, mode
        self.proc: subprocess.Popen | None = None
        if mode == "persistent":
            r, w = os.pipe()
            self._log = open(log_path, "ab")
            self.proc = subprocess.Popen([rt.python, "-c", _DRIVER, str(w)], stdin=subprocess.PIPE, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=env, pass_fds=(w,), text=True)
            os.close(w)
            self._reply = os.fdopen(r, "r")
            self._expect("ready")

    def _expect(self, what: str) -> None:
        line = self._reply.readline().strip()
        if line != what:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise RuntimeError(f"vllm bench serve driver: expected {what!r}, got {line or 'EOF'!r}\n{tail}")

    def cpu_s(self) -> float:
        """CPU seconds used so far by the vllm bench process(es): the persistent one's (from /proc), or all
        finished children's (fresh processes)."""
        if self.proc is None:
            ru = resource.getrusage(resource.RUSAGE_CHILDREN)
            return ru.ru_utime + ru.ru_stime
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self, argv: list[str]) -> None:
        if self.proc is None:
            p = subprocess.run([*self.rt.bench_command(), *argv], capture_output=True, text=True, env=self.env,
                               timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"vllm bench serve failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        self._expect("ok")

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._reply.close()
        self._log.close()


def _vllm_bench(runner: BenchRunner, feats: dict[str, bool], base_url: str, key: str, model: str, tokenizer: Path,
                c: int, n: int, in_len: int, out_len: int, warmups: int, workdir: Path, seed: int) -> dict:
    name = f"vb-c{c}-s{seed}.json"
    argv = ["--backend", "vllm", "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(in_len), "--random-output-len", str(out_len),
            "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
            "--save-result", "--result-dir", str(workdir), "--result-filename", name]
    if feats["--random-range-ratio"]:
        argv += ["--random-range-ratio", "0"]  # fixed lengths (0 is also the default)
    if feats["--temperature"]:
        argv += ["--temperature", "0"]  # greedy, as tunelab (newer vLLM no longer defaults to it)
    if feats["--num-warmups"]:
        argv += ["--num-warmups", str(warmups)]
    if feats["--ready-check-timeout-sec"]:
        argv += ["--ready-check-timeout-sec", "0"]  # no initial test request (tunelab's warm-up has none then)
    if feats["--save-detailed"]:
        argv += ["--save-detailed"]
    before = _scrape(base_url, key)
    t0 = time.perf_counter()
    cpu0 = runner.cpu_s()
    runner.run(argv)
    cpu = runner.cpu_s() - cpu0
    wall = time.perf_counter() - t0
    after = _scrape(base_url, key)
    r = json.loads((workdir / name).read_text())
    out: dict[str, Any] = {f"{m}_p{q}_ms": float(r[f"p{q}_{m}_ms"]) for m in LATENCIES for q in (50, 99)}
    out.update(output_tokens_per_s=float(r["output_throughput"]), completed=r["completed"], failed=r["failed"],
               duration_s=float(r["duration"]), process_wall_s=wall, client_cpu_s=cpu,
               **_server_side(before, after))
    if "input_lens" in r:
        out["prompt_lengths"] = sorted(set(int(x) for x in r["input_lens"]))
    if "itls" in r:
        out["chunks_per_request"] = float(np.mean([len(x) + 1 for x in r["itls"]]))
    if "errors" in r:
        out["errors"] = sorted({str(e)[:200] for e in r["errors"] if isinstance(e, str) and e})
    return out


# --------------------------------------------------------------------------- report


def _pct(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def _ci(c: dict) -> str:
    if not math.isfinite(c["lo"]):
        return "-"
    return f"[{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]%"


def _server_key(metric: str) -> str:
    """The server's own window mean that tracks ``metric`` (for throughput: TPOT, used as its inverse)."""
    return "server_tpot_mean_ms" if metric == "output_tokens_per_s" else f"server_{metric.split('_')[0]}_mean_ms"


def _adjusted(runs: list[dict], metric: str) -> list[float]:
    """Per round, the client's value divided by the server's own mean of the same round (multiplied, for
    throughput), so that the machine's speed in that round drops out."""
    k = _server_key(metric)
    if metric == "output_tokens_per_s":
        return [r[metric] * r[k] for r in runs]
    return [r[metric] / r[k] if r[k] and math.isfinite(r[k]) else math.nan for r in runs]


def compare_level(a_runs: list[dict], b_runs: list[dict]) -> list[dict]:
    """One row per metric (TOLERANCES): medians over rounds, the paired comparison tunelab vs vllm bench
    (the verdict), the A-vs-A controls of both clients, and two diagnostics: the same comparison after dividing
    each round by the server's own /metrics mean of that round (``adj_``), and the server's own means under
    tunelab vs under vllm bench (``server_``: did the server behave differently for the two clients?)."""
    rows = []
    for m in TOLERANCES:
        a = [r[m] for r in a_runs]
        b = [r[m] for r in b_runs]
        tol = tolerance(m, b)
        parts = {"cross": agreement(a, b, tol),
                 "ctl_tunelab": agreement(*control_halves(a), tol),
                 "ctl_vllm": agreement(*control_halves(b), tol),
                 "adj": agreement(_adjusted(a_runs, m), _adjusted(b_runs, m), tol),
                 "server": agreement([r[_server_key(m)] for r in a_runs], [r[_server_key(m)] for r in b_runs], tol)}
        row = {"metric": m, "gated": m in GATED, "tol": tol,
               "tunelab_median": float(np.nanmedian(a)), "vllm_median": float(np.nanmedian(b))}
        for name, res in parts.items():
            row.update({f"{name}_{k}": v for k, v in res.items() if k != "tol"})
        rows.append(row)
    return rows


def _part(row: dict, name: str) -> dict:
    return {k: row[f"{name}_{k}"] for k in ("n", "mean", "sd", "lo", "hi", "verdict")}


def _table(rows: list[dict]) -> str:
    out = ["| metric | tol | tunelab med | vllm med | mean diff | 95% CI | verdict | A-vs-A CI | A-vs-A | "
           "B-vs-B CI | server-adjusted CI | server: A-vs-B CI |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cross, ca, cb, adj, srv = (_part(r, n) for n in ("cross", "ctl_tunelab", "ctl_vllm", "adj", "server"))
        name = r["metric"] + ("" if r["gated"] else " (info)")
        out.append(f"| {name} | ±{100 * r['tol']:.1f}% | {r['tunelab_median']:.2f} | {r['vllm_median']:.2f} | "
                   f"{_pct(cross['mean'])} | {_ci(cross)} | **{cross['verdict']}** | {_ci(ca)} | {ca['verdict']} | "
                   f"{_ci(cb)} | {_ci(adj)} {adj['verdict']} | {_ci(srv)} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    """Boot, measure, compare, print; returns 0 when every gated metric agrees, 1 otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--model", type=Path, default=None, help="model folder (default: the tunelab home's "
                    "models/tiny-llama)")
    ap.add_argument("--serve-args", default="--max-model-len 2048 --no-enable-prefix-caching")
    ap.add_argument("--levels", default="1,4,8", help="concurrency levels, comma-separated")
    ap.add_argument("--blocks", type=int, default=8, help="ABBA blocks per level (even: the controls cancel drift)")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-prompts", default="16,32,48", help="requests per round, per level (the last repeats)")
    ap.add_argument("--bench-process", choices=("persistent", "fresh"), default="persistent",
                    help="vllm bench serve in one long-lived process (default) or a fresh CLI process per round")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    levels = _ints(a.levels)
    nps = _ints(a.num_prompts)
    model = (a.model or paths.models_dir() / "tiny-llama").resolve()
    rt = load_runtime(a.runtime)
    feats = _bench_features(rt)
    initial_test = not feats["--ready-check-timeout-sec"]  # older vllm bench always sends one test request
    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    runs: list[dict] = []
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tl-xcheck-") as td:
        server = EngineServer(runtime=rt, model=str(model), serve_args=a.serve_args.split(), env={},
                              log_path=Path(td) / "server.log", boot_timeout_s=900, trial_id="crosscheck")
        with server:
            base, key, name = server.base_url, server.api_key, server.served_model_name
            print(f"server up in {server.boot.boot_s:.1f} s at {base} (vLLM {rt.vllm_version}); "
                  f"vllm bench flags: {feats}", flush=True)

            async def special_tokens() -> int:
                async with make_client(base, key, 2) as client:
                    probe = await run_level(client, name, ["Hello"], 1, "concurrency", 1)
                    return (probe.records[0]["prompt_tokens"] or 0) - await PromptBuilder(client, name).count("Hello")

            special = asyncio.run(special_tokens())
            runner = BenchRunner(rt, rt.launch_env({"OPENAI_API_KEY": key}), Path(td) / "vllm-bench.log",
                                 a.bench_process)
            try:
                for li, c in enumerate(levels):
                    n = nps[min(li, len(nps) - 1)]
                    warmups = c if feats["--num-warmups"] else 0
                    # An unmeasured round first, so the level starts on a warm server at this concurrency.
                    asyncio.run(_ours(base, key, name, c, 2 * c, a.input_len, a.output_len, seed=900_000 + c,
                                      warmups=0, initial_test=False, special=special))
                    a_runs: list[dict] = []
                    b_runs: list[dict] = []
                    for i, tool in enumerate(schedule(a.blocks)):
                        load = os.getloadavg()[0]
                        t0 = time.perf_counter()
                        if tool == "A":
                            seed = 10_000 * c + len(a_runs)
                            r = asyncio.run(_ours(base, key, name, c, n, a.input_len, a.output_len, seed=seed,
                                                  warmups=warmups, initial_test=initial_test, special=special))
                            a_runs.append(r)
                        else:
                            seed = 20_000 * c + len(b_runs)
                            r = _vllm_bench(runner, feats, base, key, name, model, c, n, a.input_len, a.output_len,
                                            warmups, Path(td), seed=seed)
                            b_runs.append(r)
                        r.update(concurrency=c, position=i, client="tunelab" if tool == "A" else "vllm_bench",
                                 seed=seed, loadavg_1min=round(load, 2), round_s=round(time.perf_counter() - t0, 2),
                                 t_offset_s=round(t0 - t_start, 1))
                        runs.append(r)
                        print(f"c={c} round {i + 1}/{4 * a.blocks} {r['client']}: TTFT p50 {r['ttft_p50_ms']:.1f} "
                              f"ms, TPOT p50 {r['tpot_p50_ms']:.2f} ms, {r['output_tokens_per_s']:.0f} tok/s, "
                              f"load {load:.2f}, {r['round_s']:.1f} s", flush=True)
                    for row in compare_level(a_runs, b_runs):
                        results.append({"concurrency": c, **row})
            finally:
                runner.close()
    elapsed = time.perf_counter() - t_start
    load_end = os.getloadavg()

    print()
    print(f"Cross-check, {started:%Y-%m-%d %H:%M} UTC, {elapsed / 60:.1f} min, {os.cpu_count()} CPU cores, "
          f"vLLM {rt.vllm_version}, model {model.name}, {a.input_len} in / {a.output_len} out tokens, "
          f"{a.blocks} ABBA blocks per level, vllm bench process {a.bench_process}; load average (1/5/15 min) at start "
          f"{'/'.join(f'{x:.2f}' for x in load_start)}, at end {'/'.join(f'{x:.2f}' for x in load_end)}")
    ok = True
    for li, c in enumerate(levels):
        lr = [r for r in results if r["concurrency"] == c]
        lrun = [r for r in runs if r["concurrency"] == c]
        ta = [r for r in lrun if r["client"] == "tunelab"]
        tb = [r for r in lrun if r["client"] == "vllm_bench"]
        loads = [r["loadavg_1min"] for r in lrun]
        print(f"\nconcurrency {c}: {nps[min(li, len(nps) - 1)]} requests per round, {len(ta)} tunelab + {len(tb)} "
              f"vllm bench rounds; load average (1 min) {min(loads):.2f} to {max(loads):.2f}")
        print(_table(lr))
        lens_a = sorted({x for r in ta for x in r["prompt_lengths"]})
        lens_b = sorted({x for r in tb for x in r.get("prompt_lengths", [])})
        failed = sum(r["failed"] for r in lrun)
        print(f"tunelab: prompt lengths as counted by the server {lens_a} (special tokens {special}), "
              f"{sum(r['prompts_verified'] for r in ta)} verified with /tokenize, "
              f"{sum(r['prompts_adjusted'] for r in ta)} adjusted; "
              f"content chunks per request {np.mean([r['chunks_per_request'] for r in ta]):.1f} for "
              f"{np.mean([r['tokens_per_request'] for r in ta]):.1f} tokens; zero ITL gaps "
              f"{100 * np.nanmean([r['zero_gap_frac'] for r in ta]):.1f}%; client CPU "
              f"{max(r['client_cpu_frac'] for r in ta):.2f} max in the window, "
              f"{np.mean([r['client_cpu_s'] for r in ta]):.2f} CPU-s per round (whole round); receive stamps "
              f"{'/'.join(sorted({r['rx_stamps'] for r in ta}))}, read delay p99 (what read-time stamps would have "
              f"added) {np.nanmedian([r['read_delay_p99_ms'] for r in ta]):.2f} ms median over rounds, "
              f"{np.nanmax([r['read_delay_p99_ms'] for r in ta]):.2f} ms max")
        cpr = [r["chunks_per_request"] for r in tb if "chunks_per_request" in r]
        print(f"vllm bench: prompt lengths as counted by the server {lens_b or 'n/a'}; chunks per request "
              f"{np.mean(cpr) if cpr else math.nan:.1f}; wall per round "
              f"{np.mean([r['process_wall_s'] for r in tb]):.1f} s, of which measured window "
              f"{np.mean([r['duration_s'] for r in tb]):.1f} s; {np.mean([r['client_cpu_s'] for r in tb]):.2f} CPU-s "
              f"per round (whole round)")
        errors = sorted({f"{r['client']}: {e}" for r in lrun for e in r.get("errors", [])})
        print(f"failed requests: {failed}" + (f" ({'; '.join(errors)})" if errors else ""))
        # A request whose tokens all decoded to empty text fails in tunelab by definition (no TTFT without text;
        # tunelab/tasks/metrics.py), while vllm bench counts it; that is a model output, not a failed measurement.
        unhealthy = [e for e in errors if "no_text" not in e]
        verdicts = {r["metric"]: r["cross_verdict"] for r in lr if r["gated"]}
        level_ok = all(v == "agree" for v in verdicts.values()) and lens_a == [a.input_len] and not unhealthy
        if failed and not errors:
            level_ok = False
        print(f"verdict at c={c} (gating): " + ", ".join(f"{m} {v}" for m, v in verdicts.items()))
        print(f"server-adjusted at c={c} (not gating): "
              + ", ".join(f"{r['metric']} {r['adj_verdict']}" for r in lr if r["gated"]))
        ok = ok and level_ok
    print("\nALL GATED METRICS AGREE" if ok else "\nNOT ALL GATED METRICS AGREE (see the verdicts above)")
    if a.json:
        a.json.write_text(json.dumps({"settings": {**vars(a), "model": Path(model).name, "vllm": rt.vllm_version,
                                                   "bench_flags": feats, "special_tokens": special},
                                      "started": started.isoformat(), "elapsed_s": elapsed,
                                      "loadavg_start": load_start, "loadavg_end": load_end,
                                      "comparisons": results, "rounds": runs}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
