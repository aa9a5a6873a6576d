"""Streaming transports: send one request, record when every chunk of generated text arrived.

Each function returns a *raw request record* (the contract with ``tasks.metrics.derive_request``): the send
time, the arrival time of every streamed chunk that carried generated text, the end time, the server's usage
and finish reason.

Why tunelab keeps its own transport: the streaming requests go over a small HTTP/1.1 keep-alive transport of
its own (:class:`RawPool`, :func:`send_streaming_raw`): each network read carries the kernel's receive time of
its bytes (``SO_TIMESTAMPNS``, :mod:`tasks.rx_stamps`), so a busy or descheduled event loop does not make a
stamp late, and its SSE events are handled right there (one ``json.loads`` each), with no task switch per
chunk. Where the kernel gives no stamp the read time is used, and the window's ``LevelResult`` says so.
httpx's pure-Python stack (h11/httpcore/anyio) made the client itself the bottleneck from concurrency 64 on a
2-core machine (docs/measurement.md has the numbers); it stays available (``transport='httpx'``,
:func:`send_streaming`) and serves every non-streaming call (/tokenize, /metrics). Not the openai client:
per-chunk pydantic parsing would cost CPU on the cores that time the stream.

Connections are opened on demand, so the pool never caps the requested concurrency; before a concurrency
window it is filled with that many open keep-alive connections, so TCP set-up is not part of the first
wave's TTFT.

Timestamps are ``time.perf_counter()`` mapped onto one ``time.time()`` origin (:class:`Clock`): monotonic and
high-resolution, yet readable as epoch seconds. On Linux ``perf_counter`` is CLOCK_MONOTONIC, one clock for
all processes, so several load processes share one origin exactly.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any, Callable

import httpx

from tunelab.tasks import rx_stamps

__all__ = ["Clock", "send_streaming", "RawPool", "RxStats", "send_streaming_raw", "make_client",
           "prewarm_connections"]

class Clock:
    """Epoch seconds with perf_counter resolution: ``now() = epoch0 + (perf_counter() - perf0)``.

    Args:
        origin: ``(epoch0, perf0)`` to share one origin between processes (``Clock().origin`` of the parent);
            default: read both clocks now.
    """

    def __init__(self, origin: tuple[float, float] | None = None) -> None:
        self._e0, self._p0 = origin if origin is not None else (time.time(), time.perf_counter())

    @property
    def origin(self) -> tuple[float, float]:
        """``(epoch0, perf0)``: the pair this clock maps perf_counter seconds from."""
        return (self._e0, self._p0)

    def now(self) -> float:
        """Current time, epoch seconds (float)."""
        return self._e0 + (time.perf_counter() - self._p0)

    def to_perf(self, ts: float) -> float:
        """An epoch timestamp of this clock back on the ``time.perf_counter()`` scale."""
        return ts - self._e0 + self._p0


def _iter_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete ``data:`` payloads in ``buf`` and the unfinished tail (SSE lines end with \\n, \\r\\n)."""
    *lines, rest = buf.split(b"\n")
    out = []
    for ln in lines:
        if ln.startswith(b"data:"):
            out.append(ln[5:].strip())
    return out, rest


