"""The load generator: exact-length prompts and an async streaming client that records raw timings.

It produces *raw request records* (the contract with ``tasks.metrics.derive_request``): one dict per
request with the send time, the arrival time of every streamed chunk that carried generated text, the end
time, the server's usage and finish reason. Derived metrics (TTFT, ITL, TPOT, E2EL) are computed from
these elsewhere, in one place (``tasks.metrics``).

Design choices, and why:
- The streaming requests go over a small HTTP/1.1 keep-alive transport of its own (:class:`RawPool`,
  :func:`send_streaming_raw`): each network read carries the kernel's receive time of its bytes
  (``SO_TIMESTAMPNS``, :mod:`tasks.rx_stamps`), so a busy or descheduled event loop does not make a stamp
  late, and its SSE events are handled right there (one ``json.loads`` each), with no task switch per
  chunk. Where the kernel gives no stamp the read time is used, and :class:`LevelResult` says so. httpx's pure-Python stack (h11/httpcore/anyio) made the client itself the bottleneck from
  concurrency 64 on a 2-core machine (docs/measurement.md has the numbers); it stays available
  (``transport='httpx'``, :func:`send_streaming`) and serves every non-streaming call (/tokenize, /metrics).
  Not the openai client: per-chunk pydantic parsing would cost CPU on the cores that time the stream.
- Connections are opened on demand, so the pool never caps the requested concurrency; before a
  concurrency window it is filled with that many open keep-alive connections, so TCP set-up is not part
  of the first wave's TTFT.
- Timestamps are ``time.perf_counter()`` mapped onto one ``time.time()`` origin (:class:`Clock`): monotonic
  and high-resolution, yet readable as epoch seconds. On Linux ``perf_counter`` is CLOCK_MONOTONIC, one
  clock for all processes, so several load processes share one origin exactly.
- One Python event loop saturates one core. ``run_level(processes=N)`` splits the load over N processes
  (each with its own loop and share of the concurrency / schedule); the window's ``client_cpu_frac`` is the
  busiest loop's CPU time / wall time, and the loop's wake-up lag is measured, so a client-bound window is
  visible.
- Prompts are built with the runtime's own tokenizer through vLLM's ``/tokenize`` endpoint (no tokenizer in
  the orchestrator; works for any model the server loads), from a seeded word sequence, so that each
  repeat draws fresh prompts and the prefix cache does not serve a repeat unless the workload asks for a
  shared prefix. Each word's token count is learned once per server; a prompt is then assembled locally to
  the exact count (byte-level BPE and SentencePiece pre-tokenizers never merge across a space) and checked
  with one ``/tokenize`` call, all prompts of a window concurrently; a prompt that does not check out is
  adjusted word by word until it does.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import random
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import httpx

from tunelab.tasks import rx_stamps

__all__ = [
    "Clock",
    "PromptBuilder",
    "PromptLengthError",
    "send_streaming",
    "run_level",
    "LevelResult",
    "make_client",
    "prewarm_connections",
    "RawPool",
    "send_streaming_raw",
]

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


class PromptLengthError(RuntimeError):
    """A prompt of the requested token count could not be built (the tokenizer is not additive over words
    and the word-by-word adjustment did not converge)."""


def _bounded_gather(coros: Sequence[Any], limit: int) -> Any:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return asyncio.gather(*(one(c) for c in coros))


class PromptBuilder:
    """Builds prompts of an exact token count with the server's own tokenizer (vLLM ``/tokenize``).

    Token counts are of the prompt text alone, without special tokens (``add_special_tokens=False``), as
    ``vllm bench serve --random-input-len``: the server's ``usage.prompt_tokens`` adds a BOS token where the
    model's tokenizer adds one, and the chat template's tokens on the chat endpoint.

    How: once per builder, the token count of each of ``vocab_words`` words of the built-in list (after a
    space; and of ``first_words`` words at the start of a text) is learned with one ``/tokenize`` call each.
    A prompt is then assembled locally to the exact count from seeded random words (byte-level BPE and
    SentencePiece never merge across a space, so counts add up) and checked with one ``/tokenize`` call;
    one that does not check out is adjusted word by word, re-counted each time.

    Args:
        client: an ``httpx.AsyncClient`` with base_url and auth set.
        model: served model name.
        verify: ``'all'`` checks every prompt; ``'sample'`` (default) checks every prompt until
            ``trust_after`` prompts in a row were exact, then ``sample_size`` per call (any miss goes back
            to checking all); ``'none'`` trusts the additive counts.
        parallel: /tokenize calls in flight at once.

    ``stats`` counts prompts ``built``, ``verified``, ``adjusted`` (needed the word-by-word loop), and the
    ``tokenize_calls`` made.
    """

    def __init__(self, client: httpx.AsyncClient, model: str, verify: str = "sample", parallel: int = 16,
                 vocab_words: int = 96, first_words: int = 16, trust_after: int = 32, sample_size: int = 4) -> None:
        if verify not in ("all", "sample", "none"):
            raise ValueError(f"verify must be 'all', 'sample' or 'none', got {verify!r}")
        self.client = client
        self.model = model
        self.verify = verify
        self.parallel = parallel
        self.vocab_words = vocab_words
        self.first_words = first_words
        self.trust_after = trust_after
        self.sample_size = sample_size
        self._counts: dict[str, int] | None = None  # word -> tokens after a space
        self._words: list[str] = []
        self._first: list[tuple[str, int]] = []  # words usable first, with their count without a space
        self._one: list[str] = []  # words of exactly one token after a space
        self._exact_in_a_row = 0
        self.stats = {"built": 0, "verified": 0, "adjusted": 0, "tokenize_calls": 0}

    async def count(self, text: str) -> int:
        """Tokens of ``text`` as the server's tokenizer counts them (no special tokens).

        Raises:
            httpx.HTTPStatusError: the server has no working ``/tokenize`` (vLLM has it since 0.5).
        """
        r = await self.client.post("/tokenize", json={"model": self.model, "prompt": text, "add_special_tokens": False})
        self.stats["tokenize_calls"] += 1
        r.raise_for_status()
        body = r.json()
        return int(body["count"]) if "count" in body else len(body["tokens"])

    async def _learn(self) -> None:
        if self._counts is not None:
            return
        # A fixed, seeded subset: the same words for every builder, so prompts are reproducible from a seed.
        words = random.Random(0).sample(_WORDS, min(self.vocab_words, len(_WORDS)))
        first = words[: self.first_words]
        counts = await _bounded_gather([self.count(" " + w) for w in words] + [self.count(w) for w in first],
                                       self.parallel)
        self._counts = dict(zip(words, counts[: len(words)]))
        self._words = words
        self._one = [w for w in words if self._counts[w] == 1]
        self._first = [(w, c) for w, c in zip(first, counts[len(words):]) if c >= 1]
        if not self._one or not self._first:
            raise PromptLengthError("the built-in word list has no single-token word for this tokenizer; cannot pad "
                                    "prompts to an exact length")

    def _assemble(self, n_tokens: int, rng: random.Random, prefix: str, prefix_tokens: int) -> list[str]:
        """Words (the first one bare unless there is a prefix) whose additive count is exactly ``n_tokens``."""
        assert self._counts is not None
        words: list[str] = []
        total = prefix_tokens
        if not prefix:
            w, c = rng.choice(self._first)
            if c > n_tokens:
                w, c = min(self._first, key=lambda x: x[1])
            words.append(w)
            total += c
        counts, pool, one = self._counts, self._words, self._one
        while total < n_tokens:
            w = rng.choice(pool)
            c = counts[w]
            if total + c > n_tokens:
                w, c = rng.choice(one), 1
            words.append(w)
            total += c
        return words

    @staticmethod
    def _text(prefix: str, words: list[str]) -> str:
        body = " ".join(words)
        return f"{prefix} {body}" if prefix and body else (prefix or body)

    async def _fix(self, n_tokens: int, rng: random.Random, prefix: str, words: list[str], got: int) -> str:
        """Word-by-word adjustment: drop trailing words while too long, append one-token words while too short,
        re-counting with the server each time (never cuts inside a word, so no mid-merge surprises)."""
        self.stats["adjusted"] += 1
        for _ in range(64):
            if got == n_tokens:
                return self._text(prefix, words)
            if got > n_tokens and words:
                words = words[:-1]
            else:
                words = words + [rng.choice(self._one)]
            got = await self.count(self._text(prefix, words))
        raise PromptLengthError(
            f"could not build a prompt of exactly {n_tokens} tokens (last try: {got}); the tokenizer merges "
            "across words in a way the word-by-word adjustment cannot follow"
        )

    async def exact(self, n_tokens: int, rng: random.Random, prefix: str = "") -> tuple[str, int]:
        """One prompt of exactly ``n_tokens`` tokens, ``prefix`` included (the rest: seeded random words).

        Returns:
            ``(text, n_tokens)``; always checked with the server.

        Raises:
            ValueError: ``n_tokens`` < 1 or not larger than the prefix's tokens.
            PromptLengthError: the count cannot be reached exactly.
        """
        texts = await self.many(1, n_tokens, rng, prefix=prefix, verify="all")
        return texts[0], n_tokens

    async def many(self, n_prompts: int, n_tokens: int, rng: random.Random, prefix: str = "",
                   verify: str | None = None) -> list[str]:
        """``n_prompts`` prompts of exactly ``n_tokens`` tokens each, all starting with ``prefix`` (may be '').

        Round trips: one ``/tokenize`` of the prefix, and one per checked prompt (``parallel`` at a time);
        plus, once per builder, one per learned word.

        Raises:
            ValueError: bad ``n_prompts``/``n_tokens`` (the message names the field).
            PromptLengthError: a count cannot be reached exactly.
        """
        if n_prompts < 0:
            raise ValueError(f"n_prompts must be >= 0, got {n_prompts}")
        if n_tokens < 1:
            raise ValueError(f"n_tokens (the workload's prompt_tokens) must be >= 1, got {n_tokens}")
        verify = verify or self.verify
        await self._learn()
        prefix_tokens = await self.count(prefix) if prefix else 0
        if prefix and prefix_tokens >= n_tokens:
            raise ValueError(
                f"prefix has {prefix_tokens} tokens, not fewer than the prompt's {n_tokens}: "
                "make shared_prefix_tokens smaller than prompt_tokens"
            )
        drafts = [self._assemble(n_tokens, rng, prefix, prefix_tokens) for _ in range(n_prompts)]
        texts = [self._text(prefix, w) for w in drafts]
        self.stats["built"] += n_prompts
        if verify == "none":
            return texts
        if verify == "all" or self._exact_in_a_row < self.trust_after:
            check = list(range(n_prompts))
        else:
            check = rng.sample(range(n_prompts), min(self.sample_size, n_prompts))
        counts = await _bounded_gather([self.count(texts[i]) for i in check], self.parallel)
        self.stats["verified"] += len(check)
        for i, got in zip(check, counts):
            if got != n_tokens:
                self._exact_in_a_row = 0
                texts[i] = await self._fix(n_tokens, rng, prefix, drafts[i], got)
            else:
                self._exact_in_a_row += 1
        if any(got != n_tokens for got in counts) and verify == "sample" and len(check) < n_prompts:
            # A sampled miss: additivity does not hold for this tokenizer; check the rest too.
            rest = [i for i in range(n_prompts) if i not in set(check)]
            more = await _bounded_gather([self.count(texts[i]) for i in rest], self.parallel)
            self.stats["verified"] += len(rest)
            for i, got in zip(rest, more):
                if got != n_tokens:
                    texts[i] = await self._fix(n_tokens, rng, prefix, drafts[i], got)
        return texts


def _iter_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete ``data:`` payloads in ``buf`` and the unfinished tail (SSE lines end with \\n, \\r\\n)."""
    *lines, rest = buf.split(b"\n")
    out = []
    for ln in lines:
        if ln.startswith(b"data:"):
            out.append(ln[5:].strip())
    return out, rest


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
    """Send one streaming request and record raw timings (the raw record of ``tasks.metrics.derive_request``).

    Returns a dict with ``send_ts`` (epoch s, just before the request is handed to httpx), ``chunk_ts``
    (epoch s at which the network read holding each chunk with non-empty generated text reached the event
    loop; role-only and empty chunks excluded; several events in one read share its stamp; the last one is
    the request's end, where ``tasks.metrics`` ends E2EL and TPOT), ``end_ts`` (the stream's end: the last
    byte, after the usage-only chunk and ``[DONE]``; None if the stream was cut), ``prompt_tokens``/``output_tokens`` (server usage; None if
    absent), ``finish_reason``, ``transport_error`` (None on success: e.g. ``HTTP 503: ...``,
    ``RemoteProtocolError: ...``, ``stream ended without [DONE]``). Never raises for HTTP or stream errors.
    """
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    chat = endpoint == "chat"
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    chunk_ts: list[float] = []
    rec: dict[str, Any] = {
        "send_ts": None, "chunk_ts": chunk_ts, "end_ts": None, "prompt_tokens": None, "output_tokens": None,
        "finish_reason": None, "transport_error": None,
    }
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
                    obj = loads(data)
                    usage = obj.get("usage")
                    if usage:
                        rec["prompt_tokens"] = usage.get("prompt_tokens")
                        rec["output_tokens"] = usage.get("completion_tokens")
                    for ch in obj.get("choices") or ():
                        piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                        if piece:
                            chunk_ts.append(t)
                        fr = ch.get("finish_reason")
                        if fr:
                            rec["finish_reason"] = fr
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
) -> dict[str, Any]:
    """As :func:`send_streaming`, over a :class:`RawPool` connection: each network read is stamped in
    ``data_received`` before it is parsed, and events are handled there, without a task switch per chunk.
    A reused keep-alive connection that the server had closed is retried once on a fresh one (nothing
    was received yet; ``send_ts`` is re-stamped). Never raises for HTTP or stream errors."""
    body: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos,
    }
    chat = endpoint == "chat"
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    payload = pool.request_bytes(path, json.dumps(body).encode())
    chunk_ts: list[float] = []
    rec: dict[str, Any] = {
        "send_ts": None, "chunk_ts": chunk_ts, "end_ts": None, "prompt_tokens": None, "output_tokens": None,
        "finish_reason": None, "transport_error": None,
    }
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
        usage = obj.get("usage")
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens")
            rec["output_tokens"] = usage.get("completion_tokens")
        for ch in obj.get("choices") or ():
            piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
            if piece:
                chunk_ts.append(t)
            fr = ch.get("finish_reason")
            if fr:
                rec["finish_reason"] = fr

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


