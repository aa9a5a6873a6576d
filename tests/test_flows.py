"""The sweep as a Prefect product, against a real local Prefect server started by this module.

Fast tests (no vLLM): the device scheduler, slot names, GPU counts of parallel configs, the real
``tuning_sweep`` flow with a FAKE trial body (no server: sleeps and writes a synthetic bundle) on a FAKE
two-GPU inventory, two sweeps at once on one device, the ``compare`` flow on a synthetic warehouse.
Runtime tests (``-m runtime``, real CPU vLLM; 4 boots in all): two real sweeps started at once on one device,
and cancellation through the API in the middle of a measurement, of a `tunelab run` and of a deployment run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real `prefect server start` on a free port with its own PREFECT_HOME; stopped (and checked gone) after."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    env = dict(os.environ, PREFECT_HOME=str(home), DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "prefect server exited during start"
        assert time.monotonic() - t0 < 120, "prefect server not healthy after 120 s"
        time.sleep(0.5)
    old = {k: os.environ.get(k) for k in ("PREFECT_API_URL",)}
    os.environ["PREFECT_API_URL"] = url
    # Prefect caches its settings per context; a fresh settings context picks the URL up.
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        yield url
        _retire_events_worker()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _stop_group(proc, signal.SIGTERM, 30)


def _retire_events_worker(timeout_s: float = 30) -> None:
    """Send this process's pending Prefect events while their server is still up, and stop its events worker.

    Why: the worker is one per process, and its client keeps the API URL it was made with. After this module's
    server stopped, the events of every later test went to the dead URL, each retried with reconnection back-off;
    the backlog grew, and at interpreter exit Prefect's handler drained it for minutes (a full suite that printed
    "passed" then did not exit). Stopped here, the next server's events get a new worker with the new URL."""
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=timeout_s, at_exit=False)


def _stop_group(proc: subprocess.Popen, sig: int, timeout_s: float, drained: bool = False) -> None:
    """Send ``sig`` to the process group of ``proc``; SIGKILL it if it has not ended after ``timeout_s``.
    ``drained``: another thread reads its output (then only wait for the exit)."""
    os.killpg(proc.pid, sig)
    wait = proc.wait if drained else proc.communicate
    try:
        wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        wait(timeout=10)


# -- pure parts --------------------------------------------------------------------------------------------
def test_gpus_needed_and_slot_names():
    from tunelab.flows.sweep import Device, gpus_needed, slot_name
    from tunelab.core.plan import PlanError, Trial

    def t(**args):
        return Trial(runtime="r", model="m", model_id="m", engine_args=args, env={})

    assert gpus_needed(t()) == 1
    assert gpus_needed(t(**{"tensor-parallel-size": 2})) == 2
    assert gpus_needed(t(**{"tensor-parallel-size": 2, "pipeline-parallel-size": 2})) == 4
    assert gpus_needed(t(tp=2, **{"data-parallel-size": 3})) == 6
    with pytest.raises(PlanError, match="tensor-parallel-size"):
        gpus_needed(t(**{"tensor-parallel-size": "two"}))
    assert slot_name("GPU_Host.example", Device("gpu", 3)) == "tunelab-gpu-host.example-gpu3"
    assert slot_name("box", Device("cpu", 0)) == "tunelab-box-cpu0"


def test_devices_from_inventory():
    from tunelab.flows.sweep import devices_from_inventory
    from tunelab.tasks.gpu import GpuInfo, Inventory

    inv = Inventory(True, gpus=[GpuInfo(1, "H200", "u1", 1000, 5), GpuInfo(0, "H200", "u0", 1000, 7)])
    assert [d.label for d in devices_from_inventory(inv)] == ["gpu0", "gpu1"]
    assert [d.baseline_mib for d in devices_from_inventory(inv, [1])] == [5]
    with pytest.raises(ValueError, match="gpus"):
        devices_from_inventory(inv, [2])
    assert devices_from_inventory(Inventory(False, reason="no GPU")) == []


