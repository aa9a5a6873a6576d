"""Warehouse ingest and query speed on a synthetic history.

Builds result bundles for ``versions x configs x boots`` trials (synthetic data from
``warehouse.synthetic``; ``--requests`` request rows in total, default 10 million), loads them
with ``warehouse.loader.load_pending`` into a fresh DuckDB file, and prints:

* the bundle size: with the defaults ~50,000 request rows per bundle (200 trials of 2 workloads
  x 3 load levels x 3 repeats x 2,777 requests), i.e. the issue's 10 million rows over 50
  versions with 2 configs and 2 boots each;
* ingest: rows/s over all tables and request rows/s (wall time of ``load_pending``, its final
  CHECKPOINT included, bundle generation not included), the process CPU time of the load
  (all DuckDB threads; the machine may be shared, so CPU and wall differ) and the load average;
* a second ingest into a separate file of ``--small-bundles`` bundles of ``--small-bundle-rows``
  request rows, the size of a typical real trial, where the fixed cost per bundle (a transaction,
  a dozen statements, hashing) weighs more;
* wall time of the A/B comparison (``warehouse.compare.compare`` and ``ab_comparison.sql``),
  of the regression query (``warehouse.compare.regressions`` and ``regressions.sql``), of the
  ``latest_per_config`` view query and of a request-level p99 TTFT over ``request_facts``.

Goals: ingest >= 1 million rows/s; view queries under 1 s.

Usage::

    python benchmarks/warehouse_ingest.py                       # 10 M request rows, 50 versions
    python benchmarks/warehouse_ingest.py --requests 500000     # scaled down
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tunelab.core.bundle import write_bundle
from tunelab.warehouse.compare import compare, regressions
from tunelab.warehouse.loader import load_pending
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.query import run_query
from tunelab.warehouse.synthetic import synthetic_trial


def _timed(label: str, fn):
    t0 = time.perf_counter()
    out = fn()
    dt_s = time.perf_counter() - t0
    n = len(out) if hasattr(out, "__len__") else ""
    print(f"  {label:<46} {dt_s * 1000:9.1f} ms   ({n} rows)")
    return out, dt_s


def _write_history(results: Path, versions, args, per_repeat: int, rng, sweep_prefix: str = "sweep") -> None:
    workloads = tuple(f"wl{i}" for i in range(args.workloads))
    loads = tuple(("concurrency", float(2 ** i)) for i in range(args.loads))
    for vi, version in enumerate(versions):
        for c in range(args.configs):
            effect = -0.15 if (c == 0 and vi >= args.versions * 2 // 3) else 0.0  # one planted regression
            for b in range(args.boots):
                st = synthetic_trial(
                    sweep_id=f"{sweep_prefix}{vi:03d}", config_key=f"cfg{c}", replicate=b, vllm_version=version,
                    started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=vi),
                    workloads=workloads, loads=loads, repeats=args.repeats, requests_per_repeat=per_repeat,
                    effect_rel=effect, boot_sd_rel=0.02, repeat_sd_rel=0.02, chunk_offsets=args.chunk_offsets,
                    rng=rng,
                )
                write_bundle(results, st.sweep, st.trial, st.tables)


def _timed_load(db: Path, results: Path) -> tuple[list, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    loaded = load_pending(db, results)
    return loaded, time.perf_counter() - t0, time.process_time() - c0


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000_000, help="request rows in total")
    ap.add_argument("--versions", type=int, default=50)
    ap.add_argument("--configs", type=int, default=2)
    ap.add_argument("--boots", type=int, default=2, help="trials per (config, version)")
    ap.add_argument("--workloads", type=int, default=2)
    ap.add_argument("--loads", type=int, default=3, help="load levels per workload")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-offsets", type=int, default=0,
                    help="length of chunk_offsets_s per request (0 = NULL; real runs store one per chunk)")
    ap.add_argument("--small-bundles", type=int, default=200,
                    help="bundles of the second, small-bundle ingest (0 to skip)")
    ap.add_argument("--small-bundle-rows", type=int, default=2000,
                    help="request rows per bundle of the second ingest (a typical real trial: hundreds to thousands)")
    ap.add_argument("--workdir", type=Path, default=None, help="where to put bundles and the DB (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    args = ap.parse_args()

    trials = args.versions * args.configs * args.boots
    cells = args.workloads * args.loads * args.repeats
    per_repeat = max(1, args.requests // (trials * cells))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tunelab-ingest-"))
    results, db = workdir / "results", workdir / "warehouse.duckdb"
    print(f"{trials} trials ({args.versions} versions x {args.configs} configs x {args.boots} boots), "
          f"{cells} measurements each, {per_repeat} requests per measurement -> "
          f"{trials * cells * per_repeat:,} request rows; chunk_offsets_s length {args.chunk_offsets}")
    print(f"bundle size: {cells * per_repeat:,} request rows per bundle (one bundle per trial; the issue's "
          f"{args.requests:,} rows spread over {trials} trials). Real trials hold hundreds to thousands of request "
          "rows per measurement; the small-bundle ingest below shows the per-bundle cost.")
    print(f"load average before: {_loadavg()} ({os.cpu_count()} CPUs)")

    versions = [f"0.{minor}.{patch}" for minor in range(5, 60) for patch in range(3)][: args.versions]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    _write_history(results, versions, args, per_repeat, rng)
    gen_s = time.perf_counter() - t0
    print(f"bundles written in {gen_s:.1f} s ({sum(f.stat().st_size for f in results.rglob('*')) / 1e6:.0f} MB)")

    loaded, load_s, load_cpu = _timed_load(db, results)
    failed = [r for r in loaded if r.status != "loaded"]
    rows = sum(r.total_rows for r in loaded)
    req_rows = sum(r.rows.get("requests", 0) for r in loaded)
    print(f"ingest: {len(loaded)} bundles, {rows:,} rows in {load_s:.2f} s -> {rows / load_s:,.0f} rows/s "
          f"({req_rows / load_s:,.0f} request rows/s; {load_s / max(1, len(loaded)) * 1000:.0f} ms per bundle); "
          f"CPU {load_cpu:.2f} s; load average after: {_loadavg()}; failed: {len(failed)}")
    print(f"db file: {db.stat().st_size / 1e6:.0f} MB")
    again, again_s, _ = _timed_load(db, results)
    print(f"loading the same bundles again: {len(again)} loaded, {again_s:.2f} s (hashes checked, nothing written)")

    if args.small_bundles:
        small = workdir / "small-results"
        small_args = argparse.Namespace(**{**vars(args), "versions": args.small_bundles, "configs": 1, "boots": 1})
        small_per_repeat = max(1, args.small_bundle_rows // cells)
        _write_history(small, (versions * (args.small_bundles // len(versions) + 1))[: args.small_bundles], small_args, small_per_repeat,
                       np.random.default_rng(1), sweep_prefix="small")
        s_loaded, s_s, s_cpu = _timed_load(workdir / "small.duckdb", small)
        s_rows = sum(r.total_rows for r in s_loaded)
        print(f"small-bundle ingest (separate file): {len(s_loaded)} bundles of {cells * small_per_repeat:,} request "
              f"rows, {s_rows:,} rows in {s_s:.2f} s -> {s_rows / s_s:,.0f} rows/s, "
              f"{s_s / max(1, len(s_loaded)) * 1000:.1f} ms per bundle; CPU {s_cpu:.2f} s; "
              f"load average after: {_loadavg()}")

    con = connect(db)
    print("queries (wall time, warm after the first):")
    for _ in range(2):
        _timed("compare() cfg0 v[0] vs v[-1], output tokens/s",
               lambda: compare(con, {"config_key": "cfg0", "vllm_version": versions[0]},
                               {"config_key": "cfg0", "vllm_version": versions[-1]}))
        _timed("ab_comparison.sql cfg0 vs cfg1",
               lambda: run_query(con, "ab_comparison", metric="output_tokens_per_s", baseline_config_key="cfg0",
                                 baseline_runtime=None, candidate_config_key="cfg1", candidate_runtime=None))
        reg, _ = _timed("regressions() all configs, output tokens/s",
                        lambda: regressions(con, "output_tokens_per_s"))
        _timed("regressions.sql all configs",
               lambda: run_query(con, "regressions", metric="output_tokens_per_s", threshold_rel=0.05,
                                 noise_k=2.0, config_key=None))
        _timed("latest_per_config.sql all metrics",
               lambda: run_query(con, "latest_per_config", config_key=None, metric=None))
        _timed("request_facts: p99 TTFT per trial (all requests)",
               lambda: con.execute("SELECT trial_id, quantile_cont(ttft_s, 0.99) FROM request_facts "
                                   "GROUP BY trial_id").fetchall())
    starts = reg[reg.regression_start]
    print("planted regression (cfg0 from version index "
          f"{args.versions * 2 // 3}, {versions[args.versions * 2 // 3]}) found at: "
          f"{sorted(set(starts[starts.config_key == 'cfg0'].point))}; other configs flagged: "
          f"{sorted(set(starts[starts.config_key != 'cfg0'].config_key))}")
    con.close()
    if not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
