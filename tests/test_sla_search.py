"""SLA search (plan ``sla_search:``): the pure search on simulated servers of known capacity, its plan validation,
and one trial through the real trial flow against the FAKE timed server whose TTFT rises with concurrency."""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from tunelab.core.search import sla as S
from tunelab.core.plan import PlanError, load_plan

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))


# ---------------------------------------------------------------- simulated servers


class SimServer:
    """A simulated server of capacity ``cap`` (requests/s, or concurrency): the p99 TTFT of a window at load L is
    ``base / (1 - L / cap)`` (an M/M/1-like rise) times lognormal window noise of ``cv``; above ``cap`` it is
    huge. With ``limit = 3 x base`` the SLO holds up to the true max ``T = 2/3 cap``."""

    def __init__(self, seed: int, cap: float, cv: float = 0.05, base: float = 0.05, errors: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.cap, self.cv, self.base, self.errors = cap, cv, base, errors
        self.windows = 0

    def p99(self, level: float) -> float:
        return self.base / (1 - level / self.cap) if level < 0.999 * self.cap else self.base * 1000 * level / self.cap

    def true_max(self, limit: float) -> float:
        return self.cap * (1 - self.base / limit)

    def __call__(self, level: float) -> dict:
        self.windows += 1
        noise = math.exp(self.rng.gauss(0, self.cv))
        thr = min(level, self.cap) * math.exp(self.rng.gauss(0, 0.02))
        return {"ttft_p99_s": self.p99(level) * noise, "error_rate": self.errors,
                "request_throughput_per_s": thr, "goodput_per_s": thr, "output_tokens_per_s": 64 * thr}


LIMITS = {"ttft_p99_s": 0.15, "error_rate": 0.01}


def test_search_finds_the_true_max_within_the_resolution_in_95_percent_of_seeds_with_fewer_windows_than_a_grid():
    spec = S.SlaSearchSpec(load="rate", start=1, max=256, resolution=0.1)
    grid_windows = len(S.fixed_grid_levels(spec)) * spec.min_windows_per_level
    hits, over, windows = 0, 0, []
    for seed in range(200):
        cap = random.Random(10_000 + seed).uniform(20, 200)
        sim = SimServer(seed, cap, cv=0.05)
        res = S.search(spec, LIMITS, sim)
        truth = sim.true_max(LIMITS["ttft_p99_s"])
        assert res.verdict == "found", (seed, res.summary())
        assert res.windows == sim.windows
        hits += abs(res.max_load / truth - 1) <= spec.resolution
        over += res.max_load > truth
        windows.append(res.windows)
        # The bracket it stopped on is within the resolution.
        assert res.first_fail / res.max_load - 1 <= spec.resolution + 1e-9
    assert hits >= 0.95 * 200, f"{hits}/200 within {spec.resolution:.0%}"
    assert max(windows) < grid_windows, (max(windows), grid_windows)
    assert sum(windows) / len(windows) < grid_windows / 3


def test_search_on_integer_concurrency_ends_one_apart_or_within_the_resolution():
    spec = S.SlaSearchSpec(load="concurrency", start=1, max=512, resolution=0.1)
    hits = 0
    for seed in range(100):
        cap = random.Random(seed).uniform(8, 300)
        sim = SimServer(seed, cap, cv=0.03)
        res = S.search(spec, LIMITS, sim)
        truth = sim.true_max(LIMITS["ttft_p99_s"])
        assert all(lv.level == int(lv.level) for lv in res.levels)
        assert res.first_fail - res.max_load <= 1 or res.first_fail / res.max_load - 1 <= spec.resolution
        hits += abs(res.max_load - truth) <= max(1.0, spec.resolution * truth)
    assert hits >= 95


def test_an_slo_no_load_meets_gives_none_with_the_nearest_level():
    spec = S.SlaSearchSpec(load="rate", start=2, max=64)
    sim = SimServer(1, cap=50)
    res = S.search(spec, {"ttft_p99_s": 0.01, "error_rate": 0.01}, sim)  # base latency 0.05 > 0.01 everywhere
    assert res.verdict == "none" and res.max_load is None
    assert res.nearest_load == 2 and res.first_fail == 2
    text = res.summary()
    assert text.startswith("no load meets the SLO; nearest 2") and "ttft_p99_s" in text and "0.01" in text


def test_an_slo_met_at_max_says_so():
    spec = S.SlaSearchSpec(load="concurrency", start=1, max=16)
    sim = SimServer(2, cap=1000)
    res = S.search(spec, LIMITS, sim)
    assert res.verdict == "met_at_max" and res.max_load == 16 and res.first_fail is None
    assert [lv.level for lv in res.levels] == [1, 2, 4, 8, 16]
    assert res.summary().startswith("met at max: max load under SLO 16")


def _wide(centres: dict[float, float], spread: float = 1.6):
    """A measure whose windows alternate centre / spread and centre x spread: every level stays undecided at the
    window cap, counted by its point estimate (the geometric mean, ``centre``)."""
    seen: dict[float, int] = {}

    def measure(level: float) -> dict:
        k = seen[level] = seen.get(level, 0) + 1
        v = (centres(level) if callable(centres) else centres[level]) * (spread if k % 2 else 1 / spread)
        return {"ttft_p99_s": v, "error_rate": 0.0, "request_throughput_per_s": level, "goodput_per_s": level,
                "output_tokens_per_s": 64 * level}
    return measure


def test_a_max_accepted_only_by_its_point_estimate_says_so():
    """Every level undecided at the cap: the line, the record and the report must not read as a shown max."""
    from tunelab.tasks.sla_search import result_row

    spec = S.SlaSearchSpec(load="concurrency", start=1, max=4, max_windows_per_level=4)
    lim = LIMITS["ttft_p99_s"]
    res = S.search(spec, LIMITS, _wide({1: 0.8 * lim, 2: 0.9 * lim, 3: 1.1 * lim, 4: 1.3 * lim}))
    assert [(lv.level, lv.verdict) for lv in res.levels] == [(1, "undecided"), (2, "undecided"), (4, "undecided"),
                                                            (3, "undecided")]
    assert res.verdict == "found" and res.max_load == 2 and res.first_fail == 3
    text = res.summary(lambda v: f"c={v:g}")
    assert "max load under SLO c=2 (by point estimate: undecided at the window cap of 4)" in text, text
    assert "c=3 undecided at the window cap (counted as a fail: ttft_p99_s " in text and "c=3 fails" not in text, text
    assert res.max_load_shown is False
    row = result_row("w", spec, res)
    assert row["max_load_shown"] is False and "by point estimate" in row["summary"]


def test_a_max_shown_by_its_bounds_reads_as_before():
    spec = S.SlaSearchSpec(load="concurrency", start=1, max=16)
    lim = LIMITS["ttft_p99_s"]
    res = S.search(spec, LIMITS, _wide(lambda c: lim * (0.5 + 0.055 * c), spread=1.0))  # no noise: decided
    top, ff = res.at(res.max_load), res.at(res.first_fail)
    assert top.verdict == "pass" and ff.verdict == "fail" and res.max_load_shown is True
    text = res.summary(lambda v: f"c={v:g}")
    assert f"max load under SLO c={res.max_load:g}, c={res.first_fail:g} fails (ttft_p99_s " in text
    assert "point estimate" not in text


def test_the_report_marks_a_stored_point_estimate_max_without_the_words(tmp_path):
    """A summary stored before it said so still reads as uncertain in `tunelab report` (max_load_shown false)."""
    import duckdb

    from tunelab.reports.report import sla_search_lines

    con = duckdb.connect(":memory:")
    con.execute("CREATE TABLE sla_search_results AS SELECT * FROM (VALUES ('s', 'cfg', 0, 'rt', 'w', "
                "'max load under SLO c=2, c=3 fails; goodput 1 req/s', false), ('s', 'cfg2', 0, 'rt', 'w', "
                "'max load under SLO c=8, c=9 fails', true)) t(sweep_id, config_label, replicate, runtime_name, "
                "workload, summary, max_load_shown)")
    lines = sla_search_lines(con, "s")
    assert lines[0].endswith("[max load by point estimate: undecided at the window cap]"), lines
    assert "point estimate" not in lines[1]


def test_ab_boot_values_leave_the_search_windows_out():
    """An SLA search window at a plan's level (same workload and load) is not averaged into the boot's value."""
    import pandas as pd

    from tunelab.flows.ab_auto import ABCell, boot_value

    m = pd.DataFrame({"workload": ["w"] * 3, "load_kind": ["concurrency"] * 3, "load_value": [1.0, 1.0, 1.0],
                      "repeat": [0, 1, 2], "output_tokens_per_s": [100.0, 10.0, 10.0],
                      "sla_search_window": [None, True, True]})
    cell = ABCell(workload="w", load="c=1", metric="output_tokens_per_s")
    assert boot_value(m, cell) == 100.0
    assert boot_value(m.drop(columns="sla_search_window"), cell) == 40.0


def test_a_level_is_never_judged_by_one_window_and_errors_fail_it():
    spec = S.SlaSearchSpec(load="rate", start=1, max=8)
    one = [{"ttft_p99_s": 0.01, "error_rate": 0.0}]
    assert S.judge_level(one, LIMITS, spec)[0] == "undecided"
    two = one * 2
    assert S.judge_level(two, LIMITS, spec)[0] == "pass"
    bad = [{"ttft_p99_s": 0.01, "error_rate": e} for e in (0.5, 0.6, 0.55)]
    assert S.judge_level(bad[:2], LIMITS, spec)[0] == "undecided"  # two windows of 1 df: a wide bound
    assert S.judge_level(bad, LIMITS, spec)[0] == "fail"
    # Near the limit with noise: more windows, up to the cap; then the point estimate decides what counts.
    sim = SimServer(3, cap=100, cv=0.1)
    lv = next(lv for lv in S.search(spec, LIMITS, lambda L: sim(L) | {"ttft_p99_s": 0.149 * math.exp(
        sim.rng.gauss(0, 0.1))}).levels)
    assert lv.verdict == "undecided" and len(lv.windows) == spec.max_windows_per_level


def test_the_knee_is_where_throughput_stops_growing_faster_than_latency():
    levels = []
    for lvl, thr, lat in [(1, 10, 0.05), (2, 20, 0.051), (4, 40, 0.055), (8, 70, 0.07), (16, 78, 0.14),
                          (32, 80, 0.3)]:
        lv = S.SlaLevelResult(level=lvl, windows=[{"request_throughput_per_s": thr}])
        lv.bounds = {"ttft_p99_s": S.MetricBound("ttft_p99_s", 0.2, 2, lat, lat, lat)}
        levels.append(lv)
    assert S.knee(levels) == 8
    assert S.knee(levels[:2]) is None


# ---------------------------------------------------------------- plan validation


def _plan_text(extra: str, slo: str = "slo: {ttft_s: 0.5}") -> str:
    return textwrap.dedent("""
        name: sla
        model: unused
        workloads: [{name: w, prompt_tokens: 16, output_tokens: 4, num_requests: 8}]
        """) + slo + "\n" + extra + "\n"


@pytest.mark.parametrize("extra,slo,wanted", [
    ("sla_search: {start: 8, max: 4}", "slo: {ttft_s: 0.5}", "start (8) is above max (4); set start <= max"),
    ("sla_search: {load: concurrency, start: 1.5}", "slo: {ttft_s: 0.5}",
     "start: a concurrency level is a whole number >= 1, got 1.5"),
    ("sla_search: {resolution: 0}", "slo: {ttft_s: 0.5}", "sla_search.resolution: Input should be greater than 0"),
    ("sla_search: {load: qps}", "slo: {ttft_s: 0.5}", "sla_search.load: Input should be 'concurrency' or 'rate'"),
    ("sla_search: {min_windows_per_level: 1}", "slo: {ttft_s: 0.5}", "sla_search.min_windows_per_level"),
    ("sla_search: {min_windows_per_level: 4, max_windows_per_level: 3}", "slo: {ttft_s: 0.5}",
     "max_windows_per_level (3) is below min_windows_per_level (4)"),
    ("sla_search: {max_windows: 4}", "slo: {ttft_s: 0.5}", "sla_search.max_windows: unknown field"),
    ("sla_search: {}", "slo: {}", "sla_search: needs a latency bound in the plan's slo:"),
    ("sla_search: {max: 4096}\nrequests_per_concurrency: 100", "slo: {ttft_s: 0.5}",
     "sla_search.max: the window of w at c=4096 holds 409,600 requests"),
])
def test_bad_sla_search_values_are_refused_before_any_server_starts(tmp_path, extra, slo, wanted):
    p = tmp_path / "plan.yaml"
    p.write_text(_plan_text(extra, slo))
    with pytest.raises(PlanError) as e:
        load_plan(p)
    assert wanted in str(e.value)


def test_a_good_sla_search_plan_loads(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text(_plan_text("sla_search: {load: rate, start: 0.5, max: 64, resolution: 0.05}",
                            "slo: {ttft_s: 0.5, tpot_s: 0.05}"))
    plan = load_plan(p)
    assert plan.sla_search.load == "rate" and plan.sla_search.resolution == 0.05
    assert plan.sla_search.limits(**plan.slo.model_dump()) == {"ttft_p99_s": 0.5, "tpot_p99_s": 0.05,
                                                               "error_rate": 0.01}


# ---------------------------------------------------------------- end to end: the trial flow on the FAKE server


from test_records import FakeEngine  # noqa: E402  the FAKE engine of the records test, shared


def _fake_sla_trial(tmp_path, monkeypatch):
    """Run one trial with an SLA search through the real trial flow (its task bodies, without Prefect's task runs)
    against the FAKE timed server whose TTFT is 10 ms + 50 ms per other request in flight. Returns
    ``(bundle or the exception the trial raised, sweep_id, trial_id)``; the trial's bundle is written either way."""
    from fake_trial import fake_trial_setup
    from timed_openai_server import FakeServerProcess, FakeTiming

    import tunelab.flows.trial as T
    from tunelab.core.plan import Plan, Workload

    timing = FakeTiming(ttft_s=0.01, itl_s=0.001, tokens_per_chunk=1, ttft_per_in_flight_s=0.05)
    with FakeServerProcess(timing, model="fake-model", server="uvicorn") as fake:
        monkeypatch.setattr(T, "get_run_logger", lambda: logging.getLogger("test_sla_search"))
        monkeypatch.setattr(T, "_boot_once", lambda *a, **k: FakeEngine(fake, a[3]))
        for name in ("clean_gpu_task", "boot_task", "measure_task", "sla_search_task", "teardown_task"):
            monkeypatch.setattr(T, name, getattr(T, name).fn)  # the task bodies, without Prefect's task runs
        plan = Plan(name="sla", model="unused", seed=3, repeats=1, warmup_requests=2, concurrency=[2],
                    requests_per_concurrency=3, slo={"ttft_s": 0.235},
                    sla_search={"load": "concurrency", "start": 1, "max": 16, "max_windows_per_level": 3,
                                "percentile": 50},
                    workloads=[Workload(name="w", prompt_tokens=16, output_tokens=4, num_requests=8)])
        trial, runtime, ctx, trial_id = fake_trial_setup(plan, tmp_path)
        sweep_id = ctx.sweep.sweep_id
        try:
            out = T.run_trial.fn(trial, trial_id, plan, runtime, ctx)
        except BaseException as e:  # noqa: BLE001 - the interrupted cases: the caller checks it
            out = e
    return out, sweep_id, trial_id


def test_a_trial_with_sla_search_finds_the_fakes_max_concurrency_and_loads_it(tmp_path, monkeypatch):
    """The FAKE server's TTFT is 10 ms + 50 ms per other request in flight: at concurrency c about
    10 + 50 (c - 1) ms, so an SLO of median TTFT <= 235 ms holds up to c=5 (210 ms) and not at c=6 (260 ms); the
    median, so that a request delayed by a busy test machine does not decide a level."""
    from tunelab.core.bundle import read_bundle
    from tunelab.reports.report import comparison_frame, sla_search_lines
    from tunelab.warehouse.loader import load_bundle

    bundle, sweep_id, trial_id = _fake_sla_trial(tmp_path, monkeypatch)
    tables = read_bundle(bundle)
    assert tables["trial"].at[0, "status"] == "ok", tables["trial"].at[0, "failure_reason"]
    sla = tables["sla_searches"]
    assert len(sla) == 1
    row = sla.iloc[0]
    assert row["verdict"] == "found" and row["max_load"] == 5 and row["first_fail"] == 6, row["summary"]
    levels = json.loads(row["levels"])
    assert [lv["level"] for lv in levels][:4] == [1, 2, 4, 8]
    assert row["goodput_per_s"] > 0 and row["windows"] == sum(lv["windows"] for lv in levels)
    # Every window is an ordinary measurements row at its level: the plan's c=2 window, then the search's.
    meas = tables["measurements"]
    assert len(meas) == 1 + row["windows"]
    c2 = meas[meas["load_value"] == 2].sort_values("repeat")
    assert list(c2["repeat"]) == list(range(len(c2)))  # the search's c=2 windows follow the plan's repeat 0
    assert set(meas["load_value"]) == {lv["level"] for lv in levels} | {2.0}
    # The search's windows are marked (019); the plan's own is not.
    plan_window = (meas["load_value"] == 2) & (meas["repeat"] == 0)
    assert meas.loc[plan_window, "sla_search_window"].isna().all()
    assert meas.loc[~plan_window, "sla_search_window"].eq(True).all()

    db = tmp_path / "wh.duckdb"
    res = load_bundle(db, bundle)
    assert res.status == "loaded" and res.rows["sla_searches"] == 1
    lines = sla_search_lines(db, sweep_id)
    assert len(lines) == 1 and "max load under SLO c=5, c=6 fails (" in lines[0], lines
    assert comparison_frame(db, sweep_id, all_quality=True).attrs["sla_search"] == lines
    # compare's boot values average the plan's c=2 window only, not the search's windows at c=2.
    from tunelab.warehouse.compare import _boot_values
    from tunelab.warehouse.migrate import connect

    con = connect(db)
    try:
        bv = _boot_values(con, [trial_id], "output_tokens_per_s")
    finally:
        con.close()
    assert list(bv["load_value"]) == [2.0] and list(bv["repeats"]) == [1], bv


def _stop_at_search_window(monkeypatch, n: int, exc: BaseException):
    """The search's windows made up (``_fake_measure_server``: the SLO's TTFT p50 at a fifth of its limit, the
    level kept in flight, so every level passes on its 2 windows whatever the test machine's load), raising ``exc``
    when the search's ``n``-th window starts. The trial's own window is measured on the FAKE server."""
    import tunelab.tasks.sla_search as TS

    def window(kind, level, i):
        return {"completed": 6, "failed": 0, "ttft_p50_s": 0.047, "in_flight_while_sending": level,
                "request_throughput_per_s": level, "goodput_per_s": level, "output_tokens_per_s": 4 * level}

    made_up, calls = _fake_measure_server(window), {"n": 0}

    def measure(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return made_up(*a, **k)

    monkeypatch.setattr(TS, "measure_server", measure)


@pytest.mark.parametrize("exc, status", [(KeyboardInterrupt(), "cancelled"),
                                         (RuntimeError("server went away"), "failed")])
def test_a_search_cut_short_keeps_its_record_and_windows_in_the_bundle(tmp_path, monkeypatch, exc, status):
    """The search is stopped as its 6th window starts (levels 1 and 2 judged on 2 windows each, level 4 with one):
    the trial is cancelled (Ctrl-C) or failed (an error), and its bundle has the search's 5 windows and an
    ``interrupted`` row: passed up to c=2, c=4 unjudged after 1 window. Without the record these windows would be
    in the bundle with no row to say what they were."""
    from tunelab.core.bundle import read_bundle

    _stop_at_search_window(monkeypatch, 6, exc)
    out, _sweep_id, trial_id = _fake_sla_trial(tmp_path, monkeypatch)
    if status == "cancelled":
        assert isinstance(out, KeyboardInterrupt)  # propagated after the bundle was written
        bundle = next((tmp_path / "results").glob("*/*"))
    else:
        bundle = out
    tables = read_bundle(bundle)
    assert tables["trial"].at[0, "status"] == status, tables["trial"].at[0, "failure_reason"]
    sla = tables["sla_searches"]
    assert len(sla) == 1, sla
    row = sla.iloc[0]
    assert row["verdict"] == "interrupted" and row["max_load"] == 2 and pd.isna(row["first_fail"]), row["summary"]
    levels = json.loads(row["levels"])
    assert [(lv["level"], lv["windows"]) for lv in levels] == [(1, 2), (2, 2), (4, 1)]
    assert row["windows"] == 5
    assert row["summary"].startswith("interrupted after 3 level(s), 5 windows: passed up to c=2, c=4 unjudged "
                                     "after 1 window(s); not a max load"), row["summary"]
    meas = tables["measurements"]
    assert int(meas["sla_search_window"].eq(True).sum()) == 5  # every window the search measured is kept


def test_search_progress_is_the_bracket_so_far():
    """The pure search stopped by what its measure raises: ``SearchProgress.result`` gives the levels judged, the
    highest passed and the lowest failed above it, and the level in progress last; a search stopped before any
    window has no level at all."""
    sim = SimServer(seed=1, cap=100.0, cv=0.01)
    spec = S.SlaSearchSpec(load="rate", start=10, max=160, growth=2, resolution=0.1)

    def measure(level):
        if sim.windows == 9:  # 10, 20, 40 passed and 80 failed on 2 windows each; the bisection's 56.6 on 1
            raise KeyboardInterrupt
        return sim(level)

    prog = S.SearchProgress(dict(LIMITS))
    with pytest.raises(KeyboardInterrupt):
        S.search(spec, LIMITS, measure, progress=prog)
    res = prog.result()
    assert res.verdict == "interrupted"
    mid = spec.level(math.sqrt(40 * 80))
    assert [lv.level for lv in res.levels] == [10, 20, 40, 80, mid] and 56 < mid < 57
    assert res.max_load == 40 and res.first_fail == 80 and res.unjudged_load == mid
    assert len(res.at(mid).windows) == 1 and res.windows == 9
    assert res.summary().startswith(f"interrupted after 5 level(s), 9 windows: passed up to 40, failed at 80, "
                                    f"{mid:g} unjudged after 1 window(s)"), res.summary()
    empty = S.SearchProgress(dict(LIMITS))
    assert empty.result().levels == [] and empty.result().max_load is None


# ---------------------------------------------------------------- what decided a level; the load a level reached


def _fake_measure_server(windows_at):
    """A stand-in for ``tasks.measure.measure_server``: one measurements row (and its request rows) per call from
    ``windows_at(kind, level, n_window) -> dict`` (measurement columns; ``sends``: the request rows' send_ts)."""
    import pandas as pd

    from tunelab.tasks.measure import MeasureResult

    calls: dict[float, int] = {}

    def fake(base_url, api_key, model, sub, *, first_repeat=0, **_):
        prof = sub.load_profiles()[0]
        i = calls[prof.value] = calls.get(prof.value, 0) + 1
        row = {"workload": sub.workloads[0].name, "load_kind": prof.kind, "load_value": float(prof.value),
               "repeat": first_repeat, **windows_at(prof.kind, float(prof.value), i)}
        sends = row.pop("sends", [])
        req = pd.DataFrame({"workload": row["workload"], "load_kind": prof.kind, "load_value": float(prof.value),
                            "repeat": first_repeat, "send_ts": sends})
        return MeasureResult(req, pd.DataFrame([row]), pd.DataFrame(), [])

    return fake


def _sla_plan(sla: dict, num_requests: int = 16, **extra):
    from tunelab.core.plan import Plan, Workload

    return Plan(name="sla", model="unused", seed=3, repeats=1, warmup_requests=0, concurrency=[1],
                slo={"ttft_s": 0.5, "tpot_s": 0.05}, sla_search=sla,
                workloads=[Workload(name="w", prompt_tokens=16, output_tokens=16, num_requests=num_requests)],
                **extra)


def test_a_level_failed_by_its_error_rate_says_so_and_its_bounds_stay_in_0_1(monkeypatch):
    """The tiny CPU model at 8 req/s: one request of 16 without text (an error), latencies at 5-7 % of their
    limits. The log and the summary name the error rate, not a latency at 0.07x; its bounds lie in [0, 1]."""
    import tunelab.tasks.sla_search as T

    def window(kind, level, i):
        bad = 1 if level >= 8 and i == 1 else 0  # the first window at 8 req/s has one error
        return {"completed": 16 - bad, "failed": bad, "ttft_p99_s": 0.025 + 0.0001 * i, "tpot_p99_s": 0.0035,
                "request_throughput_per_s": level, "goodput_per_s": level, "output_tokens_per_s": 16 * level,
                "sends": [j / level for j in range(16)]}

    monkeypatch.setattr(T, "measure_server", _fake_measure_server(window))
    lines: list[str] = []
    plan = _sla_plan({"load": "rate", "start": 1, "max": 64})
    _, rows = T.run_sla_search("http://unused", "k", "m", plan, log=lines.append)
    row = rows.iloc[0]
    levels = {lv["level"]: lv for lv in json.loads(row["levels"])}
    eight = levels[8.0]
    assert eight["counted_as"] == "fail" and eight["decided_by"] == "error_rate"
    for lv in levels.values():
        b = lv["metrics"]["error_rate"]
        assert 0.0 <= b["low"] <= b["centre"] <= b["high"] <= 1.0, lv
    line8 = next(ln for ln in lines if ln.startswith("sla search w 8 req/s:"))
    assert "decided by error_rate at" in line8 and "error_rate 0.0" in line8, line8
    assert "binding metric at 0.0" not in line8
    assert row["max_load"] < 8, row["summary"]
    assert "8 req/s undecided at the window cap (counted as a fail: error_rate " in row["summary"], row["summary"]
    # a pass names the metric closest to its limit: TPOT at 0.07x (TTFT is at 0.05x)
    line1 = next(ln for ln in lines if ln.startswith("sla search w 1 req/s:"))
    assert "decided by tpot_p99_s at 0.07x its limit" in line1, line1


def test_error_rate_bounds_are_clopper_pearson_on_the_pooled_counts():
    from scipy import stats

    spec = S.SlaSearchSpec(max_windows_per_level=4, min_windows_per_level=2)
    alpha = 0.05 / 3
    wins = [{"ttft_p99_s": 0.1, "error_rate": r, "failed_requests": k, "sent_requests": 16}
            for r, k in ((1 / 16, 1), (0.0, 0))]
    verdict, b = S.judge_level(wins, {"ttft_p99_s": 0.5, "error_rate": 0.01}, spec)
    e = b["error_rate"]
    assert e.centre == pytest.approx(1 / 32)
    assert e.low == pytest.approx(stats.beta.ppf(alpha, 1, 32))
    assert e.high == pytest.approx(stats.beta.ppf(1 - alpha, 2, 31))
    assert verdict == "undecided"  # 1/32 over the limit by its estimate, not shown above it
    # without counts (window rates only): a t bound, clipped to [0, 1]
    _, b = S.judge_level([{"ttft_p99_s": 0.1, "error_rate": r} for r in (1 / 16, 0.0)],
                         {"ttft_p99_s": 0.5, "error_rate": 0.01}, spec)
    assert b["error_rate"].low == 0.0 and 0.0 < b["error_rate"].high <= 1.0
    # error-free windows pass (no bound under 1 % needs to be shown: its estimate is 0)
    ok = [{"ttft_p99_s": 0.1, "error_rate": 0.0, "failed_requests": 0, "sent_requests": 16}] * 2
    assert S.judge_level(ok, {"ttft_p99_s": 0.5, "error_rate": 0.01}, spec)[0] == "pass"
    # many errors: shown above the limit, a fail decided by the error rate
    bad = [{"ttft_p99_s": 0.1, "error_rate": 0.5, "failed_requests": 8, "sent_requests": 16}] * 2
    v, bb = S.judge_level(bad, {"ttft_p99_s": 0.5, "error_rate": 0.01}, spec)
    lv = S.SlaLevelResult(level=4, windows=bad, bounds=bb, verdict=v)
    assert v == "fail" and lv.decided_by == "error_rate"


def test_a_level_whose_concurrency_was_not_reached_does_not_pass(monkeypatch):
    """max 8 with num_requests 8: the client keeps 3.35 of 8 in flight; the SLO metrics are far under their
    limits, but c=8 is not a pass and the summary says why."""
    import tunelab.tasks.sla_search as T

    def window(kind, level, i):
        in_flight = level if level < 8 else 3.35  # below 8 the window has more requests than slots
        return {"completed": 8, "failed": 0, "ttft_p99_s": 0.05, "tpot_p99_s": 0.004,
                "in_flight_while_sending": in_flight, "request_throughput_per_s": level,
                "goodput_per_s": level, "output_tokens_per_s": 16 * level}

    monkeypatch.setattr(T, "measure_server", _fake_measure_server(window))
    lines: list[str] = []
    plan = _sla_plan({"load": "concurrency", "start": 1, "max": 8}, num_requests=8)
    _, rows = T.run_sla_search("http://unused", "k", "m", plan, log=lines.append)
    row = rows.iloc[0]
    assert row["verdict"] == "found" and row["max_load"] == 7 and row["first_fail"] == 8, row["summary"]
    assert "c=8 fails (load not reached: 3.35 of 8 in flight while sending (under 0.9 x the level))" in row["summary"]
    eight = next(lv for lv in json.loads(row["levels"]) if lv["level"] == 8)
    assert eight["counted_as"] == "fail" and eight["load_note"].startswith("load not reached")
    assert any(ln.startswith("sla search w c=8: fail after 2 window(s): load not reached") for ln in lines), lines


def test_a_rate_level_is_judged_on_its_send_rate_with_poisson_room():
    spec = S.SlaSearchSpec(load="rate")
    # 2 windows of 16 Poisson-like sends at 7.5 of 8 req/s: within chance, reached
    near = [{"achieved_load": 7.5, "load_intervals": 15}] * 2
    assert S.load_shortfall(near, 8, "rate", 0.9) is None
    # the client sent at 4 of 8 req/s over 2 x 63 intervals: not reached
    slow = [{"achieved_load": 4.0, "load_intervals": 63}] * 2
    assert S.load_shortfall(slow, 8, "rate", 0.9).startswith("load not reached: 4 of 8 req/s sent")
    assert S.load_shortfall([{"achieved_load": 3.35}], 8, "concurrency", 0.9) is not None
    assert S.load_shortfall([{"achieved_load": 7.5}], 8, "concurrency", 0.9) is None
    assert S.load_shortfall([{}], 8, "concurrency", 0.9) is None  # not recorded: not judged
    with pytest.raises(ValueError):
        S.load_shortfall(near, 8, "rate", 1.5)
    # the search fails such a level without more windows
    res = S.search(spec, LIMITS, lambda lv: {"ttft_p99_s": 0.01, "error_rate": 0.0,
                                            "achieved_load": min(lv, 4.0), "load_intervals": 63},
                   min_load_ratio=0.9)
    # (a level up to about 4 / 0.9 plus the Poisson room of 126 intervals passes; none far above it)
    assert 4.0 <= res.max_load < 5.6 and res.at(res.first_fail).load_note is not None, res.summary()


def test_plan_check_warns_when_the_top_of_an_sla_range_cannot_be_reached(tmp_path):
    from typer.testing import CliRunner

    from tunelab.cli import app
    from tunelab.core.plan_cost import plan_cost

    short = _sla_plan({"load": "concurrency", "start": 1, "max": 8}, num_requests=8)
    (msg,) = [m for m in plan_cost(short).warnings if m.startswith("sla_search:")]
    assert "window of w at c=8 holds 8 requests, not more than its 8 in flight" in msg
    assert "raise w's num_requests above 8" in msg and "lower sla_search.max to 7" in msg
    assert not [m for m in plan_cost(_sla_plan({"load": "concurrency", "start": 1, "max": 8}, num_requests=9)).warnings
                if m.startswith("sla_search:")]
    assert not [m for m in plan_cost(_sla_plan({"load": "concurrency", "max": 8}, num_requests=4,
                                               requests_per_concurrency=2)).warnings if m.startswith("sla_search:")]
    assert not [m for m in plan_cost(_sla_plan({"load": "rate", "max": 64}, num_requests=8)).warnings
                if m.startswith("sla_search:")]
    p = tmp_path / "plan.yaml"
    p.write_text(_plan_text("sla_search: {load: concurrency, start: 1, max: 8}"))  # num_requests: 8
    out = CliRunner().invoke(app, ["plan", "check", str(p)])
    assert "sla_search: the window of" in out.output and "in flight" in out.output, out.output
