"""While a sweep runs (issue 20, items 1, 2 and 4): the progress events and the live display of `tunelab run`
(plain lines when stdout is not a terminal), the plan's cost and limits, prompts built a chunk at a time with
the same prompts as before, and a trial killed with SIGKILL: `tunelab clean` stops its server and marks its
Prefect runs Crashed, `tunelab load` loads the windows it had measured as `incomplete`.

FAKES: the timed OpenAI server (tests/fakes/timed_openai_server.py) stands in for vLLM; the kill test runs
the real `tunelab` command with it (tests/fakes/fake_server_sweep_cli.py)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from timed_openai_server import FakeServerProcess, FakeTiming, fake_tokenize  # noqa: E402
from tunelab.core import progress as P  # noqa: E402
from tunelab.core.plan import Plan, PlanError, Workload, load_plan  # noqa: E402
from tunelab.reports.live import SweepDisplay, fmt_s, window_left_s  # noqa: E402
from tunelab.tasks.loadgen.prompts import PromptBuilder  # noqa: E402
from test_flows import _HOLD_SLOT, prefect_server  # noqa: E402,F401  (a real Prefect server; a slot holder)

REPO = Path(__file__).resolve().parents[1]
MODEL = "fake-model"


# -- events and the display -----------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _events(clock: _Clock) -> list[tuple[float, str, dict]]:
    """A scripted sweep of two trials: (seconds to advance, phase, fields)."""
    return [
        (0, "sweep", dict(trials_total=2, estimate_s=100.0)),
        (0, "trial", dict(trial_id="t1", trial_index=1, trials_total=2, label="eager")),
        (1, "clean", {}),
        (1, "boot", dict(estimate_s=30.0)),
        (20, "prompts", dict(done=0, total=4, window_index=1, windows_total=2)),
        (1, "window", dict(done=0, total=4, label="w c=1 repeat 1/2", window_index=1, windows_total=2)),
        (2, "window", dict(done=1, total=4, label="w c=1 repeat 1/2", window_index=1, windows_total=2)),
        (2, "window", dict(done=2, total=4, label="w c=1 repeat 1/2", window_index=1, windows_total=2)),
        (20, "window", dict(done=3, total=4, label="w c=1 repeat 1/2", window_index=1, windows_total=2)),
        (1, "window", dict(done=4, total=4, label="w c=1 repeat 1/2", window_index=1, windows_total=2)),
        (1, "teardown", {}),
        (2, "trial", dict(trial_id="t2", trial_index=2, trials_total=2, label="default")),
        (1, "validate", {}),
    ]


def test_display_prints_plain_lines_per_phase_and_throttles_window_progress():
    """Not a terminal: one line per phase change, window progress at most every plain_interval_s and at its end,
    with the window's and the sweep's time left; nothing drawn."""
    clock, out = _Clock(), io.StringIO()
    with SweepDisplay(out=out, terminal=False, plain_interval_s=10.0, clock=clock):
        for dt_, phase, fields in _events(clock):
            clock.t += dt_
            P.emit(phase, **fields)
    lines = out.getvalue().splitlines()
    # The estimate says what it assumes, with the load it saw (issue: "8 min 03 s whatever the load").
    assert lines[0].startswith("sweep: 2 trial(s); estimated 1 min 40 s (assumes an otherwise idle machine; load now ")
    assert lines[1] == "trial 1/2 eager: starts; sweep time left 1 min 40 s"
    assert lines[2:5] == ["trial 1/2 eager: checking the device is clean",
                          "trial 1/2 eager: booting the server (typically ~30 s)",
                          "trial 1/2 eager: building prompts (4 for window 1/2)"]
    window = [ln for ln in lines if "window 1/2 w c=1" in ln]
    # 0/4 (phase change), 3/4 (10 s after the last line; 1/4 and 2/4 came sooner), 4/4 (the window's end)
    assert [ln.split(": ")[2].split(" requests")[0] for ln in window] == ["0/4", "3/4", "4/4"]
    assert window[1].endswith("~8 s left in the window")  # 24 s for 3 requests -> 8 s for the last one
    assert window[2].endswith("4/4 requests")  # a finished window says nothing is left (it read "~0 s left")
    # The first trial took 51 s: the second one's line estimates 51 s left (one trial x its mean duration).
    assert lines[-2] == "trial 2/2 default: starts; sweep time left 51 s"
    assert lines[-1] == "trial 2/2 default: validating (quality gate)"
    assert "\x1b[" not in out.getvalue()  # plain text: no terminal control codes
    assert not P.sinks()  # removed on exit


def test_the_next_levels_warm_up_prompts_are_labelled_warm_up_not_the_last_window():
    """After window 1/2, the next level's warm-up builds its prompts (label 'w c=4 warm-up', no window): the line
    read 'building prompts (4 for window 1/2)', the window just measured; then the window's own build."""
    clock, out = _Clock(), io.StringIO()
    with SweepDisplay(out=out, terminal=False, plain_interval_s=10.0, clock=clock):
        for dt_, phase, fields in _events(clock)[:8] + [
                (1, "prompts", dict(done=0, total=4, label="w c=4 warm-up")),
                (1, "prompts", dict(done=4, total=4)),  # a chunk of the same build: no label, no window
                (1, "warmup", dict(done=0, total=4, label="w c=4 warm-up")),
                (1, "prompts", dict(done=0, total=4, label="w c=4 repeat 1/1", window_index=2, windows_total=2))]:
            clock.t += dt_
            P.emit(phase, **fields)
    lines = [ln for ln in out.getvalue().splitlines() if "prompts" in ln]
    assert lines == ["trial 1/2 eager: building prompts (4 for window 1/2)",
                     "trial 1/2 eager: building warm-up prompts (4 for w c=4)",
                     "trial 1/2 eager: building prompts (4 for window 2/2)"], lines


