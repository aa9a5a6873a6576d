"""The load generator: exact-length prompts and an async streaming client that records raw timings.

It produces *raw request records* (the contract with ``tasks.metrics.derive_request``): one dict per
request with the send time, the arrival time of every streamed chunk that carried generated text, the end
time, the server's usage and finish reason. Derived metrics (TTFT, ITL, TPOT, E2EL) are computed from
these elsewhere, in one place.

Design choices, and why:
- httpx with a hand-read SSE stream, not the openai client: the client's per-chunk pydantic parsing costs
  CPU on the same cores that time the stream; here a chunk costs one ``json.loads``.
- Connection limits are sized to the requested concurrency, so the pool never caps it.
- Timestamps are ``time.perf_counter()`` mapped onto one ``time.time()`` origin: monotonic and
  high-resolution, yet comparable across processes and with server logs.
- Prompts are built with the runtime's own tokenizer through vLLM's ``/tokenize`` and ``/detokenize``
  endpoints (no tokenizer in the orchestrator, works for any model the server loads), from a seeded
  word sequence, so that each repeat draws fresh prompts and the prefix cache does not serve a repeat
  unless the workload asks for a shared prefix.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

__all__ = ["Clock", "PromptBuilder", "send_streaming", "run_level", "LevelResult"]

# A fixed, plain word list: prompts read like text (realistic tokenization work for the server's
# tokenizer, which matters for VLLM_USE_FASTOKENS comparisons) and are reproducible from a seed.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has more when will would if been out so what up its "
    "about into than them only other new some could time these two may then do first any my now such like "
    "our over man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while last might "
    "us great old year off come since against go came right used take three himself few house use during "
    "without again place around however home small found thought went say part once general high upon "
    "school every don does got united left number course war until always away something fact though water "
    "less public put think almost hand enough far took head yet government system better set told nothing "
    "night end why called didn eyes find going look asked later knew point next program city business give "
    "group toward young days let room president side social given present several order national possible "
    "rather second face per among form important often things looked early white case john become large big "
    "need four within felt along children saw best church ever least power development light thing seemed "
    "family interest want members mind country area others done turned although open god service certain "
    "kind problem began different door thus help sense means whole matter perhaps itself york times law human"
).split()


class Clock:
    """Epoch seconds with perf_counter resolution: ``now() = t0_epoch + (perf_counter() - t0_perf)``."""

    def __init__(self) -> None:
        self._e0 = time.time()
        self._p0 = time.perf_counter()

    def now(self) -> float:
        return self._e0 + (time.perf_counter() - self._p0)


class PromptBuilder:
    """Builds prompts of an exact token count with the server's own tokenizer.

    Args:
        client: an ``httpx.AsyncClient`` with base_url and auth set.
        model: served model name.
    """

    def __init__(self, client: httpx.AsyncClient, model: str) -> None:
        self.client = client
        self.model = model

    async def _tokenize(self, text: str) -> list[int]:
        r = await self.client.post("/tokenize", json={"model": self.model, "prompt": text, "add_special_tokens": False})
        r.raise_for_status()
        return r.json()["tokens"]

    async def _detokenize(self, tokens: list[int]) -> str:
        r = await self.client.post("/detokenize", json={"model": self.model, "tokens": tokens})
        r.raise_for_status()
        return r.json()["prompt"]

    async def exact(self, n_tokens: int, rng: random.Random, prefix: str = "") -> tuple[str, int]:
        """A prompt of ``n_tokens`` tokens (including ``prefix``): random words, tokenized, cut to length,
        detokenized, checked. Returns (text, token count as the server counts it). The count can differ
        from the target by a token or two when a cut lands inside a merge; the caller records the
        server's own ``usage.prompt_tokens`` for every request anyway."""
        words = " ".join(rng.choice(_WORDS) for _ in range(n_tokens + 8))
        text = (prefix + " " + words) if prefix else words
        ids = await self._tokenize(text)
        best = (text, len(ids))
        for _ in range(4):
            cut = await self._detokenize(ids[:n_tokens])
            got = await self._tokenize(cut)
            best = (cut, len(got))
            if len(got) == n_tokens:
                break
            # A cut mid-merge re-tokenizes differently: adjust the cut by the difference and retry.
            ids = got + await self._tokenize(" " + rng.choice(_WORDS)) if len(got) < n_tokens else got
        return best


