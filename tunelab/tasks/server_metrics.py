"""Server-side view of a measurement window, from vLLM's Prometheus ``/metrics`` page.

The trial scrapes ``/metrics`` right before and right after each measured load level.
This module parses the two pages (with ``prometheus_client``'s own text parser) and
turns the difference into ``server_metrics`` table rows under tunelab's canonical
names, so releases that renamed a metric still compare in one column:

====================  ==============  ==================================================
canonical metric      kind            vLLM names read (preferred first)
====================  ==============  ==================================================
preemptions           counter_delta   vllm:num_preemptions_total
prompt_tokens         counter_delta   vllm:prompt_tokens_total
generation_tokens     counter_delta   vllm:generation_tokens_total
prefix_cache_queries  counter_delta   vllm:prefix_cache_queries_total (>= 0.9),
                                      vllm:gpu_prefix_cache_queries_total (0.8-0.10, deprecated 0.9)
prefix_cache_hits     counter_delta   vllm:prefix_cache_hits_total, vllm:gpu_prefix_cache_hits_total
spec_decode_drafts,   counter_delta   vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
 _draft_tokens,                       ..._num_accepted_tokens_total: only where the server exposes
 _accepted_tokens                     them (speculative decoding on), else no row
request_success_<r>   counter_delta   vllm:request_success_total{finished_reason="<r>"},
                                      r in stop, length, abort, error
server_ttft           histogram       vllm:time_to_first_token_seconds
server_itl            histogram       vllm:inter_token_latency_seconds (>= 0.11),
                                      vllm:time_per_output_token_seconds (<= 0.12; it
                                      measured the gap between engine outputs, i.e. ITL;
                                      renamed in 0.11, removed 0.13)
server_tpot           histogram       vllm:request_time_per_output_token_seconds (>= 0.11,
                                      per-request decode time / decode tokens)
server_e2el           histogram       vllm:e2e_request_latency_seconds
server_queue_time     histogram       vllm:request_queue_time_seconds
server_prefill_time   histogram       vllm:request_prefill_time_seconds
server_decode_time    histogram       vllm:request_decode_time_seconds
kv_cache_usage        gauge           vllm:kv_cache_usage_perc (>= 0.9),
                                      vllm:gpu_cache_usage_perc (deprecated 0.9)
num_requests_running  gauge           vllm:num_requests_running
num_requests_waiting  gauge           vllm:num_requests_waiting
====================  ==============  ==================================================

Rules: a page that has both an old and a new name is read through the new one only
(never counted twice); counters and histograms are deltas ``after - before``;
histogram ``value`` is the window mean ``Δsum / Δcount``; gauges are the value on
the ``after`` page. Series of several engines (``engine="0"``, ``"1"``: data
parallel) are summed (the KV-cache fraction is averaged); a gauge's series of one engine
written by several API-server processes (``pid`` label, ``--api-server-count`` before vLLM
PR 28792) are one engine's value: the max of them (the live one), never their mean; the ``model_name`` label is
ignored, and a series repeated under several ``model_name`` values is read once. A
metric the page does not have gives ``value`` NULL and a ``null_reason``, never 0.
Sources: vLLM ``vllm/v1/metrics/loggers.py`` (0.9 and current), ``vllm/engine/metrics.py``
(V0), docs/design/metrics.md, PRs #24110 (ITL rename) and #32661 (TPOT name removal).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ABSENT",
    "CANONICAL_METRICS",
    "Snapshot",
    "snapshot",
    "window_rows",
    "spec_decode_acceptance",
    "SPEC_DECODE_METRICS",
    "histogram_quantile",
]

#: null_reason of a canonical metric that the scraped vLLM does not expose.
ABSENT = "absent in this vLLM version"

_LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Spec:
    metric: str
    kind: str  # counter_delta | histogram | gauge
    names: tuple[str, ...]  # counters: sample names (…_total); histograms: family names; gauges: sample names
    match: tuple[tuple[str, str], ...] = ()  # label filter, e.g. (("finished_reason", "stop"),)
    gauge_agg: str = "sum"  # how engines combine: sum | mean


_SPECS: tuple[_Spec, ...] = (
    _Spec("preemptions", "counter_delta", ("vllm:num_preemptions_total",)),
    _Spec("prompt_tokens", "counter_delta", ("vllm:prompt_tokens_total",)),
    _Spec("generation_tokens", "counter_delta", ("vllm:generation_tokens_total",)),
    _Spec(
        "prefix_cache_queries",
        "counter_delta",
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    ),
    _Spec("prefix_cache_hits", "counter_delta", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
    *(
        _Spec(f"request_success_{r}", "counter_delta", ("vllm:request_success_total",), (("finished_reason", r),))
        for r in ("stop", "length", "abort", "error")
    ),
    _Spec("server_ttft", "histogram", ("vllm:time_to_first_token_seconds",)),
    _Spec("server_itl", "histogram", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
    _Spec("server_tpot", "histogram", ("vllm:request_time_per_output_token_seconds",)),
    _Spec("server_e2el", "histogram", ("vllm:e2e_request_latency_seconds",)),
    _Spec("server_queue_time", "histogram", ("vllm:request_queue_time_seconds",)),
    _Spec("server_prefill_time", "histogram", ("vllm:request_prefill_time_seconds",)),
    _Spec("server_decode_time", "histogram", ("vllm:request_decode_time_seconds",)),
    _Spec("kv_cache_usage", "gauge", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), gauge_agg="mean"),
    _Spec("num_requests_running", "gauge", ("vllm:num_requests_running",)),
    _Spec("num_requests_waiting", "gauge", ("vllm:num_requests_waiting",)),
)

#: Counters read only from a server that exposes them, else no row: a server runs speculative decoding only
#: with ``--speculative-config``, and a NULL row for every window of every other config says nothing. Names:
#: vllm/v1/spec_decode/metrics.py ``SpecDecodingProm``; acceptance rate = accepted / draft tokens, mean
#: acceptance length = 1 + accepted tokens / drafts (:func:`spec_decode_acceptance`).
_SPECS_IF_SERVED: tuple[_Spec, ...] = (
    _Spec("spec_decode_drafts", "counter_delta", ("vllm:spec_decode_num_drafts_total",)),
    _Spec("spec_decode_draft_tokens", "counter_delta", ("vllm:spec_decode_num_draft_tokens_total",)),
    _Spec("spec_decode_accepted_tokens", "counter_delta", ("vllm:spec_decode_num_accepted_tokens_total",)),
)

#: Canonical metric names, in the order :func:`window_rows` returns them.
CANONICAL_METRICS: tuple[str, ...] = tuple(s.metric for s in _SPECS)
#: Canonical names of the speculative-decoding counters, rows only where the server exposes them.
SPEC_DECODE_METRICS: tuple[str, ...] = tuple(s.metric for s in _SPECS_IF_SERVED)


@dataclass(frozen=True)
class Snapshot:
    """One parsed ``/metrics`` page.

    Attributes:
        samples: sample name (e.g. ``vllm:num_preemptions_total``,
            ``vllm:time_to_first_token_seconds_bucket``) -> {label key -> value}; the
            label key is the sorted ``(name, value)`` pairs without ``model_name``.
        types: family name as the parser reports it -> Prometheus type.
        model_names: every ``model_name`` label value seen on the page.
    """

    samples: Mapping[str, Mapping[_LabelKey, float]]
    types: Mapping[str, str] = field(default_factory=dict)
    model_names: frozenset[str] = frozenset()

    def has(self, sample_name: str) -> bool:
        """True when the page has at least one sample of that exact name."""
        return bool(self.samples.get(sample_name))


def snapshot(text: str, model_name: str | None = None) -> Snapshot:
    """Parse a Prometheus text page (vLLM's ``/metrics``) into a :class:`Snapshot`.

    Args:
        text: the page body, Prometheus text exposition format 0.0.4.
        model_name: keep only series with this ``model_name`` label (series without
            the label are kept). None keeps all.

    Returns:
        :class:`Snapshot`. A series that appears again with only a different
        ``model_name`` (or as an exact duplicate line) is kept once.

    Raises:
        ValueError: the text is not a Prometheus page, or two series differing only in
            ``model_name`` have different values (several models: pass ``model_name``).
    """
    if not isinstance(text, str):
        raise ValueError(f"snapshot: expected the /metrics page as str, got {type(text).__name__}")
    samples: dict[str, dict[_LabelKey, float]] = {}
    types: dict[str, str] = {}
    models: set[str] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError/IndexError/... on malformed lines
        raise ValueError(f"snapshot: not a Prometheus text page ({type(e).__name__}: {e}); pass the /metrics body") from e
    for fam in families:
        types[fam.name] = fam.type
        for s in fam.samples:
            mn = s.labels.get("model_name")
            if mn is not None:
                models.add(mn)
                if model_name is not None and mn != model_name:
                    continue
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            series = samples.setdefault(s.name, {})
            value = float(s.value)
            if key in series:
                old = series[key]
                if old == value or (math.isnan(old) and math.isnan(value)):
                    continue
                raise ValueError(
                    f"snapshot: {s.name}{dict(key)} appears under several model_name values with different values "
                    f"({old} vs {value}); the page serves several models: pass model_name= one of {sorted(models)}"
                )
            series[key] = value
    return Snapshot(samples=samples, types=types, model_names=frozenset(models))


# --------------------------------------------------------------------------- histogram_quantile


def histogram_quantile(buckets: Mapping[float, float] | Iterable[tuple[float, float]], q: float) -> float | None:
    """Estimate the q-quantile from cumulative histogram buckets, as PromQL ``histogram_quantile``.

    Args:
        buckets: ``{upper_bound: cumulative_count}`` or ``[(upper_bound, cumulative_count), ...]``
            including the ``+Inf`` bucket (e.g. the Δbuckets of a window).
        q: quantile in [0, 1] (0.5 = median, 0.99 = p99).

    Returns:
        The estimate in the buckets' unit (seconds for vLLM latency histograms), by
        linear interpolation inside the bucket holding rank ``q * count`` (the first
        bucket's lower bound is 0); the upper bound of the last finite bucket when the
        rank falls in the ``+Inf`` bucket. None when the histogram has no observations.
        Like any bucket estimate it is only as fine as the bucket boundaries.

    Raises:
        ValueError: q outside [0, 1], no ``+Inf`` bucket, or counts that decrease.

    Source: Prometheus ``promql/quantile.go`` (bucketQuantile).
    """
    if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
        raise ValueError(f"histogram_quantile: q must be in [0, 1] (0.5 for the median), got {q!r}")
    items = buckets.items() if isinstance(buckets, Mapping) else buckets
    pairs = sorted((float(le), float(c)) for le, c in items)
    if not pairs or not math.isinf(pairs[-1][0]):
        raise ValueError("histogram_quantile: buckets must include the +Inf bucket (le='+Inf')")
    for (le0, c0), (le1, c1) in zip(pairs, pairs[1:]):
        if c1 < c0:
            raise ValueError(f"histogram_quantile: cumulative counts decrease between le={le0} and le={le1}")
    total = pairs[-1][1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, (_, c) in enumerate(pairs) if c >= rank)
    upper, cum = pairs[b]
    if math.isinf(upper):
        return pairs[b - 1][0] if b > 0 else None
    if b == 0:
        if upper <= 0:
            return upper
        lower, prev = 0.0, 0.0
    else:
        lower, prev = pairs[b - 1]
    in_bucket = cum - prev
    if in_bucket <= 0:
        return lower
    return lower + (upper - lower) * (rank - prev) / in_bucket


# --------------------------------------------------------------------------- window rows


def _matching(series: Mapping[_LabelKey, float], match: tuple[tuple[str, str], ...]) -> dict[_LabelKey, float]:
    if not match:
        return dict(series)
    return {k: v for k, v in series.items() if all(p in k for p in match)}


#: Labels that name the process serving a series, not what it measures: vLLM before PR 28792 run with
#: ``--api-server-count N`` (Prometheus multiprocess mode) writes one gauge series per API-server process,
#: ``{engine="0", pid="..."}``, only one of which is live (the rest stay 0.0; vLLM issue 21954, PR 18053).
_PROCESS_LABELS = frozenset({"pid"})


def _per_engine(series: Mapping[_LabelKey, float]) -> dict[_LabelKey, float]:
    """A gauge's series with the process labels dropped, one value per engine: the max over the processes'
    series of one engine (the live one; a mean would divide the live value by the number of API servers)."""
    out: dict[_LabelKey, float] = {}
    for key, v in series.items():
        k = tuple(p for p in key if p[0] not in _PROCESS_LABELS)
        out[k] = v if k not in out or math.isnan(out[k]) else max(out[k], v)
    return out


def _probe(spec: _Spec, name: str) -> str:
    if spec.kind == "histogram":
        return f"{name}_count"
    return name


def _resolve(spec: _Spec, before: Snapshot | None, after: Snapshot) -> tuple[str | None, str | None]:
    """(name to read, null_reason): the first candidate present where needed."""
    partial: list[str] = []
    for name in spec.names:
        probe = _probe(spec, name)
        in_after = after.has(probe)
        in_before = True if before is None else before.has(probe)
        if in_after and in_before:
            return name, None
        if in_after or in_before:
            partial.append(f"{name} only in the {'after' if in_after else 'before'} page")
    if partial:
        return None, "; ".join(partial)
    return None, ABSENT


def _counter_delta(before: Mapping[_LabelKey, float], after: Mapping[_LabelKey, float]) -> tuple[float | None, str | None]:
    total = 0.0
    for key, v in after.items():
        d = v - before.get(key, 0.0)
        if d < 0:
            return None, "counter went down between the scrapes (server restarted?)"
        total += d
    return total, None


def _histogram_delta(
    before: Snapshot, after: Snapshot, name: str, match: tuple[tuple[str, str], ...]
) -> tuple[dict[float, float], float, float, str | None]:
    dcount, reason = _counter_delta(
        _matching(before.samples.get(f"{name}_count", {}), match), _matching(after.samples[f"{name}_count"], match)
    )
    if reason:
        return {}, math.nan, math.nan, reason
    dsum = sum(_matching(after.samples.get(f"{name}_sum", {}), match).values()) - sum(
        _matching(before.samples.get(f"{name}_sum", {}), match).values()
    )
    buckets: dict[float, float] = {}
    b_before = _matching(before.samples.get(f"{name}_bucket", {}), match)
    for key, v in _matching(after.samples.get(f"{name}_bucket", {}), match).items():
        le = float(dict(key)["le"])
        buckets[le] = buckets.get(le, 0.0) + v - b_before.get(key, 0.0)
    return buckets, dsum, float(dcount), None


def window_rows(
    before: Snapshot,
    after: Snapshot,
    ident: Mapping[str, Any],
    quantiles: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """``server_metrics`` rows for the window between two scrapes.

    Args:
        before: :func:`snapshot` of the page scraped just before the load level.
        after: :func:`snapshot` of the page scraped just after it.
        ident: the row key besides ``metric`` (trial_id, workload, load_kind,
            load_value, repeat); copied into every row.
        quantiles: optional, e.g. ``(0.5, 0.99)``: adds columns ``p50_s``, ``p99_s``
            (not in schema 001) to every row, the :func:`histogram_quantile` estimate
            from the window's Δbuckets on histogram rows and None elsewhere.

    Returns:
        One dict per :data:`CANONICAL_METRICS` entry, in that order, then one per
        :data:`SPEC_DECODE_METRICS` entry that the ``after`` page has (speculative decoding), with keys
        ``**ident, metric, kind, value, count, sum, source_name, null_reason``:
        ``counter_delta`` -> value = after - before (summed over engines);
        ``histogram`` -> count = Δcount, sum = Δsum (seconds), value = Δsum/Δcount
        (None with reason 'no observations in the window' when Δcount is 0);
        ``gauge`` -> value on the ``after`` page (per engine the max over its API-server
        processes' series, then summed over engines; the KV-cache usage fraction averaged).
        A missing metric has value None and null_reason
        :data:`ABSENT` (or says which page lacks it); a counter that went down
        (server restart) has value None and says so.

    Raises:
        ValueError: ``ident`` is not a mapping or uses a row column name; a quantile
            is outside [0, 1].
    """
    if not isinstance(before, Snapshot) or not isinstance(after, Snapshot):
        raise ValueError("window_rows: before and after must be Snapshot objects from snapshot(text)")
    if not isinstance(ident, Mapping):
        raise ValueError(f"window_rows: ident must be a dict of the row key (trial_id, workload, ...), got {ident!r}")
    clash = [k for k in ident if k in ("metric", "kind", "value", "count", "sum", "source_name", "null_reason")]
    if clash:
        raise ValueError(f"window_rows: ident must not contain row columns {clash}")
    qcols: list[tuple[float, str]] = []
    for q in quantiles:
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
            raise ValueError(f"window_rows: quantiles must be in [0, 1], got {q!r}")
        qcols.append((float(q), f"p{q * 100:g}_s"))

    rows: list[dict[str, Any]] = []
    served = tuple(sp for sp in _SPECS_IF_SERVED if any(after.has(n) for n in sp.names))
    for spec in _SPECS + served:
        row: dict[str, Any] = {
            **ident,
            "metric": spec.metric,
            "kind": spec.kind,
            "value": None,
            "count": None,
            "sum": None,
            "source_name": None,
            "null_reason": None,
        }
        for _, col in qcols:
            row[col] = None
        rows.append(row)

        name, reason = _resolve(spec, None if spec.kind == "gauge" else before, after)
        if name is None:
            row["null_reason"] = reason
            continue
        row["source_name"] = name

        if spec.kind == "gauge":
            vals = list(_per_engine(_matching(after.samples[name], spec.match)).values())
            row["value"] = sum(vals) if spec.gauge_agg == "sum" else sum(vals) / len(vals)
            continue

        if spec.kind == "counter_delta":
            after_s = _matching(after.samples[name], spec.match)
            if not after_s:
                label = ", ".join(f'{k}="{v}"' for k, v in spec.match)
                row["null_reason"] = f"{ABSENT} (no {name}{{{label}}} series)"
                continue
            value, reason = _counter_delta(_matching(before.samples.get(name, {}), spec.match), after_s)
            row["value"], row["null_reason"] = value, reason
            continue

        buckets, dsum, dcount, reason = _histogram_delta(before, after, name, spec.match)
        if reason:
            row["null_reason"] = reason
            continue
        row["count"], row["sum"] = dcount, dsum
        if dcount > 0:
            row["value"] = dsum / dcount
            for q, col in qcols:
                row[col] = histogram_quantile(buckets, q) if buckets else None
        else:
            row["null_reason"] = "no observations in the window"
    return rows


def spec_decode_acceptance(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Speculative-decoding acceptance of one window from its :func:`window_rows`.

    Returns:
        ``{'acceptance_rate': accepted / draft tokens, 'mean_acceptance_length': 1 + accepted tokens / drafts}``
        (vLLM's definitions, vllm/v1/spec_decode/metrics.py ``SpecDecodingProm``; the length counts the bonus
        token), each None when the window has no such rows (no speculative decoding) or no drafts.
    """
    v = {r["metric"]: r.get("value") for r in rows if r.get("metric") in SPEC_DECODE_METRICS}
    acc, toks, drafts = v.get("spec_decode_accepted_tokens"), v.get("spec_decode_draft_tokens"), v.get("spec_decode_drafts")
    return {"acceptance_rate": acc / toks if acc is not None and toks else None,
            "mean_acceptance_length": 1 + acc / drafts if acc is not None and drafts else None}
