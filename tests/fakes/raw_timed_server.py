"""A lean FAKE of the timed OpenAI server: the same schedule, routes and log, on a bare asyncio.Protocol.

This is a fake, for tests and the load generator's accuracy benchmark only. It behaves as the uvicorn fake in
``timed_openai_server.py`` does (that module's docstring is the specification: schedule, ``recv`` and
``emit_pre`` stamps, faults, ``<rid>`` in the first token, the fake tokenizer, ``/fake/*`` routes); only the
HTTP stack differs. Why it exists: the uvicorn fake spends ~100 µs of Python per streamed chunk (ASGI
``send`` -> h11 -> transport) and runs every request as a task woken by ``asyncio.sleep``. At concurrency
64 that is ~6400 chunks/s and a large part of a core, so its event loop reads new requests late, and that
lateness lands in every client's TTFT error as "request path". Here:

* HTTP/1.1 keep-alive is parsed in ``data_received`` (request line, headers, ``Content-Length`` body; no
  pipelining beyond queueing a request that arrives while the previous response is still streaming);
  ``recv`` is the ``perf_counter()`` taken at the start of the read that completed the request's head;
* a streamed response is ``Transfer-Encoding: chunked`` SSE; each chunk is one ``loop.call_at`` callback
  (no task, no coroutine) that stamps ``emit_pre``, writes the pre-framed bytes, stamps ``emit`` and
  schedules the next chunk at its due time (``recv + ttft_s + sent * itl_s``, so lateness never drifts);
* the bytes of a regular middle chunk are encoded once per request;
* sockets are read with ``recvmsg`` from a plain ``loop.add_reader`` callback (no asyncio transport), with
  ``SO_TIMESTAMPNS`` on, so each request also logs ``recv_kernel``: when the kernel queued its bytes on the
  fake's socket (CLOCK_REALTIME mapped onto perf_counter at the read; None where the option is missing).
  ``recv - recv_kernel`` is how long the request waited for the fake's event loop; ``recv`` stays the
  reference of the schedule and of the TTFT truth, as in the uvicorn fake;
* a read only stamps and stores the bytes; parsing and handling them is queued behind the other reads of
  the same event-loop pass (``call_soon``). When many requests arrive together (at concurrency 64 a wave of
  streams ends at once and the client sends the next wave within a millisecond), every one of them is read,
  and stamped, within microseconds, instead of after the parsing of all those before it.

Run it through :class:`timed_openai_server.FakeServerProcess` with ``server="raw"``, or
``python tests/fakes/timed_openai_server.py --server raw --port 8123 ...``.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import socket
import struct
import time
from typing import Any, Callable

__all__ = ["serve_raw"]

_JSON_HEAD = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n\r\n")
_REASON = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 411: b"Length Required",
           503: b"Service Unavailable"}


# Linux: SO_TIMESTAMPNS (== SCM_TIMESTAMPNS) is 35 on the asm-generic ABI (x86_64, arm64).
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")


class _SockTransport:
    """The little of asyncio.Transport the fake uses (write, close, is_closing) over a non-blocking socket,
    read by ``recvmsg`` so that the kernel's receive timestamp of each read comes with its bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, proto: "_Conn") -> None:
        self.loop, self.sock, self.proto = loop, sock, proto
        self.fd = sock.fileno()
        self.out = bytearray()
        self.closing = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self.kstamp = True
        except OSError:
            self.kstamp = False
        proto.connection_made(self)  # type: ignore[arg-type]
        loop.add_reader(self.fd, self._read)

    def _read(self) -> None:
        t = time.perf_counter()
        try:
            data, anc, _, _ = self.sock.recvmsg(262144, 64 if self.kstamp else 0)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, anc = b"", []
        if not data:
            self.loop.remove_reader(self.fd)
            self.loop.call_soon(self._shut)  # after the bytes already queued
            return
        tk = None
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                sec, ns = _TIMESPEC.unpack_from(raw)
                tk = sec + ns * 1e-9 - (time.time() - time.perf_counter())
        self.loop.call_soon(self._deliver, data, t, tk)

    def _deliver(self, data: bytes, t: float, tk: float | None) -> None:
        if self.fd >= 0:
            self.proto.data_received(data, t, tk)

    # write/_flush look like RawTransport.write/_flush of tunelab/tasks/loadgen/transport.py, and stay a copy
    # on purpose. That routine is the client side, code under test: this fake is the reference its timing
    # error is measured against (tests/test_loadgen.py, benchmarks/loadgen_accuracy.py), so it must not run
    # the client's code: a slip in the shared send/buffer path (a lost tail after a partial send, a writer
    # never removed) would then delay or corrupt both sides alike and could hide itself. The fake also imports
    # nothing of tunelab (it runs as a standalone script). And the server's semantics differ: a write after
    # close is dropped rather than raised, close() waits for the buffered bytes, and EAGAIN is not a loss.
    def write(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.out:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._shut()
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
            if e.errno != errno.EAGAIN:
                self._shut()
            return
        del self.out[:n]
        if not self.out:
            self.loop.remove_writer(self.fd)
            if self.closing:
                self._shut()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        """Close after the buffered bytes are sent."""
        self.closing = True
        if not self.out:
            self._shut()

    def _shut(self) -> None:
        if self.fd < 0:
            return
        self.closing = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self.fd = -1
        self.proto.connection_lost(None)


def _frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class _State:
    """The fake's shared state: request log, counters and the fake tokenizer's vocabulary."""

    def __init__(self, timing: Any, model: str, tokenize: Callable[[str], list[str]], fault: Any,
                 encode_chunk: Callable[..., bytes], stalls: Any = None,
                 reasoning: Callable[[str], tuple[int, str]] | None = None) -> None:
        self.timing = timing
        # prompt -> (tokens streamed as reasoning first, delta field): timed_openai_server.reasoning_marker
        self.reasoning = reasoning or (lambda prompt: (0, "content"))
        self.stalls = stalls  # timed_openai_server.SizeStalls, or None: no new-size stalls
        self.model = model
        self.tokenize = tokenize
        self.fault = fault
        self.encode_chunk = encode_chunk
        self.log: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.n = 0
        self.next_rid = 0
        self.vocab: dict[str, int] = {}
        self.rev: list[str] = []

    def tok_ids(self, text: str) -> list[int]:
        ids = []
        for p in self.tokenize(text):
            i = self.vocab.get(p)
            if i is None:
                i = self.vocab[p] = len(self.rev)
                self.rev.append(p)
            ids.append(i)
        return ids


class _Conn:
    """One client connection: parses requests in ``data_received``, streams responses from timer callbacks."""

    def __init__(self, st: _State) -> None:
        self.st = st
        self.loop = asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.head: tuple[str, str, int, bool] | None = None  # method, path, content-length, keep-alive
        self.t_head = 0.0
        self.tk_head: float | None = None
        self.tk_first: float | None = None  # kernel stamp of the first read that held bytes of this request
        self.busy = False  # a response is streaming
        self.queue: list[tuple[str, str, bytes, float, float | None, bool]] = []
        self.closed = False

    def connection_made(self, transport: _SockTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes, t: float, tk: float | None) -> None:
        """``t``: perf_counter at the read; ``tk``: the kernel's receive stamp of the read (perf_counter)."""
        if not self.buf:
            self.tk_first = tk
        buf = self.buf + data
        while True:
            if self.head is None:
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    break
                lines = buf[:i].decode("latin-1").split("\r\n")
                buf = buf[i + 4:]
                method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
                length, keep, chunked = 0, True, False
                for h in lines[1:]:
                    k, _, v = h.partition(":")
                    k, v = k.strip().lower(), v.strip().lower()
                    if k == "content-length":
                        length = int(v)
                    elif k == "connection" and v == "close":
                        keep = False
                    elif k == "transfer-encoding" and "chunked" in v:
                        chunked = True
                if chunked:
                    self._json(411, {"error": {"message": "fake: chunked request bodies are not implemented"}})
                    self.transport.close()  # type: ignore[union-attr]
                    return
                self.head, self.t_head = (method, path.split("?", 1)[0], length, keep), t
                self.tk_head = self.tk_first if self.tk_first is not None else tk
            method, path, length, keep = self.head
            if len(buf) < length:
                break
            body, buf = buf[:length], buf[length:]
            self.head = None
            self.queue.append((method, path, body, self.t_head, self.tk_head, keep))
            self.tk_first = tk if buf else None
        self.buf = buf
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while self.queue and not self.busy and not self.closed:
            self._handle(*self.queue.pop(0))

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.transport.write(_JSON_HEAD % (status, _REASON.get(status, b"X"), len(body)) + body)  # type: ignore[union-attr]

    def _handle(self, method: str, path: str, body: bytes, t_recv: float, tk_recv: float | None,
                keep: bool) -> None:
        st = self.st
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            req = json.loads(body or b"{}")
            if not req.get("stream"):
                self._json(400, {"error": {"message": "fake: only stream=true is implemented"}})
            else:
                self._stream(req, path.endswith("chat/completions"), t_recv, tk_recv, keep)
                return
        elif path == "/health":
            self._json(200, {})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": st.model, "object": "model", "root": st.model}]})
        elif path == "/tokenize" and method == "POST":
            ids = st.tok_ids(str(json.loads(body or b"{}").get("prompt", "")))
            self._json(200, {"count": len(ids), "max_model_len": 1 << 20, "tokens": ids})
        elif path == "/detokenize" and method == "POST":
            req = json.loads(body or b"{}")
            self._json(200, {"prompt": "".join(st.rev[i] for i in req.get("tokens", []))})
        elif path == "/fake/log":
            self._json(200, {"timing": st.timing.__dict__, "log": st.log,
                             "clock": {"time": time.time(), "perf_counter": time.perf_counter()}})
        elif path == "/fake/reset" and method == "POST":
            st.log, st.max_in_flight, st.n = [], st.in_flight, 0
            self._json(200, {})
        elif path == "/fake/stats":
            self._json(200, {"in_flight": st.in_flight, "max_in_flight": st.max_in_flight, "requests": st.n,
                             "cpu_s": time.process_time(), "stalls": st.stalls.stalls if st.stalls else []})
        else:
            self._json(404, {"error": {"message": f"fake: no route {method} {path}"}})
        if not keep:
            self.transport.close()  # type: ignore[union-attr]

    def _stream(self, req: dict, chat: bool, t_recv: float, tk_recv: float | None, keep: bool) -> None:
        st, timing, perf = self.st, self.st.timing, time.perf_counter
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages") or [])
        else:
            prompt = str(req.get("prompt", ""))
        fault = st.fault.search(prompt)
        if fault and fault.group(1) == "503":
            self._json(503, {"error": {"message": "fake: service unavailable (injected)", "code": 503}})
            if not keep:
                self.transport.close()  # type: ignore[union-attr]
            return
        cut_after = int(fault.group(2)) if fault and fault.group(2) else None
        n_tokens = int(req.get("max_tokens") or 16)
        prompt_tokens = len(st.tokenize(prompt)) + (3 if chat else 0)
        rid = st.next_rid
        st.next_rid += 1
        st.n += 1
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        stalls = st.stalls
        shift0 = stalls.shift_s if stalls else 0.0  # before: the request that makes a new size is in the slow batch
        if stalls:
            stalls.arrived(st.in_flight)
        entry: dict[str, Any] = {"rid": rid, "endpoint": "chat" if chat else "completions", "recv": t_recv,
                                 "recv_at_read": True, "recv_kernel": tk_recv,
                                 "model": req.get("model"), "prompt_head": prompt[:64], "prompt_len_chars": len(prompt),
                                 "prompt_sha1": hashlib.sha1(prompt.encode()).hexdigest(),
                                 "chunk_tokens": [], "emit": [], "emit_pre": [], "role": None, "usage": None,
                                 "done": None, "done_pre": None, "due": [], "cut": False}
        st.log.append(entry)
        oid = f"cmpl-fake-{rid}"
        created = int(time.time())
        obj_kind = "chat.completion.chunk" if chat else "text_completion"
        model = st.model

        def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
            return _frame(st.encode_chunk(oid, created, model, chat, text, finish, role))

        tr = self.transport
        assert tr is not None
        self.busy = True
        tr.write(_SSE_HEAD)
        if chat:
            tr.write(chunk(None, None, role=True))
            entry["role"] = perf()
        tpc = max(1, timing.tokens_per_chunk)
        regular = chunk(" t" * tpc, None)
        emit, pre, dues, ctoks = entry["emit"], entry["emit_pre"], entry["due"], entry["chunk_tokens"]
        t0 = t_recv + timing.ttft_s
        itl = timing.itl_s
        loop = self.loop
        # loop.time() is time.monotonic(); perf_counter is CLOCK_MONOTONIC too on Linux, but map explicitly.
        to_loop = loop.time() - perf()
        progress = {"sent": 0, "k": 0}
        think_k, think_field = st.reasoning(prompt) if chat else (0, "content")

        def finish() -> None:
            st.in_flight -= 1
            self.busy = False
            if not keep:
                tr.close()
            else:
                self._next()

        def shift() -> float:
            return (stalls.shift_s - shift0) if stalls else 0.0

        def step() -> None:
            if self.closed:
                st.in_flight -= 1
                return
            sent = progress["sent"]
            due = t0 + sent * itl + shift()
            if due > perf():  # a stall began after this step was scheduled
                loop.call_at(due + to_loop, step)
                return
            m = min(tpc, n_tokens - sent)
            if sent < think_k:
                m = min(m, think_k - sent)  # a chunk is all reasoning or all content
            last = sent + m >= n_tokens
            if sent == 0 or last or m != tpc or sent < think_k:
                data = _frame(st.encode_chunk(
                    oid, created, model, chat, "".join((f"<{rid}>" if sent + j == 0 else " t") for j in range(m)),
                    "length" if last else None, field=think_field if sent < think_k else "content"))
            else:
                data = regular
            pre.append(perf())
            tr.write(data)
            emit.append(perf())
            dues.append(due)
            ctoks.append(m)
            sent += m
            progress["sent"] = sent
            progress["k"] += 1
            if cut_after is not None and progress["k"] >= cut_after:
                entry["cut"] = True
                st.in_flight -= 1
                tr.close()  # mid-stream: no terminating chunk, no [DONE]
                return
            if sent < n_tokens:
                loop.call_at(t0 + sent * itl + shift() + to_loop, step)
                return
            if timing.usage_delay_s > 0:
                loop.call_later(timing.usage_delay_s, end)
            else:
                end()

        def end() -> None:
            if self.closed:
                st.in_flight -= 1
                return
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                     "total_tokens": prompt_tokens + n_tokens}
            u = {"id": oid, "object": obj_kind, "created": created, "model": model, "choices": [], "usage": usage}
            tr.write(_frame(b"data: " + json.dumps(u).encode() + b"\n\n"))
            entry["usage"] = perf()
            entry["done_pre"] = perf()
            tr.write(_frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            entry["done"] = perf()
            finish()

        loop.call_at(t0 + shift() + to_loop, step)


def serve_raw(timing: Any, model: str, tokenize: Callable[[str], list[str]], fault: Any,
              encode_chunk: Callable[..., bytes], port: int | None = None, fd: int | None = None,
              stalls: Any = None, reasoning: Callable[[str], tuple[int, str]] | None = None) -> None:
    """Serve the lean fake on 127.0.0.1:``port`` or an inherited listening socket ``fd`` until killed.
    ``tokenize``, ``fault``, ``encode_chunk`` (one SSE event), ``stalls`` (``SizeStalls``: the
    ``new_size_stall_s`` behaviour and its log) and ``reasoning`` (the ``[[reasoning:K:FIELD]]`` marker) come from the specification module, so both fakes count
    tokens, inject faults, encode chunks and stall the same way."""

    async def main() -> None:
        st = _State(timing, model, tokenize, fault, encode_chunk, stalls, reasoning)
        loop = asyncio.get_running_loop()
        if fd is not None:
            lsock = socket.socket(fileno=fd)
        else:
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind(("127.0.0.1", port or 0))
        lsock.listen(4096)
        lsock.setblocking(False)

        def accept() -> None:
            for _ in range(64):
                try:
                    conn, _ = lsock.accept()
                except (BlockingIOError, InterruptedError):
                    return
                _SockTransport(loop, conn, _Conn(st))

        loop.add_reader(lsock.fileno(), accept)
        await asyncio.Event().wait()

    asyncio.run(main())