def _intervals_overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_scheduler_parallel_in_order_and_multi_device():
    from tunelab.flows.sweep import Device, run_on_devices

    devs = [Device("gpu", 0), Device("gpu", 1)]
    need = {0: 1, 1: 1, 2: 1, 3: 2, 4: 1, 5: 3}
    log = []
    lock = threading.Lock()

    def run_one(job, ds):
        t0 = time.monotonic()
        time.sleep(0.3)
        with lock:
            log.append((job, [d.label for d in ds], t0, time.monotonic()))
        return job * 10

    skipped = []
    res = run_on_devices(list(need), need.__getitem__, devs, run_one, on_skip=lambda j, r: skipped.append((j, r)) or -1)
    assert res == [0, 10, 20, 30, 40, -1]
    assert skipped and skipped[0][0] == 5 and "needs 3" in skipped[0][1]
    by = {j: (ds, a, b) for j, ds, a, b in log}
    assert _intervals_overlap(by[0][1:], by[1][1:])            # two GPUs: two trials at once
    assert by[3][0] == ["gpu0", "gpu1"]                         # the 2-GPU trial holds both
    for j in (0, 1, 2, 4):                                      # ... and overlaps no other trial
        assert not _intervals_overlap(by[3][1:], by[j][1:])
    starts = sorted(by, key=lambda j: by[j][1])
    assert starts == [0, 1, 2, 3, 4]                            # started in plan order
    for d in ("gpu0", "gpu1"):                                  # one trial per device at a time
        iv = sorted((a, b) for j, (ds, a, b) in by.items() if d in ds)
        assert all(x[1] <= y[0] for x, y in zip(iv, iv[1:]))


def test_scheduler_takes_out_of_service_device_away():
    from tunelab.flows.sweep import Device, run_on_devices

    devs = [Device("gpu", 0), Device("gpu", 1)]
    bad: set = set()
    used = []

    def run_one(job, ds):
        used.append((job, ds[0].label))
        if job == 0:
            bad.add(ds[0])  # teardown not clean on gpu0
        time.sleep(0.05)
        return job

    skipped = []
    run_on_devices([0, 1, 2, 3], lambda j: 1, devs, run_one, on_skip=lambda j, r: skipped.append(j),
                   usable=lambda d: d not in bad)
    assert [d for j, d in used if j >= 2] == ["gpu1", "gpu1"]
    assert not skipped


def test_scheduler_interrupt_stops_and_reraises():
    from tunelab.flows.sweep import Device, run_on_devices

    devs = [Device("gpu", 0), Device("gpu", 1)]
    stopped = threading.Event()

    def run_one(job, ds):
        if job == 1:  # both devices busy: cancel (the main thread is starting job 1 or waiting for job 2)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        stopped.wait(5)  # a trial runs until its server is stopped
        return f"bundle{job}"

    # Other tests in the session (in-process servers, Prefect engines) may leave their own SIGINT handler
    # installed; this test is about Ctrl-C as Python delivers it by default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as ei:
            run_on_devices([0, 1, 2], lambda j: 1, devs, run_one, on_interrupt=stopped.set)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.is_set()
    assert ei.value.results[:2] == ["bundle0", "bundle1"] and ei.value.results[2] is None


# -- the real flow with a FAKE trial body on a FAKE two-GPU inventory -----------------------------------------
_FAKE_LOG: list[dict] = []


def _fake_trial_flow():
    from prefect import flow

    from tunelab.flows.trial import trial_row_base
    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.synthetic import synthetic_trial

    import threading

    lock, both_started, started = threading.Lock(), threading.Event(), [0]

    @flow(name="trial", validate_parameters=False)
    def fake_trial(trial, trial_id, plan, runtime, ctx, window_check=None):
        """FAKE trial: no server. Sleeps like a short trial and writes a synthetic bundle. The first one-GPU
        trial also waits (up to 60 s) until the second one has started, so that trials scheduled in parallel
        always overlap however slow the box is, and trials run one after the other never do."""
        t0 = time.time()
        if len(ctx.gpu_indices) == 1:
            with lock:
                started[0] += 1
                if started[0] == 2:
                    both_started.set()
            both_started.wait(timeout=60)
        time.sleep(3.0)
        row = trial_row_base(trial, trial_id, ctx.sweep.sweep_id, runtime, ctx)
        syn = synthetic_trial(sweep_id=ctx.sweep.sweep_id, config_key=trial.config_key,
                              replicate=trial.replicate, requests_per_repeat=6,
                              chunk_offsets=4)
        tables = {k: v.assign(trial_id=trial_id) for k, v in syn.tables.items() if k != "quality_checks"}
        row.update(status="ok", boot_s=0.5, teardown_s=0.1, teardown_clean=True,
                   finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
        _FAKE_LOG.append({"trial_id": trial_id, "gpus": list(ctx.gpu_indices), "device": ctx.device,
                          "env": json.loads(row.env), "t0": t0, "t1": time.time()})
        return write_bundle(Path(ctx.results_dir), ctx.sweep, row, tables)

    return fake_trial


@pytest.fixture
def fake_host(monkeypatch, tmp_path):
    import tunelab.flows.sweep as S
    from tunelab.tasks.gpu import GpuInfo, Inventory
    from tunelab.host.runtime import Runtime

    n_gpus = {"n": 2}
    rt = Runtime(name="gpu-fake", device="cuda", python=sys.executable, versions={"vllm": "0.32.0"})
    monkeypatch.setattr(S, "run_trial", _fake_trial_flow())
    monkeypatch.setattr(S, "inventory", lambda: Inventory(True, driver_version="fake", cuda_version="12.9", gpus=[
        GpuInfo(i, "FAKE H200", f"GPU-fake-{i}", 143771.0, 500.0) for i in range(n_gpus["n"])]))
    monkeypatch.setattr(S, "preflight", lambda plan: {"gpu-fake": rt})
    _FAKE_LOG.clear()
    return n_gpus


def _write_plan(path: Path, name: str, engine_args: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": name, "model": "fake-model", "runtime": "gpu-fake", "engine_args": engine_args,
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 6}],
        "concurrency": [4], "repeats": 3}))
    return path


