"""End to end on the real CPU runtime: a trial whose server stalls during one measured repeat is not marked pass.

One `tunelab run` of a plan with two replicates of the same config (two boots, one after the other). While the
first trial measures its second repeat, ``tests/fault_injection.py`` (FAULT INJECTION, test-side) stops the
server's whole process group in 200 ms slices with 5 ms of running between them (SIGSTOP/SIGCONT): the server
makes about one engine step (one token per request) per 205 ms; the other window is untouched. Boot, load
generator, metrics, the quality suites (great-expectations) and the loader are the normal code path of
`tunelab run`. The second trial is the control: the same config, measured in the same run, without a stall.

Why so large a stall: on a shared 2-core box a neighbour's load alone moved the TPOT p50 of un-stalled
windows between 3 and 150 ms (the engine's OpenMP threads lose a core), and once delivered a whole window in
one lump (TPOT near 0). A stall that stops the server 2/3 of the time (150 ms / 75 ms) only tripled TPOT and
was hidden by that; with 10 ms of running per 200 ms slice the engine still made several steps per slice. What
a stall adds per token is the stop time divided by the steps per run slice, so the run slice is kept shorter
than a step.

What must happen: the repeat-to-repeat CV of TPOT p50 (``cv_tpot_p50``, warn) of the stalled trial is above
``max_cv_p50_tpot`` (0.25), and GX's observed value is the CV of that trial's TPOT p50s, so its verdict is not
``pass``; the stall covered exactly the stalled window (injector timestamps vs the requests'
``send_ts``/``end_ts``) and put its TPOT p50 above a floor (50 ms) that host load can only raise. Other checks
the stall can trip are reported, not required: ``cv_ttft_p50``; ``server_client_ttft_agree`` (fail), since a
request that waits in the socket of a stopped server is late for the client but not for the server's own
TTFT; ``warmup_*_settled``. The control is checked by the same suites; its verdict is not asserted (a busy
box can make it warn), only that its median window TPOT p50 is below the stalled one.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from fault_injection import run_with_stall

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.runtime

STOP_S, RUN_S = 0.2, 0.005  # about one engine step per 205 ms: TPOT of the stalled window >~ 100 ms
REPEATS = 2
STALLED_REPEAT = 1  # 0-based: the trial's second measured window
N_REQUESTS = 4
TPOT_FLOOR_S = 0.05  # (STOP_S + RUN_S) / 4: even four engine steps per run slice leave TPOT above this


@pytest.fixture(scope="module")
def stalled_sweep(tmp_path_factory, cpu_runtime, tiny_model):
    """Run the sweep with one stalled repeat; returns the stall report and the warehouse rows (DataFrames)."""
    out = tmp_path_factory.mktemp("stalled")
    plan = out / "stalled.yaml"
    plan.write_text(yaml.safe_dump({
        "name": "it-stalled-repeat",
        "model": str(tiny_model),
        "runtime": "cpu",
        "engine_args": {"max-model-len": 512, "enforce-eager": True},
        # 32 output tokens: a request decodes through tens of stop/run slices, so its TPOT is hit every time.
        "workloads": [{"name": "short", "prompt_tokens": 32, "output_tokens": 32, "num_requests": N_REQUESTS}],
        "concurrency": [4],
        "warmup_requests": N_REQUESTS,  # the full batch of 4 once before measuring
        "repeats": REPEATS,
        "replicates": 2,
        "boot_timeout_s": 300,
    }))
    env = dict(os.environ, TUNELAB_DB=str(out / "wh.duckdb"), TUNELAB_RESULTS=str(out / "results"),
               PREFECT_HOME=str(out / "prefect"), PYTHONUNBUFFERED="1")
    rc, output, report = run_with_stall([sys.executable, "-m", "tunelab.cli", "run", str(plan)], REPO, env,
                                        STALLED_REPEAT, REPEATS, stop_s=STOP_S, run_s=RUN_S)
    assert rc == 0, output[-4000:]
    assert report is not None and report.trial_id, f"the stall never started: {report}\n" + output[-4000:]
    con = duckdb.connect(str(out / "wh.duckdb"), read_only=True)
    try:
        trials = con.execute("SELECT trial_id, status, quality_verdict FROM trials").fetchdf()
        meas = con.execute("SELECT trial_id, repeat, ttft_p50_s, tpot_p50_s, completed, failed FROM measurements "
                           "ORDER BY trial_id, repeat").fetchdf()
        reqs = con.execute("SELECT trial_id, repeat, min(send_ts) AS first_send, max(end_ts) AS last_end "
                           "FROM requests GROUP BY ALL").fetchdf()
        checks = con.execute("SELECT trial_id, suite, expectation, success, severity, observed, threshold, detail "
                             "FROM quality_checks").fetchdf()
    finally:
        con.close()
    return report, trials, meas, reqs, checks


def _cv(s) -> float:
    return float(s.std(ddof=1) / s.mean())


def _observed_max(observed: str) -> float:
    """The value in a CV check's ``observed`` ('max 0.707 (short/concurrency/4)')."""
    m = re.match(r"max ([0-9.eE+-]+) ", observed)
    assert m, observed
    return float(m.group(1))


