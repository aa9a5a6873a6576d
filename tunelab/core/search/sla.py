"""SLA search on one booted server: the highest load at which the plan's SLOs hold (``sla_search:`` in a plan).

Pure search logic, testable without a server: :func:`search` takes a ``measure(level)`` callable that runs one
measured window at a load level (a concurrency or a request rate) and returns its figures (the SLO metrics,
e.g. ``ttft_p99_s``, ``error_rate``, and the throughputs), and brackets the highest level that meets the SLO:

1. **Grow**: from ``start``, multiply the level by ``growth`` (capped at ``max``) until a level fails.
2. **Bisect** between the last level that passed and the first that failed, at the geometric midpoint, until
   ``first_fail / last_pass - 1 <= resolution`` (a concurrency search also stops when they are 1 apart).

A level is never judged by one window. After ``min_windows_per_level`` windows (then after each more, up to
``max_windows_per_level``) every SLO metric gets a one-sided t bound from its per-window values: latencies on
the log scale (a bound on the geometric mean of the windows' percentile). The error rate gets Clopper-Pearson
bounds on the failed / sent requests pooled over the level's windows (within [0, 1]; windows without counts: a
t bound on the window rates, clipped to [0, 1]). The level **passes** when every latency's upper bound is at or
under its limit and the error rate is too (its point estimate: an error-free level would need about
``ln(looks / (1 - confidence)) / max_error_rate`` requests to show a bound under the limit), **fails** when some
metric's lower bound is above its limit, and is otherwise **undecided**: another window, or at the cap, decided
by the point estimates. Each bound is at ``(1 - confidence) / looks`` (Bonferroni over the looks a level may
take), so a level whose true latency is at its limit is called on the wrong side with probability at most
``1 - confidence`` per metric, and one whose true error rate is at its limit is failed wrongly at most that
often. With ``min_load_ratio``, a level whose windows did not reach its load (:func:`load_shortfall`) fails
whatever its SLO metrics say. Method, assumptions and measured error rates: docs/sla_search.md.

The result (:class:`SlaResult`) names the highest level that passed (``max_load``; verdict ``found``), or
``met_at_max`` (``max`` itself passed: the capacity is at least ``max``), or ``none`` (``start`` failed; the
nearest level tried is named with how far it was from its limits); goodput and throughput at ``max_load``;
the knee of the latency-throughput curve (:func:`knee`); every level tried with its windows and verdict.

Domain layer: imports only the standard library, math and pydantic (scipy inside :func:`judge_level` and
:func:`load_shortfall`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "SlaSearchSpec",
    "MetricBound",
    "SlaLevelResult",
    "SlaResult",
    "slo_limits",
    "judge_level",
    "search",
    "knee",
    "fixed_grid_levels",
    "load_shortfall",
    "ERROR_RATE",
    "FAILED",
    "SENT",
    "ACHIEVED_LOAD",
    "LOAD_INTERVALS",
    "THROUGHPUT",
    "GOODPUT",
]

#: Window figure: failed / sent requests of the window (0..1).
ERROR_RATE = "error_rate"
#: Window figures (optional): failed and sent requests of the window, the counts behind :data:`ERROR_RATE`.
FAILED = "failed_requests"
SENT = "sent_requests"
#: Window figure (optional): the load the window reached: for a concurrency, the mean requests in flight while
#: the client was sending (``measurements.in_flight_while_sending``); for a rate, requests sent per second of
#: sending (intervals between the first and the last send / their seconds).
ACHIEVED_LOAD = "achieved_load"
#: Window figure (optional, rate): the number of send intervals behind :data:`ACHIEVED_LOAD` (sent - 1).
LOAD_INTERVALS = "load_intervals"
#: Window figure: completed requests per second (``measurements.request_throughput_per_s``).
THROUGHPUT = "request_throughput_per_s"
#: Window figure: requests per second that met every SLO bound of the plan (``measurements.goodput_per_s``).
GOODPUT = "goodput_per_s"
#: Window figure: output tokens per second (``measurements.output_tokens_per_s``).
OUTPUT_TPS = "output_tokens_per_s"


class SlaSearchSpec(BaseModel):
    """``sla_search:`` of a plan: search the highest load meeting the plan's ``slo:`` on each booted server.

    Example: ``sla_search: {load: concurrency, start: 1, max: 256, resolution: 0.1, max_windows_per_level: 4}``.
    The SLO metrics are the plan's ``slo:`` bounds read at ``percentile`` (``slo: {ttft_s: 0.5}`` with
    percentile 99: every window's ``ttft_p99_s``), plus the window's error rate against ``max_error_rate``."""

    model_config = ConfigDict(extra="forbid")
    load: Literal["concurrency", "rate"] = Field(
        "concurrency", description="What is searched: concurrency (requests in flight) or rate (requests/s, with "
                                   "the plan's burstiness).")
    start: float = Field(1.0, gt=0, allow_inf_nan=False, description="First level tried (the lowest searched).")
    max: float = Field(256.0, gt=0, allow_inf_nan=False, description="Highest level tried.")
    growth: float = Field(2.0, gt=1, le=16, allow_inf_nan=False,
                          description="Factor between successive levels while growing (before the first fail).")
    resolution: float = Field(0.1, gt=0, lt=1, description="Stop bisecting when first fail / last pass - 1 is at "
                                                           "most this (0.1 = 10 %).")
    min_windows_per_level: int = Field(2, strict=True, ge=2, le=20,
                                       description="Windows before a level is first judged (>= 2: an interval "
                                                   "needs two values).")
    max_windows_per_level: int = Field(4, strict=True, ge=2, le=20,
                                       description="Most windows at one level; still undecided then: a fail.")
    percentile: Literal[50, 90, 95, 99] = Field(99, description="Percentile of each window's latencies compared "
                                                                "with the slo: bounds (99: ttft_p99_s, ...).")
    max_error_rate: float = Field(0.01, ge=0, lt=1, description="Highest failed / sent requests of a level.")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="Per level: a level at its limit is called on the "
                                                              "wrong side with probability <= 1 - confidence.")

    @model_validator(mode="after")
    def _consistent(self) -> "SlaSearchSpec":
        if self.start > self.max:
            raise ValueError(f"start ({self.start:g}) is above max ({self.max:g}); set start <= max, e.g. "
                             "sla_search: {start: 1, max: 256}")
        if self.load == "concurrency":
            for name in ("start", "max"):
                v = getattr(self, name)
                if v != int(v) or v < 1:
                    raise ValueError(f"{name}: a concurrency level is a whole number >= 1, got {v:g}; e.g. "
                                     f"{name}: {max(1, round(v))}")
        if self.max_windows_per_level < self.min_windows_per_level:
            raise ValueError(f"max_windows_per_level ({self.max_windows_per_level}) is below "
                             f"min_windows_per_level ({self.min_windows_per_level}); raise it to at least that")
        return self

    @property
    def looks(self) -> int:
        """Judgements a level may take (one after each window from the minimum to the cap)."""
        return self.max_windows_per_level - self.min_windows_per_level + 1

    def level(self, value: float) -> float:
        """A level as searched: a whole number for concurrency, 3 significant digits for a rate."""
        if self.load == "concurrency":
            return float(max(1, round(value)))
        return float(f"{value:.3g}")

    def max_levels(self) -> int:
        """Most levels one search can try (growing, then bisecting), for deadlines."""
        grow = math.ceil(math.log(self.max / self.start) / math.log(self.growth)) + 1 if self.max > self.start else 1
        bisect = math.ceil(math.log2(max(1.0, math.log(self.growth) / math.log1p(self.resolution)))) + 1
        return grow + bisect

    def limits(self, ttft_s: float | None = None, tpot_s: float | None = None,
               e2el_s: float | None = None) -> dict[str, float]:
        """The SLO metrics and their limits: see :func:`slo_limits`."""
        return slo_limits(self, ttft_s=ttft_s, tpot_s=tpot_s, e2el_s=e2el_s)


def slo_limits(spec: SlaSearchSpec, *, ttft_s: float | None = None, tpot_s: float | None = None,
               e2el_s: float | None = None) -> dict[str, float]:
    """Window figure -> limit: each given ``slo:`` bound at the spec's percentile (``ttft_p99_s``: 0.5), and
    :data:`ERROR_RATE`: ``max_error_rate``."""
    out = {f"{name}_p{spec.percentile}_s": float(v)
           for name, v in (("ttft", ttft_s), ("tpot", tpot_s), ("e2el", e2el_s)) if v is not None}
    out[ERROR_RATE] = float(spec.max_error_rate)
    return out


@dataclass(frozen=True)
class MetricBound:
    """One SLO metric at one level: its windows' values summarised and its one-sided bounds.

    ``centre``: the geometric mean of the windows' values for a latency, the pooled failed / sent requests for
    the error rate (the mean of the window rates when a window has no counts); ``low`` / ``high``: its lower /
    upper confidence bounds (each one-sided at the level's per-look alpha; an error rate's within [0, 1]); NaN
    when fewer than two windows gave a value."""

    metric: str
    limit: float
    n: int
    centre: float
    low: float
    high: float

    @property
    def ratio(self) -> float:
        """``centre / limit`` (how far from the limit; inf for a limit of 0 with a positive centre)."""
        if self.limit > 0:
            return self.centre / self.limit
        return 0.0 if self.centre <= 0 else math.inf

    def record(self) -> dict[str, Any]:
        """As stored in ``sla_searches.levels``."""
        f = (lambda x: None if x is None or not math.isfinite(x) else round(float(x), 9))
        return {"limit": self.limit, "n": self.n, "centre": f(self.centre), "low": f(self.low), "high": f(self.high)}


@dataclass
class SlaLevelResult:
    """One level tried: its windows' figures (in the order measured), its metrics' bounds and its verdict
    (``pass`` | ``fail`` | ``undecided``; undecided is decided by the point estimates in the search).
    ``load_note``: why the level failed although its SLO metrics did not fail it: its windows did not reach
    the load (:func:`load_shortfall`); None otherwise."""

    level: float
    windows: list[dict[str, Any]] = field(default_factory=list)
    bounds: dict[str, MetricBound] = field(default_factory=dict)
    verdict: Literal["pass", "fail", "undecided"] = "undecided"
    load_note: str | None = None

    @property
    def passed(self) -> bool:
        """Counted as a pass by the search: ``pass``, or ``undecided`` at the cap with every metric's centre
        at or under its limit (the point estimate decides what the bounds could not); never a level whose load
        was not reached (``load_note``)."""
        if self.load_note is not None:
            return False
        if self.verdict == "undecided":
            return bool(self.bounds) and all(math.isfinite(b.centre) and b.centre <= b.limit
                                             for b in self.bounds.values())
        return self.verdict == "pass"

    def mean(self, key: str) -> float | None:
        """Mean of a window figure over the level's windows (None when no window has it)."""
        vals = [float(w[key]) for w in self.windows if _finite(w.get(key))]
        return sum(vals) / len(vals) if vals else None

    @property
    def slo_ratio(self) -> float:
        """The largest ``centre / limit`` of the level's latency metrics (the binding one; NaN: none measured)."""
        r = [b.ratio for m, b in self.bounds.items() if m != ERROR_RATE and math.isfinite(b.centre)]
        return max(r) if r else math.nan

    @property
    def binding(self) -> str | None:
        """The metric furthest above (or least below) its limit (largest ``centre / limit``, the error rate
        included)."""
        r = {m: b.ratio for m, b in self.bounds.items() if math.isfinite(b.centre)}
        return max(r, key=lambda m: r[m]) if r else None

    @property
    def decided_by(self) -> str | None:
        """The SLO metric that decided the level: for a ``fail``, the metric shown above its limit (the largest
        ``low / limit`` among those); otherwise :attr:`binding` (for a pass the metric closest to its limit, for
        an undecided level the one its point estimate was decided on). None without values, or when the level
        failed on its load (``load_note``) rather than on a metric."""
        if self.load_note is not None:
            return None
        if self.verdict == "fail":
            shown = {m: (b.low / b.limit if b.limit > 0 else math.inf) for m, b in self.bounds.items()
                     if b.n >= 2 and math.isfinite(b.low) and b.low > b.limit}
            if shown:
                return max(shown, key=lambda m: shown[m])
        return self.binding

    def why(self) -> str:
        """What decided the level, for the logs and the summary: ``error_rate 0.0625 against a limit of 0.01``,
        the ``load_note``, or empty when nothing was measured."""
        if self.load_note is not None:
            return self.load_note
        m = self.decided_by
        if m is None:
            return ""
        b = self.bounds[m]
        return f"{m} {b.centre:.4g} against a limit of {b.limit:g}"

    def record(self) -> dict[str, Any]:
        """As stored in ``sla_searches.levels``: level, windows, verdict, mean throughputs, each metric's bounds."""
        def f(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else round(float(x), 6)

        return {"level": self.level, "windows": len(self.windows), "verdict": self.verdict,
                "counted_as": "pass" if self.passed else "fail", "decided_by": self.decided_by,
                "load_note": self.load_note,
                THROUGHPUT: f(self.mean(THROUGHPUT)), GOODPUT: f(self.mean(GOODPUT)),
                OUTPUT_TPS: f(self.mean(OUTPUT_TPS)), "metrics": {m: b.record() for m, b in self.bounds.items()}}


@dataclass
class SlaResult:
    """What a search found (see the module docstring).

    Attributes:
        verdict: ``found`` (``max_load`` passed, ``first_fail`` failed, within the resolution), ``met_at_max``
            (the spec's ``max`` passed), ``none`` (``start`` failed: no load searched meets the SLO) or
            ``interrupted`` (cut short: :meth:`SearchProgress.result`; ``max_load`` / ``first_fail`` are the highest
            level passed and the lowest failed above it so far, a bracket that the search had not yet narrowed).
        max_load: the highest level that passed (None for ``none``). first_fail: the lowest level that failed
            (None for ``met_at_max``). nearest_load: ``none`` only: the level tried closest to its limits.
        knee_load: :func:`knee` of the levels tried (None with fewer than 3 levels or a flat curve).
        levels: every level tried, in the order tried.
    """

    verdict: Literal["found", "met_at_max", "none", "interrupted"]
    max_load: float | None
    first_fail: float | None
    nearest_load: float | None
    knee_load: float | None
    levels: list[SlaLevelResult]
    limits: dict[str, float]
    #: ``interrupted`` only: the level being measured when the search was cut short (listed last in ``levels``).
    unjudged_load: float | None = None

    @property
    def windows(self) -> int:
        return sum(len(lv.windows) for lv in self.levels)

    @property
    def max_load_shown(self) -> bool | None:
        """True: ``max_load`` passed on its bounds; False: it was undecided at the window cap and counted as a
        pass by its point estimate only (the summary says so); None: no max load."""
        top = self.at(self.max_load)
        return None if top is None else top.verdict == "pass"

    def at(self, level: float | None) -> SlaLevelResult | None:
        return next((lv for lv in self.levels if lv.level == level), None)

    def summary(self, unit: Callable[[float], str] = lambda v: f"{v:g}") -> str:
        """One line: the max load (with goodput and throughput there), or why none, and the knee. A max load
        undecided at the window cap (accepted by its point estimate) says ``(by point estimate: ...)``, and a
        first fail that was undecided says so instead of ``fails``. The first fail names what bound the search
        (:meth:`SlaLevelResult.why`: the metric that failed it with its value and limit, or the load not
        reached)."""
        knee_txt = f"; knee at {unit(self.knee_load)}" if self.knee_load is not None else ""
        if self.verdict == "interrupted":
            cur = self.at(self.unjudged_load) if self.unjudged_load is not None else None
            return (f"interrupted after {len(self.levels)} level(s), {self.windows} windows: "
                    f"{'no level passed yet' if self.max_load is None else 'passed up to ' + unit(self.max_load)}"
                    f"{'' if self.first_fail is None else ', failed at ' + unit(self.first_fail)}"
                    f"{'' if cur is None else f', {unit(cur.level)} unjudged after {len(cur.windows)} window(s)'}"
                    f"; not a max load{knee_txt}")
        if self.verdict == "none":
            near = self.at(self.nearest_load)
            why = f": {near.why()}" if near is not None and near.why() else ""
            return (f"no load meets the SLO; nearest {unit(self.nearest_load or 0)}{why} "
                    f"({len(self.levels)} level(s), {self.windows} windows){knee_txt}")
        top = self.at(self.max_load)
        gp, tp = (top.mean(GOODPUT), top.mean(THROUGHPUT)) if top else (None, None)
        head = "met at max: " if self.verdict == "met_at_max" else ""
        how = ("" if top is None or top.verdict == "pass"
               else f" (by point estimate: undecided at the window cap of {len(top.windows)})")
        nxt = ""
        if self.first_fail is not None:
            ff = self.at(self.first_fail)
            why = ff.why() if ff is not None else ""
            nxt = (f", {unit(self.first_fail)} fails{f' ({why})' if why else ''}"
                   if ff is None or ff.verdict == "fail"
                   else f", {unit(self.first_fail)} undecided at the window cap (counted as a fail"
                        f"{f': {why}' if why else ''})")
        return (f"{head}max load under SLO {unit(self.max_load or 0)}{how}{nxt}; goodput "
                f"{'n/a' if gp is None else f'{gp:.3g} req/s'}, throughput {'n/a' if tp is None else f'{tp:.3g} req/s'}"
                f"{knee_txt} ({len(self.levels)} levels, {self.windows} windows)")


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def judge_level(windows: Sequence[Mapping[str, Any]], limits: Mapping[str, float], spec: SlaSearchSpec
                ) -> tuple[Literal["pass", "fail", "undecided"], dict[str, MetricBound]]:
    """The verdict of a level from its windows so far (module docstring).

    Per metric, one-sided bounds at ``(1 - confidence) / looks``: a latency gets a t bound on ``n - 1`` df on the
    log scale; :data:`ERROR_RATE` gets Clopper-Pearson bounds on the failed / sent requests pooled over the
    windows (:data:`FAILED`, :data:`SENT`; when some window lacks them, a t bound on the window rates, clipped to
    [0, 1]). Fail when some metric's lower bound is > its limit; pass when every latency's upper bound is <= its
    limit and the error rate's point estimate is too; else undecided (also with fewer than
    ``min_windows_per_level`` windows, or a metric with fewer than two windows with a value).

    Args:
        windows: the level's window figures (:func:`search`'s ``measure`` results), in order.
        limits: window figure -> limit (:func:`slo_limits`).
        spec: the search's spec (confidence, looks, minimum windows).

    Returns:
        (verdict, metric -> :class:`MetricBound`)."""
    alpha = (1.0 - spec.confidence) / spec.looks
    bounds: dict[str, MetricBound] = {}
    for m, limit in limits.items():
        if m == ERROR_RATE:
            bounds[m] = _error_rate_bound(windows, limit, alpha)
            continue
        vals = [math.log(float(w[m])) for w in windows if _finite(w.get(m)) and float(w[m]) > 0]
        n = len(vals)
        if n == 0:
            bounds[m] = MetricBound(m, limit, 0, math.nan, math.nan, math.nan)
            continue
        mean = sum(vals) / n
        lo, hi = _t_bounds(vals, alpha)
        bounds[m] = MetricBound(m, limit, n, math.exp(mean), math.exp(lo), math.exp(hi))
    if len(windows) < spec.min_windows_per_level:
        return "undecided", bounds
    if any(b.n >= 2 and b.low > b.limit for b in bounds.values()):
        return "fail", bounds
    if all(b.n >= 2 and (b.centre if m == ERROR_RATE else b.high) <= b.limit for m, b in bounds.items()):
        return "pass", bounds
    # Every window failed every request: no latency at all, the error rate decides (above: fail).
    return "undecided", bounds


def _t_bounds(vals: Sequence[float], alpha: float) -> tuple[float, float]:
    """One-sided t bounds (each at ``alpha``) on the mean of ``vals``; NaN with fewer than two values."""
    from scipy import stats

    n = len(vals)
    if n < 2:
        return math.nan, math.nan
    mean = sum(vals) / n
    if all(v == vals[0] for v in vals):  # no spread: the bounds are the mean (scipy warns on constant data)
        return mean, mean
    # Two one-sided bounds at alpha each = the two-sided interval at 1 - 2 alpha (scipy's t interval).
    ci = stats.ttest_1samp(list(vals), 0.0).confidence_interval(confidence_level=1.0 - 2.0 * alpha)
    return float(ci.low), float(ci.high)


def _error_rate_bound(windows: Sequence[Mapping[str, Any]], limit: float, alpha: float) -> MetricBound:
    """The error rate's :class:`MetricBound`: Clopper-Pearson on the pooled counts, else clipped t bounds."""
    from scipy import stats

    rated = [w for w in windows if _finite(w.get(ERROR_RATE))]
    n = len(rated)
    if n == 0:
        return MetricBound(ERROR_RATE, limit, 0, math.nan, math.nan, math.nan)
    if all(_finite(w.get(FAILED)) and _finite(w.get(SENT)) and float(w[SENT]) > 0 for w in rated):
        k = sum(int(round(float(w[FAILED]))) for w in rated)
        sent = sum(int(round(float(w[SENT]))) for w in rated)
        k = min(max(k, 0), sent)
        if n < 2:
            return MetricBound(ERROR_RATE, limit, n, k / sent, math.nan, math.nan)
        # Clopper-Pearson (exact) with alpha in each tail: scipy's two-sided interval at 1 - 2 alpha.
        ci = stats.binomtest(k, sent).proportion_ci(confidence_level=1.0 - 2.0 * alpha, method="exact")
        return MetricBound(ERROR_RATE, limit, n, k / sent, float(ci.low), float(ci.high))
    vals = [float(w[ERROR_RATE]) for w in rated]
    lo, hi = _t_bounds(vals, alpha)
    clip = (lambda x: x if math.isnan(x) else min(1.0, max(0.0, x)))
    return MetricBound(ERROR_RATE, limit, n, sum(vals) / n, clip(lo), clip(hi))


def load_shortfall(windows: Sequence[Mapping[str, Any]], level: float, load: Literal["concurrency", "rate"],
                   ratio: float, alpha: float = 0.05) -> str | None:
    """Why a level's windows did not reach its load, or None when they did (or did not record it).

    Concurrency: the mean over the windows of :data:`ACHIEVED_LOAD` (requests in flight while the client was
    sending) below ``ratio * level``. Rate: the send rate pooled over the windows (send intervals / their
    seconds, :data:`LOAD_INTERVALS` with :data:`ACHIEVED_LOAD`) whose one-sided upper bound at ``alpha`` (a Poisson
    process: Gamma on the intervals) is below ``ratio * level``, so that Poisson arrivals of a few requests are
    not taken for a client that fell behind; without intervals, the mean achieved rate. ``ratio`` is the quality
    gate's ``min_concurrency_ratio`` (0.9: the load reached at least 90 % of the level).

    Returns:
        ``load not reached: 3.35 of 8 in flight while sending (under 0.9 x the level)`` and the like, or None.

    Raises:
        ValueError: ``ratio`` outside [0, 1] or a level <= 0."""
    if not 0.0 <= ratio <= 1.0 or not level > 0:
        raise ValueError(f"load_shortfall: ratio must be in [0, 1] and level > 0, got ratio {ratio!r}, level {level!r}")
    got = [w for w in windows if _finite(w.get(ACHIEVED_LOAD))]
    if not got or ratio == 0:
        return None
    want = ratio * level
    if load == "concurrency":
        mean = sum(float(w[ACHIEVED_LOAD]) for w in got) / len(got)
        if mean >= want:
            return None
        return (f"load not reached: {mean:.3g} of {level:g} in flight while sending "
                f"(under {ratio:g} x the level)")
    timed = [w for w in got if _finite(w.get(LOAD_INTERVALS)) and float(w[LOAD_INTERVALS]) >= 1
             and float(w[ACHIEVED_LOAD]) > 0]
    if len(timed) == len(got):
        from scipy import stats

        k = sum(float(w[LOAD_INTERVALS]) for w in timed)
        secs = sum(float(w[LOAD_INTERVALS]) / float(w[ACHIEVED_LOAD]) for w in timed)
        rate, upper = k / secs, float(stats.gamma.ppf(1.0 - alpha, k)) / secs
    else:
        rate = upper = sum(float(w[ACHIEVED_LOAD]) for w in got) / len(got)
    if upper >= want:
        return None
    return f"load not reached: {rate:.3g} of {level:g} req/s sent (under {ratio:g} x the level)"


def knee(levels: Sequence[SlaLevelResult]) -> float | None:
    """The knee of the latency-throughput curve of the levels measured (Kneedle, Satopaa et al. 2011): with
    x = the level's mean request throughput and y = its binding SLO ratio (largest latency centre / limit),
    both scaled to 0..1 over the levels, the knee is the level maximising ``x - y``: where throughput stopped
    growing faster than latency. None with fewer than three levels with both figures, or when x or y is flat."""
    pts = sorted(((lv.level, lv.mean(THROUGHPUT), lv.slo_ratio) for lv in levels), key=lambda p: p[0])
    pts = [p for p in pts if p[1] is not None and math.isfinite(p[2])]
    if len(pts) < 3:
        return None
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    xr, yr = max(xs) - min(xs), max(ys) - min(ys)
    if xr <= 0 or yr <= 0:
        return None
    diff = [(x - min(xs)) / xr - (y - min(ys)) / yr for x, y in zip(xs, ys)]
    best = max(range(len(pts)), key=lambda i: diff[i])
    return pts[best][0] if diff[best] > 0 else None


def fixed_grid_levels(spec: SlaSearchSpec) -> list[float]:
    """The levels of a fixed geometric grid from ``start`` to ``max`` at the spec's resolution (what a sweep
    over fixed levels would need to find the max as closely): the baseline the search is measured against."""
    out, v = [], spec.start
    while v < spec.max:
        lv = spec.level(v)
        if not out or lv > out[-1]:
            out.append(lv)
        v *= 1 + spec.resolution
    if not out or out[-1] < spec.max:
        out.append(spec.level(spec.max))
    return out


def _close(spec: SlaSearchSpec, lo: float, hi: float) -> bool:
    if spec.load == "concurrency" and hi - lo <= 1:
        return True
    return hi / lo - 1 <= spec.resolution + 1e-12


def _midpoint(spec: SlaSearchSpec, lo: float, hi: float) -> float | None:
    """The geometric midpoint as a level strictly between ``lo`` and ``hi``; None when there is none."""
    mid = spec.level(math.sqrt(lo * hi))
    if spec.load == "concurrency":
        mid = min(max(mid, lo + 1), hi - 1)
    return mid if lo < mid < hi else None


@dataclass
class SearchProgress:
    """What a running :func:`search` has tried, kept up to date as it goes: the levels judged (``tried``) and the
    level being measured with its windows so far (``current``). Why: a search is minutes of a server's time, and
    one cut short (Ctrl-C, a cancel through Prefect, a server that dies) should leave a record of what it
    measured rather than windows that no row explains (an H200 session's device time ran out in the middle of one:
    its levels 32-128 were judged, the record was lost). :meth:`result` gives that record."""

    limits: dict[str, float]
    tried: list[SlaLevelResult] = field(default_factory=list)
    current: SlaLevelResult | None = None

    def result(self) -> SlaResult:
        """The search so far as an ``interrupted`` :class:`SlaResult`: ``max_load`` the highest level counted as
        passing (``SlaLevelResult.passed``), ``first_fail`` the lowest level counted as failing above it, the knee of
        the judged levels; the level in progress, if it had a window, is listed last with its verdict from its
        windows so far (judged by the same rule; it decides neither bound)."""
        passed = [lv.level for lv in self.tried if lv.passed]
        lo = max(passed) if passed else None
        above = [lv.level for lv in self.tried if not lv.passed and (lo is None or lv.level > lo)]
        levels, unjudged = list(self.tried), None
        if self.current is not None and self.current.windows and self.current not in levels:
            levels.append(self.current)
            unjudged = self.current.level
        return SlaResult("interrupted", lo, min(above) if above else None, None, knee(self.tried), levels,
                         dict(self.limits), unjudged)


def search(spec: SlaSearchSpec, limits: Mapping[str, float], measure: Callable[[float], Mapping[str, Any]],
           on_level: Callable[[SlaLevelResult], None] | None = None, *,
           min_load_ratio: float | None = None, progress: SearchProgress | None = None) -> SlaResult:
    """Grow, then bisect, the load level (module docstring).

    Args:
        spec: the plan's ``sla_search``.
        limits: window figure -> limit (:func:`slo_limits`); every figure named here is judged.
        measure: runs one measured window at a level and returns its figures: each key of ``limits`` (None or
            NaN when the window has no value, e.g. no ok request) and, for the report, :data:`THROUGHPUT`,
            :data:`GOODPUT`, :data:`OUTPUT_TPS`. What it raises ends the search.
        on_level: called with each level once judged.
        min_load_ratio: the quality gate's ``min_concurrency_ratio``: a level whose windows reached less of its
            load (:func:`load_shortfall`, from the windows' :data:`ACHIEVED_LOAD`) fails with a ``load_note``
            once it has ``min_windows_per_level`` windows. None: not checked.
        progress: kept up to date as the search goes (:class:`SearchProgress`), so that a caller whose search is
            cut short by what ``measure`` raises can still record it (``progress.result()``). None: not kept.

    Returns:
        :class:`SlaResult`.
    """
    tried: list[SlaLevelResult] = progress.tried if progress is not None else []

    def run(level: float) -> SlaLevelResult:
        lv = SlaLevelResult(level=level)
        if progress is not None:
            progress.current = lv
        while True:
            lv.windows.append(dict(measure(level)))
            lv.verdict, lv.bounds = judge_level(lv.windows, limits, spec)
            if (min_load_ratio is not None and lv.verdict != "fail"
                    and len(lv.windows) >= spec.min_windows_per_level):
                lv.load_note = load_shortfall(lv.windows, level, spec.load, min_load_ratio,
                                              (1.0 - spec.confidence) / spec.looks)
                if lv.load_note is not None:
                    lv.verdict = "fail"
                    break
            if lv.verdict != "undecided" or len(lv.windows) >= spec.max_windows_per_level:
                break
        tried.append(lv)
        if progress is not None:
            progress.current = None
        if on_level is not None:
            on_level(lv)
        return lv

    lo: float | None = None
    hi: float | None = None
    level = spec.level(spec.start)
    top = spec.level(spec.max)
    while True:
        if run(level).passed:
            lo = level
            if level >= top:
                break
            nxt = spec.level(level * spec.growth)
            level = min(top, max(nxt, level + 1) if spec.load == "concurrency" else nxt)
        else:
            hi = level
            break
    if lo is not None and hi is not None:
        while not _close(spec, lo, hi):
            mid = _midpoint(spec, lo, hi)
            if mid is None:
                break
            if run(mid).passed:
                lo = mid
            else:
                hi = mid
    k = knee(tried)
    if lo is None:
        near = min(tried, key=lambda lv: (not math.isfinite(lv.slo_ratio), lv.slo_ratio if math.isfinite(lv.slo_ratio)
                                          else 0.0, lv.level))
        return SlaResult("none", None, hi, near.level, k, tried, dict(limits))
    return SlaResult("met_at_max" if hi is None else "found", lo, hi, None, k, tried, dict(limits))
