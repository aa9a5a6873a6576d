"""The scheduler: sends one window's prompts on its :class:`~tunelab.core.load_profiles.Schedule` (concurrency
slots or send offsets), in one event loop or split over several load processes, and reports the client's
own health.

One Python event loop saturates one core. ``run_level(processes=N)`` splits the load over N processes (each
with its own loop and share of the slots / send offsets, described by a :class:`ShardSpec`); the window's
``client_cpu_frac`` is the busiest loop's CPU time / wall time, and the loop's wake-up lag is measured, so a
client-bound window is visible. Load processes are started with multiprocessing's ``spawn``: their entry
point :func:`_worker_main` and :class:`ShardSpec` live at module level here, so the child imports them as
``tunelab.tasks.loadgen.scheduler``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import httpx

from tunelab.core.load_profiles import Schedule, profile_for
from tunelab.tasks.loadgen.transport import (Clock, RawPool, make_client, prewarm_connections, send_streaming,
                                             send_streaming_raw)

__all__ = ["LevelResult", "ShardSpec", "run_level"]


@dataclass
class LevelResult:
    """Raw records of one (workload, load level, repeat) window plus the client's own health.

    Fields:
        records: raw request records in prompt order (see :func:`send_streaming`; rate mode adds
            ``scheduled_ts``, every record ``worker``: the load process that sent it).
        wall_s: window wall time, seconds (start of sending -> last request finished).
        client_cpu_frac: CPU seconds / wall seconds of the busiest load process's event-loop thread
            (1.0 = one core saturated: the timestamps then lag; ``tasks.metrics`` flags >= 0.9 client-bound).
        loop_lag_p99_s / loop_lag_max_s: how late the busiest event loop woke up from a 5 ms sleep
            (p99 / max, seconds): a direct bound on how stale a timestamp can be.
        clock_origin: the ``(epoch0, perf0)`` pair the timestamps were taken with (see :class:`Clock`).
        processes: number of load processes used.
        per_process_cpu_frac: each load process's event-loop CPU fraction.
        rx_stamps: how the receive timestamps were taken: ``'kernel'`` (every read of the raw transport
            carried the kernel's receive time, :mod:`tasks.rx_stamps`), ``'read'`` (none did, or the httpx
            transport: stamped when the event loop read the bytes) or ``'mixed'``.
        read_delay_p99_s / read_delay_max_s: for kernel-stamped reads, how late the busiest loop read its
            bytes after they had arrived (p99 / max, seconds): the error a read-time stamp would have had,
            which the kernel stamp avoided. None without kernel stamps.

    :meth:`same_read_itl_frac` says how often the client fell so far behind that one read held two chunks
    of a stream.
    """

    records: list[dict[str, Any]]
    wall_s: float
    client_cpu_frac: float
    loop_lag_p99_s: float = 0.0
    loop_lag_max_s: float = 0.0
    clock_origin: tuple[float, float] = (0.0, 0.0)
    processes: int = 1
    per_process_cpu_frac: list[float] = field(default_factory=list)
    rx_stamps: str = "read"
    read_delay_p99_s: float | None = None
    read_delay_max_s: float | None = None

    def same_read_itl_frac(self) -> float | None:
        """Fraction of the window's inter-chunk gaps (ok or not) whose two content chunks were stamped by
        the same read, i.e. gaps of exactly 0 s (None when there is no gap). A read carries one stamp (see
        :mod:`tasks.rx_stamps`), so when the client falls behind and one read holds several chunks of a
        stream, all of them get the last one's arrival time: TTFT and ITL of those requests are coarse.
        Only meaningful for the raw transport (httpx stamps each line as it is parsed)."""
        gaps = same = 0
        for r in self.records:
            ts = r.get("chunk_ts") or []
            gaps += max(0, len(ts) - 1)
            same += sum(1 for a, b in zip(ts, ts[1:]) if a == b)
        return same / gaps if gaps else None

    def median_nonzero_gap_s(self) -> float | None:
        """Median of the window's inter-chunk gaps that are not 0 s (seconds; None without one): the typical
        ITL, against which a read delay says whether the client could have merged two chunks."""
        gaps = sorted(b - a for r in self.records for a, b in zip(r.get("chunk_ts") or [], (r.get("chunk_ts") or [])[1:])
                      if b > a)
        return gaps[len(gaps) // 2] if gaps else None


class _LagMonitor:
    """Samples event-loop wake-up lateness every ``period_s`` while running."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        p = time.perf_counter
        while True:
            t0 = p()
            await asyncio.sleep(self.period_s)
            self.lags.append(max(0.0, p() - t0 - self.period_s))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> tuple[float, float]:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if not self.lags:
            return 0.0, 0.0
        s = sorted(self.lags)
        return s[min(len(s) - 1, int(0.99 * len(s)))], s[-1]


