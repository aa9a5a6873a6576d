"""Reports of a sweep: the comparison table (per config, workload and load level) as a DataFrame, a rich
table for the terminal and markdown for a Prefect artifact; the quality summary of a sweep (how many trials
pass / warn / fail / are unvalidated, and why, from ``quality_checks``); the per-trial table shown in the
Prefect UI while a sweep runs; and the markdown of an A/B comparison (``warehouse.compare``).
The comparison SQL is ``tunelab/warehouse/queries/sweep_comparison.sql``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pandas as pd

from tunelab.core.load_profiles import load_label
from tunelab.core.markdown import markdown_table, shorten
from tunelab.reports.design_plan import metric_unit
from tunelab.stats.intervals import mde_text

__all__ = [
    "VERDICT_ORDER",
    "ab_markdown",
    "bottleneck_findings",
    "bottlenecks_markdown",
    "comparison_frame",
    "sla_search_lines",
    "sla_search_markdown",
    "sla_search_records",
    "window_diagnosis_records",
    "left_out_lines",
    "comparison_markdown",
    "has_spec_decode",
    "SPEC_COLUMNS",
    "SLO_COLUMNS",
    "has_slo",
    "slo_legend",
    "latest_sweep_id",
    "png_data_uri",
    "print_comparison",
    "settings_text",
    "sweep_quality_markdown",
    "quality_check_lines",
    "quality_terminal_lines",
    "quality_summary",
    "regressions_markdown",
    "sweep_markdown",
    "trial_facts_markdown",
    "trial_name",
    "trial_table",
    "trials_table",
    "names_runtime",
]

#: Quality verdicts in the order reports list them (tunelab/tasks/quality.py defines them).
VERDICT_ORDER = ("pass", "warn", "fail", "unvalidated")

_SQL = Path(__file__).resolve().parent.parent / "warehouse" / "queries" / "sweep_comparison.sql"


@contextlib.contextmanager
def _reader(db: Path | str | duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB file opened read-only (closed after), or an open connection as it is (left open: e.g. the
    in-memory warehouse of ``warehouse.loader.bundles_warehouse``)."""
    if isinstance(db, duckdb.DuckDBPyConnection):
        yield db
        return
    con = duckdb.connect(str(db), read_only=True)
    try:
        yield con
    finally:
        con.close()


def trial_name(label: Any, replicate: Any, runtime: Any = None) -> str:
    """How a report names a trial: ``"<config> r<replicate>"`` (``twin r0``), and ``" on <runtime>"`` after it
    when ``runtime`` is given (``twin r0 on gpu-0.26.0``): a sweep that ran one config on two runtimes has two
    ``twin r0``. Pass a runtime only where :func:`names_runtime` says so, to keep the short names otherwise."""
    name = f"{label} r{replicate}"
    return name if runtime is None or (isinstance(runtime, float) and pd.isna(runtime)) else f"{name} on {runtime}"


def names_runtime(db: Path | str | duckdb.DuckDBPyConnection, sweep_id: str) -> bool:
    """Whether the trials of a sweep ran on more than one runtime, so that a trial's name (:func:`trial_name`)
    must carry its runtime. Opens the DuckDB file read-only, or reads an open connection as it is."""
    with _reader(db) as con:
        return bool(con.execute("SELECT count(DISTINCT runtime_name) > 1 FROM trials WHERE sweep_id = ?",
                                [sweep_id]).fetchone()[0])


def comparison_frame(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str,
                     all_quality: bool = False) -> pd.DataFrame:
    """One row per (runtime, config, workload, load level) of the sweep; latencies in seconds.

    With speculative decoding, ``spec_acceptance_rate`` (accepted / draft tokens, 0-1) and
    ``spec_mean_acceptance_length`` (1 + accepted tokens / drafts, tokens) come from the level's summed
    ``server_metrics`` deltas of vLLM's spec-decode counters; NaN where the server exposed none.

    By default only trials whose quality verdict is pass or warn are used (issue: a measurement that failed
    its quality gate is not a number to compare); the trials left out are in ``df.attrs["left_out"]`` (list of
    dicts: config, replicate, runtime (None unless the sweep ran on several runtimes: :func:`names_runtime`),
    verdict, failed checks). ``all_quality=True`` uses every measured trial.
    Opens the DuckDB file read-only (the sweep's writer has already closed it); an open connection (the
    sweep's bundles in memory when the file is locked) is read as it is.

    Raises:
        duckdb.IOException: the file is locked by a writing process."""
    with _reader(db_path) as con:
        df = con.execute(_SQL.read_text(), {"sweep_id": sweep_id, "all_quality": all_quality}).df()
        left = [] if all_quality else con.execute("""
            SELECT t.config_label, t.replicate, t.quality_verdict,
                   string_agg(DISTINCT q.expectation, ', ') FILTER (WHERE q.success = false AND q.severity = 'fail'),
                   CASE WHEN ? THEN t.runtime_name END
            FROM trials t LEFT JOIN quality_checks q USING (trial_id)
            WHERE t.sweep_id = ? AND t.status = 'ok' AND coalesce(t.quality_verdict, 'unvalidated') NOT IN ('pass', 'warn')
            GROUP BY ALL ORDER BY 1, 2, 5""", [names_runtime(con, sweep_id), sweep_id]).fetchall()
    df.attrs["left_out"] = [{"config": c, "replicate": r, "runtime": rt, "verdict": v, "failed_checks": f,
                             "sweep_id": sweep_id} for c, r, v, f, rt in left]
    with _reader(db_path) as con:
        df.attrs["sla_search"] = sla_search_lines(con, sweep_id)
        df.attrs["slo"] = _plan_slo(con, sweep_id)
    return df


