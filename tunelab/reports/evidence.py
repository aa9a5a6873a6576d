"""Evidence reports: rebuild a warehouse from exported Parquet files and write a self-contained report
(markdown + PNG) with the sweep's comparison table, boot facts, boot failures and A/B verdicts.

Used for runs kept in the repository (``evidence/<run>/warehouse/*.parquet``, written by
``tunelab export``): anyone can re-create the numbers from the committed files with
``tunelab evidence-report evidence/<run>`` — or with plain SQL, since every table is one Parquet file
(``SELECT * FROM 'evidence/<run>/warehouse/measurements.parquet'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from tunelab.core.markdown import markdown_table
from tunelab.warehouse.migrate import connect

__all__ = ["warehouse_from_parquet", "evidence_report"]

_SKIP = {"schema_migrations", "loaded_bundles"}


def warehouse_from_parquet(parquet_dir: Path, db_path: Path, *more_dirs: Path) -> Path:
    """Create a fresh warehouse at ``db_path`` (current schema and views) and insert every
    ``<table>.parquet`` of ``parquet_dir`` into the table of that name, by column name; then the same for each
    of ``more_dirs`` (exports of other runs, e.g. a later sweep on another host: their trials join the history).

    Raises:
        FileNotFoundError: no Parquet files in ``parquet_dir`` or in one of ``more_dirs`` (names it).
        duckdb.ConstraintException: two exports hold the same trial (the same run exported twice).
    """
    dirs = [Path(parquet_dir), *map(Path, more_dirs)]
    found = [sorted(d.glob("*.parquet")) for d in dirs]
    for d, files in zip(dirs, found):
        if not files:
            raise FileNotFoundError(f"no <table>.parquet files in {d} (made by `tunelab export --out DIR`)")
    db_path = Path(db_path)
    if db_path.exists():
        db_path.unlink()
    con = connect(db_path)
    try:
        con.execute("BEGIN")
        for files in found:
            for f in files:
                if f.stem in _SKIP:
                    continue
                con.execute(f"INSERT INTO {f.stem} BY NAME SELECT * FROM read_parquet('{f}')")
        con.execute("COMMIT")
    finally:
        con.close()
    return db_path


def _ab_sections(db: Path, plan: str, sweep_ids: list[str], baseline_label: str,
                 metrics: tuple[str, ...]) -> list[str]:
    """A/B sections for the sweeps of one plan, pooled (each sweep adds boots of the same configs):
    every config against ``baseline_label`` on each runtime, then, when the plan ran several runtimes, each
    config on every later vLLM version against the oldest (PEP 440 order)."""
    from tunelab.warehouse.selection import compare_frames
    from tunelab.reports.report import ab_markdown

    con = duckdb.connect(str(db), read_only=True)
    try:
        sel = {"sweep_id": sweep_ids}
        rows = con.execute("""
            SELECT runtime_name, config_label FROM trial_facts
            WHERE sweep_id IN (SELECT unnest(?::VARCHAR[])) AND status = 'ok'
            GROUP BY ALL ORDER BY max(vllm_version_key), min(run_at)""", [sweep_ids]).fetchall()
        runtimes = list(dict.fromkeys(r for r, _ in rows))
        configs = list(dict.fromkeys(c for _, c in rows))
        pooled = f"{len(sweep_ids)} sweeps of plan `{plan}` pooled" if len(sweep_ids) > 1 else f"plan `{plan}`"
        out: list[str] = []

        def section(title: str, b: dict, c: dict, label_b: dict, label_c: dict) -> None:
            for m in metrics:
                df = compare_frames(con, {**sel, **b}, {**sel, **c}, metric=m, per_config=False)
                if len(df):
                    out.extend(["", ab_markdown(df, label_b, label_c, title=title).replace("# ", "#### ", 1)])

        if baseline_label in configs:
            out += ["", f"## A/B verdicts: each config against `{baseline_label}` ({pooled})"]
            for rt in runtimes:
                for other in [c for c in configs if c != baseline_label]:
                    out += ["", f"### {other} vs {baseline_label} on {rt}"]
                    section(f"{other} vs {baseline_label} on {rt}",
                            {"runtime_name": rt, "config_label": baseline_label},
                            {"runtime_name": rt, "config_label": other},
                            {"runtime": rt, "config": baseline_label}, {"runtime": rt, "config": other})
        if len(runtimes) > 1:
            out += ["", f"## Across vLLM versions: the same config on {' vs '.join(runtimes)} ({pooled})"]
            for cfg in configs:
                for rt in runtimes[1:]:
                    out += ["", f"### {cfg}: {rt} vs {runtimes[0]}"]
                    section(f"{cfg}: {rt} vs {runtimes[0]}",
                            {"runtime_name": runtimes[0], "config_label": cfg},
                            {"runtime_name": rt, "config_label": cfg},
                            {"runtime": runtimes[0], "config": cfg}, {"runtime": rt, "config": cfg})
        return out
    finally:
        con.close()


def evidence_report(run_dir: Path, baseline_label: str = "default",
                    metrics: tuple[str, ...] = ("output_tokens_per_s", "ttft_p50_s", "tpot_p50_s"),
                    keep_db: Path | None = None) -> Path:
    """Write ``run_dir/report.md`` and PNG plots from ``run_dir/warehouse/*.parquet`` (or ``run_dir/*.parquet``, the
    folder ``tunelab export --out`` wrote, when there is no ``warehouse/`` in it).

    For every sweep with measurements: the comparison table (``reports.report``), the latency-vs-throughput plot
    (``reports.plots``); per plan (its sweeps pooled), for every other config an A/B against ``baseline_label`` on
    each runtime and, when the plan ran several vLLM versions, each config across versions, per metric
    (warehouse.compare: repeats averaged per boot, Welch interval across boots; ``not_applied`` when vLLM
    ignored the compared env var). For every trial: boot time, compile cache, quality verdict, env vars not
    applied; for failed boots: failure class, reason and the eager diagnosis.
    ``keep_db``: also keep the warehouse built from the Parquet there (for ``tunelab compare --db`` etc.);
    by default it is a temporary file in ``run_dir``, removed afterwards. Returns the report's path.
    """
    from tunelab.reports.plots import latency_throughput_plot, version_plot
    from tunelab.reports.report import comparison_frame, comparison_markdown

    run_dir = Path(run_dir)
    # `tunelab export --out DIR` writes DIR/*.parquet; an evidence folder keeps them in DIR/warehouse/. Both are read
    # (found by a fresh user: export then evidence-report on the same DIR failed).
    parquet = run_dir / "warehouse"
    if not parquet.is_dir() and any(run_dir.glob("*.parquet")):
        parquet = run_dir
    db = warehouse_from_parquet(parquet, Path(keep_db) if keep_db else run_dir / ".report.duckdb")
    lines: list[str] = []
    try:
        con = duckdb.connect(str(db), read_only=True)
        sweeps = con.execute("SELECT sweep_id, plan_name, host, started_at FROM sweeps ORDER BY started_at").fetchall()
        trials = con.execute("""
            SELECT sweep_id, right(sweep_id, 4) AS sweep, config_label AS config, config_key, replicate AS boot, runtime_name AS runtime,
                   vllm_version, gpu_name, status, failure_class, round(boot_s, 1) AS boot_s, compile_cache,
                   round(teardown_s, 2) AS teardown_s, quality_verdict AS quality, eager_diagnosis,
                   CASE WHEN json_array_length(env_not_applied) > 0 THEN CAST(env_not_applied AS VARCHAR) END
                       AS env_not_applied
            FROM trials ORDER BY started_at""").df()
        phases = con.execute("""
            SELECT right(t.sweep_id, 4) AS sweep, t.runtime_name AS runtime, t.config_label AS config,
                   t.replicate AS boot, p.phase, round(p.seconds, 2) AS seconds,
                   round(p.gib, 2) AS gib, p.tokens
            FROM boot_phases p JOIN trials t USING (trial_id)
            WHERE p.phase IN ('torch_compile', 'graph_capture', 'model_load', 'kv_cache', 'init_engine')
            ORDER BY t.started_at, p.phase""").df()
        failures = con.execute("""
            SELECT config_label AS config, failure_class, eager_diagnosis, substr(failure_reason, 1, 300) AS reason
            FROM trials WHERE status <> 'ok' ORDER BY started_at""").df()
        quality = con.execute("""
            SELECT right(t.sweep_id, 4) AS sweep, t.runtime_name AS runtime, t.config_label AS config,
                   t.replicate AS boot, q.suite, q.expectation, q.severity, q.observed, q.threshold
            FROM quality_checks q JOIN trials t USING (trial_id) WHERE q.success = false
            ORDER BY t.started_at, q.suite""").df()
        con.close()
        lines += ["# tunelab evidence report", "",
                  "Generated by `tunelab evidence-report` from the Parquet files in `warehouse/` "
                  "(exported with `tunelab export`). Every number below can be recomputed from them.", ""]
        for sid, plan, host, started in sweeps:
            lines += [f"- sweep `{sid}`: plan `{plan}`, started {started}"]
        lines += ["", "## Trials (boots)", ""] + markdown_table(trials.drop(columns=["sweep_id"]))
        lines += ["", "## Boot phases (parsed from each boot log)", ""] + markdown_table(phases)
        if not failures.empty:
            lines += ["", "## Boot failures (a result, not a crash of the sweep)", ""] + markdown_table(failures)
        by_plan: dict[str, list[str]] = {}
        for sid, plan, *_ in sweeps:
            by_plan.setdefault(plan, []).append(sid)
        for sid, *_ in sweeps:
            comp = comparison_frame(db, sid)
            if comp.empty:
                continue
            lines += ["", comparison_markdown(comp, sid).replace("# tunelab sweep", "## Sweep", 1)]
            png = latency_throughput_plot(db, sid, run_dir)
            if png is not None:
                lines += ["", f"![latency vs throughput]({Path(png).name})"]
        con = duckdb.connect(str(db), read_only=True)
        n_versions = con.execute("SELECT count(DISTINCT vllm_version) FROM trials WHERE status = 'ok'").fetchall()[0][0]
        con.close()
        if n_versions > 1:  # the longitudinal view: each config's boot means along vLLM versions
            lines += ["", "## Plots along vLLM versions (mean of boot means; bars = boot-to-boot SD; a config "
                      "whose env var was not applied on a release is plotted there as it ran)", ""]
            for m in ("output_tokens_per_s", "ttft_p50_s"):
                png = version_plot(db, run_dir, m)
                if png is not None:
                    lines += [f"![{m} across vLLM versions]({Path(png).name})", ""]
        for plan, sids in by_plan.items():
            lines += _ab_sections(db, plan, sids, baseline_label, metrics)
        lines += ["", "## Quality checks that did not pass", ""] + markdown_table(quality)
    finally:
        if not keep_db:
            Path(db).unlink(missing_ok=True)
            Path(str(db) + ".wal").unlink(missing_ok=True)
    out = run_dir / "report.md"
    notes = run_dir / "NOTES.md"
    if notes.exists():  # the human-written part: what the numbers mean and do not mean
        lines = [notes.read_text().rstrip(), "", "---", ""] + lines
    out.write_text("\n".join(lines) + "\n")
    return out
