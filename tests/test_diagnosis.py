"""Bottleneck diagnosis (tunelab/core/bottleneck_rules.py, tunelab/tasks/bottleneck_evidence.py, host_load.server_process_cpu): exact cases
for each check from FAKE evidence (a FAKE /metrics server, a FAKE /proc tree, a FAKE server tree with a busy
process, synthetic windows with ITL spikes at prefills), and a window where nothing is flagged."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest

from tunelab.core import bottleneck_rules as D
from tunelab.core import records as R
from tunelab.tasks import host_load
from tunelab.tasks import server_metrics as SM
from tunelab.tasks.bottleneck_evidence import GaugePeaks, window_diagnoses

KEY = {"workload": "w", "load_kind": "concurrency", "load_value": 8.0, "repeat": 0}


# ---------------------------------------------------------------- a FAKE /metrics server
def fake_metrics_page(preemptions: float, kv_usage: float, waiting: float) -> str:
    """A vLLM /metrics page (names as vLLM 0.32 writes them) with the three figures of the KV check."""
    lab = '{engine="0",model_name="m"}'
    return (f"# HELP vllm:num_requests_waiting waiting\n# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{lab} {waiting}\n"
            f"# HELP vllm:kv_cache_usage_perc usage\n# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{lab} {kv_usage}\n"
            f"# HELP vllm:num_preemptions_total preemptions\n# TYPE vllm:num_preemptions_total counter\n"
            f"vllm:num_preemptions_total{lab} {preemptions}\n")


class FakeMetricsServer:
    """FAKE vLLM /metrics endpoint (an httpx mock transport): serves ``during`` while the window runs."""

    def __init__(self, during: str) -> None:
        self.during, self.hits = during, 0

    def client(self) -> httpx.AsyncClient:
        def handler(request: httpx.Request) -> httpx.Response:
            self.hits += 1
            return httpx.Response(200, text=self.during)

        return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://fake")


def _window_server_rows(before: str, during: str, after: str) -> list[dict]:
    async def run() -> list[dict]:
        fake = FakeMetricsServer(during)
        async with fake.client() as client:
            g = GaugePeaks(client, interval_s=0.01)
            g.start()
            for _ in range(1000):  # the window: until the gauges were read a few times (a busy host is slow)
                await asyncio.sleep(0.01)
                if fake.hits >= 3:
                    break
            await g.stop()
        assert fake.hits >= 3 and g.samples >= 3
        return SM.window_rows(SM.snapshot(before), SM.snapshot(after), KEY) + g.rows(KEY)

    return asyncio.run(run())


def test_kv_bound_window_from_a_fake_metrics_page_with_preemptions_and_usage_0_99():
    rows = _window_server_rows(fake_metrics_page(5, 0.1, 0), fake_metrics_page(5, 0.99, 4),
                               fake_metrics_page(8, 0.0, 0))  # after the window the cache is idle again
    peaks = {r["metric"]: r["value"] for r in rows if r["kind"] == "gauge_peak"}
    assert peaks == {"kv_cache_usage_peak": 0.99, "num_requests_waiting_peak": 4.0}
    f = D.diagnose_window({**KEY}, rows, [])[1]
    assert f.bottleneck == "kv_cache" and f.flagged is True and f.value == 3.0
    assert f.evidence == {"preemptions": 3.0, "kv_cache_usage_peak": 0.99, "num_requests_waiting_peak": 4.0}
    assert "--gpu-memory-utilization" in f.remedy and "--max-num-seqs" in f.remedy


def test_a_full_cache_with_nobody_waiting_and_no_preemption_is_not_kv_bound():
    rows = _window_server_rows(fake_metrics_page(5, 0.1, 0), fake_metrics_page(5, 0.99, 0),
                               fake_metrics_page(5, 0.0, 0))
    assert D.diagnose_window({**KEY}, rows, [])[1].flagged is False
    assert D.kv_cache_finding(0, 0.71, 1).flagged is True and D.kv_cache_finding(0, 0.69, 1).flagged is False
    assert D.kv_cache_finding(0, 0.99, 0).flagged is False  # full but nobody waits: not what holds requests back
    # the H200 case (evidence/h200-2026-12-02-bottlenecks): 0 preemptions, usage peak 0.79, 61 requests waiting
    assert D.kv_cache_finding(0, 0.7925, 61).flagged is True
    assert D.kv_cache_finding(None, None, None).flagged is None


# ---------------------------------------------------------------- server processes: a FAKE /proc tree
def _write_proc(root, procs: dict[int, tuple[int, str, str, dict[int, int]]]) -> None:
    """procs: pid -> (ppid, comm, cmdline, {tid: ticks}); a process's ticks = the sum of its threads'."""
    for pid, (ppid, comm, cmd, threads) in procs.items():
        d = root / str(pid)
        (d / "task").mkdir(parents=True, exist_ok=True)
        total = sum(threads.values())
        # fields after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 {total} 0 0 0 20 0\n")
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode() + b"\0")
        for tid, ticks in threads.items():
            (d / "task" / str(tid)).mkdir(exist_ok=True)
            (d / "task" / str(tid) / "stat").write_text(f"{tid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0\n")


def test_server_process_cpu_by_role_from_a_fake_proc_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(host_load, "_PROC", tmp_path)
    monkeypatch.setattr(host_load, "_clk_tck", lambda: 100)
    tree = lambda api, api2, eng: {  # noqa: E731
        100: (1, "python3", "python3 -m vllm serve /m", {100: api, 101: api2}),
        200: (100, "VLLM::EngineCore", "python3 -c from multiprocessing", {200: eng}),
        300: (100, "python3", "python3 -m resource_tracker", {300: 0}),
    }
    _write_proc(tmp_path, tree(1000, 50, 2000))
    before = dataclasses.replace(host_load.ServerProcSample.read(100), wall=0.0)
    _write_proc(tmp_path, tree(1950, 150, 2300))  # 10 s later: the API thread 950 ticks, its other 100, engine 300
    after = dataclasses.replace(host_load.ServerProcSample.read(100), wall=10.0)
    cpu = host_load.server_process_cpu(before, after)
    assert cpu == {"api_server": {"cpu": 1.05, "busiest_thread": 0.95, "processes": 1},
                   "engine_core": {"cpu": 0.3, "busiest_thread": 0.3, "processes": 1},
                   "other": {"cpu": 0.0, "busiest_thread": 0.0, "processes": 1}}
    f = D.api_server_finding(cpu, gpu_util_pct=30.0, queue_time_mean_s=0.2, ttft_outside_engine_s=0.05)
    assert f.flagged is True and f.value == 0.95 and "VLLM_USE_FASTOKENS=1" in f.remedy
    assert "--api-server-count" in f.remedy
    assert D.api_server_finding(cpu, gpu_util_pct=90.0).flagged is False  # the GPU was busy: not the host
    assert host_load.server_process_cpu(before, None) is None
    assert host_load.ServerProcSample.read(None) is None


# ---------------------------------------------------------------- api server: the frontend delivers late
# Figures of the H200 windows (vLLM 0.25.1, ~1.1B Llama, c=256, 4 s windows, tiny requests of 32 + 8 tokens).
def _cpu(busiest: float, process: float, engine: float = 0.48) -> dict:
    return {"api_server": {"cpu": process, "busiest_thread": busiest, "processes": 1},
            "engine_core": {"cpu": engine, "busiest_thread": engine, "processes": 1}}


def test_the_h200_default_tiny_window_is_api_server_bound_by_the_frontend_lag():
    cpu = _cpu(0.53, 0.60)
    assert D.api_server_finding(cpu, gpu_util_pct=20.0).flagged is False  # today's CPU rule alone misses it
    f = D.api_server_finding(cpu, gpu_util_pct=20.0, client_itl_mean_s=0.0263, engine_itl_mean_s=0.0093,
                             client_bound=False)
    assert f.flagged is True and f.value == 0.53 and f.threshold == D.API_SERVER_CPU_FRAC
    assert f.metric == "api_server_busiest_thread"
    assert f.evidence["client_itl_mean_s"] == 0.0263 and f.evidence["engine_itl_mean_s"] == 0.0093
    assert f.evidence["frontend_lag_ratio"] == pytest.approx(0.0263 / 0.0093)
    assert ("client ITL 2.8x the engine's (26.3 vs 9.3 ms) with the client not bound: the API process delivers "
            "late") in f.summary
    assert "flagged by the frontend lag only" in f.summary
    assert "vllm:inter_token_latency_seconds" in f.sources and "--api-server-count" in f.remedy
    # VLLM_USE_FASTOKENS=1, still one API server: 26.2-27.4 vs 8.9-10.6 ms, GPU 4-14 %
    assert D.api_server_finding(_cpu(0.50, 0.58), 4.0, client_itl_mean_s=0.0274, engine_itl_mean_s=0.0106,
                                client_bound=False).flagged is True


def test_windows_not_bound_by_the_api_server_are_not_flagged_by_the_frontend_path():
    # --api-server-count 4: client 11.8 vs engine 10.5 ms (1.1x), GPU 19 %
    f = D.api_server_finding(_cpu(0.38, 0.40), 19.0, client_itl_mean_s=0.0118, engine_itl_mean_s=0.0105,
                             client_bound=False)
    assert f.flagged is False and f.evidence["frontend_lag_ratio"] == pytest.approx(0.0118 / 0.0105)
    assert "client ITL 1.1x the engine's (11.8 vs 10.5 ms)" in f.summary and "delivers late" not in f.summary
    assert "flagged" not in f.summary
    # 768-token prompts on the default: 28.5 vs 22.0 ms (1.3x), GPU 66 % busy
    assert D.api_server_finding(_cpu(0.53, 0.60), 66.0, client_itl_mean_s=0.0285, engine_itl_mean_s=0.022,
                                client_bound=False).flagged is False
    # --api-server-count 2 --max-num-seqs 1024: 26.3 vs 23.7 ms, GPU 23 %
    assert D.api_server_finding(_cpu(0.40, 0.45), 23.0, client_itl_mean_s=0.0263, engine_itl_mean_s=0.0237,
                                client_bound=False).flagged is False


def test_the_frontend_path_needs_an_idle_gpu_a_healthy_client_and_a_millisecond():
    lag = {"client_itl_mean_s": 0.0263, "engine_itl_mean_s": 0.0093}
    assert D.api_server_finding(_cpu(0.53, 0.60), 20.0, **lag, client_bound=False).flagged is True
    assert D.api_server_finding(_cpu(0.53, 0.60), 66.0, **lag, client_bound=False).flagged is False  # GPU busy
    assert D.api_server_finding(_cpu(0.53, 0.60), None, **lag, client_bound=False).flagged is True  # no GPU figure
    f = D.api_server_finding(_cpu(0.53, 0.60), 20.0, **lag, client_bound=True)  # the client is what is late
    assert f.flagged is False and "delivers late" not in f.summary
    for unknown in (None, float("nan"), pd.NA):  # cannot say: this path does not flag
        assert D.api_server_finding(_cpu(0.53, 0.60), 20.0, **lag, client_bound=unknown).flagged is False
    # 3x, but 0.4 ms apart: the client's own stamping, not a late frontend
    assert D.api_server_finding(_cpu(0.53, 0.60), 20.0, client_itl_mean_s=0.0006, engine_itl_mean_s=0.0002,
                                client_bound=False).flagged is False
    assert D.api_server_finding(_cpu(0.53, 0.60), 20.0, client_itl_mean_s=0.0263, engine_itl_mean_s=None,
                                client_bound=False).flagged is False
    # a server whose process tree is not on this host: the frontend path still decides when it flags
    f = D.api_server_finding(None, 20.0, **lag, client_bound=False)
    assert f.flagged is True and f.value is None and "flagged by the frontend lag only" in f.summary
    assert D.api_server_finding(None, 20.0, client_itl_mean_s=0.0118, engine_itl_mean_s=0.0105,
                                client_bound=False).flagged is None


# ---------------------------------------------------------------- api server: TTFT spent outside the engine core
# Figures of the H200 windows (vLLM 0.25.1, ~1.1B Llama, c=256, 768-token prompts + 8 output tokens), means of the
# window's vLLM histograms: server TTFT, queue (queued -> scheduled), prefill (scheduled -> first token).
def _ttft(server_ttft: float, queue: float, prefill: float) -> dict:
    return {"server_ttft_mean_s": server_ttft, "queue_time_mean_s": queue, "prefill_time_mean_s": prefill}


def test_one_api_server_on_long_prompts_is_flagged_by_the_frontend_share_of_ttft_with_the_gpu_busy():
    # the default: ITL only 1.3x the engine's and the GPU 66 % busy, so neither older path flags ...
    old = {"client_itl_mean_s": 0.0285, "engine_itl_mean_s": 0.022, "client_bound": False}
    assert D.api_server_finding(_cpu(0.46, 0.78), 66.0, **old).flagged is False
    # ... but 0.70 of its 0.756 s TTFT was spent outside the engine core's queue (7 ms) and prefill (49 ms)
    f = D.api_server_finding(_cpu(0.46, 0.78), 66.0, **old, **_ttft(0.756, 0.007, 0.049))
    assert f.flagged is True
    assert f.evidence["frontend_ttft_s"] == pytest.approx(0.700)
    assert f.evidence["frontend_ttft_share"] == pytest.approx(0.700 / 0.756)
    assert f.evidence["prefill_time_mean_s"] == 0.049 and f.evidence["queue_time_mean_s"] == 0.007
    assert "93% of the server's TTFT (700 of 756 ms) outside the engine core's queue and prefill: the frontend" \
        in f.summary
    assert "flagged by the frontend's share of TTFT only" in f.summary
    assert "vllm:request_prefill_time_seconds" in f.sources
    # VLLM_USE_FASTOKENS=1 (+35.5 % tokens/s): 0.153 of 0.491 s, the engine now queues (274 ms)
    f = D.api_server_finding(_cpu(0.50, 0.54), 89.0, **old, **_ttft(0.491, 0.274, 0.064))
    assert f.flagged is False and "31% of the server's TTFT" in f.summary
    assert "queue and prefill: the frontend" not in f.summary
    # --api-server-count 4 (+40.1 %): 0.041 of 0.515 s
    assert D.api_server_finding(_cpu(0.20, 1.05), 100.0, **old, **_ttft(0.515, 0.410, 0.064)).flagged is False


def test_the_ttft_path_needs_its_three_means_a_share_and_50_ms():
    cpu = _cpu(0.46, 0.78)
    assert D.api_server_finding(cpu, 66.0, **_ttft(0.756, 0.007, 0.049)).flagged is True
    # 0.8125 of a second's TTFT: flagged; 0.75: not
    assert D.api_server_finding(cpu, 66.0, **_ttft(1.0, 0.125, 0.0625)).flagged is True
    assert D.api_server_finding(cpu, 66.0, **_ttft(1.0, 0.125, 0.125)).flagged is False
    # most of a light-load TTFT, but 4 ms: tokenising a short prompt, nothing held back (c=1 windows)
    f = D.api_server_finding(cpu, 40.0, **_ttft(0.005, 0.0, 0.001))
    assert f.flagged is False and f.evidence["frontend_ttft_share"] == pytest.approx(0.8)
    for missing in ("server_ttft_mean_s", "queue_time_mean_s", "prefill_time_mean_s"):
        f = D.api_server_finding(cpu, 66.0, **{**_ttft(0.756, 0.007, 0.049), missing: None})
        assert f.flagged is False and f.evidence["frontend_ttft_s"] is None and "of the server's TTFT" not in f.summary
    assert D.api_server_finding(cpu, 66.0, **_ttft(0.0, 0.0, 0.0)).evidence["frontend_ttft_share"] is None
    # a remote server (no process tree): the TTFT path still decides when it flags
    f = D.api_server_finding(None, 66.0, **_ttft(0.756, 0.007, 0.049))
    assert f.flagged is True and "flagged by the frontend's share of TTFT only" in f.summary
    assert D.api_server_finding(None, 66.0, **_ttft(0.515, 0.410, 0.064)).flagged is None


def test_the_cpu_path_still_flags_a_saturated_api_thread():
    f = D.api_server_finding(_cpu(0.95, 1.02), 10.0)
    assert f.flagged is True and f.value == 0.95 and "flagged by the busiest thread" in f.summary
    assert f.evidence["frontend_lag_ratio"] is None
    f = D.api_server_finding(_cpu(0.95, 1.02), 10.0, client_itl_mean_s=0.0118, engine_itl_mean_s=0.0105,
                             client_bound=True)
    assert f.flagged is True and "flagged by the busiest thread)" in f.summary
    f = D.api_server_finding(_cpu(0.95, 1.02), 10.0, client_itl_mean_s=0.0263, engine_itl_mean_s=0.0093,
                             client_bound=False)
    assert f.flagged is True and "flagged by the busiest thread and the frontend lag" in f.summary
    assert D.api_server_finding(_cpu(0.95, 1.02), 90.0).flagged is False


def test_diagnose_window_passes_the_client_and_engine_itl_to_the_api_server_check():
    meas = {**KEY, "ttft_mean_s": 0.55, "tpot_p50_s": 0.026, "itl_mean_s": 0.0263, "client_bound": False}
    sm = [{**KEY, "metric": "server_ttft", "kind": "histogram", "value": 0.44},
          {**KEY, "metric": "server_itl", "kind": "histogram", "value": 0.0093}]
    f = D.diagnose_window(meas, sm, [], process_cpu=_cpu(0.53, 0.60), gpu_util_pct=20.0)[0]
    assert f.bottleneck == "api_server" and f.flagged is True
    assert f.evidence["client_itl_mean_s"] == 0.0263 and f.evidence["engine_itl_mean_s"] == 0.0093
    assert f.evidence["ttft_outside_engine_s"] == pytest.approx(0.11)
    assert D.diagnose_window({**meas, "client_bound": True}, sm, [], process_cpu=_cpu(0.53, 0.60),
                             gpu_util_pct=20.0)[0].flagged is False
    assert D.diagnose_window(meas, sm[:1], [], process_cpu=_cpu(0.53, 0.60),
                             gpu_util_pct=20.0)[0].flagged is False  # no server_itl row: the path cannot say
    # the TTFT path reads the server's TTFT, queue and prefill rows
    sm2 = [{**KEY, "metric": "server_ttft", "kind": "histogram", "value": 0.756},
           {**KEY, "metric": "server_queue_time", "kind": "histogram", "value": 0.007},
           {**KEY, "metric": "server_prefill_time", "kind": "histogram", "value": 0.049}]
    f = D.diagnose_window({**meas, "itl_mean_s": 0.0285}, sm2, [], process_cpu=_cpu(0.46, 0.78), gpu_util_pct=66.0)[0]
    assert f.flagged is True and f.evidence["frontend_ttft_s"] == pytest.approx(0.700)
    assert D.diagnose_window({**meas, "itl_mean_s": 0.0285}, sm2[:2], [], process_cpu=_cpu(0.46, 0.78),
                             gpu_util_pct=66.0)[0].flagged is False  # no prefill row: the path cannot say


def test_a_busy_process_in_a_fake_server_tree_reads_near_a_core():
    # FAKE server tree: the root (the 'API server') spins, its child named EngineCore sleeps.
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', 'Engine' + 'Core'])\n"
            "t = time.time()\n"
            "while time.time() - t < 30: pass\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 10
        while len(host_load.descendants(proc.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the child's interpreter start-up is CPU too: let it end before the window
        before = host_load.ServerProcSample.read(proc.pid)
        time.sleep(1.5)
        cpu = host_load.server_process_cpu(before, host_load.ServerProcSample.read(proc.pid))
    finally:
        for p in host_load.descendants(proc.pid)[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert set(cpu) == {"api_server", "engine_core"}
    # A spinning thread: near a core on an idle host, less on a busy one (a shared 2-core host gave it 0.35), so
    # the exact threshold case is the FAKE /proc test above; here: the spin is seen, on the right thread and role.
    assert cpu["api_server"]["busiest_thread"] > 0.1
    assert cpu["api_server"]["busiest_thread"] >= 0.9 * cpu["api_server"]["cpu"]  # one thread does the work
    assert cpu["engine_core"]["cpu"] < 0.1


# ---------------------------------------------------------------- ITL spikes at prefills: synthetic windows
def _window(spike_s: float, n: int = 8, tokens: int = 40, itl_s: float = 0.01, prefill_s: float = 0.1) -> list[dict]:
    """n requests sent 0.3 s apart, each prefill ``prefill_s``; a decode step that meets another request's
    prefill takes ``spike_s`` instead of ``itl_s`` (0 = no interference)."""
    sends = [1000.0 + 0.3 * i for i in range(n)]
    prefills = [(s, s + prefill_s) for s in sends]
    rows = []
    for i, s in enumerate(sends):
        t, offs = s + prefill_s, [prefill_s]
        for _ in range(tokens - 1):
            nxt = t + itl_s
            if spike_s and any(j != i and a < nxt and b > t for j, (a, b) in enumerate(prefills)):
                nxt = t + spike_s
            offs.append(nxt - s)
            t = nxt
        rows.append({**KEY, "request_index": i, "ok": True, "send_ts": s, "first_token_ts": s + prefill_s,
                     "chunk_offsets_s": offs})
    return rows


def test_itl_spikes_at_other_requests_prefills_are_prefill_interference():
    ov = D.itl_prefill_overlap(_window(spike_s=0.08))
    assert ov["itl_p50_s"] == pytest.approx(0.01) and ov["itl_p99_s"] == pytest.approx(0.08)
    assert ov["large_gaps"] >= D.MIN_LARGE_GAPS and ov["large_share"] == 1.0 and ov["lift"] >= D.COINCIDE_LIFT
    f = D.prefill_interference_finding(ov)
    assert f.flagged is True and f.value == pytest.approx(8.0) and "--max-num-batched-tokens" in f.remedy


def test_the_same_spikes_away_from_prefills_are_not_interference():
    rows = _window(spike_s=0)
    for i, r in enumerate(rows):
        # One request at a time (2 s apart): no gap meets another request's prefill; every 7th gap is long.
        r["send_ts"] = 1000.0 + 2.0 * i
        r["first_token_ts"] = r["send_ts"] + r["chunk_offsets_s"][0]
        extra = 0.0
        for k in range(1, len(r["chunk_offsets_s"])):
            extra += 0.07 if k % 7 == 0 else 0.0
            r["chunk_offsets_s"][k] += extra
    ov = D.itl_prefill_overlap(rows)
    assert ov["ratio"] >= D.ITL_TAIL_RATIO and ov["large_gaps"] >= D.MIN_LARGE_GAPS and ov["large_share"] == 0.0
    assert D.prefill_interference_finding(ov).flagged is False


# ---------------------------------------------------------------- GPU floor, client, and a clean window
def test_bandwidth_from_nvml_clock_and_bus_width_else_the_table():
    bw, src = D.hbm_bandwidth_bytes_per_s("NVIDIA H200", 3201, 6144)
    assert src == "nvml" and bw == pytest.approx(4.917e12, rel=1e-3)
    assert D.hbm_bandwidth_bytes_per_s("NVIDIA H100 80GB HBM3") == (3.35e12, "table:H100 80GB HBM3")
    assert D.hbm_bandwidth_bytes_per_s("NVIDIA A100-SXM4-80GB")[0] == pytest.approx(2.039e12)
    assert D.hbm_bandwidth_bytes_per_s("cpu") == (None, "unknown")
    floor = D.decode_floor_s(16e9, 4.8e12, gpus=2)
    assert floor == pytest.approx(16e9 / 2 / 4.8e12)
    assert D.gpu_floor_finding(0.002, floor).flagged is True  # 1.2x the floor
    assert D.gpu_floor_finding(0.005, floor).flagged is False  # 3x
    assert D.gpu_floor_finding(0.005, None).flagged is None


def test_client_bound_is_a_finding():
    f = D.client_finding({**KEY, "client_bound": True, "client_cpu_frac": 0.97, "in_flight_while_sending": 5.1})
    assert f.flagged is True and f.value == 0.97 and "5.10 in flight" in f.summary


def _clean_frames(tmp_path):
    reqs = pd.DataFrame(_window(spike_s=0))
    reqs["end_ts"] = [s + offs[-1] for s, offs in zip(reqs["send_ts"], reqs["chunk_offsets_s"])]
    meas = pd.DataFrame([{**KEY, "ttft_mean_s": 0.1, "tpot_p50_s": 0.01, "client_bound": False,
                          "client_cpu_frac": 0.2, "in_flight_while_sending": 8.0,
                          "server_process_cpu": json.dumps({"api_server": {"cpu": 0.3, "busiest_thread": 0.25,
                                                                           "processes": 1}})}])
    sm = pd.DataFrame([{**KEY, "metric": "preemptions", "value": 0.0}, {**KEY, "metric": "kv_cache_usage_peak",
                                                                        "value": 0.3},
                       {**KEY, "metric": "num_requests_waiting_peak", "value": 0.0}])
    t0 = float(reqs["send_ts"].min())
    gpu = pd.DataFrame([{"ts": t0 + k * 0.5, "gpu_index": 0, "utilization_pct": 95.0, "mem_clock_mhz": 3201.0}
                        for k in range(5)])
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 4_800_000)  # 4.8 MB: a 1 us floor at 4.8 TB/s
    return meas, reqs, sm, gpu, model


def test_a_clean_window_flags_nothing_and_every_check_has_its_evidence(tmp_path):
    meas, reqs, sm, gpu, model = _clean_frames(tmp_path)
    df = window_diagnoses(meas, reqs, sm, gpu, model=str(model), gpu_name="NVIDIA H200", gpu_index=0,
                          nvml=object())  # a FAKE NVML without the bus width call: the table's 4.8 TB/s
    assert list(df["bottleneck"]) == list(D.BOTTLENECKS)
    assert list(df["flagged"]) == [False] * 5, df[["bottleneck", "flagged", "summary"]]
    floor = df.set_index("bottleneck").loc["gpu_floor"]
    assert floor["value"] == pytest.approx(0.01 / 1e-6) and "table:H200" in floor["summary"]
    assert json.loads(df.set_index("bottleneck").loc["api_server", "evidence"])["gpu_util_pct"] == 95.0
    R.frame(R.WindowDiagnosis, df, without=("trial_id",))  # the record's columns and types


def test_a_late_frontend_is_flagged_through_the_window_frames(tmp_path):
    meas, reqs, sm, gpu, model = _clean_frames(tmp_path)
    meas["itl_mean_s"] = 0.0263
    sm = pd.concat([sm, pd.DataFrame([{**KEY, "metric": "server_itl", "kind": "histogram", "value": 0.0093}])],
                   ignore_index=True)
    gpu["utilization_pct"] = 20.0
    df = window_diagnoses(meas, reqs, sm, gpu).set_index("bottleneck")
    assert df.loc["api_server", "flagged"] == True  # noqa: E712 (a frame's bool)
    ev = json.loads(df.loc["api_server", "evidence"])
    assert ev["frontend_lag_ratio"] == pytest.approx(0.0263 / 0.0093) and ev["gpu_util_pct"] == 20.0
    assert "the API process delivers late" in df.loc["api_server", "summary"]


# ---------------------------------------------------------------- warehouse: table, view, query, report
def test_findings_reach_the_warehouse_view_the_query_and_the_sweep_report(tmp_path):
    from tunelab.core.bundle import write_bundle
    from tunelab.reports.report import bottleneck_findings, bottlenecks_markdown, sweep_markdown
    from tunelab.warehouse.loader import load_bundle
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.query import run_query

    meas, reqs, sm, gpu, model = _clean_frames(tmp_path)
    diag = window_diagnoses(meas, reqs, sm, None)
    kv = diag["bottleneck"] == "kv_cache"
    diag.loc[kv, ["flagged", "value", "summary"]] = [True, 3.0, "3 preemptions, KV cache usage peak 0.99"]
    sweep = R.Sweep(sweep_id="s1", plan_name="p")
    trial = R.TrialRow(trial_id="s1/rt/k/r0", sweep_id="s1", config_key="k", config_label="max-num-seqs=512",
                    replicate=0, status="ok")
    bundle = write_bundle(tmp_path / "results", sweep, trial, {"window_diagnoses": diag})
    db = tmp_path / "wh.duckdb"
    assert load_bundle(db, bundle).rows["window_diagnoses"] == 5
    con = connect(db)
    try:
        f = bottleneck_findings(con, "s1")
        q = run_query(con, "bottlenecks", sweep_id="s1")
    finally:
        con.close()
    assert list(f["bottleneck"]) == ["kv_cache"]
    assert q.to_dict("records")[0] | {"value_median": 3.0} == {
        "sweep_id": "s1", "config_label": "max-num-seqs=512", "bottleneck": "kv_cache", "metric": "preemptions",
        "windows": 1, "checked": 1, "value_median": 3.0, "remedy": D.REMEDIES["kv_cache"]}
    md = bottlenecks_markdown(f)
    assert md.splitlines()[2] == ("- **kv_cache** max-num-seqs=512 r0 w c=8 #1: 3 preemptions, KV cache usage peak "
                                  f"0.99. Try: {D.REMEDIES['kv_cache']}")
    assert "No window showed" in bottlenecks_markdown(f.iloc[0:0])
    assert "## Bottlenecks" in sweep_markdown(pd.DataFrame(), "s1", None, None, findings=f)
    from typer.testing import CliRunner

    from tunelab.cli import app

    out = CliRunner().invoke(app, ["report", "--db", str(db), "--sweep", "s1"], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    # rendered for the terminal: the heading and the bold name without their markdown marks
    assert "kv_cache max-num-seqs=512 r0 w c=8 #1: 3 preemptions" in " ".join(out.output.split())
    assert "**kv_cache**" not in out.output and "## Bottlenecks" not in out.output


# ---------------------------------------------------------------- wiring: measure_server reads the server's tree
def test_measure_server_records_the_fake_servers_cpu_by_role():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "fakes"))
    from timed_openai_server import FakeServerProcess, FakeTiming

    from tunelab.core.plan import Plan, Workload
    from tunelab.tasks.measure import measure_server

    # /proc counts CPU in clock ticks (10 ms): 60 streams of 32 chunks keep the fake busy for many ticks (6 x 8
    # chunks used less than one tick on a busy CI host and read 0.0)
    plan = Plan(name="diag", model="unused", seed=3, repeats=1, warmup_requests=0, concurrency=[2],
                workloads=[Workload(name="w", prompt_tokens=16, output_tokens=32, num_requests=60)])
    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002), model="fake-model") as fake:
        res = measure_server(fake.base_url, "k", "fake-model", plan, progress=lambda *a: None,
                             server_pid=fake.proc.pid)
        no_pid = measure_server(fake.base_url, "k", "fake-model", plan, progress=lambda *a: None)
    cpu = json.loads(res.measurements.iloc[0]["server_process_cpu"])
    assert cpu["api_server"]["processes"] == 1 and cpu["api_server"]["cpu"] > 0  # it served the window
    assert no_pid.measurements.iloc[0]["server_process_cpu"] is None