def test_sweep_on_two_fake_gpus(prefect_server, fake_host, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from tunelab.flows.sweep import TrialStatus, tuning_sweep

    plan = _write_plan(tmp_path / "plan.yaml", "fake-two-gpus",
                       {"data-parallel-size": [1, 2], "max-model-len": [128, 256]})
    out = tuning_sweep(str(plan), db=str(tmp_path / "wh.duckdb"), results=str(tmp_path / "results"), plots=True)
    log = {e["trial_id"]: e for e in _FAKE_LOG}
    assert len(log) == 4 and [t["status"] for t in out.trials] == ["ok"] * 4
    assert all(set(t) == set(TrialStatus.__annotations__) for t in out.trials)  # the typed keys, no more
    order = [t["trial_id"] for t in out.trials]
    one, two = [log[i] for i in order[:2]], [log[i] for i in order[2:]]
    assert sorted(e["gpus"][0] for e in one) == [0, 1] and all(len(e["gpus"]) == 1 for e in one)
    assert _intervals_overlap((one[0]["t0"], one[0]["t1"]), (one[1]["t0"], one[1]["t1"]))
    for e in two:  # data-parallel 2: both GPUs, visible to the server, alone on them
        assert e["gpus"] == [0, 1] and e["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert all(not _intervals_overlap((e["t0"], e["t1"]), (o["t0"], o["t1"])) for o in _FAKE_LOG if o is not e)
    assert all(e["env"]["VLLM_SERVER_DEV_MODE"] == "1" for e in _FAKE_LOG)
    # warehouse rows, verdicts and the report
    con = duckdb.connect(out.db, read_only=True)
    rows = con.execute("SELECT trial_id, gpu_index, status, quality_verdict FROM trials ORDER BY trial_id").fetchall()
    # a plain sweep (no A/B, no search) is finished in `sweeps` too, after its last trial
    (finished, last), = con.execute("SELECT s.finished_at, max(t.finished_at) FROM sweeps s JOIN trials t "
                                    "USING (sweep_id) GROUP BY s.finished_at").fetchall()
    con.close()
    assert finished is not None and finished >= last
    assert len(rows) == 4 and all(r[2] == "ok" and r[3] in ("pass", "warn", "fail", "unvalidated") for r in rows)
    assert sum(out.quality.values()) == 4
    assert "## Quality" in out.report_markdown and "data-parallel-size=2" in out.report_markdown
    assert out.plots and Path(out.plots[0]).read_bytes()[:4] == b"\x89PNG"
    host_slots = [f"tunelab-{socket.gethostname().lower()}-gpu{i}" for i in (0, 1)]
    with get_client(sync_client=True) as c:
        for n in host_slots:
            lim = c.read_global_concurrency_limit_by_name(n)
            assert lim.limit == 1 and lim.active_slots == 0
        parent = c.read_flow_runs(flow_run_filter=FlowRunFilter(name={"any_": ["sweep fake-two-gpus"]}))  # the plan's name
        assert parent
        kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent[0].id])))
        names = sorted(k.name for k in kids)
        assert len(names) == 4 and any("@ gpu0+gpu1" in n for n in names) and any(n.endswith("@ gpu1") for n in names)
        arts = c.read_artifacts()
        keys = {a.key for a in arts}
        assert "sweep-report-fake-two-gpus" in keys and "sweep-trials-fake-two-gpus" in keys
        assert len([k for k in keys if k and k.startswith("trial-fake-two-gpus-")]) == 4
        prog = [a for a in arts if a.key == "sweep-progress-fake-two-gpus"]
        assert prog and float(prog[0].data) == 100.0


