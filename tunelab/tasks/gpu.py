"""GPU hygiene through NVML (nvidia-ml-py): inventory, baseline memory, compute processes, sampling.

Why: a measurement is only comparable when every boot starts from the same free GPU memory with no other
program on the GPU, and when the GPU was not throttled meanwhile. This module reads those facts; it never
kills anything (stopping tunelab's own leftovers is ``tasks.engine.stop_leftovers``, which confirms each
process is ours first).

- :func:`inventory`: name, UUID, PCI bus id, memory, compute processes of every GPU, driver and CUDA driver
  version. No NVML (no driver, a CPU host, ``pynvml`` missing) gives ``Inventory(available=False, reason=...)``,
  never an exception. An NVML error on one device (MIG enabled, a container answering NoPermission or
  NotSupported to memory queries) is that device's ``status`` with its reason, never an exception either.
- Device identity (:func:`cuda_visible_devices`, :func:`inherited_restriction`, :func:`server_placement`): CUDA
  numbers devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML in its own enumeration order;
  a server is therefore given ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and the devices' ordinals in PCI bus order
  (computed here from ``nvmlDeviceGetPciInfo``), a restriction the sweep inherited in ``CUDA_VISIBLE_DEVICES``
  is honoured, and after boot NVML must show the server's processes on the GPUs it was given.
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
from typing import Any, Callable, Iterable, Sequence

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
    "DEVICE_STATUSES",
    "MigInstance",
    "nvml_error_status",
    "cuda_visible_devices",
    "inherited_restriction",
    "server_placement",
    "placement_problem",
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


#: Status of one GPU in the inventory. ``ok``: schedulable. ``mig``: MIG mode is on (its instances are listed in
#: ``GpuInfo.mig_instances`` but not scheduled: vLLM maps CUDA device ids to NVML devices by integer index,
#: which a ``MIG-<uuid>`` is not). ``no_permission`` / ``unsupported``: NVML answered NoPermission /
#: NotSupported to a query the clean check needs (memory, processes), typical of containers and vGPUs.
#: ``error``: any other NVML error on that device.
DEVICE_STATUSES: tuple[str, ...] = ("ok", "mig", "no_permission", "unsupported", "error")


@dataclass
class MigInstance:
    """One MIG instance of a MIG-enabled GPU: its own UUID (``MIG-...``) and memory from the instance handle, MiB
    (None when NVML does not say)."""

    uuid: str
    memory_total_mib: float | None
    memory_used_mib: float | None


@dataclass
class GpuInfo:
    """One GPU as NVML reports it. Memory in MiB (2**20 bytes); ``memory_used_mib`` at inventory time is the
    baseline for later checks when no server of ours runs (NaN when NVML could not read it).

    ``pci_bus_id`` is NVML's bus id ('00000000:18:00.0'); ``cuda_index`` the device's ordinal in PCI bus order,
    which is its CUDA index under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (None when the bus id is unknown: then the
    NVML index is used). ``status`` is one of :data:`DEVICE_STATUSES` and ``reason`` says why when it is not
    ``ok``; only ``ok`` devices are scheduled."""

    index: int
    name: str
    uuid: str
    memory_total_mib: float
    memory_used_mib: float
    processes: list[GpuProcess] = field(default_factory=list)
    pci_bus_id: str | None = None
    cuda_index: int | None = None
    status: str = "ok"
    reason: str = ""
    mig_instances: list[MigInstance] = field(default_factory=list)


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


def nvml_error_status(e: BaseException) -> str:
    """Map an NVML exception to a device status: ``no_permission`` (``NVMLError_NoPermission``, "Insufficient
    Permissions"), ``unsupported`` (``NVMLError_NotSupported``, "Not Supported"), else ``error``. By class name
    and message, so that pynvml's generated subclasses and plain ``NVMLError(value)`` both map."""
    text = f"{type(e).__name__} {e}".lower().replace("_", " ")
    if "nopermission" in text.replace(" ", "") or "insufficient permission" in text:
        return "no_permission"
    if "notsupported" in text.replace(" ", "") or "not supported" in text:
        return "unsupported"
    return "error"


def _mig_instances(nv: Any, h: Any) -> list[MigInstance] | None:
    """The MIG instances of GPU handle ``h`` when MIG mode is on, else None (also when NVML has no MIG calls)."""
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(h)
    except Exception:  # NotSupported on GPUs without MIG; old pynvml without the call
        return None
    if not current:
        return None
    out = []
    try:
        n = nv.nvmlDeviceGetMaxMigDeviceCount(h)
    except Exception:
        n = 0
    for j in range(n):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except Exception:  # NotFound: no instance in this slot
            continue
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(mh)
            total, used = mem.total / _MIB, mem.used / _MIB
        except Exception:
            total = used = None
        out.append(MigInstance(_s(nv.nvmlDeviceGetUUID(mh)), total, used))
    return out


def _pci_bus_id(nv: Any, h: Any) -> str | None:
    try:
        info = nv.nvmlDeviceGetPciInfo(h)
    except Exception:
        return None
    bus = getattr(info, "busId", None) or getattr(info, "busIdLegacy", None)
    return _s(bus).lower() if bus else None


def _device(nv: Any, i: int) -> GpuInfo:
    """GPU ``i``; an NVML error in any query the clean check needs becomes the device's status."""
    nan = _NAN
    try:
        h = nv.nvmlDeviceGetHandleByIndex(i)
    except Exception as e:
        return GpuInfo(i, "?", "?", nan, nan, status=nvml_error_status(e), reason=f"NVML handle: {e or type(e).__name__}")
    name = uuid = "?"
    with_err: list[tuple[str, BaseException]] = []
    try:
        name = _s(nv.nvmlDeviceGetName(h))
    except Exception as e:
        with_err.append(("name", e))
    try:
        uuid = _s(nv.nvmlDeviceGetUUID(h))
    except Exception as e:
        with_err.append(("UUID", e))
    info = GpuInfo(i, name, uuid, nan, nan, pci_bus_id=_pci_bus_id(nv, h))
    mig = _mig_instances(nv, h)
    if mig is not None:
        info.mig_instances = mig
        info.status = "mig"
        info.reason = (f"MIG enabled ({len(mig)} instance(s): "
                       + ", ".join(f"{m.uuid} {m.memory_total_mib or 0:.0f} MiB" for m in mig)
                       + "); not scheduled: vLLM addresses CUDA devices by integer index, not MIG UUID")
        return info
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        info.memory_total_mib, info.memory_used_mib = mem.total / _MIB, mem.used / _MIB
    except Exception as e:
        with_err.append(("memory", e))
    try:
        info.processes = _processes(nv, h)
    except Exception as e:
        with_err.append(("compute processes", e))
    if with_err:
        what, e = with_err[0]
        info.status = nvml_error_status(e)
        info.reason = (f"NVML {what} query: {e or type(e).__name__}; the clean check needs "
                       + ", ".join(w for w, _ in with_err))
    return info


def inventory(nvml: Any | None = None) -> Inventory:
    """Read name, UUID, PCI bus id, memory and compute processes of every GPU, plus driver and CUDA driver
    versions, and number the GPUs in PCI bus order (``GpuInfo.cuda_index``).

    Returns ``Inventory(available=False, reason=...)`` when NVML cannot be imported or initialised (no driver,
    no GPU); never raises for that. An error on one device is that device's ``status``/``reason``
    (:data:`DEVICE_STATUSES`): the other devices stay usable."""
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
            inv.gpus.append(_device(nv, i))
        # CUDA's PCI_BUS_ID order counts every GPU the driver exposes, so the ordinal is over all devices,
        # whatever their status; unknown bus ids leave the NVML index in charge.
        if inv.gpus and all(g.pci_bus_id for g in inv.gpus):
            for k, g in enumerate(sorted(inv.gpus, key=lambda g: g.pci_bus_id or "")):
                g.cuda_index = k
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


# -- device identity ------------------------------------------------------------------------------------------
def cuda_visible_devices(gpus: Iterable[Any]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a server on ``gpus`` (objects with ``index`` and ``cuda_index``: ``GpuInfo``
    or ``flows.devices.Device``): their PCI-bus-order ordinals, comma-separated, valid only together with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the server gets both). Falls back to the NVML index where the ordinal is
    unknown. Integers rather than ``GPU-<uuid>``: vLLM turns the entries of ``CUDA_VISIBLE_DEVICES`` into NVML
    device indices with ``int()`` (``device_id_to_physical_device_id``), which a UUID fails."""
    return ",".join(str(g.cuda_index if getattr(g, "cuda_index", None) is not None else g.index) for g in gpus)


def inherited_restriction(visible: str | None, device_order: str | None, inv: Inventory) -> list[int] | None:
    """The NVML indices of the GPUs a ``CUDA_VISIBLE_DEVICES`` the sweep inherited allows, in its order.

    Args:
        visible: the inherited ``CUDA_VISIBLE_DEVICES`` (None: unset, no restriction).
        device_order: the inherited ``CUDA_DEVICE_ORDER`` ('PCI_BUS_ID', 'FASTEST_FIRST' or None = CUDA's
            default, fastest first).
        inv: this host's inventory.

    Entries are read as CUDA reads them (CUDA C Programming Guide, "CUDA Environment Variables"): integers
    (CUDA ordinals), ``GPU-<uuid>`` (a unique prefix is enough) or ``MIG-<uuid>``; reading stops at the first
    entry that names no device (so ``-1`` or an empty value hides every GPU). An integer is mapped through PCI
    bus order when ``device_order`` is ``PCI_BUS_ID``, or when all GPUs are one model (fastest-first then has no
    fastest, and CUDA keeps PCI order).

    Returns:
        None when ``visible`` is None; else the list (possibly empty).

    Raises:
        ValueError: integers on a host with several GPU models and no ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA's
            fastest-first order cannot be read from NVML), or a ``MIG-`` entry (MIG instances are not scheduled);
            the message names the variable and the fix.
    """
    if visible is None:
        return None
    by_uuid = {g.uuid.lower(): g for g in inv.gpus}
    by_pci = {(g.cuda_index if g.cuda_index is not None else g.index): g for g in inv.gpus}
    pci_order = (device_order or "").strip().upper() == "PCI_BUS_ID"
    models = sorted({g.name for g in inv.gpus})
    out: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise ValueError(f"CUDA_VISIBLE_DEVICES={visible}: {entry} is a MIG instance; tunelab does not schedule "
                             f"MIG instances (vLLM maps devices by integer index). Unset it or name whole GPUs")
        if entry.upper().startswith("GPU-"):
            hits = [g for u, g in by_uuid.items() if u.startswith(entry.lower())]
            if len(hits) != 1:
                break  # CUDA stops at an entry that names no (or no unique) device
            g = hits[0]
        else:
            try:
                k = int(entry)
            except ValueError:
                break
            if k < 0 or k not in by_pci:
                break
            if not pci_order and len(models) > 1:
                raise ValueError(
                    f"CUDA_VISIBLE_DEVICES={visible} names GPUs by CUDA index, and with CUDA_DEVICE_ORDER unset "
                    f"CUDA numbers this host's mixed GPUs ({', '.join(models)}) fastest-first, an order NVML cannot "
                    f"tell; set CUDA_DEVICE_ORDER=PCI_BUS_ID or name the GPUs by UUID (nvidia-smi -L)")
            g = by_pci[k]
        if g.index not in out:
            out.append(g.index)
    return out


def server_placement(pids: Iterable[int], nvml: Any | None = None) -> dict[int, list[int]] | None:
    """Where NVML sees the processes ``pids`` (a server's process group): ``{NVML index: [pids on it]}`` over
    every GPU that lists at least one of them. None when NVML cannot be read. A GPU whose process list NVML
    will not give (NoPermission, NotSupported) is left out: it can neither confirm nor refute."""
    want = set(pids)
    try:
        nv = _nvml(nvml)
        nv.nvmlInit()
    except Exception:
        return None
    try:
        out: dict[int, list[int]] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                on = [p.pid for p in _processes(nv, nv.nvmlDeviceGetHandleByIndex(i)) if p.pid in want]
            except Exception:
                continue
            if on:
                out[i] = sorted(on)
        return out
    except Exception:
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def placement_problem(intended: Sequence[int], placement: dict[int, list[int]] | None) -> str | None:
    """Why a server does not sit on the GPUs it was given, or None.

    Args:
        intended: NVML indices of the trial's GPUs.
        placement: :func:`server_placement` of the server's process group after boot.

    Returns None when every GPU with a process of the server is intended and every intended GPU has one, and
    also when NVML shows no process of the server at all (NVML in a container may list PIDs of another PID
    namespace, and then cannot confirm anything: never a failure). Otherwise one sentence naming the GPUs
    (the trial then fails as ``wrong_device``)."""
    if not placement:
        return None
    elsewhere = {i: p for i, p in placement.items() if i not in intended}
    missing = [i for i in intended if i not in placement]
    if not elsewhere and not missing:
        return None
    parts = []
    if elsewhere:
        parts.append("server processes on " + ", ".join(f"gpu{i} (PIDs {p})" for i, p in sorted(elsewhere.items())))
    if missing:
        parts.append("none on " + ", ".join(f"gpu{i}" for i in missing))
    return (f"{'; '.join(parts)}; the trial was given {', '.join(f'gpu{i}' for i in intended)} (NVML indices): "
            "CUDA numbered the GPUs differently from NVML")


def host_load_avg() -> float | None:
    """1-minute load average of the host (noise context recorded with every trial)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
