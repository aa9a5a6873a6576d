"""Compare two tunelab warehouses made by the same plan, table by table: does a change keep the rows?

Used for issue 13's done-when check ("the same plan gives the same warehouse rows before and after"): run a
plan (``experiments/demo.yaml``) into one warehouse before a refactor and into another after it, then

    python benchmarks/compare_warehouses.py BEFORE.duckdb AFTER.duckdb

It prints, and exits 1 when a check that must hold does not:

1. tables and views: the names only in one side;
2. columns per table: those only in one side (new columns of later migrations are expected in AFTER only);
3. row counts per table, and per (config_key, workload, load level) for the tables of a window
   (measurements, requests, server_metrics) or per config_key (trials, boot_phases, quality_checks, ...);
4. values: the rows of both sides aligned on their natural key (config_key, runtime, replicate, and per
   table workload, load level, repeat, request_index, metric, phase, suite/expectation...; an n-th
   occurrence number where a key repeats), then every column in both sides compared cell by cell, except
   ids (they embed the sweep's start time and token); the server command line, vLLM's effective config and
   the boot phases' notes are compared without the port, served-model-name token and checkout folder each
   boot picks anew. A column is either *deterministic* (must be equal:
   config_key, engine_args, env, statuses, counts such as output tokens per request, prompt lengths, quality
   check names...) or *varies by nature* (times, durations, rates, latencies, memory figures, anything
   derived from them); the second kind is reported with how many cells differ and never fails the check.

Only the standard library, duckdb and pandas.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any

import duckdb
import pandas as pd

#: Natural key of each table's rows, after the trial's (config_key, runtime_name, replicate).
KEYS: dict[str, tuple[str, ...]] = {
    "trials": (),
    "boot_phases": ("phase",),
    "measurements": ("workload", "load_kind", "load_value", "repeat"),
    "requests": ("workload", "load_kind", "load_value", "repeat", "request_index"),
    "server_metrics": ("workload", "load_kind", "load_value", "repeat", "metric", "kind"),
    "quality_checks": ("suite", "expectation"),
    "gpu_samples": ("gpu_index",),
}
#: Tables whose rows belong to a measured window: counted per (config_key, workload, load level).
WINDOW_TABLES = ("measurements", "requests", "server_metrics")
TRIAL_KEY = ("config_key", "runtime_name", "replicate")

#: Ids, or text made of them (the sweep id holds the start time): not compared.
ID_COLUMNS = {"sweep_id", "trial_id", "bundle_id", "bundle_path", "log_path", "sha256"}

#: Columns whose values vary from run to run by nature, beyond those typed DOUBLE/TIMESTAMP (which all do,
#: except the load level): the reason is printed with them.
VARIES = {
    "quality_checks.observed": "the measured value a check saw",
    "quality_checks.success": "a threshold check on measured values (noise can cross it)",
    "quality_checks.detail": "text with measured values",
    "trials.quality_verdict": "follows the checks on measured values",
    "trials.measurement_notes": "notes on measured windows (client-bound, lateness) with figures",
    "trials.load_avg_1m": "host load",
    "trials.compile_cache": "cold or warm: what earlier boots on the host left in the compile cache",
    "boot_phases.tokens": "KV cache size from free memory at boot",
    "measurements.peak_in_flight": "requests in flight at once: scheduling",
    "measurements.warmup_peak_in_flight": "the same during warm-up",
    "measurements.compile_during_window": "whether vLLM compiled during the window",
    "measurements.compile_log_lines": "log lines with times",
    "measurements.client_bound": "the client's evidence of its own lag",
    "server_metrics.count": "histogram counts of scraped timings (bucketed)",
    "loaded_bundles.rows_loaded": "includes server_metrics and gpu_samples rows, which vary",
    "sweeps.plan_yaml": "compared separately: the plan file's text",
}


def _served_name_dropped(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    cfg = json.loads(text)
    cfg.pop("served_model_name", None)
    return json.dumps(cfg, sort_keys=True)


#: Columns compared after taking out what each boot picks anew (a free port, a served-model-name token, the
#: folder the checkout ran from): what remains must be equal.
NORMALIZE = {
    "trials.command": lambda v: v if not isinstance(v, str) else re.sub(
        r"--served-model-name \S+", "--served-model-name X",
        re.sub(r"--port \d+", "--port N", re.sub(r"^\S+ -m vllm", "<runtime python> -m vllm", v))),
    "trials.effective_config": _served_name_dropped,
    "boot_phases.detail": lambda v: v if not isinstance(v, str) else re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:N", v),
}


def _load(con: duckdb.DuckDBPyConnection, db: str, table: str, columns: list[str]) -> pd.DataFrame:
    """The table's rows with the trial's key columns and ``_n`` (occurrence number within the full key)."""
    cols = ", ".join(f"t.{c}" for c in columns)
    if table in KEYS:
        extra = [c for c in TRIAL_KEY if c not in columns]
        key = [f"tr.{c}" if c in extra else f"t.{c}" for c in TRIAL_KEY] + [f"t.{c}" for c in KEYS[table]]
        join = "" if table == "trials" else f"JOIN {db}.trials tr ON tr.trial_id = t.trial_id"
        trcols = "".join(f", tr.{c}" for c in extra) if table != "trials" else ""
        q = (f"SELECT {cols}{trcols}, row_number() OVER (PARTITION BY {', '.join(key)} ORDER BY t.rowid) AS _n "
             f"FROM {db}.{table} t {join}")
    elif table == "loaded_bundles":
        q = (f"SELECT {cols}, tr.config_key, tr.runtime_name, tr.replicate, 1 AS _n FROM {db}.{table} t "
             f"JOIN {db}.trials tr ON tr.trial_id = t.bundle_id")
    elif table == "sweeps":
        q = f"SELECT {cols}, row_number() OVER (ORDER BY t.started_at) AS _n FROM {db}.{table} t"
    elif table == "schema_migrations":
        q = f"SELECT {cols}, 1 AS _n FROM {db}.{table} t"
    else:
        q = f"SELECT {cols}, row_number() OVER (ORDER BY t.rowid) AS _n FROM {db}.{table} t"
    return con.execute(q).df()


def _key_of(table: str) -> list[str]:
    if table in KEYS:
        return list(TRIAL_KEY) + list(KEYS[table]) + ["_n"]
    if table == "loaded_bundles":
        return list(TRIAL_KEY) + ["_n"]
    if table == "schema_migrations":
        return ["version"]
    return ["_n"]


def _same(a: Any, b: Any) -> bool:
    """Cell equality: missing equals missing, floats exactly, lists element-wise, JSON text as parsed."""
    a_na = a is None or (isinstance(a, float) and math.isnan(a)) or a is pd.NA or a is pd.NaT
    b_na = b is None or (isinstance(b, float) and math.isnan(b)) or b is pd.NA or b is pd.NaT
    if a_na or b_na:
        return a_na and b_na
    if hasattr(a, "__len__") and not isinstance(a, str) and hasattr(b, "__len__") and not isinstance(b, str):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and a != b and a[:1] in "[{" and b[:1] in "[{":
        try:
            return json.loads(a) == json.loads(b)
        except ValueError:
            return False
    return bool(a == b)


def _varies(table: str, col: str, sql_type: str) -> str | None:
    """Why ``table.col`` varies by nature, or None when it must be equal."""
    if f"{table}.{col}" in VARIES:
        return VARIES[f"{table}.{col}"]
    if col == "load_value":
        return None
    if sql_type in ("DOUBLE", "FLOAT", "DOUBLE[]") or sql_type.startswith("TIMESTAMP"):
        return f"{sql_type}: a time, duration, rate or measured amount"
    return None


def _columns(con: duckdb.DuckDBPyConnection, db: str) -> dict[str, dict[str, str]]:
    rows = con.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                       "WHERE database_name = ? AND schema_name = 'main' ORDER BY table_name, column_index",
                       [db]).fetchall()
    out: dict[str, dict[str, str]] = {}
    for t, c, ty in rows:
        out.setdefault(t, {})[c] = ty
    return out


def _kinds(con: duckdb.DuckDBPyConnection, db: str) -> dict[str, str]:
    tables = con.execute("SELECT table_name, 'table' FROM duckdb_tables() WHERE database_name = ? "
                         "AND schema_name = 'main'", [db]).fetchall()
    views = con.execute("SELECT view_name, 'view' FROM duckdb_views() WHERE database_name = ? "
                        "AND schema_name = 'main' AND NOT internal", [db]).fetchall()
    return dict(tables + views)


def _group_counts(con: duckdb.DuckDBPyConnection, db: str, table: str, cols: dict[str, str]) -> dict[tuple, int]:
    if table in WINDOW_TABLES:
        q = (f"SELECT tr.config_key, t.workload, t.load_kind, t.load_value, count(*) FROM {db}.{table} t "
             f"JOIN {db}.trials tr USING (trial_id) GROUP BY ALL")
    elif "trial_id" in cols:
        q = f"SELECT tr.config_key, count(*) FROM {db}.{table} t JOIN {db}.trials tr USING (trial_id) GROUP BY ALL"
    elif table == "loaded_bundles":
        q = (f"SELECT tr.config_key, count(*) FROM {db}.{table} t JOIN {db}.trials tr ON tr.trial_id = t.bundle_id "
             "GROUP BY ALL")
    else:
        return {}
    return {tuple(r[:-1]): r[-1] for r in con.execute(q).fetchall()}


def compare(before: str, after: str) -> int:
    """Print the comparison; returns the number of failed checks."""
    con = duckdb.connect()
    con.execute(f"ATTACH '{before}' AS b (READ_ONLY)")
    con.execute(f"ATTACH '{after}' AS a (READ_ONLY)")
    failures = 0
    print(f"before: {before}\nafter:  {after}\n")

    kb, ka = _kinds(con, "b"), _kinds(con, "a")
    only_b, only_a = sorted(set(kb) - set(ka)), sorted(set(ka) - set(kb))
    print(f"1. tables/views: {len(kb)} before, {len(ka)} after; only before: {only_b or '-'}; only after: {only_a or '-'}")
    failures += bool(only_b)

    cb, ca = _columns(con, "b"), _columns(con, "a")
    print("\n2. columns only in one side (expected: new columns of later migrations, in after only)")
    for t in sorted(set(cb) & set(ca)):
        ob, oa = [c for c in cb[t] if c not in ca[t]], [c for c in ca[t] if c not in cb[t]]
        typed = [c for c in cb[t] if c in ca[t] and cb[t][c] != ca[t][c]]
        if ob or oa or typed:
            print(f"   {t}: only before {ob or '-'}; only after {oa or '-'}"
                  + (f"; type changed {[(c, cb[t][c], ca[t][c]) for c in typed]}" if typed else ""))
        failures += bool(ob) + bool(typed)
    print("   (other tables and views: same columns)")

    tables = sorted(t for t in set(kb) & set(ka) if kb[t] == "table")
    print("\n3. row counts (before / after)")
    for t in tables:
        nb = con.execute(f"SELECT count(*) FROM b.{t}").fetchall()[0][0]
        na = con.execute(f"SELECT count(*) FROM a.{t}").fetchall()[0][0]
        gb, ga = _group_counts(con, "b", t, cb[t]), _group_counts(con, "a", t, ca[t])
        ok_groups = gb == ga
        flag = "" if nb == na and ok_groups else "  <-- differs"
        if t == "schema_migrations":
            flag = "  (more migrations after: expected)" if na >= nb else "  <-- fewer migrations after"
        print(f"   {t:18s} {nb:6d} / {na:6d}   groups: {len(gb)} / {len(ga)}, "
              f"{'same count in every group' if ok_groups else 'counts differ'}{flag}")
        if not ok_groups:
            for g in sorted(set(gb) | set(ga), key=str):
                if gb.get(g) != ga.get(g):
                    print(f"      {g}: {gb.get(g)} / {ga.get(g)}")
        if t != "schema_migrations" and flag:
            failures += 1

    print("\n4. values of the rows aligned on their key (ids left out)")
    deterministic_bad = 0
    for t in tables:
        common = [c for c in cb[t] if c in ca[t]]
        fb, fa = _load(con, "b", t, common), _load(con, "a", t, common)
        key = _key_of(t)
        m = fb.merge(fa, on=key, how="outer", suffixes=("__b", "__a"), indicator=True)
        # schema_migrations: versions only in after are the later migrations (section 3 counts them)
        lost = m["_merge"] == "left_only" if t == "schema_migrations" else m["_merge"] != "both"
        unmatched = int(lost.sum())
        m = m[m["_merge"] == "both"]
        equal, varied, bad = [], [], []
        for c in common:
            if c in key or c in ID_COLUMNS or (t == "sweeps" and c == "plan_yaml"):
                continue
            norm = NORMALIZE.get(f"{t}.{c}")
            if norm is not None:
                m[f"{c}__b"], m[f"{c}__a"] = m[f"{c}__b"].map(norm), m[f"{c}__a"].map(norm)
            n_diff = sum(not _same(x, y) for x, y in zip(m[f"{c}__b"], m[f"{c}__a"]))
            why = _varies(t, c, cb[t][c])
            if why is None and n_diff:
                bad.append((c, n_diff))
            elif why is not None:
                varied.append((c, n_diff, why))
            else:
                equal.append(c)
        print(f"   {t}: {len(m)} rows aligned, {unmatched} without a partner"
              f"{' (before)' if t == 'schema_migrations' else ''}; "
              f"{len(equal)} deterministic columns equal{', ' + str(len(bad)) + ' DIFFER' if bad else ''}")
        if equal:
            print(f"      equal: {', '.join(equal)}")
        for c, n, in bad:
            ex = m[[f"{c}__b", f"{c}__a"]][[not _same(x, y) for x, y in zip(m[f"{c}__b"], m[f"{c}__a"])]].head(2)
            print(f"      DIFFERS {c}: {n} of {len(m)} rows, e.g. {ex.values.tolist()}")
        if varied:
            print("      vary by nature (differing rows / aligned): "
                  + "; ".join(f"{c} {n}/{len(m)}" for c, n, _ in varied))
        deterministic_bad += len(bad) + bool(unmatched)
    failures += deterministic_bad

    pb = con.execute("SELECT plan_yaml FROM b.sweeps").fetchall()
    pa = con.execute("SELECT plan_yaml FROM a.sweeps").fetchall()
    same_plan = [r[0] for r in pb] == [r[0] for r in pa]
    print(f"\n   sweeps.plan_yaml: {'the same plan text' if same_plan else 'the plan texts differ'}")
    failures += not same_plan

    # A few headline figures of the varying kind, so a reader sees the run-to-run spread.
    q = """SELECT tr.config_label, m.workload, m.load_kind || '=' || m.load_value::INT AS load,
                  avg(m.output_tokens_per_s) AS tok_s, avg(m.ttft_p50_s) * 1000 AS ttft_ms,
                  avg(m.tpot_p50_s) * 1000 AS tpot_ms
           FROM {db}.measurements m JOIN {db}.trials tr USING (trial_id) GROUP BY ALL ORDER BY ALL"""
    hb, ha = con.execute(q.format(db="b")).df(), con.execute(q.format(db="a")).df()
    h = hb.merge(ha, on=["config_label", "workload", "load"], suffixes=(" before", " after"))
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.1f}".format):
        print("\n5. timing figures (vary by nature; means over repeats), for scale:\n")
        print(h.to_string(index=False))
    lb = con.execute("SELECT round(avg(load_avg_1m), 1) FROM b.trials").fetchall()[0][0]
    la = con.execute("SELECT round(avg(load_avg_1m), 1) FROM a.trials").fetchall()[0][0]
    print(f"   host 1-minute load average at the trials' start (mean): before {lb}, after {la}")

    print(f"\nresult: {'SAME ROWS (apart from ids and times)' if failures == 0 else f'{failures} check(s) failed'}")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="warehouse .duckdb of the earlier run")
    ap.add_argument("after", help="warehouse .duckdb of the later run")
    args = ap.parse_args(argv)
    return 1 if compare(args.before, args.after) else 0


if __name__ == "__main__":
    sys.exit(main())