def test_two_fake_sweeps_at_once_share_one_gpu(prefect_server, fake_host, tmp_path):
    from tunelab.flows.sweep import tuning_sweep

    fake_host["n"] = 1
    errors = []

    def go(i):
        plan = _write_plan(tmp_path / f"p{i}.yaml", f"fake-share-{i}", {"max-model-len": [128, 256]})
        try:
            tuning_sweep(str(plan), db=str(tmp_path / f"wh{i}.duckdb"), results=str(tmp_path / f"res{i}"), plots=False)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    import contextvars

    # Each thread carries this context: Prefect's settings (the test server's URL) live in a context variable.
    ts = [threading.Thread(target=contextvars.copy_context().run, args=(go, i)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors, errors
    assert len(_FAKE_LOG) == 4
    iv = sorted((e["t0"], e["t1"]) for e in _FAKE_LOG)
    assert all(a[1] <= b[0] for a, b in zip(iv, iv[1:])), iv  # never two trials on gpu0 at once


def test_ensure_slots_is_idempotent(prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    from tunelab.flows.sweep import ensure_slots

    ensure_slots(["tunelab-test-gpu7"])
    with get_client(sync_client=True) as c:
        c.update_global_concurrency_limit("tunelab-test-gpu7", GlobalConcurrencyLimitUpdate(limit=3))
    ensure_slots(["tunelab-test-gpu7"])
    with get_client(sync_client=True) as c:
        assert c.read_global_concurrency_limit_by_name("tunelab-test-gpu7").limit == 1


def test_ensure_slots_concurrently_creates_once(prefect_server):
    """Two sweeps starting at once both create the device's limit: the read-then-create upsert must not fail."""
    import contextvars

    from prefect.client.orchestration import get_client

    from tunelab.flows.sweep import ensure_slots

    errors = []

    def go():
        try:
            ensure_slots(["tunelab-race-gpu0"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=contextvars.copy_context().run, args=(go,)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    with get_client(sync_client=True) as c:
        assert [x.name for x in c.read_global_concurrency_limits(limit=200)].count("tunelab-race-gpu0") == 1


_HOLD_SLOT = """
import sys, time
sys.path.insert(0, {repo!r})
from tunelab.host.slot_holders import hold_slots
with hold_slots([{name!r}], lease_duration_s=60, sweep_id="killed-sweep", log=print):
    print("held", flush=True)
    time.sleep(300)
"""


def test_slot_holder_is_named_while_waiting_and_a_killed_holders_slot_is_reclaimed(prefect_server, tmp_path):
    """A sweep waiting for a device slot says who holds it, for how long it has waited and how long the wait may
    last, every poll; when the holder is SIGKILLed (its lease would block the slot for 60-75 s) the waiter sees
    the PID gone, releases that lease and gets the slot well before the lease could have run out."""
    import contextvars

    from prefect.client.orchestration import get_client

    from tunelab.flows.sweep import SLOT_LEASE_S, ensure_slots
    from tunelab.host.slot_holders import hold_slots, read_holder

    name = "tunelab-test-reclaim-cpu0"
    ensure_slots([name])
    env = dict(os.environ, PREFECT_API_URL=prefect_server)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), name=name)], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    got, release = threading.Event(), threading.Event()
    timing = {}

    def wait_for_slot():
        with hold_slots([name], lease_duration_s=SLOT_LEASE_S, sweep_id="waiting-sweep", log=lines.append,
                        poll_s=0.5, first_report_after_s=0.5) as lease_id:
            timing["record"] = read_holder(name)
            timing["lease_id"] = lease_id
            got.set()
            release.wait(30)

    try:
        assert holder.stdout.readline().strip() == "held"
        rec = read_holder(name)
        assert rec is not None and rec.pid == holder.pid and rec.sweep_id == "killed-sweep" and rec.lease_id
        th = threading.Thread(target=contextvars.copy_context().run, args=(wait_for_slot,), daemon=True)
        th.start()
        assert not got.wait(3.0), lines  # the holder is alive: the waiter waits ...
        alive = [ln for ln in lines if f"PID {holder.pid}" in ln and "is alive" in ln and "waited" in ln]
        assert len(alive) >= 2 and name in alive[0] and "killed-sweep" in alive[0], lines  # ... and says so
        t_kill = time.monotonic()
        os.killpg(holder.pid, signal.SIGKILL)  # no release, no cleanup: the lease stays on the server
        holder.wait()
        assert got.wait(SLOT_LEASE_S / 2), lines  # reclaimed: no wait for the lease to run out
        assert time.monotonic() - t_kill < SLOT_LEASE_S / 2
        reclaimed = [ln for ln in lines if "released the lease" in ln and f"PID {holder.pid} is gone" in ln]
        assert len(reclaimed) == 1, lines
        assert timing["record"].pid == os.getpid() and timing["record"].sweep_id == "waiting-sweep"
        assert timing["lease_id"] and timing["lease_id"] != rec.lease_id
    finally:
        release.set()
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    th.join(30)
    assert read_holder(name) is None  # the record goes with the slot
    with get_client(sync_client=True) as c:
        assert c.read_global_concurrency_limit_by_name(name).active_slots == 0


def _table_lines(text: str) -> list[str]:
    """The lines of the rich comparison table in a command's output (header to bottom border)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("┏"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("└"))
    return lines[start:end + 1]


def test_sweep_with_a_locked_warehouse_prints_the_table_from_its_bundles(prefect_server, tmp_path):
    """A warehouse file held by another process when the sweep loads: the sweep still prints its comparison
    table (built from its bundles), one line naming the holder's PID and the command to load later, no
    traceback, exit 3; `tunelab load` later loads the bundles and `tunelab report` prints the same table.
    Real `tunelab run` command and sweep flow; FAKE trial body and GPU (tests/fakes/fake_sweep_cli.py)."""
    db, res = tmp_path / "wh.duckdb", tmp_path / "results"
    plan = _write_plan(tmp_path / "plan.yaml", "fake-locked", {"max-model-len": [128, 256]})
    env = dict(os.environ, PREFECT_API_URL=prefect_server, TUNELAB_DB=str(db), TUNELAB_RESULTS=str(res),
               COLUMNS="220", FAKE_FINDING="1")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(300)",
         str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = subprocess.run([sys.executable, str(REPO / "tests" / "fakes" / "fake_sweep_cli.py"), "run", str(plan),
                            "--lock-timeout-s", "1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    pid_lines = [ln for ln in r.stderr.splitlines() if f"PID {holder.pid}" in ln and "not loaded" in ln]
    assert len(pid_lines) == 1 and "`tunelab load`" in pid_lines[0] and "2 bundle(s)" in pid_lines[0], r.stderr[-3000:]
    table = _table_lines(r.stdout)
    assert sum("max-model-len=" in ln for ln in table) == 2, r.stdout
    # the run ends with the bottlenecks `tunelab report` shows (here from the bundles: the file is locked)
    found = [ln for ln in r.stdout.splitlines() if "FAKE 3 preemptions" in ln]
    assert len(found) == 2 and all("kv_cache" in ln for ln in found), r.stdout[-3000:]
    assert not db.exists() or not duckdb.connect(str(db), read_only=True).execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'trials'").fetchall()[0][0]
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "load"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "2 bundle(s) loaded" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "report"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _table_lines(r.stdout) == table  # the table from the bundles is the warehouse's table
    assert [ln for ln in r.stdout.splitlines() if "FAKE 3 preemptions" in ln] == found


# -- compare ---------------------------------------------------------------------------------------------------
def _synthetic_warehouse(path: Path, results: Path) -> None:
    import numpy as np

    from tunelab.core.bundle import write_bundle
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    rng = np.random.default_rng(7)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for vi, version in enumerate(["0.9.2", "0.10.0"]):  # string order would put 0.9.2 last
        for key, effect in (("cfgfast", 0.3 if version == "0.10.0" else 0.0), ("cfgsame", 0.0)):
            for rep in range(3):
                s = synthetic_trial(sweep_id=f"s{vi}", config_key=key, replicate=rep, vllm_version=version,
                                    runtime_name=f"rt-{version}", effect_rel=effect, boot_sd_rel=0.01,
                                    repeat_sd_rel=0.01, started_at=t0 + dt.timedelta(days=vi), rng=rng)
                write_bundle(results, s.sweep, s.trial, s.tables)
    load_pending(path, results)


def test_parse_selector():
    from tunelab.flows.compare import parse_selector

    assert parse_selector("runtime=cpu,version=0.32.0|0.31.0") == {"runtime_name": "cpu",
                                                                   "vllm_version": ["0.32.0", "0.31.0"]}
    assert parse_selector("config=enforce-eager VLLM_USE_FASTOKENS=1") == {
        "config_label": "enforce-eager VLLM_USE_FASTOKENS=1"}
    with pytest.raises(ValueError, match="no '='"):
        parse_selector("cpu")
    with pytest.raises(ValueError, match="unknown"):
        parse_selector("colour=red")


def test_compare_flow_versions_config_by_config(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from tunelab.flows.compare import compare

    db = tmp_path / "wh.duckdb"
    _synthetic_warehouse(db, tmp_path / "results")
    out = compare({"vllm_version": "previous"}, {"vllm_version": "latest"}, db=str(db),
                  artifact_key="ab-test-versions")
    assert out["baseline"] == {"vllm_version": "0.9.2"} and out["candidate"] == {"vllm_version": "0.10.0"}
    by = {r["config_key"]: r for r in out["rows"]}
    assert set(by) == {"cfgfast", "cfgsame"}
    assert by["cfgfast"]["verdict"] == "better" and 0.2 < by["cfgfast"]["rel_diff"] < 0.4
    assert by["cfgsame"]["verdict"] in ("no_significant_change", "better", "worse")
    assert by["cfgsame"]["baseline_boots"] == 3 and by["cfgsame"]["candidate_boots"] == 3
    with get_client(sync_client=True) as c:
        arts = [a for a in c.read_artifacts() if a.key == "ab-test-versions"]
    assert arts and "cfgfast" in arts[0].data and "**better**" in arts[0].data


def test_compare_cli(prefect_server, tmp_path):
    db = tmp_path / "wh.duckdb"
    _synthetic_warehouse(db, tmp_path / "results")
    env = dict(os.environ, PREFECT_API_URL=prefect_server, COLUMNS="220")
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "compare", "--baseline", "version=0.9.2",
                        "--candidate", "version=latest", "--db", str(db)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "better" in r.stdout and "cfgfast" in r.stdout
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "compare", "--baseline", "colour=red",
                        "--candidate", "version=latest", "--db", str(db)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "colour" in r.stderr
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "compare", "--baseline", "sweep=no-such-sweep",
                        "--candidate", "version=latest", "--db", str(db)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no measurements match both selectors" in " ".join(r.stderr.split()), r.stderr[-2000:]


# -- real CPU runtime ------------------------------------------------------------------------------------------
def _plan_file(tmp: Path, name: str, model: Path, **over) -> Path:
    import yaml

    d = yaml.safe_load((REPO / "tests" / "plans" / "one_trial.yaml").read_text())
    d.update(name=name, model=str(model), **over)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _ps_args() -> str:
    return subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout


def _trial_rows(db: Path) -> list[dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        df = con.execute("SELECT * FROM trials").fetchdf()
    finally:
        con.close()
    return df.to_dict("records")


@pytest.mark.runtime
def test_two_real_sweeps_at_once_never_overlap(prefect_server, cpu_runtime, tiny_model, tmp_path):
    """Two `tunelab run` processes at once on this host's one device: the slot serialises their trials."""
    from prefect.client.orchestration import get_client

    procs = []
    for i in range(2):
        plan = _plan_file(tmp_path, f"it-share-{i}", tiny_model)
        env = dict(os.environ, PREFECT_API_URL=prefect_server, TUNELAB_DB=str(tmp_path / f"wh{i}.duckdb"),
                   TUNELAB_RESULTS=str(tmp_path / f"res{i}"))
        procs.append(subprocess.Popen([sys.executable, "-m", "tunelab.cli", "run", str(plan)], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    rows = [_trial_rows(tmp_path / f"wh{i}.duckdb") for i in range(2)]
    assert [len(r) for r in rows] == [1, 1]
    a, b = rows[0][0], rows[1][0]
    assert a["status"] == b["status"] == "ok"
    ia, ib = (a["started_at"], a["finished_at"]), (b["started_at"], b["finished_at"])
    assert not _intervals_overlap(ia, ib), (ia, ib)
    for r in (a, b):
        # --enforce-eager: no torch.compile, so the boot log shows no compilation and compile_cache is NULL
        assert r["compile_cache"] is None and r["quality_verdict"] in ("pass", "warn", "fail")
        assert json.loads(r["env"])["VLLM_SERVER_DEV_MODE"] == "1"
        log = Path(r["log_path"]).read_text(errors="replace")
        assert "/reset_prefix_cache" in log and '"POST /reset_prefix_cache HTTP/1.1" 200' in log
        argv = r["command"].split()
        served = argv[argv.index("--served-model-name") + 1]
        assert served not in _ps_args()
    from tunelab.tasks.engine import tracked_servers

    state = tracked_servers()
    assert not [e for e in state if e["trial_id"] in (a["trial_id"], b["trial_id"])]
    with get_client(sync_client=True) as c:
        keys = {x.key for x in c.read_artifacts()}
        reports = [x for x in c.read_artifacts() if x.key == "sweep-report-it-share-0"]
    assert {"sweep-report-it-share-0", "sweep-report-it-share-1", "sweep-progress-it-share-0"} <= keys
    assert reports and "## Quality" in reports[0].data and "output tok/s" in reports[0].data


def _run_filter(name: str | None = None, run_id=None):
    from prefect.client.schemas.filters import FlowRunFilter

    return FlowRunFilter(name={"any_": [name]}) if name else FlowRunFilter(id={"any_": [run_id]})


def _cancel_when_measuring(proc: subprocess.Popen, which, timeout_s: float = 600) -> str:
    """Read ``proc``'s output until a measured window is under way, then cancel the flow run ``which`` (a
    FlowRunFilter) through the API (what the UI's Cancel does: state Cancelling). Returns the output so far."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    seen = []
    t0 = time.monotonic()
    for line in proc.stdout:
        seen.append(line)
        if "repeat 1/8:" in line and "requests" in line:
            break
        assert time.monotonic() - t0 < timeout_s, "no measurement started: " + "".join(seen)[-2000:]
    else:
        raise AssertionError("the sweep ended before measuring: " + "".join(seen)[-3000:])
    with get_client(sync_client=True) as c:
        runs = [r for r in c.read_flow_runs(flow_run_filter=which) if r.state and r.state.is_running()]
        assert len(runs) == 1, runs
        c.set_flow_run_state(runs[0].id, Cancelling(message="cancelled by the test"))
    return "".join(seen)


def _final_states(which, timeout_s: float = 120) -> tuple[object, list]:
    """The sweep's flow run and its trial subflow runs, once all are final (waits up to ``timeout_s``; then as
    they are). A deployment run's runner records the sweep Cancelled after its process exited; the process
    records the trial's run itself, so both are normally final together."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    t0 = time.monotonic()
    with get_client(sync_client=True) as c:
        while True:
            run = c.read_flow_runs(flow_run_filter=which)[0]
            kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
            if all(r.state.is_final() for r in [run, *kids]) or time.monotonic() - t0 > timeout_s:
                break
            time.sleep(1)
    return run, kids


def _assert_cancelled_trial(res: Path, db: Path) -> None:
    """One bundle, status cancelled, clean teardown, loaded into DuckDB; no vLLM process and no tracked server."""
    from tunelab.core.bundle import list_bundles, read_bundle
    from tunelab.tasks.engine import tracked_servers

    bundles = list_bundles(res)
    assert len(bundles) == 1
    trow = read_bundle(bundles[0])["trial"].iloc[0]
    assert trow["status"] == "cancelled" and trow["teardown_clean"]
    rows = _trial_rows(db)  # loaded on the way out
    assert len(rows) == 1 and rows[0]["status"] == "cancelled"
    argv = trow["command"].split()
    served = argv[argv.index("--served-model-name") + 1]
    assert served not in _ps_args()
    assert not [e for e in tracked_servers() if e["trial_id"] == trow["trial_id"]]


def _cancel_plan(tmp_path: Path, name: str, model: Path) -> Path:
    # Enough windows that a cancel sent at the first one lands in the measurement even when the runner or the
    # cancel watch reacts late (a cancelled trial never measures them).
    return _plan_file(tmp_path, name, model, repeats=8,
                      workloads=[{"name": "long", "prompt_tokens": 32, "output_tokens": 64, "num_requests": 40}])


@pytest.mark.runtime
def test_cancel_from_the_api_while_measuring(prefect_server, cpu_runtime, tiny_model, tmp_path):
    """`tunelab run` against a server, cancelled in the middle of a measurement through the API (the UI's
    Cancel): the run and its trial end Cancelled, the trial is recorded cancelled, no server is left."""
    plan = _cancel_plan(tmp_path, "it-cancel", tiny_model)
    db, res = tmp_path / "wh.duckdb", tmp_path / "res"
    env = dict(os.environ, PREFECT_API_URL=prefect_server, TUNELAB_DB=str(db), TUNELAB_RESULTS=str(res))
    p = subprocess.Popen([sys.executable, "-m", "tunelab.cli", "run", str(plan)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = _cancel_when_measuring(p, _run_filter(f"sweep {plan.stem}"))
        rest = p.communicate(timeout=180)[0]
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, seen[-2000:] + rest[-3000:]
    run, kids = _final_states(_run_filter(f"sweep {plan.stem}"))
    assert run.state.is_cancelled(), (run.state, rest[-3000:])
    assert len(kids) == 1 and kids[0].state.is_cancelled(), [k.state for k in kids]
    _assert_cancelled_trial(res, db)


@pytest.mark.runtime
def test_cancel_a_deployment_run_while_measuring(prefect_server, cpu_runtime, tiny_model, tmp_path):
    """A run of the served deployment (`tunelab serve`), cancelled through the API: Prefect's runner sends
    SIGTERM after its "cancel" intent; the run and its trial end Cancelled (not Crashed)."""
    from prefect.deployments import run_deployment

    plan = _cancel_plan(tmp_path, "it-cancel-dep", tiny_model)
    db, res = tmp_path / "wh.duckdb", tmp_path / "res"
    env = dict(os.environ, PREFECT_API_URL=prefect_server, TUNELAB_DB=str(db), TUNELAB_RESULTS=str(res))
    reader = None
    serve = subprocess.Popen([sys.executable, "-m", "tunelab.cli", "serve", "--plan", str(plan), "--paused"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        t0 = time.monotonic()
        while True:  # the deployment exists once `serve` has registered it
            try:
                fr = run_deployment("tuning_sweep/nightly", timeout=0)
                break
            except Exception:
                assert serve.poll() is None and time.monotonic() - t0 < 120, "tunelab serve did not come up"
                time.sleep(1)
        seen = _cancel_when_measuring(serve, _run_filter(run_id=fr.id))
        t_cancel = time.monotonic()
        after: list[str] = []  # the runner's and the run's lines after the cancel, with seconds since it
        reader = threading.Thread(target=lambda: [after.append(f"+{time.monotonic() - t_cancel:.1f}s {ln}")
                                                  for ln in serve.stdout], daemon=True)
        reader.start()
        run, kids = _final_states(_run_filter(run_id=fr.id))
        assert run.state.is_cancelled(), (run.state, seen[-3000:], "".join(after)[-4000:])
        assert len(kids) == 1 and kids[0].state.is_cancelled(), ([k.state for k in kids], "".join(after)[-4000:])
        # ... by the run's process, not later by the server's clean-up of a killed run's subflows
        assert kids[0].state.message != "The parent flow run was cancelled.", "".join(after)[-4000:]
        _assert_cancelled_trial(res, db)
    finally:
        _stop_group(serve, signal.SIGINT, 60, drained=reader is not None)


@pytest.mark.runtime
def test_bare_sigterm_while_measuring_tears_down(prefect_server, cpu_runtime, tiny_model, tmp_path):
    """`kill -TERM` of `tunelab run` (nobody cancelled it through Prefect): the trial still tears down and is
    recorded cancelled; Prefect's engine records the run Crashed, and tunelab's on_crashed hook sets it Cancelled, as
    the CLI says (issue 29 item 18: before, the UI said Crashed)."""
    plan = _cancel_plan(tmp_path, "it-sigterm", tiny_model)
    db, res = tmp_path / "wh.duckdb", tmp_path / "res"
    env = dict(os.environ, PREFECT_API_URL=prefect_server, TUNELAB_DB=str(db), TUNELAB_RESULTS=str(res))
    p = subprocess.Popen([sys.executable, "-m", "tunelab.cli", "run", str(plan)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    t0 = time.monotonic()
    for line in p.stdout:
        seen.append(line)
        if "repeat 1/8:" in line and "requests" in line:  # a measured window is under way
            p.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() - t0 < 600, "no measurement started"
    rest = p.communicate(timeout=180)[0]
    assert p.returncode != 0, "".join(seen)[-2000:] + rest[-2000:]
    run, _ = _final_states(_run_filter(f"sweep {plan.stem}"))
    assert run.state.is_cancelled(), run.state
    _assert_cancelled_trial(res, db)


def test_a_cancelled_trials_reason_never_ends_in_an_empty_message():
    from prefect.exceptions import TerminationSignal

    from tunelab.flows.trial import cancel_reason

    assert cancel_reason(KeyboardInterrupt()) == "KeyboardInterrupt (Ctrl-C)"
    assert cancel_reason(TerminationSignal(signal.SIGTERM)) == \
        "TerminationSignal (signal 15: SIGTERM or a cancel through Prefect)"
    assert cancel_reason(KeyboardInterrupt("stop")) == "KeyboardInterrupt: stop"
    assert not cancel_reason(KeyboardInterrupt()).endswith(":")