def test_display_on_a_terminal_draws_the_trial_the_phase_and_a_bar():
    from rich.console import Console

    clock = _Clock()
    d = SweepDisplay(out=io.StringIO(), terminal=False, clock=clock)
    for dt_, phase, fields in _events(clock)[:8]:
        clock.t += dt_
        d(P.ProgressEvent(phase=phase, **fields))
    con = Console(file=io.StringIO(), width=120, record=True)
    con.print(d._render())
    text = con.export_text()
    assert "trial 1/2 eager" in text and "window 1/2 w c=1 repeat 1/2: 2/4 requests" in text
    assert "━" in text  # the progress bar of the window
    assert "sweep: " in text and "left" in text


def test_waiting_for_a_device_is_shown_and_does_not_eat_the_sweep_estimate():
    """Issue 29 item 18: a trial waiting for a device another sweep holds says so (whom it waits for), and the wait
    does not use up the plan's estimate (before: nothing shown, then "starts; sweep time left 0 s")."""
    clock, out = _Clock(), io.StringIO()
    d = SweepDisplay(out=out, terminal=False, clock=clock)
    d(P.ProgressEvent("sweep", trials_total=2, estimate_s=100.0))
    clock.t += 5
    d(P.ProgressEvent("wait", trial_id="t1", trial_index=1, trials_total=2, label="eager",
                      detail="device cpu0: another sweep on this host holds it"))
    clock.t += 300  # longer than the whole estimate
    d(P.ProgressEvent("wait", trial_id="t1", trial_index=1, trials_total=2, label="eager",
                      detail="slot tunelab-h-cpu0: held by sweep s1"))
    assert "waiting for a device (slot tunelab-h-cpu0: held by sweep s1)" in d._phase_text()
    assert d.state.phase_started == 105.0  # the wait's clock runs from its first event
    d(P.ProgressEvent("trial", trial_id="t1", trial_index=1, trials_total=2, label="eager"))
    lines = out.getvalue().splitlines()
    assert lines[1] == "trial 1/2 eager: waiting for a device (device cpu0: another sweep on this host holds it)"
    assert lines[-1] == "trial 1/2 eager: starts; sweep time left 1 min 35 s", lines  # 100 s - 5 s before the wait
    assert d.sweep_left_s() == pytest.approx(95.0)


