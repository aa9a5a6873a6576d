"""The coordinator of a multi-host sweep and the runs it submitted (issue 29 items 10 and 11), on a FAKE Prefect
client (no server: the faults are a worker killed mid-run and a coordinator stopped, which need exact control).

- a coordinator that times out (or is cancelled) cancels every run it submitted that is not final: they are not
  subflows, so Prefect leaves them running or scheduled;
- a run left Running by a killed worker (no heartbeat any more) is set Crashed with the reason and reported,
  instead of the coordinator waiting for its 24 h timeout.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import tunelab.flows.hosts as H


def _plan(tmp_path: Path, n: int) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump({
        "name": "hosts", "model": "fake-model", "runtime": "gpu-fake",
        "engine_args": {"max-model-len": [128 * (i + 1) for i in range(n)]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 6}],
        "concurrency": [4], "repeats": 3}))
    return p


class FakeClient:
    """FAKE sync Prefect client: each run's state type comes from ``script(run_id, reads, client)``; states the
    coordinator sets are recorded in ``set`` and stick."""

    def __init__(self, script):
        self.script, self.reads, self.set, self.forced = script, {}, [], {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def read_flow_run(self, run_id):
        from prefect.client.schemas.objects import StateType

        self.reads[run_id] = self.reads.get(run_id, 0) + 1
        kind = self.forced.get(run_id) or self.script(run_id, self.reads[run_id], self)
        return SimpleNamespace(state=SimpleNamespace(type=StateType(kind)))

    def set_flow_run_state(self, run_id, state, force=False):
        assert force
        self.set.append((run_id, state.type.value, state.message))
        self.forced[run_id] = state.type.value


@pytest.fixture
def coordinator(monkeypatch, tmp_path):
    """Run ``multi_host_sweep``'s body with FAKE run submission and client; returns (run, client holder)."""
    import prefect.client.orchestration as orch
    import prefect.deployments as deps

    ids = iter(f"run-{i}" for i in range(100))
    holder = {}
    monkeypatch.setattr(H, "get_run_logger", lambda: logging.getLogger("test-hosts"))
    monkeypatch.setattr(deps, "run_deployment", lambda *a, **k: SimpleNamespace(id=next(ids)))
    monkeypatch.setattr(orch, "get_client", lambda sync_client=True: holder["client"])

    def run(n, script, **kw):
        holder["client"] = FakeClient(script)
        return H.multi_host_sweep.fn(str(_plan(tmp_path, n)), store=str(tmp_path / "store"),
                                     db=str(tmp_path / "wh.duckdb"), poll_s=0.01, **kw)

    return run, holder


def test_a_coordinator_that_times_out_cancels_the_runs_it_submitted(coordinator):
    run, holder = coordinator
    states = {"run-0": "COMPLETED", "run-1": "RUNNING", "run-2": "SCHEDULED"}
    with pytest.raises(TimeoutError):
        run(3, lambda rid, n, c: states[rid], timeout_s=0.2, stale_s=1e9)
    got = {rid: kind for rid, kind, _ in holder["client"].set}
    assert got == {"run-1": "CANCELLING", "run-2": "CANCELLED"}  # the finished one is left alone
    assert all("cancelled by its coordinator: TimeoutError" in msg for _, _, msg in holder["client"].set)


def test_an_interrupted_coordinator_cancels_its_runs_too(coordinator):
    run, holder = coordinator

    def script(rid, n, client):
        if rid == "run-1" and n == 3:
            raise KeyboardInterrupt  # Ctrl-C (Prefect's cancel raises TerminationSignal the same way)
        return "PENDING"

    with pytest.raises(KeyboardInterrupt):
        run(2, script, timeout_s=60, stale_s=1e9)
    assert sorted((rid, kind) for rid, kind, _ in holder["client"].set) == [("run-0", "CANCELLED"),
                                                                            ("run-1", "CANCELLED")]


def test_a_run_whose_worker_died_is_crashed_with_its_reason_and_reported(coordinator, monkeypatch):
    """run-0's worker was killed: Running, its heartbeat stops. run-1's host beats on (a new beat between reads)
    and its run completes once run-0 was ended, so the test depends on no timing but ``stale_s`` itself."""
    run, holder = coordinator
    beats = {"n": 0}

    def script(rid, n, client):
        if rid == "run-1":
            if client.forced.get("run-0") == "CRASHED":
                return "COMPLETED"
            beats["n"] += 1
        return "RUNNING"

    first: dict = {}
    orig_wait = H.wait_for_runs

    def wait(client, runs, **kw):
        first["trial_id"] = runs[0]["trial_id"]
        return orig_wait(client, runs, **kw)

    def beat_of(path):  # FAKE heartbeats: run-0's last beat stays, run-1's changes
        if path == H.heartbeat_path(path.parents[2], path.parents[1].name, first["trial_id"]):
            return ("pid-dead", 1), "host-a"
        return ("pid-live", beats["n"]), "host-b"

    monkeypatch.setattr(H, "_beat_of", beat_of)
    monkeypatch.setattr(H, "wait_for_runs", wait)
    out = run(2, script, timeout_s=120, stale_s=0.3)
    assert out.crashed == [first["trial_id"]]
    (rid, kind, msg), = holder["client"].set
    assert (rid, kind) == ("run-0", "CRASHED")
    assert "host-a" in msg and "no heartbeat" in msg and "re-run it" in msg
    assert out.runs[0]["state"] == "CRASHED" and "no heartbeat" in out.runs[0]["reason"]
    assert out.runs[1]["state"] == "COMPLETED" and "reason" not in out.runs[1]


def test_a_running_run_that_never_beat_is_crashed_too(tmp_path):
    """A worker killed before the run's first beat: no heartbeat file at all, counted from when the coordinator
    first saw the run Running (its own clock: a fake one here)."""
    t = {"now": 0.0}
    client = FakeClient(lambda rid, n, c: "RUNNING")
    runs = [{"trial_id": "T0", "flow_run_id": "run-0", "state": None}]

    def sleep(s):
        t["now"] += s

    crashed = H.wait_for_runs(client, runs, store=tmp_path, sweep_id="S", timeout_s=1000, poll_s=10, stale_s=100,
                              clock=lambda: t["now"], sleep=sleep)
    assert crashed == ["T0"] and client.set[0][1] == "CRASHED" and "no heartbeat ever written" in client.set[0][2]
    assert 100 <= t["now"] <= 130  # crashed at the first poll past stale_s, not at the timeout


def test_heartbeat_writes_beats_into_a_hidden_folder_of_the_store(tmp_path):
    import time

    from tunelab.core.bundle import list_bundles

    p = H.heartbeat_path(tmp_path, "S1", "T1")
    with H.heartbeat(p, every_s=0.01):
        first = json.loads(p.read_text())["beat"]
        deadline = time.monotonic() + 30
        while json.loads(p.read_text())["beat"] == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(p.read_text())["beat"] > first
    assert list_bundles(tmp_path) == []  # the loader never sees it