def _plan_slo(con: duckdb.DuckDBPyConnection, sweep_id: str) -> dict[str, float]:
    """The ``slo:`` bounds of the sweep's stored plan (``sweeps.plan_yaml``), seconds; {} when it has none or the
    plan text is not readable YAML (a view, never fatal)."""
    import yaml

    row = con.execute("SELECT plan_yaml FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchone()
    try:
        slo = (yaml.safe_load(row[0]) or {}).get("slo") if row and row[0] else None
    except yaml.YAMLError:
        return {}
    return {k: float(v) for k, v in slo.items() if isinstance(v, (int, float))} if isinstance(slo, dict) else {}


def sla_search_lines(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str) -> list[str]:
    """One line per trial and workload with an SLA search (``sla_searches``, plan ``sla_search:``): config, boot,
    runtime, workload, then the search's summary (max load under the SLO, goodput and throughput there, the
    knee; or no load meets the SLO and the nearest level; a max load accepted only by its point estimate says
    so). Empty for a warehouse older than schema version 17
    or a sweep without searches. Opens the DuckDB file read-only, or reads an open connection."""
    with _reader(db_path) as con:
        try:
            rows = con.execute(
                """SELECT config_label, replicate, runtime_name, workload, summary, max_load_shown
                   FROM sla_search_results
                   WHERE sweep_id = ? ORDER BY config_label, runtime_name, replicate, workload""", [sweep_id]).fetchall()
        except duckdb.CatalogException:
            return []
    out = []
    for c, r, rt, w, s, shown in rows:
        if shown is False and "by point estimate" not in str(s):  # a summary stored before it said so
            s = f"{s} [max load by point estimate: undecided at the window cap]"
        out.append(f"{c} (r{r}, {rt}) {w}: {s}")
    return out


#: Keys of each ``sla_searches`` entry of ``tunelab report --json`` (:func:`sla_search_records`), in order.
SLA_SEARCH_KEYS = ("trial_id", "config_key", "config_label", "runtime_name", "replicate", "workload", "load_kind",
                   "verdict", "max_load", "max_load_shown", "first_fail", "nearest_load", "goodput_per_s",
                   "request_throughput_per_s", "output_tokens_per_s", "knee_load", "knee_request_throughput_per_s",
                   "limits", "levels", "levels_tried", "windows", "summary")
#: Keys of each ``window_diagnoses`` entry of ``tunelab report --json`` (:func:`window_diagnosis_records`), in order.
WINDOW_DIAGNOSIS_KEYS = ("trial_id", "config_label", "replicate", "workload", "load_kind", "load_value", "repeat",
                         "bottleneck", "flagged", "metric", "value", "threshold", "summary", "evidence", "remedy",
                         "sources")


def _json_field(v: Any) -> Any:
    """A JSON column as DuckDB returns it (text) -> its value; other values as they are."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def sla_search_records(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str) -> list[dict[str, Any]]:
    """The sweep's SLA searches (table ``sla_searches``, migration 017, with each trial's config), one dict per
    trial and workload with the keys :data:`SLA_SEARCH_KEYS`: loads in the search's unit (``load_kind``:
    concurrency, or requests/s for ``rate``), throughputs per second, ``limits`` (metric -> limit, seconds) and
    ``levels`` (every level tried, in order) as JSON values; ordered by config, runtime, boot, workload. Empty for a
    warehouse older than schema version 17 or a sweep without searches. Opens the DuckDB file read-only, or reads an
    open connection."""
    cols = ", ".join(f"t.{k}" if k in ("config_key", "config_label", "runtime_name", "replicate") else f"s.{k}"
                     for k in SLA_SEARCH_KEYS)
    with _reader(db_path) as con:
        try:
            rows = con.execute(f"""SELECT {cols} FROM sla_searches s JOIN trials t USING (trial_id)
                                   WHERE t.sweep_id = ?
                                   ORDER BY t.config_label, t.runtime_name, t.replicate, s.workload""",
                               [sweep_id]).fetchall()
        except duckdb.CatalogException:
            return []
    return [{k: (_json_field(v) if k in ("limits", "levels") else v) for k, v in zip(SLA_SEARCH_KEYS, r)}
            for r in rows]


def window_diagnosis_records(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str) -> list[dict[str, Any]]:
    """Every bottleneck check of every measured window of the sweep (table ``window_diagnoses``, migration 016, with
    each trial's config), flagged or not: one dict per window and check with the keys
    :data:`WINDOW_DIAGNOSIS_KEYS` (``flagged``: the evidence crossed the threshold, None: evidence missing;
    ``evidence``: every figure the check used, as a JSON value; ``repeat`` 0-based); ordered as the view
    ``window_findings``. The flagged ones are :func:`bottleneck_findings`. Empty for a warehouse older than schema
    version 16. Opens the DuckDB file read-only, or reads an open connection."""
    cols = ", ".join(f"t.{k}" if k in ("config_label", "replicate") else f"d.{k}" for k in WINDOW_DIAGNOSIS_KEYS)
    with _reader(db_path) as con:
        try:
            rows = con.execute(f"""SELECT {cols} FROM window_diagnoses d JOIN trials t USING (trial_id)
                                   WHERE t.sweep_id = ?
                                   ORDER BY t.config_label, t.replicate, d.workload, d.load_kind, d.load_value,
                                            d.repeat, d.bottleneck""", [sweep_id]).fetchall()
        except duckdb.CatalogException:
            return []
    return [{k: (_json_field(v) if k == "evidence" else v) for k, v in zip(WINDOW_DIAGNOSIS_KEYS, r)} for r in rows]


def sla_search_markdown(lines: list[str]) -> str:
    """Markdown of :func:`sla_search_lines` (docs/sla_search.md says how the search decides)."""
    return "\n".join(["## Max load under the SLO (sla_search; docs/sla_search.md)", ""] + [f"- {x}" for x in lines])


def _config_cell(r: pd.Series) -> str:
    """The config label, marked when vLLM reported one of its env vars as unknown on some boot."""
    na = r.get("env_not_applied")
    if isinstance(na, str) and na:
        return f"{r['config']} (not applied: {', '.join(json.loads(na))})"
    return str(r["config"])


#: Display columns of the speculative-decoding acceptance (``spec_acceptance_rate``, ``spec_mean_acceptance_length``
#: of :func:`comparison_frame`), shown right after TPOT because they explain it: a higher acceptance means more
#: tokens per decode step, hence a lower TPOT.
SPEC_COLUMNS = ("spec accept rate", "spec accept len")


def has_spec_decode(df: pd.DataFrame) -> bool:
    """True when at least one row of a :func:`comparison_frame` has a speculative-decoding acceptance figure (the
    server exposed vLLM's spec-decode counters); a sweep without speculative decoding shows no such columns."""
    return any(c in df.columns and df[c].notna().any()
               for c in ("spec_acceptance_rate", "spec_mean_acceptance_length"))


#: Display columns of the plan's ``slo:`` in a plain sweep (``goodput_per_s`` and ``slo_attainment`` of
#: :func:`comparison_frame`), shown after the throughput: goodput in requests/s, and the share of the completed
#: requests that met every bound, in %.
SLO_COLUMNS = ("goodput req/s", "goodput %", "in SLO")
#: The latency columns of the comparison. Their percentiles are over the requests that completed (a failed request
#: has no TTFT/TPOT/E2EL); where any request of the frame failed they are labelled with :data:`OK_ONLY` and the
#: ``failed %`` column beside them gives the failed share, so a config that fails its slow requests does not read
#: as fast (error-aware latency, as LLMPerf and GenAI-Perf users ask for).
LATENCY_COLUMNS = ("TTFT p50 ms", "TPOT p50 ms", "ITL p50 ms", "E2EL p95 ms")
OK_ONLY = " (OK only)"
FAILED_PCT = "failed %"


def has_failures(df: pd.DataFrame) -> bool:
    """True when some request of a :func:`comparison_frame` failed (its latency columns are then labelled OK-only)."""
    return "failed_requests" in df.columns and bool((df["failed_requests"].fillna(0) > 0).any())


def _failed_frac(r: pd.Series) -> float | None:
    """failed / (completed + failed) requests of a row; None where the counts are missing."""
    f, c = r.get("failed_requests"), r.get("completed_requests")
    if f is None or c is None or pd.isna(f) or pd.isna(c) or f + c <= 0:
        return None
    return float(f) / float(f + c)


def has_slo(df: pd.DataFrame) -> bool:
    """True when a :func:`comparison_frame` has goodput figures (its plan gave an ``slo:``)."""
    return "goodput_per_s" in df.columns and df["goodput_per_s"].notna().any()


def slo_legend(df: pd.DataFrame) -> str | None:
    """One line that says what :data:`SLO_COLUMNS` mean, with the plan's bounds (``df.attrs["slo"]``, seconds); None
    when the frame has no goodput. Source of the rule: ``vllm bench serve --goodput`` (a request is good when each
    bounded metric of that request, its TTFT, TPOT or E2EL, is <= its bound)."""
    if not has_slo(df):
        return None
    bounds = ", ".join(f"{k.removesuffix('_s').upper()} <= {v * 1000:g} ms"
                       for k, v in (df.attrs.get("slo") or {}).items() if v is not None)
    return (f"slo{f' ({bounds})' if bounds else ''}, per request as vllm bench serve --goodput: goodput = requests/s "
            "meeting every bound; goodput % = their share of all requests sent (a failed request is not good); in "
            "SLO = their share of the completed requests (failed ones: column failed)")


def _fmt_row(r: pd.Series, spec: bool = False, slo: bool = False, ok_only: bool = False) -> dict[str, str]:
    """One comparison row as display strings; ``spec`` adds :data:`SPEC_COLUMNS` after TPOT (acceptance rate in %,
    mean acceptance length in tokens per draft, the bonus token included; ``-`` where the row has none); ``slo``
    adds :data:`SLO_COLUMNS` after the output-token throughput's cv (goodput % = in SLO x completed / all
    requests). ``failed %`` follows the latency columns; ``ok_only`` (:func:`has_failures`) labels those
    columns :data:`OK_ONLY`."""
    def ms(x: Any) -> str:
        return "-" if pd.isna(x) else f"{x * 1000:.1f}"

    def num(x: Any, fmt: str) -> str:
        return "-" if x is None or pd.isna(x) else format(x, fmt)

    cv = r.get("output_tps_cv")
    out = {
        "runtime": str(r["runtime"]),
        "config": _config_cell(r),
        "workload": str(r["workload"]),
        "load": load_label(r["load_kind"], r["load_value"]),
        "boots x repeats": f"{int(r['boots'])}x{int(r['repeats'] // max(r['boots'], 1))}",
        "output tok/s": "-" if pd.isna(r["output_tokens_per_s"]) else f"{r['output_tokens_per_s']:.1f}",
        "cv": "-" if pd.isna(cv) else f"{cv * 100:.0f}%",
        "TTFT p50 ms": ms(r["ttft_p50_s"]),
        "TPOT p50 ms": ms(r["tpot_p50_s"]),
        "ITL p50 ms": ms(r["itl_p50_s"]),
        "E2EL p95 ms": ms(r["e2el_p95_s"]),
        FAILED_PCT: "-" if _failed_frac(r) is None else f"{_failed_frac(r) * 100:.1f}%",
        "failed": str(int(r["failed_requests"] or 0)),
        "quality": str(r["quality"]),
    }
    def insert_after(key: str, cells: list[tuple[str, str]]) -> None:
        nonlocal out
        items = list(out.items())
        i = [k for k, _ in items].index(key) + 1
        out = dict(items[:i] + cells + items[i:])

    if slo:
        att, ff = r.get("slo_attainment"), _failed_frac(r)
        good = None if att is None or pd.isna(att) else att * (1 - ff if ff is not None else 1)
        insert_after("cv", [(SLO_COLUMNS[0], num(r.get("goodput_per_s"), ".2f")),
                            (SLO_COLUMNS[1], "-" if good is None else f"{good * 100:.0f}%"),
                            (SLO_COLUMNS[2], "-" if att is None or pd.isna(att) else f"{att * 100:.0f}%")])
    if spec:
        rate, length = r.get("spec_acceptance_rate"), r.get("spec_mean_acceptance_length")
        insert_after("TPOT p50 ms", [(SPEC_COLUMNS[0], "-" if rate is None or pd.isna(rate) else f"{rate * 100:.1f}%"),
                                     (SPEC_COLUMNS[1], num(length, ".2f"))])
    if ok_only:
        out = {(k + OK_ONLY if k in LATENCY_COLUMNS else k): v for k, v in out.items()}
    return out


def comparison_markdown(df: pd.DataFrame, sweep_id: str, statuses: list[dict] | None = None) -> str:
    """Markdown report: the trials with their status, then the comparison in two narrow tables (throughput,
    then latency), so that neither is cut in a 1600 px browser window (the Prefect UI cut one 13-column
    table after "ITL p50 ms")."""
    lines = [f"# tunelab sweep `{sweep_id}`", ""]
    if statuses:
        lines += ["## Trials", ""] + markdown_table([{
            "trial": f"`{s['trial_id'].split('/', 1)[-1]}`", "config": s["config"], "runtime": s["runtime"],
            "status": s["status"], "failure": s.get("failure_class") or "",
            "boot s": "" if s.get("boot_s") is None or pd.isna(s["boot_s"]) else f"{s['boot_s']:.1f}",
        } for s in statuses])
        lines.append("")
    lines += ["## Comparison (means over boots and repeats; cv = repeat-to-repeat spread of output tok/s)", ""]
    if df.empty:
        lines.append("_no measurements_")
        return "\n".join(lines)
    spec, slo, ok_only = has_spec_decode(df), has_slo(df), has_failures(df)
    rows = [_fmt_row(r, spec, slo, ok_only) for _, r in df.iterrows()]
    several_runtimes = len({r["runtime"] for r in rows}) > 1
    for r in rows:  # one runtime: named in the heading, not repeated in every row
        if several_runtimes:
            r["config"] = f"{r['config']} @ {r['runtime']}"
    if not several_runtimes:
        lines += [f"Runtime: `{rows[0]['runtime']}`", ""]
    ident = ("config", "workload", "load")
    lines += ["### Throughput", ""] + ([slo_legend(df) or "", ""] if slo else []) + markdown_table([
        {k: r[k] for k in (*ident, "boots x repeats", "output tok/s", "cv", *(SLO_COLUMNS if slo else ()), "failed",
                           "quality")} for r in rows])
    lab = OK_ONLY if ok_only else ""
    latency = (f"TTFT p50 ms{lab}", f"TPOT p50 ms{lab}", *(SPEC_COLUMNS if spec else ()), f"ITL p50 ms{lab}",
               f"E2EL p95 ms{lab}", FAILED_PCT)
    lines += ["", "### Latency (ms)" + ("; speculative decoding: acceptance rate, mean acceptance length (tokens)"
                                         if spec else "")
              + ("; percentiles over the completed requests only, failed % = failed / all requests" if ok_only
                 else ""), ""] + markdown_table([{k: r[k] for k in (*ident, *latency)} for r in rows])
    return "\n".join(lines)


def settings_text(engine_args: dict | str | None, env: dict | str | None) -> str:
    """A config key's full settings on one line, e.g. ``--dtype bfloat16 --enforce-eager; env VLLM_X=1``:
    every engine arg launched (sorted, ``true`` flags without a value; ``false``/null ones are not launched and not
    part of the key: ``tunelab.core.plan.config_key``) and every env var of
    the config (values of secret-looking names are already redacted in the warehouse). Accepts the dicts or
    their JSON text (``trials.engine_args`` / ``trials.env``). A label names only the axis that varies in its
    plan, so the same key can carry different labels in different sweeps: this text is what the key is."""
    ea = json.loads(engine_args) if isinstance(engine_args, str) else dict(engine_args or {})
    ev = json.loads(env) if isinstance(env, str) else dict(env or {})
    args = []
    for k in sorted(ea):
        v = ea[k]
        if v is None or v is False:
            continue
        args.append(f"--{k}" if v is True else f"--{k} {v}")
    text = " ".join(args) or "(vLLM defaults)"
    if ev:
        text += "; env " + " ".join(f"{k}={v}" for k, v in sorted(ev.items()))
    return text


def trials_table(statuses: list[dict]) -> list[dict[str, str]]:
    """The sweep's trials as narrow rows for a Prefect table artifact: run order, config, key, boot (replicate),
    device, status, failure class, boot s (0.1 s), compile cache, verdict and the number of measurement notes
    (the notes themselves, one line per window, are in the trial's log and ``trials.measurement_notes``; in a
    table cell they made rows 12 lines high)."""
    out = []
    for i, s in enumerate(statuses):
        notes = [n for n in str(s.get("measurement_notes") or "").splitlines() if n.strip()]
        boot_s = s.get("boot_s")
        out.append({
            "#": str(i + 1), "config": str(s.get("config", "")), "key": str(s.get("config_key", "")),
            "boot": f"r{s.get('replicate', '')}", "device": str(s.get("device", "")), "status": str(s.get("status", "")),
            "failure": s.get("failure_class") or "", "boot s": "" if boot_s is None or pd.isna(boot_s) else f"{boot_s:.1f}",
            "compile cache": s.get("compile_cache") or "", "verdict": s.get("verdict") or "",
            "notes": str(len(notes)) if notes else "",
        })
    return out


def table_width() -> int:
    """Columns for the terminal tables: ``COLUMNS`` when it is set wider, else 250 (the comparison table with the
    SLO, failed and quality columns is about 230 wide; a pipe would otherwise get Rich's 80 and a narrower
    fixed width cut the last column, found by a fresh user)."""
    import os

    try:
        cols = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        cols = 0
    return max(250, cols)


def left_out_lines(left_out: list[dict]) -> list[str]:
    """One line per trial left out of a comparison by its quality verdict, with the failed checks; when some were
    never judged (a sweep cancelled before its quality gate ran), a last line with the command that judges them."""
    lines = [f"left out: {trial_name(x['config'], x['replicate'], x.get('runtime'))} "
             f"(quality {x['verdict'] or 'unvalidated'}: {x['failed_checks'] or 'not validated'}); "
             "`tunelab report --all-quality` includes it" for x in left_out]
    unjudged = [x for x in left_out if (x.get("verdict") or "unvalidated") == "unvalidated"]
    if unjudged:
        sweep = unjudged[0].get("sweep_id")
        lines.append(f"{len(unjudged)} finished trial(s) were never judged by the quality gate (a sweep cancelled "
                     "before it ran keeps them unvalidated): `tunelab recheck"
                     + (f" --sweep {sweep}" if sweep else "") + "` judges them")
    return lines


def print_comparison(df: pd.DataFrame, title: str = "comparison", left_out: list[dict] | None = None,
                     sla_lines: list[str] | None = None, empty_note: str | None = None) -> None:
    """Print one line per config's SLA search (``sla_lines``, default ``df.attrs["sla_search"]``:
    :func:`sla_search_lines`), the trials left out by their quality verdict, then the comparison as a rich table.
    ``empty_note``: what to say instead of "(no measurements)" when nothing is compared (e.g. the windows of
    cancelled trials that are stored but not compared)."""
    from rich.console import Console
    from rich.table import Table

    sla_lines = df.attrs.get("sla_search", []) if sla_lines is None else sla_lines
    if sla_lines:
        Console(width=table_width()).print("max load under the SLO (sla_search):", highlight=False)
        for line in sla_lines:
            Console(width=table_width()).print(f"  {line}", highlight=False, soft_wrap=True)

    left_out = df.attrs.get("left_out", []) if left_out is None else left_out
    for line in left_out_lines(left_out):
        Console(width=table_width()).print(line, highlight=False)
    t = Table(title=title)
    if df.empty:
        Console(width=table_width()).print(f"({empty_note})" if empty_note else "(no measurements)" if not left_out
                                 else "(no measurement passed its quality gate)", highlight=False, soft_wrap=True)
        return
    spec, slo, ok_only = has_spec_decode(df), has_slo(df), has_failures(df)
    rows = [_fmt_row(r, spec, slo, ok_only) for _, r in df.iterrows()]
    if ok_only:
        Console(width=table_width()).print(f"latency columns{OK_ONLY}: percentiles over the completed requests; a failed "
                                 f"request has none ({FAILED_PCT} = failed / all requests, beside them)",
                                 highlight=False, soft_wrap=True)
    if slo:
        Console(width=table_width()).print(slo_legend(df), highlight=False, soft_wrap=True)
        if (df["slo_attainment"].fillna(0) == 0).all():
            Console(width=table_width()).print("no completed request met the slo: at any config and load: check its bounds "
                                     "against the latencies below", highlight=False, soft_wrap=True)
    for c in rows[0]:
        text = c in ("runtime", "config", "workload", "quality")
        # The names say which row is which: never cut them ("max-num-se..." for both configs of the demo); the
        # numeric columns' headers wrap instead. Capped so one long label cannot take the table.
        width = min(40, max(len(str(r[c])) for r in rows)) if c in ("runtime", "config", "workload") else None
        t.add_column(c, justify="left" if text else "right", min_width=width, overflow="fold")
    for r in rows:
        t.add_row(*r.values())
    Console(width=table_width()).print(t)


def latest_sweep_id(db_path: Path) -> str | None:
    """The most recently started sweep in the warehouse, or None when it has none."""
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        row = con.execute("SELECT sweep_id FROM sweeps ORDER BY started_at DESC LIMIT 1").fetchall()
    finally:
        con.close()
    return row[0][0] if row else None


def trial_facts_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """The facts of one trial as a short markdown text (the description of its table artifact): config label,
    config key with its full settings (:func:`settings_text`), runtime, vLLM version, device, status with the
    failure class and reason (shortened at a word boundary), boot seconds and compile cache. Input: the tables
    of one result bundle (``tunelab.core.bundle.read_bundle``)."""
    t = tables["trial"].iloc[0]

    def g(k: str) -> Any:
        v = t.get(k)
        return None if v is None or (isinstance(v, float) and pd.isna(v)) else v

    gpu = f"{g('gpu_name')}{'' if g('gpu_index') is None else ' #' + str(int(g('gpu_index')))}"
    status = f"**{g('status')}**" + (f" ({g('failure_class')}: {shorten(g('failure_reason'), 240)})"
                                     if g("failure_class") or g("failure_reason") else "")
    return "\n".join([
        f"config **{g('config_label')}** = key `{g('config_key')}`: `{settings_text(g('engine_args'), g('env'))}`",
        "",
        f"runtime `{g('runtime_name')}` · vLLM {g('vllm_version') or '?'} · {gpu} · {status} · boot "
        f"{'-' if g('boot_s') is None else format(g('boot_s'), '.1f')} s · compile cache {g('compile_cache') or '-'}",
        *(["", f"eager re-boot (the config once more with only --enforce-eager): {g('eager_diagnosis')}"]
          if g("eager_diagnosis") else []),
    ])


def trial_table(tables: dict[str, pd.DataFrame]) -> list[dict[str, str]]:
    """The table a person sees for one trial in the Prefect UI: one row per measured window (workload x load
    level x repeat) with throughput and latency percentiles in ms; the trial's facts are in
    :func:`trial_facts_markdown` (the artifact's description), not repeated in every row. A trial without
    measurements gives one row with its status and failure class (its reason is in the description).
    Input: the tables of one result bundle (``tunelab.core.bundle.read_bundle``)."""
    t = tables["trial"].iloc[0]

    def g(k: str) -> Any:
        v = t.get(k)
        return None if v is None or (isinstance(v, float) and pd.isna(v)) else v

    meas = tables.get("measurements")
    if meas is None or meas.empty:
        # The reason is in the description (trial_facts_markdown): a table cell does not wrap in the Prefect UI.
        return [{"status": str(g("status")), "failure": str(g("failure_class") or "")}]
    rows = []

    def ms(x: Any) -> str:
        return "-" if x is None or pd.isna(x) else f"{x * 1000:.1f}"

    for _, m in meas.sort_values(["workload", "load_kind", "load_value", "repeat"]).iterrows():
        rows.append({
            "workload": str(m["workload"]),
            "load": load_label(m["load_kind"], m["load_value"]),
            "repeat": int(m["repeat"]),
            "output tok/s": "-" if pd.isna(m.get("output_tokens_per_s")) else f"{m['output_tokens_per_s']:.1f}",
            "TTFT p50 ms": ms(m.get("ttft_p50_s")), "TPOT p50 ms": ms(m.get("tpot_p50_s")),
            "ITL p50 ms": ms(m.get("itl_p50_s")), "E2EL p95 ms": ms(m.get("e2el_p95_s")),
            "completed": int(m.get("completed") or 0), "failed": int(m.get("failed") or 0),
        })
    return rows


def quality_summary(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str) -> dict[str, Any]:
    """How many trials of a sweep pass / warn / fail / are unvalidated, and why.

    Returns a dict: ``counts`` ({verdict: trials}, every verdict of :data:`VERDICT_ORDER` present, 0 if none),
    ``reasons`` (DataFrame: severity, suite, expectation, trials, which (its trials as ``config rN``, with
    `` on <runtime>`` when the sweep ran on several runtimes: :func:`trial_name`; the check's
    outcome there is its severity, not the trial's verdict: :func:`quality_check_lines` words it),
    example observed / threshold / detail: one row per quality check that failed in at least one trial, from
    ``quality_checks``),
    ``unvalidated`` (DataFrame: trial_id, config, status, failure_class, failure_reason: why a trial was
    not validated: it did not measure, or validation itself could not run), ``rule_versions`` (the quality rule
    versions stamped on the sweep's ``quality_checks`` rows, None for unversioned rows), ``shape_checks`` (lines
    saying which of the sweep's shape checks ran, which were skipped and why: ``shape_checks.shape_check_lines``;
    empty for a sweep without shape rows).
    Opens the DuckDB file read-only, or reads an open connection as :func:`comparison_frame` does."""
    with _reader(db_path) as con:
        by_runtime = names_runtime(con, sweep_id)
        counts = dict(con.execute(
            "SELECT coalesce(quality_verdict, 'unvalidated'), count(*) FROM trials WHERE sweep_id = ? GROUP BY 1",
            [sweep_id]).fetchall())
        # One row per check (not per check and trial verdict: a warn check that failed in a trial judged fail
        # and in one judged warn was two rows with one example), naming its trials.
        reasons = con.execute(
            """SELECT q.severity, q.suite, q.expectation,
                      count(DISTINCT q.trial_id) AS trials,
                      -- the trials only: the trial's own verdict beside a check that only warned read as if
                      -- the check had failed it (a warn check in a trial that another check failed)
                      string_agg(DISTINCT t.config_label || ' r' || t.replicate
                                          || CASE WHEN $by_runtime THEN ' on ' || t.runtime_name ELSE '' END, ', '
                                 ORDER BY t.config_label || ' r' || t.replicate
                                          || CASE WHEN $by_runtime THEN ' on ' || t.runtime_name ELSE '' END) AS which,
                      any_value(q.observed) AS observed, any_value(q.threshold) AS threshold,
                      any_value(q.detail) AS detail
               FROM quality_checks q JOIN trials t USING (trial_id)
               WHERE t.sweep_id = $sweep_id AND q.success = false
               GROUP BY ALL ORDER BY q.severity, trials DESC, q.expectation""",
            {"sweep_id": sweep_id, "by_runtime": by_runtime}).fetchdf()
        # The rule versions that judged the sweep (quality_thresholds.RULE_VERSIONS; NULL: unversioned rows).
        has_version = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'quality_checks' "
                                  "AND column_name = 'rule_version'").fetchone()[0]
        versions = [r[0] for r in con.execute(
            "SELECT DISTINCT q.rule_version FROM quality_checks q JOIN trials t USING (trial_id) WHERE t.sweep_id = ? "
            "ORDER BY 1 NULLS FIRST", [sweep_id]).fetchall()] if has_version else [None]
        # The sweep's shape checks (tasks.quality.shape_checks): which ran, which were skipped and why.
        shape = con.execute(
            """SELECT DISTINCT q.expectation, q.success, q.detail FROM quality_checks q JOIN trials t USING (trial_id)
               WHERE t.sweep_id = ? AND q.suite = 'sweep_shape'""", [sweep_id]).fetchdf()
        plan_yaml = con.execute("SELECT plan_yaml FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchone()
        unval = con.execute(
            """SELECT trial_id, config_label AS config, status, failure_class, failure_reason
               FROM trials WHERE sweep_id = ? AND coalesce(quality_verdict, 'unvalidated') = 'unvalidated'
               ORDER BY trial_id""", [sweep_id]).fetchdf()
    full = {v: int(counts.pop(v, 0)) for v in VERDICT_ORDER}
    full.update({k: int(v) for k, v in counts.items()})
    from tunelab.tasks.quality.shape_checks import shape_check_lines
    from tunelab.warehouse.sweep_anchor import plan_anchor

    # No shape rows at all: a sweep judged before rule v4 (or nothing measured): no lines rather than "not run".
    shape_lines = shape_check_lines(shape, plan_anchor(plan_yaml[0] if plan_yaml else None) is not None) \
        if len(shape) else []
    return {"counts": full, "reasons": reasons, "unvalidated": unval, "rule_versions": versions,
            "shape_checks": shape_lines}


#: How a check that did not pass reads, by its severity: a warn check warned (the trial's verdict is at most
#: ``warn`` by it), a fail check failed the trial.
_OUTCOME = {"warn": "warned", "fail": "failed"}


def quality_check_lines(q: dict[str, Any]) -> list[str]:
    """One line per check of :func:`quality_summary`'s ``reasons`` that did not pass: the check, what it did by
    its own severity (``warned`` / ``failed``; never the trial's overall verdict, which another check may have
    decided), in how many trials and which (``config rN``), and an example observed value and threshold.
    Shown by ``tunelab report`` and logged by the sweep."""
    return [f"quality check {r.suite}/{r.expectation} {_OUTCOME.get(r.severity, 'did not pass')} "
            f"(severity {r.severity}) in {int(r.trials)} trial(s): {r.which}; e.g. observed {r.observed}, "
            f"threshold {r.threshold}" for r in q["reasons"].itertuples(index=False)]


def quality_terminal_lines(q: dict[str, Any]) -> list[str]:
    """What ``tunelab report`` prints of :func:`quality_summary` under the comparison: the counts and the quality
    rule version(s) that judged the sweep (as the markdown's Quality section names them), then
    :func:`quality_check_lines` and the shape-check lines."""
    from tunelab.core.quality_thresholds import rule_version_label

    head = "quality: " + ", ".join(f"{k} {v}" for k, v in q["counts"].items())
    if q.get("rule_versions"):
        head += ("; judged by quality rules " + ", ".join(rule_version_label(v) for v in q["rule_versions"])
                 + " (docs/quality.md, 'Rule versions'; `tunelab recheck` re-judges with today's)")
    return [head, *quality_check_lines(q), *q.get("shape_checks", [])]


def sweep_quality_markdown(q: dict[str, Any]) -> str:
    """Markdown of :func:`quality_summary`: the counts, the failed checks and the unvalidated trials.

    Cells stay short (the Prefect UI does not wrap table cells: a 160-character detail pushed the threshold off
    a 1600 px window): observed and threshold are shortened at a word boundary, the check's detail is left to
    ``quality_checks`` and docs/quality.md, a failure reason to 60 characters (``tunelab report`` and the HTML
    report give it whole)."""
    c = q["counts"]
    lines = ["## Quality", "", " | ".join(f"**{k}** {v}" for k, v in c.items()), ""]
    if q.get("rule_versions"):
        from tunelab.core.quality_thresholds import rule_version_label

        lines += ["Judged by quality rules " + ", ".join(rule_version_label(v) for v in q["rule_versions"])
                  + " (docs/quality.md, 'Rule versions'; `tunelab recheck` re-judges with today's)", ""]
    if q.get("shape_checks"):
        lines += [f"- {x}" for x in q["shape_checks"]] + [""]
    if len(q["reasons"]):
        lines += ["Checks that did not pass (severity fail decides `fail`, warn decides `warn`; see docs/quality.md):", ""]
        lines += markdown_table([{
            "severity": r.severity, "check": f"{r.suite}/{r.expectation}", "trials": int(r.trials),
            # shortened at a word boundary: a cell never ends mid-word (the whole text is in quality_checks)
            "observed": shorten(r.observed, 48), "threshold": shorten(r.threshold, 32),
        } for r in q["reasons"].itertuples(index=False)])
        lines.append("")
    if len(q["unvalidated"]):
        lines += ["Unvalidated trials (not measured, or validation could not run):", ""]
        lines += markdown_table([{
            "trial": f"`{r.trial_id.split('/', 1)[-1]}`", "config": r.config, "status": r.status,
            "why": f"{'' if pd.isna(r.failure_class) else r.failure_class} "
                   f"{shorten(r.failure_reason, 60)}".strip(),
        } for r in q["unvalidated"].itertuples(index=False)])
        lines.append("")
    return "\n".join(lines)


def bottleneck_findings(db_path: Path | duckdb.DuckDBPyConnection, sweep_id: str) -> pd.DataFrame:
    """The flagged bottleneck findings of a sweep's windows (view ``window_findings``, table ``window_diagnoses``;
    checks in ``tunelab.core.bottleneck_rules``): columns config_label, replicate, workload, load_kind, load_value, repeat,
    bottleneck, metric, value, threshold, summary, remedy, runtime_name and trial (the trial's name,
    :func:`trial_name`: with its runtime when the sweep ran on several); one row per window and finding. Empty for
    a warehouse older than schema version 16. Opens the DuckDB file read-only, or reads an open connection."""
    with _reader(db_path) as con:
        try:
            df = con.execute(
                """SELECT f.config_label, f.replicate, f.workload, f.load_kind, f.load_value, f.repeat, f.bottleneck,
                          f.metric, f.value, f.threshold, f.summary, f.remedy, t.runtime_name
                   FROM window_findings f JOIN trials t USING (trial_id) WHERE f.sweep_id = ?
                   ORDER BY f.config_label, f.replicate, t.runtime_name, f.workload, f.load_kind, f.load_value,
                            f.repeat, f.bottleneck""", [sweep_id]).fetchdf()
        except duckdb.CatalogException:
            return pd.DataFrame(columns=["config_label", "replicate", "workload", "load_kind", "load_value", "repeat",
                                         "bottleneck", "metric", "value", "threshold", "summary", "remedy",
                                         "runtime_name", "trial"])
        by_runtime = names_runtime(con, sweep_id)
    df["trial"] = [trial_name(r.config_label, r.replicate, r.runtime_name if by_runtime else None)
                   for r in df.itertuples(index=False)]
    return df


def bottlenecks_markdown(findings: pd.DataFrame) -> str:
    """Markdown of :func:`bottleneck_findings`: one line per window with a finding (the trial's name, config and
    boot with its runtime where the sweep ran on several: column ``trial``; workload, load, repeat: bottleneck, its
    evidence figures, the remedy to try), or a line saying no window had one."""
    lines = ["## Bottlenecks (docs/measurement.md, \"Bottleneck diagnosis\")", ""]
    if findings is None or not len(findings):
        return "\n".join(lines + ["No window showed a bottleneck the checks know (api_server, kv_cache, "
                                   "prefill_interference, client, gpu_floor)."])
    for r in findings.itertuples(index=False):
        name = getattr(r, "trial", None) or trial_name(r.config_label, r.replicate)  # records of an older summary
        where = f"{name} {r.workload} {load_label(r.load_kind, r.load_value)} #{int(r.repeat) + 1}"
        lines.append(f"- **{r.bottleneck}** {where}: {r.summary}. Try: {r.remedy}")
    return "\n".join(lines)


def png_data_uri(path: Path | str) -> str:
    """A PNG file as a ``data:image/png;base64,...`` URI: an image that travels inside a markdown artifact or an
    HTML file (the Prefect UI cannot open a ``file://`` link to the sweep host's disk)."""
    import base64

    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def sweep_markdown(df: pd.DataFrame, sweep_id: str, statuses: list[dict] | None, quality: dict[str, Any] | None,
                   plots: list[Path] | None = None, interleave: str | None = None,
                   config_settings: dict[str, str] | None = None, findings: pd.DataFrame | None = None) -> str:
    """The sweep report (a Prefect markdown artifact): trials with device, status, boot time, compile cache
    and verdict, in the order they ran; the config keys with their full settings (``config_settings``:
    config_key -> :func:`settings_text`); the quality summary; the bottlenecks found (``findings``:
    :func:`bottleneck_findings`, one line per window and finding); the comparison tables; the plots embedded as
    data-URI images (they show in the Prefect UI and in any copy of the text), each with its path on the
    sweep host."""
    lines = [f"# tunelab sweep `{sweep_id}`", ""]
    if statuses:
        if interleave:
            lines += [f"Trials in run order ({interleave}; replicates = boots per config):", ""]
        # Two narrow tables, the Prefect UI does not wrap cells (reports.artifacts): the outcome first, with the
        # failure's cause (cut at a word boundary; whole in `tunelab report --json`), then where and how it booted.
        lines += markdown_table([{
            "#": i + 1, "config": s["config"], "status": s["status"],
            "why": ": ".join(x for x in (shorten(s.get("failure_class")), shorten(s.get("failure_reason"), 90)) if x),
            "verdict": s.get("verdict") or "",
        } for i, s in enumerate(statuses)])
        lines += [""] + markdown_table([{
            "#": i + 1, "key": f"`{s.get('config_key', '')}`", "runtime": s["runtime"],
            "boot": f"r{s.get('replicate', '')}", "device": s.get("device", ""),
            "boot s": "" if s.get("boot_s") is None or pd.isna(s.get("boot_s")) else f"{s['boot_s']:.1f}",
            "compile cache": s.get("compile_cache") or "",
        } for i, s in enumerate(statuses)])
        lines.append("")
    if config_settings:
        lines += ["## Config keys (full settings; a label names only what varies in its plan)", ""]
        labels: dict[str, str] = {}
        for s in statuses or []:
            labels.setdefault(str(s.get("config_key", "")), str(s.get("config", "")))
        lines += markdown_table([{"key": f"`{k}`", "label": labels.get(k, ""), "settings": f"`{v}`"}
                                 for k, v in config_settings.items()])
        lines.append("")
    if quality is not None:
        lines += [sweep_quality_markdown(quality), ""]
    if findings is not None:
        lines += [bottlenecks_markdown(findings), ""]
    if df.attrs.get("sla_search"):
        lines += [sla_search_markdown(df.attrs["sla_search"]), ""]
    body = comparison_markdown(df, sweep_id).split("\n", 2)[2]  # without its title
    if df.attrs.get("left_out"):
        body = "\n".join(f"- {x}" for x in left_out_lines(df.attrs["left_out"])) + "\n\n" + body
    lines.append(body)
    if plots:
        lines += ["", "## Plots", ""]
        for p in plots:
            p = Path(p)
            lines += ([f"![{p.name}]({png_data_uri(p)})", ""] if p.exists() else []) + [f"`{p}`", ""]
    return "\n".join(lines)


def _sel(sel: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sel.items())


def ab_markdown(df: pd.DataFrame, baseline: dict, candidate: dict, title: str | None = None) -> str:
    """Markdown of ``warehouse.compare.compare``'s result: one row per workload and load level with both
    means, the relative difference and its confidence interval, the boots per side, the minimum detectable
    effect (MDE, 80 % power) and the verdict; then the method and the trials left out."""
    metric = df["metric"].iloc[0] if len(df) else "?"
    lines = [f"# {title or 'A/B comparison'}: `{metric}`", "",
             f"- baseline: `{_sel(baseline)}`", f"- candidate: `{_sel(candidate)}`", ""]
    if df.empty:
        lines.append("_no measurements match both selectors_")
    else:
        def pct(x: Any) -> str:
            return "-" if pd.isna(x) else f"{x * 100:+.1f}%"

        def welch(r: Any) -> str:
            lo, hi = getattr(r, "welch_ci_low", None), getattr(r, "welch_ci_high", None)
            return "-" if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else f"[{lo:+.4g}, {hi:+.4g}]"

        by_config = "config_key" in df.columns and (df["config_key"].astype(str) != "").any()
        # The plain Welch interval on boot means beside the product's (what the method adds is then visible), in
        # the metric's unit as the A/B lines give it (reports.design_plan._welch_text): as a percentage it fell
        # below -100 % on 2-3 boots.
        has_welch = "welch_ci_low" in df.columns and df["welch_ci_low"].notna().any()
        lines += markdown_table([{
            **({"config": f"{r.config_label} `{r.config_key}`"} if by_config else {}),
            "workload": r.workload,
            "load": load_label(r.load_kind, r.load_value),
            "baseline": "-" if pd.isna(r.baseline_mean) else f"{r.baseline_mean:.4g}",
            "candidate": "-" if pd.isna(r.candidate_mean) else f"{r.candidate_mean:.4g}",
            "change": pct(r.rel_diff), "CI": f"[{pct(r.rel_ci_low)}, {pct(r.rel_ci_high)}]",
            **({f"Welch on boot means ({metric_unit(metric) or 'metric unit'})": welch(r)} if has_welch else {}),
            "boots": f"{r.baseline_boots} vs {r.candidate_boots}",
            # The resolution of the verdict: effects smaller than this could not have been seen (80 % power).
            "MDE": "-" if pd.isna(getattr(r, "mde_rel", None)) else mde_text(r.mde_rel),
            "verdict": f"**{r.verdict}**", "why": r.reason,
            # The headline: Holm-adjusted over the report's family (stats.family); the verdict before it is per cell.
            **({"headline": f"**{r.family_verdict}**" + (" (secondary)" if r.family_role == "secondary" else "")}
               if "family_verdict" in df.columns else {}),
            **({"tokens": r.token_change} if "token_change" in df.columns and (df["token_change"] != "").any() else {}),
        } for r in df.itertuples(index=False)])
    lines += ["", f"Method: {df.attrs.get('method', '')}"]
    if "welch_ci_low" in df.columns and df["welch_ci_low"].notna().any():
        lines += ["", f"Welch on boot means: the plain Welch t interval of candidate - baseline on the boots' means, "
                      f"per cell, in the unit of `{metric}` (nothing borrowed across cells or history), beside CI, "
                      "the product's interval of the change"]
    if df.attrs.get("family"):
        lines += ["", f"Verdicts: {df.attrs['family']}"]
    if "token_change" in df.columns and (df["token_change"] != "").any():
        lines += ["", "Token counts differ between the sides (not the same work; the change is partly the "
                      "workload's): " + "; ".join(f"{r.workload} {load_label(r.load_kind, r.load_value)}: "
                                                  f"{r.token_change}" for r in df.itertuples(index=False)
                                                  if r.token_change)]
    ex = df.attrs.get("excluded")
    if ex is not None and len(ex):
        lines += ["", "Trials left out:", ""] + markdown_table(ex.to_dict("records"))
    na = df.attrs.get("not_applied")
    if na is not None and len(na):
        lines += ["", "Boots whose vLLM reported these env vars as unknown (not applied; from the boot log):", ""]
        lines += markdown_table(na.to_dict("records"))
    return "\n".join(lines)


def regressions_markdown(df: pd.DataFrame, only_flagged: bool = True) -> str:
    """Markdown of ``warehouse.compare.regressions``: the points flagged ``regression`` or
    ``violation_unconfirmed`` (all points with ``only_flagged=False``), with the method."""
    lines = ["## Regressions along vLLM versions", ""]
    d = df[df["status"].isin(["regression", "violation_unconfirmed"])] if only_flagged else df
    if d.empty:
        lines.append(f"_none flagged over {df[['config_key', 'workload', 'load_kind', 'load_value']].drop_duplicates().shape[0]} "
                     f"series and {len(df)} points_")
    else:
        lines += markdown_table([{
            "config": r.config_key, "gpu": r.gpu_name, "workload": r.workload,
            "load": load_label(r.load_kind, r.load_value), "version": r.point, "baseline": r.baseline_point,
            "change": "-" if pd.isna(r.rel_change) else f"{r.rel_change * 100:+.1f}%", "boots": r.boots,
            "status": f"**{r.status}**",
        } for r in d.itertuples(index=False)])
    lines += ["", f"Method: {df.attrs.get('method', '')}"]
    return "\n".join(lines)
