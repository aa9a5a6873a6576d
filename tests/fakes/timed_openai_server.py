"""FAKE OpenAI-compatible streaming server with exact, known token timing and injectable faults.

This is a fake, for tests and the load generator's accuracy benchmark only: it generates no text, it
streams placeholder tokens on a fixed schedule so that the load generator's timings can be checked against
ground truth. It runs as a separate process (uvicorn serving a plain ASGI app, HTTP/1.1 via h11), so the
client under test does not share its event loop.

Timing (per request, from ``recv``: the moment the fake's event loop read the request's bytes, stamped in
the HTTP protocol's ``data_received`` before parsing, so the ASGI task's scheduling delay is not in it):

* the first content chunk is due at ``recv + ttft_s``; chunk ``k`` at ``recv + ttft_s + k * tokens_per_chunk * itl_s``;
* each chunk carries ``tokens_per_chunk`` tokens (the last one fewer when ``max_tokens`` is not a multiple);
* right after the last content chunk (which carries ``finish_reason='length'``), a usage chunk with
  ``choices: []`` and ``data: [DONE]``, as vLLM's OpenAI server sends them;
* chat requests get a role-only first chunk (``delta={'role': 'assistant', 'content': ''}``) immediately at
  ``recv``, before any token, as vLLM's chat endpoint does.

Every log entry also keeps the request's ``model`` (a LoRA workload sends its adapter's name there).

Ground truth is what the server *did*, not what it intended: for every request it logs ``recv`` and the
``time.perf_counter()`` right after each chunk was handed to the transport (``emit``; ``emit_pre``: right
before, so the write happened between the two: a process descheduled just after writing can stamp ``emit``
after a fast client already read the chunk; on Linux ``perf_counter`` is
CLOCK_MONOTONIC, one clock for every process of the machine, so a client's perf_counter stamps compare
directly). ``GET /fake/log`` returns the log; ``POST /fake/reset`` clears it and the counters;
``GET /fake/stats`` returns in-flight counts (``max_in_flight``: concurrency actually reached) and the
server's own CPU time.

Server behaviours, per fake (``FakeTiming``; both HTTP stacks implement them):

* ``usage_delay_s``: the usage-only chunk (``choices: []``, what ``stream_options.include_usage`` asks for) is
  sent that many seconds after the last token chunk, then ``[DONE]`` (vLLM sends it right away; a slower
  server or a proxy may not). The log's ``usage`` stamp says when it went out.
* ``new_size_stall_s``: the first time the number of requests in flight reaches a size never reached before
  (a new batch size), the whole fake stalls for that long: every chunk of every request in flight, and the
  first chunk of the request that made the new size, is due that much later. This is a server that compiles
  a kernel or graph on the first batch of each new shape (vLLM's Triton JIT, torch.compile for a new size).
  With ``log_file`` set, the fake appends one vLLM-style line per stall to that file, the line vLLM's JIT
  monitor (``vllm/triton_utils/jit_monitor.py``) writes: ``... WARNING MM-DD HH:MM:SS [jit_monitor.py:103]
  Triton kernel JIT compilation during inference: fake_batch_<size>. This causes a latency spike; consider
  extending warmup to cover this shape/config.`` ``/fake/stats`` lists the sizes that stalled (``stalls``).

* ``max_running`` (uvicorn stack only): a server of fixed capacity: at most that many requests stream at once,
  the rest wait in arrival order (FIFO) and their schedule starts when they get a slot (an open-loop rate above
  the capacity makes the queue, in-flight count and TTFT grow over the window: ``tasks.metrics.overload``).

Faults, injected per request by a marker anywhere in the prompt (or chat message):

* ``[[fault:503]]``: HTTP 503 with a JSON error body;
* ``[[fault:cut:K]]``: after K content chunks the connection is dropped mid-stream (no [DONE]).

Reasoning streams, per chat request by a marker: ``[[reasoning:K:FIELD]]`` streams the first K tokens in
the delta's ``FIELD`` (``reasoning``, as vLLM >= 0.10.2 with ``--reasoning-parser``; ``reasoning_content``,
as older releases; ``tool_calls``, as tool-call argument deltas), then the rest as ``content``; a chunk never
mixes the two (the fake cuts a chunk at the K-th token). K >= max_tokens: the whole budget is reasoning.

Every first token's text is ``<rid>`` (the server's request id) so a client's generated text can be matched
to the log (``vllm bench serve --save-detailed`` keeps generated texts); the other tokens are ``" t"``.
``/tokenize`` and ``/detokenize`` implement a deterministic fake tokenizer: pre-split like GPT-2 (optional
leading space + word, or punctuation run, or whitespace run), then each piece cut into 4-character tokens.

Two HTTP stacks serve this same specification: ``server="uvicorn"`` (the default here: uvicorn + h11 + the
ASGI app below) and ``server="raw"``, a lean asyncio.Protocol server in ``raw_timed_server.py`` that costs a
fraction of the CPU per chunk, so its event loop reads requests sooner under load (the accuracy benchmark's
default).

Run: ``python tests/fakes/timed_openai_server.py [--server raw] --port 8123 --ttft-s 0.05 --itl-s 0.01
--tokens-per-chunk 1`` or, from Python, :class:`FakeServerProcess` (a context manager that starts it on a
free port).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FakeTiming", "SizeStalls", "jit_log_line", "make_app", "FakeServerProcess", "fake_tokenize", "sse_chunk",
           "reasoning_marker"]

_PIECE = re.compile(r" ?[A-Za-z0-9_]+| ?[^\sA-Za-z0-9_]+|\s+")
_FAULT = re.compile(r"\[\[fault:(503|cut:(\d+))\]\]")
_REASONING = re.compile(r"\[\[reasoning:(\d+):(reasoning|reasoning_content|tool_calls)\]\]")


def reasoning_marker(prompt: str) -> tuple[int, str]:
    """``(k, field)`` of a ``[[reasoning:K:FIELD]]`` marker in a chat prompt: the first K tokens stream in the
    delta's ``FIELD`` instead of ``content``; ``(0, 'content')`` without one."""
    m = _REASONING.search(prompt)
    return (int(m.group(1)), m.group(2)) if m else (0, "content")


