"""Multi-turn sessions: c conversations in flight at once, each turn sending the whole conversation so far.

A session (``tunelab.core.workloads.MultiTurnWorkload``) is a list of user messages. Turn k sends every earlier
user message with the server's *actual* answer to it, then the new message, on ``/v1/chat/completions``; after
an answer ends the session waits ``think_time_s`` and sends its next turn. ``concurrency`` sessions run at
once (a session holds its slot through its think time, as a user at a keyboard does, so sessions interleave:
while one thinks, the others' turns go out), and a finished session makes room for the next one, in order.
A turn that failed ends its session (the next turn would lack the answer it appends).

Why its own runner rather than :func:`~tunelab.tasks.loadgen.scheduler.run_level`: a turn's prompt depends on
the previous answer, so prompts cannot be built before the window and sent on a fixed schedule. The same
transports time each request (:func:`~tunelab.tasks.loadgen.transport.send_streaming_raw` by default), so a
turn's record is an ordinary raw request record plus ``session_index`` and ``turn``. One event loop only: a
multi-turn window at the concurrencies a chat session workload uses does not saturate a core.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

import httpx

from tunelab.tasks.loadgen.scheduler import LevelResult, _rx_fields
from tunelab.tasks.loadgen.transport import Clock, RawPool, send_streaming, send_streaming_raw

__all__ = ["run_sessions"]


async def run_sessions(
    client: httpx.AsyncClient,
    model: str,
    sessions: Sequence[Sequence[str]],
    max_tokens: int | Sequence[int],
    concurrency: int,
    think_time_s: float = 0.0,
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
    on_done: Callable[[], None] | None = None,
    transport: str = "raw",
) -> LevelResult:
    """Run ``sessions`` (each a list of user messages, one per turn) with ``concurrency`` sessions in flight.

    Args:
        client: from :func:`~tunelab.tasks.loadgen.transport.make_client` (base URL and API key are reused).
        model: served model name.
        sessions: the user messages of every session, turn by turn.
        max_tokens: per turn (one int), or one per request in session order (len = total turns).
        concurrency: sessions in flight at once (>= 1).
        think_time_s: seconds from an answer's end to the session's next send (>= 0).
        on_done: called after each finished request (progress).
        transport: ``'raw'`` (:func:`send_streaming_raw`) or ``'httpx'`` (:func:`send_streaming`).

    Returns:
        :class:`LevelResult` whose records are in session order (session 0's turns, then session 1's ...),
        each a raw request record plus ``session_index``, ``turn`` (0-based) and ``messages_sent`` (how many
        messages the request carried); turns after a failed one are left out.

    Raises:
        ValueError: bad concurrency, think time, transport or max_tokens length.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 for multi-turn sessions, got {concurrency}")
    if think_time_s < 0:
        raise ValueError(f"think_time_s must be >= 0, got {think_time_s}")
    if transport not in ("raw", "httpx"):
        raise ValueError(f"transport must be 'raw' or 'httpx', got {transport!r}")
    n_total = sum(len(s) for s in sessions)
    if isinstance(max_tokens, int):
        per_req = [max_tokens] * n_total
    else:
        per_req = list(max_tokens)
        if len(per_req) != n_total:
            raise ValueError(f"max_tokens has {len(per_req)} values for {n_total} turns; give one per turn or one int")
    starts = [0]
    for s in sessions:
        starts.append(starts[-1] + len(s))
    clock = Clock()
    pool = RawPool(str(client.base_url).rstrip("/"), client.headers.get("authorization", "").removeprefix("Bearer ")
                   or None, clock) if transport == "raw" else None
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(len(sessions)):
        queue.put_nowait(k)
    out: dict[int, dict[str, Any]] = {}

    async def run_one(k: int) -> None:
        history: list[dict] = []
        for turn, message in enumerate(sessions[k]):
            if turn and think_time_s:
                await asyncio.sleep(think_time_s)
            history.append({"role": "user", "content": message})
            i = starts[k] + turn
            args = (model, message, per_req[i], "chat", ignore_eos, timeout_s)
            if pool is not None:
                rec = await send_streaming_raw(pool, clock, *args, messages=list(history), keep_text=True)
            else:
                rec = await send_streaming(client, clock, *args, messages=list(history), keep_text=True)
            answer = "".join(rec.pop("text", []))
            rec.update(session_index=k, turn=turn, messages_sent=len(history))
            out[i] = rec
            if on_done is not None:
                on_done()
            if rec["transport_error"] or not rec["finish_reason"]:
                return  # the next turn would lack this answer
            history.append({"role": "assistant", "content": answer})

    async def worker() -> None:
        while True:
            try:
                k = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await run_one(k)

    if pool is not None:
        await pool.prewarm(min(concurrency, len(sessions)))
    cpu0, t0 = time.thread_time(), time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(sessions)))))
    finally:
        wall = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        if pool is not None:
            pool.close()
    frac = cpu / wall if wall > 0 else 0.0
    rx = pool.rx.summary() if pool is not None else None
    return LevelResult([out[i] for i in sorted(out)], wall, frac, 0.0, 0.0, clock.origin, 1, [frac],
                       *_rx_fields([rx]))