def test_emit_checks_phases_and_drops_a_sink_that_raises():
    seen = []

    def bad(ev):
        raise RuntimeError("display broke")

    P.add_sink(seen.append)
    P.add_sink(bad)
    try:
        with P.current_trial("tr-1"):
            ev = P.emit("boot", estimate_s=30.0)
        assert ev.trial_id == "tr-1" and seen == [ev]
        assert bad not in P.sinks()  # a display error never reaches the sweep
        with pytest.raises(ValueError, match="phase 'booting' is not one of"):
            P.emit("booting")
    finally:
        P.remove_sink(seen.append)
    assert P.emit("boot") is None  # no sink: nothing built


def test_time_formatting_and_window_estimate():
    assert [fmt_s(x) for x in (None, 4.4, 65, 7500)] == ["?", "4 s", "1 min 05 s", "2 h 05 min"]
    assert window_left_s(10.0, 0, 4) is None and window_left_s(9.0, 3, 4) == 3.0


# -- the measurement reports its phases and hands over each window as it ends ----------------------------------------
@pytest.fixture(scope="module")
def fake():
    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002, tokens_per_chunk=1), model=MODEL) as s:
        yield s


def test_measurement_reports_prompt_warmup_and_window_events_and_each_window(fake):
    from tunelab.tasks.measure import measure_server

    plan = Plan(name="t", model="unused", workloads=[Workload(name="w", prompt_tokens=24, output_tokens=4,
                                                              num_requests=5)],
                concurrency=[1, 2], warmup_requests=2, repeats=2, seed=7)
    events, kept = [], []
    P.add_sink(events.append)
    try:
        res = measure_server(fake.base_url, "k", MODEL, plan, progress=lambda *a: None,
                             on_window=lambda r: kept.append(len(r.measurements)))
    finally:
        P.remove_sink(events.append)
    assert kept == [1, 2, 3, 4]  # after every window, the windows so far
    assert len(res.measurements) == 4
    phases = [e.phase for e in events]
    assert phases[0] == "prompts" and "warmup" in phases
    windows = [e for e in events if e.phase == "window"]
    assert sorted({e.window_index for e in windows}) == [1, 2, 3, 4] and {e.windows_total for e in windows} == {4}
    for k in range(1, 5):  # each window: from 0 to 5 requests, one event per request, after its prompts
        w = [e.done for e in windows if e.window_index == k]
        assert w == [0, 1, 2, 3, 4, 5]
        first = next(i for i, e in enumerate(events) if e.phase == "window" and e.window_index == k)
        assert events[first - 1].phase == "prompts" and events[first - 1].done == 5
    warm = [e for e in events if e.phase == "warmup"]
    assert warm[-1].done == warm[-1].total == 2  # c=2 warms up with max(2, 2) requests


# -- prompts: built a chunk at a time, the same prompts as before ----------------------------------------------------
class _Resp:
    def __init__(self, n: int) -> None:
        self.n = n

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict:
        return {"count": self.n}


class _FakeTokenizeClient:
    """FAKE /tokenize: the fake server's tokenizer; with ``quirk`` one more token per 'e t' in the text, so counts
    are not additive over words and the sampled checks and word-by-word fixes run."""

    quirk = False

    async def post(self, path: str, json: dict) -> _Resp:
        t = json["prompt"]
        return _Resp(len(fake_tokenize(t)) + (t.count("e t") if self.quirk else 0))

    async def request(self, method: str, path: str, json: dict, **_: object) -> _Resp:
        """What the control calls use (tasks.loadgen.control.control_call: httpx's ``request``)."""
        assert (method, path) == ("POST", "/tokenize"), (method, path)
        return await self.post(path, json)


