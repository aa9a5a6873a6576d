"""How many boots a search wastes on configs that run out of memory: optuna told such a boot as FAIL (before issue
29) against told as infeasible (a violated constraint and the worst value, ``tunelab.core.search.config_tpe.CONFIG_FAILURES``).

The simulated space (issue 29 item 9): ``max-num-seqs`` in {32, 64, 128, 256, 512}, ``gpu-memory-utilization`` in
{0.8, 0.85, 0.9, 0.95}, ``max-num-batched-tokens`` in {1024, 2048, 4096, 8192}: 80 configs. A config with
``max-num-seqs >= 256`` and ``gpu-memory-utilization < 0.9`` fails to boot as ``oom_kv_cache`` (20 % of the grid);
every other config boots and gives a throughput that grows with all three knobs (so the best configs border the
failing region, as on a real GPU). No SLO. The search starts from the default (128, 0.9, 2048), with a budget of 20
boots and the memory walk-down on (its boots count against the budget); boots are simulated, so a run takes
seconds. A boot is *wasted* when it fails (a search boot or a walk-down boot in the failing region).

Run: ``python benchmarks/search_failures.py [--seeds 20] [--boots 20]``. Prints, per way of telling, the wasted
boots per search (mean, min-max over the seeds) and the best throughput found; docs/tuning.md has a run of it.
"""

from __future__ import annotations

import argparse
import math
import statistics

import pandas as pd

from tunelab.core.search.config_tpe import BootOutcome, SearchSpec, run_search

SPACE = {"max-num-seqs": [32, 64, 128, 256, 512], "gpu-memory-utilization": [0.8, 0.85, 0.9, 0.95],
         "max-num-batched-tokens": [1024, 2048, 4096, 8192]}
DEFAULT = {"max-num-seqs": 128, "gpu-memory-utilization": 0.9, "max-num-batched-tokens": 2048}


def out_of_memory(args: dict) -> bool:
    """The failing region: ``max-num-seqs >= 256`` and ``gpu-memory-utilization < 0.9``."""
    return int(args["max-num-seqs"]) >= 256 and float(args["gpu-memory-utilization"]) < 0.9


def throughput(args: dict) -> float:
    """Output tokens/s of a config that boots: grows with each knob (log of max-num-seqs and of the batch)."""
    seqs, gmu, mbt = int(args["max-num-seqs"]), float(args["gpu-memory-utilization"]), int(args["max-num-batched-tokens"])
    return 100.0 * math.log2(seqs) * (1.0 + 2.0 * (gmu - 0.8)) * (1.0 + 0.1 * math.log2(mbt / 1024))


def simulate(config_failure_as: str, seed: int, boots: int = 20) -> dict:
    """One search of the simulated space. Returns ``{boots, failed, failed_search, failed_walk_down, best,
    stop_reason}``: boots started, failed boots (all, search's, walk-down's), the best throughput found."""
    spec = SearchSpec.model_validate({"space": {"engine_args": SPACE},
                                      "objective": {"maximize": "output_tokens_per_s", "load": "c=4"},
                                      "budget": {"boots": boots}, "guide": False})

    def boot(req):
        if out_of_memory(req.engine_args):
            return BootOutcome("boot_failed", "oom_kv_cache", None, usable=False, gpu_minutes=1.0)
        rows = [{"workload": "chat", "load_kind": "concurrency", "load_value": 4.0, "repeat": r,
                 "output_tokens_per_s": throughput(req.engine_args), "ttft_p90_s": 0.1} for r in range(2)]
        return BootOutcome("ok", None, pd.DataFrame(rows), usable=True, gpu_minutes=1.0)

    out = run_search(spec, base_args=dict(DEFAULT), base_env={}, seed=seed, workload="chat", load="c=4",
                     slo={"ttft_s": None, "tpot_s": None, "e2el_s": None}, boot=boot,
                     config_failure_as=config_failure_as)  # type: ignore[arg-type]
    failed = [r for r in out.records if r.state == "fail"]
    best = out.best()
    return {"boots": out.boots, "failed": len(failed), "failed_search": sum(r.role == "search" for r in failed),
            "failed_walk_down": sum(r.role == "walk_down" for r in failed),
            "best": best.value if best is not None else None, "stop_reason": out.stop_reason}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="searches per way of telling (seeds 0..N-1)")
    ap.add_argument("--boots", type=int, default=20, help="boot budget of each search")
    a = ap.parse_args()
    top = max(throughput({"max-num-seqs": s, "gpu-memory-utilization": g, "max-num-batched-tokens": m})
              for s in SPACE["max-num-seqs"] for g in SPACE["gpu-memory-utilization"]
              for m in SPACE["max-num-batched-tokens"]
              if not out_of_memory({"max-num-seqs": s, "gpu-memory-utilization": g}))
    print(f"{a.seeds} seeded searches of {a.boots} boots each; failing region 16 of 80 configs; best possible "
          f"{top:.1f} tokens/s")
    print(f"{'told as':<11} {'failed boots/search':>20} {'(search + walk-down)':>22} {'min-max':>8} "
          f"{'best found (mean)':>18} {'found the best':>15}")
    for how in ("fail", "infeasible"):
        runs = [simulate(how, seed, a.boots) for seed in range(a.seeds)]
        f = [r["failed"] for r in runs]
        fs = statistics.mean(r["failed_search"] for r in runs)
        fw = statistics.mean(r["failed_walk_down"] for r in runs)
        bests = [r["best"] or 0.0 for r in runs]
        hit = sum(abs(b - top) < 1e-9 for b in bests)
        print(f"{how:<11} {statistics.mean(f):>20.2f} {f'({fs:.2f} + {fw:.2f})':>22} {f'{min(f)}-{max(f)}':>8} "
              f"{statistics.mean(bests):>18.1f} {f'{hit}/{a.seeds}':>15}")


if __name__ == "__main__":
    main()
