"""Several GPUs on one host, with a FAKE NVML (tests/fakes/fake_nvml.py) and FAKE servers (below): device identity
(PCI order, an inherited CUDA_VISIBLE_DEVICES, the placement check), per-device NVML errors (MIG, NoPermission),
the compile lock of parallel boots, the corrupted-cache and port-in-use failure classes, and the boot retried
once through Prefect's task retries."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fakes.fake_nvml import FakeGpu, FakeNvml
from tunelab.flows import devices as D
from tunelab.tasks import bootlog, compile_cache, gpu


# -- a host with two GPU models, NVML's order not PCI's ------------------------------------------------------
def mixed_host() -> FakeNvml:
    """NVML index 0 is an A100 on bus 3b, index 1 an H200 on bus 18: in PCI bus order the H200 comes first."""
    return FakeNvml([
        FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid="GPU-aaaa-1111", memory_total_mib=81920, memory_used_mib=400,
                pci_bus_id="00000000:3B:00.0"),
        FakeGpu(name="NVIDIA H200", uuid="GPU-bbbb-2222", memory_total_mib=143771, memory_used_mib=500,
                pci_bus_id="00000000:18:00.0"),
    ])


def test_servers_get_pci_bus_order_ordinals_not_nvml_indices():
    from tunelab.flows.trial import trial_server_env
    from tunelab.core.plan import Trial

    inv = gpu.inventory(nvml=mixed_host())
    assert [(g.index, g.name.split()[1], g.cuda_index) for g in inv.gpus] == [(0, "A100-SXM4-80GB", 1), (1, "H200", 0)]
    devs = D.devices_from_inventory(inv)
    assert [(d.index, d.uuid, d.cuda_index) for d in devs] == [(0, "GPU-aaaa-1111", 1), (1, "GPU-bbbb-2222", 0)]
    # The A100 (NVML 0) is CUDA device 1 under PCI_BUS_ID order: its server must see "1", with that order set.
    assert D.device_env([devs[0]]) == "1" and D.device_env([devs[1]]) == "0" and D.device_env(devs) == "1,0"
    t = Trial(runtime="r", model="m", model_id="m", engine_args={}, env={})
    env = trial_server_env(t, None, [0], D.device_env([devs[0]]))
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == "1"
    # Each GPU owns a block of internal ports: parallel servers on gpu0 and gpu1 never share torch's 29500.
    env1 = trial_server_env(t, None, [1], "0")
    assert env["VLLM_PORT"] != env1["VLLM_PORT"] and env["MASTER_PORT"] != env1["MASTER_PORT"]
    assert env["MASTER_PORT"] != "29500" and abs(int(env["VLLM_PORT"]) - int(env1["VLLM_PORT"])) >= D.DIST_PORT_BLOCK


def test_an_inherited_cuda_visible_devices_is_honoured():
    inv = gpu.inventory(nvml=mixed_host())
    env = {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}  # a unique UUID prefix, as CUDA accepts
    assert [d.index for d in D.host_devices(inv, env=env)] == [1]
    # An integer under PCI_BUS_ID order is a PCI ordinal: CUDA 0 is the H200, NVML 1.
    assert [d.index for d in D.host_devices(inv, env={"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})] == [1]
    # Integers in CUDA's default fastest-first order cannot be mapped on mixed models: a clear error, not a guess.
    with pytest.raises(ValueError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        D.host_devices(inv, env={"CUDA_VISIBLE_DEVICES": "0"})
    # On one model the order is PCI order.
    same = gpu.inventory(nvml=FakeNvml([FakeGpu(uuid="GPU-0", pci_bus_id="0000:18:00.0"),
                                        FakeGpu(uuid="GPU-1", pci_bus_id="0000:2a:00.0")]))
    assert [d.index for d in D.host_devices(same, env={"CUDA_VISIBLE_DEVICES": "1"})] == [1]
    assert D.host_devices(same, env={"CUDA_VISIBLE_DEVICES": "-1"}) == []  # CUDA stops at -1: no GPU
    assert [d.index for d in D.host_devices(same, env={})] == [0, 1]
    with pytest.raises(ValueError, match="outside the inherited CUDA_VISIBLE_DEVICES"):
        D.host_devices(same, only=[0], env={"CUDA_VISIBLE_DEVICES": "1"})


def test_placement_after_boot_finds_a_server_on_the_wrong_gpu():
    nv = mixed_host()
    nv.gpus[1].processes = [(4100, 70_000.0), (999, 10.0)]  # our EngineCore (4100) sits on NVML gpu1
    placed = gpu.server_placement({4099, 4100}, nvml=nv)
    assert placed == {1: [4100]}
    problem = gpu.placement_problem([0], placed)
    assert problem and "gpu1 (PIDs [4100])" in problem and "none on gpu0" in problem
    assert gpu.placement_problem([1], placed) is None
    assert gpu.placement_problem([0], {}) is None  # NVML shows none of ours (other PID namespace): cannot tell


# -- per-device NVML errors ----------------------------------------------------------------------------------
def test_mig_and_no_permission_are_device_statuses_not_a_crash():
    nv = FakeNvml([
        FakeGpu(uuid="GPU-ok", memory_used_mib=300, pci_bus_id="0000:18:00.0"),
        FakeGpu(uuid="GPU-mig", pci_bus_id="0000:2a:00.0",
                mig=[FakeGpu(uuid="MIG-1111", memory_total_mib=16384, memory_used_mib=12),
                     FakeGpu(uuid="MIG-2222", memory_total_mib=32768, memory_used_mib=20)]),
        FakeGpu(uuid="GPU-locked", pci_bus_id="0000:3b:00.0",
                errors={"nvmlDeviceGetMemoryInfo": "Insufficient Permissions"}),
        FakeGpu(uuid="GPU-vgpu", pci_bus_id="0000:4c:00.0", unsupported={"nvmlDeviceGetComputeRunningProcesses"}),
    ])
    inv = gpu.inventory(nvml=nv)
    assert inv.available and [g.status for g in inv.gpus] == ["ok", "mig", "no_permission", "unsupported"]
    mig = inv.gpus[1]
    assert [(m.uuid, m.memory_total_mib, m.memory_used_mib) for m in mig.mig_instances] == [
        ("MIG-1111", 16384, 12), ("MIG-2222", 32768, 20)]  # memory of each instance, not of the whole GPU
    assert "MIG-1111" in mig.reason and "not scheduled" in mig.reason
    assert "Insufficient Permissions" in inv.gpus[2].reason and "memory" in inv.gpus[2].reason
    assert [d.index for d in D.devices_from_inventory(inv)] == [0]
    assert len(D.unusable_gpus(inv)) == 3
    with pytest.raises(ValueError, match=r"2 \(no_permission"):
        D.devices_from_inventory(inv, only=[0, 2])
    with pytest.raises(ValueError, match="MIG instance"):
        gpu.inherited_restriction("MIG-1111", None, inv)


# -- boot log classes ----------------------------------------------------------------------------------------
CORRUPT_LOG = """\
(EngineCore_DP0 pid=7) INFO 12-01 10:00:01 [backends.py:115] Directly load the compiled graph(s) for dynamic shape from the cache, took 0.5 s
(EngineCore_DP0 pid=7) ERROR 12-01 10:00:02 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=7) ERROR 12-01 10:00:02 [core.py:700] Traceback (most recent call last):
(EngineCore_DP0 pid=7) ERROR 12-01 10:00:02 [core.py:700]   File "/venv/lib/python3.12/site-packages/vllm/compilation/compiler_interface.py", line 300, in load
(EngineCore_DP0 pid=7) ERROR 12-01 10:00:02 [core.py:700]     inductor_compiled_graph = pickle.load(f)  # /home/u/.tunelab/runtimes/gpu/vllm-cache/torch_compile_cache/3f2a9c1b0d/rank_0_0
(EngineCore_DP0 pid=7) ERROR 12-01 10:00:02 [core.py:700] _pickle.UnpicklingError: pickle data was truncated
(APIServer pid=5) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_corrupted_compile_cache_is_its_own_transient_class():
    f = bootlog.classify_boot_failure(CORRUPT_LOG, 1, False)
    assert f.failure_class == "compile_cache_corrupt" and f.transient and f.retryable
    assert "pickle data was truncated" in f.reason
    assert bootlog.corrupt_cache_dir(CORRUPT_LOG) == "/home/u/.tunelab/runtimes/gpu/vllm-cache/torch_compile_cache/3f2a9c1b0d"
    # The same error outside compile code is an ordinary crash.
    plain = "ERROR 12-01 10:00:02 [x.py:1] _pickle.UnpicklingError: invalid load key, 'x'.\n"
    assert bootlog.classify_boot_failure(plain, 1, False).failure_class == "crash"