def _print_summary(report, trials, meas, checks) -> None:
    failed = checks[checks["success"] == False]  # noqa: E712 (nullable booleans)
    short = {t: t.rsplit("/", 1)[-1] + (" (stalled)" if t == report.trial_id else " (control)")
             for t in trials["trial_id"]}
    print(f"\nstall: {report.slices} slices, stopped {report.stopped_s:.2f} s of {report.wall_s:.2f} s "
          f"({report.stopped_frac:.0%}), mean run slice {(report.wall_s - report.stopped_s) / max(report.slices, 1) * 1e3:.1f} ms, "
          f"real-time thread {report.realtime}")
    for t in trials.itertuples():
        tp = meas[meas["trial_id"] == t.trial_id].set_index("repeat")
        print(f"  {short[t.trial_id]}: verdict {t.quality_verdict}; TPOT p50 ms by repeat "
              f"{[round(v * 1e3, 2) for v in tp['tpot_p50_s']]}, TTFT p50 ms {[round(v * 1e3, 1) for v in tp['ttft_p50_s']]}")
        for r in failed[failed["trial_id"] == t.trial_id].itertuples():
            print(f"    failed {r.severity} {r.expectation}: observed {r.observed}; threshold {r.threshold}")


def test_stalled_repeat_is_not_pass(stalled_sweep):
    report, trials, meas, reqs, checks = stalled_sweep
    _print_summary(report, trials, meas, checks)
    assert len(trials) == 2 and set(trials["status"]) == {"ok"}
    stalled = trials.set_index("trial_id").loc[report.trial_id]
    assert stalled["quality_verdict"] in ("warn", "fail")  # not pass

    # The injection happened, and covered the stalled window and nothing of the other one.
    assert report.slices >= 10 and report.stopped_frac > 0.9, report
    w = reqs[reqs["trial_id"] == report.trial_id].set_index("repeat")
    assert w.at[STALLED_REPEAT - 1, "last_end"] <= report.started_at < w.at[STALLED_REPEAT, "first_send"], (report, w)
    assert report.ended_at >= w.at[STALLED_REPEAT, "last_end"], (report, w)

    m = meas[meas["trial_id"] == report.trial_id].set_index("repeat")
    assert (m["failed"] == 0).all() and (m["completed"] == N_REQUESTS).all()  # a stall, not errors
    # The stall sets a floor under the stalled window's TPOT: a step per 205 ms, a few at most (load on the box
    # only raises it). Not asserted against the other window: a neighbour once made an un-stalled one 150 ms.
    assert m.at[STALLED_REPEAT, "tpot_p50_s"] >= TPOT_FLOOR_S, m

    c = checks[checks["trial_id"] == report.trial_id].set_index("expectation")
    cv = c.loc["cv_tpot_p50"]
    assert (cv["suite"], cv["severity"], cv["success"]) == ("aggregates", "warn", False), cv.to_dict()
    assert cv["threshold"] == "<= 0.25" and "failing: short/concurrency/4" in cv["detail"]
    observed = _observed_max(cv["observed"])
    assert observed > 0.25
    assert observed == pytest.approx(_cv(m["tpot_p50_s"]), rel=1e-2)  # GX judged the stalled trial's CV


def test_control_without_stall_is_checked_by_the_same_suites_and_is_better(stalled_sweep):
    report, trials, meas, reqs, checks = stalled_sweep
    control_id = next(t for t in trials["trial_id"] if t != report.trial_id)
    control = trials.set_index("trial_id").loc[control_id]
    assert control["status"] == "ok" and control["quality_verdict"] in ("pass", "warn", "fail")
    by_trial = {t: g.set_index("expectation") for t, g in checks.groupby("trial_id")}
    assert set(by_trial[control_id].index) == set(by_trial[report.trial_id].index)  # the same suites and checks
    cv_control = by_trial[control_id].loc["cv_tpot_p50"]
    cv_stalled = by_trial[report.trial_id].loc["cv_tpot_p50"]
    print(f"\ncv_tpot_p50: stalled {cv_stalled['observed']} (success {cv_stalled['success']}), "
          f"control {cv_control['observed']} (success {cv_control['success']})")
    # Worse on the stalled metric than the control trial (its median window TPOT p50). Not the CVs: with 2
    # repeats a CV is at most sqrt(2), which a control whose one window a neighbour made bursty (TPOT near 0)
    # also reaches.
    mc = meas[meas["trial_id"] == control_id]
    ms = meas[meas["trial_id"] == report.trial_id].set_index("repeat")
    assert ms.at[STALLED_REPEAT, "tpot_p50_s"] > mc["tpot_p50_s"].median(), (ms, mc)
