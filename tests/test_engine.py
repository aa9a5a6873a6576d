"""Engine lifecycle: boot, readiness, port identity, boot failures, teardown, leftovers of killed runs.

Fault coverage runs against the FAKE OpenAI server (tests/fakes/fake_openai_server.py), which starts in well under a
second and injects exact faults. Three tests (marked ``runtime``) boot the real CPU vLLM runtime: a full
boot/teardown, an invalid engine arg, and a killed orchestrator whose leftovers the next run stops.

Every test gets its own tunelab home (state file, caches), so servers of other runs on this host are never touched.
No assert on absolute times: only relations (a failure well before its timeout, SIGKILL only after SIGTERM failed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fakes import fake_server_runtime
from fakes.fake_nvml import FakeGpu, FakeNvml
from tunelab.tasks import bootlog, engine
from tunelab.tasks.engine import (BootFailed, EngineServer, group_members, is_tunelab_process, port_listeners, stop_leftovers,
                          tracked_servers)

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    """A private tunelab home: its own state file, so other runs' servers are invisible to these tests."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNELAB_HOME", str(home))
    yield home


@pytest.fixture
def reap():
    """Process groups a test started outside EngineServer: SIGKILLed at the end whatever happens."""
    pgids: list[int] = []
    yield pgids
    for g in pgids:
        try:
            os.killpg(g, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def fake(tmp_path: Path, *fake_args: str, device: str = "cpu", **kw) -> EngineServer:
    kw.setdefault("boot_timeout_s", 30)
    kw.setdefault("grace_s", 5)
    return EngineServer(runtime=fake_server_runtime(*fake_args, device=device), model="fake-model",
                        serve_args=["--enforce-eager"], env={}, log_path=tmp_path / "server.log", **kw)


def log_lines(s: EngineServer) -> list[str]:
    return [ln for ln in Path(s.log_path).read_text().splitlines() if ln.startswith("FAKE ")]


def env_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


# -- boot, readiness and a clean teardown ------------------------------------------------------------------
def test_boot_ready_and_clean_teardown(tmp_path):
    s = fake(tmp_path, "--children", "2", "--write-tmp")
    with s:
        pgid = s.proc.pid
        members = group_members(pgid)
        assert len(members) == 3  # the server and its two children, all in the server's own group
        assert os.getpgid(os.getpid()) != pgid
        assert all(is_tunelab_process(m) for m in members)  # children inherit the server id
        assert s.boot.health_s is not None and 0 < s.boot.health_s <= s.boot.boot_s
        assert port_listeners(s.port) and s.base_url == f"http://127.0.0.1:{s.port}"
        assert s.api_key not in s.redacted_command() and "--api-key ***" in s.redacted_command()
        assert [e["pid"] for e in tracked_servers()] == [pgid]
        assert list((s.run_dir / "tmp").rglob("*.bin")) and list((s.run_dir / "rpc").rglob("*.bin"))
        env = env_of(pgid)
        assert env["TMPDIR"] == str(s.run_dir / "tmp") and env["VLLM_RPC_BASE_PATH"] == str(s.run_dir / "rpc")
        lines = log_lines(s)
        assert any("completion 200" in ln for ln in lines)
        assert any("ignored_args=['--enforce-eager']" in ln for ln in lines)  # serve_args reach the server
    td = s.teardown
    assert td.clean and not td.sigkill_used and td.sigterm_s is not None and td.sigkill_s is None
    assert td.port_free_s is not None and td.gpu_memory_back_s is None  # CPU: no GPU wait
    assert td.total_s >= td.sigterm_s
    assert not group_members(pgid)
    assert not port_listeners(s.port)
    assert not s.run_dir.exists()  # nothing the server wrote in its private folder survives
    assert tracked_servers() == []
    assert s.stop() is td  # idempotent


def test_ready_waits_for_a_real_completion(tmp_path):
    """/health answers 200 at once, but completions fail 3 times: ready only after the 4th succeeded."""
    s = fake(tmp_path, "--fail-completions", "3")
    with s:
        lines = log_lines(s)
        fails = [i for i, ln in enumerate(lines) if "completion 503" in ln]
        ok = [i for i, ln in enumerate(lines) if "completion 200" in ln]
        assert len(fails) == 3 and ok and ok[0] > fails[-1]
        assert s.boot.boot_s > s.boot.health_s


@pytest.mark.parametrize("mode", ["hang", "hang-health"])
def test_hanging_server_times_out_quickly(tmp_path, mode):
    """hang: never binds; hang-health: accepts connections but never answers (HTTP calls must not hold us)."""
    s = fake(tmp_path, "--mode", mode, boot_timeout_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(BootFailed) as ei:
        with s:
            pass
    elapsed = time.monotonic() - t0
    e = ei.value
    assert e.kind == "timeout" and e.returncode is None
    assert e.boot_s >= s.boot_timeout_s
    assert e.boot_s < 2 * s.boot_timeout_s  # the failure came at the deadline, not after a hung request
    assert elapsed < e.boot_s + s.grace_s  # teardown did not wait out its SIGKILL grace
    assert s.teardown.clean and not group_members(s.proc.pid)
    assert e.classify().failure_class == "timeout"


def test_server_dying_during_boot_fails_at_once(tmp_path):
    """The server answers /health, fails every completion, then exits with code 3 while its child lives on."""
    s = fake(tmp_path, "--die-after-s", "0.5", "--fail-completions", "100000", "--children", "1",
             boot_timeout_s=30)
    with pytest.raises(BootFailed) as ei:
        with s:
            pass
    e = ei.value
    assert e.kind == "died" and e.returncode == 3
    assert e.boot_s < s.boot_timeout_s / 2
    assert s.teardown.clean and not group_members(s.proc.pid)  # the surviving child was stopped too
    assert e.classify().failure_class == "crash"


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    s = fake(tmp_path, "--ignore-sigterm", "--children", "2", grace_s=0.5)
    with s:
        pgid = s.proc.pid
        assert len(group_members(pgid)) == 3
    td = s.teardown
    assert td.sigkill_used and td.sigterm_s is None and td.sigkill_s is not None
    assert td.clean and not group_members(pgid) and not s.run_dir.exists()
    assert td.returncode == -signal.SIGKILL


def test_teardown_runs_on_interrupt_in_the_with_block(tmp_path):
    s = fake(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with s:
            raise KeyboardInterrupt  # what Prefect cancellation / Ctrl-C looks like inside a task
    assert s.teardown is not None and s.teardown.clean and not group_members(s.proc.pid)
    assert tracked_servers() == []


def test_teardown_runs_on_interrupt_during_boot(tmp_path, monkeypatch):
    calls = []

    def interrupted(self):
        calls.append(self.proc.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(EngineServer, "wait_ready", interrupted)
    s = fake(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with s:
            pass
    assert calls and s.teardown is not None and not group_members(calls[0])


def test_unstoppable_server_marks_teardown_unclean(tmp_path, monkeypatch):
    """Signals that do nothing stand in for a process stuck in the kernel: teardown reports it, keeps the
    record, and a later stop_leftovers (signals working again) stops it."""
    monkeypatch.setattr(engine, "_signal_group", lambda pgid, sig: None)
    s = fake(tmp_path, grace_s=0.2, kill_wait_s=0.5)
    with s:
        pgid = s.proc.pid
    td = s.teardown
    assert not td.clean and td.sigkill_used and "survived SIGKILL" in td.detail and "port" in td.detail
    assert group_members(pgid) and s.run_dir.exists() and [e["pid"] for e in tracked_servers()] == [pgid]
    monkeypatch.undo()
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    stopped = stop_leftovers(log=lambda *_: None)
    assert [e["pid"] for e in stopped] == [pgid] and stopped[0]["teardown"]["clean"]
    assert not group_members(pgid) and not s.run_dir.exists() and tracked_servers() == []


# -- GPU memory back to baseline -----------------------------------------------------------------------------
def test_teardown_waits_for_gpu_memory_back_to_baseline(tmp_path):
    # reads: baseline at start (500), then three reads above tolerance, then back (700 <= 500 + 1024)
    nv = FakeNvml([FakeGpu(memory_used_mib=[500, 9000, 9000, 9000, 700])])
    s = fake(tmp_path, device="cuda", gpu_index=0, nvml=nv)
    with s:
        assert s.gpu_baseline_mib == 500
        assert env_of(s.proc.pid)["CUDA_VISIBLE_DEVICES"] == "0"
    td = s.teardown
    assert td.clean and td.gpu_memory_back_s is not None and td.gpu_memory_back_s > 0


def test_gpu_memory_not_back_makes_teardown_unclean(tmp_path):
    nv = FakeNvml([FakeGpu(memory_used_mib=[500, 9000])])
    s = fake(tmp_path, device="cuda", gpu_index=0, nvml=nv, gpu_memory_timeout_s=0.3)
    with s:
        pgid = s.proc.pid
    td = s.teardown
    assert not td.clean and td.gpu_memory_back_s is None and "not back to baseline" in td.detail
    assert not group_members(pgid)  # the processes are gone; the memory is what is wrong
    # the record stays; a later run drops it (group gone) and removes the private folder
    assert tracked_servers() and s.run_dir.exists()
    assert stop_leftovers(log=lambda *_: None) == [] and tracked_servers() == [] and not s.run_dir.exists()


# -- port identity -----------------------------------------------------------------------------------------------
def _old_server(port: int, *args: str) -> subprocess.Popen:
    """A server of an 'earlier trial' (another key, another name) on ``port``, in its own session."""
    p = subprocess.Popen([sys.executable, str(TESTS / "fakes" / "fake_openai_server.py"), "old-model", "--port",
                          str(port), "--api-key", "old-key", "--served-model-name", "old-trial", "--reuse-port", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while not port_listeners(port):
        assert p.poll() is None and time.monotonic() < deadline, "the old fake server did not start"
        time.sleep(0.05)
    return p


@pytest.mark.parametrize("listener_check", [True, False], ids=["proc-net", "no-proc-net"])
@pytest.mark.parametrize("old_args", [[], ["--no-auth"]], ids=["old-key", "old-no-auth"])
def test_old_server_on_the_port_is_never_taken_as_ready(tmp_path, monkeypatch, reap, listener_check, old_args):
    """An old server holds the port and answers /health 200. With /proc/net the foreign listening socket gives it
    away (our fake binds beside it with SO_REUSEPORT, as vLLM does); without, the 401 on our key, or a model list
    without our served name, does (our fake then never binds, so only the old one answers)."""
    port = engine.free_port()
    old = _old_server(port, *old_args)
    reap.append(old.pid)
    if not listener_check:
        monkeypatch.setattr(engine, "port_listeners", lambda port: None)
    s = fake(tmp_path, *(["--reuse-port"] if listener_check else ["--mode", "hang"]), port=port, boot_timeout_s=30)
    with pytest.raises(BootFailed) as ei:
        with s:
            pass
    e = ei.value
    assert e.kind == "not_ours" and e.boot_s < s.boot_timeout_s / 2
    assert str(port) in str(e)
    assert s.teardown.clean and s.teardown.port_free_s is not None  # the old server's socket is not ours to wait for
    assert old.poll() is None  # the old server was not touched
    assert not group_members(s.proc.pid)


# -- leftovers of a killed orchestrator ----------------------------------------------------------------------------
_ORCHESTRATOR = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from tunelab.tasks.engine import EngineServer
from tunelab.host.runtime import Runtime
from fakes import fake_server_runtime
spec = json.loads({spec!r})
rt = Runtime.model_validate_json(spec["runtime_json"]) if spec.get("runtime_json") else fake_server_runtime(*spec["fake_args"])
s = EngineServer(runtime=rt, model=spec["model"], serve_args=spec["serve_args"], env=spec["env"],
                 log_path=Path(spec["log"]), boot_timeout_s=spec["timeout"], trial_id="killed-orchestrator")
s.__enter__()
print(json.dumps({{"pid": s.proc.pid, "port": s.port, "run_dir": str(s.run_dir)}}), flush=True)
time.sleep(3600)
"""


def _start_orchestrator(tmp_path: Path, spec: dict) -> tuple[subprocess.Popen, dict]:
    """A python process that boots a server with EngineServer, prints its pid/port/run_dir when ready, and
    sleeps: an orchestrator to be SIGKILLed. It inherits this test's private TUNELAB_HOME."""
    code = _ORCHESTRATOR.format(tests=str(TESTS), spec=json.dumps(spec))
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=open(tmp_path / "orchestrator.err", "wb"), text=True)
    line = p.stdout.readline()  # blocks until the server is ready (or the orchestrator died)
    assert line, f"orchestrator failed: {(tmp_path / 'orchestrator.err').read_text()[-2000:]}"
    return p, json.loads(line)


def test_leftovers_of_a_killed_orchestrator_are_stopped_and_live_ones_left_alone(tmp_path, reap):
    spec = {"fake_args": ["--children", "2", "--write-tmp"], "model": "m", "serve_args": [],
            "env": {}, "log": str(tmp_path / "server.log"), "timeout": 60}
    orch, info = _start_orchestrator(tmp_path, spec)
    pgid = info["pid"]
    reap.append(pgid)
    try:
        assert len(group_members(pgid)) == 3
        # Another orchestrator is alive and owns it: a run starting now must leave it alone.
        assert stop_leftovers(log=lambda *_: None) == []
        assert len(group_members(pgid)) == 3 and [e["pid"] for e in tracked_servers()] == [pgid]
    finally:
        orch.kill()
        orch.wait()
    # The orchestrator was SIGKILLed (no teardown ran); then the API server dies too, its children live on.
    os.kill(pgid, signal.SIGKILL)
    time.sleep(0.2)
    survivors = group_members(pgid)
    assert len(survivors) == 2 and pgid not in survivors
    messages: list[str] = []
    stopped = stop_leftovers(log=messages.append)
    assert [e["pid"] for e in stopped] == [pgid] and stopped[0]["teardown"]["clean"]
    assert any("orphaned children" in m for m in messages)
    assert not group_members(pgid)
    assert not Path(info["run_dir"]).exists()
    assert tracked_servers() == []


def test_stop_leftovers_never_signals_an_unconfirmed_process(tmp_path, reap):
    """A record whose PID now belongs to a process without our server id (a recycled PID, or a PID from another
    PID namespace) is dropped, and the process is left alone."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    reap.append(stranger.pid)
    dead = subprocess.Popen(["true"])
    dead.wait()
    base = {"pid": stranger.pid, "pgid": stranger.pid, "port": 1, "trial_id": "t", "owner_pid": dead.pid,
            "owner_start_ticks": -1}
    engine._state_write([
        {**base, "server_id": "0123456789abcdef", "run_dir": str(tmp_path / "tl-gone")},
        {**base, "pid": stranger.pid, "trial_id": "legacy", "start_ticks": -5},  # old record: ticks do not match
    ])
    (tmp_path / "tl-gone").mkdir()
    assert stop_leftovers(log=lambda *_: None) == []
    time.sleep(0.1)
    assert stranger.poll() is None and group_members(stranger.pid) == [stranger.pid]
    assert tracked_servers() == []
    assert not is_tunelab_process(stranger.pid, [{"server_id": "0123456789abcdef"}])


# -- the real CPU runtime (3 boots in total) -------------------------------------------------------------------------
REAL_ARGS = ["--enforce-eager", "--max-model-len", "512"]


@pytest.mark.runtime
def test_real_boot_ready_phases_and_teardown(cpu_runtime, tiny_model, tmp_path):
    s = EngineServer(runtime=cpu_runtime, model=str(tiny_model), serve_args=REAL_ARGS, env={},
                     log_path=tmp_path / "real.log", boot_timeout_s=400, trial_id="real")
    with s:
        pgid = s.proc.pid
        assert s.boot.health_s is not None and s.boot.boot_s >= s.boot.health_s
        headers = {"Authorization": f"Bearer {s.api_key}"}
        r = httpx.post(f"{s.base_url}/v1/completions", headers=headers, timeout=120,
                       json={"model": s.served_model_name, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(f"{s.base_url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        members = group_members(pgid)
        assert members and all(is_tunelab_process(m) for m in members)
    td = s.teardown
    assert td.clean and td.port_free_s is not None, td.detail
    assert not group_members(pgid) and not port_listeners(s.port)
    assert not s.run_dir.exists() and tracked_servers() == []
    report = bootlog.parse_boot_log(Path(s.log_path).read_text(errors="replace"))
    phases = {p.phase for p in report.phases}
    assert {"weights_load", "kv_cache", "init_engine"} <= phases, phases
    assert report.effective_config.get("enforce_eager") in (True, "True"), report.effective_config


@pytest.mark.runtime
def test_real_invalid_engine_arg_is_invalid_config_and_not_retryable(cpu_runtime, tiny_model, tmp_path):
    s = EngineServer(runtime=cpu_runtime, model=str(tiny_model), serve_args=[*REAL_ARGS, "--max-num-seqs", "many"],
                     env={}, log_path=tmp_path / "bad.log", boot_timeout_s=400, trial_id="bad")
    with pytest.raises(BootFailed) as ei:
        with s:
            pass
    e = ei.value
    assert e.kind == "died" and e.returncode not in (None, 0)
    assert e.boot_s < s.boot_timeout_s / 2
    f = e.classify()
    assert f.failure_class == "invalid_config" and f.retryable is False, f
    assert "max-num-seqs" in f.reason or "max_num_seqs" in f.reason, f.reason
    assert s.teardown.clean and tracked_servers() == []


@pytest.mark.runtime
def test_real_leftovers_of_a_killed_orchestrator_with_surviving_engine_core(cpu_runtime, tiny_model, tmp_path, reap):
    """The orchestrator is SIGKILLed after ready, then the API server is SIGKILLed too: vLLM's EngineCore (a
    child in the server's group, VLLM_ENABLE_V1_MULTIPROCESSING=1) lives on. The next run's stop_leftovers
    must stop it."""
    spec = {"runtime_json": cpu_runtime.model_dump_json(), "model": str(tiny_model), "serve_args": REAL_ARGS,
            "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, "log": str(tmp_path / "real.log"), "timeout": 400}
    orch, info = _start_orchestrator(tmp_path, spec)
    pgid = info["pid"]
    reap.append(pgid)
    orch.kill()
    orch.wait()
    os.kill(pgid, signal.SIGKILL)
    time.sleep(0.5)
    survivors = group_members(pgid)
    assert survivors and pgid not in survivors, "expected EngineCore to outlive the API server"
    stopped = stop_leftovers(log=lambda *_: None)
    assert [e["pid"] for e in stopped] == [pgid] and stopped[0]["teardown"]["clean"]
    assert not group_members(pgid)
    assert not Path(info["run_dir"]).exists() and tracked_servers() == []


def test_port_conflict_names_the_pid_that_holds_the_port(tmp_path, reap):
    """The boot failure of a port conflict names the PID (and command) of the process holding the port, not a
    socket inode; the trial's reason is that message alone (no contradicting 'stopped before ready' clause)."""
    from tunelab.tasks.steps.boot import boot_failure_reason

    port = engine.free_port()
    old = _old_server(port)
    reap.append(old.pid)
    s = fake(tmp_path, "--reuse-port", port=port, boot_timeout_s=30)
    with pytest.raises(BootFailed) as ei:
        with s:
            pass
    e = ei.value
    assert e.kind == "not_ours" and f"PID {old.pid} (" in str(e) and "fake_openai_server.py" in str(e), str(e)
    assert "socket" not in str(e)
    reason = boot_failure_reason(e, bootlog.classify_boot_failure(s.log_path.read_text(errors="replace"), None, False))
    assert reason == str(e) and "stopped before ready" not in reason


# -- readiness answers parsed with the openai package's types -------------------------------------------------------
VLLM_MODELS = {"object": "list", "data": [{"id": "tunelab-1a2b", "object": "model", "created": 1764000000,
                                           "owned_by": "vllm", "root": "/models/tiny", "parent": None,
                                           "max_model_len": 2048, "permission": []}]}
VLLM_COMPLETION = {"id": "cmpl-9f", "object": "text_completion", "created": 1764000000, "model": "tunelab-1a2b",
                   "choices": [{"index": 0, "text": " the", "logprobs": None, "finish_reason": "length",
                                "stop_reason": None, "prompt_logprobs": None}],
                   "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1}, "kv_transfer_params": None}


def test_readiness_answers_are_parsed_as_openai_types():
    """vLLM's answers (with its extra fields) parse; an answer that only looks like one is not readiness."""
    assert engine.served_model_ids(VLLM_MODELS) == ["tunelab-1a2b"]
    assert engine.completion_ok(VLLM_COMPLETION)
    with pytest.raises(ValueError):
        engine.served_model_ids({"data": [{"name": "tunelab-1a2b"}]})
    assert not engine.completion_ok({"choices": [{"error": "engine dead"}]})  # was taken as ready: 'choices' non-empty
    assert not engine.completion_ok({**VLLM_COMPLETION, "choices": []})
    assert not engine.completion_ok("Service Unavailable")