def fake_tokenize(text: str) -> list[str]:
    """Token strings of the fake tokenizer: GPT-2-like pre-split, then 4-character pieces. Additive over
    words: ``len(tok(a + ' ' + b)) == len(tok(a)) + len(tok(' ' + b))``."""
    out: list[str] = []
    for m in _PIECE.finditer(text):
        p = m.group(0)
        out.extend(p[i : i + 4] for i in range(0, len(p), 4))
    return out


def sse_chunk(oid: str, created: int, model: str, chat: bool, text: str | None, finish: str | None,
              role: bool = False, field: str = "content") -> bytes:
    """One server-sent event of a streamed completion (``chat`` -> ``chat.completion.chunk`` with a delta; else
    ``text_completion``), as vLLM sends it; ``role=True`` is chat's role-only first chunk. ``field``: the chat
    delta's key for the text: ``content``, ``reasoning`` / ``reasoning_content`` (a reasoning parser's
    thinking; vLLM >= 0.10.2 / older) or ``tool_calls`` (the text as a tool call's arguments). Both fakes use it."""
    if chat:
        delta: dict[str, Any]
        if role:
            delta = {"role": "assistant", "content": ""}
        elif field == "tool_calls":
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        else:
            delta = {field: text}
        ch = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    o = {"id": oid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
         "model": model, "choices": [ch]}
    return b"data: " + json.dumps(o, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class FakeTiming:
    """The fake's schedule. ``ttft_s``: receipt -> first token chunk; ``itl_s``: seconds per token (a chunk of
    k tokens follows the previous one after ``k * itl_s``); ``tokens_per_chunk``: tokens per streamed chunk;
    ``usage_delay_s``: last token chunk -> usage-only chunk; ``new_size_stall_s``: stall of the whole fake on
    the first batch of each new in-flight size (module docstring)."""

    ttft_s: float = 0.05
    itl_s: float = 0.01
    tokens_per_chunk: int = 1
    usage_delay_s: float = 0.0
    new_size_stall_s: float = 0.0
    #: A server that slows with load (uvicorn stack only): each request's first token is due this many seconds
    #: later per other request in flight when it arrived (TTFT = ttft_s + ttft_per_in_flight_s x (in flight - 1)),
    #: so latency rises with concurrency and an SLO on TTFT holds up to a known concurrency (the SLA search).
    ttft_per_in_flight_s: float = 0.0
    #: A server of fixed capacity (uvicorn stack only): at most this many requests stream at once, the rest wait
    #: in arrival order (FIFO) and their schedule starts when they get a slot; each takes ``ttft_s + n x itl_s``,
    #: so it completes ``max_running / (ttft_s + n x itl_s)`` requests/s. 0: no limit.
    max_running: int = 0


def jit_log_line(size: int) -> str:
    """The log line the fake writes for a stall on a new batch ``size``: vLLM's JIT monitor warning (text of
    ``vllm/triton_utils/jit_monitor.py``) with vLLM's header (``LEVEL MM-DD HH:MM:SS [file:line]``)."""
    return (f"(EngineCore_DP0 pid={os.getpid()}) WARNING {time.strftime('%m-%d %H:%M:%S')} [jit_monitor.py:103] "
            f"Triton kernel JIT compilation during inference: fake_batch_{size}. This causes a latency spike; "
            "consider extending warmup to cover this shape/config.\n")


class SizeStalls:
    """The ``new_size_stall_s`` bookkeeping shared by both fakes: sizes seen, the total stall so far
    (``shift_s``; a request's chunks are due ``shift_s`` at due time minus ``shift_s`` at its arrival later),
    and the log file."""

    def __init__(self, stall_s: float, log_file: str | None) -> None:
        self.stall_s = stall_s
        self.log_file = log_file
        self.seen: set[int] = set()
        self.stalls: list[int] = []
        self.shift_s = 0.0

    def arrived(self, in_flight: int) -> None:
        """A request arrived and made ``in_flight`` requests: a new size stalls everyone (and is logged)."""
        if self.stall_s <= 0 or in_flight in self.seen:
            return
        self.seen.add(in_flight)
        self.stalls.append(in_flight)
        self.shift_s += self.stall_s
        if self.log_file:
            with open(self.log_file, "a") as f:
                f.write(jit_log_line(in_flight))


def make_app(timing: FakeTiming, model: str = "fake-model", log_file: str | None = None) -> Any:
    """The ASGI app of the fake. Routes: /health, /v1/models, /v1/completions, /v1/chat/completions,
    /tokenize, /detokenize, /fake/log, /fake/reset, /fake/stats. Anything else: 404."""
    perf = time.perf_counter
    state: dict[str, Any] = {"log": [], "in_flight": 0, "max_in_flight": 0, "n": 0, "next_rid": 0}
    stalls = SizeStalls(timing.new_size_stall_s, log_file)
    slots = asyncio.Semaphore(timing.max_running) if timing.max_running > 0 else None  # FIFO: waiters wake in order
    vocab: dict[str, int] = {}
    rev: list[str] = []

    def tok_ids(text: str) -> list[int]:
        ids = []
        for p in fake_tokenize(text):
            i = vocab.get(p)
            if i is None:
                i = vocab[p] = len(rev)
                rev.append(p)
            ids.append(i)
        return ids

    async def read_body(receive: Any) -> bytes:
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                return b"".join(chunks)

    async def respond(send: Any, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def stream(send: Any, req: dict, chat: bool, t_recv: float, recv_at_read: bool, shift0: float,
                     load_s: float = 0.0) -> None:
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages") or [])
        else:
            prompt = str(req.get("prompt", ""))
        fault = _FAULT.search(prompt)
        if fault and fault.group(1) == "503":
            await respond(send, 503, {"error": {"message": "fake: service unavailable (injected)", "code": 503}})
            return
        cut_after = int(fault.group(2)) if fault and fault.group(2) else None
        n_tokens = int(req.get("max_tokens") or 16)
        prompt_tokens = len(fake_tokenize(prompt)) + (3 if chat else 0)
        rid = state["next_rid"]
        state["next_rid"] += 1
        entry: dict[str, Any] = {"rid": rid, "endpoint": "chat" if chat else "completions", "recv": t_recv,
                                 "recv_at_read": recv_at_read,
                                 "model": req.get("model"), "prompt_head": prompt[:64], "prompt_len_chars": len(prompt),
                                 "prompt_sha1": hashlib.sha1(prompt.encode()).hexdigest(),
                                 "chunk_tokens": [], "emit": [], "emit_pre": [], "role": None, "usage": None,
                                 "done": None, "done_pre": None,
                                 "due": [], "cut": False}
        state["log"].append(entry)
        oid = f"cmpl-fake-{rid}"
        created = int(time.time())
        obj_kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
            return sse_chunk(oid, created, model, chat, text, finish, role)

        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        if chat:
            await send({"type": "http.response.body", "body": chunk(None, None, role=True), "more_body": True})
            entry["role"] = perf()
        tpc = max(1, timing.tokens_per_chunk)
        regular = chunk(" t" * tpc, None)  # the bytes of a full middle chunk, encoded once per request
        sent = 0
        k = 0
        emit, pre, dues, ctoks = entry["emit"], entry["emit_pre"], entry["due"], entry["chunk_tokens"]
        think_k, think_field = reasoning_marker(prompt) if chat else (0, "content")
        while sent < n_tokens:
            while True:  # re-check after a sleep: a stall that began meanwhile moves the chunk later
                due = t_recv + timing.ttft_s + load_s + sent * timing.itl_s + (stalls.shift_s - shift0)
                delay = due - perf()
                if delay <= 0:
                    break
                await asyncio.sleep(delay)
            m = min(tpc, n_tokens - sent)
            if sent < think_k:
                m = min(m, think_k - sent)  # a chunk is all reasoning or all content
            last = sent + m >= n_tokens
            if sent == 0 or last or m != tpc or sent < think_k:
                text = "".join((f"<{rid}>" if sent + j == 0 else " t") for j in range(m))
                data = sse_chunk(oid, created, model, chat, text, "length" if last else None,
                                 field=think_field if sent < think_k else "content")
            else:
                data = regular
            pre.append(perf())
            await send({"type": "http.response.body", "body": data, "more_body": True})
            emit.append(perf())
            dues.append(due)
            ctoks.append(m)
            sent += m
            k += 1
            if cut_after is not None and k >= cut_after:
                entry["cut"] = True
                raise ConnectionAbortedError("fake: stream cut (injected)")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                 "total_tokens": prompt_tokens + n_tokens}
        u = {"id": oid, "object": obj_kind, "created": created, "model": model, "choices": [], "usage": usage}
        if timing.usage_delay_s > 0:
            await asyncio.sleep(timing.usage_delay_s)
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(u).encode() + b"\n\n",
                    "more_body": True})
        entry["usage"] = perf()
        entry["done_pre"] = perf()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        entry["done"] = perf()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        # When the fake's event loop read the request's bytes (stamped by _StampingH11 below), else now.
        t_recv = scope.get("fake_recv") or perf()
        path, method = scope["path"], scope["method"]
        body = await read_body(receive)
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            req = json.loads(body or b"{}")
            if not req.get("stream"):
                await respond(send, 400, {"error": {"message": "fake: only stream=true is implemented"}})
                return
            state["n"] += 1
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            shift0 = stalls.shift_s  # taken before: the request that makes a new size is in the slow batch
            stalls.arrived(state["in_flight"])
            try:
                load_s = timing.ttft_per_in_flight_s * (state["in_flight"] - 1)
                if slots is not None:
                    await slots.acquire()
                    load_s += perf() - t_recv  # the time it queued: its schedule starts at its slot
                try:
                    await stream(send, req, path.endswith("chat/completions"), t_recv, "fake_recv" in scope, shift0,
                                 load_s)
                finally:
                    if slots is not None:
                        slots.release()
            finally:
                state["in_flight"] -= 1
        elif path == "/health":
            await respond(send, 200, {})
        elif path == "/v1/models":
            await respond(send, 200, {"object": "list", "data": [{"id": model, "object": "model", "root": model}]})
        elif path == "/tokenize" and method == "POST":
            req = json.loads(body or b"{}")
            ids = tok_ids(str(req.get("prompt", "")))
            await respond(send, 200, {"count": len(ids), "max_model_len": 1 << 20, "tokens": ids})
        elif path == "/detokenize" and method == "POST":
            req = json.loads(body or b"{}")
            await respond(send, 200, {"prompt": "".join(rev[i] for i in req.get("tokens", []))})
        elif path == "/fake/log":
            await respond(send, 200, {"timing": timing.__dict__, "log": state["log"],
                                      "clock": {"time": time.time(), "perf_counter": perf()}})
        elif path == "/fake/reset" and method == "POST":
            state.update(log=[], max_in_flight=state["in_flight"], n=0)
            await respond(send, 200, {})
        elif path == "/fake/stats":
            await respond(send, 200, {"in_flight": state["in_flight"], "max_in_flight": state["max_in_flight"],
                                      "requests": state["n"], "cpu_s": time.process_time(),
                                      "stalls": stalls.stalls})
        else:
            await respond(send, 404, {"error": {"message": f"fake: no route {method} {path}"}})

    return app


