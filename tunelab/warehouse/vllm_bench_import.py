"""Import ``vllm bench serve --save-result`` JSON files into the warehouse.

So that results people already have (or produce with vLLM's own client) can be compared with
tunelab's in SQL. Key names are those written by vLLM's ``vllm/benchmarks/serve.py``
(``main_async`` / ``benchmark``): ``date`` (``%Y%m%d-%H%M%S``, the client's local time when
the run ended), ``backend``, ``label``, ``model_id``, ``num_prompts``, ``request_rate``
(number or ``"inf"``), ``burstiness``, ``max_concurrency``, any ``--metadata KEY=VALUE`` pairs,
``duration`` (s), ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``request_goodput``, ``output_throughput``, ``total_token_throughput``,
``{mean,median,std}_{ttft,tpot,itl,e2el}_ms`` and ``p{N}_{metric}_ms``; with ``--save-detailed``
also per-request ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (list of s per
request), ``latencies`` (s), ``start_times`` (``time.perf_counter`` values, not epoch),
``errors``. ``--append-result`` files (one JSON object per line) are accepted.

Mapping: one file = one sweep (``source='vllm-bench-import'``) with one trial (status ``ok``,
quality ``unvalidated``: nothing validated the run); each JSON object = one measurements row
(``repeat`` numbers repeated load levels); per-request arrays become ``requests`` rows.
Milliseconds are converted to seconds. Ids derive from the file's sha256, so importing the
same file twice changes nothing.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tunelab.core import records as R
from tunelab.core.bundle import BundleError
from tunelab.warehouse.loader import (
    DEFAULT_LOCK_TIMEOUT_S,
    BundleLoadError,
    LoadResult,
    _loaded_sha,
    _record_loaded,
    insert_trial_tables,
    open_warehouse,
)

__all__ = ["SOURCE", "import_vllm_bench", "vllm_bench_tables"]

SOURCE = "vllm-bench-import"
#: The runtime part of an imported trial's id when the import names no runtime.
IMPORT_RUNTIME = "unknown-runtime"
_STAT_METRICS = ("ttft", "tpot", "itl", "e2el")


def _records(path: Path, text: str) -> list[dict]:
    try:
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise BundleError(f"{path}: not a vllm bench serve result (neither JSON nor JSON lines): {exc}") from exc
    if not records:
        # An empty file (or `[]`): an interrupted run or a wrong path; there is nothing to import.
        raise BundleError(f"{path}: empty: no result records; give a file written by `vllm bench serve "
                          "--save-result` (one JSON object, or one per line with --append-result)")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "duration" not in r or "completed" not in r:
            raise BundleError(
                f"{path}: record {i} lacks 'duration'/'completed'; expected a `vllm bench serve --save-result` file"
            )
    return records


def _ms(r: dict, key: str) -> float | None:
    v = r.get(key)
    return None if v is None else float(v) / 1000.0


def _load_level(r: dict) -> tuple[str, float]:
    rate = r.get("request_rate")
    rate = math.inf if rate in (None, "inf") else float(rate)
    if math.isfinite(rate):
        return "rate", rate
    if r.get("max_concurrency") is not None:
        return "concurrency", float(r["max_concurrency"])
    return "rate", math.inf  # all requests sent at t=0


def _date(r: dict) -> _dt.datetime | None:
    try:
        return _dt.datetime.strptime(str(r.get("date")), "%Y%m%d-%H%M%S").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return None


def _request_rows(r: dict, trial_id: str, workload: str, kind: str, value: float, repeat: int) -> list[dict]:
    ttfts = r.get("ttfts")
    if not ttfts:
        return []
    n = len(ttfts)
    itls = r.get("itls") or [[] for _ in range(n)]
    lat = r.get("latencies") or [None] * n
    inl = r.get("input_lens") or [None] * n
    outl = r.get("output_lens") or [None] * n
    errors = r.get("errors")
    rows = []
    for i in range(n):
        ok = (not errors[i]) if errors is not None else bool(ttfts[i] or lat[i])
        ttft = float(ttfts[i]) if ok else None
        gaps = [float(x) for x in (itls[i] or [])]
        e2el = (float(lat[i]) if lat[i] is not None else ttft + sum(gaps)) if ok else None
        out = int(outl[i]) if outl[i] is not None else None
        rows.append({
            "trial_id": trial_id, **R.measurement_key(workload, kind, value, repeat), "request_index": i, "ok": ok,
            "error": (errors[i] or None) if errors is not None else (None if ok else "failed"),
            "send_ts": None, "first_token_ts": None, "end_ts": None,
            "chunk_offsets_s": list(ttft + np.cumsum([0.0] + gaps)) if ok else None,
            "prompt_tokens": int(inl[i]) if inl[i] is not None else None,
            "output_tokens": out, "requested_output_tokens": None, "finish_reason": None,
            "ttft_s": ttft, "e2el_s": e2el,
            "tpot_s": (e2el - ttft) / (out - 1) if ok and out and out > 1 else None,
            "itl_mean_s": float(np.mean(gaps)) if ok and gaps else None,
        })
    return rows


def vllm_bench_tables(
    path: Path,
    *,
    runtime_name: str | None = None,
    vllm_version: str | None = None,
    workload: str | None = None,
    config_key: str | None = None,
) -> tuple[str, dict[str, pd.DataFrame], str]:
    """Turn one ``vllm bench serve`` result file into warehouse rows.

    Args:
        path: the JSON (or JSON lines) file.
        runtime_name: the tunelab runtime the server ran on, if known.
        vllm_version: overrides a ``vllm_version`` key from ``--metadata``.
        workload: workload name; default the ``workload`` metadata key, else ``vllm-bench[-<label>]``.
        config_key: default ``vb-`` + sha256(model_id, label)[:12].

    Returns:
        (trial_id, {bundle table name: DataFrame}, sha256 of the file); each frame has its record's columns
        (``tunelab.core.records``: ``Sweep``, ``Trial``, ``Measurement``, ``Request``) in the record's order.

    Raises:
        BundleError: not a ``vllm bench serve`` result file.
        records.RecordError: a value that does not fit its column (names the table and the column).
    """
    path = Path(path)
    raw = path.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    records = _records(path, raw.decode("utf-8"))
    first = records[0]
    label = first.get("label")
    model = first.get("model_id")
    config_key = config_key or "vb-" + hashlib.sha256(f"{model}\0{label}".encode()).hexdigest()[:12]
    version = vllm_version or first.get("vllm_version")
    sweep_id = R.import_sweep_id(SOURCE, sha)
    trial_id = R.trial_id(sweep_id, config_key, runtime_name or IMPORT_RUNTIME, 0)
    end = _date(records[-1])
    start = _date(first)
    if start is not None:
        start -= _dt.timedelta(seconds=float(first.get("duration") or 0))
    meta_keys = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                 "request_rate", "burstiness", "max_concurrency", "ramp_up_strategy", "ramp_up_start_rps",
                 "ramp_up_end_rps"}
    bench_args = {k: first.get(k) for k in meta_keys if k in first}
    sweep = {"sweep_id": sweep_id, "plan_name": f"vllm bench serve: {path.name}", "plan_yaml": None,
             "host": None, "started_at": start, "finished_at": end, "tunelab_version": None, "source": SOURCE}
    trial = {
        "trial_id": trial_id, "sweep_id": sweep_id, "config_key": config_key, "config_label": label,
        "replicate": 0, "runtime_name": runtime_name, "vllm_version": version, "model": model,
        "engine_args": None, "env": None, "effective_config": json.dumps(bench_args, sort_keys=True, default=str),
        "command": None, "status": "ok", "started_at": start, "finished_at": end,
        "quality_verdict": "unvalidated", "log_path": str(path),
    }
    mrows, rrows, seen = [], [], {}
    for r in records:
        wl = workload or r.get("workload") or ("vllm-bench" + (f"-{r['label']}" if r.get("label") else ""))
        kind, value = _load_level(r)
        rep = seen.get((wl, kind, value), 0)
        seen[(wl, kind, value)] = rep + 1
        duration = float(r["duration"])
        lat = [x for x in (r.get("latencies") or []) if x]
        m = {
            "trial_id": trial_id, **R.measurement_key(wl, kind, value, rep),
            "num_requests": r.get("num_prompts"), "completed": r.get("completed"), "failed": r.get("failed"),
            "duration_s": duration, "request_throughput_per_s": r.get("request_throughput"),
            "output_tokens_per_s": r.get("output_throughput"), "total_tokens_per_s": r.get("total_token_throughput"),
            "goodput_per_s": r.get("request_goodput"),
            "achieved_concurrency": (sum(lat) / duration) if lat and duration > 0 else None,
            "total_input_tokens": r.get("total_input_tokens"), "total_output_tokens": r.get("total_output_tokens"),
            "client_cpu_frac": None, "client_bound": None,
        }
        for name in _STAT_METRICS:
            m[f"{name}_mean_s"] = _ms(r, f"mean_{name}_ms")
            m[f"{name}_p50_s"] = _ms(r, f"median_{name}_ms") if f"median_{name}_ms" in r else _ms(r, f"p50_{name}_ms")
            for p in (90, 95, 99):
                m[f"{name}_p{p}_s"] = _ms(r, f"p{p}_{name}_ms")
        mrows.append(m)
        rrows.extend(_request_rows(r, trial_id, wl, kind, value, rep))
    # Through the records, as the trial flow's rows are: every column of the table in its order (None where
    # the file has no value), and a value of the wrong type is refused here, naming the column, before the
    # warehouse is opened.
    tables = {"sweep": pd.DataFrame([R.to_row(R.Sweep, sweep)]), "trial": pd.DataFrame([R.to_row(R.TrialRow, trial)]),
              "measurements": R.frame(R.Measurement, pd.DataFrame(mrows))}
    if rrows:
        tables["requests"] = R.frame(R.Request, pd.DataFrame(rrows))
    return trial_id, tables, sha


def import_vllm_bench(
    db_path: str | Path,
    files: list[Path],
    runtime_name: str | None = None,
    *,
    vllm_version: str | None = None,
    workload: str | None = None,
    config_key: str | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> list[LoadResult]:
    """Import ``vllm bench serve --save-result`` files into the warehouse at ``db_path``.

    Each file is one transaction; a file already imported with the same content is skipped.
    See the module docstring for the mapping and ``vllm_bench_tables`` for the arguments.

    Returns:
        One LoadResult per file (``loaded`` or ``skipped``; ``bundle_dir`` is the file).

    Raises:
        BundleError: a file that is not a vllm bench serve result (named). Checked for all
            files before the database is opened.
        WarehouseLocked: the database stayed locked for ``lock_timeout_s``.
        BundleLoadError: an insert failed (rolled back).
    """
    prepared = [
        (Path(f), *vllm_bench_tables(Path(f), runtime_name=runtime_name, vllm_version=vllm_version,
                                     workload=workload, config_key=config_key))
        for f in files
    ]
    con = open_warehouse(db_path, lock_timeout_s=lock_timeout_s)
    results = []
    try:
        for path, trial_id, tables, sha in prepared:
            t0 = time.perf_counter()
            sweep_id = tables["sweep"].at[0, "sweep_id"]
            # Imports before ids came from records.trial_id had no runtime part: the same file is still known.
            legacy_id = f"{sweep_id}/{tables['trial'].at[0, 'config_key']}/r0"
            if sha in (_loaded_sha(con, trial_id), _loaded_sha(con, legacy_id)):
                results.append(LoadResult(path, trial_id, sweep_id, "skipped", {}, sha, time.perf_counter() - t0))
                continue
            con.execute("BEGIN TRANSACTION")
            try:
                rows = insert_trial_tables(con, trial_id, tables, source=f"vllm bench file {path}")
                _record_loaded(con, trial_id, sha, str(path), None, sum(rows.values()))
                con.execute("COMMIT")
            except Exception as exc:
                con.execute("ROLLBACK")
                if isinstance(exc, BundleError):
                    raise
                raise BundleLoadError(f"importing {path} failed and was rolled back: {exc}") from exc
            results.append(LoadResult(path, trial_id, sweep_id, "loaded", rows, sha, time.perf_counter() - t0))
    finally:
        con.close()
    return results