@pytest.mark.parametrize("line", [
    "RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
    "OSError: [Errno 98] address already in use",
    "torch.distributed.DistNetworkError: ADDRESS ALREADY IN USE",
])
def test_port_in_use_is_transient_in_any_case(line):
    f = bootlog.classify_boot_failure(f"ERROR 12-01 10:00:02 [x.py:1] {line}\n", 1, False)
    assert f.failure_class == "crash" and f.transient and f.retryable


# -- parallel boots of one compile key; retries ----------------------------------------------------------------
class FakeServer:
    """FAKE EngineServer for the boot attempts: ``start``/``wait_ready``/``stop``; ``outcome`` is 'ok' or a log
    text to fail with (written to the log, then BootFailed 'died' with exit status 1). Records its timeline."""

    timeline: list[tuple[str, str, float]] = []

    def __init__(self, name: str, log_path: Path, outcome: str = "ok", boot_s: float = 0.0):
        self.name, self.log_path, self.outcome, self.boot_s = name, Path(log_path), outcome, boot_s
        self.stopped = False
        self.proc = None

    def start(self) -> None:
        FakeServer.timeline.append((self.name, "start", time.monotonic()))

    def wait_ready(self):
        from tunelab.tasks.engine import BootFailed, BootResult

        time.sleep(self.boot_s)
        if self.outcome != "ok":
            self.log_path.write_text(self.outcome)
            raise BootFailed("died", "vllm serve exited with code 1 during boot", 1, self.log_path, self.boot_s)
        FakeServer.timeline.append((self.name, "ready", time.monotonic()))
        return BootResult(self.boot_s, self.boot_s, 1234, 1)

    def stop(self):
        self.stopped = True