@dataclass(frozen=True)
class ShardSpec:
    """One event loop's share of a window: what it sends, to whom, and on which schedule (picklable: it is
    the argument of a spawned load process).

    Fields:
        base_url / api_key: the server (``http://host:port``) and its bearer key.
        model: served model name. prompts: this shard's prompts, in the order of its records.
        max_tokens: per request, one int for all or one per prompt (a workload whose output lengths vary).
        endpoint ('completions' | 'chat'), ignore_eos, timeout_s: per request (seconds).
        slots: closed loop: this shard's share of the window's concurrency (None: open loop).
        offsets_s: open loop: send offset of each prompt, seconds after the window's start (None: closed loop).
        worker: the load process's number (recorded as ``worker`` in every record).
        transport: 'raw' (:func:`~tunelab.tasks.loadgen.transport.send_streaming_raw`) or 'httpx'.
        clock_origin: the window's ``(epoch0, perf0)`` (:class:`~tunelab.tasks.loadgen.transport.Clock`), so
            every shard stamps on one scale; None: a fresh clock.
        send_until_s: closed loop: no slot takes a new request this many seconds or later after the window's
            start (a duration window, ``Schedule.send_until_s``); None: every prompt is sent.
        stagger_s, slot_offset, slots_total: closed loop, staggered starts (``Schedule.stagger_s``): this shard's
            slot k takes its first request ``(slot_offset + k) x stagger_s / slots_total`` seconds after the
            window's start (``slot_offset``: the slots of the load processes before this one).
    """

    base_url: str
    api_key: str
    model: str
    prompts: tuple[str, ...]
    max_tokens: int | tuple[int, ...]
    endpoint: str = "completions"
    ignore_eos: bool = True
    timeout_s: float = 120.0
    slots: int | None = None
    offsets_s: tuple[float, ...] | None = None
    worker: int = 0
    transport: str = "raw"
    clock_origin: tuple[float, float] | None = None
    send_until_s: float | None = None
    stagger_s: float = 0.0
    slot_offset: int = 0
    slots_total: int | None = None

    @property
    def pool_size(self) -> int:
        """httpx connections this shard needs: its slots, or (open loop: no bound) one per request."""
        return self.slots if self.slots is not None else len(self.prompts)


async def _run_shard(
    client: httpx.AsyncClient,
    spec: ShardSpec,
    t_start_perf: float | None = None,
    on_done: Callable[[], None] | None = None,
    shared_next: Any = None,
) -> tuple[list[dict[str, Any]], float, float, float, float, dict[str, Any] | None]:
    """One event loop's share: returns (records, wall_s, cpu_frac, lag_p99_s, lag_max_s, rx) where rx is
    ``RxStats.summary`` of the raw transport's reads (None for httpx). With ``shared_next`` (a
    ``multiprocessing.Value('i')`` shared by the load processes of one closed-loop window) the workers take the
    next request index from it, so every process pulls from one queue; each record then carries its index as
    ``"index"``. ``t_start_perf``: the ``perf_counter`` time to start sending at (None: now)."""
    clock = Clock(spec.clock_origin)
    pool: RawPool | None = None
    if spec.transport == "raw":
        pool = RawPool(spec.base_url, spec.api_key or None, clock)
    try:
        out = await _run_shard_with(client, pool, clock, spec, t_start_perf, on_done, shared_next)
        return (*out, pool.rx.summary() if pool is not None else None)
    finally:
        if pool is not None:
            pool.close()