async def prewarm_connections(client: httpx.AsyncClient, n: int) -> None:
    """Open ``n`` keep-alive connections (``n`` concurrent ``GET /health``) so a window's first wave does not
    pay for TCP set-up inside its TTFT. Errors are ignored (the window will show them)."""

    async def one() -> None:
        try:
            await client.get("/health", timeout=10)
        except httpx.HTTPError:
            pass

    await asyncio.gather(*(one() for _ in range(max(0, n))))


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


def _check_load(load_kind: str, load_value: float, n: int, arrival_offsets_s: Sequence[float] | None) -> None:
    if load_kind == "concurrency":
        if not load_value >= 1:
            raise ValueError(f"load_value (concurrency) must be >= 1, got {load_value!r}")
    elif load_kind == "rate":
        if arrival_offsets_s is None or len(arrival_offsets_s) != n:
            raise ValueError("load_kind='rate' needs arrival_offsets_s with one offset (seconds) per prompt "
                             "(tasks.arrivals.arrival_offsets)")
    else:
        raise ValueError(f"load_kind must be 'concurrency' or 'rate', got {load_kind!r}")


async def _run_shard(
    client: httpx.AsyncClient,
    clock: Clock,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    load_kind: str,
    concurrency: int,
    endpoint: str,
    ignore_eos: bool,
    timeout_s: float,
    offsets: Sequence[float] | None,
    t_start_perf: float | None,
    on_done: Callable[[], None] | None,
    worker: int,
    transport: str = "raw",
    shared_next: Any = None,
) -> tuple[list[dict[str, Any]], float, float, float, float, dict[str, Any] | None]:
    """One event loop's share: returns (records, wall_s, cpu_frac, lag_p99_s, lag_max_s, rx) where rx is
    :meth:`RxStats.summary` of the raw transport's reads (None for httpx). With ``shared_next`` (a
    ``multiprocessing.Value('i')`` shared by the load processes of one concurrency window) the workers take the
    next request index from it, so every process pulls from one queue; each record then carries its index as
    ``"index"``."""
    pool: RawPool | None = None
    if transport == "raw":
        auth = client.headers.get("authorization", "")
        pool = RawPool(str(client.base_url), auth.removeprefix("Bearer ") or None, clock)
    try:
        out = await _run_shard_with(client, pool, clock, model, prompts, max_tokens, load_kind, concurrency,
                                    endpoint, ignore_eos, timeout_s, offsets, t_start_perf, on_done, worker,
                                    shared_next)
        return (*out, pool.rx.summary() if pool is not None else None)
    finally:
        if pool is not None:
            pool.close()


