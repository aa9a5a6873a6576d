"""Bottleneck diagnosis of a measured window, from measured evidence.

For each measured window five bottlenecks are checked; each check gives one :class:`Finding` (a row of
``window_diagnoses``, record :class:`tunelab.core.records.WindowDiagnosis`) with the figures it rests on, whether they
cross the named thresholds below (``flagged``), and the remedy to try. An unflagged row is evidence too: the
figures were there and said no. ``flagged`` None: the evidence was missing (e.g. no GPU, /metrics not scraped).

=====================  =========================================================================================
bottleneck             evidence (source)
=====================  =========================================================================================
api_server             while the GPU was busy < :data:`GPU_BUSY_PCT` of the window (NVML utilisation,
                       ``gpu_samples``; or not measured), either path: (a) CPU of the server's API-server
                       process(es) (busiest thread, cores; ``/proc/<pid>/task`` via
                       ``tasks.host_load.server_process_cpu``) >= :data:`API_SERVER_CPU_FRAC`; or (b) the frontend
                       delivers late: the client's mean ITL (``measurements.itl_mean_s``) >= :data:`FRONTEND_LAG_RATIO`
                       x the engine's (vLLM ``vllm:inter_token_latency_seconds`` mean, ``server_itl``) and >=
                       :data:`FRONTEND_LAG_MIN_S` longer, with ``measurements.client_bound`` False.
                       Whatever the GPU: (c) the server's own TTFT is spent outside the engine core: vLLM's
                       ``vllm:time_to_first_token_seconds`` mean minus its ``vllm:request_queue_time_seconds`` and
                       ``vllm:request_prefill_time_seconds`` means is >= :data:`FRONTEND_TTFT_SHARE` of it and >=
                       :data:`FRONTEND_TTFT_MIN_S`.
                       Context: the client's TTFT minus the server's (time spent before vLLM stamped arrival).
kv_cache               ``vllm:num_preemptions_total`` delta > 0, or ``vllm:kv_cache_usage_perc`` peak >=
                       :data:`KV_USAGE_FULL` with ``vllm:num_requests_waiting`` peak > 0 (peaks: /metrics sampled
                       during the window, ``server_metrics`` rows ``*_peak``).
prefill_interference   ITL p99 / p50 >= :data:`ITL_TAIL_RATIO`, and of the gaps longer than
                       :data:`LARGE_GAP_FACTOR` x the median gap at least :data:`COINCIDE_SHARE` overlap another
                       request's prefill (its send -> first token), at least :data:`COINCIDE_LIFT` times the share
                       of all gaps (requests' ``send_ts``, ``first_token_ts``, ``chunk_offsets_s``).
client                 ``measurements.client_bound`` (the load generator's own CPU and in-flight evidence).
gpu_floor              decode TPOT p50 / (weight bytes per GPU / HBM bandwidth) <= :data:`GPU_FLOOR_RATIO`: each
                       decode step reads every weight once, so no serving flag goes below that floor.
=====================  =========================================================================================

Domain layer: the standard library only. The readings (``/proc``, NVML, ``/metrics``, model files) are taken by
``tunelab.tasks.bottleneck_evidence``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "API_SERVER_CPU_FRAC",
    "BOTTLENECKS",
    "COINCIDE_LIFT",
    "COINCIDE_SHARE",
    "FRONTEND_LAG_MIN_S",
    "FRONTEND_LAG_RATIO",
    "FRONTEND_TTFT_MIN_S",
    "FRONTEND_TTFT_SHARE",
    "Finding",
    "GPU_BUSY_PCT",
    "GPU_FLOOR_RATIO",
    "HBM_BANDWIDTH_GBPS",
    "ITL_TAIL_RATIO",
    "KV_USAGE_FULL",
    "LARGE_GAP_FACTOR",
    "MIN_LARGE_GAPS",
    "REMEDIES",
    "api_server_finding",
    "client_finding",
    "decode_floor_s",
    "diagnose_window",
    "gpu_floor_finding",
    "hbm_bandwidth_bytes_per_s",
    "itl_prefill_overlap",
    "kv_cache_finding",
    "prefill_interference_finding",
]

# -- thresholds ----------------------------------------------------------------------------------------------
#: A Python process runs its event loop (HTTP, detokenising, tokenising on the API server) on one thread: at 0.9
#: of a core that thread is saturated for practical purposes (scheduling and short waits take the rest).
API_SERVER_CPU_FRAC = 0.9
#: NVML utilisation is the share of time a kernel ran. Below half, the GPU waited for the host most of the
#: window (on the H200 the host-bound c=1 windows read 45-61 %); an API server at a full core then holds it back.
GPU_BUSY_PCT = 50.0
#: The API process can hold the GPU back without any of its threads near a core (it waits on its own queues, the
#: GIL, the engine's output socket): then the client sees tokens later than the engine made them. vLLM v1 computes
#: ``vllm:inter_token_latency_seconds`` from the engine core's timestamps, so client mean ITL / that mean says how
#: late the frontend delivers. On the H200 (vLLM 0.25.1, ~1.1B Llama, c=256, 4 s windows) one API server on tiny
#: requests (32 prompt / 8 output tokens) read 2.5-3x (client 26.3-31.1 ms vs engine 8.4-10.8 ms; also with
#: VLLM_USE_FASTOKENS=1: 26.2-27.4 vs 8.9-10.6) with its busiest thread at only 0.50-0.54 cores, GPU 4-24 % busy,
#: the client healthy; ``--api-server-count 4`` more than doubled output throughput (3,300-3,760 -> 6,900-8,540
#: tokens/s), cut TTFT p50 from 430-490 to 155-197 ms and brought the ratio to 1.1-1.2. Windows not bound by the
#: API server read 1.1-1.3 (768-token prompts, GPU 58-77 % busy: 25.1-28.5 vs 19.5-22.0 ms; ``--api-server-count
#: 2 --max-num-seqs 1024``: 26.3 vs 23.7, 23.3 vs 18.7 ms). 1.5 lies between. The default on 256/32-token chat
#: read 1.7-2.0 (23.8 vs 14.1, 22.3 vs 10.9 ms, GPU 29-35 %) and is flagged; whether more API servers help there
#: was not measured.
FRONTEND_LAG_RATIO = 1.5
#: ... and the client's mean ITL must be at least 1 ms longer than the engine's: at sub-millisecond gaps a ratio
#: is the client's own stamping and event loop, not a frontend that delivers late.
FRONTEND_LAG_MIN_S = 0.001
#: vLLM v1 splits a request's TTFT (``vllm:time_to_first_token_seconds``: from the API server's arrival stamp to
#: the API server's handling of the first token) into parts the engine core stamps: queued -> scheduled
#: (``vllm:request_queue_time_seconds``) and scheduled -> first token (``vllm:request_prefill_time_seconds``).
#: The rest is the frontend's: chat template, tokenising, the hop to the engine core and its input queue (up to
#: one engine step), and the first token's way back through the API process's output handling. When that rest is
#: most of the TTFT the engine had spare time the frontend did not give it work. On the H200 (vLLM 0.25.1, ~1.1B
#: Llama, c=256, ``evidence/h200-2026-12-02-api-server-and-search``) one API server on 768-token prompts spent
#: 0.88-0.93 of its TTFT there (0.62-0.76 s, queue 7-26 ms, GPU 58-77 % busy), with neither the busiest-thread
#: nor the ITL path flagging it; ``VLLM_USE_FASTOKENS=1`` (+35.5 % output tokens/s) brought it to 0.19-0.40 and
#: ``--api-server-count 4`` (+40.1 %) to 0.07-0.09, both then queueing in the engine (0.23-0.42 s). The tiny
#: requests' windows with one API server read 0.79-0.92 (flagged by the ITL path too), with four 0.54-0.61; the
#: same day's search at c=256 read 0.86-0.91 for its two configs with one API server (the default flagged by the
#: ITL path too) and 0.10-0.33 for those with two or four. Across the other H200 evidence of 2026-11-29 to
#: 2026-12-02 (~1.1B at c=1 and 32, Llama-3.1-8B shape at c=16-256, KV-starved and interference-bound configs
#: included) no window read above 0.70. 0.8 lies between.
FRONTEND_TTFT_SHARE = 0.8
#: ... and that rest must be at least 50 ms: at light load a short prompt's few milliseconds of tokenising can be
#: most of a small TTFT without holding anything back (c=1 windows read 0.12-0.51 of 3-16 ms).
FRONTEND_TTFT_MIN_S = 0.05
#: A request waits for KV blocks when the free share of the cache is smaller than its own blocks, which with few
#: large requests happens far below 1: on the H200 (``evidence/h200-2026-12-02-bottlenecks``, 512 KV blocks = 8,192
#: tokens, requests of 2,048 + 128 tokens at c=64) three requests held the cache at a peak usage of 0.79 while 61
#: waited, with no preemption, and output throughput fell to 968 tokens/s from 7,770 with the default cache. An
#: earlier 0.95 missed that case. With requests waiting, usage >= 0.7 says the cache is what holds them; below it
#: they wait for another reason (for example ``--max-num-seqs``).
KV_USAGE_FULL = 0.7
#: With steady decoding the ITL distribution is narrow (p99/p50 about 1.2-1.5 on the CPU runtime and the H200);
#: a p99 three times the median means some steps took much longer than the rest.
ITL_TAIL_RATIO = 3.0
#: A "large" gap: longer than 3 x the median gap, the size of a step that also ran another request's prefill.
LARGE_GAP_FACTOR = 3.0
#: Most large gaps (half) must fall while another request was in prefill ...
COINCIDE_SHARE = 0.5
#: ... and that share must be 1.5 x the share of all gaps, so that at a load where some prefill runs all the
#: time (every gap overlaps one) the coincidence is not read as a cause.
COINCIDE_LIFT = 1.5
#: Fewer large gaps than this say nothing either way.
MIN_LARGE_GAPS = 5
#: TPOT within 1.5 x the bandwidth floor: the KV reads, the sampler and launch gaps make up the rest; the
#: weights' bandwidth is then what holds decoding back.
GPU_FLOOR_RATIO = 1.5

#: Peak HBM bandwidth per GPU model, GB/s (vendor data sheets), used when NVML's memory clock or bus width is not
#: readable. Matched as a case-insensitive substring of the NVML name, longest key first.
HBM_BANDWIDTH_GBPS: dict[str, float] = {
    "H200": 4800.0,
    "H100 NVL": 3900.0,
    "H100 SXM": 3350.0,
    "H100 80GB HBM3": 3350.0,   # NVML's name of the SXM part
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "GH200": 4000.0,
    "B200": 8000.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100-PCIE-40GB": 1555.0,
    "A100-SXM4-40GB": 1555.0,
    "A100": 2000.0,
    "L40S": 864.0,
    "L4": 300.0,
    "A10G": 600.0,
}

BOTTLENECKS: tuple[str, ...] = ("api_server", "kv_cache", "prefill_interference", "client", "gpu_floor")

#: The remedies to try first (the seeds of the tuning issue), per bottleneck.
REMEDIES: dict[str, str] = {
    "api_server": "VLLM_USE_FASTOKENS=1 (fast tokenizer path); --api-server-count N (several API server processes)",
    "kv_cache": "raise --gpu-memory-utilization; a realistic --max-model-len; lower --max-num-seqs",
    "prefill_interference": "chunked prefill (--enable-chunked-prefill); a smaller --max-num-batched-tokens",
    "client": "the window measures the client: more load processes (plan load_processes) when its loop was busy; "
              "free cores for it (cpu_affinity, nothing else on the host) when it waited for a CPU; the window's "
              "measurement note says which",
    "gpu_floor": "fewer weight bytes per GPU (fp8 / int4 weights, tensor parallel) or speculative decoding; "
                 "no serving flag goes below this floor",
}


@dataclass(frozen=True)
class Finding:
    """One bottleneck check of one window: ``bottleneck`` (one of :data:`BOTTLENECKS`), ``flagged`` (True: the
    evidence crosses the thresholds; False: it does not; None: evidence missing), ``metric``/``value``/
    ``threshold``: the deciding figure, ``evidence``: every figure used ({name: number or None}), ``summary``:
    one line for a report, ``remedy``: :data:`REMEDIES`, ``sources``: where the figures come from."""

    bottleneck: str
    flagged: bool | None
    metric: str
    value: float | None
    threshold: float | None
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str = ""
    sources: str = ""

    def row(self) -> dict[str, Any]:
        """The ``window_diagnoses`` columns of this finding (without the window's key)."""
        return {"bottleneck": self.bottleneck, "flagged": self.flagged, "metric": self.metric,
                "value": _num(self.value), "threshold": self.threshold, "summary": self.summary,
                "evidence": self.evidence, "remedy": self.remedy, "sources": self.sources}


def _num(v: Any) -> float | None:
    """A finite float or None (NaN, None, text -> None)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _bool(v: Any) -> bool | None:
    """True/False, or None for None, NaN and pandas' NA (a column read back from a frame)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    try:
        return bool(v)
    except TypeError:  # pd.NA
        return None


def _fmt(v: Any, spec: str = ".2f") -> str:
    f = _num(v)
    return "n/a" if f is None else format(f, spec)


# -- api server ----------------------------------------------------------------------------------------------
def api_server_finding(process_cpu: Mapping[str, Mapping[str, float]] | None, gpu_util_pct: float | None,
                       queue_time_mean_s: float | None = None, ttft_outside_engine_s: float | None = None, *,
                       client_itl_mean_s: float | None = None, engine_itl_mean_s: float | None = None,
                       client_bound: bool | None = None, server_ttft_mean_s: float | None = None,
                       prefill_time_mean_s: float | None = None) -> Finding:
    """API-server / tokeniser bound: while the GPU waits, the API server's busiest thread is near a full core, or
    the frontend delivers tokens late (the client's ITL well above the engine's); or, whatever the GPU, most of
    the server's own TTFT is spent outside the engine core (tokenising, the hop to the engine, output handling).

    Args:
        process_cpu: ``{role: {"cpu": cores, "busiest_thread": cores, "processes": n}}`` over the window, roles
            ``api_server`` (the server's root process, or processes named APIServer), ``engine_core`` (cmdline or
            name with 'EngineCore'), ``worker``, ``other`` (``tasks.host_load.server_process_cpu``); cores = CPU
            seconds / wall seconds. None: not sampled.
        gpu_util_pct: mean NVML utilisation over the window, percent; None on a CPU runtime / no samples (both
            paths then count the GPU as idle).
        queue_time_mean_s: mean of vLLM ``vllm:request_queue_time_seconds`` in the window (context).
        ttft_outside_engine_s: client TTFT mean - server ``vllm:time_to_first_token_seconds`` mean, seconds:
            time a request spent before the engine saw it (HTTP, tokenising; context).
        client_itl_mean_s: the client's mean gap between token chunks, seconds (``measurements.itl_mean_s``).
        engine_itl_mean_s: mean of vLLM ``vllm:inter_token_latency_seconds`` in the window, seconds (the
            ``server_itl`` row of ``server_metrics``; vLLM v1 takes it from the engine core's timestamps, so it
            does not include the API process's delay).
        client_bound: ``measurements.client_bound``; only False lets the frontend path flag (True: the client
            is what is late; None: cannot say).
        server_ttft_mean_s: mean of vLLM ``vllm:time_to_first_token_seconds`` in the window, seconds
            (``server_ttft``).
        prefill_time_mean_s: mean of vLLM ``vllm:request_prefill_time_seconds`` (scheduled -> first token, engine
            core timestamps), seconds (``server_prefill_time``). With ``queue_time_mean_s`` and
            ``server_ttft_mean_s`` it gives the TTFT path; any of the three missing: that path cannot say.

    Returns:
        The finding; value = the API server's busiest thread, cores, threshold :data:`API_SERVER_CPU_FRAC` (also
        when the frontend path decided). Flagged when the GPU was busy < :data:`GPU_BUSY_PCT` % (or not
        measured) and either the busiest thread >= :data:`API_SERVER_CPU_FRAC`, or client ITL / engine ITL >=
        :data:`FRONTEND_LAG_RATIO` with client - engine >= :data:`FRONTEND_LAG_MIN_S` and ``client_bound``
        False; or, whatever the GPU, when ``server_ttft - queue - prefill`` >= :data:`FRONTEND_TTFT_SHARE` x
        ``server_ttft`` and >= :data:`FRONTEND_TTFT_MIN_S`. None when the threads were not sampled and neither
        server-side path flags. Evidence adds ``client_itl_mean_s``, ``engine_itl_mean_s`` (s),
        ``frontend_lag_ratio`` (client / engine), ``prefill_time_mean_s``, ``frontend_ttft_s`` (s) and
        ``frontend_ttft_share`` (of the server's TTFT). Caveats: the client's ITL is per chunk; a server that sends
        several tokens per chunk on purpose (a stream interval > 1) reads as late on the ITL path. The TTFT path
        compares means of histograms that vLLM fills at different moments (TTFT at the first token, queue and
        prefill at the request's end), so a window's edge requests can sit in one and not the other.
    """
    api = (process_cpu or {}).get("api_server") or {}
    busiest = _num(api.get("busiest_thread"))
    c_itl, e_itl = _num(client_itl_mean_s), _num(engine_itl_mean_s)
    ratio = c_itl / e_itl if c_itl is not None and e_itl is not None and e_itl > 0 else None
    s_ttft, queue, prefill = _num(server_ttft_mean_s), _num(queue_time_mean_s), _num(prefill_time_mean_s)
    fe_ttft = s_ttft - queue - prefill if None not in (s_ttft, queue, prefill) else None
    fe_share = fe_ttft / s_ttft if fe_ttft is not None and s_ttft > 0 else None
    ev = {"api_server_cpu": _num(api.get("cpu")), "api_server_busiest_thread": busiest,
          "engine_core_cpu": _num(((process_cpu or {}).get("engine_core") or {}).get("cpu")),
          "gpu_util_pct": _num(gpu_util_pct), "queue_time_mean_s": queue,
          "ttft_outside_engine_s": _num(ttft_outside_engine_s), "client_itl_mean_s": c_itl,
          "engine_itl_mean_s": e_itl, "frontend_lag_ratio": ratio, "prefill_time_mean_s": prefill,
          "frontend_ttft_s": fe_ttft, "frontend_ttft_share": fe_share}
    src = ("/proc/<pid>/task/<tid>/stat of the server's process tree; NVML utilisation; "
           "vllm:time_to_first_token_seconds, vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds; "
           "measurements.itl_mean_s, client_bound, vllm:inter_token_latency_seconds")
    gpu_idle = ev["gpu_util_pct"] is None or ev["gpu_util_pct"] < GPU_BUSY_PCT
    cpu_path = busiest is not None and busiest >= API_SERVER_CPU_FRAC and gpu_idle
    frontend_path = bool(ratio is not None and ratio >= FRONTEND_LAG_RATIO
                         and c_itl - e_itl >= FRONTEND_LAG_MIN_S and _bool(client_bound) is False and gpu_idle)
    ttft_path = bool(fe_share is not None and fe_share >= FRONTEND_TTFT_SHARE and fe_ttft >= FRONTEND_TTFT_MIN_S)
    lag = "" if ratio is None else (
        f"; client ITL {ratio:.1f}x the engine's ({c_itl * 1e3:.1f} vs {e_itl * 1e3:.1f} ms)"
        + (" with the client not bound: the API process delivers late" if frontend_path else ""))
    if fe_share is not None:
        lag += (f"; {fe_share:.0%} of the server's TTFT ({fe_ttft * 1e3:.0f} of {s_ttft * 1e3:.0f} ms) outside "
                "the engine core's queue and prefill" + (": the frontend" if ttft_path else ""))
    paths = [name for name, hit in (("the busiest thread", cpu_path), ("the frontend lag", frontend_path),
                                    ("the frontend's share of TTFT", ttft_path)) if hit]
    by = " and ".join(paths)
    if busiest is None:
        if paths:
            return Finding("api_server", True, "api_server_busiest_thread", None, API_SERVER_CPU_FRAC,
                           f"server processes not sampled; GPU busy {_fmt(ev['gpu_util_pct'], '.0f')} %{lag} "
                           f"(flagged by {by} only)", ev, REMEDIES["api_server"], src)
        return Finding("api_server", None, "api_server_busiest_thread", None, API_SERVER_CPU_FRAC,
                       "server processes not sampled" + lag, ev, REMEDIES["api_server"], src)
    summary = (f"API server thread at {busiest:.2f} cores (process {_fmt(ev['api_server_cpu'])}), engine core "
               f"{_fmt(ev['engine_core_cpu'])} cores, GPU busy {_fmt(ev['gpu_util_pct'], '.0f')} %, "
               f"queue {_fmt(ev['queue_time_mean_s'], '.4f')} s, TTFT outside engine "
               f"{_fmt(ev['ttft_outside_engine_s'], '.4f')} s{lag}")
    if paths == ["the busiest thread"]:
        summary += " (flagged by the busiest thread)"
    elif paths and not cpu_path:
        summary += f" (flagged by {by} only: the busiest thread is below {API_SERVER_CPU_FRAC} cores)"
    elif paths:
        summary += f" (flagged by {by})"
    return Finding("api_server", bool(paths), "api_server_busiest_thread", busiest,
                   API_SERVER_CPU_FRAC, summary, ev, REMEDIES["api_server"], src)


# -- kv cache ------------------------------------------------------------------------------------------------
def kv_cache_finding(preemptions: float | None, kv_usage_peak: float | None, waiting_peak: float | None) -> Finding:
    """KV-cache bound: the scheduler preempted requests, or the cache was mostly used while requests waited.

    Args:
        preemptions: delta of vLLM ``vllm:num_preemptions_total`` over the window (count).
        kv_usage_peak: highest ``vllm:kv_cache_usage_perc`` (0..1; ``vllm:gpu_cache_usage_perc`` before 0.9)
            seen during the window; falls back to the value after the window.
        waiting_peak: highest ``vllm:num_requests_waiting`` seen during the window (requests).

    Returns:
        The finding; value = preemptions; flagged when preemptions > 0, or usage >= :data:`KV_USAGE_FULL` with
        requests waiting; None when none of the three was read.
    """
    p, u, w = _num(preemptions), _num(kv_usage_peak), _num(waiting_peak)
    ev = {"preemptions": p, "kv_cache_usage_peak": u, "num_requests_waiting_peak": w}
    src = "vllm:num_preemptions_total (delta), vllm:kv_cache_usage_perc, vllm:num_requests_waiting (peaks)"
    if p is None and u is None:
        return Finding("kv_cache", None, "preemptions", None, 0.0, "KV metrics not read", ev,
                       REMEDIES["kv_cache"], src)
    flagged = bool((p or 0) > 0 or ((u or 0) >= KV_USAGE_FULL and (w or 0) > 0))
    summary = (f"{_fmt(p, '.0f')} preemptions, KV cache usage peak {_fmt(u)}, "
               f"{_fmt(w, '.0f')} requests waiting at peak")
    return Finding("kv_cache", flagged, "preemptions", p, 0.0, summary, ev, REMEDIES["kv_cache"], src)


# -- prefill-decode interference -----------------------------------------------------------------------------
def itl_prefill_overlap(requests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """ITL gaps of a window against the prefills of the other requests.

    Args:
        requests: rows of ``requests`` (``tunelab.core.records.Request``): ``ok``, ``send_ts``, ``first_token_ts``
            (epoch s) and ``chunk_offsets_s`` (s after ``send_ts``, one per token chunk). Failed rows are skipped.

    Returns:
        ``gaps`` (int), ``itl_p50_s``, ``itl_p99_s`` (nearest-rank percentiles of the pooled gaps, s), ``ratio``
        (p99/p50), ``large_gaps`` (gaps > :data:`LARGE_GAP_FACTOR` x p50), ``large_share`` (share of the large
        gaps that overlap the prefill, send -> first token, of another request), ``all_share`` (the same over all
        gaps), ``lift`` (large_share / all_share). Figures without data are None.
    """
    rows = [r for r in requests if r.get("ok") and _num(r.get("send_ts")) is not None
            and _num(r.get("first_token_ts")) is not None]
    prefills = sorted((float(r["send_ts"]), float(r["first_token_ts"]), i) for i, r in enumerate(rows))
    starts = [p[0] for p in prefills]
    gaps: list[tuple[float, float, int]] = []  # (start, end, request)
    for i, r in enumerate(rows):
        offs = r.get("chunk_offsets_s")
        if offs is None:
            continue
        t = [float(r["send_ts"]) + float(o) for o in list(offs)]
        gaps.extend((a, b, i) for a, b in zip(t, t[1:]))
    out: dict[str, Any] = {"gaps": len(gaps), "itl_p50_s": None, "itl_p99_s": None, "ratio": None,
                           "large_gaps": 0, "large_share": None, "all_share": None, "lift": None}
    if not gaps:
        return out
    lengths = sorted(b - a for a, b, _ in gaps)

    def pct(q: float) -> float:
        return lengths[min(len(lengths) - 1, max(0, math.ceil(q / 100 * len(lengths)) - 1))]

    p50, p99 = pct(50), pct(99)
    out.update(itl_p50_s=p50, itl_p99_s=p99, ratio=p99 / p50 if p50 > 0 else None)

    longest = max((e - s for s, e, _ in prefills), default=0.0)

    def overlaps(a: float, b: float, own: int) -> bool:
        # Prefills of another request that started before the gap ended and ended after it began (only those
        # that started at most the longest prefill before the gap can still run in it).
        lo, hi = bisect.bisect_left(starts, a - longest), bisect.bisect_left(starts, b)
        return any(prefills[j][1] > a and prefills[j][2] != own for j in range(lo, hi))

    hits = [overlaps(a, b, i) for a, b, i in gaps]
    large = [h for (a, b, _), h in zip(gaps, hits) if p50 > 0 and (b - a) > LARGE_GAP_FACTOR * p50]
    out["all_share"] = sum(hits) / len(hits)
    out["large_gaps"] = len(large)
    if large:
        out["large_share"] = sum(large) / len(large)
        out["lift"] = out["large_share"] / out["all_share"] if out["all_share"] else None
    return out


def prefill_interference_finding(overlap: Mapping[str, Any]) -> Finding:
    """Prefill-decode interference: decode steps stretched by other requests' prefills.

    Args:
        overlap: :func:`itl_prefill_overlap` of the window.

    Returns:
        The finding; value = ITL p99/p50; flagged when it is >= :data:`ITL_TAIL_RATIO`, there are at least
        :data:`MIN_LARGE_GAPS` large gaps, at least :data:`COINCIDE_SHARE` of them overlap a prefill and that
        share is >= :data:`COINCIDE_LIFT` x the share of all gaps (a lift of None, all_share 0, counts as met).
    """
    ev = {k: _num(v) for k, v in overlap.items()}
    ratio = ev.get("ratio")
    src = "requests.send_ts, first_token_ts, chunk_offsets_s (client stamps)"
    if ratio is None:
        return Finding("prefill_interference", None, "itl_p99_over_p50", None, ITL_TAIL_RATIO,
                       "no ITL gaps", ev, REMEDIES["prefill_interference"], src)
    share, lift = ev.get("large_share"), ev.get("lift")
    flagged = bool(ratio >= ITL_TAIL_RATIO and (ev.get("large_gaps") or 0) >= MIN_LARGE_GAPS
                   and share is not None and share >= COINCIDE_SHARE and (lift is None or lift >= COINCIDE_LIFT))
    summary = (f"ITL p99/p50 {ratio:.1f} ({_fmt(ev.get('itl_p99_s'), '.4f')} / {_fmt(ev.get('itl_p50_s'), '.4f')} s); "
               f"{_fmt(share, '.0%') if share is not None else 'n/a'} of {_fmt(ev.get('large_gaps'), '.0f')} large "
               f"gaps fall in another request's prefill (all gaps: {_fmt(ev.get('all_share'), '.0%')})")
    return Finding("prefill_interference", flagged, "itl_p99_over_p50", ratio, ITL_TAIL_RATIO, summary, ev,
                   REMEDIES["prefill_interference"], src)


# -- client --------------------------------------------------------------------------------------------------
def client_finding(measurement: Mapping[str, Any]) -> Finding:
    """Client bound, as ``measurements.client_bound`` says (``tasks.metrics``: the load generator's busiest
    thread >= 0.9 of a core, or fewer in flight than the target while it still had requests to send).

    Returns:
        The finding; value = ``client_cpu_frac`` (cores); flagged = ``client_bound`` (None when not recorded).
    """
    cb = measurement.get("client_bound")
    cb = None if cb is None or (isinstance(cb, float) and math.isnan(cb)) else bool(cb)
    ev = {"client_cpu_frac": _num(measurement.get("client_cpu_frac")),
          "in_flight_while_sending": _num(measurement.get("in_flight_while_sending")),
          "target": _num(measurement.get("load_value")) if measurement.get("load_kind") == "concurrency" else None}
    summary = (f"client thread at {_fmt(ev['client_cpu_frac'])} cores, {_fmt(ev['in_flight_while_sending'])} in "
               f"flight while sending (target {_fmt(ev['target'], '.0f')})")
    return Finding("client", cb, "client_cpu_frac", ev["client_cpu_frac"], 0.9, summary, ev, REMEDIES["client"],
                   "measurements.client_bound, client_cpu_frac, in_flight_while_sending")


# -- gpu floor -----------------------------------------------------------------------------------------------
def hbm_bandwidth_bytes_per_s(gpu_name: str | None, mem_clock_mhz: float | None = None,
                              bus_width_bits: int | None = None) -> tuple[float | None, str]:
    """Peak memory bandwidth of one GPU, bytes/s, and how it was found.

    From NVML when both are known: memory clock (MHz, ``nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)``, its maximum)
    x 2 (double data rate) x bus width (bits, ``nvmlDeviceGetMemoryBusWidth``) / 8: H200 3201 MHz x 2 x 6144 /
    8 = 4.9 TB/s, H100 SXM 2619 MHz x 2 x 5120 / 8 = 3.35 TB/s. Else :data:`HBM_BANDWIDTH_GBPS` by name.

    Returns:
        (bytes/s or None when unknown (a CPU runtime, an unlisted GPU), 'nvml' | 'table:<key>' | 'unknown').
    """
    clk, bus = _num(mem_clock_mhz), _num(bus_width_bits)
    if clk and bus:
        return clk * 1e6 * 2 * bus / 8, "nvml"
    name = (gpu_name or "").lower()
    for key in sorted(HBM_BANDWIDTH_GBPS, key=len, reverse=True):
        if key.lower() in name:
            return HBM_BANDWIDTH_GBPS[key] * 1e9, f"table:{key}"
    return None, "unknown"


def decode_floor_s(weight_bytes: float | None, bandwidth_bytes_per_s: float | None, gpus: int = 1) -> float | None:
    """The bandwidth floor of one decode step, seconds: weight bytes per GPU (``weight_bytes`` / ``gpus``, the
    tensor-parallel size) / bandwidth (bytes/s). None when either is unknown or not positive."""
    w, b = _num(weight_bytes), _num(bandwidth_bytes_per_s)
    if not w or not b or w <= 0 or b <= 0:
        return None
    return w / max(1, int(gpus)) / b


def gpu_floor_finding(tpot_p50_s: float | None, floor_s: float | None, *, bandwidth_source: str = "",
                      weight_bytes: float | None = None) -> Finding:
    """TPOT against the GPU's bandwidth floor (:func:`decode_floor_s`).

    Args:
        tpot_p50_s: the window's TPOT p50, seconds (``measurements.tpot_p50_s``).
        floor_s: the floor, seconds per output token.

    Returns:
        The finding; value = TPOT / floor; flagged when <= :data:`GPU_FLOOR_RATIO`; None without a floor.
    """
    t, f = _num(tpot_p50_s), _num(floor_s)
    ev = {"tpot_p50_s": t, "floor_s": f, "weight_bytes": _num(weight_bytes), "bandwidth_source": bandwidth_source}
    src = "measurements.tpot_p50_s; model weight files; NVML memory clock x bus width, else HBM_BANDWIDTH_GBPS"
    if t is None or f is None:
        return Finding("gpu_floor", None, "tpot_over_floor", None, GPU_FLOOR_RATIO,
                       "no bandwidth floor (no GPU, unknown GPU model or weight size)", ev, REMEDIES["gpu_floor"], src)
    ratio = t / f
    summary = f"TPOT p50 {t * 1e3:.2f} ms is {ratio:.2f}x the bandwidth floor {f * 1e3:.2f} ms ({bandwidth_source})"
    return Finding("gpu_floor", ratio <= GPU_FLOOR_RATIO, "tpot_over_floor", ratio, GPU_FLOOR_RATIO, summary, ev,
                   REMEDIES["gpu_floor"], src)


# -- one window ----------------------------------------------------------------------------------------------
def _metric(server_metrics: Sequence[Mapping[str, Any]], name: str) -> float | None:
    for r in server_metrics:
        if r.get("metric") == name:
            return _num(r.get("value"))
    return None


def diagnose_window(measurement: Mapping[str, Any], server_metrics: Sequence[Mapping[str, Any]],
                    requests: Sequence[Mapping[str, Any]], *, process_cpu: Mapping[str, Any] | None = None,
                    gpu_util_pct: float | None = None, floor_s: float | None = None, bandwidth_source: str = "",
                    weight_bytes: float | None = None) -> list[Finding]:
    """Every check of :data:`BOTTLENECKS` for one window.

    Args:
        measurement: the window's ``measurements`` row (needs ``ttft_mean_s``, ``tpot_p50_s``, ``client_bound``,
            ``itl_mean_s``).
        server_metrics: its ``server_metrics`` rows (canonical names of ``tasks.server_metrics``, plus the
            ``kv_cache_usage_peak`` / ``num_requests_waiting_peak`` rows sampled during the window).
        requests: its ``requests`` rows.
        process_cpu: see :func:`api_server_finding`; gpu_util_pct: mean NVML utilisation in the window, %.
        floor_s, bandwidth_source, weight_bytes: see :func:`gpu_floor_finding`.

    Returns:
        One :class:`Finding` per bottleneck, in :data:`BOTTLENECKS` order.
    """
    server_ttft = _metric(server_metrics, "server_ttft")
    ttft = _num(measurement.get("ttft_mean_s"))
    outside = ttft - server_ttft if ttft is not None and server_ttft is not None else None
    kv_peak = _metric(server_metrics, "kv_cache_usage_peak")
    waiting_peak = _metric(server_metrics, "num_requests_waiting_peak")
    return [
        api_server_finding(process_cpu, gpu_util_pct, _metric(server_metrics, "server_queue_time"), outside,
                           client_itl_mean_s=_num(measurement.get("itl_mean_s")),
                           engine_itl_mean_s=_metric(server_metrics, "server_itl"),
                           client_bound=_bool(measurement.get("client_bound")), server_ttft_mean_s=server_ttft,
                           prefill_time_mean_s=_metric(server_metrics, "server_prefill_time")),
        kv_cache_finding(_metric(server_metrics, "preemptions"),
                         kv_peak if kv_peak is not None else _metric(server_metrics, "kv_cache_usage"),
                         waiting_peak if waiting_peak is not None else _metric(server_metrics, "num_requests_waiting")),
        prefill_interference_finding(itl_prefill_overlap(requests)),
        client_finding(measurement),
        gpu_floor_finding(measurement.get("tpot_p50_s"), floor_s, bandwidth_source=bandwidth_source,
                          weight_bytes=weight_bytes),
    ]
