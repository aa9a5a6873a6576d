"""Task ``clean-gpu``: the device check before a boot (``tasks.gpu.check_clean``, NVML)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tunelab.tasks.gpu import check_clean

__all__ = ["clean_gpu_task"]


@task(name="clean-gpu", cache_policy=NO_CACHE)
def clean_gpu_task(gpu_index: int | None, baseline_mib: float | None, our_pids: list[int]) -> dict[str, Any]:
    """Pre-boot GPU check (NVML). On a CPU host: nothing to check, recorded as such.

    Returns:
        ``gpu_clean_at_boot`` (True / False; None on CPU or when NVML could not tell), ``detail`` (one line) and,
        when checked, ``foreign_gpu_processes`` (count) and ``gpu_baseline_excess_mib`` (MiB over the baseline).
    """
    if gpu_index is None:
        return {"gpu_clean_at_boot": None, "detail": "no GPU"}
    chk = check_clean(gpu_index, baseline_mib or 0.0, set(our_pids))
    if not getattr(chk, "available", True):  # NVML unreadable: unknown, never "clean"
        return {"gpu_clean_at_boot": None, "detail": f"GPU {gpu_index} could not be checked: {chk.detail}"}
    return {
        "gpu_clean_at_boot": chk.clean,
        "foreign_gpu_processes": len(chk.foreign_pids),
        "gpu_baseline_excess_mib": chk.memory_used_mib - chk.baseline_mib,
        "detail": chk.detail,
    }
