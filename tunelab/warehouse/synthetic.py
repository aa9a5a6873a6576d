"""Synthetic trial results with known effects and known noise, for tests and the ingest benchmark.

Not measurements: every number here is drawn from a stated distribution, so tests can check
that the comparison finds an effect that was put in (or none), and the benchmark can build a
warehouse of any size without a GPU. Names and units follow the warehouse contract.

Noise model (per metric value ``v`` of one repeat)::

    v = base * (1 + effect) * (1 + boot_noise) * (1 + repeat_noise)
    boot_noise   ~ Normal(0, boot_sd_rel)    drawn once per trial (boot)
    repeat_noise ~ Normal(0, repeat_sd_rel)  drawn per repeat
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tunelab.core import records

__all__ = ["SyntheticTrial", "synthetic_trial"]


@dataclass
class SyntheticTrial:
    """``sweep`` and ``trial`` row dicts and ``tables`` (DataFrames), as ``tunelab.core.bundle.write_bundle`` takes them."""

    sweep: dict
    trial: dict
    tables: dict[str, pd.DataFrame]


def synthetic_trial(
    *,
    sweep_id: str,
    config_key: str,
    replicate: int = 0,
    runtime_name: str = "synthetic",
    vllm_version: str = "0.32.0",
    config_label: str | None = None,
    started_at: _dt.datetime | None = None,
    workloads: tuple[str, ...] = ("chat",),
    loads: tuple[tuple[str, float], ...] = (("concurrency", 4.0),),
    repeats: int = 3,
    requests_per_repeat: int = 0,
    base_output_tokens_per_s: float = 1000.0,
    base_ttft_s: float = 0.05,
    effect_rel: float = 0.0,
    boot_sd_rel: float = 0.0,
    repeat_sd_rel: float = 0.0,
    chunk_offsets: int = 0,
    status: str = "ok",
    quality_verdict: str = "pass",
    rng: np.random.Generator | None = None,
) -> SyntheticTrial:
    """One synthetic trial.

    Args:
        effect_rel: relative change of throughput for this config (``+0.1`` = 10 % faster);
            latencies change by ``1 / (1 + effect_rel)``.
        boot_sd_rel: relative SD of the per-boot factor (boot-to-boot noise).
        repeat_sd_rel: relative SD of the per-repeat factor (repeat-to-repeat noise on one server).
        requests_per_repeat: rows of ``requests`` per (workload, load, repeat); 0 for none.
        chunk_offsets: length of each request's ``chunk_offsets_s`` list (0: NULL, keeps it small).

    Returns:
        SyntheticTrial with ``trial_id = records.trial_id(sweep_id, config_key, runtime_name, replicate)``
        (``<sweep_id>/<runtime_name>/<config_key>/r<replicate>``, as a sweep writes it).
    """
    rng = rng or np.random.default_rng(0)
    started_at = started_at or _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)
    trial_id = records.trial_id(sweep_id, config_key, runtime_name, replicate)
    sweep = {
        "sweep_id": sweep_id,
        "plan_name": "synthetic",
        "host": "synthetic-host",
        "started_at": started_at,
        "finished_at": started_at + _dt.timedelta(hours=1),
        "tunelab_version": "0.1.0",
        "source": "tunelab",
    }
    trial = {
        "trial_id": trial_id,
        "sweep_id": sweep_id,
        "config_key": config_key,
        "config_label": config_label or config_key,
        "replicate": replicate,
        "runtime_name": runtime_name,
        "vllm_version": vllm_version,
        "gpu_name": "synthetic",
        "gpu_index": 0,
        "model": "tiny-llama",
        "engine_args": {"max_num_batched_tokens": 8192},
        "env": {"VLLM_USE_FASTOKENS": "1"},
        "status": status,
        "boot_s": float(30 + rng.normal(0, 1)),
        "started_at": started_at,
        "finished_at": started_at + _dt.timedelta(minutes=10),
        "quality_verdict": quality_verdict,
    }
    boot_factor = (1.0 + effect_rel) * (1.0 + rng.normal(0.0, boot_sd_rel))
    mrows = []
    rparts = []
    for workload in workloads:
        for load_kind, load_value in loads:
            for rep in range(repeats):
                f = boot_factor * (1.0 + rng.normal(0.0, repeat_sd_rel))
                tput = base_output_tokens_per_s * f
                ttft = base_ttft_s / f
                n = requests_per_repeat or 100
                duration = n * 128 / tput
                mrows.append({
                    "trial_id": trial_id, "workload": workload, "load_kind": load_kind,
                    "load_value": float(load_value), "repeat": rep, "num_requests": n, "completed": n,
                    "failed": 0, "duration_s": duration, "request_throughput_per_s": n / duration,
                    "output_tokens_per_s": tput, "total_tokens_per_s": tput * 1.5,
                    "total_input_tokens": n * 64, "total_output_tokens": n * 128,
                    "ttft_mean_s": ttft, "ttft_p50_s": ttft, "ttft_p99_s": ttft * 2,
                    "tpot_mean_s": 1.0 / tput * float(load_value), "e2el_mean_s": duration / n * float(load_value),
                    "client_bound": False,
                })
                if requests_per_repeat:
                    k = requests_per_repeat
                    send = 1.7e9 + np.sort(rng.uniform(0, duration, k))
                    ttfts = rng.gamma(4.0, ttft / 4.0, k)
                    e2el = ttfts + 127 * rng.gamma(8.0, (1.0 / tput * float(load_value)) / 8.0, k)
                    part = {
                        "trial_id": np.full(k, trial_id, dtype=object),
                        "workload": np.full(k, workload, dtype=object),
                        "load_kind": np.full(k, load_kind, dtype=object),
                        "load_value": np.full(k, float(load_value)),
                        "repeat": np.full(k, rep, dtype=np.int32),
                        "request_index": np.arange(k, dtype=np.int32),
                        "ok": np.ones(k, dtype=bool),
                        "send_ts": send,
                        "first_token_ts": send + ttfts,
                        "end_ts": send + e2el,
                        "prompt_tokens": np.full(k, 64, dtype=np.int32),
                        "output_tokens": np.full(k, 128, dtype=np.int32),
                        "requested_output_tokens": np.full(k, 128, dtype=np.int32),
                        "finish_reason": np.full(k, "length", dtype=object),
                        "ttft_s": ttfts,
                        "tpot_s": (e2el - ttfts) / 127,
                        "e2el_s": e2el,
                        "itl_mean_s": (e2el - ttfts) / 127,
                    }
                    if chunk_offsets:
                        steps = np.linspace(0.0, 1.0, chunk_offsets)
                        part["chunk_offsets_s"] = [list(t + (e - t) * steps) for t, e in zip(ttfts, e2el)]
                    rparts.append(pd.DataFrame(part))
    tables = {
        "measurements": pd.DataFrame(mrows),
        "boot_phases": pd.DataFrame([
            {"trial_id": trial_id, "phase": "weights_load", "seconds": 3.0, "gib": 1.0},
            {"trial_id": trial_id, "phase": "graph_capture", "seconds": 5.0},
        ]),
        "quality_checks": pd.DataFrame([
            {"trial_id": trial_id, "suite": "requests", "expectation": "no_failed_requests",
             "success": True, "severity": "fail", "observed": "0", "threshold": "0"},
        ]),
    }
    if rparts:
        tables["requests"] = pd.concat(rparts, ignore_index=True)
    return SyntheticTrial(sweep=sweep, trial=trial, tables=tables)