def test_two_boots_of_one_compile_key_at_once_the_second_boots_warm(tmp_path):
    from tunelab.tasks.steps.boot import TrialBoots as _Boots

    FakeServer.timeline = []
    key = f"k-{tmp_path.name}"
    boots = [_Boots(lambda lp, n=n: FakeServer(n, lp, boot_s=1.0), tmp_path / f"{n}.log", "rt", key)
             for n in ("first", "second")]
    other = _Boots(lambda lp: FakeServer("other-key", lp, boot_s=1.0), tmp_path / "o.log", "rt", key + "-other")
    assert not compile_cache.is_warm("rt", key)
    th = [threading.Thread(target=b.attempt) for b in (*boots, other)]
    th[0].start()
    time.sleep(0.3)
    th[1].start()
    th[2].start()
    for t in th:
        t.join(timeout=30)
    ev = {(n, e): t for n, e, t in FakeServer.timeline}
    # The second boot of the key started only after the first was ready (then warm); another key did not wait.
    assert ev[("second", "start")] >= ev[("first", "ready")]
    assert ev[("other-key", "start")] < ev[("first", "ready")]
    assert compile_cache.is_warm("rt", key)


def _run_boot(boots):
    from prefect import flow

    from tunelab.tasks.steps.boot import boot_task
    from tunelab.tasks.steps.outcome import task_value as _task_value

    @flow(name="boot-retry-test")
    def f():
        try:
            return _task_value(boot_task(boots))
        except Exception as e:  # noqa: BLE001 - returned for the assertions
            return e

    return f()


PORT_LOG = "ERROR 12-01 10:00:02 [x.py:1] OSError: [Errno 98] Address already in use\n"
OOM_LOG = "ERROR 12-01 10:00:02 [x.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def test_a_transient_boot_failure_is_retried_once_through_prefect(tmp_path):
    from tunelab.tasks.steps.boot import TrialBoots as _Boots

    outcomes = iter([PORT_LOG, "ok"])
    made: list[FakeServer] = []

    def make(lp):
        made.append(FakeServer(f"s{len(made)}", lp, next(outcomes)))
        return made[-1]

    b = _Boots(make, tmp_path / "t.log", "rt", f"k-{tmp_path.name}")
    out = _run_boot(b)
    assert out["port"] == 1234 and b.attempts == 2 and len(made) == 2 and made[0].stopped
    assert b.server is made[1]
    assert b.first_failure.startswith("crash: ") and "Address already in use" in b.first_failure
    assert (tmp_path / "t.attempt1.log").read_text() == PORT_LOG  # the first attempt's log is kept


def test_a_config_failure_is_not_retried(tmp_path):
    from tunelab.tasks.steps.boot import TrialBoots as _Boots
    from tunelab.tasks.engine import BootFailed

    made: list[FakeServer] = []
    b = _Boots(lambda lp: made.append(FakeServer("s", lp, OOM_LOG)) or made[-1], tmp_path / "t.log", "rt", "k-oom")
    out = _run_boot(b)
    assert isinstance(out, BootFailed) and out.failure.failure_class.startswith("oom_")
    assert b.attempts == 1 and len(made) == 1 and b.first_failure is None


