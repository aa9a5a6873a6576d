"""Warehouse ingest and query speed on a synthetic history.

Builds result bundles for ``versions x configs x boots`` trials (synthetic data from
``warehouse.synthetic``; ``--requests`` request rows in total, default 10 million), loads them
with ``warehouse.loader.load_pending`` into a fresh DuckDB file, and prints:

* ingest: rows/s over all tables and request rows/s (wall time of ``load_pending``,
  bundle generation not included);
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
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tasks.bundle import write_bundle
from warehouse.compare import compare, regressions
from warehouse.loader import load_pending
from warehouse.migrate import connect
from warehouse.query import run_query
from warehouse.synthetic import synthetic_trial


def _timed(label: str, fn):
    t0 = time.perf_counter()
    out = fn()
    dt_s = time.perf_counter() - t0
    n = len(out) if hasattr(out, "__len__") else ""
    print(f"  {label:<46} {dt_s * 1000:9.1f} ms   ({n} rows)")
    return out, dt_s


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

    versions = [f"0.{minor}.{patch}" for minor in range(5, 60) for patch in range(3)][: args.versions]
    workloads = tuple(f"wl{i}" for i in range(args.workloads))
    loads = tuple(("concurrency", float(2 ** i)) for i in range(args.loads))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for vi, version in enumerate(versions):
        for c in range(args.configs):
            effect = -0.15 if (c == 0 and vi >= args.versions * 2 // 3) else 0.0  # one planted regression
            for b in range(args.boots):
                st = synthetic_trial(
                    sweep_id=f"sweep{vi:03d}", config_key=f"cfg{c}", replicate=b, vllm_version=version,
                    started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=vi),
                    workloads=workloads, loads=loads, repeats=args.repeats, requests_per_repeat=per_repeat,
                    effect_rel=effect, boot_sd_rel=0.02, repeat_sd_rel=0.02, chunk_offsets=args.chunk_offsets,
                    rng=rng,
                )
                write_bundle(results, st.sweep, st.trial, st.tables)
    gen_s = time.perf_counter() - t0
    print(f"bundles written in {gen_s:.1f} s ({sum(f.stat().st_size for f in results.rglob('*')) / 1e6:.0f} MB)")

    t0 = time.perf_counter()
    loaded = load_pending(db, results)
    load_s = time.perf_counter() - t0
    failed = [r for r in loaded if r.status != "loaded"]
    rows = sum(r.total_rows for r in loaded)
    req_rows = sum(r.rows.get("requests", 0) for r in loaded)
    print(f"ingest: {len(loaded)} bundles, {rows:,} rows in {load_s:.2f} s -> {rows / load_s:,.0f} rows/s "
          f"({req_rows / load_s:,.0f} request rows/s); failed: {len(failed)}")
    print(f"db file: {db.stat().st_size / 1e6:.0f} MB")

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
