"""Load profiles: how a measured window loads the server, as one type per profile.

A *load profile* is one load level of a plan: fixed concurrency (``c=4``: that many requests in flight while
requests remain, closed loop, as ``vllm bench serve --max-concurrency``) or a request rate with its arrival
process (``2 req/s``: request i sent at a drawn offset whatever the server does, open loop, as
``vllm bench serve --request-rate --burstiness``). Each profile owns everything that differs between them:

* ``kind`` / ``value``: the warehouse key (``measurements.load_kind``, ``load_value``);
* ``label``: how people read it (``c=4``, ``2 req/s``) in reports, plots, notes and the CLI;
* ``schedule(n, seed)``: what the load generator's scheduler consumes (:class:`Schedule`: concurrency slots
  or send offsets);
* ``measured_requests`` / ``warmup_requests``: requests per measured window and per warm-up;
* ``window_deadline_s``: the time a window may take before tunelab gives up on the measurement;
* ``duration_schedule``: the schedule of a window defined by its duration (``window: {duration_s}``);
* ``target_concurrency``: the in-flight count a window should reach (client-bound and quality checks);
* validation, with errors naming the plan field and the fix.

The plan's YAML keeps its fields (``concurrency: [...]``, ``request_rates: [...]``, ``burstiness``) and
expands them into profiles (``Plan.load_profiles()``). docs/load_profiles.md says how to add a profile.

Domain layer: imports only the standard library, numpy and pydantic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError, field_validator

__all__ = [
    "Schedule",
    "WindowSpec",
    "DURATION_PROMPT_HEADROOM",
    "ConcurrencyProfile",
    "RateProfile",
    "TraceProfile",
    "LoadProfile",
    "LOAD_KINDS",
    "RATE_WARMUP_S",
    "arrival_offsets",
    "profile_for",
    "profile_class",
    "load_label",
    "concurrency_target_kinds",
    "profiles_from_levels",
]

#: A request-rate level's warm-up lasts at least this many seconds of its arrivals (``ceil(rate x 1 s)``
#: requests): enough to see the batch sizes that the rate brings in a second.
RATE_WARMUP_S = 1.0


@dataclass(frozen=True)
class Schedule:
    """What the load generator's scheduler runs for one window of ``n_requests`` requests: exactly one of

    * ``slots``: closed loop, at most this many requests in flight, the next one sent as soon as one ends
      (every slot busy while requests remain);
    * ``send_offsets_s``: open loop, request i sent ``send_offsets_s[i]`` seconds after the window's start,
      whatever the server does (non-decreasing, >= 0, one per request).

    Raises:
        ValueError: neither or both given, ``slots`` < 1, or not one offset per request.
    """

    n_requests: int
    slots: int | None = None
    send_offsets_s: tuple[float, ...] | None = None
    #: A duration window: no request is sent this many seconds or later after the window's start (closed loop:
    #: ``n_requests`` is then a capacity, the prompts prepared; open loop: the offsets already end before it).
    #: None: every request is sent.
    send_until_s: float | None = None
    #: Closed loop: slot k of the ``slots`` takes its first request ``k x stagger_s / slots`` seconds after the
    #: window's start (staggered starts). Equal-length requests started together finish together and run in
    #: lockstep waves under a closed loop (every slot refills at once; a short window lands in one phase or the
    #: other: the bimodal windows of the H200's first 8B A/A); spread over one request's duration, the slots stay
    #: spread. The stagger lies in the ramp-up, which the window's figures exclude (``tasks.metrics.
    #: steady_interval``: the steady part starts when all slots are busy). 0: every slot starts at once.
    stagger_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.slots is None) == (self.send_offsets_s is None):
            raise ValueError("a Schedule has either slots (closed loop) or send_offsets_s (open loop), not both "
                             "or neither")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"Schedule.slots (concurrency) must be >= 1, got {self.slots!r}")
        if self.send_offsets_s is not None and len(self.send_offsets_s) != self.n_requests:
            raise ValueError(f"Schedule.send_offsets_s needs one offset (seconds) per request: got "
                             f"{len(self.send_offsets_s)} for {self.n_requests} requests")
        if self.send_until_s is not None and not (math.isfinite(self.send_until_s) and self.send_until_s > 0):
            raise ValueError(f"Schedule.send_until_s (window duration) must be a finite number of seconds > 0, got "
                             f"{self.send_until_s!r}")
        if not (math.isfinite(self.stagger_s) and self.stagger_s >= 0):
            raise ValueError(f"Schedule.stagger_s must be a finite number of seconds >= 0, got {self.stagger_s!r}")
        if self.stagger_s and self.slots is None:
            raise ValueError("Schedule.stagger_s staggers the slots of a closed loop; an open loop's send offsets "
                             "already set every send time")

    @property
    def closed_loop(self) -> bool:
        """True for a slots schedule (the server's pace sets the send times)."""
        return self.slots is not None


def arrival_offsets(
    n: int,
    rate_per_s: float,
    burstiness: float = 1.0,
    seed: int = 0,
    *,
    match_total_duration: bool = False,
) -> np.ndarray:
    """Send offsets, in seconds from the start of the measurement, of ``n`` requests at a mean rate.

    The gaps between successive requests are independent draws, as ``vllm bench serve --request-rate R
    --burstiness B`` (vllm/benchmarks/serve.py, ``get_request``): exponential with mean ``1/R`` when
    ``B == 1`` (a Poisson process); gamma with shape ``B`` and scale ``1/(R*B)`` otherwise, so the mean gap
    stays ``1/R`` and the gaps' coefficient of variation is ``1/sqrt(B)`` (``B < 1`` burstier than Poisson,
    ``B > 1`` more regular, ``B = inf`` constant gaps of exactly ``1/R``). ``R = inf`` sends everything at
    offset 0, as in vLLM. Offsets are the cumulative sums of the gaps, so the first request also waits one
    gap, as vLLM's scheduler does. Unlike vLLM (numpy's global random state), draws come from a seeded
    ``numpy.random.Generator``, so a schedule is reproducible and identical across the configs compared.

    Args:
        n: number of requests (>= 0).
        rate_per_s: mean request rate, requests/s (> 0); ``float('inf')`` sends all at offset 0.
        burstiness: gamma shape of the gaps (> 0; 1.0 Poisson, ``float('inf')`` constant gaps).
        seed: seed of ``numpy.random.default_rng``; the same arguments always give the same offsets.
        match_total_duration: rescale so the last offset is exactly ``n / rate_per_s`` (what recent
            ``vllm bench serve`` versions do "to stabilise throughput across seeds"); the default False keeps
            an unconditioned renewal process, whose realised mean rate differs from ``rate_per_s`` by about
            ``1/sqrt(n * burstiness)`` relative.

    Returns:
        ``numpy.ndarray`` of shape ``(n,)``, float64, non-decreasing, >= 0.

    Raises:
        ValueError: ``n`` not a non-negative integer, ``rate_per_s`` or ``burstiness`` not positive
            (``inf`` allowed), ``seed`` not an integer.

    Source: vLLM ``vllm/benchmarks/serve.py::get_request``.
    """
    import numbers

    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"arrival_offsets: n must be a non-negative integer (number of requests), got {n!r}")
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, numbers.Real) or math.isnan(rate_per_s) or rate_per_s <= 0:
        raise ValueError(
            f"arrival_offsets: rate_per_s must be a positive number of requests/s "
            f"(float('inf') to send all at once), got {rate_per_s!r}"
        )
    if isinstance(burstiness, bool) or not isinstance(burstiness, numbers.Real) or math.isnan(burstiness) or burstiness <= 0:
        raise ValueError(
            f"arrival_offsets: burstiness must be > 0 (1 = Poisson, <1 burstier, >1 more regular, "
            f"inf = constant gaps), got {burstiness!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"arrival_offsets: seed must be an integer, got {seed!r}")

    n = int(n)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    if math.isinf(rate_per_s):
        return np.zeros(n, dtype=np.float64)

    mean_gap_s = 1.0 / float(rate_per_s)
    if math.isinf(burstiness):
        gaps = np.full(n, mean_gap_s, dtype=np.float64)
    else:
        rng = np.random.default_rng(int(seed))
        if burstiness == 1.0:
            gaps = rng.exponential(scale=mean_gap_s, size=n)
        else:
            gaps = rng.gamma(shape=float(burstiness), scale=mean_gap_s / float(burstiness), size=n)
    offsets = np.cumsum(gaps, dtype=np.float64)
    if match_total_duration and offsets[-1] > 0:
        offsets *= (n * mean_gap_s) / offsets[-1]
    return offsets


class WindowSpec(BaseModel):
    """How long a measured window runs: the plan's ``window:`` field.

    * absent (the default, as before): a number of requests, the workload's ``num_requests`` (raised by
      ``requests_per_concurrency`` at concurrency levels);
    * ``window: {duration_s: 10}``: requests are sent for 10 s from the window's start (closed loop: the
      slots keep taking the next request until then; open loop: the arrivals that fall before it), then the
      window drains. A longer window does not by itself lower boot-to-boot noise (docs/measurement.md,
      "Steady-state windows"), so the default stays the request count.

    Raises:
        pydantic.ValidationError: ``duration_s`` not a finite number > 0 (the message gives an example).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    duration_s: float | None = Field(None, description="Seconds of sending per measured window (> 0); None: a "
                                                       "window of the workload's num_requests.")

    @field_validator("duration_s")
    @classmethod
    def _duration_ok(cls, v: float | None) -> float | None:
        if v is not None and (isinstance(v, bool) or not math.isfinite(v) or v <= 0):
            raise ValueError(f"duration_s must be a finite number of seconds > 0, got {v!r}; e.g. window: "
                             "{duration_s: 10}, or leave window out for windows of num_requests requests")
        return v


#: Headroom of a closed-loop duration window's prompts over the expected number of requests (the warm-up's
#: pace x duration): a window that runs out of prompts ends early, with a note.
DURATION_PROMPT_HEADROOM = 1.5


class _Profile(BaseModel):
    """What every load profile provides (see the module docstring). Subclasses set ``kind`` (a ``Literal``,
    the discriminator), ``level_field`` (the attribute holding the level, read by :func:`profile_for`),
    ``plan_field`` (the plan's YAML field it expands from, named in errors) and implement the methods."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    level_field: ClassVar[str]
    plan_field: ClassVar[str]
    #: matplotlib marker of this profile's points in plots.
    plot_marker: ClassVar[str] = "o"
    #: True when ``load_value`` is an in-flight target a window should reach (``target_concurrency``).
    has_concurrency_target: ClassVar[bool] = False

    @property
    def value(self) -> float:
        """The warehouse's ``load_value`` (float)."""
        return float(getattr(self, self.level_field))

    @classmethod
    def format_label(cls, value: float) -> str:  # pragma: no cover - abstract
        """The label of this profile at ``value`` (also for warehouse rows that no plan validated)."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """How people read the level: ``c=4``, ``2 req/s``."""
        return self.format_label(self.value)

    @property
    def seed_key(self) -> str:
        """The level's part of the prompt and arrival seeds. The spelling of the former ``LoadLevel``
        dataclass's repr, kept so that a plan sends the same prompts and the same schedule as before the
        profiles (comparisons across tunelab releases then measure the same requests)."""
        return f"LoadLevel(kind={self.kind!r}, value={self.value!r})"  # type: ignore[attr-defined]

    @property
    def target_concurrency(self) -> float | None:
        """The in-flight count a window should reach while it still has requests to send; None: no target
        (open loop)."""
        return None

    def measured_requests(self, workload_requests: int, requests_per_concurrency: int = 0) -> int:
        """Measured requests per window: the workload's ``num_requests`` (profiles with a concurrency target
        raise it to ``requests_per_concurrency x c``)."""
        return workload_requests

    def offered_rate_per_s(self, workload_arrivals_s: Sequence[float] | None = None) -> float | None:
        """Requests/s an open-loop level offers (plan cost estimates); None for a closed loop (the server's pace
        sets it). ``workload_arrivals_s``: the workload's own arrival offsets, for profiles that replay them."""
        return None

    def warmup_requests(self, minimum: int) -> int:  # pragma: no cover - abstract
        """Warm-up requests before the level's windows; ``minimum`` is the plan's ``warmup_requests`` (0 turns
        the warm-up off)."""
        raise NotImplementedError

    def schedule(self, n_requests: int, seed: int | None = None,
                 send_offsets_s: Sequence[float] | None = None,
                 workload_arrivals_s: Sequence[float] | None = None) -> Schedule:  # pragma: no cover - abstract
        """The :class:`Schedule` of a window of ``n_requests``; ``seed`` draws random parts (arrivals),
        ``send_offsets_s`` gives them instead. ``workload_arrivals_s``: the workload's own arrival offsets
        (a trace workload's, seconds from its first request; None for other workloads), used only by profiles
        that replay them (``trace``); the others ignore it, so the measurement passes it to every profile."""
        raise NotImplementedError

    def window_deadline_s(self, request_timeout_s: float, repeats: int, duration_s: float | None = None) -> float:
        """Seconds one measured window (and its share of warm-up) may take before tunelab stops the
        measurement: ``request_timeout_s x (repeats + 1)`` (the rule of the trial flow since its start; the
        flow adds 300 s to the sum over windows); a duration window adds its ``duration_s``."""
        return request_timeout_s * (repeats + 1) + (duration_s or 0.0)

    def duration_schedule(self, duration_s: float, seed: int, requests_per_s: float | None) -> Schedule:
        """The :class:`Schedule` of a window that sends for ``duration_s`` seconds (``window: {duration_s}``).

        Args:
            duration_s: seconds of sending (> 0).
            seed: draws random parts (arrivals).
            requests_per_s: the pace the server kept at this level (the warm-up's requests / wall seconds), to
                size a closed loop's prompts; None: unknown.
        """
        raise NotImplementedError  # pragma: no cover - abstract


class ConcurrencyProfile(_Profile):
    """Fixed concurrency ``c``: exactly ``c`` requests in flight while requests remain (closed loop; as
    ``vllm bench serve --max-concurrency c --request-rate inf``). Label ``c=4``."""

    kind: Literal["concurrency"] = "concurrency"
    concurrency: StrictInt = Field(description="Max requests in flight (>= 1).")
    level_field: ClassVar[str] = "concurrency"
    plan_field: ClassVar[str] = "concurrency"
    plot_marker: ClassVar[str] = "o"
    has_concurrency_target: ClassVar[bool] = True

    @field_validator("concurrency")
    @classmethod
    def _ok(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"concurrency levels must be >= 1 (max requests in flight), got {v}; e.g. "
                             "concurrency: [1, 4]")
        return v

    @classmethod
    def format_label(cls, value: float) -> str:
        return f"c={int(value)}"

    @property
    def target_concurrency(self) -> float:
        return float(self.concurrency)

    def measured_requests(self, workload_requests: int, requests_per_concurrency: int = 0) -> int:
        """``max(num_requests, requests_per_concurrency x c)`` with ``requests_per_concurrency`` > 0, so high
        levels are really reached and low ones stay short; else ``num_requests``."""
        if requests_per_concurrency:
            return max(workload_requests, int(requests_per_concurrency * self.concurrency))
        return workload_requests

    def warmup_requests(self, minimum: int) -> int:
        """``max(minimum, c)`` at concurrency c, so c requests are in flight at once (every batch size up to c
        is passed on the way up) before the first measured request; 0 when ``minimum`` <= 0."""
        return 0 if minimum <= 0 else max(minimum, self.concurrency)

    def schedule(self, n_requests: int, seed: int | None = None,
                 send_offsets_s: Sequence[float] | None = None,
                 workload_arrivals_s: Sequence[float] | None = None) -> Schedule:
        """``c`` slots (no send offsets: the server's pace sets them; ``seed`` is not used)."""
        return Schedule(n_requests, slots=self.concurrency)

    def duration_schedule(self, duration_s: float, seed: int, requests_per_s: float | None) -> Schedule:
        """``c`` slots that take no new request ``duration_s`` after the start; prompts for
        ``DURATION_PROMPT_HEADROOM x requests_per_s x duration_s + c`` requests (at least ``4 c``; ``64 c``
        when the pace is unknown)."""
        c = self.concurrency
        if requests_per_s is None or not math.isfinite(requests_per_s) or requests_per_s <= 0:
            n = 64 * c
        else:
            n = max(4 * c, math.ceil(DURATION_PROMPT_HEADROOM * requests_per_s * duration_s) + c)
        return Schedule(n, slots=c, send_until_s=float(duration_s))


class RateProfile(_Profile):
    """A request rate with its arrival process: request i is sent at offset i of a renewal process with mean
    rate ``rate_per_s`` and gamma-shaped gaps (``burstiness`` 1.0 = Poisson, < 1 burstier, > 1 more regular,
    ``inf`` constant gaps), whatever the server does (open loop; as ``vllm bench serve --request-rate
    --burstiness``). Label ``2 req/s``."""

    kind: Literal["rate"] = "rate"
    rate_per_s: float = Field(description="Mean requests/s (finite, > 0).")
    burstiness: float = Field(1.0, description="Gamma shape of the inter-arrival gaps (> 0; 1.0 = Poisson, inf = "
                                                "constant).")
    level_field: ClassVar[str] = "rate_per_s"
    plan_field: ClassVar[str] = "request_rates"
    plot_marker: ClassVar[str] = "s"

    @field_validator("rate_per_s")
    @classmethod
    def _rate_ok(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"request rates must be finite numbers > 0 requests/s, got {v!r}; e.g. "
                             "request_rates: [0.5, 2]")
        return v

    @field_validator("burstiness")
    @classmethod
    def _burst_ok(cls, v: float) -> float:
        if math.isnan(v) or v <= 0:
            raise ValueError(f"burstiness must be > 0 (1 = Poisson, < 1 burstier, > 1 more regular), got {v!r}")
        return v

    def offered_rate_per_s(self, workload_arrivals_s: Sequence[float] | None = None) -> float | None:
        """The level's mean rate, requests/s."""
        return self.rate_per_s

    @property
    def arrival_process(self) -> str:
        """``'poisson'`` (burstiness 1), ``'constant'`` (inf) or ``'gamma'``."""
        if self.burstiness == 1.0:
            return "poisson"
        return "constant" if math.isinf(self.burstiness) else "gamma"

    @classmethod
    def format_label(cls, value: float) -> str:
        return f"{value:g} req/s"

    def warmup_requests(self, minimum: int) -> int:
        """``max(minimum, ceil(rate x RATE_WARMUP_S))`` on the level's own arrival process: the batch sizes a
        second of arrivals brings. An open-loop window's in-flight count is random; the window records
        ``peak_in_flight`` and a note says when it went above the warm-up's. 0 when ``minimum`` <= 0."""
        return 0 if minimum <= 0 else max(minimum, math.ceil(self.rate_per_s * RATE_WARMUP_S))

    def schedule(self, n_requests: int, seed: int | None = None,
                 send_offsets_s: Sequence[float] | None = None,
                 workload_arrivals_s: Sequence[float] | None = None) -> Schedule:
        """Send offsets drawn by :func:`arrival_offsets` from ``seed``, or the ``send_offsets_s`` given.

        Raises:
            ValueError: neither ``seed`` nor ``send_offsets_s`` (the message names arrival_offsets_s, the
                load generator's argument), or not one offset per request.
        """
        if send_offsets_s is None:
            if seed is None:
                raise ValueError("a request-rate window needs arrival_offsets_s: one send offset (seconds) per "
                                 "prompt (tunelab.core.load_profiles.arrival_offsets), or a seed to draw them from")
            send_offsets_s = arrival_offsets(n_requests, self.rate_per_s, self.burstiness, seed=seed)
        return Schedule(n_requests, send_offsets_s=tuple(float(x) for x in send_offsets_s))

    def duration_schedule(self, duration_s: float, seed: int, requests_per_s: float | None = None) -> Schedule:
        """The arrivals of :func:`arrival_offsets` (same seed, same draws as a count window's) that fall before
        ``duration_s``: about ``rate x duration_s`` requests (``requests_per_s`` is not used: the rate sets the
        pace)."""
        n = max(8, math.ceil(self.rate_per_s * duration_s * 2) + 8)
        while True:
            offs = arrival_offsets(n, self.rate_per_s, self.burstiness, seed=seed)
            if offs[-1] >= duration_s:
                break
            n *= 2
        kept = tuple(float(x) for x in offs if x < duration_s) or (float(offs[0]),)  # at least one request
        return Schedule(len(kept), send_offsets_s=kept, send_until_s=float(duration_s))


class TraceProfile(_Profile):
    """Trace replay: request i is sent at the trace workload's arrival offset i divided by ``speedup``
    (``speedup`` 2 replays the trace twice as fast, 0.5 at half speed), whatever the server does (open loop;
    as AIPerf's fixed-schedule replay). The offsets come from the workload (``tunelab.core.workloads.TraceWorkload``,
    passed to :meth:`schedule` as ``workload_arrivals_s``); the plan checks that every workload measured at a
    trace level has them. Label ``trace x2``."""

    kind: Literal["trace"] = "trace"
    speedup: float = Field(description="Replay speed: offsets are divided by it (finite, > 0; 1.0 = as recorded).")
    level_field: ClassVar[str] = "speedup"
    plan_field: ClassVar[str] = "trace_speedups"
    plot_marker: ClassVar[str] = "^"

    @field_validator("speedup")
    @classmethod
    def _speedup_ok(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"trace speedups must be finite numbers > 0 (1.0 = as recorded, 2 = twice as fast), got "
                             f"{v!r}; e.g. trace_speedups: [1.0]")
        return v

    @classmethod
    def format_label(cls, value: float) -> str:
        return f"trace x{value:g}"

    def warmup_requests(self, minimum: int) -> int:
        """``minimum`` (the plan's ``warmup_requests``) of the trace's first requests at its own times; 0 when
        ``minimum`` <= 0."""
        return max(0, minimum)

    def offered_rate_per_s(self, workload_arrivals_s: Sequence[float] | None = None) -> float | None:
        """The replay's mean rate, requests/s: ``(n - 1) x speedup / span`` of the arrival offsets given; None
        without them or when all arrive at once."""
        if not workload_arrivals_s or len(workload_arrivals_s) < 2:
            return None
        span_s = (float(workload_arrivals_s[-1]) - float(workload_arrivals_s[0])) / self.speedup
        return (len(workload_arrivals_s) - 1) / span_s if span_s > 0 else None

    def schedule(self, n_requests: int, seed: int | None = None,
                 send_offsets_s: Sequence[float] | None = None,
                 workload_arrivals_s: Sequence[float] | None = None) -> Schedule:
        """Send offsets ``workload_arrivals_s[i] / speedup`` (``seed`` is not used: the trace is the schedule).

        Raises:
            ValueError: no ``workload_arrivals_s`` (a workload without arrival times, e.g. type fixed, at a trace
                level), or not one per request.
        """
        if workload_arrivals_s is None:
            raise ValueError("a trace level needs the workload's arrival times: use a workload of type trace "
                             "(tunelab.core.workloads.TraceWorkload), or measure this workload at concurrency/request_rates")
        return Schedule(n_requests, send_offsets_s=tuple(float(x) / self.speedup for x in workload_arrivals_s))

    def duration_schedule(self, duration_s: float, seed: int, requests_per_s: float | None = None) -> Schedule:
        """Not available: a trace sets its own length (the plan rejects ``window: {duration_s}`` with trace
        levels).

        Raises:
            ValueError: always.
        """
        raise ValueError("a trace level has no duration window: the trace sets the window's length; remove "
                         "window: {duration_s} or the trace_speedups")


#: The union of all profiles, told apart by ``kind`` (pydantic discriminated union).
LoadProfile = Annotated[Union[ConcurrencyProfile, RateProfile, TraceProfile], Field(discriminator="kind")]
_ADAPTER: TypeAdapter = TypeAdapter(LoadProfile)
_BY_KIND: dict[str, type[_Profile]] = {c.model_fields["kind"].default: c
                                       for c in (ConcurrencyProfile, RateProfile, TraceProfile)}
#: The ``load_kind`` values of the warehouse.
LOAD_KINDS: tuple[str, ...] = tuple(_BY_KIND)


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    return str(err["msg"]).removeprefix("Value error, ")


def profile_class(kind: str) -> type[_Profile]:
    """The profile type of a warehouse ``load_kind``.

    Raises:
        ValueError: an unknown kind (the message lists the known ones).
    """
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise ValueError(f"load_kind must be one of {list(LOAD_KINDS)}, got {kind!r}")
    return cls


def profile_for(kind: str, value: float, **options: Any) -> LoadProfile:
    """The profile of a warehouse key (``load_kind``, ``load_value``), with ``options`` such as
    ``burstiness`` for a rate.

    Raises:
        ValueError: an unknown kind (the message lists the known ones) or a value the profile rejects.
    """
    cls = profile_class(kind)
    level: Any = value
    if cls.level_field == "concurrency" and isinstance(value, float) and value.is_integer():
        level = int(value)  # the warehouse stores every load_value as a float
    try:
        return _ADAPTER.validate_python({"kind": kind, cls.level_field: level, **options})
    except ValidationError as e:
        raise ValueError(f"load_value ({kind}): {_first_error(e)}") from None


def load_label(kind: str, value: float) -> str:
    """The label of a warehouse row's load level (``c=4``, ``2 req/s``) by its profile's rule, without
    validating the value (rows imported from ``vllm bench serve`` may have rate ``inf``).

    Raises:
        ValueError: an unknown kind.
    """
    return profile_class(kind).format_label(float(value))


def concurrency_target_kinds() -> tuple[str, ...]:
    """The ``load_kind`` values whose ``load_value`` is an in-flight target (achieved-concurrency checks)."""
    return tuple(k for k, c in _BY_KIND.items() if c.has_concurrency_target)


def profiles_from_levels(cls: type[_Profile], levels: Sequence[Any], **options: Any) -> list[LoadProfile]:
    """One profile of ``cls`` per level of the plan field ``cls.plan_field`` (e.g. ``concurrency: [1, 4]``),
    with shared ``options`` (e.g. the plan's ``burstiness``).

    Raises:
        ValueError: a level the profile rejects, or a level given twice (the message names the plan field and
            the fix).
    """
    out = []
    for i, v in enumerate(levels):
        try:
            out.append(cls(**{cls.level_field: v}, **options))
        except ValidationError as e:
            raise ValueError(f"{cls.plan_field}[{i}]: {_first_error(e)}") from None
    keys = [p.value for p in out]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{cls.plan_field} levels must be distinct, got {list(levels)}: a level measured twice is "
                         "what `repeats` is for")
    return out