async def _run_shard_with(
    client: httpx.AsyncClient,
    pool: "RawPool | None",
    clock: Clock,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    load_kind: str,
    concurrency: int,
    endpoint: str,
    ignore_eos: bool,
    timeout_s: float,
    offsets: Sequence[float] | None,
    t_start_perf: float | None,
    on_done: Callable[[], None] | None,
    worker: int,
    shared_next: Any = None,
) -> tuple[list[dict[str, Any]], float, float, float, float]:
    if load_kind == "concurrency":
        if pool is not None:
            await pool.prewarm(min(concurrency, len(prompts)))
        else:
            await prewarm_connections(client, concurrency)
    if t_start_perf is not None:
        await asyncio.sleep(max(0.0, t_start_perf - time.perf_counter()))
    records: list[dict[str, Any] | None] = [None] * len(prompts)
    mon = _LagMonitor()
    mon.start()
    cpu0, t0 = time.thread_time(), time.perf_counter()
    if t_start_perf is None:
        t_start_perf = t0

    async def go(i: int) -> None:
        if pool is not None:
            r = await send_streaming_raw(pool, clock, model, prompts[i], max_tokens, endpoint, ignore_eos, timeout_s)
        else:
            r = await send_streaming(client, clock, model, prompts[i], max_tokens, endpoint, ignore_eos, timeout_s)
        r["worker"] = worker
        if shared_next is not None:
            r["index"] = i
        records[i] = r
        if on_done:
            on_done()

    if load_kind == "concurrency":
        # Exactly `concurrency` workers pull from one queue: never more in flight, and no idle slot while
        # requests remain. Several load processes share that queue through `shared_next`: a static split left
        # a process idle, once its own requests had ended sooner, while another still had requests queued.
        nxt = iter(range(len(prompts)))

        def claim() -> int | None:
            if shared_next is None:
                return next(nxt, None)
            with shared_next.get_lock():  # held for one increment: microseconds
                i = shared_next.value
                if i >= len(prompts):
                    return None
                shared_next.value = i + 1
                return i

        async def slot() -> None:
            while (i := claim()) is not None:
                await go(i)

        await asyncio.gather(*(slot() for _ in range(min(concurrency, len(prompts)))))
    else:
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


