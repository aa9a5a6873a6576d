"""GPU hygiene with an injected FAKE NVML (tests/fakes/fake_nvml.py): inventory, no driver, foreign and
unconfirmed processes, memory back to baseline, the sampler. One test uses the real pynvml on this host to show
that a machine without a GPU driver gives an explicit "no GPU" inventory, not a crash."""

from __future__ import annotations

import math
import os
import time

import pytest

from fakes.fake_nvml import FakeGpu, FakeNvml
from tunelab.tasks import gpu


def two_gpus() -> FakeNvml:
    return FakeNvml([
        FakeGpu(name="NVIDIA H200", uuid="GPU-aaaa", memory_total_mib=143771, memory_used_mib=612,
                processes=[(4242, 80_000.0)]),
        FakeGpu(name="NVIDIA H200", uuid="GPU-bbbb", memory_total_mib=143771, memory_used_mib=0,
                processes=[(77, None)]),
    ], driver="580.159.04", cuda=12040)


def test_inventory_reads_every_gpu_and_versions():
    nv = two_gpus()
    inv = gpu.inventory(nvml=nv)
    assert inv.available and inv.reason == ""
    assert inv.driver_version == "580.159.04" and inv.cuda_version == "12.4"
    assert [(g.index, g.name, g.uuid) for g in inv.gpus] == [(0, "NVIDIA H200", "GPU-aaaa"), (1, "NVIDIA H200", "GPU-bbbb")]
    assert inv.gpus[0].memory_used_mib == pytest.approx(612) and inv.gpus[0].memory_total_mib == pytest.approx(143771)
    assert [(p.pid, p.used_memory_mib) for p in inv.gpus[0].processes] == [(4242, pytest.approx(80_000.0))]
    assert [(p.pid, p.used_memory_mib) for p in inv.gpus[1].processes] == [(77, None)]  # NVML "not available"
    assert nv.inits == nv.shutdowns == 1


def test_no_driver_is_an_explicit_no_gpu_not_a_crash():
    nv = FakeNvml(init_error="Driver Not Loaded")
    inv = gpu.inventory(nvml=nv)
    assert not inv.available and "no GPU" in inv.reason and "Driver Not Loaded" in inv.reason and inv.gpus == []
    chk = gpu.check_clean(0, 0.0, nvml=nv, is_ours=lambda pid: True)
    assert not chk.available and not chk.clean and "NVML unavailable" in chk.detail and math.isnan(chk.memory_used_mib)
    assert gpu.memory_used_mib(0, nvml=nv) is None
    assert gpu.wait_memory_back(0, 0.0, timeout_s=0.2, poll_s=0.05, nvml=nv) is None
    with gpu.GpuSampler(0, interval_s=0.01, nvml=nv) as s:
        time.sleep(0.05)
    assert s.rows == [] and "Driver Not Loaded" in s.error


def test_real_nvml_on_this_host_without_a_gpu_driver():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has a working NVIDIA driver")
    inv = gpu.inventory()
    assert not inv.available and inv.reason.startswith("no GPU") and inv.gpus == []


def test_foreign_process_is_reported_and_not_ours():
    nv = two_gpus()
    chk = gpu.check_clean(0, baseline_mib=600, our_pids={1}, nvml=nv, is_ours=lambda pid: pid == 1)
    assert not chk.clean and chk.available
    assert chk.foreign_pids == [4242] and chk.our_pids == []
    assert "4242" in chk.detail and "left alone" in chk.detail


def test_pid_from_another_namespace_is_not_taken_as_ours():
    """NVML reports PID 4242, which is in our state file's PIDs, but /proc does not confirm it (in a container it
    is another namespace's PID): it is foreign, so the trial becomes gpu_busy and nothing is killed."""
    nv = two_gpus()
    confirmed = gpu.check_clean(0, 600, our_pids={4242}, nvml=nv, is_ours=lambda pid: pid == 4242)
    assert confirmed.our_pids == [4242] and confirmed.foreign_pids == [] and not confirmed.clean
    # a confirmed child of our server (EngineCore/worker) is ours although only the server's PID is recorded
    child = gpu.check_clean(0, 600, our_pids={1}, nvml=nv, is_ours=lambda pid: pid == 4242)
    assert child.our_pids == [4242] and child.foreign_pids == []
    unconfirmed = gpu.check_clean(0, 600, our_pids={4242}, nvml=nv, is_ours=lambda pid: False)
    assert unconfirmed.our_pids == [] and unconfirmed.foreign_pids == [4242]