async def send_streaming(
    client: httpx.AsyncClient,
    clock: Clock,
    model: str,
    prompt: str,
    max_tokens: int,
    endpoint: str = "completions",
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Send one streaming request and record raw timings.

    Returns a dict with ``send_ts``, ``chunk_ts`` (epoch s of each chunk carrying non-empty generated
    text; role-only and empty chunks excluded), ``end_ts`` (last byte; None if the stream was cut),
    ``prompt_tokens``/``output_tokens`` (server usage; None if absent), ``finish_reason``,
    ``transport_error`` (None on success). Never raises for HTTP or stream errors.
    """
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    rec: dict[str, Any] = {
        "send_ts": None, "chunk_ts": [], "end_ts": None, "prompt_tokens": None, "output_tokens": None,
        "finish_reason": None, "transport_error": None,
    }
    done = False
    try:
        rec["send_ts"] = clock.now()
        async with client.stream("POST", path, json=body, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                rec["end_ts"] = clock.now()
                rec["transport_error"] = f"HTTP {resp.status_code}: {text}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                t = clock.now()
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    continue
                obj = json.loads(data)
                if obj.get("usage"):
                    rec["prompt_tokens"] = obj["usage"].get("prompt_tokens")
                    rec["output_tokens"] = obj["usage"].get("completion_tokens")
                for ch in obj.get("choices") or []:
                    piece = ch.get("text") if endpoint != "chat" else (ch.get("delta") or {}).get("content")
                    if piece:
                        rec["chunk_ts"].append(t)
                    if ch.get("finish_reason"):
                        rec["finish_reason"] = ch["finish_reason"]
            rec["end_ts"] = clock.now()
            if not done:
                rec["transport_error"] = "stream ended without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError, asyncio.TimeoutError) as e:
        rec["transport_error"] = f"{type(e).__name__}: {e}"[:300]
        if not done:
            rec["end_ts"] = None
    return rec


@dataclass
class LevelResult:
    """Raw records of one (workload, load level, repeat) window plus client CPU use.

    ``client_cpu_frac`` = process CPU seconds / wall seconds over the window (1.0 = one core saturated)."""

    records: list[dict[str, Any]]
    wall_s: float
    client_cpu_frac: float


async def run_level(
    client: httpx.AsyncClient,
    model: str,
    prompts: list[str],
    max_tokens: int,
    load_kind: str,
    load_value: float,
    endpoint: str = "completions",
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
    arrival_offsets_s: list[float] | None = None,
    on_done: Callable[[], None] | None = None,
) -> LevelResult:
    """Send ``prompts`` at a fixed concurrency (``load_kind='concurrency'``: at most ``load_value`` in
    flight) or on an arrival schedule (``load_kind='rate'``: request i is sent at ``arrival_offsets_s[i]``
    seconds after the start, as ``vllm bench serve --request-rate``). Returns raw records in prompt order.
    """
    clock = Clock()
    if load_kind == "concurrency":
        sem = asyncio.Semaphore(int(load_value))
    elif load_kind == "rate":
        if arrival_offsets_s is None or len(arrival_offsets_s) != len(prompts):
            raise ValueError("load_kind='rate' needs one arrival offset per prompt")
        sem = None
    else:
        raise ValueError(f"load_kind must be 'concurrency' or 'rate', got {load_kind!r}")

    async def one(i: int, p: str) -> dict[str, Any]:
        if sem is not None:
            async with sem:
                r = await send_streaming(client, clock, model, p, max_tokens, endpoint, ignore_eos, timeout_s)
        else:
            await asyncio.sleep(max(0.0, t_start + arrival_offsets_s[i] - time.perf_counter()))
            r = await send_streaming(client, clock, model, p, max_tokens, endpoint, ignore_eos, timeout_s)
        if on_done:
            on_done()
        return r

    cpu0, t_start = time.process_time(), time.perf_counter()
    records = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu0
    return LevelResult(list(records), wall, cpu / wall if wall > 0 else 0.0)


def make_client(base_url: str, api_key: str, concurrency: int) -> httpx.AsyncClient:
    """An AsyncClient whose pool never caps the requested concurrency."""
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {api_key}"},
        limits=limits,
        timeout=httpx.Timeout(120.0, connect=10.0),
    )