async def _prompt_sequence(chunk: int | None) -> tuple[list[str], dict]:
    c = _FakeTokenizeClient()
    b = PromptBuilder(c, "m", trust_after=8, sample_size=3)
    out: list[str] = []
    calls = [(1, 5, 40, "", False), (2, 20, 64, "", False), (3, 30, 50, "shared prefix words here", True),
             (4, 300, 33, "", False), (5, 40, 20, "", True), (6, 600, 25, "", False), (7, 50, 30, "", True)]
    for seed, n, tok, prefix, quirk in calls:
        c.quirk = quirk
        if chunk is None:
            out += await b.many(n, tok, random.Random(seed), prefix=prefix)
        else:
            out += [p async for p in b.iter_many(n, tok, random.Random(seed), prefix=prefix, chunk=chunk)]
    out += await b.many(10, 30, random.Random(9), verify="all")
    out += await b.many(10, 30, random.Random(10), verify="none")
    return out, b.stats


#: sha256 of the prompts of ``_prompt_sequence`` as the former all-at-once ``PromptBuilder.many`` built them
#: (tunelab before the chunked build), with its stats: the same seeds must keep giving the same prompts.
FORMER_DIGEST = "db5ecb888c813a99b8d7d7572d6743dcfd27f1caf495df01d34e1913d8536fd5"
FORMER_STATS = {"built": 1065, "verified": 97, "adjusted": 25, "tokenize_calls": 250}


@pytest.mark.parametrize("chunk", [None, 1, 7, 256])
def test_chunked_prompts_are_the_former_prompts(chunk):
    """Exact, sampled and unchecked builds, with fixes after misses (sampled and not), chunk boundaries
    anywhere: the prompts and the round trips are those of the former build."""
    out, stats = asyncio.run(_prompt_sequence(chunk))
    assert len(out) == 1065
    assert hashlib.sha256("\n".join(out).encode()).hexdigest() == FORMER_DIGEST
    assert stats == FORMER_STATS


def test_prompts_streamed_a_chunk_at_a_time_hold_little_memory():
    """20,000 prompts of 64 tokens consumed one by one: the builder holds a chunk of drafts and the rng states,
    not all drafts (the former build held every draft's word list and every text: a 12.8 MB peak here; the
    chunked one 0.35 MB, measured with tracemalloc)."""
    b = PromptBuilder(_FakeTokenizeClient(), "m", verify="none")

    async def consume() -> int:
        n = 0
        async for _ in b.iter_many(20_000, 64, random.Random(3)):
            n += 1
        return n

    asyncio.run(b._learn())
    tracemalloc.start()
    try:
        n = asyncio.run(consume())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 20_000
    assert peak < 1_500_000, f"peak {peak / 1e6:.1f} MB"


# -- the plan's size -------------------------------------------------------------------------------------------
def _plan_file(tmp_path: Path, **over) -> Path:
    import yaml

    doc = dict(name="p", model="unused", workloads=[dict(name="w", prompt_tokens=64, output_tokens=8,
                                                         num_requests=10)], concurrency=[1, 4], repeats=2)
    doc.update(over)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_a_plan_beyond_the_limits_is_refused_naming_the_field_and_the_limit(tmp_path):
    big = [dict(name="w", prompt_tokens=64, output_tokens=8, num_requests=1_000_000_000)]
    with pytest.raises(PlanError, match=r"workloads\[0\]\.num_requests: .*1,000,000,000 measured requests in one "
                                        r"window is more than the limit of 100,000"):
        load_plan(_plan_file(tmp_path, workloads=big))
    with pytest.raises(PlanError, match=r"requests_per_concurrency: 1,280,000 measured requests in the window of w "
                                        r"at c=128, more than the limit of 100,000"):
        load_plan(_plan_file(tmp_path, concurrency=[128], requests_per_concurrency=10_000))
    long = [dict(name="w", prompt_tokens=100_000, output_tokens=8, num_requests=1_000)]
    with pytest.raises(PlanError, match=r"workloads\[0\]\.num_requests: the window of w at c=1 holds 1,000 prompts "
                                        r"of 100,000 tokens = 100,000,000 prompt tokens, more than the limit"):
        load_plan(_plan_file(tmp_path, workloads=long))


