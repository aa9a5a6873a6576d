"""The readings behind the bottleneck diagnosis (``tunelab.core.bottleneck_rules``), and the ``window_diagnoses`` rows of a
measurement.

* :class:`GaugePeaks`: vLLM's gauges (``vllm:kv_cache_usage_perc``, ``vllm:num_requests_waiting``) sampled from
  ``/metrics`` during a window. The scrapes before and after a window give counters and histograms, but a gauge
  read after the window reads an idle server (usage and queue back near 0); the peak during it is the evidence.
  Rows ``kv_cache_usage_peak`` and ``num_requests_waiting_peak`` (kind ``gauge_peak``, ``count`` = samples) go to
  ``server_metrics``.
* :func:`weight_bytes`: the model's weight bytes, from the sizes of its weight files.
* :func:`bandwidth`: the GPU's peak memory bandwidth, from NVML's memory clock and bus width, else the table.
* :func:`window_diagnoses`: every check of every window of a measurement, as ``window_diagnoses`` rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from tunelab.core import bottleneck_rules as D
from tunelab.core import records as R
from tunelab.tasks import server_metrics as SM
from tunelab.tasks.loadgen.control import control_call

__all__ = ["GAUGE_INTERVAL_S", "GaugePeaks", "bandwidth", "weight_bytes", "window_diagnoses"]

#: How often the gauges are read during a window, seconds: one small GET per second costs the API server and the
#: client little next to hundreds of streamed chunks per second; the first read is one interval after the start.
GAUGE_INTERVAL_S = 1.0
_PEAKED = {"kv_cache_usage": "kv_cache_usage_peak", "num_requests_waiting": "num_requests_waiting_peak"}


class GaugePeaks:
    """Reads ``/metrics`` every ``interval_s`` between :meth:`start` and :meth:`stop` (in the caller's event loop)
    and keeps the highest value of each gauge of :data:`_PEAKED`. A read is a control call
    (``loadgen.control.control_call``: a dropped connection retried on a fresh one, recorded against the client);
    a page that still cannot be read is skipped."""

    def __init__(self, client: Any, interval_s: float = GAUGE_INTERVAL_S) -> None:
        self.client, self.interval_s = client, interval_s
        self.peaks: dict[str, tuple[float, str | None]] = {}
        self.samples = 0
        self._task: asyncio.Task | None = None

    async def _read(self) -> None:
        try:
            # A dropped keep-alive connection is retried on a fresh one, as the other control calls are.
            r = await control_call(self.client, "GET", "/metrics", timeout=5)
        except Exception:  # noqa: BLE001 - a failed sample is skipped, the window goes on
            return
        if r.status_code != 200:
            return
        snap = SM.snapshot(r.text)
        self.samples += 1
        for row in SM.window_rows(snap, snap, {}):
            if row["metric"] in _PEAKED and row.get("value") is not None:
                old = self.peaks.get(row["metric"])
                if old is None or row["value"] > old[0]:
                    self.peaks[row["metric"]] = (float(row["value"]), row.get("source_name"))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._read()

    def start(self) -> None:
        """Start sampling (needs a running event loop)."""
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def rows(self, ident: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``server_metrics`` rows of the peaks (none when no page was read during the window)."""
        if not self.samples:
            return []
        out = []
        for metric, name in _PEAKED.items():
            value, source = self.peaks.get(metric, (None, None))
            out.append({**ident, "metric": name, "kind": "gauge_peak", "value": value, "count": float(self.samples),
                        "sum": None, "source_name": source,
                        "null_reason": None if value is not None else SM.ABSENT})
        return out


def weight_bytes(model: str | os.PathLike | None) -> float | None:
    """Bytes of the model's weights: the sizes of its ``*.safetensors`` files (else ``*.bin``, ``*.pt``) in the
    model directory (``plan.model``). None when it is not a readable directory or has no weight file."""
    if model is None:
        return None
    d = Path(model)
    if not d.is_dir():
        return None
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = list(d.glob(pattern))
        if files:
            try:
                return float(sum(f.stat().st_size for f in files))
            except OSError:
                return None
    return None


def bandwidth(gpu_name: str | None, gpu_index: int | None, gpu_samples: pd.DataFrame | None,
              nvml: Any | None = None) -> tuple[float | None, str]:
    """Peak memory bandwidth of the trial's GPU, bytes/s, and its source (``diagnosis.hbm_bandwidth_bytes_per_s``):
    the highest memory clock of ``gpu_samples`` (MHz) and NVML's ``nvmlDeviceGetMemoryBusWidth`` (bits) when both
    are readable, else the table by ``gpu_name``. (None, 'unknown') on a CPU runtime."""
    if gpu_index is None or not gpu_name or gpu_name == "cpu":
        return None, "unknown"
    clk = None
    if gpu_samples is not None and len(gpu_samples) and "mem_clock_mhz" in gpu_samples:
        m = pd.to_numeric(gpu_samples["mem_clock_mhz"], errors="coerce").max()
        clk = None if pd.isna(m) else float(m)
    bus = None
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
        try:
            bus = int(nvml.nvmlDeviceGetMemoryBusWidth(nvml.nvmlDeviceGetHandleByIndex(gpu_index)))
        finally:
            nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, or a driver without the call: the table instead
        bus = None
    return D.hbm_bandwidth_bytes_per_s(gpu_name, clk, bus)


def _key(df: pd.DataFrame, key: Mapping[str, Any]) -> pd.DataFrame:
    if df is None or len(df) == 0 or "workload" not in df:
        return pd.DataFrame()
    m = pd.Series(True, index=df.index)
    for k in ("workload", "load_kind", "load_value", "repeat"):
        m &= df[k] == key[k]
    return df[m]


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return df.to_dict("records") if len(df) else []


def window_diagnoses(measurements: pd.DataFrame, requests: pd.DataFrame, server_metrics: pd.DataFrame,
                     gpu_samples: pd.DataFrame | None = None, *, model: str | None = None,
                     gpu_name: str | None = None, gpu_index: int | None = None, gpus: int = 1,
                     nvml: Any | None = None) -> pd.DataFrame:
    """The ``window_diagnoses`` rows of a measurement (record ``WindowDiagnosis``, without ``trial_id``): one per
    window and bottleneck of ``diagnosis.BOTTLENECKS``.

    Args:
        measurements, requests, server_metrics: ``tasks.measure.MeasureResult``'s frames; the measurements'
            ``server_process_cpu`` (JSON or dict) carries the server's CPU by role.
        gpu_samples: the trial's NVML samples (``gpu_samples``), for the GPU's busy share in each window (its first
            send to its last end) and the memory clock.
        model: the model directory (weight bytes); gpu_name, gpu_index: the trial's GPU; gpus: tensor-parallel
            size (the weights are split over that many GPUs).

    Returns:
        A DataFrame with the record's columns (empty, with its columns, when there is no window).
    """
    cols = [c for c in R.columns(R.WindowDiagnosis) if c != "trial_id"]
    if measurements is None or len(measurements) == 0:
        return pd.DataFrame(columns=cols)
    bw, bw_source = bandwidth(gpu_name, gpu_index, gpu_samples, nvml)
    wbytes = weight_bytes(model) if bw else None
    floor = D.decode_floor_s(wbytes, bw, gpus)
    out = []
    for m in measurements.to_dict("records"):
        key = {k: m[k] for k in ("workload", "load_kind", "load_value", "repeat")}
        reqs = _records(_key(requests, key))
        util = None
        if gpu_samples is not None and len(gpu_samples) and reqs:
            sends = [r["send_ts"] for r in reqs if r.get("send_ts") is not None]
            ends = [r["end_ts"] for r in reqs if r.get("end_ts") is not None]
            if sends and ends:
                g = gpu_samples[(gpu_samples["ts"] >= min(sends)) & (gpu_samples["ts"] <= max(ends))]
                u = pd.to_numeric(g.get("utilization_pct"), errors="coerce").mean() if len(g) else None
                util = None if u is None or pd.isna(u) else float(u)
        pcpu = m.get("server_process_cpu")
        if isinstance(pcpu, str):
            pcpu = json.loads(pcpu)
        elif not isinstance(pcpu, dict):
            pcpu = None  # not sampled (NaN in a frame)
        for f in D.diagnose_window(m, _records(_key(server_metrics, key)), reqs, process_cpu=pcpu,
                                   gpu_util_pct=util, floor_s=floor, bandwidth_source=bw_source,
                                   weight_bytes=wbytes):
            row = f.row()
            out.append({**key, **row, "evidence": json.dumps(row["evidence"], sort_keys=True, default=str)})
    return R.frame(R.WindowDiagnosis, pd.DataFrame(out, columns=cols), without=("trial_id",))
