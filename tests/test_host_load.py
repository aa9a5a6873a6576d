"""CPU pinning of the server and the load, and the per-window host covariates (tunelab/tasks/host_load.py).

Pinning is checked on real processes: the FAKE OpenAI server (tests/fakes/) with child processes, started by the
real EngineServer, and the measurement against the FAKE timed server. The covariates are checked on a FAKE /proc
(crafted counters, so the expected fractions are exact)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))

from tunelab.core.plan import CpuAffinity, Plan, Workload, format_cpus, parse_cpus  # noqa: E402
from tunelab.tasks import host_load  # noqa: E402

CPUS = sorted(os.sched_getaffinity(0))


def test_cpu_lists_and_plan_errors():
    assert parse_cpus("0-3,8") == (0, 1, 2, 3, 8) and parse_cpus([3, 1, 1]) == (1, 3)
    assert format_cpus((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    with pytest.raises(ValueError, match=r"cpu_affinity.server: '3-1' is not a CPU list.*'0-3,8'"):
        CpuAffinity(server="3-1")
    with pytest.raises(ValueError, match="server and load share CPUs 2-3"):
        CpuAffinity(server="0-3", load="2-5")
    with pytest.raises(ValueError, match=r"cpu_affinity.load: CPUs 4096 are not available.*fix the plan"):
        with host_load.pinned_thread((4096,)):
            pass


def _fake_proc(root: Path, me: int, *, total: int, idle: int, steal: int, mine: int, child: int, stranger: int,
               reaped: int = 0) -> None:
    """A FAKE /proc: /proc/stat (one CPU line), this process, one child of it (tunelab's, e.g. the server) and a
    stranger (another process on the host). Ticks per field as given."""
    user = total - idle - steal
    (root / "stat").write_text(f"cpu  {user} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")

    def proc(pid: int, ppid: int, ticks: int, cticks: int = 0) -> None:
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
        (d / "stat").write_text(f"{pid} (py thon) S {ppid} 1 1 0 -1 0 0 0 0 0 {ticks} 0 {cticks} 0 20 0 1 0\n")

    proc(me, 1, mine, reaped)
    proc(me + 1, me, child)
    proc(me + 2, 1, stranger)


def test_covariates_count_only_other_processes(tmp_path, monkeypatch):
    me = os.getpid()
    monkeypatch.setattr(host_load, "_PROC", tmp_path)
    monkeypatch.setattr(host_load, "_SYS_CPU", tmp_path / "sys")
    for i, khz in enumerate((2000000, 3000000)):
        f = tmp_path / "sys" / f"cpu{i}" / "cpufreq" / "scaling_cur_freq"
        f.parent.mkdir(parents=True)
        f.write_text(f"{khz}\n")
    _fake_proc(tmp_path, me, total=10000, idle=8000, steal=0, mine=100, child=300, stranger=1000)
    before = host_load.HostSample.read()
    assert before.ours == 400 and before.busy == 2000
    # In the window: 1000 ticks of host time, 550 run by processes and 50 stolen: 150 ours (100 this process, of which 30 from a reaped load
    # process, + 50 the server), the rest (400) someone else's.
    _fake_proc(tmp_path, me, total=11000, idle=8400, steal=50, mine=170, reaped=30, child=350, stranger=1400)
    cov = host_load.covariates(before)
    assert cov["host_other_cpu_frac"] == pytest.approx(0.40)  # (550 run - 150 ours) / 1000: the stranger's 400
    assert cov["host_steal_frac"] == pytest.approx(0.05)
    assert cov["host_cpu_mhz"] == pytest.approx(2500.0)
    assert host_load.covariates(None)["host_other_cpu_frac"] is None


def test_engine_pins_every_process_of_the_server(tmp_path, monkeypatch):
    from fakes import fake_server_runtime
    from tunelab.tasks.engine import EngineServer

    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    cpu = (CPUS[-1],)
    s = EngineServer(runtime=fake_server_runtime("--children", "2"), model="fake-model", serve_args=[], env={},
                     log_path=tmp_path / "server.log", cpu_affinity=cpu)
    with s:
        tree = host_load.descendants(s.proc.pid)
        assert len(tree) == 3  # the server and its two children (like EngineCore and a worker)
        for pid in tree:
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(tid)) == set(cpu)
    unpinned = EngineServer(runtime=fake_server_runtime(), model="fake-model", serve_args=[], env={},
                            log_path=tmp_path / "server2.log")
    with unpinned:
        assert os.sched_getaffinity(unpinned.proc.pid) == set(CPUS)


def test_measurement_pins_the_load_and_records_covariates():
    from timed_openai_server import FakeServerProcess, FakeTiming
    from tunelab.tasks.measure import measure_server

    before = os.sched_getaffinity(0)
    load = CPUS[:1]
    plan = Plan(name="t", model="unused", workloads=[Workload(name="w", prompt_tokens=16, output_tokens=4,
                                                              num_requests=4)],
                concurrency=[2], warmup_requests=0, repeats=1, load_processes=2,
                cpu_affinity={"load": format_cpus(load)})
    seen = []
    real = host_load.HostSample.read

    def spy():  # the loop's thread is pinned while the windows run
        seen.append(os.sched_getaffinity(0))
        return real()

    with FakeServerProcess(FakeTiming(ttft_s=0.005, itl_s=0.002), model="fake-model") as fake:
        host_load.HostSample.read = staticmethod(spy)
        try:
            res = measure_server(fake.base_url, "k", "fake-model", plan, progress=lambda *a: None)
        finally:
            host_load.HostSample.read = staticmethod(real)
    m = res.measurements.iloc[0]
    assert seen and all(s == set(load) for s in seen)
    assert os.sched_getaffinity(0) == before  # given back after the measurement
    assert m["load_cpus"] == format_cpus(load) and m["server_cpus"] is None
    assert 0.0 <= m["host_other_cpu_frac"] <= 1.0 and 0.0 <= m["host_steal_frac"] <= 1.0