def _completion_request(model: str, prompt: str, max_tokens: int, endpoint: str,
                        ignore_eos: bool, messages: list[dict] | None = None) -> tuple[str, dict[str, Any], bool]:
    """``(path, JSON body, chat?)`` of one streamed, greedy (temperature 0) completion whose last chunk
    carries the usage: ``endpoint='chat'`` asks ``/v1/chat/completions`` with ``messages`` (a conversation:
    multi-turn sessions) or else one user message ``prompt``, anything else ``/v1/completions`` with the
    prompt. Both transports send this same body."""
    body: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
        # continuous_usage_stats: a usage on every chunk (vLLM's StreamOptions; a server without it sends the last
        # chunk's only), so the first content chunk's token count is known and TPOT divides by the tokens after it.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "ignore_eos": ignore_eos,
    }
    chat = endpoint == "chat"
    if chat:
        body["messages"] = list(messages) if messages else [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", body, True
    body["prompt"] = prompt
    return "/v1/completions", body, False


def _new_record() -> dict[str, Any]:
    """An empty raw request record (the keys of ``tasks.metrics.derive_request``'s input), ``chunk_ts`` a
    list the transport appends to; ``first_content_ts`` and ``reasoning_chunks`` (reasoning streams) are set
    by :func:`_take_event`."""
    return {"send_ts": None, "chunk_ts": [], "end_ts": None, "prompt_tokens": None, "output_tokens": None,
            "finish_reason": None, "transport_error": None, "first_content_ts": None, "reasoning_chunks": 0,
            "cached_prompt_tokens": None, "first_chunk_tokens": None}


def _take_event(obj: dict[str, Any], t: float, rec: dict[str, Any], chat: bool) -> None:
    """One parsed SSE event of a streamed completion into ``rec``: its usage (prompt and completion tokens),
    ``t`` appended to ``chunk_ts`` once per choice that carries generated tokens of any kind (chat: a delta
    with ``content``, ``reasoning``/``reasoning_content`` or ``tool_calls``; completions: ``text``; role-only
    and empty deltas do not count), ``first_content_ts`` set at the first visible text (``content`` /
    ``text``), ``reasoning_chunks`` counting chunks with reasoning text, the finish reason, and
    ``first_chunk_tokens``: the cumulative ``usage.completion_tokens`` on the first chunk that carries tokens
    (a server that streams usage on every chunk, ``stream_options.continuous_usage_stats``; None otherwise). Called
    for every event, so kept to dict look-ups."""
    usage = obj.get("usage")
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["output_tokens"] = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")  # vllm serve --enable-prompt-tokens-details
        if details:
            rec["cached_prompt_tokens"] = details.get("cached_tokens")
    for ch in obj.get("choices") or ():
        if chat:
            delta = ch.get("delta") or {}
            content = delta.get("content")
            # A server run with --reasoning-parser streams the thinking as `reasoning` (vLLM releases before
            # 0.10.2, and DeepSeek's API: `reasoning_content`) before the answer's `content`; tool calls come as
            # `tool_calls` deltas. All are generated tokens: they count for TTFT and ITL.
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                rec["reasoning_chunks"] += 1
            token = content or reasoning or delta.get("tool_calls")
        else:
            content = token = ch.get("text")
        if token:
            if not rec["chunk_ts"] and usage:
                rec["first_chunk_tokens"] = usage.get("completion_tokens")
            rec["chunk_ts"].append(t)
        if content:
            if rec["first_content_ts"] is None:
                rec["first_content_ts"] = t
            if "text" in rec:  # kept only when asked (a multi-turn session appends the answer to its history)
                rec["text"].append(content)
        fr = ch.get("finish_reason")
        if fr:
            rec["finish_reason"] = fr


async def send_streaming(
    client: httpx.AsyncClient,
    clock: Clock,
    model: str,
    prompt: str,
    max_tokens: int,
    endpoint: str = "completions",
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
    messages: list[dict] | None = None,
    keep_text: bool = False,
) -> dict[str, Any]:
    """Send one streaming request and record raw timings (the raw record of ``tasks.metrics.derive_request``).

    Returns a dict with ``send_ts`` (epoch s, just before the request is handed to httpx), ``chunk_ts``
    (epoch s at which the network read holding each chunk with non-empty generated text reached the event
    loop, content, reasoning and tool-call deltas alike; role-only and empty chunks excluded; several events in
    one read share its stamp; the last one is the request's end, where ``tasks.metrics`` ends E2EL and TPOT),
    ``first_content_ts`` (epoch s of the first chunk with visible ``content``/``text``; None if none came),
    ``reasoning_chunks`` (chunks whose delta carried ``reasoning`` or ``reasoning_content``), ``end_ts`` (the stream's end: the last
    byte, after the usage-only chunk and ``[DONE]``; None if the stream was cut), ``prompt_tokens``/``output_tokens`` (server usage; None if
    absent), ``finish_reason``, ``transport_error`` (None on success: e.g. ``HTTP 503: ...``,
    ``RemoteProtocolError: ...``, ``stream ended without [DONE]``), ``cached_prompt_tokens`` (the usage's
    ``prompt_tokens_details.cached_tokens``: prompt tokens served from the prefix cache; None unless the server
    runs with ``--enable-prompt-tokens-details``), and with ``keep_text`` the answer's content pieces as
    ``text`` (a list of str). ``messages``: the chat conversation to send instead of one user message.
    Never raises for HTTP or stream errors.
    """
    path, body, chat = _completion_request(model, prompt, max_tokens, endpoint, ignore_eos, messages)
    rec = _new_record()
    if keep_text:
        rec["text"] = []
    done = False
    loads = json.loads
    now = clock.now
    try:
        rec["send_ts"] = now()
        async with client.stream("POST", path, json=body, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                rec["end_ts"] = now()
                rec["transport_error"] = f"HTTP {resp.status_code}: {text}"
                return rec
            buf = b""
            async for raw in resp.aiter_raw():
                t = now()
                events, buf = _iter_events(buf + raw)
                for data in events:
                    if data == b"[DONE]":
                        done = True
                        continue
                    _take_event(loads(data), t, rec, chat)
            rec["end_ts"] = now()
            if not done:
                rec["transport_error"] = "stream ended without [DONE]"
    except (httpx.HTTPError, ValueError, asyncio.TimeoutError) as e:  # ValueError: bad JSON in an event
        rec["transport_error"] = f"{type(e).__name__}: {e}"[:300]
        if not done:
            rec["end_ts"] = None
    return rec


# --------------------------------------------------------------------------- raw HTTP/1.1 streaming transport


class _StreamProtocol:
    """One keep-alive HTTP/1.1 connection. Parses the response *inside* ``data_received(data, t)``: ``t`` is
    the read's stamp (the kernel's receive time where there is one, see :class:`_StampedSocket`); the bytes
    are de-chunked and split into SSE events, and each event is handed to the request's
    ``on_event(payload, t)`` synchronously — no task switch per chunk. ``end_t`` is the stamp of the read
    that completed the response."""

    def __init__(self) -> None:
        self.transport: _StampedSocket | None = None
        self.closed = False
        self.reset(None, None)

    def reset(self, on_event: Callable[[bytes, float], None] | None, done: asyncio.Future | None) -> None:
        self.on_event = on_event
        self.done = done
        self.state = "head"
        self.buf = b""
        self.sse = b""
        self.status = 0
        self.chunked = False
        self.remaining = -1  # content-length left, or current chunk's bytes left
        self.keep_alive = True
        self.body = b""  # non-200 bodies only
        self.got_bytes = False
        self.end_t: float | None = None

    def connection_made(self, transport: "_StampedSocket") -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(
                "peer closed connection without sending complete message body" if self.got_bytes
                else f"connection closed before a response ({exc or 'EOF'})"))

    def _body(self, data: bytes, t: float) -> None:
        if self.status != 200:
            self.body += data
            return
        sse = self.sse + data
        if b"\n" not in data:
            self.sse = sse
            return
        *lines, self.sse = sse.split(b"\n")
        cb = self.on_event
        for ln in lines:
            if ln[:5] == b"data:" and cb is not None:
                cb(ln[5:].strip(), t)

    def _finish(self, t: float) -> None:
        self.end_t = t
        if self.done is not None and not self.done.done():
            self.done.set_result(self.status)

    def data_received(self, data: bytes, t: float) -> None:
        self.got_bytes = True
        buf = self.buf + data
        while True:
            if self.state == "head":
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    self.buf = buf
                    return
                head = buf[:i].decode("latin-1").split("\r\n")
                buf = buf[i + 4:]
                try:
                    self.status = int(head[0].split(" ", 2)[1])
                except (IndexError, ValueError):
                    self.status = 0
                for h in head[1:]:
                    k, _, v = h.partition(":")
                    k, v = k.strip().lower(), v.strip().lower()
                    if k == "transfer-encoding" and "chunked" in v:
                        self.chunked = True
                    elif k == "content-length":
                        self.remaining = int(v)
                    elif k == "connection" and v == "close":
                        self.keep_alive = False
                if self.chunked:
                    self.state, self.remaining = "size", -1
                elif self.remaining >= 0:
                    self.state = "fixed"
                else:
                    self.state, self.keep_alive = "until_close", False
            elif self.state == "size":
                i = buf.find(b"\r\n")
                if i < 0:
                    self.buf = buf
                    return
                size = int(buf[:i].split(b";", 1)[0], 16)
                buf = buf[i + 2:]
                if size == 0:
                    self.state = "trailer"
                else:
                    self.state, self.remaining = "chunk", size
            elif self.state == "chunk":
                if not buf:
                    self.buf = b""
                    return
                take = buf[: self.remaining]
                buf = buf[len(take):]
                self.remaining -= len(take)
                self._body(take, t)
                if self.remaining == 0:
                    self.state = "chunk_end"
            elif self.state == "chunk_end":
                if len(buf) < 2:
                    self.buf = buf
                    return
                buf = buf[2:]
                self.state = "size"
            elif self.state == "trailer":
                i = buf.find(b"\r\n")
                if i < 0:
                    self.buf = buf
                    return
                line, buf = buf[:i], buf[i + 2:]
                if not line:
                    self.state, self.buf = "idle", b""
                    self._finish(t)
                    return
            elif self.state == "fixed":
                take = buf[: self.remaining]
                buf = buf[len(take):]
                self.remaining -= len(take)
                if take:
                    self._body(take, t)
                if self.remaining == 0:
                    self.state, self.buf = "idle", b""
                    self._finish(t)
                    return
                self.buf = b""
                return
            elif self.state == "until_close":
                if buf:
                    self._body(buf, t)
                self.buf = b""
                return
            else:  # idle: bytes nobody asked for
                self.buf = b""
                return

    def eof_received(self, t: float) -> None:
        if self.state == "until_close":
            self._finish(t)


class RxStats:
    """How a pool's reads were stamped. ``kernel`` / ``read``: reads stamped with the kernel's receive time /
    with the read time (no kernel stamp); ``delays_s``: for kernel-stamped reads, read time - kernel receive
    time (seconds): how late the client got to its bytes, i.e. what a read-time stamp would have added."""

    def __init__(self) -> None:
        self.kernel = 0
        self.read = 0
        self.delays_s: list[float] = []

    def summary(self) -> dict[str, Any]:
        """``{'kernel': n, 'read': n, 'delay_p99_s': float | None, 'delay_max_s': float | None}``."""
        d = sorted(self.delays_s)
        return {"kernel": self.kernel, "read": self.read,
                "delay_p99_s": d[min(len(d) - 1, int(0.99 * len(d)))] if d else None,
                "delay_max_s": d[-1] if d else None}


class _StampedSocket:
    """The little of an asyncio transport the raw client needs (``write``, ``close``, ``is_closing``) over a
    non-blocking socket that is read with ``recvmsg`` from a plain ``loop.add_reader`` callback, so that
    every read carries the kernel's receive stamp (:mod:`tasks.rx_stamps`). asyncio's own transports read
    with ``recv`` and drop ancillary data. Stamps are handed to the protocol on the :class:`Clock`'s scale."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, proto: _StreamProtocol,
                 clock: "Clock", stats: RxStats) -> None:
        self.loop, self.sock, self.proto, self.stats = loop, sock, proto, stats
        self.epoch0, self.perf0 = clock.origin
        self.fd = sock.fileno()
        self.out = bytearray()
        self.closing = False
        self.kernel = rx_stamps.enable(sock)
        proto.connection_made(self)
        loop.add_reader(self.fd, self._read)

    def _read(self) -> None:
        try:
            data, t_read, t_kernel = rx_stamps.recv_stamped(self.sock, 262144, self.kernel)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        if t_kernel is None:
            self.stats.read += 1
            t = t_read
        else:
            self.stats.kernel += 1
            self.stats.delays_s.append(t_read - t_kernel)
            t = t_kernel
        t = self.epoch0 + (t - self.perf0)
        if not data:
            self.proto.eof_received(t)
            self._lost(None)
            return
        self.proto.data_received(data, t)

    def write(self, data: bytes) -> None:
        if self.closing:
            raise ConnectionError("write on a closed connection")
        if not self.out:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._lost(e)
                return
            if n == len(data):
                return
            data = data[n:]
            self.loop.add_writer(self.fd, self._flush)
        self.out += data

    def _flush(self) -> None:
        try:
            n = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        del self.out[:n]
        if not self.out:
            self.loop.remove_writer(self.fd)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        """Close now (the client only closes between requests or after a failure: nothing to flush)."""
        self._lost(None)

    def _lost(self, exc: Exception | None) -> None:
        if self.fd < 0:
            return
        self.closing = True
        self.loop.remove_reader(self.fd)
        if self.out:
            self.loop.remove_writer(self.fd)
        self.fd = -1
        self.sock.close()
        self.proto.connection_lost(exc)


class RawPool:
    """Keep-alive HTTP/1.1 connections to one server, opened on demand, never capped (a request never waits
    for a connection). Used by :func:`send_streaming_raw`; ``prewarm(n)`` opens n connections ahead. Every
    read is stamped with the kernel's receive time where the platform gives one (Linux), else with the read
    time; ``rx`` counts which (:class:`RxStats`).

    Args:
        base_url: ``http://host:port`` (no TLS: the server is local to the load generator).
        api_key: sent as ``Authorization: Bearer``; None/'' sends none.
        clock: the :class:`Clock` whose epoch scale the stamps are given on.

    Raises:
        ValueError: ``base_url`` is not ``http://``.
    """

    def __init__(self, base_url: str, api_key: str | None, clock: "Clock") -> None:
        u = httpx.URL(base_url)
        if u.scheme != "http":
            raise ValueError(f"base_url must be http://host:port for the raw transport, got {base_url!r}")
        self.host = u.host
        self.port = u.port or 80
        self.clock = clock
        self.rx = RxStats()
        self.idle: list[_StreamProtocol] = []
        self.all: list[_StreamProtocol] = []
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._head = (f"Host: {self.host}:{self.port}\r\n{auth}Content-Type: application/json\r\n"
                      "Accept: text/event-stream\r\n").encode()

    async def _open(self) -> _StreamProtocol:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        err: OSError | None = None
        for family, kind, proto_num, _name, addr in infos:
            sock = socket.socket(family, kind, proto_num)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, addr)
            except OSError as e:
                sock.close()
                err = e
                continue
            except BaseException:
                sock.close()
                raise
            proto = _StreamProtocol()
            _StampedSocket(loop, sock, proto, self.clock, self.rx)
            self.all.append(proto)
            return proto
        raise err or OSError(f"cannot resolve {self.host}:{self.port}")

    async def acquire(self) -> tuple[_StreamProtocol, bool]:
        """(connection, reused?)"""
        while self.idle:
            p = self.idle.pop()
            if not p.closed and p.transport is not None and not p.transport.is_closing():
                return p, True
        return await self._open(), False

    def release(self, p: _StreamProtocol) -> None:
        if p.keep_alive and not p.closed and p.state == "idle":
            p.reset(None, None)
            self.idle.append(p)
        elif p.transport is not None:
            p.transport.close()

    async def prewarm(self, n: int) -> None:
        """Open connections until ``n`` are idle."""
        need = n - len(self.idle)
        if need > 0:
            self.idle.extend(await asyncio.gather(*(self._open() for _ in range(need))))

    def request_bytes(self, path: str, body: bytes) -> bytes:
        return b"POST " + path.encode() + b" HTTP/1.1\r\n" + self._head + \
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body

    def close(self) -> None:
        for p in self.all:
            if p.transport is not None:
                p.transport.close()
        self.idle.clear()
        self.all.clear()


async def send_streaming_raw(
    pool: RawPool,
    clock: Clock,
    model: str,
    prompt: str,
    max_tokens: int,
    endpoint: str = "completions",
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
    messages: list[dict] | None = None,
    keep_text: bool = False,
) -> dict[str, Any]:
    """As :func:`send_streaming`, over a :class:`RawPool` connection: each network read is stamped in
    ``data_received`` before it is parsed, and events are handled there, without a task switch per chunk.
    A reused keep-alive connection that the server had closed is retried once on a fresh one (nothing
    was received yet; ``send_ts`` is re-stamped). Never raises for HTTP or stream errors."""
    path, body, chat = _completion_request(model, prompt, max_tokens, endpoint, ignore_eos, messages)
    payload = pool.request_bytes(path, json.dumps(body).encode())
    rec = _new_record()
    if keep_text:
        rec["text"] = []
    state = {"done": False}
    loads = json.loads

    def on_event(data: bytes, t: float) -> None:
        if data == b"[DONE]":
            state["done"] = True
            return
        try:
            obj = loads(data)
        except ValueError as e:
            rec["transport_error"] = rec["transport_error"] or f"bad JSON event: {e}"[:300]
            return
        _take_event(obj, t, rec, chat)

    loop = asyncio.get_running_loop()
    conn: _StreamProtocol | None = None
    for attempt in (0, 1):
        conn = None
        reused = False
        try:
            conn, reused = await pool.acquire()
            done: asyncio.Future = loop.create_future()
            conn.reset(on_event, done)
            rec["send_ts"] = clock.now()
            conn.transport.write(payload)  # type: ignore[union-attr]
            status = await asyncio.wait_for(done, timeout_s)
            # The stamp of the read that completed the response, not the moment this task resumed.
            rec["end_ts"] = conn.end_t if conn.end_t is not None else clock.now()
            if status != 200:
                rec["transport_error"] = f"HTTP {status}: {conn.body.decode(errors='replace')[:300]}"
            elif not state["done"] and rec["transport_error"] is None:
                rec["transport_error"] = "stream ended without [DONE]"
            pool.release(conn)
            return rec
        except (ConnectionError, OSError) as e:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            if attempt == 0 and conn is not None and reused and not conn.got_bytes:
                continue
            rec["transport_error"] = f"{type(e).__name__}: {e}"[:300]
            rec["end_ts"] = None
            return rec
        except asyncio.TimeoutError:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            rec["transport_error"] = f"TimeoutError: no complete response within {timeout_s} s"
            rec["end_ts"] = None
            return rec
    return rec


async def prewarm_connections(client: httpx.AsyncClient, n: int) -> None:
    """Open ``n`` keep-alive connections (``n`` concurrent ``GET /health``) so a window's first wave does not
    pay for TCP set-up inside its TTFT. Errors are ignored (the window will show them)."""

    async def one() -> None:
        try:
            await client.get("/health", timeout=10)
        except httpx.HTTPError:
            pass

    await asyncio.gather(*(one() for _ in range(max(0, n))))


def make_client(base_url: str, api_key: str, concurrency: int) -> httpx.AsyncClient:
    """An AsyncClient whose pool never caps the requested concurrency (``concurrency + 8`` connections, all
    kept alive), with the API key as a bearer token."""
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {api_key}"},
        limits=limits,
        timeout=httpx.Timeout(120.0, connect=10.0),
    )
