"""The SLA search on a running server: ``tunelab.core.search.sla.search`` with real measured windows.

For each workload of the plan, the search (``sla_search:`` of the plan) calls ``measure(level)``, which runs one
window at that level through ``tasks.measure.measure_server`` (the same warm-up, prompts, load generator,
aggregates and notes as the plan's own windows): the first window at a level warms up at it first (the plan's
``warmup_requests``, raised by the level's profile), later ones do not. Each window is an ordinary
``measurements`` row at its load level; its repeat number follows the windows already measured at that level
(the plan's own, or the search's earlier ones), so keys never collide, and is marked ``sla_search_window``
(019): the quality gate's load checks and the compare / A/B level means leave it out. The window's figures
(:func:`window_figures`: its percentiles, error rate with its counts, throughputs, the load it reached) go to
the search, which fails a level whose windows did not reach its load by the quality gate's own ratio
(``plan.quality.min_concurrency_ratio``); its verdict becomes one ``sla_searches`` row (:func:`result_row`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

import pandas as pd

from tunelab.core import records as R
from tunelab.core.search import sla as S
from tunelab.core.load_profiles import concurrency_target_kinds, load_label
from tunelab.core.plan import Plan, Workload
from tunelab.tasks.measure import MeasureResult, measure_server

__all__ = ["window_figures", "level_plan", "level_line", "result_row", "run_sla_search", "SEARCH_WINDOW_SLACK_S"]

#: Seconds added to a search window's own deadline (``LoadProfile.window_deadline_s``): prompts, scrapes.
SEARCH_WINDOW_SLACK_S = 120.0


def window_figures(row: Mapping[str, Any], requests: pd.DataFrame | None = None) -> dict[str, Any]:
    """The figures of one ``measurements`` row that the search judges and reports: every latency column
    (``ttft_p99_s`` ...), ``error_rate`` (failed / (completed + failed); 1.0 when nothing completed) with its
    counts (``S.FAILED``, ``S.SENT``: NaN when nothing was counted), the throughputs (NaN where the row has None)
    and the load the window reached (``S.ACHIEVED_LOAD``): for a concurrency window the row's
    ``in_flight_while_sending`` (requests in flight while the client was sending); for a rate window, from
    ``requests`` (the window's request rows, ``send_ts`` in seconds), the send intervals / seconds from the
    first to the last send, with their number as ``S.LOAD_INTERVALS`` (NaN without two sends)."""

    def num(key: str) -> float:
        v = row.get(key)
        try:
            return float(v) if v is not None else math.nan
        except (TypeError, ValueError):
            return math.nan

    out: dict[str, Any] = {c: num(c) for c in R.LATENCY_COLUMNS}
    ok, bad = num("completed"), num("failed")
    ok, bad = (0.0 if math.isnan(ok) else ok), (0.0 if math.isnan(bad) else bad)
    out[S.ERROR_RATE] = bad / (ok + bad) if ok + bad > 0 else 1.0
    out[S.FAILED], out[S.SENT] = (bad, ok + bad) if ok + bad > 0 else (math.nan, math.nan)
    for c in (S.THROUGHPUT, S.GOODPUT, S.OUTPUT_TPS):
        out[c] = num(c)
    out[S.ACHIEVED_LOAD], out[S.LOAD_INTERVALS] = math.nan, math.nan
    if row.get("load_kind") in concurrency_target_kinds():
        out[S.ACHIEVED_LOAD] = num("in_flight_while_sending")
    elif requests is not None and len(requests) and "send_ts" in requests.columns:
        send = pd.to_numeric(requests["send_ts"], errors="coerce").dropna()
        span = float(send.max() - send.min()) if len(send) >= 2 else 0.0
        if span > 0:
            out[S.ACHIEVED_LOAD], out[S.LOAD_INTERVALS] = (len(send) - 1) / span, float(len(send) - 1)
    return out


def level_plan(plan: Plan, workload: Workload, level: float, warm_up: bool) -> Plan:
    """The plan of one search window: ``workload`` only, one load level (the search's kind), one repeat, the
    plan's warm-up only when ``warm_up`` (the first window at the level). Not validated again: the plan was."""
    spec = plan.sla_search
    assert spec is not None
    upd: dict[str, Any] = {"workloads": [workload], "repeats": 1, "concurrency": [], "request_rates": [],
                           "trace_speedups": []}
    if spec.load == "concurrency":
        upd["concurrency"] = [int(level)]
    else:
        upd["request_rates"] = [float(level)]
    if not warm_up:
        upd["warmup_requests"] = 0
    return plan.model_copy(update=upd)


def result_row(workload: str, spec: S.SlaSearchSpec, res: S.SlaResult) -> dict[str, Any]:
    """The ``sla_searches`` row (without trial_id) of one search."""
    top, kn = res.at(res.max_load), res.at(res.knee_load)
    return {
        "workload": workload, "load_kind": spec.load, "verdict": res.verdict, "max_load": res.max_load,
        "max_load_shown": res.max_load_shown, "first_fail": res.first_fail,
        "nearest_load": res.nearest_load,
        "goodput_per_s": None if top is None else top.mean(S.GOODPUT),
        "request_throughput_per_s": None if top is None else top.mean(S.THROUGHPUT),
        "output_tokens_per_s": None if top is None else top.mean(S.OUTPUT_TPS),
        "knee_load": res.knee_load, "knee_request_throughput_per_s": None if kn is None else kn.mean(S.THROUGHPUT),
        "limits": json.dumps(res.limits, sort_keys=True), "spec": json.dumps(spec.model_dump(), sort_keys=True),
        "levels": json.dumps([lv.record() for lv in res.levels], sort_keys=True),
        "levels_tried": len(res.levels), "windows": res.windows,
        "summary": res.summary(lambda v: load_label(spec.load, v)),
    }


def level_line(workload: str, load: str, lv: S.LevelResult) -> str:
    """The log line of one judged level: its verdict (how an undecided one was counted), its windows and what
    decided it: the metric that did (``S.LevelResult.decided_by``) at its centre / limit, or the load not
    reached. E.g. ``sla search chat 8 req/s: undecided (counted as fail) after 4 window(s), decided by error_rate
    at 1.56x its limit (error_rate 0.01562 against a limit of 0.01)``."""
    head = (f"sla search {workload} {load_label(load, lv.level)}: {lv.verdict}"
            f"{'' if lv.verdict != 'undecided' else ' (counted as ' + ('pass' if lv.passed else 'fail') + ')'}"
            f" after {len(lv.windows)} window(s)")
    if lv.load_note is not None:
        return f"{head}: {lv.load_note}"
    m = lv.decided_by
    if m is None:
        return head
    r = lv.bounds[m].ratio
    return f"{head}, decided by {m} at {r:.3g}x its limit ({lv.why()})"


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_sla_search(base_url: str, api_key: str, model: str, plan: Plan, *, measured: MeasureResult | None = None,
                   progress: Callable[[str, int, int], None] | None = None, load_processes: int = 1,
                   server_log: Any = None, server_pid: int | None = None,
                   on_window: Callable[[MeasureResult], None] | None = None,
                   log: Callable[[str], None] | None = None,
                   on_interrupted: Callable[[pd.DataFrame], None] | None = None
                   ) -> tuple[MeasureResult, pd.DataFrame]:
    """Run the plan's SLA search on a ready server, each workload in turn.

    Args:
        measured: the windows the trial measured before (the plan's levels): the search's windows at the same
            level take the next repeat numbers. None: none.
        on_window: called after each search window with every window so far, the ``measured`` ones first.
        log: called with one line per level judged and per result.
        on_interrupted: called, before what cut the search short propagates (Ctrl-C, a cancel, an error of a
            window), with the ``sla_searches`` frame so far: the finished workloads' rows and an ``interrupted``
            row for the one in progress (``tunelab.core.search.sla.SearchProgress``), so the trial's bundle keeps it.
        base_url, api_key, model, progress, load_processes, server_log, server_pid: as ``measure_server``.

    Returns:
        (the search's windows as a :class:`MeasureResult`, the ``sla_searches`` frame without trial_id).
    """
    spec = plan.sla_search
    if spec is None:
        raise ValueError("run_sla_search: the plan has no sla_search")
    limits = spec.limits(**plan.slo.model_dump())
    used: dict[tuple[str, str, float], int] = {}
    if measured is not None and len(measured.measurements):
        for r in measured.measurements.itertuples(index=False):
            key = (str(r.workload), str(r.load_kind), float(r.load_value))
            used[key] = max(used.get(key, 0), int(r.repeat) + 1)
    parts: list[MeasureResult] = []
    rows: list[dict[str, Any]] = []
    duration_s = plan.window.duration_s if plan.window else None

    def merged() -> MeasureResult:
        every = ([measured] if measured is not None else []) + parts
        return MeasureResult(_concat([p.requests for p in every]), _concat([p.measurements for p in every]),
                             _concat([p.server_metrics for p in every]), [n for p in every for n in p.notes])

    for w in plan.workloads:
        warmed: set[float] = set()

        def measure(level: float, w: Workload = w, warmed: set[float] = warmed) -> dict[str, Any]:
            sub = level_plan(plan, w, level, warm_up=level not in warmed)
            prof = sub.load_profiles()[0]
            key = (w.name, prof.kind, float(prof.value))
            rep = used.get(key, 0)
            res = measure_server(base_url, api_key, model, sub, progress=progress, load_processes=load_processes,
                                 deadline_s=prof.window_deadline_s(plan.request_timeout_s, 1, duration_s)
                                 + SEARCH_WINDOW_SLACK_S,
                                 server_log=server_log, server_pid=server_pid, first_repeat=rep)
            if len(res.measurements):  # judged by the search's SLO bounds, not the gate's load checks (019)
                res.measurements["sla_search_window"] = True
            warmed.add(level)
            used[key] = rep + 1
            parts.append(res)
            if on_window is not None:
                on_window(merged())
            if not len(res.measurements):
                return {m: math.nan for m in limits}
            return window_figures(res.measurements.iloc[0].to_dict(), res.requests)

        def on_level(lv: S.LevelResult, w: Workload = w) -> None:
            if log is not None:
                log(level_line(w.name, spec.load, lv))

        so_far = S.SearchProgress(dict(limits))
        try:
            result = S.search(spec, limits, measure, on_level=on_level,
                              min_load_ratio=plan.quality.min_concurrency_ratio, progress=so_far)
        except BaseException:  # re-raised: a record of the search so far first, for the trial's bundle
            if on_interrupted is not None:
                cut = result_row(w.name, spec, so_far.result())
                if log is not None:
                    log(f"sla search {w.name}: {cut['summary']}")
                on_interrupted(R.frame(R.SlaSearch, pd.DataFrame(rows + [cut]), without=("trial_id",)))
            raise
        row = result_row(w.name, spec, result)
        rows.append(row)
        if log is not None:
            log(f"sla search {w.name}: {row['summary']}")
    search_only = MeasureResult(_concat([p.requests for p in parts]), _concat([p.measurements for p in parts]),
                                _concat([p.server_metrics for p in parts]), [n for p in parts for n in p.notes])
    return search_only, R.frame(R.SlaSearch, pd.DataFrame(rows), without=("trial_id",))