def test_plan_cost_counts_and_estimate_from_typical_figures(tmp_path):
    from tunelab.core.plan_cost import TYPICAL, plan_cost

    plan = load_plan(_plan_file(tmp_path, engine_args={"enforce-eager": [True, False]}, warmup_requests=2))
    c = plan_cost(plan, {"cpu": "cpu"})
    assert c.boots == 2 and c.windows == 2 * 1 * 2 * 2  # boots x workloads x levels x repeats
    assert c.measured_requests == 2 * 2 * 2 * 10 and c.warmup_requests == 2 * (2 + 4)
    fig = TYPICAL["cpu"]
    e2el = fig.ttft_s + 8 * fig.tpot_s  # one request at c: TTFT + output_tokens x TPOT
    per_boot = (2 + 20) * e2el / 1 + (4 + 20) * e2el / 4  # (warm-up + 2 repeats x 10) / rate at c=1 and c=4
    assert c.boot_s == 2 * fig.boot_s and c.requests_s == pytest.approx(2 * per_boot)
    assert c.largest_window_requests == 10 and c.largest_window_prompt_tokens == 640 and not c.warnings
    gpu = plan_cost(plan, {"cpu": "cuda"})
    assert gpu.boot_s == 2 * TYPICAL["cuda"].boot_s


