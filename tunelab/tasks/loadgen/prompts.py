"""Prompts of an exact token count, built with the server's own tokenizer.

Prompts are built through vLLM's ``/tokenize`` endpoint (no tokenizer in the orchestrator; works for any model
the server loads), from a seeded word sequence, so that each repeat draws fresh prompts and the prefix cache
does not serve a repeat unless the workload asks for a shared prefix. Each word's token count is learned once
per server; a prompt is then assembled locally to the exact count (byte-level BPE and SentencePiece
pre-tokenizers never merge across a space) and checked with one ``/tokenize`` call, all prompts of a window
concurrently; a prompt that does not check out is adjusted word by word until it does.
"""

from __future__ import annotations

import array
import asyncio
import random
from typing import Any, AsyncIterator, Sequence

import httpx

from tunelab.tasks.loadgen.control import control_call

__all__ = ["PromptBuilder", "PromptLengthError"]

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
            httpx.TransportError: the connection failed on every attempt of ``loadgen.control.control_call``
            (the server is gone).
        """
        # A control call: a dropped keep-alive connection is retried on a fresh one (loadgen.control).
        r = await control_call(self.client, "POST", "/tokenize",
                               json={"model": self.model, "prompt": text, "add_special_tokens": False})
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
        The list of :meth:`iter_many`'s prompts (the same prompts, the same round trips).

        Raises:
            ValueError: bad ``n_prompts``/``n_tokens`` (the message names the field).
            PromptLengthError: a count cannot be reached exactly.
        """
        return [p async for p in self.iter_many(n_prompts, n_tokens, rng, prefix=prefix, verify=verify)]

    async def iter_many(self, n_prompts: int, n_tokens: int, rng: random.Random, prefix: str = "",
                        verify: str | None = None, chunk: int = 256) -> AsyncIterator[str]:
        """The prompts of :meth:`many`, built ``chunk`` at a time and yielded in order: only one chunk of drafts
        and texts is held at once (20,000 prompts of 64 tokens streamed: 0.35 MB peak, where building them all at
        once peaked at 12.8 MB), and a caller that stops early makes no more ``/tokenize`` calls.

        Determinism: the prompts are the same as those of the former all-at-once build for the same ``rng``
        state (tested against its digest): drafts are drawn from ``rng`` in prompt order; the verification
        sample and the word-by-word fixes draw from ``rng`` after the last draft, as before. To get there without
        holding the drafts, a first pass draws them and keeps only ``rng``'s state at the start of each chunk
        (2.5 KB per chunk); the chunks are then drawn again from those states. That doubles the local
        assembly (microseconds per prompt), not the ``/tokenize`` round trips.

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
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        verify = verify or self.verify
        await self._learn()
        prefix_tokens = await self.count(prefix) if prefix else 0
        if prefix and prefix_tokens >= n_tokens:
            raise ValueError(
                f"prefix has {prefix_tokens} tokens, not fewer than the prompt's {n_tokens}: "
                "make shared_prefix_tokens smaller than prompt_tokens"
            )
        # Pass 1: the rng state at each chunk's start; rng ends where the former build left it after its drafts.
        states = []
        for i in range(n_prompts):
            if i % chunk == 0:
                version, internal, gauss = rng.getstate()
                # 625 words of 32 bits as an array: 2.5 KB, where the tuple of ints takes about 22 KB.
                states.append((version, array.array("I", internal), gauss))
            self._assemble(n_tokens, rng, prefix, prefix_tokens)
        self.stats["built"] += n_prompts

        def drafts_of(c: int) -> list[list[str]]:
            r = random.Random()
            version, internal, gauss = states[c]
            r.setstate((version, tuple(internal), gauss))
            return [self._assemble(n_tokens, r, prefix, prefix_tokens)
                    for _ in range(c * chunk, min((c + 1) * chunk, n_prompts))]

        n_chunks = len(states)
        if verify == "none":
            for c in range(n_chunks):
                for w in drafts_of(c):
                    yield self._text(prefix, w)
            return
        if verify == "all" or self._exact_in_a_row < self.trust_after:
            # Every prompt checked, fixed in prompt order (as before), a chunk at a time.
            for c in range(n_chunks):
                drafts = drafts_of(c)
                texts = [self._text(prefix, w) for w in drafts]
                counts = await _bounded_gather([self.count(t) for t in texts], self.parallel)
                self.stats["verified"] += len(texts)
                for j, got in enumerate(counts):
                    if got != n_tokens:
                        self._exact_in_a_row = 0
                        texts[j] = await self._fix(n_tokens, rng, prefix, drafts[j], got)
                    else:
                        self._exact_in_a_row += 1
                for t in texts:
                    yield t
            return
        # A sample checked first (its fixes in the sample's order, as before); a miss among it: every other
        # prompt is checked too, in prompt order.
        check = rng.sample(range(n_prompts), min(self.sample_size, n_prompts))
        sampled: dict[int, tuple[list[str], str]] = {}
        for i in check:
            w = drafts_of(i // chunk)[i % chunk]
            sampled[i] = (w, self._text(prefix, w))
        counts = await _bounded_gather([self.count(sampled[i][1]) for i in check], self.parallel)
        self.stats["verified"] += len(check)
        fixed: dict[int, str] = {}
        for i, got in zip(check, counts):
            if got != n_tokens:
                self._exact_in_a_row = 0
                fixed[i] = await self._fix(n_tokens, rng, prefix, sampled[i][0], got)
            else:
                self._exact_in_a_row += 1
        check_rest = any(got != n_tokens for got in counts) and len(check) < n_prompts
        for c in range(n_chunks):
            drafts = drafts_of(c)
            base = c * chunk
            texts = [fixed.get(base + j, self._text(prefix, w)) for j, w in enumerate(drafts)]
            if check_rest:
                rest = [j for j in range(len(drafts)) if base + j not in sampled]
                more = await _bounded_gather([self.count(texts[j]) for j in rest], self.parallel)
                self.stats["verified"] += len(rest)
                for j, got in zip(rest, more):
                    if got != n_tokens:
                        texts[j] = await self._fix(n_tokens, rng, prefix, drafts[j], got)
            for t in texts:
                yield t