def test_a_corrupted_cache_is_moved_aside_and_booted_once_more(tmp_path):
    from tunelab.tasks.steps.boot import TrialBoots as _Boots

    root = compile_cache.cache_root("rt-corrupt")
    bad = root / "torch_compile_cache" / "3f2a9c1b0d"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / "artefact.pkl").write_bytes(b"\x80")
    log = CORRUPT_LOG.replace("/home/u/.tunelab/runtimes/gpu/vllm-cache", str(root))
    outcomes = iter([log, "ok"])
    b = _Boots(lambda lp: FakeServer("s", lp, next(outcomes)), tmp_path / "t.log", "rt-corrupt", "k-c")
    out = _run_boot(b)
    assert out["port"] == 1234 and b.attempts == 2
    assert b.first_failure.startswith("compile_cache_corrupt: ") and "moved aside" in b.first_failure
    assert not bad.exists()
    moved = [p for p in (root / "torch_compile_cache").iterdir() if p.name.startswith("3f2a9c1b0d.corrupt-")]
    assert len(moved) == 1 and (moved[0] / "artefact.pkl").exists()  # kept for a bug report


def test_a_failed_boot_raises_its_typed_reason_into_the_flow(tmp_path):
    """The boot task raises BootFailed (not a returned Failed state) carrying the classified reason: a config that
    cannot boot is not retryable, a port taken twice is retryable after both attempts."""
    from prefect import flow

    from tunelab.tasks.engine import BootFailed
    from tunelab.tasks.steps.boot import TrialBoots, boot_task

    @flow(name="boot-raises-test")
    def f(boots):
        try:
            boot_task(boots)
        except BootFailed as e:  # raised here, in the flow: nothing to unwrap
            return e
        return None

    oom = TrialBoots(lambda lp: FakeServer("s", lp, OOM_LOG), tmp_path / "o.log", "rt", f"k-oom-{tmp_path.name}")
    e = f(oom)
    assert isinstance(e, BootFailed) and e.failure_class.startswith("oom_") and e.retryable is False
    assert "out of memory" in e.reason.lower() and oom.attempts == 1
    port = TrialBoots(lambda lp: FakeServer("p", lp, PORT_LOG), tmp_path / "p.log", "rt", f"k-port-{tmp_path.name}")
    e = f(port)
    assert isinstance(e, BootFailed) and e.failure_class == "crash" and e.retryable is True
    assert port.attempts == 2 and "Address already in use" in e.reason


def test_prefects_record_of_a_failed_boot_is_one_line_without_a_traceback(tmp_path):
    """Two transient failures exhaust the retry: Prefect logs "Task run failed with exception ... Retries are
    exhausted" with the exception attached; the filter on its task-run logger keeps that to one line."""
    import logging

    from prefect import flow

    from tunelab.tasks.engine import BootFailed
    from tunelab.tasks.steps.boot import TrialBoots, boot_task

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(logging.Formatter("%(message)s").format(record))

    @flow(name="boot-log-test")
    def f(boots):
        try:
            boot_task(boots)
        except BootFailed:
            pass

    h = Keep(level=logging.DEBUG)
    logger = logging.getLogger("prefect.task_runs")
    logger.addHandler(h)
    try:
        f(TrialBoots(lambda lp: FakeServer("p", lp, PORT_LOG), tmp_path / "p.log", "rt", f"k-l-{tmp_path.name}"))
    finally:
        logger.removeHandler(h)
    exhausted = [m for m in seen if "Retries are exhausted" in m]
    assert exhausted and all("BootFailed" in m and "\n" not in m for m in exhausted), seen
    assert not any("Traceback" in m for m in seen), seen
    assert any(m.startswith("boot failed (crash): ") for m in seen), seen


def test_the_boot_log_filter_keeps_other_exceptions_tracebacks():
    import logging
    import sys

    from tunelab.tasks.engine import BootFailed
    from tunelab.tasks.steps.boot import BootFailedLogFilter

    def record(exc):
        try:
            raise exc
        except BaseException:
            return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "failed: %r\nmore", (exc,),
                                     sys.exc_info())

    bug = record(RuntimeError("a bug"))
    assert BootFailedLogFilter().filter(bug) and "Traceback" in logging.Formatter().format(bug)
    boot = record(BootFailed("died", "vllm serve exited", 1, Path("x.log"), 0.0))
    assert BootFailedLogFilter().filter(boot)
    text = logging.Formatter().format(boot)
    assert "Traceback" not in text and "\n" not in text and text.startswith("failed: BootFailed(")