def _worker_main(conn: Any, spec: dict[str, Any], shared_next: Any = None) -> None:
    """Entry point of a load process (multiprocessing 'spawn'): runs its shard, sends back the result.
    ``shared_next``: the window's shared request counter (concurrency mode), see :func:`_run_shard`."""

    async def main() -> Any:
        # Rate mode has no concurrency bound: size the (httpx) pool for every request of the shard.
        size = spec["concurrency"] if spec["load_kind"] == "concurrency" else len(spec["prompts"])
        async with make_client(spec["base_url"], spec["api_key"], size) as client:
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
                return await _run_shard(
                    client, Clock(spec["clock_origin"]), spec["model"], spec["prompts"], spec["max_tokens"],
                    spec["load_kind"], spec["concurrency"], spec["endpoint"], spec["ignore_eos"],
                    spec["timeout_s"], spec["offsets"], t_start, tick, spec["worker"], spec["transport"],
                    shared_next)
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
    base_url: str, api_key: str, model: str, prompts: Sequence[str], max_tokens: int, load_kind: str,
    load_value: float, endpoint: str, ignore_eos: bool, timeout_s: float,
    arrival_offsets_s: Sequence[float] | None, on_done: Callable[[], None] | None, processes: int,
    transport: str,
) -> LevelResult:
    clock = Clock()
    n = len(prompts)
    ctx = mp.get_context("spawn")
    shared_next = None
    if load_kind == "concurrency":
        conc = [c for c in _split(int(load_value), processes) if c > 0]
        processes = len(conc)
        # Every process gets every prompt and takes the next index from one shared counter (one queue for
        # the window, as in one process); records come back with their index.
        shares: list[list[int]] = [list(range(n)) for _ in conc]
        shared_next = ctx.Value("i", 0)
    else:
        conc = [0] * processes
        shares = [list(range(w, n, processes)) for w in range(processes)]
    procs, conns = [], []
    for w in range(processes):
        parent, child = ctx.Pipe()
        spec = dict(base_url=base_url, api_key=api_key, model=model, prompts=[prompts[i] for i in shares[w]],
                    max_tokens=max_tokens, load_kind=load_kind, concurrency=conc[w], endpoint=endpoint,
                    ignore_eos=ignore_eos, timeout_s=timeout_s, worker=w, clock_origin=clock.origin,
                    transport=transport,
                    offsets=None if arrival_offsets_s is None else [arrival_offsets_s[i] for i in shares[w]])
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
    max_tokens: int,
    load_kind: str,
    load_value: float,
    endpoint: str = "completions",
    ignore_eos: bool = True,
    timeout_s: float = 120.0,
    arrival_offsets_s: Sequence[float] | None = None,
    on_done: Callable[[], None] | None = None,
    processes: int = 1,
    transport: str = "raw",
) -> LevelResult:
    """Send ``prompts`` at a fixed concurrency or on an arrival schedule; return their raw records.

    Args:
        client: from :func:`make_client` (its base_url and auth header are reused by extra load processes).
        load_kind: ``'concurrency'``: exactly ``load_value`` requests in flight while requests remain (as
            ``vllm bench serve --max-concurrency`` with ``--request-rate inf``); ``'rate'``: request i is sent
            ``arrival_offsets_s[i]`` seconds after the start whatever the server does (open loop, as
            ``--request-rate``; offsets from ``tasks.arrivals.arrival_offsets``).
        on_done: called after each finished request (progress).
        processes: load processes; > 1 splits the concurrency (or the schedule, round robin) over that many
            spawned processes, each with its own event loop and connection pool, started together.
        transport: ``'raw'`` (default: :func:`send_streaming_raw`, stamps each read before parsing it) or
            ``'httpx'`` (:func:`send_streaming`); the benchmark benchmarks/loadgen_accuracy.py compares them.

    Returns:
        :class:`LevelResult`, records in prompt order.

    Raises:
        ValueError: bad load_kind/load_value, or rate mode without one offset per prompt.
        RuntimeError: a load process failed.
    """
    _check_load(load_kind, load_value, len(prompts), arrival_offsets_s)
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if transport not in ("raw", "httpx"):
        raise ValueError(f"transport must be 'raw' or 'httpx', got {transport!r}")
    if processes > 1 and len(prompts) > 1:
        auth = client.headers.get("authorization", "")
        return await _run_processes(
            str(client.base_url).rstrip("/"), auth.removeprefix("Bearer "), model, prompts, max_tokens, load_kind,
            load_value, endpoint, ignore_eos, timeout_s, arrival_offsets_s, on_done, min(processes, len(prompts)),
            transport)
    clock = Clock()
    recs, wall, frac, lag99, lagmax, rx = await _run_shard(
        client, clock, model, prompts, max_tokens, load_kind, int(load_value) if load_kind == "concurrency" else 0,
        endpoint, ignore_eos, timeout_s, arrival_offsets_s, None, on_done, 0, transport)
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
