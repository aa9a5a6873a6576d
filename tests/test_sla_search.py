"""SLA search (plan ``sla_search:``): the pure search on simulated servers of known capacity, its plan validation,
and one trial through the real trial flow against the FAKE timed server whose TTFT rises with concurrency."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import random
import sys
import textwrap
from pathlib import Path

import pytest

from tunelab import sla_search as S
from tunelab.plan import PlanError, load_plan

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
    assert "c=3 undecided at the window cap (counted as a fail)" in text and "c=3 fails" not in text, text
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
    assert f"max load under SLO c={res.max_load:g}, c={res.first_fail:g} fails; goodput" in text
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
        lv = S.LevelResult(level=lvl, windows=[{"request_throughput_per_s": thr}])
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


def test_a_trial_with_sla_search_finds_the_fakes_max_concurrency_and_loads_it(tmp_path, monkeypatch):
    """The FAKE server's TTFT is 10 ms + 50 ms per other request in flight: at concurrency c about
    10 + 50 (c - 1) ms, so an SLO of median TTFT <= 235 ms holds up to c=5 (210 ms) and not at c=6 (260 ms); the
    median, so that a request delayed by a busy test machine does not decide a level."""
    from timed_openai_server import FakeServerProcess, FakeTiming

    import tunelab.flows.trial as T
    from tunelab import records as R
    from tunelab.bundle import read_bundle
    from tunelab.plan import Plan, Trial, Workload
    from tunelab.reports.report import comparison_frame, sla_search_lines
    from tunelab.runtime import Runtime
    from tunelab.warehouse.loader import load_bundle

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
        trial = Trial(runtime="fake-rt", model="unused", model_id="unused", engine_args={}, env={})
        runtime = Runtime(name="fake-rt", device="cpu", python=sys.executable, versions={"vllm": "0.32.0"})
        started = dt.datetime.now(dt.timezone.utc)
        sweep_id = R.sweep_id(started, plan.name)
        sweep = R.Sweep(sweep_id=sweep_id, plan_name=plan.name, host="fake-host", started_at=started)
        (tmp_path / "logs").mkdir()
        ctx = T.TrialContext(sweep=sweep, results_dir=str(tmp_path / "results"), logs_dir=str(tmp_path / "logs"))
        trial_id = R.trial_id(sweep_id, trial.config_key, runtime.name, 0)
        bundle = T.run_trial.fn(trial, trial_id, plan, runtime, ctx)

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
    assert len(lines) == 1 and "max load under SLO c=5, c=6 fails; goodput" in lines[0]
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
