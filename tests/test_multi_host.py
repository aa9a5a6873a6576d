"""Several hosts on this machine: a real ``prefect server start`` (own PREFECT_HOME), a process work pool, and two
real ``prefect worker start`` processes standing in for two GPU hosts, each with its own tunelab home, host name
and FAKE device set (tests/fakes/fake_host_flow.py: FAKE NVML from ``FAKE_NVML_GPUS``, FAKE trial body). One
``multi_host_sweep`` spreads its trials over both; their bundles reach one store and one loader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from test_flows import REPO, _stop_group, prefect_server  # noqa: F401 - the real Prefect server fixture

PREFECT = str(Path(sys.executable).parent / "prefect")


def _write_plan(path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": "two-hosts", "model": "fake-model", "runtime": "gpu-fake",
        "engine_args": {"max-model-len": [128, 256]},
        "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 6}],
        "concurrency": [4], "repeats": 3}))
    return path


def _start_worker(url: str, pool: str, host: str, home: Path, gpus: list[dict], tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, PREFECT_API_URL=url, TUNELAB_HOME=str(home), TUNELAB_HOST=host,
               FAKE_NVML_GPUS=json.dumps(gpus), FAKE_TRIAL_S="2", PREFECT_HOME=str(tmp / f"prefect-{host}"),
               PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="0")
    log = open(tmp / f"worker-{host}.log", "wb")
    # --limit 1: each stand-in host has one GPU, so it takes one trial at a time (the real deployment's
    # --limit is the host's GPU count).
    return subprocess.Popen([PREFECT, "worker", "start", "--pool", pool, "--type", "process", "--limit", "1",
                             "--name", f"worker-{host}"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(REPO), start_new_session=True)


def test_one_sweep_spreads_over_two_worker_hosts_into_one_warehouse(prefect_server, tmp_path):  # noqa: F811
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tunelab.flows.hosts import multi_host_sweep

    t0 = time.monotonic()
    pool = "tunelab-gpu-test"
    subprocess.run([PREFECT, "work-pool", "create", pool, "--type", "process", "--overwrite"], check=True,
                   env=dict(os.environ, PREFECT_API_URL=prefect_server), capture_output=True, timeout=60)
    flow.from_source(source=str(REPO), entrypoint="tests/fakes/fake_host_flow.py:host_trial").deploy(
        name="host-trial", work_pool_name=pool, print_next_steps=False)
    homes = {h: tmp_path / f"home-{h}" for h in ("host-a", "host-b")}
    workers = [
        _start_worker(prefect_server, pool, "host-a", homes["host-a"],
                      [{"name": "NVIDIA H200", "uuid": "GPU-a-0", "pci_bus_id": "0000:18:00.0"}], tmp_path),
        _start_worker(prefect_server, pool, "host-b", homes["host-b"],
                      [{"name": "NVIDIA A100", "uuid": "GPU-b-0", "pci_bus_id": "0000:3b:00.0"}], tmp_path),
    ]
    try:
        with get_client(sync_client=True) as client:  # both hosts online before the first trial is submitted
            while len([w for w in client.read_workers_for_work_pool(pool) if w.status.value == "ONLINE"]) < 2:
                assert time.monotonic() - t0 < 60, "workers did not come online"
                assert all(w.poll() is None for w in workers), "a worker exited"
                time.sleep(0.5)
        store, db = tmp_path / "store", tmp_path / "warehouse.duckdb"
        out = multi_host_sweep(str(_write_plan(tmp_path / "plan.yaml")), store=str(store), db=str(db),
                               timeout_s=80, poll_s=0.5)
    finally:
        for w in workers:
            _stop_group(w, signal.SIGTERM, 20)
    logs = "\n".join((tmp_path / f"worker-{h}.log").read_text(errors="replace")[-3000:] for h in homes)
    assert [r["state"] for r in out.runs] == ["COMPLETED"] * 2, logs
    assert out.loaded == 2
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT trial_id, host, gpu_uuids, gpu_name, status, env FROM trials WHERE sweep_id = ? "
                       "ORDER BY trial_id", [out.sweep_id]).fetchall()
    con.close()
    assert sorted(r[0] for r in rows) == sorted(r["trial_id"] for r in out.runs)
    hosts = {r[1] for r in rows}
    assert hosts == {"host-a", "host-b"}, rows  # the trials of one sweep ran on both hosts
    for _tid, host, uuids, name, status, env in rows:
        assert status == "ok" and uuids == {"host-a": "GPU-a-0", "host-b": "GPU-b-0"}[host]
        assert name == {"host-a": "NVIDIA H200", "host-b": "NVIDIA A100"}[host]
        assert json.loads(env)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # Each host wrote its bundles in its own home; the store holds them all.
    for h, home in homes.items():
        own = [p for p in (home / "results" / out.sweep_id).iterdir() if not p.name.startswith(".")]
        assert len(own) == len([r for r in rows if r[1] == h]) >= 1
    assert len([p for p in (store / out.sweep_id).iterdir() if not p.name.startswith(".")]) == 2
    # No bound on the wall time here: the sweep's own timeout_s=80 bounds it, and a 2-core box shared with other
    # work varies 2-5x (a "< 90 s" check failed at 127 s beside another test run).
