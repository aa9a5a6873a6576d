"""FAKE NVML: the part of the ``pynvml`` (nvidia-ml-py) surface tunelab uses, with scripted values.

Use ``FakeNvml(gpus=[FakeGpu(...)])`` where ``tasks.gpu`` takes ``nvml=``. ``FakeNvml(init_error="Driver Not
Loaded")`` behaves like a host without a working driver (``nvmlInit`` raises). ``FakeGpu.memory_used_mib`` may be a
list: each read takes the next value and the last one repeats (memory draining after a teardown).

Device identity and per-device errors: ``FakeGpu.pci_bus_id`` (NVML enumerates in list order, which a test may
make differ from PCI order), ``errors={"nvmlDeviceGetMemoryInfo": "Insufficient Permissions"}`` (that call raises
``NVMLError`` with the message, as pynvml's ``NVMLError_NoPermission`` prints), ``mig=[FakeGpu(...), ...]``
(MIG mode on, the list being its instances; an instance's handle is ``(gpu, slot)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeGpu", "FakeNvml", "NVMLError"]

MIB = 2**20


class NVMLError(Exception):
    """Stands in for ``pynvml.NVMLError``."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total_mib: float = 143771.0
    memory_used_mib: float | list[float] = 0.0
    processes: list[tuple[int, float | None]] = field(default_factory=list)  # (pid, MiB or None)
    utilization_pct: int = 50
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 3201
    power_mw: int = 350_000
    temperature_c: int = 45
    throttle_reasons: int = 0
    unsupported: set[str] = field(default_factory=set)  # names of nvml functions that raise NotSupported
    pci_bus_id: str | None = None
    errors: dict[str, str] = field(default_factory=dict)  # nvml function name -> NVMLError message it raises
    mig: list["FakeGpu"] | None = None  # MIG mode on: its instances
    _reads: int = 0

    def used_bytes(self) -> int:
        v = self.memory_used_mib
        if isinstance(v, list):
            v = v[min(self._reads, len(v) - 1)]
            self._reads += 1
        return int(v * MIB)


class FakeNvml:
    """Module-like FAKE of pynvml. Counts ``nvmlInit``/``nvmlShutdown`` calls (``inits``, ``shutdowns``)."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: str | None = None,
                 driver: str = "580.159.04", cuda: int = 13000):
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.inits = 0
        self.shutdowns = 0

    def _gpu(self, h: Any, fn: str) -> FakeGpu:
        g = self.gpus[h[0]].mig[h[1]] if isinstance(h, tuple) else self.gpus[h]  # type: ignore[index]
        if fn in g.unsupported:
            raise NVMLError("Not Supported")
        if fn in g.errors:
            raise NVMLError(g.errors[fn])
        return g

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetPciInfo")
        if g.pci_bus_id is None:
            raise NVMLError("Not Supported")
        return SimpleNamespace(busId=g.pci_bus_id.upper())

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        if g.mig is None:
            raise NVMLError("Not Supported")  # what a GPU without MIG answers
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:
        g = self._gpu(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if g.mig is None or j >= len(g.mig):
            raise NVMLError("Not Found")
        return (h, j)

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._gpu(h, "nvmlDeviceGetName").name.encode()  # old pynvml returned bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        used = g.used_bytes()
        total = int(g.memory_total_mib * MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=(2**64 - 1) if mib is None else int(mib * MIB))
                for pid, mib in g.processes]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.utilization_pct, memory=10)

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock_mhz if kind == self.NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").throttle_reasons
