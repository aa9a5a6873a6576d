"""Client-side latency/throughput math: raw streamed-request records -> warehouse rows.

The load generator records, per request, *when* things happened (send, every
content chunk, last byte) and what the server said (``usage``, ``finish_reason``).
This module turns those facts into the field's metrics, in one place:

* :func:`derive_request` -> one row of the ``requests`` table (TTFT, TPOT, E2EL,
  mean ITL, ok/error) per request;
* :func:`itl_values` -> every inter-token gap of the ok requests, pooled;
* :func:`aggregate` -> one row of the ``measurements`` table (throughputs, goodput,
  achieved concurrency, mean/p50/p90/p95/p99 of each latency) per
  (workload, load level, repeat);
* :func:`summarize_repeats` -> repeat-to-repeat spread (mean, std, CV) per load level.

Definitions follow ``vllm bench serve`` (vllm/benchmarks/serve.py ``calculate_metrics``
and vllm/benchmarks/lib/endpoint_request_func.py), with these deliberate differences,
each chosen so that a number means the same thing for every config and version:

* TTFT is measured to the first chunk that carries generated tokens: text, chat
  ``content``, ``reasoning``/``reasoning_content`` (a server with a reasoning parser)
  or ``tool_calls``. vLLM's chat client stamps the first chunk that has ``choices``,
  which is the role-only chunk (``delta = {"role": "assistant"}``) the server sends
  before any token. The time to the first *visible* content (after the thinking) is
  ``ttfc_s``, its own column.
* ITL gaps are between successive token chunks, reasoning included (vLLM: between
  any chunks with ``choices``, empty ones included).
* E2EL and TPOT end at the last chunk that carried generated text, as vLLM's do.
  (Before 2026-12 they ended at the stream's last byte, so a usage-only chunk sent
  late, then ``[DONE]``, made them longer; the stream's end is still stored as
  ``end_ts``.)
* A request without ``usage`` fails (vLLM falls back to re-tokenizing the text);
  a request that stopped early although ``ignore_eos`` was set fails (vLLM counts
  it as a success with fewer tokens), so throughput compares like with like.
* The measurement window is first send -> last end of the measured requests
  (vLLM: wall time of the whole benchmark call, including client start-up), but
  throughputs and latency percentiles count only its *steady part*
  (:func:`steady_interval`): from the moment the target load first held to the
  moment it stopped holding after the last send. The ramp-up before and the drain
  after are recorded (``ramp_*``, ``drain_*`` columns) and excluded; vLLM counts
  the whole run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tunelab.core import records as R

from tunelab.core.load_profiles import LOAD_KINDS, concurrency_target_kinds

__all__ = [
    "PERCENTILES",
    "REQUEST_COLUMNS",
    "MEASUREMENT_COLUMNS",
    "SLO_KEYS",
    "CLIENT_BOUND_CPU_FRAC",
    "CLIENT_BOUND_CONCURRENCY_FRAC",
    "derive_request",
    "itl_values",
    "in_flight",
    "steady_interval",
    "SteadyInterval",
    "aggregate",
    "summarize_repeats",
    "overload",
    "Overload",
    "OVERLOAD_MIN_REQUESTS",
    "OVERLOAD_GROWTH",
    "OVERLOAD_BEHIND_FRAC",
]

#: Percentiles reported for every latency (``*_p50_s`` ... ``*_p99_s``): ``records.PERCENTILES``.
PERCENTILES: tuple[int, ...] = R.PERCENTILES

_IDENT = tuple(c for c in R.columns(R.MeasurementKey) if c != "trial_id")
_LOAD_KINDS = LOAD_KINDS  # one per load profile (tunelab.core.load_profiles)

#: Columns of :func:`derive_request`'s result: the ``requests`` record (``records.Request``) without
#: ``trial_id`` (added by the caller, or passed through when the raw record has it).
REQUEST_COLUMNS: tuple[str, ...] = tuple(c for c in R.columns(R.Request) if c != "trial_id")

_LATENCIES = R.LATENCIES

#: Columns of :func:`aggregate`'s result: ``records.WindowAggregate`` without ``trial_id``; the rest of the
#: ``measurements`` columns (``records.Measurement``) come from the load generator and ``tasks.measure``.
MEASUREMENT_COLUMNS: tuple[str, ...] = tuple(c for c in R.columns(R.WindowAggregate) if c != "trial_id")

#: SLO keys :func:`aggregate` accepts (seconds), as ``vllm bench serve --goodput ttft: tpot: e2el:``.
SLO_KEYS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2el_s")

#: Load-generator CPU time / wall time at or above which a measurement is client-bound.
CLIENT_BOUND_CPU_FRAC = 0.9
#: In flight while sending / target concurrency below which a concurrency measurement is client-bound.
CLIENT_BOUND_CONCURRENCY_FRAC = 0.9

_RAW_FIELDS = (
    "workload",
    "load_kind",
    "load_value",
    "repeat",
    "request_index",
    "send_ts",
    "chunk_ts",
    "end_ts",
    "prompt_tokens",
    "output_tokens",
    "requested_output_tokens",
    "ignore_eos",
    "finish_reason",
    "transport_error",
)

# Finish reasons that mean the server gave up on the request (vLLM FinishReason ABORT/ERROR).
_FAILED_FINISH_REASONS = ("abort", "error")


# --------------------------------------------------------------------------- helpers


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _finite(x: Any, field: str) -> float:
    if not _is_number(x) or not math.isfinite(float(x)):
        raise ValueError(f"raw request record: field {field!r} must be a finite number (epoch seconds), got {x!r}")
    return float(x)


def _opt_count(x: Any, field: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0:
        raise ValueError(f"raw request record: field {field!r} must be a non-negative integer or None, got {x!r}")
    return int(x)


def _timing_problem(send: float, chunks: list[float], end: float | None) -> str | None:
    if chunks and chunks[0] < send:
        return f"bad_timing: first chunk {send - chunks[0]:.6f}s before send"
    for i in range(1, len(chunks)):
        if chunks[i] < chunks[i - 1]:
            return f"bad_timing: chunk {i} earlier than chunk {i - 1}"
    if end is not None:
        if end < send:
            return "bad_timing: end before send"
        if chunks and end < chunks[-1]:
            return "bad_timing: end before last chunk"
    return None


# --------------------------------------------------------------------------- per request


def derive_request(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Turn one raw streamed-request record into a row of the ``requests`` table.

    Args:
        raw: the load generator's record (keys: workload, load_kind, load_value, repeat,
            request_index, send_ts, chunk_ts, end_ts, prompt_tokens, output_tokens,
            requested_output_tokens, ignore_eos, finish_reason, transport_error; optional:
            ``first_content_ts`` (first visible content; absent: every chunk was content, so
            the first chunk), ``reasoning_chunks`` (default 0), ``first_chunk_tokens`` (tokens
            in the first token chunk, None when the server did not say), ``session_index`` and ``turn``
            (multi-turn sessions) and ``cached_prompt_tokens`` (the server's
            ``prompt_tokens_details.cached_tokens``), None when absent; an optional trial_id is
            passed through). Times are epoch seconds; ``chunk_ts`` lists the chunks that
            carried generated tokens of any kind: text, chat ``content``, ``reasoning`` /
            ``reasoning_content`` or ``tool_calls`` deltas.

    Returns:
        dict with the keys of :data:`REQUEST_COLUMNS` (plus ``trial_id`` if given):

        * ``ttft_s`` = first token chunk of any kind (content, reasoning, tool call) -
          send (``vllm bench serve`` stamps the first chunk with ``choices`` instead,
          which can be a role-only chunk; its reasoning streams count reasoning too);
        * ``ttfc_s`` = first visible content chunk - send (time to first content: the
          answer after the thinking; equals ``ttft_s`` without a reasoning parser; None
          when the whole budget went to reasoning, which is still a success);
        * ``last_token_ts`` = the last content chunk (epoch s): the request's end;
        * ``e2el_s`` = last content chunk - send, as ``vllm bench serve`` (its
          ``latency`` ends at the last chunk with text); not the stream's end
          ``end_ts`` (last byte, after the usage chunk and ``[DONE]``), which is kept
          for the window's duration and the time the request held its slot;
        * ``itl_mean_s`` = mean gap between successive content chunks (None with
          fewer than two chunks);
        * ``first_chunk_tokens`` = k1, the tokens the first token chunk carried (the
          raw record's ``first_chunk_tokens``: the server's cumulative usage on that
          chunk, ``stream_options.continuous_usage_stats``), None when the server did
          not say;
        * ``tpot_s`` = (E2EL - TTFT) / (output_tokens - k1): the time after the first
          chunk over the tokens that came after it (k1 = 1 when unknown, vLLM's
          ``output_tokens - 1``); output_tokens from the server's ``usage``. None when
          no token came after the first chunk (as vLLM, which leaves requests of one
          token out of TPOT). A first chunk of several tokens (speculative decoding,
          ``--stream-interval``, a detokenizer holding text back) would otherwise
          spread the later tokens' time over too many tokens (aiperf PR 1279);
        * ``chunk_offsets_s`` = every content chunk's time after send.

        A request is failed (``ok`` False, ``error`` set, every latency None, never a
        TTFT of 0) on the first of: ``transport_error: <text>``;
        ``cut_off: ...`` (no end of stream, or no finish_reason);
        ``server_abort: finish_reason=<abort|error>``; ``no_text`` (no token chunk of any kind);
        ``no_usage`` (no ``usage`` with completion tokens); ``early_stop: k/n tokens``
        (``ignore_eos`` set but fewer tokens than requested); ``bad_timing: ...``
        (timestamps out of order, e.g. a clock step). Timing facts (send, first
        chunk, end, chunk offsets) and token counts are kept on failed rows;
        ``send_ts`` may be None only together with a transport error (never sent).

    Raises:
        ValueError: a field is missing or has the wrong type (the message names it).
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"derive_request: expected a dict (raw request record), got {type(raw).__name__}")
    missing = [f for f in _RAW_FIELDS if f not in raw]
    if missing:
        raise ValueError(
            f"raw request record is missing field(s) {missing}; the load generator must record all of {list(_RAW_FIELDS)}"
        )
    if raw["load_kind"] not in _LOAD_KINDS:
        raise ValueError(f"raw request record: field 'load_kind' must be one of {_LOAD_KINDS}, got {raw['load_kind']!r}")
    transport_error = raw["transport_error"]
    if raw["send_ts"] is None and transport_error:
        send = None  # never sent: failed below with the transport error, no timing
    else:
        send = _finite(raw["send_ts"], "send_ts")
    end = None if raw["end_ts"] is None else _finite(raw["end_ts"], "end_ts")
    chunk_ts = raw["chunk_ts"]
    if chunk_ts is None or isinstance(chunk_ts, (str, bytes)) or not isinstance(chunk_ts, Iterable):
        raise ValueError(f"raw request record: field 'chunk_ts' must be a list of epoch seconds, got {chunk_ts!r}")
    chunks = [_finite(c, "chunk_ts") for c in chunk_ts]
    prompt_tokens = _opt_count(raw["prompt_tokens"], "prompt_tokens")
    output_tokens = _opt_count(raw["output_tokens"], "output_tokens")
    requested = _opt_count(raw["requested_output_tokens"], "requested_output_tokens")
    if requested is None:
        raise ValueError("raw request record: field 'requested_output_tokens' must be an integer (max_tokens sent)")
    ignore_eos = raw["ignore_eos"]
    if not isinstance(ignore_eos, (bool, np.bool_)):
        raise ValueError(f"raw request record: field 'ignore_eos' must be a bool, got {ignore_eos!r}")
    finish_reason = raw["finish_reason"]
    if "first_content_ts" in raw:
        fc = raw["first_content_ts"]
        first_content = None if fc is None else _finite(fc, "first_content_ts")
    else:  # a record from before reasoning streams: every chunk was content
        first_content = chunks[0] if chunks else None
    reasoning_chunks = _opt_count(raw.get("reasoning_chunks", 0), "reasoning_chunks") or 0
    first_chunk_tokens = _opt_count(raw.get("first_chunk_tokens"), "first_chunk_tokens")

    error: str | None = None
    if transport_error:
        error = f"transport_error: {transport_error}"
    elif end is None:
        error = "cut_off: stream did not finish (no end of stream)"
    elif not finish_reason:
        error = "cut_off: stream ended without a finish_reason"
    elif finish_reason in _FAILED_FINISH_REASONS:
        error = f"server_abort: finish_reason={finish_reason}"
    elif not chunks:
        error = "no_text"
    elif output_tokens is None:
        error = "no_usage"
    elif ignore_eos and output_tokens < requested:
        error = f"early_stop: {output_tokens}/{requested} tokens"
    else:
        error = _timing_problem(send, chunks, end)

    row: dict[str, Any] = {}
    if "trial_id" in raw:
        row["trial_id"] = raw["trial_id"]
    row.update(
        workload=raw["workload"],
        load_kind=raw["load_kind"],
        load_value=float(raw["load_value"]),
        repeat=int(raw["repeat"]),
        request_index=int(raw["request_index"]),
        ok=error is None,
        error=error,
        send_ts=send,
        first_token_ts=chunks[0] if chunks else None,
        first_content_ts=first_content,
        reasoning_chunks=reasoning_chunks,
        session_index=raw.get("session_index"),
        turn=raw.get("turn"),
        cached_prompt_tokens=_opt_count(raw.get("cached_prompt_tokens"), "cached_prompt_tokens"),
        first_chunk_tokens=first_chunk_tokens,
        end_ts=end,
        last_token_ts=chunks[-1] if chunks else None,
        chunk_offsets_s=[] if send is None else [c - send for c in chunks],
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        requested_output_tokens=requested,
        finish_reason=finish_reason,
        ttft_s=None,
        ttfc_s=None,
        tpot_s=None,
        e2el_s=None,
        itl_mean_s=None,
    )
    if error is not None:
        return row

    assert send is not None and end is not None and output_tokens is not None  # guarded above
    ttft = chunks[0] - send
    # The request's end is its last token: a usage-only chunk (stream_options.include_usage) and [DONE] may
    # come later and are not generation.
    e2el = chunks[-1] - send
    row["ttft_s"] = ttft
    if first_content is not None:
        row["ttfc_s"] = first_content - send
    row["e2el_s"] = e2el
    if len(chunks) >= 2:
        row["itl_mean_s"] = (chunks[-1] - chunks[0]) / (len(chunks) - 1)
    # Tokens after the first chunk; a server's k1 of 0 (a usage counted before its tokens) or above the total
    # (impossible) is not trusted: vLLM's 1.
    k1 = first_chunk_tokens if first_chunk_tokens and first_chunk_tokens <= output_tokens else 1
    if output_tokens - k1 >= 1:
        row["tpot_s"] = (e2el - ttft) / (output_tokens - k1)
    return row


def _rows(derived_rows: pd.DataFrame | Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(derived_rows, pd.DataFrame):
        return derived_rows.to_dict("records")
    return list(derived_rows)


def itl_values(derived_rows: pd.DataFrame | Iterable[Mapping[str, Any]]) -> np.ndarray:
    """All inter-token-latency gaps (seconds) of the ok requests, pooled.

    Args:
        derived_rows: rows of :func:`derive_request` (a DataFrame or an iterable of dicts);
            needs columns ``ok`` and ``chunk_offsets_s``.

    Returns:
        1-D float64 array of the gaps between successive content chunks of every ok
        request, request by request (empty when there are none). This is the list
        ``vllm bench serve`` pools for its ITL mean and percentiles.
    """
    gaps: list[np.ndarray] = []
    for r in _rows(derived_rows):
        if not bool(r["ok"]):
            continue
        offs = r["chunk_offsets_s"]
        if offs is None:
            continue
        arr = np.asarray(list(offs), dtype=np.float64)
        if arr.size >= 2:
            gaps.append(np.diff(arr))
    if not gaps:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(gaps)


# --------------------------------------------------------------------------- per measurement


def in_flight(send_ts: Any, end_ts: Any, from_ts: float | None = None) -> tuple[int | None, float | None]:
    """How many requests were in flight, from their send and end stamps (the client's own record).

    Args:
        send_ts: epoch seconds per request (array-like; NaN/None = never sent, left out).
        end_ts: the stream's end per request (same length; NaN/None = no end recorded: counted as still in
            flight, so an unknown end never lowers the numbers below).

    Returns:
        ``(peak, while_sending)``:

        * ``peak``: the most requests in flight at once (an end and a send at the same instant are a slot
          handed on, not two in flight);
        * ``while_sending``: the time-average number in flight from the first send to the last send, i.e.
          while the client still had requests to send (seconds in flight / seconds). In a concurrency window
          the client keeps every slot busy then, so anything below the target is time the client itself
          took between one request's end and the next send; the drain after the last send (the last
          requests finishing with fewer in flight) is left out, because no client could fill it. When all
          requests were sent at the same instant: the number in flight right after that instant.

        ``(None, None)`` when no request was sent.

        ``from_ts`` (epoch seconds): ``while_sending`` averages from ``max(first send, from_ts)`` instead; a closed
        loop with staggered starts (``Schedule.stagger_s``) passes its steady part's start, so the slots joining
        one by one on purpose are not read as a client that could not keep them busy.
    """
    s = pd.to_numeric(pd.Series(send_ts, dtype="object"), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    e = pd.to_numeric(pd.Series(end_ts, dtype="object"), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if s.shape != e.shape:
        raise ValueError(f"in_flight: send_ts and end_ts must have the same length, got {s.size} and {e.size}")
    sent = ~np.isnan(s)
    s, e = s[sent], e[sent]
    if s.size == 0:
        return None, None
    e = np.where(np.isnan(e), np.inf, np.maximum(e, s))
    times = np.concatenate([s, e])
    steps = np.concatenate([np.ones(s.size), -np.ones(e.size)])
    order = np.lexsort((steps, times))  # at equal times ends (-1) before sends (+1)
    peak = int(np.max(np.cumsum(steps[order])))
    t0, t1 = float(s.min()), float(s.max())
    if from_ts is not None and math.isfinite(from_ts) and t0 < from_ts < t1:
        t0 = float(from_ts)
    if t1 <= t0:
        return peak, float(np.sum(e > t1))
    busy = np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0.0, None)
    return peak, float(busy.sum() / (t1 - t0))


@dataclass(frozen=True)
class SteadyInterval:
    """The steady part of a window, epoch seconds ``[start_ts, end_ts]`` (see :func:`steady_interval`)."""

    start_ts: float
    end_ts: float

    @property
    def seconds(self) -> float:
        """Its length, seconds."""
        return self.end_ts - self.start_ts


def steady_interval(send_ts: Any, end_ts: Any, target: float | None) -> SteadyInterval | None:
    """The part of a window in which the target load held (epoch seconds), from the client's own stamps.

    Closed loop (``target`` = the concurrency c): the steady part starts when the number in flight first
    reaches c (the ramp-up before it is the first wave being sent) and ends at the first moment after the last
    send at which fewer than c are in flight (the drain after it is the last requests finishing with nobody to
    replace them). Open loop (``target`` None: a request rate, where the offered load is the arrivals): from the
    first end to the last send. With arrivals at rate r and requests of latency S, the number in flight rises as
    r x min(t, S) for the first S seconds (Little's law; M/G/infinity), so the first end marks the ramp's end;
    after the last arrival the load is no longer offered.

    Why: a window of 64 requests at c=32 sends 32 at once (a burst no steady server sees), then runs at 32 in
    flight, then drains from 32 to 0 after its last send; the ramp and the drain are a large share of a short
    window and belong to no load level. Long benchmarks (MLPerf Inference's server scenario, 600 s minimum)
    make them negligible instead; tunelab excludes them so that short and long windows measure the same thing.

    Args:
        send_ts: epoch seconds per request (NaN/None = never sent, left out).
        end_ts: the stream's end per request (``end_ts``, when the request frees its slot; NaN/None = never
            ended, counted as in flight to the end).
        target: the concurrency target, or None for an open-loop window.

    Returns:
        The interval, or None when the window has none of positive length (e.g. no more requests than slots:
        one wave that never ran at the target while requests remained; or a single send).

    Raises:
        ValueError: ``send_ts`` and ``end_ts`` of different lengths.
    """
    s = pd.to_numeric(pd.Series(send_ts, dtype="object"), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    e = pd.to_numeric(pd.Series(end_ts, dtype="object"), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if s.shape != e.shape:
        raise ValueError(f"steady_interval: send_ts and end_ts must have the same length, got {s.size} and {e.size}")
    sent = ~np.isnan(s)
    s, e = s[sent], e[sent]
    if s.size < 2:
        return None
    last_send = float(s.max())
    if target is None:
        ended = e[~np.isnan(e)]
        if ended.size == 0:
            return None
        start, end = float(ended.min()), last_send
        return SteadyInterval(start, end) if end > start else None
    k = int(math.ceil(float(target)))
    e = np.where(np.isnan(e), np.inf, np.maximum(e, s))
    times = np.concatenate([s, e])
    steps = np.concatenate([np.ones(s.size), -np.ones(e.size)])
    order = np.lexsort((steps, times))  # at equal times ends (-1) before sends (+1): a slot handed on
    times, kinds = times[order], steps[order]
    level = np.cumsum(kinds)
    reached = np.flatnonzero(level >= k)
    if reached.size == 0:
        return None
    start = float(times[reached[0]])
    # The first event after the last send that leaves fewer than k in flight (an end stamped at the same
    # instant as the last send handed its slot to that send: it sorts before it and is not the drain).
    last_send_pos = int(np.flatnonzero(kinds > 0)[-1])
    after = np.flatnonzero((np.arange(times.size) > last_send_pos) & (level < k))
    end = float(times[after[0]]) if after.size else last_send
    if level[last_send_pos] < k:  # fewer than k in flight already when the last request went out
        end = last_send
    if not math.isfinite(end) or end <= start:
        return None
    return SteadyInterval(start, end)


def _check_slo(slo: Mapping[str, Any] | None) -> dict[str, float]:
    if not slo:
        return {}
    if not isinstance(slo, Mapping):
        raise ValueError(f"slo must be a dict like {{'ttft_s': 0.5, 'tpot_s': 0.05}}, got {slo!r}")
    unknown = [k for k in slo if k not in SLO_KEYS]
    if unknown:
        hint = ""
        if "itl_s" in unknown:
            hint = (
                " (an ITL SLO is not supported: vllm bench serve --goodput accepts only ttft, tpot and e2el,"
                " and a per-request ITL has no single value; use tpot_s)"
            )
        raise ValueError(f"slo has unknown key(s) {unknown}; allowed keys are {list(SLO_KEYS)} in seconds{hint}")
    out = {}
    for k, v in slo.items():
        if not _is_number(v) or not math.isfinite(float(v)) or float(v) <= 0:
            raise ValueError(f"slo[{k!r}] must be a positive number of seconds, got {v!r}")
        out[k] = float(v)
    return out


def _single(df: pd.DataFrame, col: str) -> Any:
    vals = df[col].unique()
    if len(vals) != 1:
        raise ValueError(
            f"aggregate: column {col!r} has {len(vals)} values {list(vals)[:5]}; aggregate one "
            f"(trial_id, workload, load_kind, load_value, repeat) group at a time (use DataFrame.groupby)"
        )
    v = vals[0]
    return v.item() if isinstance(v, np.generic) else v


def _num(series: pd.Series) -> np.ndarray:
    arr = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return arr[~np.isnan(arr)]


def _stats(values: np.ndarray, prefix: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    if values.size == 0:
        out[f"{prefix}_mean_s"] = None
        for p in PERCENTILES:
            out[f"{prefix}_p{p}_s"] = None
        return out
    out[f"{prefix}_mean_s"] = float(np.mean(values))
    qs = np.percentile(values, PERCENTILES, method="linear")
    for p, q in zip(PERCENTILES, qs):
        out[f"{prefix}_p{p}_s"] = float(q)
    return out


#: The steady-part columns :func:`aggregate` adds (``records.WindowAggregate``).
_STEADY_COLUMNS: tuple[str, ...] = R.pick(R.WindowAggregate, "steady_state", "steady_s", "ramp_s", "drain_s",
                                          "steady_requests", "ramp_requests", "drain_requests")


def _steady_part(derived: pd.DataFrame, ok_mask: np.ndarray, good_mask: np.ndarray | None, send: np.ndarray,
                 end: np.ndarray, target: float | None) -> dict[str, Any]:
    """What happened in the window's steady part (:func:`steady_interval`): its columns, its length, the rows
    whose latencies count, and the counts its rates are made of. ``columns['steady_state']`` False (and
    nothing else) when there is none or no ok request was sent in it."""
    iv = steady_interval(send, end, target)
    sent = ~np.isnan(send)
    lat_rows = sent & (send >= (iv.start_ts if iv else 0)) & (send <= (iv.end_ts if iv else -1))
    if iv is None or not np.any(lat_rows & ok_mask):
        return {"columns": {**{k: None for k in _STEADY_COLUMNS}, "steady_state": False, "ramp_s": 0.0,
                            "drain_s": 0.0, "ramp_requests": 0, "drain_requests": 0,
                            "steady_requests": int(sent.sum())}}
    t0, t1 = iv.start_ts, iv.end_ts
    ok = derived[ok_mask]
    n_out = 0.0
    n_done = n_good = n_in = 0
    goods = good_mask if good_mask is not None else np.zeros(len(ok), dtype=bool)
    for r, good in zip(ok.itertuples(index=False), goods):
        offs = np.asarray(list(r.chunk_offsets_s or []), dtype=np.float64)
        if offs.size and r.output_tokens:
            ts = float(r.send_ts) + offs
            # Tokens per content chunk: the server's count spread over its chunks (1 each on vLLM's default
            # stream; several when it batches them).
            n_out += float(r.output_tokens) * float(np.sum((ts >= t0) & (ts <= t1))) / offs.size
        if r.last_token_ts is not None and t0 <= float(r.last_token_ts) <= t1:
            n_done += 1
            n_good += int(bool(good))
        if r.first_token_ts is not None and t0 <= float(r.first_token_ts) <= t1 and r.prompt_tokens is not None:
            n_in += int(r.prompt_tokens)
    first_send = float(np.nanmin(send))
    window_end = float(np.nanmax(end)) if np.any(~np.isnan(end)) else t1
    return {
        "columns": {"steady_state": True, "steady_s": t1 - t0, "ramp_s": t0 - first_send,
                    "drain_s": max(0.0, window_end - t1), "steady_requests": int(lat_rows.sum()),
                    "ramp_requests": int(np.sum(sent & (send < t0))), "drain_requests": int(np.sum(sent & (send > t1)))},
        "seconds": t1 - t0, "start_ts": t0, "latency_rows": lat_rows, "completed": n_done, "output_tokens": n_out,
        "input_tokens": n_in, "good": None if good_mask is None else n_good,
    }


def aggregate(
    derived: pd.DataFrame,
    slo: Mapping[str, float] | None,
    client_cpu_frac: float | None = None,
    target: float | None = None,
    steady_state: bool = True,
    staggered: bool = False,
) -> dict[str, Any]:
    """Aggregate one (workload, load level, repeat) group of requests into a ``measurements`` row.

    Args:
        derived: DataFrame of :func:`derive_request` rows, all of one workload, load_kind,
            load_value and repeat (and trial_id, if that column is present).
        slo: per-request SLOs in seconds for goodput, keys among :data:`SLO_KEYS`
            (``ttft_s``, ``tpot_s``, ``e2el_s``); None or {} -> ``goodput_per_s`` None.
        client_cpu_frac: load-generator CPU time / wall time during the measurement.
        target: the target concurrency (``LoadProfile.target_concurrency``; used only for load kinds that have
            one, ``load_profiles.concurrency_target_kinds()``).
        staggered: the window's closed-loop slots started staggered (``Schedule.stagger_s`` > 0):
            ``in_flight_while_sending`` (and so ``client_bound``) is then taken from the steady part's start, when
            every slot had joined (:func:`in_flight`'s ``from_ts``).
        steady_state: count throughputs and latencies over the window's steady part only
            (:func:`steady_interval`); needs ``target`` for a load kind with a concurrency target (without it
            the whole window counts and ``steady_state`` is None). False: the whole window, as before 2026-12
            and as ``vllm bench serve`` (the cross-check against it uses that).

    Returns:
        dict with the keys of :data:`MEASUREMENT_COLUMNS` (plus ``trial_id`` if present):

        * ``duration_s``: first send -> last end over *all* measured requests (failed
          ones too); vLLM uses the benchmark call's wall time instead.
        * The steady part (``steady_state`` True): ``steady_s`` seconds from ``ramp_s``
          after the first send to ``drain_s`` before the window's end; ``ramp_requests``
          requests were sent before it and ``drain_requests`` after it (left out of the
          latencies), ``steady_requests`` in it (their latencies count, also when they
          finish in the drain: the load they met when they arrived is the target's).
          Rates below are then over ``steady_s`` and count what happened in it: output
          tokens of ok requests streamed in it (a chunk of k tokens counts k; a request's
          tokens are spread evenly over its content chunks), requests whose last token
          came in it, prompt tokens of requests whose first token came in it.
          ``steady_state`` False: the window had no steady part (no more requests than
          slots, or a single request): everything counts over ``duration_s`` as before,
          excluded counts 0. None: not asked for, or no target given for a concurrency
          window.
        * ``request_throughput_per_s`` = completed / duration; ``output_tokens_per_s`` =
          output tokens of ok requests / duration; ``total_tokens_per_s`` = (prompt +
          output tokens of ok requests) / duration — as ``vllm bench serve`` (over the
          steady part, see above).
        * ``goodput_per_s``: ok requests meeting every SLO given / duration, with vLLM's
          ``--goodput`` rule: a request is good when ``metric <= slo`` for each SLO; a
          request with no TPOT (output_tokens <= 1) counts as TPOT 0, i.e. meets it.
        * ``achieved_concurrency``: Little's law, L = sum over requests of their time
          in flight (end - send, failed requests with an end included) / duration, over
          the whole window (ramp and drain included: it says how much of the window
          ran below the target).
          ``end`` is the stream's end (``end_ts``): the request holds its slot until then.
        * ``peak_in_flight``, ``in_flight_while_sending``: see :func:`in_flight`.
        * ``*_mean_s``/``*_p50_s``..``*_p99_s`` of TTFT, TPOT, E2EL over ok requests
          (TPOT over those with output_tokens > 1) and of ITL over all gaps of ok
          requests pooled, percentiles by ``numpy.percentile(method='linear')`` as
          vLLM. None where there is no value (e.g. no ok request).
        * ``client_bound``: the client's own evidence only. True when
          ``client_cpu_frac >= 0.9`` (its loop was saturated), or for a concurrency
          target when ``in_flight_while_sending`` < 0.9 * min(target, num_requests)
          (while it still had requests to send, the client did not keep the slots
          busy). A window whose achieved concurrency is low only because slow requests
          (e.g. a server compiling a new batch shape) drained after the last send is
          not client-bound: ``achieved_concurrency`` shows that. False when a check was
          possible and neither holds; None when neither input was given.

    Raises:
        ValueError: empty frame, missing columns, mixed groups, or a bad SLO / argument.
    """
    slo_s = _check_aggregate_inputs(derived, slo, client_cpu_frac, target)
    out = _group_identity(derived)
    ok_mask = derived["ok"].astype(bool).to_numpy()
    ok = derived[ok_mask]
    n = int(len(derived))
    completed = int(ok_mask.sum())
    out.update(num_requests=n, completed=completed, failed=n - completed)

    send = pd.to_numeric(derived["send_ts"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    end = pd.to_numeric(derived["end_ts"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    duration = _window_seconds(send, end)
    out["duration_s"] = duration
    in_tokens = int(_num(ok["prompt_tokens"]).sum())
    out_tokens = int(_num(ok["output_tokens"]).sum())
    good_mask = _good_mask(ok, slo_s)

    closed = out["load_kind"] in concurrency_target_kinds()
    steady = _steady_part(derived, ok_mask, good_mask, send, end, target if closed else None) \
        if steady_state and (target is not None or not closed) else None
    out.update(steady["columns"] if steady else {k: None for k in _STEADY_COLUMNS})
    if steady is not None and steady["columns"]["steady_state"]:
        span: float | None = steady["seconds"]
        n_done, n_out, n_in, n_good = steady["completed"], steady["output_tokens"], steady["input_tokens"], steady["good"]
        scope = derived[steady["latency_rows"]]
    else:  # the whole window, as before steady parts
        span, n_done, n_out, n_in = duration, completed, out_tokens, in_tokens
        n_good = None if good_mask is None else int(good_mask.sum())
        scope = derived

    # A closed loop's slots may join one by one on purpose (staggered starts): the client is judged from the
    # moment all of them were busy (the steady part's start), not over the stagger.
    staggered_from = steady.get("start_ts") if closed and steady is not None and staggered else None
    peak, while_sending = in_flight(send, end, from_ts=staggered_from)
    out.update(_throughputs(span, n_done=n_done, n_out=n_out, n_in=n_in, n_good=n_good))
    out.update(achieved_concurrency=_achieved_concurrency(send, end, duration), peak_in_flight=peak,
               in_flight_while_sending=while_sending, total_input_tokens=in_tokens, total_output_tokens=out_tokens)
    out.update(_latency_stats(scope))
    out["client_cpu_frac"] = None if client_cpu_frac is None else float(client_cpu_frac)
    out["client_bound"] = _client_bound(client_cpu_frac, target, out["load_kind"], while_sending, n)
    return out


def _check_aggregate_inputs(derived: pd.DataFrame, slo: Mapping[str, float] | None, client_cpu_frac: float | None,
                            target: float | None) -> dict[str, float]:
    """Check :func:`aggregate`'s arguments and return its SLOs in seconds; ValueError naming the bad one."""
    if not isinstance(derived, pd.DataFrame):
        raise ValueError(f"aggregate: derived must be a pandas DataFrame of derive_request rows, got {type(derived).__name__}")
    if len(derived) == 0:
        raise ValueError("aggregate: derived has no requests; a measurement needs at least one request")
    needed = [c for c in REQUEST_COLUMNS if c not in derived.columns]
    if needed:
        raise ValueError(f"aggregate: derived lacks column(s) {needed}; build it from derive_request rows")
    slo_s = _check_slo(slo)
    if client_cpu_frac is not None and (not _is_number(client_cpu_frac) or not client_cpu_frac >= 0):
        raise ValueError(f"aggregate: client_cpu_frac must be a number >= 0 (CPU time / wall time), got {client_cpu_frac!r}")
    if target is not None and (not _is_number(target) or not target > 0):
        raise ValueError(f"aggregate: target must be a positive concurrency, got {target!r}")
    return slo_s


def _group_identity(derived: pd.DataFrame) -> dict[str, Any]:
    """The group's key columns (trial_id if present, workload, load_kind, load_value, repeat); ValueError when
    the frame mixes groups."""
    out: dict[str, Any] = {}
    if "trial_id" in derived.columns:
        out["trial_id"] = _single(derived, "trial_id")
    for col in _IDENT:
        out[col] = _single(derived, col)
    out["load_value"] = float(out["load_value"])
    out["repeat"] = int(out["repeat"])
    return out


def _window_seconds(send: np.ndarray, end: np.ndarray) -> float | None:
    """Seconds from the first send to the last end over all requests; None when unknown or not positive."""
    if np.any(~np.isnan(send)) and np.any(~np.isnan(end)):
        d = float(np.nanmax(end) - np.nanmin(send))
        return d if d > 0 else None
    return None


def _good_mask(ok: pd.DataFrame, slo_s: Mapping[str, float]) -> np.ndarray | None:
    """Per ok request, whether it meets every SLO (seconds) by vLLM's ``--goodput`` rule; None without SLOs."""
    if not slo_s:
        return None
    good_mask = np.ones(len(ok), dtype=bool)
    for key, limit in slo_s.items():
        vals = pd.to_numeric(ok[key], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        if key == "tpot_s":
            vals = np.where(np.isnan(vals), 0.0, vals)  # vLLM: no TPOT (<=1 token) counts as 0
        good_mask &= vals <= limit  # NaN compares False -> not good
    return good_mask


def _rate(x: float | None, over: float | None) -> float | None:
    """``x`` per second over ``over`` seconds; None when either is unknown."""
    return None if x is None or over is None else x / over


def _throughputs(span: float | None, *, n_done: int, n_out: float, n_in: int, n_good: int | None) -> dict[str, Any]:
    """Requests/s, output tokens/s, total tokens/s and goodput (good requests/s) over ``span`` seconds."""
    return {"request_throughput_per_s": _rate(n_done, span), "output_tokens_per_s": _rate(n_out, span),
            "total_tokens_per_s": _rate(n_in + n_out, span), "goodput_per_s": _rate(n_good, span)}


def _achieved_concurrency(send: np.ndarray, end: np.ndarray, duration: float | None) -> float | None:
    """Little's law over the whole window: requests' seconds in flight (end - send) / ``duration`` seconds."""
    both = ~np.isnan(send) & ~np.isnan(end)
    return _rate(float(np.sum(end[both] - send[both])), duration)


def _latency_stats(scope: pd.DataFrame) -> dict[str, float | None]:
    """Mean and percentiles (seconds) of TTFT, TPOT and E2EL over the ok requests of ``scope``, and of ITL over
    their gaps pooled."""
    scope_ok = scope[scope["ok"].astype(bool).to_numpy()]
    return {**_stats(_num(scope_ok["ttft_s"]), "ttft"), **_stats(_num(scope_ok["tpot_s"]), "tpot"),
            **_stats(itl_values(scope), "itl"), **_stats(_num(scope_ok["e2el_s"]), "e2el")}


def _client_bound(client_cpu_frac: float | None, target: float | None, load_kind: str,
                  while_sending: float | None, n: int) -> bool | None:
    """Whether the load generator limited the window (its CPU fraction saturated, or it kept fewer than 0.9 x the
    target's slots busy while sending); None when neither input was given."""
    bound: bool | None = None
    if client_cpu_frac is not None:
        bound = float(client_cpu_frac) >= CLIENT_BOUND_CPU_FRAC
    if target is not None and load_kind in concurrency_target_kinds() and while_sending is not None:
        expected = min(float(target), float(n))
        low = while_sending < CLIENT_BOUND_CONCURRENCY_FRAC * expected
        bound = bool(bound) or low
    return bound


_SPREAD_METRICS = ("ttft_p50_s", "tpot_p50_s", "output_tokens_per_s")


def summarize_repeats(measurements: pd.DataFrame) -> pd.DataFrame:
    """Repeat-to-repeat spread of the headline numbers per load level.

    Args:
        measurements: DataFrame of :func:`aggregate` rows; needs workload, load_kind,
            load_value, repeat and the metric columns. Rows are grouped by
            (trial_id,) workload, load_kind, load_value — trial_id only when present,
            so repeats of different trials are never mixed.

    Returns:
        DataFrame, one row per group, columns: the group keys, ``n_repeats``, and for
        each of ``ttft_p50_s``, ``tpot_p50_s``, ``output_tokens_per_s``: ``<m>_mean``,
        ``<m>_std`` (sample standard deviation, ddof=1; NaN with fewer than two
        values) and ``<m>_cv`` (std / mean; NaN when undefined). Missing values
        (e.g. no TPOT) are skipped, not counted as 0.

    Raises:
        ValueError: a required column is missing.
    """
    keys = (["trial_id"] if "trial_id" in measurements.columns else []) + ["workload", "load_kind", "load_value"]
    needed = [c for c in (*keys, "repeat", *_SPREAD_METRICS) if c not in measurements.columns]
    if needed:
        raise ValueError(f"summarize_repeats: measurements lacks column(s) {needed}; pass aggregate() rows")
    df = measurements.copy()
    for m in _SPREAD_METRICS:
        df[m] = pd.to_numeric(df[m], errors="coerce").astype("float64")
    rows = []
    for key, g in df.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(keys, key))
        row["n_repeats"] = int(g["repeat"].nunique())
        for m in _SPREAD_METRICS:
            vals = g[m].dropna().to_numpy(dtype=np.float64)
            mean = float(np.mean(vals)) if vals.size else math.nan
            std = float(np.std(vals, ddof=1)) if vals.size >= 2 else math.nan
            cv = std / mean if (not math.isnan(std) and mean != 0) else math.nan
            row[f"{m}_mean"] = mean
            row[f"{m}_std"] = std
            row[f"{m}_cv"] = cv
        rows.append(row)
    cols = [*keys, "n_repeats", *(f"{m}_{s}" for m in _SPREAD_METRICS for s in ("mean", "std", "cv"))]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- open-loop saturation

#: Fewest sent requests of a window :func:`overload` judges (three thirds of at least 4).
OVERLOAD_MIN_REQUESTS = 12
#: Last third / first third of the window (by send order) above which in-flight and TTFT count as growing.
OVERLOAD_GROWTH = 1.5
#: Completions / arrivals over the second half of the sending span below which completions fall behind.
OVERLOAD_BEHIND_FRAC = 0.9


@dataclass(frozen=True)
class Overload:
    """:func:`overload`'s finding for one open-loop window.

    Attributes:
        overloaded: True when all three hold (completions behind arrivals, in-flight growing, TTFT growing);
            None when the window cannot be judged (fewer than :data:`OVERLOAD_MIN_REQUESTS` sent, or no
            sending span).
        completion_ratio: completions / arrivals in the second half of the sending span.
        in_flight_growth: mean in flight at the sends of the last third / of the first third.
        ttft_growth: median TTFT of the last third's ok requests / of the first third's.
    """

    overloaded: bool | None
    completion_ratio: float | None = None
    in_flight_growth: float | None = None
    ttft_growth: float | None = None

    def describe(self) -> str:
        """One line with the three figures, e.g. ``completions 0.41 x arrivals, in flight x6.2, TTFT x9.8``."""
        f = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        return (f"completions {f(self.completion_ratio)} x arrivals, in flight x{f(self.in_flight_growth)}, "
                f"TTFT x{f(self.ttft_growth)} from the first to the last third")


def overload(derived: pd.DataFrame) -> Overload:
    """Whether an open-loop window (arrivals on a schedule: request rate, trace) outran the server.

    An open-loop client keeps sending whatever the server does; past the server's capacity the queue grows
    without bound and the window's latencies are those of a queue that was still filling, not of the rate asked
    for (guidellm's ``--detect-saturation``, guidellm issues 108, 242). The window is overloaded when all of:

    * completions fall behind arrivals: over the second half of the sending span (first to last send), the
      requests that ended in it / the requests sent in it < :data:`OVERLOAD_BEHIND_FRAC` (a stable server
      finishes as many as arrive, one E2EL later);
    * in flight grows: the mean number in flight at the sends of the last third of the requests (send order) is
      above :data:`OVERLOAD_GROWTH` x that of the first third;
    * TTFT grows: the median TTFT of the last third's ok requests is above :data:`OVERLOAD_GROWTH` x the first
      third's (requests wait longer and longer in the queue).

    A ramp from an empty server alone raises in-flight but neither TTFT nor the completion gap, so it is not
    flagged; all three together are the signature of a queue growing over the window.

    Args:
        derived: one window's :func:`derive_request` rows (``send_ts``, ``end_ts``, ``ok``, ``ttft_s``).

    Returns:
        :class:`Overload`; ``overloaded`` None when the window cannot be judged.
    """
    send = pd.to_numeric(derived["send_ts"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    end = pd.to_numeric(derived["end_ts"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    sent = ~np.isnan(send)
    if int(sent.sum()) < OVERLOAD_MIN_REQUESTS:
        return Overload(None)
    order = np.argsort(np.where(sent, send, np.inf), kind="stable")[: int(sent.sum())]
    s_sorted = send[order]
    s0, s1 = float(s_sorted[0]), float(s_sorted[-1])
    if s1 <= s0:
        return Overload(None)
    mid = (s0 + s1) / 2
    arrived = int(np.sum((send >= mid) & (send <= s1)))
    ended = int(np.sum(~np.isnan(end) & (end >= mid) & (end <= s1)))
    ratio = ended / arrived if arrived else None
    end_or_inf = np.where(np.isnan(end), np.inf, end)
    in_flight_at = np.array([float(np.sum(sent & (send <= t) & (end_or_inf > t))) for t in s_sorted])
    third = len(order) // 3
    first, last = order[:third], order[-third:]
    a, c = float(np.mean(in_flight_at[:third])), float(np.mean(in_flight_at[-third:]))
    growth = c / a if a > 0 else None
    ok = derived["ok"].astype(bool).to_numpy()
    ttft = pd.to_numeric(derived["ttft_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    t_first = ttft[first][ok[first] & ~np.isnan(ttft[first])]
    t_last = ttft[last][ok[last] & ~np.isnan(ttft[last])]
    ttft_growth = (float(np.median(t_last)) / float(np.median(t_first))
                   if t_first.size and t_last.size and float(np.median(t_first)) > 0 else None)
    # A window whose last third never finished (every request cut at the timeout) has no TTFT to compare: the
    # other two signs decide then.
    ttft_grew = ttft_growth is None and t_last.size == 0 or (ttft_growth is not None and ttft_growth > OVERLOAD_GROWTH)
    over = (ratio is not None and ratio < OVERLOAD_BEHIND_FRAC and growth is not None and growth > OVERLOAD_GROWTH
            and ttft_grew)
    return Overload(bool(over), ratio, growth, ttft_growth)