async def _run_shard_with(
    client: httpx.AsyncClient,
    pool: "RawPool | None",
    clock: Clock,
    spec: ShardSpec,
    t_start_perf: float | None,
    on_done: Callable[[], None] | None,
    shared_next: Any = None,
) -> tuple[list[dict[str, Any]], float, float, float, float]:
    prompts = spec.prompts
    if spec.slots is not None:
        if pool is not None:
            await pool.prewarm(min(spec.slots, len(prompts)))
        else:
            await prewarm_connections(client, spec.slots)
    if t_start_perf is not None:
        await asyncio.sleep(max(0.0, t_start_perf - time.perf_counter()))
    records: list[dict[str, Any] | None] = [None] * len(prompts)
    mon = _LagMonitor()
    mon.start()
    cpu0, t0 = time.thread_time(), time.perf_counter()
    if t_start_perf is None:
        t_start_perf = t0
    args = (spec.model, spec.max_tokens, spec.endpoint, spec.ignore_eos, spec.timeout_s)

    async def go(i: int) -> None:
        model, max_tokens, endpoint, ignore_eos, timeout_s = args
        if not isinstance(max_tokens, int):
            max_tokens = max_tokens[i]
        if pool is not None:
            r = await send_streaming_raw(pool, clock, model, prompts[i], max_tokens, endpoint, ignore_eos, timeout_s)
        else:
            r = await send_streaming(client, clock, model, prompts[i], max_tokens, endpoint, ignore_eos, timeout_s)
        r["worker"] = spec.worker
        if shared_next is not None:
            r["index"] = i
        records[i] = r
        if on_done:
            on_done()

    if spec.slots is not None:
        # Exactly `slots` workers pull from one queue: never more in flight, and no idle slot while
        # requests remain. Several load processes share that queue through `shared_next`: a static split left
        # a process idle, once its own requests had ended sooner, while another still had requests queued.
        nxt = iter(range(len(prompts)))
        stop_at = None if spec.send_until_s is None else t_start_perf + spec.send_until_s

        def claim() -> int | None:
            if stop_at is not None and time.perf_counter() >= stop_at:
                return None  # a duration window: sending stops, the window drains
            if shared_next is None:
                return next(nxt, None)
            with shared_next.get_lock():  # held for one increment: microseconds
                i = shared_next.value
                if i >= len(prompts):
                    return None
                shared_next.value = i + 1
                return i

        total = spec.slots_total or spec.slots

        async def slot(k: int) -> None:
            if spec.stagger_s > 0:  # staggered starts: slot k joins k/total of the stagger after the start
                await asyncio.sleep(max(0.0, t_start_perf + (spec.slot_offset + k) * spec.stagger_s / total
                                        - time.perf_counter()))
            while (i := claim()) is not None:
                await go(i)

        await asyncio.gather(*(slot(k) for k in range(min(spec.slots, len(prompts)))))
    else:
        offsets = spec.offsets_s
        assert offsets is not None

        async def timed(i: int) -> None:
            due = t_start_perf + offsets[i]
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await go(i)
            records[i]["scheduled_ts"] = clock.origin[0] + (due - clock.origin[1])  # type: ignore[index]

        await asyncio.gather(*(timed(i) for i in range(len(prompts))))
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - cpu0
    lag_p99, lag_max = await mon.stop()
    return [r for r in records if r is not None], wall, (cpu / wall if wall > 0 else 0.0), lag_p99, lag_max


def _worker_main(conn: Any, spec: ShardSpec, shared_next: Any = None) -> None:
    """Entry point of a load process (multiprocessing 'spawn'): runs its shard, sends back the result.
    ``shared_next``: the window's shared request counter (closed loop), see :func:`_run_shard`."""

    async def main() -> Any:
        async with make_client(spec.base_url, spec.api_key, spec.pool_size) as client:
            conn.send(("ready", None))
            t_start = conn.recv()
            pending = [0]

            def tick() -> None:
                pending[0] += 1

            async def ticker() -> None:
                while True:
                    await asyncio.sleep(0.25)
                    if pending[0]:
                        conn.send(("tick", pending[0]))
                        pending[0] = 0

            tk = asyncio.get_running_loop().create_task(ticker())
            try:
                return await _run_shard(client, spec, t_start, tick, shared_next)
            finally:
                tk.cancel()
                if pending[0]:
                    conn.send(("tick", pending[0]))

    try:
        conn.send(("result", asyncio.run(main())))
    except BaseException as e:  # report, never hang the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