class FakeServerProcess:
    """Runs the fake in a child process on a free 127.0.0.1 port (a listening socket handed over by fd, so
    there is no port race). Use as a context manager; ``base_url``, ``log()``, ``reset()``, ``stats()``.

    Args:
        server: ``"uvicorn"`` (uvicorn + h11 + ASGI) or ``"raw"`` (the lean asyncio.Protocol fake); default
            ``$TUNELAB_FAKE_SERVER`` or ``"uvicorn"`` (so the tests can be run against either).
        cpus: if given, the child is pinned to these CPUs (``os.sched_setaffinity``).
        log_file: the fake's server log (its JIT-compilation lines, see ``new_size_stall_s``); None: none.

    Raises:
        RuntimeError: the child did not answer /health within ``start_timeout_s``.
    """

    def __init__(self, timing: FakeTiming = FakeTiming(), model: str = "fake-model",
                 start_timeout_s: float = 30.0, python: str | None = None, server: str | None = None,
                 cpus: set[int] | None = None, log_file: str | Path | None = None) -> None:
        server = server or os.environ.get("TUNELAB_FAKE_SERVER", "uvicorn")
        if server not in ("uvicorn", "raw"):
            raise ValueError(f"server must be 'uvicorn' or 'raw', got {server!r}")
        if server == "raw" and (timing.ttft_per_in_flight_s or timing.max_running):
            raise ValueError("ttft_per_in_flight_s and max_running are implemented by the uvicorn fake only; use "
                             "server='uvicorn'")
        self.server = server
        self.cpus = cpus
        self.log_file = None if log_file is None else str(log_file)
        self.timing = timing
        self.model = model
        self.start_timeout_s = start_timeout_s
        self.python = python or sys.executable
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeServerProcess":
        import httpx

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(4096)
        self.port = sock.getsockname()[1]
        fd = sock.fileno()
        os.set_inheritable(fd, True)
        argv = [self.python, str(Path(__file__).resolve()), "--fd", str(fd), "--model", self.model,
                "--ttft-s", repr(self.timing.ttft_s), "--itl-s", repr(self.timing.itl_s),
                "--tokens-per-chunk", str(self.timing.tokens_per_chunk), "--server", self.server,
                "--usage-delay-s", repr(self.timing.usage_delay_s),
                "--new-size-stall-s", repr(self.timing.new_size_stall_s),
                "--ttft-per-in-flight-s", repr(self.timing.ttft_per_in_flight_s),
                "--max-running", str(self.timing.max_running)]
        if self.log_file:
            argv += ["--log-file", self.log_file]
        import tempfile

        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, pass_fds=(fd,), stdout=subprocess.DEVNULL, stderr=self._err)
        sock.close()
        if self.cpus:
            os.sched_setaffinity(self.proc.pid, self.cpus)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._err.seek(0)
                err = self._err.read().decode(errors="replace")
                raise RuntimeError(f"fake server exited with {self.proc.returncode}: {err[-2000:]}")
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake server did not answer /health within {self.start_timeout_s} s")

    def _get(self, path: str) -> Any:
        import httpx

        return httpx.get(self.base_url + path, timeout=30).json()

    def log(self) -> dict[str, Any]:
        """``{'timing': ..., 'log': [per-request entries], 'clock': {...}}``; times are perf_counter seconds."""
        return self._get("/fake/log")

    def stats(self) -> dict[str, Any]:
        """``{'in_flight', 'max_in_flight', 'requests', 'cpu_s', 'stalls'}`` (``stalls``: the in-flight sizes
        that stalled, in order)."""
        return self._get("/fake/stats")

    def reset(self) -> None:
        import httpx

        httpx.post(self.base_url + "/fake/reset", timeout=30).raise_for_status()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_err", None) is not None:
            self._err.close()
            self._err = None

    def __enter__(self) -> "FakeServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _stamping_protocol() -> Any:
    """uvicorn's h11 protocol with a ``perf_counter`` stamp taken on every read, before parsing; the request
    parsed from that read gets it as ``scope['fake_recv']`` — also when h11 parses it later (a request that
    arrives on a keep-alive connection before the previous response cycle has closed is held, PAUSED,
    until then: the bytes were still read, and the clock starts, at the read)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class _StampingH11(H11Protocol):
        def data_received(self, data: bytes) -> None:
            self._fake_read_t = time.perf_counter()
            super().data_received(data)

        def handle_events(self) -> None:
            before = getattr(self, "scope", None)
            super().handle_events()
            scope = getattr(self, "scope", None)
            if scope is not None and scope is not before and "fake_recv" not in scope:
                scope["fake_recv"] = getattr(self, "_fake_read_t", None) or time.perf_counter()

    return _StampingH11


def main(argv: list[str] | None = None) -> None:
    """CLI: serve the fake on ``--port`` (or an inherited listening socket ``--fd``)."""
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--fd", type=int, default=None)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--ttft-s", type=float, default=0.05)
    ap.add_argument("--itl-s", type=float, default=0.01)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--server", choices=("uvicorn", "raw"), default="uvicorn")
    ap.add_argument("--usage-delay-s", type=float, default=0.0)
    ap.add_argument("--new-size-stall-s", type=float, default=0.0)
    ap.add_argument("--ttft-per-in-flight-s", type=float, default=0.0)
    ap.add_argument("--max-running", type=int, default=0)
    ap.add_argument("--log-file", default=None)
    a = ap.parse_args(argv)
    timing = FakeTiming(a.ttft_s, a.itl_s, a.tokens_per_chunk, a.usage_delay_s, a.new_size_stall_s,
                        a.ttft_per_in_flight_s, a.max_running)
    if a.server == "raw":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from raw_timed_server import serve_raw

        serve_raw(timing, a.model, fake_tokenize, _FAULT, sse_chunk,
                  port=None if a.fd is not None else a.port, fd=a.fd,
                  stalls=SizeStalls(timing.new_size_stall_s, a.log_file), reasoning=reasoning_marker)
        return
    app = make_app(timing, a.model, a.log_file)
    kw: dict[str, Any] = {"fd": a.fd} if a.fd is not None else {"host": "127.0.0.1", "port": a.port}
    uvicorn.run(app, http=_stamping_protocol(), loop="asyncio", lifespan="on", log_level="warning", access_log=False,
                backlog=4096, timeout_keep_alive=120, **kw)


if __name__ == "__main__":
    main()
