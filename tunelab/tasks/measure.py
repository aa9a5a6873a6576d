"""Warm-up and measurement of one running server: every workload x load level x repeat.

For each (workload, load level): warm-up requests first (fresh prompts, never among the measured ones,
excluded from every number; :func:`warmup_requests_for` says how many: at least the level's concurrency, so
that every batch size the window will run was seen before it), then ``repeats`` measured windows, each with its own prompts drawn from its
own seed so the prefix cache does not serve a repeat (a workload with ``shared_prefix_tokens`` gets one
prefix, the same for every request and repeat of that workload). ``/metrics`` is scraped right before and
right after each window; the deltas are the server's view of the same window. Right before each window (so
after a level's warm-up too) the prefix cache is reset where the server allows it (``/reset_prefix_cache``,
needs ``VLLM_SERVER_DEV_MODE=1``; otherwise the fresh prompts keep the cache cold); the reset's outcome is the
window's ``prefix_cache_reset`` (:func:`reset_prefix_cache`: a 200 with ``{"success": false}`` did not take).

Control calls (``/tokenize``, ``/metrics``, the reset, ``/v1/models``) go through ``loadgen.control.control_call``:
a dropped connection is retried on a fresh one, a bounded number of times; the window counts them
(``measurements.control_retries``) and a note names them. Only a server that is gone fails the trial.

Open-loop saturation: an open-loop window (request rate, trace) whose server fell behind its arrivals
(``tasks.metrics.overload``) is ``measurements.overloaded`` and gets a note; the workload's higher levels of
that load kind are not measured (a note says so), as guidellm's ``--detect-saturation``.

Server log: given the server's log file (``server_log``), the bytes it gained during each window (file offsets
at the window's start and end) are searched for compilation and CUDA graph capture (``bootlog.compile_lines``);
``measurements.compile_during_window`` and ``compile_log_lines`` record the result and a note names it.

Checks that become notes (``MeasureResult.notes``): /metrics not scrapable; the server's
``usage.prompt_tokens`` not the same for every request of a window (prompt lengths were not exact);
the load generator's event loop lagging (p99 wake-up lateness > 5 ms) or saturated (client-bound); the server
compiling during a window; a window with more requests in flight than its warm-up reached.

Interruption: a signal handler that raises (Prefect's SIGTERM bridge raises ``TerminationSignal`` when a run is
cancelled, Ctrl-C raises ``KeyboardInterrupt``) ends the measurement at once with that exception. asyncio alone
would not do it for exceptions that are not ``KeyboardInterrupt``/``SystemExit``: raised inside a transport
callback (where the raw HTTP client spends most of its time) the loop logs and drops them, raised inside a task
they wait in the task. :func:`run_interruptible` re-raises them.

Progress: ``progress(label, done, total)`` after each measured request; :func:`progress_reporter` gives a
rich progress bar on a terminal and throttled log lines (the Prefect run logger inside a flow) otherwise.
The live display of ``tunelab run`` gets events (``tunelab.core.progress``): ``prompts`` while a window's prompts
are built, ``warmup`` and ``window`` (k of n, requests done/total) per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import sys
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pandas as pd

from tunelab.core import progress as progress_events
from tunelab.core import records as R
from tunelab.tasks import bootlog
from tunelab.tasks import host_load
from tunelab.tasks import metrics as M
from tunelab.tasks import server_metrics as SM
from tunelab.tasks.bottleneck_evidence import GaugePeaks
from tunelab.tasks.loadgen import PromptBuilder, make_client, run_level, run_sessions
from tunelab.tasks.loadgen.control import control_call, take_retries
from tunelab.core.load_profiles import RATE_WARMUP_S, LoadProfile, Schedule
from tunelab.core.plan import Plan, Workload, requests_for_level
from tunelab.core.workloads import fit_text_to_context

__all__ = ["MeasureResult", "measure_server", "run_interruptible", "window_prompts",
           "progress_logger", "progress_reporter", "warm_up", "warmup_requests_for", "ServerLogTail",
           "LOOP_LAG_NOTE_S", "SAME_READ_NOTE_FRAC", "RATE_WARMUP_S", "COMPILE_LINES_KEPT", "same_read_note"]

#: p99 event-loop wake-up lateness (seconds) above which a window gets a note: timestamps may be that stale.
LOOP_LAG_NOTE_S = 0.005
#: Fraction of inter-chunk gaps inside one read (LevelResult.same_read_itl_frac) above which a window gets a
#: note. 1 %: in the accuracy benchmark's unstressed runs it was 0 at every level up to concurrency 256.
SAME_READ_NOTE_FRAC = 0.01
#: Log lines kept per window in ``measurements.compile_log_lines``.
COMPILE_LINES_KEPT = 20


def warmup_requests_for(plan: Plan, profile: LoadProfile) -> int:
    """How many warm-up requests run before ``profile``'s measured windows (0: no warm-up).

    A server may compile a kernel or graph the first time it runs a batch of a new size (vLLM's Triton JIT,
    torch.compile for a new shape; vLLM logs "JIT compilation during inference ... latency spike"), so the
    warm-up must reach the sizes the window will run. ``plan.warmup_requests`` is a minimum that the profile
    raises (``LoadProfile.warmup_requests``: at least c requests at concurrency c; at least
    ``ceil(r x RATE_WARMUP_S)`` on the level's own arrival process at rate r). An open-loop window's in-flight
    count is random; the window records ``peak_in_flight`` and a note says when it went above the warm-up's
    peak (raise ``warmup_requests`` towards ``r x E2EL`` then). ``warmup_requests: 0`` turns the warm-up off
    (a cold-server measurement, on purpose).
    """
    return profile.warmup_requests(plan.warmup_requests)


class ServerLogTail:
    """The server's log file read window by window: :meth:`mark` at a window's start, :meth:`since_mark` at its
    end gives the text the server wrote in between (by file offsets, so log timestamps with their 1 s
    resolution and the log's clock do not matter).

    Args:
        path: the log file (``EngineServer.log_path``); None: no log (every read gives None).

    A file that is missing, unreadable or shorter than at the mark (rotated or truncated) gives None for that
    window rather than raising: the measurement never fails because of its log.
    """

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = None if path is None else Path(path)
        self._mark: int | None = None

    def _size(self) -> int | None:
        if self.path is None:
            return None
        try:
            return self.path.stat().st_size
        except OSError:
            return None

    def mark(self) -> None:
        """Remember the log's current end."""
        self._mark = self._size()

    def since_mark(self) -> str | None:
        """The text written since :meth:`mark` (decoded leniently), or None when it cannot be told."""
        start, end = self._mark, self._size()
        if start is None or end is None or end < start or self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
        except OSError:
            return None
        return data.decode("utf-8", errors="replace")


@dataclass
class MeasureResult:
    """DataFrames with the columns of the ``requests``, ``measurements`` and ``server_metrics`` records
    (``tunelab/core/records.py``, in that order; without trial_id, which the caller adds)."""

    requests: pd.DataFrame
    measurements: pd.DataFrame
    server_metrics: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


# Shared prefixes per builder (one server), per (workload name, prefix tokens).
_PREFIXES: "weakref.WeakKeyDictionary[PromptBuilder, dict[tuple[str, int], str]]" = weakref.WeakKeyDictionary()


async def window_prompts(builder: PromptBuilder, w: Workload, n: int, seed: int) -> list[str]:
    """``n`` prompts of exactly ``w.prompt_tokens`` tokens for one window, drawn from ``seed``.

    Different seeds give different prompts (each repeat and the warm-up get their own seed). With
    ``w.shared_prefix_tokens`` every prompt starts with the same prefix of that many tokens, derived from the
    workload's name only, so it is shared across requests and repeats (a prefix-cache workload).

    Raises:
        loadgen.PromptLengthError: the server's tokenizer cannot be matched exactly.
    """
    prefix = ""
    if w.shared_prefix_tokens:
        cache = _PREFIXES.setdefault(builder, {})
        key = (w.name, w.shared_prefix_tokens)
        if key not in cache:
            cache[key], _ = await builder.exact(w.shared_prefix_tokens, random.Random(_seed("prefix", w.name)))
        prefix = cache[key]
    # Built a chunk at a time (loadgen.PromptBuilder.iter_many), each chunk reported to the live display. The
    # window's prompts are all built before it starts: building them while it runs would put /tokenize calls on
    # the server being measured; the plan's limits bound a window's size (tunelab.core.plan.MAX_WINDOW_*).
    out: list[str] = []
    async for p in builder.iter_many(n, w.prompt_tokens, random.Random(seed), prefix=prefix):
        out.append(p)
        if len(out) % 256 == 0 or len(out) == n:
            progress_events.emit("prompts", done=len(out), total=n)
    return out


@dataclass
class WindowRequests:
    """The requests of one window, in send order: ``prompts`` (text), ``max_tokens`` (one per prompt, tokens)
    and ``arrivals_s`` (the workload's own send offsets, seconds, for the ``trace`` load profile; None when
    the workload has none)."""

    prompts: list[str]
    max_tokens: list[int]
    arrivals_s: list[float] | None


async def window_requests(builder: PromptBuilder, w: Workload, n: int, seed: int,
                          context_tokens: int | None = None) -> WindowRequests:
    """The ``n`` requests of one window of ``w``, drawn from ``seed`` by the workload's type
    (``tunelab.core.workloads``: ``w.profile.request_specs``): a prompt of each spec's exact length built with the
    server's tokenizer (a workload of one prompt length: :func:`window_prompts`, the same prompts as before the
    workload types), or the spec's text (a dataset); ``max_tokens`` the spec's output length, or the token count
    of a dataset's reference answer (counted by the server's tokenizer) capped at it.

    Args:
        context_tokens: the model's max-model-len (``/v1/models``), lengths are clipped to it; None: no clip.

    Raises:
        loadgen.PromptLengthError: the server's tokenizer cannot be matched exactly.
    """
    specs = w.profile.request_specs(n, seed, context_tokens)
    arrivals = [s.arrival_offset_s for s in specs]
    arrivals_s = None if any(a is None for a in arrivals) else [float(a) for a in arrivals]  # type: ignore[arg-type]
    if w.profile.exact_prompt_tokens is not None:
        return WindowRequests(await window_prompts(builder, w, n, seed), [s.output_tokens for s in specs], arrivals_s)
    sem = asyncio.Semaphore(builder.parallel)
    done = [0]

    async def one(i: int) -> tuple[str, int]:
        sp = specs[i]
        async with sem:
            if sp.prompt_text is not None:
                text = sp.prompt_text
            else:
                # Each request's own seeded stream: the same prompt whatever order the builds finish in.
                text = (await builder.many(1, int(sp.prompt_tokens or 1), random.Random(_seed(seed, i))))[0]
            out = sp.output_tokens
            if sp.output_text is not None:
                out = max(1, min(out, await builder.count(sp.output_text)))
            if sp.prompt_text is not None and context_tokens is not None:  # a dataset's text: fit the context
                text, out, _clipped = await fit_text_to_context(text, out, context_tokens, builder.count)
        done[0] += 1
        if done[0] % 64 == 0 or done[0] == n:
            progress_events.emit("prompts", done=done[0], total=n)
        return text, out

    got = await asyncio.gather(*(one(i) for i in range(n)))
    return WindowRequests([g[0] for g in got], [g[1] for g in got], arrivals_s)


async def _run_sessions_window(client: httpx.AsyncClient, model: str, w: Workload, lv: Any, reqs: WindowRequests,
                               on_done: Callable[[], None], common: dict[str, Any]) -> Any:
    """One window of a multi-turn workload (``tunelab.core.workloads.MultiTurnWorkload``): its requests' prompts
    are the sessions' user messages in session order; ``loadgen.run_sessions`` runs them at the level's
    concurrency with the workload's think time. Each record carries its ``request_index`` (position in
    session order)."""
    prof = w.profile
    if lv.target_concurrency is None:
        raise ValueError(f"workload {w.name!r} (multi_turn) needs a concurrency load level (sessions in flight), "
                         f"got {lv.label}; use concurrency: [...]")
    turns = prof.turns  # type: ignore[union-attr]
    sessions = [reqs.prompts[k:k + turns] for k in range(0, len(reqs.prompts), turns)]
    res = await run_sessions(client, model, sessions, reqs.max_tokens, int(lv.target_concurrency or 1),
                             think_time_s=prof.think_time_s, ignore_eos=common["ignore_eos"],  # type: ignore[union-attr]
                             timeout_s=common["timeout_s"], on_done=on_done)
    for r in res.records:
        r["request_index"] = r["session_index"] * turns + r["turn"]
    return res


def turn_summary(requests: pd.DataFrame) -> list[str]:
    """One line per turn of a multi-turn window's derived requests (columns ``turn``, ``ok``,
    ``prompt_tokens``, ``cached_prompt_tokens``, ``ttft_s``): requests, mean prompt tokens, mean prompt tokens
    served from the prefix cache (``n/a`` when the server did not report them: it needs
    ``--enable-prompt-tokens-details``) and TTFT p50, e.g. ``turn 1: 2 requests, prompt 358 tokens, cached 256
    (71 %), TTFT p50 39.0 ms``. The warehouse view ``turn_prefix_cache`` holds the same per turn."""
    out = []
    for turn, g in requests.groupby("turn", sort=True):
        ok = g[g["ok"].astype(bool)]
        prompt = ok["prompt_tokens"].dropna().astype(float)
        cached = ok["cached_prompt_tokens"].dropna().astype(float)
        ttft = ok["ttft_s"].dropna().astype(float)
        cache = (f"cached {cached.mean():.0f} ({100 * cached.sum() / prompt.sum():.0f} %)"
                 if len(cached) and len(prompt) and prompt.sum() > 0 else "cached n/a")
        out.append(f"turn {int(turn)}: {len(g)} requests ({len(ok)} ok), prompt "
                   f"{prompt.mean() if len(prompt) else float('nan'):.0f} tokens, {cache}, TTFT p50 "
                   f"{1000 * ttft.median() if len(ttft) else float('nan'):.1f} ms")
    return out


async def _context_tokens(client: httpx.AsyncClient, model: str) -> int | None:
    """The served model's ``max_model_len`` from ``/v1/models`` (vLLM's ModelCard), or None when the server
    does not say."""
    try:
        r = await control_call(client, "GET", "/v1/models")
        for card in r.json().get("data", []):
            if card.get("id") == model and isinstance(card.get("max_model_len"), int):
                return int(card["max_model_len"])
    except Exception:  # a server without the field: lengths are not clipped, the plan's check still holds
        return None
    return None


def run_interruptible(coro: Any) -> Any:
    """``asyncio.run(coro)``, except that a ``BaseException`` that is not an ``Exception`` (a signal handler's
    ``TerminationSignal``, ``KeyboardInterrupt``) raised anywhere in the loop ends the run and is re-raised.

    Without this, Prefect's cancellation (SIGTERM -> ``TerminationSignal``) landing in a transport callback is
    logged by the loop's exception handler and dropped, and the measurement runs to its end (seen before the
    fix: a cancelled run measured on and then finished)."""
    caught: list[BaseException] = []

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()

        def on_error(loop_: asyncio.AbstractEventLoop, context: dict) -> None:
            exc = context.get("exception")
            if isinstance(exc, BaseException) and not isinstance(exc, (Exception, asyncio.CancelledError)):
                if not caught:
                    caught.append(exc)
                    if me is not None:
                        me.cancel()
                return
            loop_.default_exception_handler(context)

        loop.set_exception_handler(on_error)
        return await coro

    try:
        out = asyncio.run(main())
    except BaseException as e:
        if caught and (isinstance(e, asyncio.CancelledError) or e is not caught[0]):
            raise caught[0] from None
        raise
    if caught:
        raise caught[0]
    return out


@contextlib.contextmanager
def progress_reporter(logger: Any | None = None, min_interval_s: float = 2.0) -> Iterator[Callable[[str, int, int], None]]:
    """A ``progress(label, done, total)`` callback for :func:`measure_server`.

    On a terminal (``sys.stdout.isatty()``): a rich progress bar, one task per window. Otherwise: log lines
    at most every ``min_interval_s`` seconds and at the end of each window, to ``logger`` (default: the
    Prefect run logger inside a flow or task run, else the ``tunelab.measure`` logger).
    """
    if sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        tasks: dict[str, Any] = {}
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      transient=False) as bar:

            def cb(label: str, done: int, total: int) -> None:
                if label not in tasks:
                    tasks[label] = bar.add_task(label, total=total)
                bar.update(tasks[label], completed=done)

            yield cb
        return
    if logger is None:
        try:
            from prefect.logging import get_run_logger

            logger = get_run_logger()
        except Exception:  # outside a flow/task run (MissingContextError) or prefect absent
            logger = logging.getLogger("tunelab.measure")
    yield progress_logger(logger, min_interval_s)


def progress_logger(logger: Any, min_interval_s: float = 2.0) -> Callable[[str, int, int], None]:
    """A ``progress(label, done, total)`` callback that logs ``"<label>: <done>/<total> requests"`` to ``logger``
    at most every ``min_interval_s`` seconds (monotonic clock), and always at the end of a window
    (``done == total``): enough for the Prefect UI, quiet in the logs. The first call always logs."""
    last = {"t": float("-inf")}

    def log_cb(label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last["t"] >= min_interval_s:
            last["t"] = now
            logger.info("%s: %d/%d requests", label, done, total)

    return log_cb


async def _scrape(client: httpx.AsyncClient) -> Any | None:
    try:
        r = await control_call(client, "GET", "/metrics", timeout=10)
        return SM.snapshot(r.text) if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


#: ``measurements.prefix_cache_reset`` of a reset the server confirmed (HTTP 200, no ``"success": false``).
RESET_OK = "ok"


async def reset_prefix_cache(client: httpx.AsyncClient) -> str:
    """``POST /reset_prefix_cache`` and what came of it, for ``measurements.prefix_cache_reset``.

    Returns:
        :data:`RESET_OK`; ``'not_taken: ...'`` when the server answered 200 with ``{"success": false}`` (vLLM
        refuses a reset while requests still hold cache blocks, PR 12284; llm-d-benchmark PR 1918 reads the body
        for this reason); ``'unavailable: HTTP <code>'`` (vLLM serves the endpoint only with
        ``VLLM_SERVER_DEV_MODE=1``); ``'error: <type>: <text>'`` when no answer came (after the control call's
        retries, ``loadgen.control``). Never raises: a window without a reset is measured and says so.
    """
    try:
        r = await control_call(client, "POST", "/reset_prefix_cache", timeout=10)
    except httpx.HTTPError as e:
        return f"error: {type(e).__name__}: {e}"
    if r.status_code != 200:
        return f"unavailable: HTTP {r.status_code} (vLLM serves it with VLLM_SERVER_DEV_MODE=1)"
    try:
        body = r.json()
    except ValueError:  # vLLM answers an empty 200 when the reset took
        body = None
    if isinstance(body, dict) and body.get("success") is False:
        return "not_taken: the server answered 200 with success=false"
    return RESET_OK


async def warm_up(client: Any, builder: PromptBuilder, model: str, plan: Plan, w: Workload, lv: LoadProfile,
                  context_tokens: int | None, log: ServerLogTail, load_processes: int,
                  common: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """The warm-up before a load level's measured windows: :func:`warmup_requests_for` requests (none when 0) with
    prompts of their own seed (never among the measured ones; excluded from every number), at the level's
    concurrency or rate and with the window's load processes, so the batch sizes the windows will run are compiled
    before they start. Logs when the server compiled during it (``log``: the server's log tail).

    Returns:
        ``({"warmup_requests": n, "warmup_peak_in_flight": k}, pace_per_s)``: what the windows record, and the
        requests per second the warm-up kept (sizes a duration window's prompts; None without a warm-up).
    """
    n_warm = warmup_requests_for(plan, lv)
    warm = {"warmup_requests": n_warm, "warmup_peak_in_flight": 0}
    pace_per_s: float | None = None  # requests/s the warm-up kept: sizes a duration window's prompts
    if n_warm:
        # Warm-up: its own seed, so none of its prompts is among the measured ones; excluded. At the
        # level's concurrency (and with the window's load processes), so the batch sizes the window
        # will run are compiled before it starts.
        progress_events.emit("prompts", done=0, total=n_warm, label=f"{w.name} {lv.label} warm-up")
        wr = await window_requests(builder, w, n_warm, _seed(plan.seed, w.name, lv.seed_key, "warmup"),
                                   context_tokens)
        wp = wr.prompts
        log.mark()
        warm_done = [0]

        def warm_tick(warm_done=warm_done, n=len(wp), label=f"{w.name} {lv.label} warm-up"):
            warm_done[0] += 1
            progress_events.emit("warmup", done=warm_done[0], total=n, label=label)

        progress_events.emit("warmup", done=0, total=len(wp), label=f"{w.name} {lv.label} warm-up")
        if getattr(w.profile, "has_sessions", False):
            wres = await _run_sessions_window(client, w.adapter or model, w, lv, wr, warm_tick, common)
        else:
            wres = await run_level(client, w.adapter or model, wp, max_tokens=wr.max_tokens,
                                   schedule=lv.schedule(len(wp), _seed(plan.seed, "wa"),
                                                        workload_arrivals_s=wr.arrivals_s),
                                   on_done=warm_tick, processes=load_processes, **common)
        warm["warmup_peak_in_flight"] = M.in_flight([r.get("send_ts") for r in wres.records],
                                                    [r.get("end_ts") for r in wres.records])[0] or 0
        pace_per_s = len(wres.records) / wres.wall_s if wres.wall_s > 0 else None
        wlines = bootlog.compile_lines(log.since_mark() or "")
        if wlines:
            logging.getLogger("tunelab.measure").info(
                "%s %s warm-up: the server compiled (%d log lines), as a warm-up is for", w.name,
                lv.label, len(wlines))
    return warm, pace_per_s


#: A count window (no ``window: duration_s``) is staggered only when it holds at least this many waves of c
#: requests; a duration window always (its prompts are sized for the whole duration).
STAGGER_MIN_WAVES = 4


def stagger_schedule(sched: Schedule, plan: Plan, pace_per_s: float | None, duration_s: float | None) -> Schedule:
    """A closed-loop window's schedule with staggered starts (``plan.closed_loop_start`` 'staggered'): the c slots'
    first requests spread over one request's duration, ``c / pace_per_s`` seconds (Little's law on the warm-up: c in
    flight at ``pace_per_s`` requests per second), at most half a duration window. Unchanged for an open loop, for
    'together', without a pace (no warm-up), and for a count window of fewer than :data:`STAGGER_MIN_WAVES` x c
    requests. Why: equal-length requests sent together run in lockstep waves
    (``core.load_profiles.Schedule.stagger_s``)."""
    if not sched.closed_loop or plan.closed_loop_start != "staggered" or not pace_per_s or pace_per_s <= 0:
        return sched
    if duration_s is None and sched.n_requests < STAGGER_MIN_WAVES * (sched.slots or 1):
        # A short count window (a few waves) would spend most of its requests joining: its steady part, the
        # part its figures count, would shrink to nothing. Lockstep shows in windows of many waves.
        return sched
    stagger = float(sched.slots or 1) / pace_per_s
    if duration_s is not None:
        stagger = min(stagger, duration_s / 2)
    return replace(sched, stagger_s=stagger) if sched.slots and sched.slots > 1 and stagger > 0 else sched


@dataclass
class _Window:
    """One measured window before it runs: its label and progress fields, its requests and their schedule."""

    label: str
    fields: dict[str, int]
    reqs: WindowRequests
    sched: Any


@dataclass
class _Observed:
    """What was seen while one window ran: the load generator's result, the prefix-cache reset's outcome, the
    /metrics pages before and after (None when not scrapable), the gauges' peaks, the server log's share,
    the host's and the server's CPU, and the control calls retried."""

    res: Any
    reset: str
    before: Any
    after: Any
    gauges: Any
    log_text: str | None
    host: dict[str, Any]
    proc_cpu: dict[str, Any] | None
    retried: list[str]


@dataclass
class _Rows:
    """The rows measured so far (requests, measurements, server_metrics) and the notes."""

    requests: list[dict] = field(default_factory=list)
    measurements: list[dict] = field(default_factory=list)
    server_metrics: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def result(self) -> MeasureResult:
        return _result(self.requests, self.measurements, self.server_metrics, self.notes)


def _skipped_as_overloaded(w: Workload, lv: LoadProfile, overloaded_at: dict[str, float], notes: list[str]) -> bool:
    """True (with a note) for a level past the first one of its open-loop kind that overloaded the server:
    guidellm's --detect-saturation: a higher rate only fills the queue faster; its windows would measure the
    queue, not the rate."""
    if lv.kind in overloaded_at and lv.value > overloaded_at[lv.kind]:
        notes.append(f"{w.name} {lv.label}: not measured: the server was overloaded at {lv.kind} "
                     f"{overloaded_at[lv.kind]:g} (quality check overloaded)")
        return True
    return False


async def _prepare_window(builder: PromptBuilder, plan: Plan, w: Workload, lv: LoadProfile, seed: int,
                          label: str, fields: dict[str, int], duration_s: float | None, pace_per_s: float | None,
                          context_tokens: int | None) -> _Window:
    """The window's requests (prompts of its own ``seed``) and schedule: a count window sends the level's
    request count; a duration window as many as its duration needs at the warm-up's pace."""
    if duration_s is None:
        n_req = requests_for_level(plan, w, lv)
        progress_events.emit("prompts", done=0, total=n_req, label=label, **fields)
        reqs = await window_requests(builder, w, n_req, seed, context_tokens)
        # The workload's own arrival times (a trace) go to every profile; only a trace level uses them.
        sched = lv.schedule(n_req, seed, workload_arrivals_s=reqs.arrivals_s)
    else:
        sched = lv.duration_schedule(duration_s, seed, pace_per_s)
        progress_events.emit("prompts", done=0, total=sched.n_requests, label=label, **fields)
        reqs = await window_requests(builder, w, sched.n_requests, seed, context_tokens)
    if not getattr(w.profile, "has_sessions", False):  # chat sessions keep their own pacing
        sched = stagger_schedule(sched, plan, pace_per_s, duration_s)
    return _Window(label, fields, reqs, sched)


async def _run_window(client: Any, model: str, w: Workload, lv: LoadProfile, win: _Window, common: dict[str, Any],
                      load_processes: int, log: ServerLogTail, server_pid: int | None,
                      progress: Callable[[str, int, int], None] | None) -> _Observed:
    """Run one window and observe it: the prefix-cache reset and a /metrics scrape right before it, the host's
    and the server's CPU and the gauges during it, the server log's share and a scrape right after it."""
    prompts = win.reqs.prompts
    done = [0]

    def tick(label=win.label, done=done, n=len(prompts), wfields=win.fields):
        done[0] += 1
        if progress:
            progress(label, done[0], n)
        progress_events.emit("window", done=done[0], total=n, label=label, **wfields)

    progress_events.emit("window", done=0, total=len(prompts), label=win.label, **win.fields)
    # Right before the window, so it covers the warm-up too (its prompts, and a shared prefix the warm-up
    # cached): the window starts cold, and the outcome is the window's.
    reset = await reset_prefix_cache(client)
    before = await _scrape(client)
    log.mark()
    host0 = host_load.HostSample.read()
    procs0 = host_load.ServerProcSample.read(server_pid)  # the server's CPU by role (diagnosis)
    gauges = GaugePeaks(client)  # KV usage and waiting requests during the window
    gauges.start()
    if getattr(w.profile, "has_sessions", False):
        res = await _run_sessions_window(client, w.adapter or model, w, lv, win.reqs, tick, common)
    else:
        # A LoRA workload names its adapter as the request's model (prompts use the base's tokenizer).
        res = await run_level(client, w.adapter or model, prompts, max_tokens=win.reqs.max_tokens,
                              schedule=win.sched, on_done=tick, processes=load_processes, **common)
    text = log.since_mark()
    host = host_load.covariates(host0)  # other processes' CPU, steal, frequency in the window
    proc_cpu = host_load.server_process_cpu(procs0, host_load.ServerProcSample.read(server_pid))
    await gauges.stop()
    after = await _scrape(client)
    # Control calls (prompts' /tokenize, the reset, the scrapes) retried since the last window.
    retried = take_retries(client)
    return _Observed(res, reset, before, after, gauges, text, host, proc_cpu, retried)


def _request_rows(w: Workload, win: _Window, obs: _Observed, ident: dict[str, Any]) -> list[dict]:
    """One derived ``requests`` row per request of the window (``tasks.metrics.derive_request``)."""
    derived = []
    for i, raw in enumerate(obs.res.records):
        # A multi-turn window's records carry their own index (a failed turn ends its session).
        i = raw.get("request_index", i)
        raw = {**raw, **ident, "request_index": i, "requested_output_tokens": win.reqs.max_tokens[i],
               "ignore_eos": w.ignore_eos}
        derived.append(M.derive_request(raw))
    return derived


def _measurement_row(w: Workload, ident: dict[str, Any], agg: dict[str, Any], obs: _Observed, over: Any,
                     warm: dict[str, Any], clines: list[str] | None, duration_s: float | None,
                     pins: dict[str, Any]) -> dict[str, Any]:
    """The window's ``measurements`` row: its aggregates and everything known about how it ran."""
    res = obs.res
    return {**ident, **agg, "window_duration_s": duration_s, **obs.host, **pins, "rx_stamps": res.rx_stamps,
            "read_delay_p99_s": res.read_delay_p99_s,
            "loop_lag_p99_s": res.loop_lag_p99_s,
            "same_read_itl_frac": res.same_read_itl_frac(),
            "load_processes": res.processes, **warm,
            "server_process_cpu": json.dumps(obs.proc_cpu, sort_keys=True) if obs.proc_cpu else None,
            "compile_during_window": None if clines is None else bool(clines),
            "compile_log_lines": "\n".join(clines[:COMPILE_LINES_KEPT]) if clines else None,
            "prefix_cache_reset": obs.reset, "unique_prompts": _unique_prompts(w),
            "control_retries": len(obs.retried),
            "overloaded": None if over is None else over.overloaded}


def _notes_of_window(label: str, w: Workload, lv: LoadProfile, plan: Plan, df: pd.DataFrame, agg: dict[str, Any],
                     win: _Window, obs: _Observed, over: Any, warm: dict[str, Any],
                     clines: list[str] | None) -> list[str]:
    """What the window's figures need said beside them, in this order: overload, a reset that did not take,
    control calls retried, the window's own checks, its steady part, the warm-up's coverage, a client that fell
    behind, /metrics not scraped."""
    res, notes = obs.res, []
    if over is not None and over.overloaded:
        notes.append(f"{label}: overloaded: the server fell behind the arrivals ({over.describe()}); "
                     "its latencies are a growing queue's, not this rate's; left out of comparisons")
    if obs.reset != RESET_OK and not obs.reset.startswith("unavailable"):
        notes.append(f"{label}: prefix-cache reset before the window: {obs.reset}; the window may "
                     "not start cold (quality check cache_not_cold)")
    if obs.retried:
        notes.append(f"{label}: {len(obs.retried)} control call(s) retried on a fresh connection: "
                     + "; ".join(obs.retried[:3]))
    notes.extend(_window_notes(label, df, res, lv, w.profile.exact_prompt_tokens is not None))
    notes.extend(_steady_notes(label, agg, win.sched, res))
    notes.extend(_warmup_notes(label, agg, warm, clines, plan))
    if agg.get("client_bound") and res.client_cpu_frac < M.CLIENT_BOUND_CPU_FRAC:
        notes.append(f"{label}: client-bound: while it still had requests to send, the client kept "
                     f"{agg['in_flight_while_sending']:.2f} of {int(lv.target_concurrency or 0)} in flight; "
                     f"{_client_advice(res, lv.target_concurrency)}")
    if obs.before is None or obs.after is None:
        notes.append(f"{label}: /metrics could not be scraped")
    return notes


def _record_window(rows: _Rows, plan: Plan, w: Workload, lv: LoadProfile, rep: int, win: _Window, obs: _Observed,
                   warm: dict[str, Any], slo: dict[str, float], duration_s: float | None,
                   pins: dict[str, Any]) -> Any:
    """Add one observed window to ``rows``: its requests (:func:`_request_rows`), its aggregates
    (``tasks.metrics.aggregate``) as its ``measurements`` row (:func:`_measurement_row`), its ``server_metrics``
    rows (the /metrics deltas and gauge peaks) and its notes (:func:`_notes_of_window`).

    Returns:
        The open-loop overload check (``tasks.metrics.overload``); None for a closed-loop level, which cannot
        outrun the server (it sends when a slot frees).
    """
    clines = None if obs.log_text is None else bootlog.compile_lines(obs.log_text)
    ident = R.measurement_key(w.name, lv.kind, lv.value, rep)
    derived = _request_rows(w, win, obs, ident)
    df = pd.DataFrame(derived)
    if getattr(w.profile, "has_sessions", False):
        for line in turn_summary(df):
            logging.getLogger("tunelab.measure").info("%s: %s", win.label, line)
    agg = M.aggregate(df, slo or None, client_cpu_frac=obs.res.client_cpu_frac, target=lv.target_concurrency,
                      staggered=win.sched.stagger_s > 0)
    over = M.overload(df) if lv.target_concurrency is None else None
    row = _measurement_row(w, ident, agg, obs, over, warm, clines, duration_s, pins)
    # Closed loop: over how many seconds the slots' first sends were spread (0: together); None: open loop, sessions.
    row["stagger_s"] = (win.sched.stagger_s if win.sched.closed_loop and not getattr(w.profile, "has_sessions", False)
                        else None)
    rows.measurements.append(row)
    rows.requests.extend(derived)
    rows.notes.extend(_notes_of_window(win.label, w, lv, plan, df, agg, win, obs, over, warm, clines))
    if obs.before is not None and obs.after is not None:
        rows.server_metrics.extend(SM.window_rows(obs.before, obs.after, ident))
        rows.server_metrics.extend(obs.gauges.rows(ident))
    return over


def _cpu_pins(plan: Plan) -> dict[str, str | None]:
    """The plan's CPU pinning as recorded on every window (``server_cpus``, ``load_cpus``; None when not pinned)."""
    aff = plan.cpu_affinity
    return {"server_cpus": None if aff is None or aff.server is None else host_load.format_cpus(aff.server_cpus()),
            "load_cpus": None if aff is None or aff.load is None else host_load.format_cpus(aff.load_cpus())}


async def _measure(
    base_url: str,
    api_key: str,
    model: str,
    plan: Plan,
    progress: Callable[[str, int, int], None] | None,
    load_processes: int = 1,
    server_log: str | os.PathLike | None = None,
    on_window: Callable[[MeasureResult], None] | None = None,
    server_pid: int | None = None,
    first_repeat: int = 0,
) -> MeasureResult:
    """The measurement's loop (see :func:`measure_server`): per workload and load level (unless skipped as past an
    overloaded one, :func:`_skipped_as_overloaded`), :func:`warm_up`, then each repeat's window:
    :func:`_prepare_window`, :func:`_run_window`, :func:`_record_window`; ``on_window`` after each."""
    levels = plan.load_profiles()
    n_windows = len(plan.workloads) * len(levels) * plan.repeats
    k_window = 0
    max_conc = int(max([lv.target_concurrency for lv in levels if lv.target_concurrency] or [1]))
    rows = _Rows()
    slo = {k: v for k, v in plan.slo.model_dump().items() if v is not None}
    duration_s = plan.window.duration_s if plan.window else None
    pins = _cpu_pins(plan)
    log = ServerLogTail(server_log)
    async with make_client(base_url, api_key, max(max_conc, 64)) as client:
        builder = PromptBuilder(client, model)
        context_tokens = await _context_tokens(client, model)
        for w in plan.workloads:
            overloaded_at: dict[str, float] = {}  # open-loop load kind -> first level that overloaded the server
            for lv in levels:
                if _skipped_as_overloaded(w, lv, overloaded_at, rows.notes):
                    continue
                common = dict(endpoint=w.endpoint, ignore_eos=w.ignore_eos, timeout_s=plan.request_timeout_s)
                warm, pace_per_s = await warm_up(client, builder, model, plan, w, lv, context_tokens, log,
                                                 load_processes, common)
                for rep in range(first_repeat, first_repeat + plan.repeats):
                    k_window += 1
                    label = f"{w.name} {lv.label} repeat {rep + 1}/{first_repeat + plan.repeats}"
                    win = await _prepare_window(builder, plan, w, lv, _seed(plan.seed, w.name, lv.seed_key, rep),
                                                label, dict(window_index=k_window, windows_total=n_windows),
                                                duration_s, pace_per_s, context_tokens)
                    obs = await _run_window(client, model, w, lv, win, common, load_processes, log, server_pid,
                                            progress)
                    over = _record_window(rows, plan, w, lv, rep, win, obs, warm, slo, duration_s, pins)
                    if over is not None and over.overloaded:
                        overloaded_at.setdefault(lv.kind, lv.value)
                    if duration_s is not None:
                        # A duration window keeps its pace for a later repeat: its own requests / seconds sending.
                        pace_per_s = len(obs.res.records) / duration_s
                    if on_window is not None:
                        # The windows so far, for the caller to keep on disk now (a killed trial keeps them).
                        on_window(rows.result())
    return rows.result()


def _unique_prompts(w: Workload) -> bool:
    """True when no two prompts of the workload's windows share a prefix by design: generated prompts of an exact
    length without ``shared_prefix_tokens``, not multi-turn (a session's turns repeat its history); a dataset's
    texts may share one (``cache_not_cold`` is not judged on it)."""
    return (w.profile.exact_prompt_tokens is not None and not w.shared_prefix_tokens
            and not getattr(w.profile, "has_sessions", False))


def _result(req_rows: list[dict], meas_rows: list[dict], sm_rows: list[dict], notes: list[str]) -> MeasureResult:
    """The rows through their records (tunelab/core/records.py): every column, in table order, of the right type."""
    no_id = ("trial_id",)  # the trial flow's bundle writer adds it
    return MeasureResult(R.frame(R.Request, pd.DataFrame(req_rows), without=no_id),
                         R.frame(R.Measurement, pd.DataFrame(meas_rows), without=no_id),
                         R.frame(R.ServerMetric, pd.DataFrame(sm_rows), without=no_id), list(notes))


def _client_advice(res: Any, concurrency: float | None) -> str:
    """What to do about a client that fell behind: more load processes only help a client that was busy
    itself and has concurrency to split; a client that used little CPU was waiting for one."""
    if res.client_cpu_frac < 0.5:
        return (f"the client's loop used only {res.client_cpu_frac:.2f} of a core, so it waited for a CPU: the "
                "machine is oversubscribed (e.g. a CPU vLLM server on the same cores); more load processes will "
                "not help")
    if concurrency is not None and concurrency < 2:
        return "at concurrency 1 the load runs in one process whatever load_processes says"
    return "raise the plan's load_processes"


def same_read_note(res: Any, concurrency: float | None = None) -> str | None:
    """A note when more than :data:`SAME_READ_NOTE_FRAC` of a window's inter-chunk gaps fell inside one read
    (``LevelResult.same_read_itl_frac``), saying which side it was: the client, when it read at least once
    later than the window's median non-zero gap (late enough to find two chunks that the server wrote an
    ITL apart; those then share the later arrival stamp); else the server, which wrote them together (the
    0 s gaps are then true). None below the threshold."""
    same = res.same_read_itl_frac()
    if same is None or same <= SAME_READ_NOTE_FRAC:
        return None
    gap, late = res.median_nonzero_gap_s(), res.read_delay_max_s
    head = f"{same:.1%} of inter-chunk gaps fell inside one read (0 s ITL)"
    if late is not None and gap is not None and late < gap:
        return (f"{head}: the server sent those chunks together (the client read within {late * 1e3:.2f} ms, "
                f"under the median gap of {gap * 1e3:.2f} ms)")
    lateness = "" if late is None else f" (read up to {late * 1e3:.1f} ms late)"
    return (f"{head}: the client fell behind{lateness}; those chunks carry the later one's arrival stamp, so "
            f"TTFT/ITL of those requests are coarse; {_client_advice(res, concurrency)}")


def _steady_notes(label: str, agg: dict, sched: Any, res: Any) -> list[str]:
    """Notes on the window's steady part: none at all, and a duration window that ran out of prompts."""
    out = []
    if agg.get("steady_state") is False:
        out.append(f"{label}: no steady part (the target load never held while requests remained: no more "
                   "requests than slots?); its figures count the whole window, ramp and drain included. Raise "
                   "num_requests or requests_per_concurrency, or use window: {duration_s: ...}")
    if sched.send_until_s is not None and sched.closed_loop and len(res.records) >= sched.n_requests:
        out.append(f"{label}: the duration window ran out of its {sched.n_requests} prompts before "
                   f"{sched.send_until_s:g} s: it ended early (the server was faster than its warm-up)")
    return out


def _warmup_notes(label: str, agg: dict, warm: dict, clines: list[str] | None, plan: Plan) -> list[str]:
    """Notes on what the warm-up did not cover: compilation in the window, more in flight than warmed up."""
    out = []
    if clines:
        out.append(f"{label}: the server compiled during the measured window ({len(clines)} log line(s), first: "
                   f"{clines[0][:200]!r}); its latencies include that cost. The warm-up ran "
                   f"{warm['warmup_requests']} request(s) reaching {warm['warmup_peak_in_flight']} in flight")
    peak = agg.get("peak_in_flight")
    if warm["warmup_requests"] and peak is not None and peak > warm["warmup_peak_in_flight"]:
        out.append(f"{label}: {peak} requests in flight in the window, more than the warm-up's "
                   f"{warm['warmup_peak_in_flight']}: batch sizes above that were first run while measuring; "
                   f"raise warmup_requests (now {plan.warmup_requests})")
    return out


def _window_notes(label: str, df: pd.DataFrame, res: Any, lv: LoadProfile, one_prompt_length: bool = True) -> list[str]:
    out = []
    conc = lv.target_concurrency
    pt = df.loc[df["ok"].astype(bool), "prompt_tokens"].dropna()
    if one_prompt_length and pt.nunique() > 1:  # workloads of varying lengths (tunelab.core.workloads) vary on purpose
        out.append(f"{label}: server counted {pt.nunique()} different prompt lengths "
                   f"({int(pt.min())}..{int(pt.max())} tokens): prompts were not all of the exact length")
    kernel = res.rx_stamps == "kernel"
    if not kernel:
        out.append(f"{label}: receive timestamps are read times ({res.rx_stamps}), not the kernel's: each can "
                   "be as late as the event loop was")
    if res.loop_lag_p99_s > LOOP_LAG_NOTE_S:
        # With kernel receive stamps a busy loop no longer makes chunk stamps late, but it still sends
        # requests late (a lower offered load than asked for).
        out.append(f"{label}: load generator event loop lagged (p99 {res.loop_lag_p99_s * 1e3:.1f} ms, max "
                   f"{res.loop_lag_max_s * 1e3:.1f} ms): "
                   + ("requests may have been sent that late (receive stamps are the kernel's)" if kernel
                      else "timestamps may be that late") + f"; {_client_advice(res, conc)}")
    same = same_read_note(res, conc)
    if same:
        out.append(f"{label}: {same}")
    if res.client_cpu_frac >= M.CLIENT_BOUND_CPU_FRAC:
        out.append(f"{label}: client-bound: load generator loop used {res.client_cpu_frac:.2f} of a core "
                   f"({res.processes} process(es)); raise the plan's load_processes")
    return out


def measure_server(
    base_url: str,
    api_key: str,
    model: str,
    plan: Plan,
    progress: Callable[[str, int, int], None] | None = None,
    deadline_s: float | None = None,
    load_processes: int = 1,
    server_log: str | os.PathLike | None = None,
    on_window: Callable[[MeasureResult], None] | None = None,
    server_pid: int | None = None,
    first_repeat: int = 0,
) -> MeasureResult:
    """Run warm-up + measurement against a ready server (blocking).

    Args:
        base_url: ``http://127.0.0.1:<port>``; api_key: the trial's key; model: served model name.
        plan: the validated plan (workloads, load levels, repeats, warm-up, SLOs, seed).
        progress: called as ``progress(label, done, total)`` after each measured request; None: the
            :func:`progress_reporter` default (rich bar on a terminal, log lines otherwise).
        deadline_s: tunelab's own deadline for the whole measurement; ``asyncio.TimeoutError`` past it.
        load_processes: load-generator processes per window (``loadgen.run_level(processes=...)``); more than
            one when a single event loop is the bottleneck (notes say "client-bound").
        server_log: the server's log file (stdout+stderr); each window's share of it is searched for
            compilation (``measurements.compile_during_window``). None: not read (the column stays NULL).
        on_window: called after each measured window (its /metrics scraped, before the next one starts) with
            the :class:`MeasureResult` of the windows so far; the trial flow writes them to disk there. What it
            raises ends the measurement.
        server_pid: the server's root process (``vllm serve``): its tree's CPU by role is read around each
            window (``measurements.server_process_cpu``, for ``tunelab.core.bottleneck_rules``); None: not read.
        first_repeat: repeat number of the first window at each level (the windows are ``first_repeat`` ..
            ``first_repeat + plan.repeats - 1``): the SLA search's later windows at a level already measured
            (``tasks.sla_search``).

    Returns:
        :class:`MeasureResult` (requests, measurements, server_metrics frames; notes).

    Raises:
        asyncio.TimeoutError: past ``deadline_s``. loadgen.PromptLengthError: exact prompts impossible.
        httpx.HTTPStatusError: the server's /tokenize failed.
    """

    def run(cb: Callable[[str, int, int], None] | None) -> MeasureResult:
        coro = _measure(base_url, api_key, model, plan, cb, load_processes, server_log, on_window, server_pid,
                        first_repeat)
        if deadline_s:
            coro = asyncio.wait_for(coro, timeout=deadline_s)
        # The load on its own CPUs (the plan's cpu_affinity.load): this thread's event loop and the load
        # processes it spawns, which inherit the affinity.
        with host_load.pinned_thread(plan.cpu_affinity.load_cpus() if plan.cpu_affinity else None):
            return run_interruptible(coro)

    if progress is not None:
        return run(progress)
    with progress_reporter() as cb:
        return run(cb)