async def _run_processes(
    window: ShardSpec, schedule: Schedule, on_done: Callable[[], None] | None, processes: int,
) -> LevelResult:
    """``window`` (all prompts, the schedule's slots or offsets) split over ``processes`` spawned load
    processes started together."""
    clock = Clock()
    prompts = window.prompts
    n = len(prompts)
    ctx = mp.get_context("spawn")
    shared_next = None
    if schedule.slots is not None:
        slots: list[int | None] = [c for c in _split(schedule.slots, processes) if c > 0]
        processes = len(slots)
        # Every process gets every prompt and takes the next index from one shared counter (one queue for
        # the window, as in one process); records come back with their index.
        shares: list[list[int]] = [list(range(n)) for _ in slots]
        shared_next = ctx.Value("i", 0)
    else:
        slots = [None] * processes
        shares = [list(range(w, n, processes)) for w in range(processes)]
    offsets = schedule.send_offsets_s
    procs, conns = [], []
    for w in range(processes):
        parent, child = ctx.Pipe()
        mt = window.max_tokens
        spec = replace(window, prompts=tuple(prompts[i] for i in shares[w]), slots=slots[w], worker=w,
                       slot_offset=sum(s or 0 for s in slots[:w]),
                       clock_origin=clock.origin, max_tokens=mt if isinstance(mt, int) else tuple(mt[i] for i in shares[w]),
                       offsets_s=None if offsets is None else tuple(offsets[i] for i in shares[w]))
        p = ctx.Process(target=_worker_main, args=(child, spec, shared_next), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    loop = asyncio.get_running_loop()
    try:
        for c in conns:
            kind, _ = await loop.run_in_executor(None, c.recv)
            if kind != "ready":
                raise RuntimeError(f"load process failed to start: {_}")
        t_start = time.perf_counter() + 0.2 + 0.05 * processes  # every process pre-warms, then all start together
        for c in conns:
            c.send(t_start)

        async def collect(c: Any) -> Any:
            while True:
                kind, val = await loop.run_in_executor(None, c.recv)
                if kind == "tick":
                    for _ in range(val):
                        if on_done:
                            on_done()
                elif kind == "result":
                    return val
                else:
                    raise RuntimeError(f"load process failed: {val}")

        results = await asyncio.gather(*(collect(c) for c in conns))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    records: list[dict[str, Any] | None] = [None] * n
    for w, (recs, *_rest) in enumerate(results):
        if shared_next is not None:
            for r in recs:
                records[r.pop("index")] = r
        else:
            for i, r in zip(shares[w], recs):
                records[i] = r
    wall = max(r[1] for r in results)
    fracs = [r[2] for r in results]
    return LevelResult([r for r in records if r is not None], wall, max(fracs), max(r[3] for r in results),
                       max(r[4] for r in results), clock.origin, processes, fracs,
                       *_rx_fields([r[5] for r in results]))


async def run_level(
    client: httpx.AsyncClient,
    model: str,
    prompts: list[str],
    max_tokens: int | Sequence[int],
    load_kind: str | None = None,
    load_value: float | None = None,
    endpoint: str = "completions",
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
    arrival_offsets_s: Sequence[float] | None = None,
    on_done: Callable[[], None] | None = None,
    processes: int = 1,
    transport: str = "raw",
    schedule: Schedule | None = None,
) -> LevelResult:
    """Send ``prompts`` on a schedule (fixed concurrency or send offsets); return their raw records.

    Args:
        client: from :func:`~tunelab.tasks.loadgen.transport.make_client` (its base_url and auth header are
            reused by extra load processes).
        schedule: a profile's :class:`~tunelab.core.load_profiles.Schedule` for these prompts (``profile.schedule``):
            slots: exactly that many requests in flight while requests remain (as ``vllm bench serve
            --max-concurrency`` with ``--request-rate inf``); send offsets: request i is sent
            ``send_offsets_s[i]`` seconds after the start whatever the server does (open loop, as
            ``--request-rate``).
        load_kind, load_value, arrival_offsets_s: instead of ``schedule``, a warehouse load key
            (``'concurrency'``, c) or (``'rate'``, r/s with one offset per prompt, from
            ``tunelab.core.load_profiles.arrival_offsets``), turned into that profile's schedule.
        max_tokens: ``max_tokens`` of every request, or one per prompt (a workload whose output lengths vary).
        on_done: called after each finished request (progress).
        processes: load processes; > 1 splits the slots (or the send offsets, round robin) over that many
            spawned processes, each with its own event loop and connection pool, started together.
        transport: ``'raw'`` (default: ``send_streaming_raw``, stamps each read before parsing it) or
            ``'httpx'`` (``send_streaming``); the benchmark benchmarks/loadgen_accuracy.py compares them.

    Returns:
        :class:`LevelResult`, records in prompt order.

    Raises:
        ValueError: neither schedule nor load_kind, an unknown load_kind or bad load_value, a rate without one
            offset per prompt, a schedule for another number of prompts, bad processes or transport.
        RuntimeError: a load process failed.
    """
    if schedule is None:
        if load_kind is None:
            raise ValueError("run_level needs schedule= (a load profile's schedule) or load_kind and load_value")
        schedule = profile_for(load_kind, load_value).schedule(  # type: ignore[arg-type]
            len(prompts), send_offsets_s=None if arrival_offsets_s is None else list(arrival_offsets_s))
    if schedule.n_requests != len(prompts):
        raise ValueError(f"schedule is for {schedule.n_requests} requests, got {len(prompts)} prompts")
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if not isinstance(max_tokens, int):
        max_tokens = tuple(int(m) for m in max_tokens)
        if len(max_tokens) != len(prompts):
            raise ValueError(f"max_tokens needs one value per prompt: got {len(max_tokens)} for {len(prompts)} prompts")
    if transport not in ("raw", "httpx"):
        raise ValueError(f"transport must be 'raw' or 'httpx', got {transport!r}")
    auth = client.headers.get("authorization", "")
    window = ShardSpec(base_url=str(client.base_url).rstrip("/"), api_key=auth.removeprefix("Bearer "),
                       model=model, prompts=tuple(prompts), max_tokens=max_tokens, endpoint=endpoint,
                       ignore_eos=ignore_eos, timeout_s=timeout_s, slots=schedule.slots,
                       offsets_s=schedule.send_offsets_s, transport=transport, send_until_s=schedule.send_until_s,
                       stagger_s=schedule.stagger_s, slots_total=schedule.slots)
    if processes > 1 and len(prompts) > 1:
        return await _run_processes(window, schedule, on_done, min(processes, len(prompts)))
    clock = Clock()
    recs, wall, frac, lag99, lagmax, rx = await _run_shard(client, replace(window, clock_origin=clock.origin),
                                                           None, on_done)
    return LevelResult(recs, wall, frac, lag99, lagmax, clock.origin, 1, [frac], *_rx_fields([rx]))


def _rx_fields(summaries: list[dict[str, Any] | None]) -> tuple[str, float | None, float | None]:
    """(rx_stamps, read_delay_p99_s, read_delay_max_s) of a window from its shards' RxStats summaries (the
    busiest shard's p99, like the loop lag)."""
    got = [s for s in summaries if s is not None]
    kernel, read = sum(s["kernel"] for s in got), sum(s["read"] for s in got)
    kind = "kernel" if kernel and not read else ("mixed" if kernel else "read")
    p99 = [s["delay_p99_s"] for s in got if s["delay_p99_s"] is not None]
    mx = [s["delay_max_s"] for s in got if s["delay_max_s"] is not None]
    return kind, (max(p99) if p99 else None), (max(mx) if mx else None)
