"""GPU hygiene through NVML (nvidia-ml-py): inventory, baseline memory, foreign processes, sampling.

No NVML (no driver, a CPU host) gives an explicit ``Inventory(available=False, ...)``, never a crash.
Tests inject a fake NVML module through the ``nvml`` argument (the real one is ``pynvml``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GpuInfo", "Inventory", "inventory", "GpuCheck", "check_clean", "GpuSampler", "THROTTLE_BITS"]


def _nvml(nvml: Any | None):
    if nvml is not None:
        return nvml
    import pynvml

    return pynvml


@dataclass
class GpuInfo:
    """One GPU as NVML reports it. Memory in MiB."""

    index: int
    name: str
    uuid: str
    memory_total_mib: float
    memory_used_mib: float


@dataclass
class Inventory:
    """All GPUs of the host, or ``available=False`` with the reason (e.g. 'NVML Shared Library Not Found')."""

    available: bool
    reason: str = ""
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def inventory(nvml: Any | None = None) -> Inventory:
    """Read name, UUID, memory of every GPU, plus driver and CUDA driver versions.

    Returns ``Inventory(available=False)`` when NVML cannot be initialised (no driver / no GPU)."""
    try:
        nv = _nvml(nvml)
        nv.nvmlInit()
    except Exception as e:  # pynvml.NVMLError_LibraryNotFound and friends; ImportError too
        return Inventory(False, reason=f"no GPU: {e}")
    try:
        inv = Inventory(True, driver_version=_s(nv.nvmlSystemGetDriverVersion()))
        try:
            cv = nv.nvmlSystemGetCudaDriverVersion()
            inv.cuda_version = f"{cv // 1000}.{(cv % 1000) // 10}"
        except Exception:
            pass
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            inv.gpus.append(GpuInfo(i, _s(nv.nvmlDeviceGetName(h)), _s(nv.nvmlDeviceGetUUID(h)),
                                    mem.total / 2**20, mem.used / 2**20))
        return inv
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


@dataclass
class GpuCheck:
    """Result of the pre-boot check of one GPU. ``clean`` is True when no foreign compute process runs on
    it and used memory is within ``tolerance_mib`` of the baseline."""

    gpu_index: int
    clean: bool
    memory_used_mib: float
    baseline_mib: float
    foreign_pids: list[int]
    our_pids: list[int]
    detail: str = ""


def check_clean(gpu_index: int, baseline_mib: float, our_pids: set[int], tolerance_mib: float = 1024,
                nvml: Any | None = None) -> GpuCheck:
    """Check that GPU ``gpu_index`` holds no foreign process and is back at baseline memory.

    ``our_pids`` are PIDs tunelab started (from its state file). Inside a container NVML may report PIDs of
    another PID namespace, so a PID NVML reports is "ours" only if it is in ``our_pids``; anything else is
    foreign and is reported, never killed.
    """
    nv = _nvml(nvml)
    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(gpu_index)
        used = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        pids = [p.pid for p in procs]
    finally:
        nv.nvmlShutdown()
    ours = [p for p in pids if p in our_pids]
    foreign = [p for p in pids if p not in our_pids]
    excess = used - baseline_mib
    clean = not foreign and not ours and excess <= tolerance_mib
    detail = []
    if foreign:
        detail.append(f"foreign compute processes {foreign}")
    if ours:
        detail.append(f"tunelab processes still on the GPU {ours}")
    if excess > tolerance_mib:
        detail.append(f"{excess:.0f} MiB above baseline {baseline_mib:.0f} MiB")
    return GpuCheck(gpu_index, clean, used, baseline_mib, foreign, ours, "; ".join(detail))


# NVML clock-event (throttle) reasons that mean the measurement was slowed by the hardware or power
# (nvmlClocksEventReason*: HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80,
# SW power cap 0x4). GPU idle (0x1) and application clocks setting (0x2) are not throttling.
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


class GpuSampler:
    """Background thread sampling one GPU every ``interval_s``: memory, utilization, SM and memory clocks,
    power, temperature, throttle reasons. Rows match the ``gpu_samples`` table. A no-op without NVML."""

    def __init__(self, gpu_index: int, interval_s: float = 0.5, nvml: Any | None = None):
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._nvml = nvml
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            nv = _nvml(self._nvml)
            nv.nvmlInit()
        except Exception:
            return
        try:
            h = nv.nvmlDeviceGetHandleByIndex(self.gpu_index)
            while not self._stop.is_set():
                row = {"ts": time.time(), "gpu_index": self.gpu_index}
                for col, fn in (
                    ("memory_used_mib", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
                    ("utilization_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                    ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                    ("mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                    ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                    ("throttle_reasons", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
                ):
                    try:
                        row[col] = fn()
                    except Exception:
                        row[col] = None
                self.rows.append(row)
                self._stop.wait(self.interval_s)
        finally:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass

    def __enter__(self) -> "GpuSampler":
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"gpu-sampler-{self.gpu_index}")
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


def host_load_avg() -> float | None:
    """1-minute load average of the host (noise context recorded with every trial)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
