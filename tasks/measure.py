"""Warm-up and measurement of one running server: every workload x load level x repeat.

For each (workload, load level): warm-up requests first (fresh prompts, never among the measured ones,
excluded from every number), then ``repeats`` measured windows, each with its own prompts drawn from its
own seed so the prefix cache does not serve a repeat. ``/metrics`` is scraped right before and right after
each window; the deltas are the server's view of the same window. Between windows the prefix cache is
reset where the server allows it (``/reset_prefix_cache``, needs ``VLLM_SERVER_DEV_MODE=1``; otherwise the
fresh prompts keep the cache cold and the attempt is recorded).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import pandas as pd

from tasks import metrics as M
from tasks import server_metrics as SM
from tasks.arrivals import arrival_offsets
from tasks.loadgen import PromptBuilder, make_client, run_level
from tunelab.plan import Plan, Workload

__all__ = ["LoadLevel", "MeasureResult", "load_levels", "measure_server"]


@dataclass(frozen=True)
class LoadLevel:
    """``kind`` is 'concurrency' (value = max in-flight requests) or 'rate' (value = requests/s)."""

    kind: str
    value: float

    @property
    def label(self) -> str:
        return f"c={int(self.value)}" if self.kind == "concurrency" else f"rate={self.value:g}/s"


def load_levels(plan: Plan) -> list[LoadLevel]:
    """The plan's load levels in order: concurrencies, then request rates."""
    return [LoadLevel("concurrency", float(c)) for c in plan.concurrency] + [
        LoadLevel("rate", float(r)) for r in plan.request_rates
    ]


@dataclass
class MeasureResult:
    """DataFrames with the columns of the ``requests``, ``measurements`` and ``server_metrics`` tables
    (without trial_id, which the caller adds)."""

    requests: pd.DataFrame
    measurements: pd.DataFrame
    server_metrics: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


async def _prompts(builder: PromptBuilder, w: Workload, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    prefix = ""
    if w.shared_prefix_tokens:
        # The shared prefix depends only on the workload, so every request (and repeat) shares it.
        prefix, _ = await builder.exact(w.shared_prefix_tokens, random.Random(_seed("prefix", w.name)))
    out = []
    for _ in range(n):
        text, _ = await builder.exact(w.prompt_tokens, rng, prefix=prefix)
        out.append(text)
    return out


async def _scrape(client: httpx.AsyncClient) -> Any | None:
    try:
        r = await client.get("/metrics", timeout=10)
        return SM.snapshot(r.text) if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


async def _reset_prefix_cache(client: httpx.AsyncClient) -> bool:
    try:
        r = await client.post("/reset_prefix_cache", timeout=10)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


async def _measure(
    base_url: str,
    api_key: str,
    model: str,
    plan: Plan,
    progress: Callable[[str, int, int], None] | None,
) -> MeasureResult:
    levels = load_levels(plan)
    max_conc = int(max([lv.value for lv in levels if lv.kind == "concurrency"] or [1]))
    req_rows: list[dict] = []
    meas_rows: list[dict] = []
    sm_rows: list[dict] = []
    notes: list[str] = []
    slo = {k: v for k, v in plan.slo.model_dump().items() if v is not None}
    async with make_client(base_url, api_key, max(max_conc, 64)) as client:
        builder = PromptBuilder(client, model)
        for w in plan.workloads:
            for lv in levels:
                common = dict(max_tokens=w.output_tokens, load_kind=lv.kind, load_value=lv.value,
                              endpoint=w.endpoint, ignore_eos=w.ignore_eos, timeout_s=plan.request_timeout_s)
                if plan.warmup_requests:
                    wp = await _prompts(builder, w, plan.warmup_requests, _seed(plan.seed, w.name, lv, "warmup"))
                    offs = (list(arrival_offsets(len(wp), lv.value, plan.burstiness, seed=_seed(plan.seed, "wa")))
                            if lv.kind == "rate" else None)
                    await run_level(client, model, wp, arrival_offsets_s=offs, **common)
                for rep in range(plan.repeats):
                    s = _seed(plan.seed, w.name, lv, rep)
                    prompts = await _prompts(builder, w, w.num_requests, s)
                    offs = (list(arrival_offsets(len(prompts), lv.value, plan.burstiness, seed=s))
                            if lv.kind == "rate" else None)
                    label = f"{w.name} {lv.label} repeat {rep + 1}/{plan.repeats}"
                    done = [0]

                    def tick(label=label, done=done, n=len(prompts)):
                        done[0] += 1
                        if progress:
                            progress(label, done[0], n)

                    before = await _scrape(client)
                    res = await run_level(client, model, prompts, arrival_offsets_s=offs, on_done=tick, **common)
                    after = await _scrape(client)
                    ident = {"workload": w.name, "load_kind": lv.kind, "load_value": lv.value, "repeat": rep}
                    derived = []
                    for i, raw in enumerate(res.records):
                        raw = {**raw, **ident, "request_index": i, "requested_output_tokens": w.output_tokens,
                               "ignore_eos": w.ignore_eos}
                        derived.append(M.derive_request(raw))
                    df = pd.DataFrame(derived)
                    agg = M.aggregate(df, slo or None, client_cpu_frac=res.client_cpu_frac,
                                      target=lv.value if lv.kind == "concurrency" else None)
                    meas_rows.append({**ident, **agg})
                    req_rows.extend(derived)
                    if before is not None and after is not None:
                        sm_rows.extend(SM.window_rows(before, after, ident))
                    else:
                        notes.append(f"{label}: /metrics could not be scraped")
                    await _reset_prefix_cache(client)
    return MeasureResult(pd.DataFrame(req_rows), pd.DataFrame(meas_rows), pd.DataFrame(sm_rows), notes)


def measure_server(
    base_url: str,
    api_key: str,
    model: str,
    plan: Plan,
    progress: Callable[[str, int, int], None] | None = None,
    deadline_s: float | None = None,
) -> MeasureResult:
    """Run warm-up + measurement against a ready server (blocking).

    Args:
        base_url: ``http://127.0.0.1:<port>``; api_key: the trial's key; model: served model name.
        plan: the validated plan (workloads, load levels, repeats, warm-up, SLOs, seed).
        progress: called as ``progress(label, done, total)`` after each measured request.
        deadline_s: tunelab's own deadline for the whole measurement; ``asyncio.TimeoutError`` past it.
    """
    coro = _measure(base_url, api_key, model, plan, progress)
    if deadline_s:
        coro = asyncio.wait_for(coro, timeout=deadline_s)
    return asyncio.run(coro)