def test_default_confirmation_reads_proc(tmp_path, monkeypatch):
    """Without ``is_ours`` the check asks tasks.processes whether the PID carries a tracked server id: this test
    process carries none, so even listed in our_pids it is foreign."""
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    nv = FakeNvml([FakeGpu(memory_used_mib=0, processes=[(os.getpid(), 100.0)])])
    chk = gpu.check_clean(0, 0, our_pids={os.getpid()}, nvml=nv)
    assert chk.foreign_pids == [os.getpid()] and chk.our_pids == []


@pytest.mark.parametrize("used, clean", [(600 + 1024, True), (600 + 1025, False), (0, True)])
def test_memory_tolerance_around_baseline(used, clean):
    nv = FakeNvml([FakeGpu(memory_used_mib=used)])
    chk = gpu.check_clean(0, baseline_mib=600, tolerance_mib=1024, nvml=nv, is_ours=lambda pid: False)
    assert chk.clean is clean and chk.memory_used_mib == pytest.approx(used)
    assert ("above baseline" in chk.detail) is (not clean)


def test_wait_memory_back_counts_until_baseline():
    nv = FakeNvml([FakeGpu(memory_used_mib=[90_000, 50_000, 5_000, 700])])
    s = gpu.wait_memory_back(0, baseline_mib=600, tolerance_mib=1024, timeout_s=30, poll_s=0.01, nvml=nv)
    assert s is not None and nv.gpus[0]._reads == 4  # stopped polling at the first value within tolerance
    nv2 = FakeNvml([FakeGpu(memory_used_mib=90_000)])
    assert gpu.wait_memory_back(0, 600, timeout_s=0.1, poll_s=0.01, nvml=nv2) is None


def test_sampler_rows_match_gpu_samples_columns():
    g = FakeGpu(memory_used_mib=[1000, 2000, 3000], utilization_pct=97, sm_clock_mhz=1755, mem_clock_mhz=3201,
                power_mw=612_500, temperature_c=71, throttle_reasons=0x4 | 0x20, unsupported={"nvmlDeviceGetTemperature"})
    nv = FakeNvml([g])
    with gpu.GpuSampler(0, interval_s=0.02, nvml=nv) as s:
        deadline = time.monotonic() + 10
        while len(s.rows) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(s.rows) >= 4 and s.error is None
    cols = {"ts", "gpu_index", "memory_used_mib", "utilization_pct", "sm_clock_mhz", "mem_clock_mhz", "power_w",
            "temperature_c", "throttle_reasons"}
    assert all(set(r) == cols for r in s.rows)
    assert [r["memory_used_mib"] for r in s.rows[:3]] == pytest.approx([1000, 2000, 3000])
    r = s.rows[0]
    assert (r["utilization_pct"], r["sm_clock_mhz"], r["mem_clock_mhz"]) == (97, 1755, 3201)
    assert r["power_w"] == pytest.approx(612.5)  # NVML reports mW
    assert r["temperature_c"] is None  # not supported on this (fake) GPU: None, not a crash
    assert r["throttle_reasons"] & gpu.THROTTLE_BITS
    assert gpu.throttle_reason_names(r["throttle_reasons"]) == ["sw_power_cap", "sw_thermal_slowdown"]
    ts = [r["ts"] for r in s.rows]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert nv.inits == nv.shutdowns == 1


def test_sampler_keeps_a_fixed_schedule():
    """Sample k is due at start + k x interval: with slow NVML reads (0.09 s of a 0.1 s interval) the number of
    samples follows the elapsed time (one per 0.1 s), not one per read + interval (0.19 s)."""
    class SlowNvml(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, h):
            time.sleep(0.09)
            return super().nvmlDeviceGetMemoryInfo(h)

    nv = SlowNvml([FakeGpu()])
    t0 = time.monotonic()
    with gpu.GpuSampler(0, interval_s=0.1, nvml=nv) as s:
        time.sleep(1.0)
    elapsed = time.monotonic() - t0
    assert len(s.rows) > elapsed / 0.17


def test_throttle_reason_names_and_bad_interval():
    assert gpu.throttle_reason_names(None) == [] and gpu.throttle_reason_names(0) == []
    assert gpu.throttle_reason_names(0x1 | 0x40 | 0x1000) == ["gpu_idle", "hw_thermal_slowdown", "0x1000"]
    assert not (0x1 & gpu.THROTTLE_BITS)  # idle is not throttling
    with pytest.raises(ValueError, match="interval_s"):
        gpu.GpuSampler(0, interval_s=0)