def test_a_dataset_workloads_estimate_uses_the_files_output_lengths_not_the_cap(tmp_path):
    """ShareGPT-style records carry reference answers, not lengths: the estimate assumed every request asked for
    max_output_tokens (1024 here, the answers ~60 words), so raising the cap lengthened the estimate. Now the
    mean of the answers sets it, the cap changes nothing the answers stay under, and the how line says so."""
    import json

    from tunelab.core.plan_cost import CHARS_PER_TOKEN, TYPICAL, plan_cost
    from tunelab.core.workloads import read_dataset, synthetic_sharegpt

    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(synthetic_sharegpt(16, seed=1)))
    answers = [min(max(1, len(e.output_text) // CHARS_PER_TOKEN), 1024) for e in read_dataset(data)]
    mean = sum(answers) / len(answers)
    assert mean < 300  # far below the cap the estimate assumed

    def cost(cap):
        wl = [dict(name="sg", type="dataset", path=str(data), num_requests=10, max_output_tokens=cap)]
        return plan_cost(load_plan(_plan_file(tmp_path, workloads=wl, concurrency=[1], repeats=1,
                                              warmup_requests=0)), {"cpu": "cpu"})

    c, big = cost(1024), cost(4096)
    fig = TYPICAL["cpu"]
    assert c.requests_s == pytest.approx(10 * (fig.ttft_s + mean * fig.tpot_s))
    assert big.requests_s == pytest.approx(c.requests_s)
    assert f"output_tokens of dataset workload sg: ~{mean:.0f}, the mean of the file's output lengths" in c.how
    assert f"{len(answers)} reference answers at ~4 characters a token; capped at 1024" in c.how


def test_plan_check_prints_the_cost_and_warns_on_a_plan_of_days(tmp_path):
    from typer.testing import CliRunner

    from tunelab.cli import app

    r = CliRunner().invoke(app, ["plan", "check", str(_plan_file(tmp_path))])
    assert r.exit_code == 0, r.output
    assert "cost: 1 boot(s), 4 measured window(s), 40 measured + 8 warm-up requests" in r.output
    assert "estimated time: ~" in r.output and "how: boots x typical boot" in r.output
    big = [dict(name="w", prompt_tokens=64, output_tokens=512, num_requests=100_000)]
    r = CliRunner().invoke(app, ["plan", "check", str(_plan_file(tmp_path, workloads=big, repeats=10))])
    assert r.exit_code == 0 and "warning: estimated" in r.output and "more than 24 h" in r.output
    r = CliRunner().invoke(app, ["plan", "check", str(_plan_file(
        tmp_path, workloads=[dict(name="w", prompt_tokens=8, output_tokens=8, num_requests=1_000_000_000)]))])
    assert r.exit_code == 2 and "limit of 100,000" in r.output


# -- kill -9: the windows measured stay, `tunelab clean` puts the rest right ------------------------------------------
def _tunelab() -> list[str]:
    return [sys.executable, "-c", "import sys; from tunelab.cli import app; sys.exit(app())"]


def _incomplete_windows(results: Path) -> int:
    from tunelab.core.bundle import list_bundles, read_bundle

    for b in list_bundles(results):
        try:
            t = read_bundle(b)
        except Exception:
            continue
        if t["trial"]["status"].iloc[0] == "incomplete":
            return len(t.get("measurements", []))
    return 0


def test_kill_9_keeps_the_measured_windows_and_clean_stops_the_server_and_crashes_the_runs(tmp_path):
    """The real `tunelab run` (FAKE server), killed with SIGKILL after its first window: the bundle on disk
    holds that window as 'incomplete'; `tunelab clean` stops the orphaned server and marks the sweep's and the
    trial's Prefect runs Crashed; `tunelab load` loads the window with status 'incomplete'."""
    import duckdb

    home = tmp_path / "home"
    env = {**os.environ, "TUNELAB_HOME": str(home), "FAKE_ITL_S": "0.05", "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)  # the ephemeral Prefect of `tunelab run` on a fresh machine
    # A Prefect database of this test's own: the suite's shared one holds other tests' runs, and this test counts
    # the runs it finds there.
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    plan = _plan_file(tmp_path, workloads=[dict(name="w", prompt_tokens=16, output_tokens=8, num_requests=6)],
                      concurrency=[1], repeats=4, warmup_requests=1)
    out = tmp_path / "run.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakes" / "fake_server_sweep_cli.py"), "run",
                                 str(plan)], env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while _incomplete_windows(home / "results") < 1:
            assert proc.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        kept = _incomplete_windows(home / "results")
        assert 1 <= kept < 4  # killed before its last window
        servers = json.loads((home / "state" / "servers.json").read_text())
        assert len(servers) == 1
        server_pid = servers[0]["pid"]
        os.kill(server_pid, 0)  # the fake server outlived the sweep, as vllm serve did
        # The display's plain lines (stdout is a file): the boot and the window were shown as they happened.
        shown = out.read_text()
        assert "trial 1/1 default: booting the server" in shown and "window 1/4 w c=1 repeat 1/4" in shown

        r = subprocess.run(_tunelab() + ["clean"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "servers stopped: 1;" in r.stdout and "runs marked crashed: 2" in r.stdout, r.stdout + r.stderr
        assert f"tunelab home: {home}" in r.stdout  # which home it examined
        assert "1 incomplete trial bundle(s)" in r.stdout
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)
        assert json.loads((home / "state" / "servers.json").read_text()) == []
        # Prefect's own record: the sweep and its trial are Crashed, with the reason.
        states = subprocess.run([sys.executable, "-c", (
            "from tunelab.host import prefect_env; prefect_env.configure(); prefect_env.start_ephemeral_server()\n"
            "from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c:\n"
            "    for r in c.read_flow_runs(): print(r.flow_id is not None, r.state.type.value, r.state.message)")],
            env=env, capture_output=True, text=True, timeout=300)
        lines = [ln for ln in states.stdout.splitlines() if ln.startswith("True ")]
        assert len(lines) == 2 and all(" CRASHED " in ln and "died without ending it" in ln for ln in lines), \
            states.stdout + states.stderr

        r = subprocess.run(_tunelab() + ["load"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        db = next(home.glob("*.duckdb"))  # the default warehouse of this home (tunelab.host.paths.db_path)
        with duckdb.connect(str(db), read_only=True) as con:
            status, n = con.execute("SELECT t.status, count(m.trial_id) FROM trials t "
                                    "LEFT JOIN measurements m USING (trial_id) GROUP BY t.status").fetchone()
        assert status == "incomplete" and n == kept
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_clean_releases_the_slot_of_a_killed_holder_at_once(prefect_server):
    """A sweep holding a device's Prefect slot, killed with SIGKILL, leaves the lease on the server (60 s here,
    then up to the repossessor's 15 s): `clean` sees the holder's PID gone, releases that lease at once and drops
    the record; a live holder's slot is left alone."""
    from prefect.client.orchestration import get_client

    from tunelab.flows.clean import clean
    from tunelab.flows.sweep import ensure_slots
    from tunelab.host.slot_holders import read_holder

    dead, alive = "tunelab-test-clean-gpu0", "tunelab-test-clean-gpu1"
    ensure_slots([dead, alive])
    env = dict(os.environ, PREFECT_API_URL=prefect_server)
    holders = [subprocess.Popen([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), name=n)], env=env,
                                stdout=subprocess.PIPE, text=True, start_new_session=True) for n in (dead, alive)]
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["held", "held"]
        os.killpg(holders[0].pid, signal.SIGKILL)
        holders[0].wait()
        lines: list[str] = []
        rep = clean(results_dir=None, log=lines.append)
        assert rep.slots_released == [dead] and not rep.problems, (lines, rep.problems)
        assert any(f"PID {holders[0].pid} is gone" in ln and "its lease released" in ln for ln in lines), lines
        assert read_holder(dead) is None and read_holder(alive).pid == holders[1].pid
        with get_client(sync_client=True) as c:
            assert c.read_global_concurrency_limit_by_name(dead).active_slots == 0
            assert c.read_global_concurrency_limit_by_name(alive).active_slots == 1
    finally:
        for h in holders:
            if h.poll() is None:
                os.killpg(h.pid, signal.SIGKILL)
                h.wait()


def test_load_note_says_the_estimate_assumes_an_idle_machine_and_names_a_busy_one():
    """The estimate is made for an idle machine: the note says so, names the load and core count it saw, and
    adds "expect longer" only when runnable work exceeds the cores."""
    from tunelab.core.plan_cost import load_note

    assert load_note(0.3, 2) == "assumes an otherwise idle machine; load now 0.3 on 2 cores"
    busy = load_note(8.2, 2)
    assert busy == "assumes an otherwise idle machine; load now 8.2 on 2 cores: expect longer"
    assert "expect longer" not in load_note(2.0, 2)
    assert load_note(1.5, 1).endswith("on 1 core: expect longer")



def test_the_progress_artifact_says_what_the_ended_trials_came_to():
    """Issue 29 item 13: the progress artifact read only "Progress: 100%"; its description now counts the ended
    trials by status and names the last one."""
    from tunelab.flows.sweep import progress_description

    sts = [{"status": "ok"}, {"status": "boot_failed"}, {"status": "ok"}, {"status": "ok"}]
    text = progress_description("s1", sts, 6, "eager ok")
    assert text == "s1: 4/6 trials ended: 3 ok, 1 boot_failed; last: eager ok"
    assert progress_description("s1", [], None, "x ok") == "s1: 0/? trials ended: none; last: x ok"


def test_load_now_names_the_load_and_the_cores_alone():
    """The A/B's busy line names the load it saw without the estimate's idle-machine assumption."""
    from tunelab.core.plan_cost import load_now

    assert load_now(4.7, 2) == "load now 4.7 on 2 cores"
    assert load_now(0.5, 1) == "load now 0.5 on 1 core"
