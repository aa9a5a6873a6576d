"""GPU hygiene through NVML (nvidia-ml-py): inventory, baseline memory, compute processes, sampling.

Why: a measurement is only comparable when every boot starts from the same free GPU memory with no other
program on the GPU, and when the GPU was not throttled meanwhile. This module reads those facts; it never
kills anything (stopping tunelab's own leftovers is ``tasks.engine.stop_leftovers``, which confirms each
process is ours first).

- :func:`inventory`: name, UUID, memory, compute processes of every GPU, driver and CUDA driver version.
  No NVML (no driver, a CPU host, ``pynvml`` missing) gives ``Inventory(available=False, reason=...)``,
  never an exception.
- :func:`check_clean`: before a boot: no foreign compute process and memory back at baseline. A PID that
  NVML reports counts as tunelab's only when it is confirmed (inside a container NVML may report PIDs of
  another PID namespace); everything else is foreign: reported, never killed.
- :func:`memory_used_mib`, :func:`wait_memory_back`: memory polling for teardown.
- :class:`GpuSampler`: background sampling of memory, utilization, SM/memory clocks, power, temperature and
  clock-event (throttle) reasons at a fixed interval, rows shaped like the warehouse's ``gpu_samples`` table.

Tests inject a fake NVML module through the ``nvml`` argument (the real one is ``pynvml`` from nvidia-ml-py).
NVML calls used (nvidia-ml-py 13.x names): ``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetComputeRunningProcesses``,
``nvmlDeviceGetUtilizationRates``, ``nvmlDeviceGetClockInfo``, ``nvmlDeviceGetPowerUsage`` (mW),
``nvmlDeviceGetTemperature``, ``nvmlDeviceGetCurrentClocksEventReasons`` (older:
``nvmlDeviceGetCurrentClocksThrottleReasons``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tunelab.tasks.processes import is_tunelab_process

__all__ = [
    "GpuProcess",
    "GpuInfo",
    "Inventory",
    "inventory",
    "GpuCheck",
    "check_clean",
    "memory_used_mib",
    "wait_memory_back",
    "GpuSampler",
    "THROTTLE_BITS",
    "THROTTLE_REASON_NAMES",
    "throttle_reason_names",
    "host_load_avg",
]

_MIB = 2**20
_NAN = float("nan")


def _nvml(nvml: Any | None):
    if nvml is not None:
        return nvml
    import pynvml

    return pynvml


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class GpuProcess:
    """A compute process NVML reports on a GPU. ``used_memory_mib`` is None when NVML does not say
    (e.g. no permission, some MIG modes)."""

    pid: int
    used_memory_mib: float | None


@dataclass
class GpuInfo:
    """One GPU as NVML reports it. Memory in MiB (2**20 bytes); ``memory_used_mib`` at inventory time is the
    baseline for later checks when no server of ours runs."""

    index: int
    name: str
    uuid: str
    memory_total_mib: float
    memory_used_mib: float
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class Inventory:
    """All GPUs of the host, or ``available=False`` with the reason (e.g. 'no GPU: NVML Shared Library Not
    Found'). ``cuda_version`` is the CUDA version the driver supports ("12.4"), from
    ``nvmlSystemGetCudaDriverVersion``."""

    available: bool
    reason: str = ""
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)


def _processes(nv: Any, h: Any) -> list[GpuProcess]:
    out = []
    for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
        mem = getattr(p, "usedGpuMemory", None)
        # NVML reports NVML_VALUE_NOT_AVAILABLE (2**64-1) when it cannot tell.
        out.append(GpuProcess(int(p.pid), mem / _MIB if isinstance(mem, int) and mem < 2**63 else None))
    return out


def inventory(nvml: Any | None = None) -> Inventory:
    """Read name, UUID, memory and compute processes of every GPU, plus driver and CUDA driver versions.

    Returns ``Inventory(available=False, reason=...)`` when NVML cannot be imported or initialised (no driver,
    no GPU); never raises for that."""
    try:
        nv = _nvml(nvml)
        nv.nvmlInit()
    except Exception as e:  # pynvml.NVMLError_LibraryNotFound / DriverNotLoaded; ImportError too
        return Inventory(False, reason=f"no GPU: {e or type(e).__name__}")
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
            try:
                procs = _processes(nv, h)
            except Exception:
                procs = []
            inv.gpus.append(GpuInfo(i, _s(nv.nvmlDeviceGetName(h)), _s(nv.nvmlDeviceGetUUID(h)),
                                    mem.total / _MIB, mem.used / _MIB, procs))
        return inv
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


@dataclass
class GpuCheck:
    """Result of the pre-boot check of one GPU.

    ``clean`` is True when NVML answered, no compute process runs on the GPU and used memory is within
    ``tolerance_mib`` of the baseline. ``foreign_pids`` are processes not confirmed tunelab's: the trial is then
    ``gpu_busy``; they are never killed. ``our_pids`` are confirmed tunelab processes still on the GPU (to be
    stopped by ``stop_leftovers``). ``available`` is False when NVML could not be read (``detail`` says why;
    ``memory_used_mib`` is then NaN)."""

    gpu_index: int
    clean: bool
    memory_used_mib: float
    baseline_mib: float
    foreign_pids: list[int]
    our_pids: list[int]
    detail: str = ""
    available: bool = True


def check_clean(gpu_index: int, baseline_mib: float, our_pids: Iterable[int] = (), tolerance_mib: float = 1024,
                nvml: Any | None = None, is_ours: Callable[[int], bool] | None = None) -> GpuCheck:
    """Check that GPU ``gpu_index`` holds no foreign process and is back at baseline memory.

    Args:
        gpu_index: NVML index.
        baseline_mib: memory used with nothing of ours running (from :func:`inventory`), MiB.
        our_pids: PIDs tunelab started (the state file's server PIDs). Each still needs confirmation, and
            their children (EngineCore, workers: the processes NVML lists) are found by ``is_ours`` alone.
        tolerance_mib: accepted excess over the baseline, MiB.
        nvml: NVML module (default ``pynvml``).
        is_ours: confirms that a PID of this PID namespace is tunelab's (default
            ``tasks.processes.is_tunelab_process``: its environment carries a tracked server id). A PID counts as
            ours only when confirmed: NVML in a container may report PIDs of another namespace that collide
            with ours, so a number match alone never makes a process ours.

    Returns a :class:`GpuCheck`; when NVML cannot be read, ``available=False, clean=False`` (never raises for it).
    """
    if is_ours is None:
        is_ours = is_tunelab_process
    try:
        nv = _nvml(nvml)
        nv.nvmlInit()
    except Exception as e:
        return GpuCheck(gpu_index, False, _NAN, baseline_mib, [], [], f"NVML unavailable: {e or type(e).__name__}", False)
    try:
        h = nv.nvmlDeviceGetHandleByIndex(gpu_index)
        used = nv.nvmlDeviceGetMemoryInfo(h).used / _MIB
        pids = [p.pid for p in _processes(nv, h)]
    except Exception as e:
        return GpuCheck(gpu_index, False, _NAN, baseline_mib, [], [], f"NVML error on GPU {gpu_index}: {e}", False)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    ours = [p for p in pids if is_ours(p)]  # our_pids alone proves nothing (see Args)
    foreign = [p for p in pids if p not in ours]
    excess = used - baseline_mib
    clean = not foreign and not ours and excess <= tolerance_mib
    detail = []
    if foreign:
        detail.append(f"foreign compute processes {foreign} (not confirmed tunelab's: left alone)")
    if ours:
        detail.append(f"tunelab processes still on the GPU {ours}")
    if excess > tolerance_mib:
        detail.append(f"{used:.0f} MiB used, {excess:.0f} MiB above baseline {baseline_mib:.0f} MiB "
                      f"(tolerance {tolerance_mib:.0f})")
    return GpuCheck(gpu_index, clean, used, baseline_mib, foreign, ours, "; ".join(detail))


def memory_used_mib(gpu_index: int, nvml: Any | None = None) -> float | None:
    """Memory used on GPU ``gpu_index`` in MiB (``nvmlDeviceGetMemoryInfo().used``); None without NVML."""
    try:
        nv = _nvml(nvml)
        nv.nvmlInit()
    except Exception:
        return None
    try:
        return nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(gpu_index)).used / _MIB
    except Exception:
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def wait_memory_back(gpu_index: int, baseline_mib: float, tolerance_mib: float = 1024, timeout_s: float = 60,
                     poll_s: float = 0.1, nvml: Any | None = None) -> float | None:
    """Poll until GPU memory used <= ``baseline_mib + tolerance_mib``. Returns the seconds it took, or None
    when it did not come back within ``timeout_s`` or NVML cannot be read."""
    t0 = time.monotonic()
    while True:
        used = memory_used_mib(gpu_index, nvml)
        if used is not None and used <= baseline_mib + tolerance_mib:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            return None
        time.sleep(poll_s)


# NVML clock-event (throttle) reasons, nvmlClocksEventReason* in nvml.h / pynvml.
THROTTLE_REASON_NAMES: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that mean the measurement was slowed by power or heat (idle and clock settings are not).
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def throttle_reason_names(mask: int | None) -> list[str]:
    """Names of the bits set in an NVML clock-event reasons mask (``THROTTLE_REASON_NAMES``); unknown bits
    as hex. ``None`` -> []."""
    if not mask:
        return []
    out = [n for b, n in THROTTLE_REASON_NAMES.items() if mask & b]
    rest = mask & ~sum(THROTTLE_REASON_NAMES)
    if rest:
        out.append(hex(rest))
    return out


class GpuSampler:
    """Background thread sampling one GPU every ``interval_s`` seconds (fixed schedule: sample k is due at
    start + k x interval, so slow NVML calls do not stretch the interval; a missed slot is skipped).

    Each row has the ``gpu_samples`` columns except ``trial_id``: ``ts`` (epoch s), ``gpu_index``,
    ``memory_used_mib``, ``utilization_pct`` (%), ``sm_clock_mhz``, ``mem_clock_mhz``, ``power_w`` (W),
    ``temperature_c`` (deg C), ``throttle_reasons`` (NVML bitmask). A value NVML does not support is None.
    Without NVML the sampler records nothing and sets ``error``. Use as a context manager.
    """

    def __init__(self, gpu_index: int, interval_s: float = 0.5, nvml: Any | None = None):
        if interval_s <= 0:
            raise ValueError(f"GpuSampler(interval_s={interval_s}): the sampling interval must be > 0 seconds")
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.rows: list[dict] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._nvml = nvml
        self._thread: threading.Thread | None = None

    def _sample(self, nv: Any, h: Any) -> dict:
        def reasons() -> int:
            fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            return int(fn(h))

        row: dict[str, Any] = {"ts": time.time(), "gpu_index": self.gpu_index}
        for col, fn in (
            ("memory_used_mib", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / _MIB),
            ("utilization_pct", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
            ("sm_clock_mhz", lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            ("mem_clock_mhz", lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
            ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("temperature_c", lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            ("throttle_reasons", reasons),
        ):
            try:
                row[col] = fn()
            except Exception:
                row[col] = None
        return row

    def _run(self) -> None:
        try:
            nv = _nvml(self._nvml)
            nv.nvmlInit()
        except Exception as e:
            self.error = f"NVML unavailable: {e or type(e).__name__}"
            return
        try:
            h = nv.nvmlDeviceGetHandleByIndex(self.gpu_index)
            t0 = time.monotonic()
            k = 0
            while not self._stop.is_set():
                self.rows.append(self._sample(nv, h))
                k = max(k + 1, int((time.monotonic() - t0) / self.interval_s) + 1)
                self._stop.wait(max(0.0, t0 + k * self.interval_s - time.monotonic()))
        except Exception as e:
            self.error = f"NVML error on GPU {self.gpu_index}: {e}"
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
