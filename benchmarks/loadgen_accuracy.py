"""Instrument accuracy of tunelab's load generator against ground truth, side by side with `vllm bench serve`.

Ground truth is the FAKE timed OpenAI server (tests/fakes/timed_openai_server.py; by default its lean
asyncio.Protocol variant, tests/fakes/raw_timed_server.py, ``--fake uvicorn`` for the uvicorn one), run as its
own process:
it streams tokens on a fixed schedule (TTFT 50 ms, one token every 10 ms; a variant with several tokens per
chunk) and logs, for every request, when it had read the request and when it actually handed each chunk to
the transport (perf_counter = CLOCK_MONOTONIC). Errors are measured against what it *did*, so its own
lateness under load does not count against a client.

Per request (and per inter-chunk gap for ITL) the error is ``client's value - true value``:

Emission = the fake's perf_counter stamp taken just before it hands a chunk to the transport (never after
the bytes left; early by its encoding time, tens of microseconds, so the errors below are upper bounds).

* TTFT: true = first content chunk emitted - request *arrived* at the server (the kernel's receive stamp of
  the request's bytes on the fake's socket, ``recv_kernel``). Time the request then waited for the fake's
  busy event loop is the server's latency, not the instrument's: a real server's queue is part of the TTFT
  a user sees, and no client can shorten it. ``TTFT p50 vs read`` gives the error against the fake's read
  of the request instead (the definition of runs before 2026-11-29 15:00; it adds the fake's read lag to
  every client's error). Where the fake has no kernel stamp (the uvicorn fake) both are against the read.
* ITL: true = gaps between the server's emissions of successive content chunks.
* TPOT: each client against the truth of its own definition: tunelab ends E2EL at the last byte
  (``[DONE]``), ``vllm bench serve`` at the last chunk with choices; true TPOT = (that emission - first
  content emission) / (output tokens - 1).
* E2EL: true = that same end emission - request arrived (as TTFT).

The table gives p50 and p99 of |error| in milliseconds. ``req path p50`` splits TTFT's error: the time from
the client's send stamp to the fake reading the request (client write, kernel, and the fake's busy event
loop), the rest of TTFT's error being the response path (fake's write -> client's stamp). Whatever delays the bytes between the server's
write and the client's timestamp (the client's event loop being busy, the kernel, a CPU shared with other
work) is error; the server reading a request late counts too (the fake's own CPU and schedule lateness are
printed so a server-bound row can be told apart). Both clients run against the same fake server in the
same run, level by level, interleaved.

Pinning (``--pin split``, the default on a machine with at least 2 CPUs): the fake runs on the last CPU,
this process (tunelab's event loop, its load processes) and ``vllm bench serve`` on the others, so the two
clients get the same CPUs and neither competes with the fake for its core. ``--pin none`` leaves placement to
the kernel.

``read lag p50`` (lean fake only): how long a request's bytes waited in the fake's socket before its event
loop read them (kernel receive stamp, SO_TIMESTAMPNS, to ``recv``). It is part of ``req path`` and of
``TTFT p50 vs read``, but it is the fake's doing: the client had already written the request.

``rx`` / ``rx delay99``: how tunelab stamped what it received (``kernel``: the kernel's receive time of each
read, tunelab/tasks/rx_stamps.py) and the p99 of (read time - kernel receive time): how late its event loop got to
the bytes, i.e. the error a read-time stamp would have had. ``same read %``: the share of tunelab's
inter-chunk gaps whose two chunks came in one read (the client fell behind a whole ITL; both chunks then
carry the later arrival stamp, see tunelab/tasks/rx_stamps.py).

Client health: ``cpu`` = tunelab's busiest event-loop thread CPU / wall (>= 0.9: client-bound),
``lag99`` = p99 of that loop's wake-up lateness. Rows marked ``client-bound`` have cpu >= 0.9 or did not
reach the requested concurrency; ``client behind`` rows have more than 1 % of their gaps inside one read
while the client read later than a typical gap at least once (tasks.measure.same_read_note, which notes such
a window too).

``--busy-clients N``: N busy-looping processes share the clients' CPUs for the whole run (a stand-in for a
busy machine: the clients' event loops get the CPU late). Kernel receive stamps should keep tunelab's
errors where they were; ``rx delay99`` shows what read-time stamps would have added.

Usage:
    .venv/bin/python benchmarks/loadgen_accuracy.py [--runtime-dir $TUNELAB_HOME/runtimes/cpu]
        [--tokenizer $TUNELAB_HOME/models/tiny-llama] [--levels 1,16,64,256] [--tokens-per-chunk 1,4]
        [--output-tokens 32] [--multi-process-at 256] [--json results.json] [--skip-vllm-bench]
        [--fake raw|uvicorn] [--pin split|none] [--busy-clients N]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "fakes"))

from tunelab.tasks import metrics as M  # noqa: E402
from tunelab.tasks.loadgen import Clock, make_client, run_level  # noqa: E402
from tunelab.tasks.measure import same_read_note  # noqa: E402
from tunelab.host import paths  # noqa: E402
from timed_openai_server import FakeServerProcess, FakeTiming  # noqa: E402

__all__ = ["main", "errors_ours", "errors_vllm_bench"]

MODEL = "fake-model"
_FILLER = "the quick brown fox jumps over the lazy dog " * 4


def _pct(x: list[float] | np.ndarray, q: float) -> float | None:
    a = np.abs(np.asarray(x, dtype=float))
    return float(np.percentile(a, q)) if a.size else None


def _summary(errs: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in errs.items():
        out[f"{k}_p50_ms"] = None if not v else _pct(v, 50) * 1e3
        out[f"{k}_p99_ms"] = None if not v else _pct(v, 99) * 1e3
        out[f"{k}_signed_mean_ms"] = None if not v else float(np.mean(v)) * 1e3
    return out


def _truth(e: dict[str, Any], end: str) -> dict[str, Any]:
    # The moment the fake began handing a chunk to the transport: never after the bytes left (a stamp taken
    # after the write can be late by a preemption), early only by the fake's encoding time (tens of us).
    emit = e["emit_pre"]
    n_tokens = sum(e["chunk_tokens"])
    end_t = e["done_pre"] if end == "done" else emit[-1]
    arrived = e["recv_kernel"] if e.get("recv_kernel") is not None else e["recv"]
    return {
        "ttft": emit[0] - arrived,
        "ttft_read": emit[0] - e["recv"],
        "itl": np.diff(emit),
        "tpot": (end_t - emit[0]) / (n_tokens - 1) if n_tokens > 1 else None,
        "e2el": end_t - arrived,
    }


def _new_errs() -> dict[str, list[float]]:
    return {"ttft": [], "ttft_read": [], "itl": [], "tpot": [], "e2el": [], "req_path": []}


def errors_ours(records: list[dict], prompts: list[str], log: list[dict], output_tokens: int,
                to_perf: Any = None) -> tuple[dict, int]:
    """Per-request errors of tunelab's records (matched to the fake's log by prompt head). Returns
    ({'ttft': [...], 'ttft_read': [...], 'itl': [...], 'tpot': [...], 'e2el': [...], 'req_path': [...]}, number of
    ok requests); ``req_path`` = server read - client send stamp (needs ``to_perf``: the records'
    Clock.to_perf)."""
    by_head = {e["prompt_head"]: e for e in log if e.get("done") is not None}
    errs = _new_errs()
    ok = 0
    for i, (p, raw) in enumerate(zip(prompts, records)):
        e = by_head.get(p[:64])
        row = M.derive_request({**raw, "workload": "acc", "load_kind": "concurrency", "load_value": 1.0,
                                "repeat": 0, "request_index": i, "requested_output_tokens": output_tokens,
                                "ignore_eos": True})
        if e is None or not row["ok"]:
            continue
        ok += 1
        t = _truth(e, "last_chunk")  # tunelab's E2EL/TPOT end at the last token, as vllm bench's
        errs["ttft"].append(row["ttft_s"] - t["ttft"])
        errs["ttft_read"].append(row["ttft_s"] - t["ttft_read"])
        if to_perf is not None:
            errs["req_path"].append(e["recv"] - to_perf(raw["send_ts"]))
        errs["e2el"].append(row["e2el_s"] - t["e2el"])
        if row["tpot_s"] is not None and t["tpot"] is not None:
            errs["tpot"].append(row["tpot_s"] - t["tpot"])
        gaps = np.diff(np.asarray(row["chunk_offsets_s"]))
        if len(gaps) == len(t["itl"]):
            errs["itl"].extend((gaps - t["itl"]).tolist())
    return errs, ok


def errors_vllm_bench(result: dict, log: list[dict]) -> tuple[dict, int]:
    """Per-request errors of a ``vllm bench serve --save-detailed`` result (matched to the fake's log by the
    request id the fake puts in the first token, ``<rid>``)."""
    by_rid = {e["rid"]: e for e in log if e.get("done") is not None}
    errs = _new_errs()
    ok = 0
    for text, ttft, itl, lat, n_out, err, st in zip(result["generated_texts"], result["ttfts"], result["itls"],
                                                    result["latencies"], result["output_lens"], result["errors"],
                                                    result["start_times"]):
        if err or not text or not text.startswith("<"):
            continue
        e = by_rid.get(int(text[1:text.index(">")]))
        if e is None:
            continue
        ok += 1
        t = _truth(e, "last_chunk")
        errs["ttft"].append(ttft - t["ttft"])
        errs["ttft_read"].append(ttft - t["ttft_read"])
        errs["req_path"].append(e["recv"] - st)  # vllm's start_time is its perf_counter: the same clock
        errs["e2el"].append(lat - t["e2el"])
        if n_out and n_out > 1 and t["tpot"] is not None:
            errs["tpot"].append((lat - ttft) / (n_out - 1) - t["tpot"])
        if len(itl) == len(t["itl"]):
            errs["itl"].extend((np.asarray(itl) - t["itl"]).tolist())
    return errs, ok


def _fake_health(log: list[dict], wall_s: float, cpu0: float, cpu1: float) -> dict[str, Any]:
    late = [em - du for e in log for em, du in zip(e["emit_pre"], e["due"])]
    write = [b - a for e in log for a, b in zip(e["emit_pre"], e["emit"])]
    lag = [e["recv"] - e["recv_kernel"] for e in log if e.get("recv_kernel") is not None]
    return {"fake_late_p99_ms": _pct(late, 99) * 1e3 if late else None,
            "fake_read_lag_p50_ms": _pct(lag, 50) * 1e3 if lag else None,
            "truth_write_p50_ms": _pct(write, 50) * 1e3 if write else None,
            "fake_cpu_frac": (cpu1 - cpu0) / wall_s if wall_s > 0 else None}


def _prompts(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i:05d} {_FILLER}" for i in range(n)]


async def _ours(fake: FakeServerProcess, c: int, n: int, out_tokens: int, tag: str, processes: int,
                transport: str) -> dict:
    async with make_client(fake.base_url, "unused", c + 8) as client:
        warm = _prompts(f"{tag}-warm", min(c, 16))
        await run_level(client, MODEL, warm, out_tokens, "concurrency", min(c, 16), transport=transport)
        prompts = _prompts(tag, n)
        fake.reset()
        cpu0 = fake.stats()["cpu_s"]
        t0 = time.perf_counter()
        res = await run_level(client, MODEL, prompts, out_tokens, "concurrency", c, processes=processes,
                              transport=transport)
        wall = time.perf_counter() - t0
    stats = fake.stats()
    log = fake.log()["log"]
    errs, ok = errors_ours(res.records, prompts, log, out_tokens, Clock(res.clock_origin).to_perf)
    name = "tunelab" + ("" if transport == "raw" else f" ({transport})") + (f" x{processes}p" if processes > 1 else "")
    same = res.same_read_itl_frac()
    note = same_read_note(res)
    return {"client": name, "ok": ok, "n": n, "rx_stamps": res.rx_stamps,
            "client_behind": bool(note and "client fell behind" in note),
            "same_read_pct": None if same is None else same * 100,
            "read_delay_p99_ms": None if res.read_delay_p99_s is None else res.read_delay_p99_s * 1e3,
            **_summary(errs), "client_cpu_frac": res.client_cpu_frac, "loop_lag_p99_ms": res.loop_lag_p99_s * 1e3,
            "max_in_flight": stats["max_in_flight"], **_fake_health(log, wall, cpu0, stats["cpu_s"])}


def _vllm_bench(fake: FakeServerProcess, c: int, n: int, out_tokens: int, runtime_dir: Path, tokenizer: Path,
                workdir: Path) -> dict:
    py = runtime_dir / "venv" / "bin" / "python"
    name = f"vb-c{c}-{int(time.time() * 1000)}.json"
    argv = [str(py), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--base-url", fake.base_url, "--model", MODEL, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", str(out_tokens),
            "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(workdir), "--result-filename", name]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    fake.reset()
    cpu0 = fake.stats()["cpu_s"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0  # includes vllm's start-up: fake_cpu_frac is a lower bound here
    if p.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({p.returncode}):\n{p.stderr[-3000:]}")
    result = json.loads((workdir / name).read_text())
    stats = fake.stats()
    log = fake.log()["log"]
    errs, ok = errors_vllm_bench(result, log)
    return {"client": "vllm bench", "ok": ok, "n": n, "rx_stamps": "read", "read_delay_p99_ms": None,
            "same_read_pct": None,
            **_summary(errs), "client_cpu_frac": None,
            "loop_lag_p99_ms": None, "max_in_flight": stats["max_in_flight"],
            **_fake_health(log, wall, cpu0, stats["cpu_s"])}


def _spin() -> None:
    while True:
        pass


def _fmt(v: Any, nd: int = 2) -> str:
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _table(rows: list[dict]) -> str:
    head = ("| tok/chunk | conc | client | ok/n | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TPOT p50 | TPOT p99 "
            "| E2EL p50 | E2EL p99 | TTFT p50 vs read | req path p50 | read lag p50 | rx | rx delay99 | same read % "
            "| cpu | lag99 | in-flight | fake cpu | fake late99 | flags |")
    lines = [head, "|" + "---|" * 24]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["tokens_per_chunk"]), str(r["concurrency"]), r["client"], f"{r['ok']}/{r['n']}",
            *(_fmt(r[f"{m}_{q}_ms"]) for m in ("ttft", "itl", "tpot", "e2el") for q in ("p50", "p99")),
            _fmt(r["ttft_read_p50_ms"]), _fmt(r["req_path_p50_ms"]), _fmt(r.get("fake_read_lag_p50_ms")),
            r.get("rx_stamps") or "-", _fmt(r.get("read_delay_p99_ms")), _fmt(r.get("same_read_pct")),
            _fmt(r["client_cpu_frac"]),
            _fmt(r["loop_lag_p99_ms"], 1),
            str(r["max_in_flight"]), _fmt(r["fake_cpu_frac"]), _fmt(r["fake_late_p99_ms"], 1),
            r.get("flags", "")]) + " |")
    return "\n".join(lines)


def _verdicts(rows: list[dict]) -> list[str]:
    """Per level: is each of tunelab's six errors <= half of vllm bench's? An error at or below the truth's
    own resolution (``floor``: the fake's median pre-write -> post-write time, i.e. how precisely the
    emission instant is known, at least 0.05 ms) cannot be told apart from zero and counts as met."""
    out = []
    keys = [f"{m}_{q}_ms" for m in ("ttft", "itl", "tpot") for q in ("p50", "p99")]
    for r in rows:
        if r["client"] != "tunelab":
            continue
        v = next((x for x in rows if x["client"] == "vllm bench" and x["concurrency"] == r["concurrency"]
                  and x["tokens_per_chunk"] == r["tokens_per_chunk"]), None)
        if v is None:
            continue
        floor = max(0.05, r.get("truth_write_p50_ms") or 0.0, v.get("truth_write_p50_ms") or 0.0)
        worse = [k for k in keys if r[k] is not None and v[k] is not None and r[k] > max(0.5 * v[k], floor)]
        ttft_ok = r["concurrency"] > 64 or (r["ttft_p50_ms"] is not None and r["ttft_p50_ms"] < 2.0)
        ttft = (f"TTFT p50 {_fmt(r['ttft_p50_ms'])} ms (vs the fake's read {_fmt(r['ttft_read_p50_ms'])} ms)")
        out.append(f"tok/chunk={r['tokens_per_chunk']} c={r['concurrency']}: "
                   + ("<= half of vllm bench (or at the truth's floor) on all six" if not worse
                      else "NOT <= half of vllm bench on " + ", ".join(worse))
                   + ("" if r["concurrency"] > 64 else
                      (f"; {ttft} < 2 ms" if ttft_ok else f"; {ttft} >= 2 ms (target missed)")))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and verdicts; optionally write JSON. Returns the exit code (0)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime-dir", type=Path, default=None,
                    help="vLLM runtime folder whose venv runs `vllm bench serve` (default: the tunelab home's "
                         "runtimes/cpu; TUNELAB_HOME overrides the home)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="default: the tunelab home's models/tiny-llama")
    ap.add_argument("--fake", choices=("raw", "uvicorn"), default="raw",
                    help="ground-truth fake: the lean asyncio.Protocol one (default) or uvicorn + h11 + ASGI")
    ap.add_argument("--pin", choices=("split", "none"), default="split",
                    help="split: fake on the last CPU, both clients on the others; none: the kernel decides")
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--tokens-per-chunk", default="1,4")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--ttft-s", type=float, default=0.05)
    ap.add_argument("--itl-s", type=float, default=0.01)
    ap.add_argument("--multi-process-at", default="256", help="levels where tunelab also runs with 2 load processes")
    ap.add_argument("--skip-vllm-bench", action="store_true")
    ap.add_argument("--httpx", action="store_true", help="also run tunelab's httpx transport (for comparison)")
    ap.add_argument("--busy-clients", type=int, default=0,
                    help="busy-looping processes on the clients' CPUs during the run (a busy machine)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    a.runtime_dir = a.runtime_dir or paths.runtimes_dir() / "cpu"
    a.tokenizer = a.tokenizer or paths.models_dir() / "tiny-llama"
    fake_cpus: set[int] | None = None
    cpus = sorted(os.sched_getaffinity(0))
    if a.pin == "split" and len(cpus) >= 2:
        fake_cpus = {cpus[-1]}
        os.sched_setaffinity(0, set(cpus[:-1]))  # inherited by load processes and by `vllm bench serve`
    busy = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(a.busy_clients)]
    for b in busy:
        b.start()  # inherits this process's (client) CPU affinity
    load0 = os.getloadavg()
    levels = [int(x) for x in a.levels.split(",") if x]
    multi = {int(x) for x in a.multi_process_at.split(",") if x}
    rows: list[dict] = []
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="tl-acc-") as td:
        for tpc in [int(x) for x in a.tokens_per_chunk.split(",") if x]:
            with FakeServerProcess(FakeTiming(a.ttft_s, a.itl_s, tpc), model=MODEL, server=a.fake,
                                   cpus=fake_cpus) as fake:
                for c in levels:
                    n = max(24, 2 * c)
                    runs = [("ours", 1, "raw")] + ([] if a.skip_vllm_bench else [("vllm", 0, "")]) + (
                        [("ours", 1, "httpx")] if a.httpx else []) + ([("ours", 2, "raw")] if c in multi else [])
                    for kind, procs, tr in runs:
                        if kind == "ours":
                            r = asyncio.run(_ours(fake, c, n, a.output_tokens, f"acc-t{tpc}-c{c}-p{procs}-{tr}",
                                                  procs, tr))
                        else:
                            r = _vllm_bench(fake, c, n, a.output_tokens, a.runtime_dir, a.tokenizer, Path(td))
                        r.update(tokens_per_chunk=tpc, concurrency=c)
                        flags = []
                        if r["client_cpu_frac"] is not None and r["client_cpu_frac"] >= M.CLIENT_BOUND_CPU_FRAC:
                            flags.append("client-bound (cpu)")
                        if r["max_in_flight"] < M.CLIENT_BOUND_CONCURRENCY_FRAC * min(c, n):
                            flags.append("concurrency not reached at server")
                        if r.pop("client_behind", False):
                            flags.append("client behind (chunks share reads)")
                        if r["fake_late_p99_ms"] is not None and r["fake_late_p99_ms"] > 5:
                            flags.append("fake late")
                        r["flags"] = ", ".join(flags)
                        rows.append(r)
                        # Progress on stderr: `> file` keeps only the final table and verdicts.
                        print(_table([r]).splitlines()[-1], file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    for b in busy:
        b.terminate()
    pin = (f"fake pinned to CPU {sorted(fake_cpus)}, clients to {sorted(os.sched_getaffinity(0))}"
           if fake_cpus else "not pinned")
    print()
    print(f"Load generator accuracy vs. ground truth (|client - true|, ms); {started:%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), fake TTFT "
          f"{a.ttft_s * 1e3:g} ms, {a.itl_s * 1e3:g} ms/token, {a.output_tokens} output tokens, "
          f"n = max(24, 2 x concurrency) requests per level; fake: {a.fake}; {pin}; "
          f"{a.busy_clients} busy-looping processes on the clients' CPUs; load average "
          f"(1 min) {load0[0]:.2f} at start, {load1[0]:.2f} at end")
    print(_table(rows))
    print()
    for v in _verdicts(rows):
        print(v)
    if a.json:
        a.json.write_text(json.dumps({"started": started.isoformat(), "cores": os.cpu_count(), "fake": a.fake,
                                      "pin": pin, "busy_clients": a.busy_clients, "loadavg_start": load0, "loadavg_end": load1, "rows": rows},
                                     indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
