"""Workload profiles: what each request of a window asks for, as one type per kind of workload.

A plan's workload (``tunelab.core.plan.Workload``) has common fields (``name``, ``num_requests``, ``endpoint``,
``ignore_eos``, ``shared_prefix_tokens``) and a *workload type*, told apart by ``type`` (a pydantic
discriminated union, :data:`WorkloadType`):

* ``fixed`` (the default, today's workloads): every prompt ``prompt_tokens`` long, every answer
  ``output_tokens`` long;
* ``distribution``: prompt and output lengths drawn from a :data:`LengthDistribution` (``fixed``, ``uniform``,
  ``normal``, ``lognormal``, ``empirical`` histogram), clipped to ``[min_tokens, max_tokens]`` and to the
  model's context;
* ``dataset``: requests read from a local file the user brings: ShareGPT JSON (a list of
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}``) or JSONL whose lines
  have ``conversations``, OpenAI ``messages``, or ``prompt_tokens`` / ``output_tokens`` lengths;
* ``trace``: a CSV or JSONL trace of ``arrival_s, prompt_tokens, output_tokens``; its arrival offsets are
  sent by the ``trace`` load profile (``tunelab.core.load_profiles.TraceProfile``, time-scaled by its speedup).

Every type turns ``(n, seed)`` into ``n`` :class:`RequestSpec` (prompt length or text, output length, optional
messages and arrival offset) deterministically: the same arguments always give the same specs. Every type also
gives :meth:`record` (type, parameters and the sha256 of any file it read), which the trial stores in
``trials.workloads``. The measurement builds prompts of the exact lengths with the runtime's own tokenizer
(``tasks.loadgen.PromptBuilder``), as for fixed lengths. docs/workloads.md lists the types and parameters and
says how to add one.

Domain layer: imports only the standard library, numpy and pydantic.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Awaitable, Callable, ClassVar, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

__all__ = [
    "RequestSpec",
    "WorkloadFileError",
    "FixedDistribution",
    "UniformDistribution",
    "NormalDistribution",
    "LogNormalDistribution",
    "EmpiricalDistribution",
    "LengthDistribution",
    "FixedWorkload",
    "DistributionWorkload",
    "DatasetWorkload",
    "TraceWorkload",
    "MultiTurnWorkload",
    "WorkloadType",
    "WORKLOAD_TYPES",
    "DatasetEntry",
    "TraceRow",
    "read_dataset",
    "read_dataset_skipping",
    "DatasetRead",
    "UnusableRecord",
    "DATASET_RULE",
    "CONTEXT_MARGIN_TOKENS",
    "fit_text_to_context",
    "read_trace",
    "file_sha256",
    "synthetic_sharegpt",
    "synthetic_trace",
    "write_demo_files",
]


class WorkloadFileError(ValueError):
    """A dataset or trace file that cannot be used. The message names the file and, where the fault is in one
    record, its 1-based line (``path:line: what is wrong; the fix``)."""

    def __init__(self, path: str | os.PathLike, line: int | None, msg: str) -> None:
        self.path = str(path)
        self.line = line
        super().__init__(f"{self.path}:{line}: {msg}" if line is not None else f"{self.path}: {msg}")


@dataclass(frozen=True)
class RequestSpec:
    """What one request of a window asks for.

    Attributes:
        output_tokens: ``max_tokens`` of the request (>= 1).
        prompt_tokens: exact prompt length, tokens of the runtime's tokenizer (the measurement builds a prompt
            of that length); None when ``prompt_text`` or ``messages`` give the prompt.
        prompt_text: the prompt as given by a dataset (sent as is), or None.
        messages: OpenAI chat messages (``[{"role", "content"}]``) of a dataset entry, or None.
        output_text: a dataset's reference answer whose token count sets ``max_tokens`` when the file gives no
            ``output_tokens`` (counted by the measurement with the runtime's tokenizer), or None.
        arrival_offset_s: a trace's send offset, seconds after its first request (before the trace load
            profile's speedup), or None.
    """

    output_tokens: int
    prompt_tokens: int | None = None
    prompt_text: str | None = None
    messages: tuple[dict, ...] | None = None
    output_text: str | None = None
    arrival_offset_s: float | None = None


def _rng(seed: int, *parts: Any) -> np.random.Generator:
    """A generator seeded by ``seed`` and ``parts`` (so prompt and output draws are independent streams)."""
    blob = "|".join(map(str, (seed, *parts))).encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(blob).digest()[:8], "big"))


# ----------------------------------------------------------------------------------------------------------
# Length distributions
# ----------------------------------------------------------------------------------------------------------


class _Dist(BaseModel):
    """What every length distribution provides: ``sample(n, rng)`` -> int64 array of shape ``(n,)``, each value
    in ``[min_tokens, max_tokens]`` (values drawn outside are clipped to the bound, so the bounds carry the
    clipped mass), and ``nominal_max`` (the largest value it can give, for plan limits)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_tokens: StrictInt = Field(1, ge=1, description="Smallest length, tokens (draws below are clipped to it).")
    max_tokens: StrictInt | None = Field(None, ge=1, description="Largest length, tokens (draws above are clipped "
                                                                  "to it); None: no bound but the model's context.")

    @model_validator(mode="after")
    def _bounds(self) -> "_Dist":
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})")
        return self

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` lengths (int64, tokens): continuous draws rounded to the nearest integer, then clipped to
        ``[min_tokens, max_tokens]``."""
        x = np.rint(self._draw(int(n), rng))
        hi = self.max_tokens if self.max_tokens is not None else np.iinfo(np.int64).max // 4
        return np.clip(x, self.min_tokens, hi).astype(np.int64)

    @property
    def nominal_max(self) -> int:  # pragma: no cover - abstract
        """The largest length it gives (``max_tokens``, else a high quantile), for plan limits and costs."""
        raise NotImplementedError

    @property
    def mean_tokens(self) -> float:  # pragma: no cover - abstract
        """The mean before clipping, tokens (plan cost)."""
        raise NotImplementedError


class FixedDistribution(_Dist):
    """Every length exactly ``tokens``."""

    dist: Literal["fixed"] = "fixed"
    tokens: StrictInt = Field(gt=0, description="The length, tokens.")

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, float(self.tokens))

    @property
    def nominal_max(self) -> int:
        return min(self.tokens, self.max_tokens or self.tokens)

    @property
    def mean_tokens(self) -> float:
        return float(self.tokens)


class UniformDistribution(_Dist):
    """Integers uniform on ``[low, high]`` inclusive (as ``vllm bench serve --random-range-ratio``'s range)."""

    dist: Literal["uniform"] = "uniform"
    low: StrictInt = Field(gt=0, description="Smallest length, tokens.")
    high: StrictInt = Field(gt=0, description="Largest length, tokens (>= low).")

    @model_validator(mode="after")
    def _order(self) -> "UniformDistribution":
        if self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) must be >= low ({self.low}); e.g. {{dist: uniform, low: "
                             "32, high: 256}")
        return self

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True).astype(np.float64)

    @property
    def nominal_max(self) -> int:
        return min(self.high, self.max_tokens or self.high)

    @property
    def mean_tokens(self) -> float:
        return (self.low + self.high) / 2


class NormalDistribution(_Dist):
    """Normal with ``mean`` and ``sd`` (tokens), rounded and clipped (``min_tokens`` >= 1 keeps it positive)."""

    dist: Literal["normal"] = "normal"
    mean: float = Field(gt=0, allow_inf_nan=False, description="Mean length, tokens.")
    sd: float = Field(ge=0, allow_inf_nan=False, description="Standard deviation, tokens.")

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(self.mean, self.sd, size=n)

    @property
    def nominal_max(self) -> int:
        return int(self.max_tokens or math.ceil(self.mean + 4 * self.sd))

    @property
    def mean_tokens(self) -> float:
        return float(self.mean)


class LogNormalDistribution(_Dist):
    """Log-normal: ``log(length)`` is normal with mean ``log(median)`` and standard deviation ``sigma``
    (scipy.stats.lognorm(s=sigma, scale=median)); the usual shape of chat prompt and answer lengths."""

    dist: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, allow_inf_nan=False, description="Median length, tokens.")
    sigma: float = Field(ge=0, allow_inf_nan=False, description="Standard deviation of log(length).")

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.lognormal(math.log(self.median), self.sigma, size=n)

    @property
    def nominal_max(self) -> int:
        return int(self.max_tokens or math.ceil(self.median * math.exp(4 * self.sigma)))

    @property
    def mean_tokens(self) -> float:
        return float(self.median * math.exp(self.sigma ** 2 / 2))


class EmpiricalDistribution(_Dist):
    """A histogram: bin ``i`` covers the integer lengths ``[edges[i], edges[i+1])`` and is drawn with
    probability ``counts[i] / sum(counts)``; within a bin the length is uniform. E.g. the histogram of a
    production log's prompt lengths."""

    dist: Literal["empirical"] = "empirical"
    edges: list[StrictInt] = Field(min_length=2, description="Bin edges, tokens, strictly increasing, first >= 1.")
    counts: list[float] = Field(min_length=1, description="Weight of each bin (>= 0, one fewer than edges).")

    @model_validator(mode="after")
    def _shape(self) -> "EmpiricalDistribution":
        if len(self.counts) != len(self.edges) - 1:
            raise ValueError(f"empirical: counts needs one weight per bin, len(edges) - 1 = {len(self.edges) - 1}, "
                             f"got {len(self.counts)}; e.g. {{dist: empirical, edges: [1, 64, 256], counts: [3, 1]}}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])) or self.edges[0] < 1:
            raise ValueError(f"empirical: edges must be strictly increasing integers >= 1, got {self.edges}")
        if any(not math.isfinite(c) or c < 0 for c in self.counts) or sum(self.counts) <= 0:
            raise ValueError(f"empirical: counts must be finite, >= 0 and not all 0, got {self.counts}")
        return self

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        p = np.asarray(self.counts, dtype=np.float64)
        b = rng.choice(len(p), size=n, p=p / p.sum())
        lo = np.asarray(self.edges[:-1])[b]
        hi = np.asarray(self.edges[1:])[b]
        return rng.integers(lo, hi).astype(np.float64)  # hi exclusive: [edges[i], edges[i+1])

    @property
    def nominal_max(self) -> int:
        return min(self.edges[-1] - 1, self.max_tokens or self.edges[-1])

    @property
    def mean_tokens(self) -> float:
        p = np.asarray(self.counts) / sum(self.counts)
        mids = (np.asarray(self.edges[:-1]) + np.asarray(self.edges[1:]) - 1) / 2
        return float(np.sum(p * mids))


#: A length distribution, told apart by ``dist``.
LengthDistribution = Annotated[
    Union[FixedDistribution, UniformDistribution, NormalDistribution, LogNormalDistribution, EmpiricalDistribution],
    Field(discriminator="dist"),
]


def _as_dist(v: Any) -> Any:
    """A bare integer length is a fixed distribution."""
    if isinstance(v, int) and not isinstance(v, bool):
        return {"dist": "fixed", "tokens": v}
    return v


def _clip_to_context(prompt: np.ndarray, output: np.ndarray, context_tokens: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Clip so that ``prompt + output <= context_tokens`` (the model's max-model-len): the output first keeps at
    most half the context, then the prompt takes what is left (a request longer than the context is rejected
    by the server, not measured)."""
    if context_tokens is None:
        return prompt, output
    output = np.minimum(output, max(1, context_tokens // 2))
    prompt = np.maximum(1, np.minimum(prompt, context_tokens - output))
    return prompt, output


# ----------------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of the file's bytes (recorded with the trial, so a result names the exact file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class DatasetEntry:
    """One request of a dataset file: a prompt (text, messages, or a length) and an output length or reference
    answer; ``line`` is the 1-based line of the file where the entry starts."""

    line: int
    prompt_text: str | None = None
    messages: tuple[dict, ...] | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_text: str | None = None


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "system": "system"}


class UnusableRecord(WorkloadFileError):
    """A conversation record that gives no (prompt, answer) pair to send: fewer than two turns, a turn that is not
    ``{"from", "value": text}`` of a known role, no user turn, or no non-empty answer after the first user turn.
    ``vllm bench serve`` skips such ShareGPT records (vllm/benchmarks/datasets.py, ``ShareGPTDataset``: entries
    with fewer than two turns are dropped); a :class:`DatasetWorkload` does too (``skip_unusable``) and counts
    them by ``reason``; :func:`read_dataset` raises it."""

    def __init__(self, path: str | os.PathLike, line: int | None, msg: str, reason: str) -> None:
        self.reason = reason
        super().__init__(path, line, msg)


def _pos_int(path: Any, line: int, obj: dict, key: str) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WorkloadFileError(path, line, f"{key} must be an integer >= 1 (tokens), got {v!r}")
    return v


def _entry(path: Any, line: int, obj: Any) -> DatasetEntry:
    """One record (a ShareGPT conversation, an OpenAI messages list, or lengths) as a :class:`DatasetEntry`.

    Source of the ShareGPT rule: ``vllm bench serve --dataset-name sharegpt`` (vllm/benchmarks/datasets.py,
    ``ShareGPTDataset``): the prompt is the first turn, the output length the token count of the second."""
    if not isinstance(obj, dict):
        raise WorkloadFileError(path, line, f"a record must be a JSON object, got {type(obj).__name__}")
    out_tokens = _pos_int(path, line, obj, "output_tokens")
    if "conversations" in obj:
        conv = obj["conversations"]
        if not isinstance(conv, list) or len(conv) < 2:
            raise UnusableRecord(path, line, "conversations must be a list of at least 2 turns "
                                             '([{"from": "human", "value": ...}, {"from": "gpt", "value": ...}])',
                                 "fewer than 2 turns")
        msgs = []
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or turn.get("from") not in _SHAREGPT_ROLES:
                raise UnusableRecord(path, line, f"conversations[{j}] must be {{\"from\": one of "
                                                 f"{sorted(_SHAREGPT_ROLES)}, \"value\": text}}, got {turn!r:.80}",
                                     "a malformed turn")
            msgs.append({"role": _SHAREGPT_ROLES[turn["from"]], "content": turn["value"]})
        return _from_messages(path, line, msgs, out_tokens)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
            raise WorkloadFileError(path, line, 'messages must be a non-empty list of {"role": ..., "content": text}')
        return _from_messages(path, line, [dict(m) for m in msgs], out_tokens)
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise WorkloadFileError(path, line, "prompt must be non-empty text")
        if out_tokens is None:
            raise WorkloadFileError(path, line, "a prompt record needs output_tokens (an integer >= 1)")
        return DatasetEntry(line, prompt_text=obj["prompt"], output_tokens=out_tokens)
    p_tokens = _pos_int(path, line, obj, "prompt_tokens")
    if p_tokens is None or out_tokens is None:
        raise WorkloadFileError(path, line, "a record needs conversations (ShareGPT), messages, prompt + "
                                            f"output_tokens, or prompt_tokens + output_tokens; got keys {sorted(obj)}")
    return DatasetEntry(line, prompt_tokens=p_tokens, output_tokens=out_tokens)


def _from_messages(path: Any, line: int, msgs: list[dict], out_tokens: int | None) -> DatasetEntry:
    """Prompt: the messages up to and including the first user turn; output: the answer after it (its
    token count), unless the record gives ``output_tokens``."""
    first_user = next((i for i, m in enumerate(msgs) if m["role"] == "user"), None)
    if first_user is None:
        raise UnusableRecord(path, line, "the conversation has no human/user turn to send", "no user turn")
    if not msgs[first_user]["content"].strip():
        raise UnusableRecord(path, line, "the first user turn is empty", "an empty prompt")
    answer = msgs[first_user + 1] if first_user + 1 < len(msgs) else None
    if out_tokens is None and (answer is None or answer["role"] != "assistant" or not answer["content"]):
        raise UnusableRecord(path, line, "the first user turn has no non-empty answer after it to take the "
                                         "output length from; add one or give output_tokens",
                             "no answer after the first user turn")
    prompt = tuple(msgs[: first_user + 1])
    return DatasetEntry(line, prompt_text=prompt[-1]["content"], messages=prompt, output_tokens=out_tokens,
                        output_text=None if out_tokens is not None else answer["content"])  # type: ignore[index]


def _json_array_items(path: Any, text: str) -> list[tuple[int, Any]]:
    """The items of a top-level JSON array with the 1-based line where each starts."""
    dec = json.JSONDecoder()
    # Lines counted from the last position asked (positions only grow): counting from 0 for each record is
    # quadratic, hours on the 673 MB ShareGPT_V3 file.
    mark = [0, 1]  # position, its line

    def line_of(pos: int) -> int:
        if pos < mark[0]:
            return text.count("\n", 0, pos) + 1
        mark[1] += text.count("\n", mark[0], pos)
        mark[0] = pos
        return mark[1]

    def skip_ws(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    pos = skip_ws(0)
    if pos >= len(text) or text[pos] != "[":
        raise WorkloadFileError(path, line_of(pos), "a .json dataset must be a JSON array of records (ShareGPT); "
                                                    "use .jsonl for one record per line")
    items = []
    pos = skip_ws(pos + 1)
    if pos < len(text) and text[pos] == "]":
        return items
    while True:
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise WorkloadFileError(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
        items.append((line_of(pos), obj))
        pos = skip_ws(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            if skip_ws(pos + 1) != len(text):
                raise WorkloadFileError(path, line_of(skip_ws(pos + 1)), "text after the end of the JSON array")
            return items
        raise WorkloadFileError(path, line_of(pos), "expected ',' or ']' after a record of the JSON array")


def _jsonl_items(path: Any, text: str) -> list[tuple[int, Any]]:
    items = []
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            items.append((i, json.loads(raw)))
        except json.JSONDecodeError as e:
            raise WorkloadFileError(path, i, f"invalid JSON: {e.msg} (column {e.colno}); a .jsonl file has one "
                                             "JSON object per line") from None
    return items


def _read_text(path: str | os.PathLike) -> str:
    p = Path(path)
    if not p.is_file():
        raise WorkloadFileError(path, None, "no such file (datasets and traces are read from a local path; "
                                            "nothing is downloaded)")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = p.read_bytes()[: e.start].count(b"\n") + 1
        raise WorkloadFileError(path, line, "not UTF-8 text") from None


def _format_of(path: str | os.PathLike, fmt: str, allowed: tuple[str, ...]) -> str:
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in allowed:
        return suffix
    raise WorkloadFileError(path, None, f"cannot tell the format from the suffix {suffix!r}: name the file "
                                        f"{' or '.join('.' + a for a in allowed)}, or set format to one of {list(allowed)}")


#: The rule a dataset workload applies to its file, as recorded with the trial (``trials.dataset_filters``).
DATASET_RULE = ("skip conversation records with no (user prompt, non-empty answer) pair (vllm bench serve's ShareGPT "
                "rule); at send time clip a text prompt so prompt + max_tokens fits the server's max-model-len "
                "(max_tokens first to at most half of it, then the prompt's tail cut)")


#: Tokens kept free of a clipped prompt + max_tokens below the context: the chat template and special tokens the
#: server adds around a text prompt are not in its count.
CONTEXT_MARGIN_TOKENS = 32


async def fit_text_to_context(text: str, max_tokens: int, context_tokens: int,
                              count: Callable[[str], Awaitable[int]],
                              margin_tokens: int = CONTEXT_MARGIN_TOKENS) -> tuple[str, int, bool]:
    """A dataset's text prompt and ``max_tokens`` made to fit the server's context (:data:`DATASET_RULE`), so a
    9k-token prompt is not sent to a 4k server (which answers 400 and counts as an error).

    Rule (as :func:`_clip_to_context` for lengths): when ``count(text) + max_tokens`` fits in ``context_tokens -
    margin_tokens`` nothing changes; else ``max_tokens`` keeps at most half the context, and a prompt still too long
    is cut at its end (characters in proportion to the excess, recounted until it fits).

    Args:
        text: the prompt. max_tokens: the request's output length. context_tokens: the server's max-model-len.
        count: the server's tokenizer count of a text (``PromptBuilder.count``), awaited.
        margin_tokens: tokens left free for the chat template and special tokens.

    Returns:
        (text, max_tokens, clipped): ``clipped`` is True when the prompt was cut.
    """
    room = max(2, context_tokens - margin_tokens)
    n = await count(text)
    if n + max_tokens <= room:
        return text, max_tokens, False
    out = max(1, min(max_tokens, room // 2, room - n)) if n < room else max(1, min(max_tokens, room // 2))
    budget = room - out
    if n <= budget:
        return text, out, False
    for _ in range(16):
        text = text[: max(1, int(len(text) * budget / max(n, 1) * 0.97))]
        n = await count(text)
        if n <= budget:
            break
    return text, out, True


@dataclass(frozen=True)
class DatasetRead:
    """A dataset file read with unusable records skipped (:func:`read_dataset_skipping`).

    Attributes:
        entries: the usable records, in file order.
        records: records in the file.
        skipped: reason -> records skipped for it (:class:`UnusableRecord` reasons).
        first_skipped: (line, message) of the first skipped record, or None.
    """

    entries: list[DatasetEntry]
    records: int
    skipped: dict[str, int]
    first_skipped: tuple[int, str] | None = None

    def summary(self) -> str:
        """E.g. ``used 61 of 64 records; skipped 3 (2 fewer than 2 turns, 1 no user turn; first at line 40)``."""
        n = sum(self.skipped.values())
        if not n:
            return f"used all {self.records} records"
        why = ", ".join(f"{c} {r}" for r, c in sorted(self.skipped.items(), key=lambda kv: -kv[1]))
        first = f"; first at line {self.first_skipped[0]}" if self.first_skipped else ""
        return f"used {len(self.entries)} of {self.records} records; skipped {n} ({why}{first})"


def _items_of(path: str | os.PathLike, fmt: str) -> list[tuple[int, Any]]:
    text = _read_text(path)
    items = _json_array_items(path, text) if _format_of(path, fmt, ("json", "jsonl")) == "json" else _jsonl_items(path, text)
    if not items:
        raise WorkloadFileError(path, None, "no records")
    return items


def read_dataset_skipping(path: str | os.PathLike, fmt: str = "auto") -> DatasetRead:
    """As :func:`read_dataset`, but a conversation record with no usable (prompt, answer) pair
    (:class:`UnusableRecord`: fewer than two turns, a malformed turn, no user turn, an empty prompt, no answer) is
    skipped and counted instead of raised, as ``vllm bench serve`` does with ShareGPT (whose V3 file has records with
    ``"conversations": []`` and ones that start with a gpt turn). Other faults (invalid JSON, a bad length, a
    record of no known shape) still raise.

    Raises:
        WorkloadFileError: as :func:`read_dataset`, and when every record was skipped (naming the counts).
    """
    items = _items_of(path, fmt)
    entries: list[DatasetEntry] = []
    skipped: dict[str, int] = {}
    first: tuple[int, str] | None = None
    for line, obj in items:
        try:
            entries.append(_entry(path, line, obj))
        except UnusableRecord as e:
            skipped[e.reason] = skipped.get(e.reason, 0) + 1
            first = first or (line, str(e))
    read = DatasetRead(entries, len(items), skipped, first)
    if not entries:
        raise WorkloadFileError(path, None, f"no usable records: {read.summary()}; the first: {first[1] if first else ''}")
    return read


def read_dataset(path: str | os.PathLike, fmt: str = "auto") -> list[DatasetEntry]:
    """The requests of a dataset file, in file order.

    Args:
        path: a local file: ``.json`` (ShareGPT: a JSON array of records) or ``.jsonl`` (one record per line).
            A record has ``conversations`` (ShareGPT turns), ``messages`` (OpenAI chat), ``prompt`` text with
            ``output_tokens``, or ``prompt_tokens`` and ``output_tokens``; ``output_tokens`` overrides the
            length of the reference answer.
        fmt: ``'auto'`` (by suffix), ``'json'`` or ``'jsonl'``.

    Returns:
        One :class:`DatasetEntry` per record (at least one).

    Raises:
        WorkloadFileError: a missing or unreadable file, invalid JSON or a bad record (the message names the file
            and the record's line), or no record.
    """
    return [_entry(path, line, obj) for line, obj in _items_of(path, fmt)]


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: its arrival, seconds (any origin: offsets are taken from the first row), its
    prompt and output lengths, tokens; ``line`` is the 1-based line in the file."""

    line: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


_TRACE_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")


def _trace_row(path: Any, line: int, rec: dict) -> TraceRow:
    missing = [k for k in _TRACE_FIELDS if rec.get(k) in (None, "")]
    if missing:
        raise WorkloadFileError(path, line, f"missing {missing}: every row needs {list(_TRACE_FIELDS)}")
    try:
        t = float(rec["arrival_s"])
    except (TypeError, ValueError):
        raise WorkloadFileError(path, line, f"arrival_s must be a number of seconds, got {rec['arrival_s']!r}") from None
    if not math.isfinite(t):
        raise WorkloadFileError(path, line, f"arrival_s must be finite, got {rec['arrival_s']!r}")
    vals = []
    for k in ("prompt_tokens", "output_tokens"):
        v = rec[k]
        try:
            iv = int(v) if not isinstance(v, float) or v.is_integer() else None
        except (TypeError, ValueError):
            iv = None
        if iv is None or isinstance(v, bool) or iv < 1 or (isinstance(v, str) and not v.strip().isdigit()):
            raise WorkloadFileError(path, line, f"{k} must be an integer >= 1 (tokens), got {v!r}")
        vals.append(iv)
    return TraceRow(line, t, vals[0], vals[1])


def read_trace(path: str | os.PathLike, fmt: str = "auto") -> list[TraceRow]:
    """The rows of a trace file, in file order (arrivals must not go back in time).

    Args:
        path: ``.csv`` with a header row naming ``arrival_s,prompt_tokens,output_tokens`` (other columns are
            ignored) or ``.jsonl`` with those keys on every line.
        fmt: ``'auto'`` (by suffix), ``'csv'`` or ``'jsonl'``.

    Raises:
        WorkloadFileError: a missing file, a bad header, a bad or missing value, or an arrival earlier than the
            row before (the message names the file and line).
    """
    text = _read_text(path)
    rows: list[TraceRow] = []
    if _format_of(path, fmt, ("csv", "jsonl")) == "csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or any(k not in reader.fieldnames for k in _TRACE_FIELDS):
            raise WorkloadFileError(path, 1, f"the header must name {list(_TRACE_FIELDS)}, got {reader.fieldnames}")
        for rec in reader:
            rows.append(_trace_row(path, reader.line_num, rec))
    else:
        for line, obj in _jsonl_items(path, text):
            if not isinstance(obj, dict):
                raise WorkloadFileError(path, line, "a trace line must be a JSON object")
            rows.append(_trace_row(path, line, obj))
    if not rows:
        raise WorkloadFileError(path, None, "no rows")
    for a, b in zip(rows, rows[1:]):
        if b.arrival_s < a.arrival_s:
            raise WorkloadFileError(path, b.line, f"arrival_s {b.arrival_s} is earlier than the row before "
                                                  f"({a.arrival_s}, line {a.line}); sort the trace by arrival")
    return rows


# ----------------------------------------------------------------------------------------------------------
# Workload types
# ----------------------------------------------------------------------------------------------------------


class _Workload(BaseModel):
    """What every workload type provides (see the module docstring). Subclasses set ``type`` (a ``Literal``,
    the discriminator) and implement :meth:`request_specs`, ``nominal_prompt_tokens`` and
    ``nominal_output_tokens``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: True when the specs carry arrival offsets (a trace): the ``trace`` load profile sends them.
    has_arrivals: ClassVar[bool] = False

    def request_specs(self, n: int, seed: int, context_tokens: int | None = None) -> list[RequestSpec]:  # pragma: no cover
        """``n`` request specs drawn from ``seed``; lengths clipped so prompt + output <= ``context_tokens``
        (the model's max-model-len; None: no clip). Same arguments, same specs."""
        raise NotImplementedError

    @property
    def nominal_prompt_tokens(self) -> int:  # pragma: no cover - abstract
        """The longest prompt it asks for, tokens (plan limits: max-model-len, prompt tokens held per window)."""
        raise NotImplementedError

    @property
    def nominal_output_tokens(self) -> int:  # pragma: no cover - abstract
        """The longest output it asks for, tokens."""
        raise NotImplementedError

    @property
    def exact_prompt_tokens(self) -> int | None:
        """The one prompt length of every request when there is one (fixed), else None."""
        return None

    def record(self) -> dict[str, Any]:
        """What the trial stores about it (``trials.workloads``): ``type``, ``parameters`` (the plan's) and
        ``file_sha256`` of the file it read (None without a file)."""
        params = self.model_dump(mode="json", exclude={"type"})
        return {"type": self.type, "parameters": params, "file_sha256": None}  # type: ignore[attr-defined]


class FixedWorkload(_Workload):
    """Today's workloads: every prompt exactly ``prompt_tokens``, every answer ``output_tokens`` (clipped to
    the context like the others)."""

    type: Literal["fixed"] = "fixed"
    prompt_tokens: StrictInt = Field(gt=0, description="Prompt length in tokens of the runtime's own tokenizer.")
    output_tokens: StrictInt = Field(gt=0, description="Output tokens requested per request (max_tokens).")

    def request_specs(self, n: int, seed: int, context_tokens: int | None = None) -> list[RequestSpec]:
        return [RequestSpec(output_tokens=self.output_tokens, prompt_tokens=self.prompt_tokens)] * int(n)

    @property
    def nominal_prompt_tokens(self) -> int:
        return self.prompt_tokens

    @property
    def nominal_output_tokens(self) -> int:
        return self.output_tokens

    @property
    def exact_prompt_tokens(self) -> int:
        return self.prompt_tokens


class DistributionWorkload(_Workload):
    """Prompt and output lengths drawn from distributions (a bare integer is a fixed length), independently
    per request, from streams seeded by ``seed`` (prompt and output streams separate)."""

    type: Literal["distribution"] = "distribution"
    prompt_tokens: LengthDistribution = Field(description="Prompt length distribution, tokens.")
    output_tokens: LengthDistribution = Field(description="Output length distribution, tokens (max_tokens).")

    @field_validator("prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _bare_int(cls, v: Any) -> Any:
        return _as_dist(v)

    def request_specs(self, n: int, seed: int, context_tokens: int | None = None) -> list[RequestSpec]:
        p = self.prompt_tokens.sample(n, _rng(seed, "prompt_tokens"))
        o = self.output_tokens.sample(n, _rng(seed, "output_tokens"))
        p, o = _clip_to_context(p, o, context_tokens)
        return [RequestSpec(output_tokens=int(b), prompt_tokens=int(a)) for a, b in zip(p, o)]

    @property
    def nominal_prompt_tokens(self) -> int:
        return self.prompt_tokens.nominal_max

    @property
    def nominal_output_tokens(self) -> int:
        return self.output_tokens.nominal_max


class _FileWorkload(_Workload):
    path: str = Field(description="Local file path (relative: to the directory tunelab runs in).")

    _cache: ClassVar[dict[tuple, Any]] = {}

    def _load(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def loaded(self) -> Any:
        """The file's parsed records, cached by (path, size, mtime, parameters)."""
        st = os.stat(self.path) if os.path.isfile(self.path) else None
        # The parameters are part of the key: the same file read with another format or skip rule is another read.
        key = (os.path.abspath(self.path), st.st_size if st else -1, st.st_mtime_ns if st else -1, type(self).__name__,
               json.dumps(self.model_dump(mode="json"), sort_keys=True))
        if key not in self._cache:
            self._cache[key] = self._load()  # type: ignore[index]
        return self._cache[key]  # type: ignore[index]

    @model_validator(mode="after")
    def _readable(self) -> "_FileWorkload":
        self.loaded()  # a bad file fails at plan check, naming the file and line
        return self

    _sha_cache: ClassVar[dict[tuple[str, int, int], str]] = {}

    def sha256(self) -> str:
        """:func:`file_sha256` of the file, cached by (path, size, mtime) (a dataset can be hundreds of MB)."""
        st = os.stat(self.path)
        key = (os.path.abspath(self.path), st.st_size, st.st_mtime_ns)
        if key not in self._sha_cache:
            self._sha_cache[key] = file_sha256(self.path)
        return self._sha_cache[key]

    def record(self) -> dict[str, Any]:
        rec = super().record()
        rec["file_sha256"] = self.sha256()
        return rec


class DatasetWorkload(_FileWorkload):
    """Requests from a dataset file (:func:`read_dataset`): ``order: shuffle`` (default) draws a seeded
    permutation of the records, cycling through further permutations when a window needs more requests than
    the file has; ``order: file`` takes them in file order, cycling. Output lengths: the record's
    ``output_tokens``, else the reference answer's token count (counted by the measurement with the runtime's
    tokenizer), capped at ``max_output_tokens``."""

    type: Literal["dataset"] = "dataset"
    format: Literal["auto", "json", "jsonl"] = Field("auto", description="auto: by the file's suffix.")
    order: Literal["shuffle", "file"] = Field("shuffle", description="shuffle: seeded permutation; file: in order.")
    max_output_tokens: StrictInt = Field(1024, gt=0, description="Cap on an output length taken from a record, tokens.")
    skip_unusable: bool = Field(True, description="Skip (and count) conversation records with no (prompt, answer) "
                                                  "pair, as vllm bench serve does; false: such a record is an error.")

    def _load(self) -> DatasetRead:
        if self.skip_unusable:
            return read_dataset_skipping(self.path, self.format)
        entries = read_dataset(self.path, self.format)
        return DatasetRead(entries, len(entries), {})

    def entries(self) -> list[DatasetEntry]:
        """The usable records of the file (cached)."""
        return self.loaded().entries

    def filter_record(self) -> dict[str, Any]:
        """What the trial stores of the file and its filter (``trials.dataset_filters``): ``file_sha256``,
        ``rule`` (:data:`DATASET_RULE`, or strict), ``records``, ``used``, ``skipped`` (reason -> count)."""
        r: DatasetRead = self.loaded()
        return {"path": self.path, "file_sha256": self.sha256(),
                "rule": DATASET_RULE if self.skip_unusable else "every record must be usable (skip_unusable: false); "
                + DATASET_RULE.split("; ", 1)[1],
                "records": r.records, "used": len(r.entries), "skipped": dict(r.skipped)}

    def request_specs(self, n: int, seed: int, context_tokens: int | None = None) -> list[RequestSpec]:
        entries: list[DatasetEntry] = self.entries()
        idx: list[int] = []
        rng = _rng(seed, "dataset")
        while len(idx) < n:
            idx.extend(rng.permutation(len(entries)).tolist() if self.order == "shuffle" else range(len(entries)))
        out = []
        for i in idx[: int(n)]:
            e = entries[i]
            o = min(e.output_tokens, self.max_output_tokens) if e.output_tokens is not None else self.max_output_tokens
            if e.prompt_tokens is not None:
                p, oo = _clip_to_context(np.array([e.prompt_tokens]), np.array([o]), context_tokens)
                out.append(RequestSpec(output_tokens=int(oo[0]), prompt_tokens=int(p[0])))
            else:
                out.append(RequestSpec(output_tokens=o, prompt_text=e.prompt_text, messages=e.messages,
                                       output_text=e.output_text))
        return out

    @property
    def nominal_prompt_tokens(self) -> int:
        # Text prompts: about one token per 4 characters (the limit checks need only a bound's order).
        return max((e.prompt_tokens or max(1, len(e.prompt_text or "") // 4)) for e in self.entries())

    @property
    def nominal_output_tokens(self) -> int:
        return max(min(e.output_tokens or self.max_output_tokens, self.max_output_tokens) for e in self.entries())


class TraceWorkload(_FileWorkload):
    """Requests of a trace file (:func:`read_trace`) in trace order, with arrival offsets from its first row.
    A window of more requests than rows replays the trace again after its span plus its mean gap."""

    type: Literal["trace"] = "trace"
    format: Literal["auto", "csv", "jsonl"] = Field("auto", description="auto: by the file's suffix.")
    has_arrivals: ClassVar[bool] = True

    def _load(self) -> list[TraceRow]:
        return read_trace(self.path, self.format)

    def request_specs(self, n: int, seed: int, context_tokens: int | None = None) -> list[RequestSpec]:
        rows: list[TraceRow] = self.loaded()
        t0 = rows[0].arrival_s
        span = rows[-1].arrival_s - t0
        period = span + (span / (len(rows) - 1) if len(rows) > 1 else 1.0)
        p = np.array([r.prompt_tokens for r in rows])
        o = np.array([r.output_tokens for r in rows])
        p, o = _clip_to_context(p, o, context_tokens)
        out = []
        for i in range(int(n)):
            k, j = divmod(i, len(rows))
            out.append(RequestSpec(output_tokens=int(o[j]), prompt_tokens=int(p[j]),
                                   arrival_offset_s=k * period + rows[j].arrival_s - t0))
        return out

    @property
    def nominal_prompt_tokens(self) -> int:
        return max(r.prompt_tokens for r in self.loaded())

    @property
    def nominal_output_tokens(self) -> int:
        return max(r.output_tokens for r in self.loaded())


class MultiTurnWorkload(_Workload):
    """Multi-turn chat sessions (AIPerf's multi-turn; ``vllm bench serve`` has none): a session's first request
    is one user message of ``prompt_tokens``; each later turn sends the whole conversation so far (every earlier
    user message and the server's actual answer) plus a new user message of ``turn_prompt_tokens``, after
    ``think_time_s`` from the previous answer's end. The conversation grows by one answer and one message per
    turn, which is the prefix that prefix caching can reuse. Needs ``endpoint: chat`` and a concurrency load
    level: c sessions are in flight at once (a session's think time holds its slot, as a user would), sessions
    interleave, and a finished session makes room for the next. A window of n requests runs ceil(n / turns)
    sessions; the last one may stop early.

    :meth:`request_specs` gives one spec per request in session order (session 0's turns, then session 1's,
    ...): its ``prompt_tokens`` is that turn's *new* user message; :meth:`session_of` maps a request index to
    ``(session, turn)``."""

    type: Literal["multi_turn"] = "multi_turn"
    turns: StrictInt = Field(ge=2, le=64, description="Turns (requests) per session.")
    prompt_tokens: StrictInt = Field(gt=0, description="Tokens of a session's first user message.")
    turn_prompt_tokens: StrictInt = Field(gt=0, description="Tokens of each later user message.")
    output_tokens: StrictInt = Field(gt=0, description="max_tokens of every turn.")
    think_time_s: float = Field(0.0, ge=0, allow_inf_nan=False,
                                description="Seconds between an answer's end and the session's next send.")
    has_sessions: ClassVar[bool] = True

    def request_specs(self, n: int, seed: int, context_tokens: int | None = None) -> list[RequestSpec]:
        # Every turn's history must fit: the last turn holds the first message, every answer and every message.
        out_tok = self.output_tokens
        if context_tokens is not None and self.nominal_prompt_tokens + out_tok > context_tokens:
            raise ValueError(f"multi_turn: the last turn needs {self.nominal_prompt_tokens} prompt + {out_tok} output "
                             f"tokens, more than the model's context of {context_tokens}; lower turns, "
                             "prompt_tokens, turn_prompt_tokens or output_tokens")
        return [RequestSpec(output_tokens=out_tok,
                            prompt_tokens=self.prompt_tokens if self.session_of(i)[1] == 0 else self.turn_prompt_tokens)
                for i in range(int(n))]

    def session_of(self, i: int) -> tuple[int, int]:
        """``(session, turn)`` of request ``i`` of a window (0-based both)."""
        return divmod(int(i), self.turns)

    @property
    def nominal_prompt_tokens(self) -> int:
        # The last turn's prompt: first message + (turns - 1) answers and new messages (chat template excluded).
        return self.prompt_tokens + (self.turns - 1) * (self.output_tokens + self.turn_prompt_tokens)

    @property
    def nominal_output_tokens(self) -> int:
        return self.output_tokens


#: The union of all workload types, told apart by ``type`` (pydantic discriminated union).
WorkloadType = Annotated[Union[FixedWorkload, DistributionWorkload, DatasetWorkload, TraceWorkload,
                               MultiTurnWorkload],
                         Field(discriminator="type")]
#: The ``type`` values a plan's workload may have.
WORKLOAD_TYPES: tuple[str, ...] = ("fixed", "distribution", "dataset", "trace", "multi_turn")


# ----------------------------------------------------------------------------------------------------------
# The synthetic ShareGPT-shaped file shipped for the demo and the tests
# ----------------------------------------------------------------------------------------------------------

_SYN_WORDS = (
    "the model server request token batch cache prefix answer question time memory layer kernel queue "
    "prompt output length user system data file sweep config trial latency throughput window load rate "
    "a of to and in is for on with as at by from it that this be are was can will not or an"
).split()


def synthetic_sharegpt(n_conversations: int = 64, seed: int = 0) -> list[dict]:
    """A ShareGPT-shaped dataset of ``n_conversations`` records, the same for the same arguments.

    Each record: ``{"id": "syn-<i>", "conversations": [human, gpt, ...]}`` with 1-3 human/gpt turn pairs;
    a turn's word count is log-normal (human: median 40 words, sigma 0.7; gpt: median 60 words, sigma 0.6,
    both clipped to [4, 400]), its words drawn from a fixed 60-word list. Generated with
    ``numpy.random.default_rng(seed)``; ``python -m tunelab.scripts.make_synthetic_sharegpt`` writes the
    shipped file (docs/workloads.md gives its length statistics).
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_conversations):
        turns = []
        for _ in range(int(rng.integers(1, 4))):
            for role, median, sigma in (("human", 40, 0.7), ("gpt", 60, 0.6)):
                k = int(np.clip(np.rint(rng.lognormal(math.log(median), sigma)), 4, 400))
                words = rng.choice(len(_SYN_WORDS), size=k)
                text = " ".join(_SYN_WORDS[w] for w in words)
                turns.append({"from": role, "value": text[0].upper() + text[1:] + "."})
        out.append({"id": f"syn-{i}", "conversations": turns})
    return out


def synthetic_trace(n_requests: int = 24, seed: int = 0, rate_per_s: float = 2.0) -> list[dict]:
    """A trace of ``n_requests`` rows ``{arrival_s, prompt_tokens, output_tokens}``, the same for the same
    arguments: Poisson arrivals at ``rate_per_s`` (exponential gaps, rounded to ms) from 0; prompt lengths
    log-normal (median 48, sigma 0.6, clipped to [8, 256]); output lengths uniform on [8, 48]."""
    rng = np.random.default_rng(seed)
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate_per_s, size=n_requests - 1))])
    p = np.clip(np.rint(rng.lognormal(math.log(48), 0.6, size=n_requests)), 8, 256)
    o = rng.integers(8, 48, size=n_requests, endpoint=True)
    return [{"arrival_s": round(float(a), 3), "prompt_tokens": int(b), "output_tokens": int(c)} for a, b, c in zip(t, p, o)]


def write_demo_files(directory: str | os.PathLike) -> list[Path]:
    """Write the shipped demo files into ``directory``: ``sharegpt_synthetic.json`` (:func:`synthetic_sharegpt`,
    64 conversations, seed 0, one JSON record per few lines) and ``trace_demo.csv`` (:func:`synthetic_trace`,
    24 rows, seed 0). Byte-identical on every run (the tests check the shipped files against it).

    Returns:
        The paths written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    sg = d / "sharegpt_synthetic.json"
    sg.write_text(json.dumps(synthetic_sharegpt(64, 0), indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    tr = d / "trace_demo.csv"
    rows = synthetic_trace(24, 0)
    tr.write_text("arrival_s,prompt_tokens,output_tokens\n"
                  + "".join(f"{r['arrival_s']},{r['prompt_tokens']},{r['output_tokens']}\n" for r in rows), encoding="utf-8")
    return [sg, tr]


if __name__ == "__main__":  # python -m tunelab.core.workloads DIR: regenerate the shipped demo files
    import sys

    for written in write_demo_files(sys.argv[1] if len(sys.argv) > 1 else "experiments/data"):
        print(written, file_sha256(written))
