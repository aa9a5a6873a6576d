"""The tuning report of a ``search:`` sweep (``tunelab tuning-report [SWEEP]``; also the end of such a sweep).

From the warehouse (``sweeps.search_*`` and ``trials.search_*``, migration 018, and the boots' measurements):

- every config tried, with its objective value, SLO verdict and search state (pruned, failed for memory and walked
  down, ...);
- the **frontier**: the Pareto set of throughput against latency at the objective's cell over the usable boots
  (status ok, quality pass or warn): no other config has both more throughput and less latency. Throughput is the
  objective's metric when it is a ``*_per_s`` column, else ``output_tokens_per_s``; latency is the objective's
  metric when it is a latency, else the first SLO bound's column at the SLO percentile (``ttft_p90_s`` ...), else
  ``e2el_p90_s``;
- the **best config under the SLO** with its verdict against the default (the plan's base config), from
  ``warehouse.compare.compare`` (boot-level log-ratio interval; one boot per side gives ``inconclusive`` with its
  point estimate, and the report says how to confirm it: a ``replicates: auto`` A/B);
- the bottleneck diagnosis of both (``window_diagnoses``, read only where that table exists): the checks flagged
  in their windows at the objective's cell;
- GPU-minutes spent, boots used against the full grid, and the ``vllm serve`` command line of the best config;
- the **cost** of each frontier config: output tokens per GPU-hour (``output_tokens_per_s`` at the objective's
  cell x 3600 / the GPUs one boot occupies: tensor x pipeline x data parallel size, 1 when unset; a CPU boot
  counts as one device) and, with a price per GPU-hour (the plan's ``price_per_gpu_hour`` or the command's
  ``--price-per-gpu-hour``), the cost per million output tokens = price x 1e6 / (output tokens per GPU-hour).
  The throughput is the one measured at that cell's load, so the cost is the cost at that load: a config run
  below its saturation costs more per token than its peak would;
- a PNG of the configs and the frontier, in ``reports.plots``' style.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import yaml

from tunelab.core.load_profiles import load_label
from tunelab.core.markdown import markdown_table
from tunelab.core.search.config_tpe import SearchSpace, boots_phrase, default_in_space

__all__ = ["TuningReport", "auto_tune_boots", "boot_gpus", "frontier", "serve_command", "tuning_report"]


@dataclass
class TuningReport:
    """What :func:`tuning_report` found: ``configs`` (one row per boot), ``frontier`` (its Pareto rows), the best
    config's row (None: no config met the SLO), its ``verdict`` rows against the default, the diagnosis rows, the
    deploy ``command``, the ``plot`` path, and the report as terminal ``lines`` and ``markdown``."""

    sweep_id: str
    configs: pd.DataFrame
    frontier: pd.DataFrame
    best: dict[str, Any] | None
    default: dict[str, Any] | None
    verdict: pd.DataFrame | None
    diagnosis: pd.DataFrame | None
    command: str | None
    plot: Path | None
    lines: list[str] = field(default_factory=list)
    markdown: str = ""
    price_per_gpu_hour: float | None = None


def boot_gpus(engine_args: dict[str, Any]) -> int:
    """GPUs one boot with ``engine_args`` occupies: the product of ``tensor-parallel-size``,
    ``pipeline-parallel-size`` and ``data-parallel-size`` (or ``tp``/``pp``/``dp``), 1 when none is set; a value
    that is not a positive integer counts as 1 (the plan check refuses such a plan before it runs)."""
    n = 1
    for k, v in (engine_args or {}).items():
        if k in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size", "tp", "pp", "dp"):
            try:
                n *= max(int(v), 1)
            except (TypeError, ValueError):
                pass
    return n


def auto_tune_boots(grid_size: int) -> tuple[int, int]:
    """Server boots that vLLM's ``benchmarks/auto_tune/auto_tune.sh`` (vLLM main, 2026) spends on a grid of
    ``grid_size`` configs, as (fewest, most): it first starts the server at ``--gpu-memory-utilization`` 0.98 and
    steps down by 0.01 until one starts, giving up below 0.90 (1 to 9 boots); then boots every grid point once
    (its request-rate walk for the latency limit runs on that boot); then boots the best once more to profile it.
    Nothing is skipped (no pruning, no model of the objective) and the default config is never measured.

    Raises:
        ValueError: ``grid_size`` < 1.
    """
    if grid_size < 1:
        raise ValueError(f"grid_size must be >= 1, got {grid_size}")
    return grid_size + 2, grid_size + 10


def frontier(df: pd.DataFrame, throughput: str, latency: str) -> pd.DataFrame:
    """The Pareto rows of ``df``: no other row has ``throughput`` >= and ``latency`` <= with one strictly better.
    Rows with a missing value are left out. Sorted by throughput."""
    d = df.dropna(subset=[throughput, latency])
    keep = []
    for i, r in d.iterrows():
        dominated = ((d[throughput] >= r[throughput]) & (d[latency] <= r[latency])
                     & ((d[throughput] > r[throughput]) | (d[latency] < r[latency]))).any()
        if not dominated:
            keep.append(i)
    return d.loc[keep].sort_values(throughput)


def serve_command(model: str, engine_args: dict[str, Any], env: dict[str, str]) -> str:
    """``VAR=value ... vllm serve MODEL --flag value ...`` (flags sorted; ``true`` -> the bare flag; ``false`` and
    ``null`` left out, as tunelab launches them), shell-quoted."""
    parts = [f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
    parts += ["vllm", "serve", shlex.quote(str(model))]
    for k, v in sorted(engine_args.items()):
        if v is None or v is False:
            continue
        parts.append(f"--{k}")
        if v is not True:
            parts.append(shlex.quote(str(v)))
    return " ".join(parts)


def _con(db: Path | str | duckdb.DuckDBPyConnection) -> tuple[duckdb.DuckDBPyConnection, bool]:
    if isinstance(db, duckdb.DuckDBPyConnection):
        return db, False
    return duckdb.connect(str(db), read_only=True), True


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0])


def _at_load(df: pd.DataFrame, label: str) -> pd.Series:
    """Rows of ``df`` (``load_kind``, ``load_value``) at the load level ``label``."""
    return pd.Series([load_label(k, v) == label for k, v in zip(df["load_kind"], df["load_value"])], index=df.index,
                     dtype=bool)


def _axes(obj: dict) -> tuple[str, str]:
    metric, q = obj["metric"], obj.get("slo_percentile", 90)
    thr = metric if metric.endswith("_per_s") else "output_tokens_per_s"
    if not metric.endswith("_per_s"):
        return thr, metric
    for k in ("ttft_s", "tpot_s", "e2el_s"):
        if (obj.get("slo") or {}).get(k) is not None:
            return thr, f"{k.removesuffix('_s')}_p{q}_s"
    return thr, f"e2el_p{q}_s"


def tuning_report(db: Path | str | duckdb.DuckDBPyConnection, sweep_id: str | None = None,
                  plots_dir: Path | None = None, price_per_gpu_hour: float | None = None) -> TuningReport:
    """The tuning report of a search sweep (default: the latest sweep with ``search_boots``; a newer sweep whose
    plan has ``search:`` but no search record, one still running or killed before it wrote one, is named in a
    line). An interrupted search (``search_stop_reason`` ``interrupted``) is reported with the boots it had, and
    says so.

    ``price_per_gpu_hour`` (any currency per GPU-hour; default: the plan's ``price_per_gpu_hour``) adds the cost
    per million output tokens beside each frontier config (module notes).

    Raises:
        ValueError: ``price_per_gpu_hour`` <= 0; no such sweep; the sweep has no search; or its plan has ``search:`` but the warehouse has no
            record of that search (the message says why that happens and what to run).
    """
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise ValueError(f"price per GPU-hour must be > 0, got {price_per_gpu_hour}")
    con, close = _con(db)
    try:
        return _report(con, sweep_id, plots_dir, price_per_gpu_hour)
    finally:
        if close:
            con.close()


def _has_search(plan_yaml: Any) -> bool:
    """Whether a sweep's plan text has a ``search:`` section (False when it cannot be read)."""
    try:
        plan = yaml.safe_load(plan_yaml or "")
    except yaml.YAMLError:
        return False
    return isinstance(plan, dict) and plan.get("search") is not None


def _unrecorded_searches(con: duckdb.DuckDBPyConnection, after: Any = None) -> list[str]:
    """Sweeps (started after ``after``; None: any) whose plan has ``search:`` but that have no search record."""
    rows = con.execute("SELECT sweep_id, plan_yaml, started_at FROM sweeps WHERE search_boots IS NULL "
                       + ("AND started_at > ? " if after is not None else "") + "ORDER BY started_at",
                       [after] if after is not None else []).fetchall()
    return [r[0] for r in rows if _has_search(r[1])]


def _no_record(sweep_id: str) -> str:
    return (f"the search of sweep {sweep_id} has no record: the sweep is still running, or was killed before it "
            f"could write one (SIGKILL, a lost machine), or its bundles are not loaded yet (`tunelab load`); its "
            f"trials: `tunelab report --sweep {sweep_id}`")


def _report(con: duckdb.DuckDBPyConnection, sweep_id: str | None, plots_dir: Path | None,
            price: float | None = None) -> TuningReport:
    notes: list[str] = []
    if sweep_id is None:
        row = con.execute("SELECT sweep_id, started_at FROM sweeps WHERE search_boots IS NOT NULL "
                          "ORDER BY started_at DESC LIMIT 1").fetchone()
        newer = _unrecorded_searches(con, row[1] if row is not None else None)
        if row is None:
            raise ValueError("no sweep with a search in the warehouse (a plan with `search:` makes one)"
                             + (f"; {_no_record(newer[-1])}" if newer else ""))
        sweep_id = row[0]
        notes += [f"note: a newer sweep, {x}, ran a search too; {_no_record(x).split(': ', 1)[1]}" for x in newer]
    sw = con.execute("SELECT * FROM sweeps WHERE sweep_id = ?", [sweep_id]).df()
    if sw.empty:
        raise ValueError(f"sweep {sweep_id!r} is not in the warehouse")
    s = sw.iloc[0]
    if pd.isna(s["search_boots"]):
        if _has_search(s.get("plan_yaml")):
            raise ValueError(f"sweep {sweep_id!r} ran a search (its plan has `search:`), but {_no_record(sweep_id)}")
        raise ValueError(f"sweep {sweep_id!r} has no search (its plan has no `search:`)")
    obj = json.loads(s["search_objective"])
    thr, lat = _axes(obj)
    trials = con.execute(
        "SELECT trial_id, config_key, config_label, status, failure_class, quality_verdict, search_role, "
        "search_trial, search_state, search_value, search_slo_violation, search_walk_down, search_reason, "
        "engine_args, env, model "
        "FROM trials WHERE sweep_id = ? AND search_role IS NOT NULL ORDER BY started_at, trial_id", [sweep_id]).df()
    meas = con.execute(f"SELECT m.trial_id, m.workload, m.load_kind, m.load_value, m.{thr} AS thr, m.{lat} AS lat, "
                       "m.output_tokens_per_s AS out_tps "
                       "FROM measurements m JOIN trials t USING (trial_id) WHERE t.sweep_id = ?", [sweep_id]).df()
    if not meas.empty:
        meas = meas[(meas["workload"] == obj["workload"]) & _at_load(meas, obj["load"])]
    cols = ["thr", "lat", "out_tps"]
    cell = meas.groupby("trial_id")[cols].mean() if not meas.empty else pd.DataFrame(columns=cols)
    cfg = trials.join(cell.rename(columns={"thr": thr, "lat": lat}), on="trial_id")
    # Cost (module notes): output tokens per GPU-hour at the cell, and per million tokens with a price.
    if price is None:
        try:
            price = (yaml.safe_load(s.get("plan_yaml") or "") or {}).get("price_per_gpu_hour")
        except yaml.YAMLError:
            price = None
    gpus = cfg["engine_args"].map(lambda a: boot_gpus(json.loads(a or "{}")))
    cfg["output_tokens_per_gpu_hour"] = pd.to_numeric(cfg["out_tps"], errors="coerce") * 3600.0 / gpus
    cfg["cost_per_million_output_tokens"] = (float(price) * 1e6 / cfg["output_tokens_per_gpu_hour"]
                                             if price else float("nan"))
    cfg = cfg.drop(columns=["out_tps"])
    cfg["usable"] = (cfg["status"] == "ok") & cfg["quality_verdict"].isin(["pass", "warn"])
    cfg["slo_met"] = cfg["search_slo_violation"].map(lambda v: None if pd.isna(v) else bool(v <= 0))
    front = frontier(cfg[cfg["usable"]], thr, lat)
    best_key = s.get("search_best_config_key")
    best_rows = cfg[(cfg["config_key"] == best_key) & cfg["usable"]] if isinstance(best_key, str) else cfg.iloc[:0]
    best = best_rows.iloc[0].to_dict() if not best_rows.empty else None
    def_rows = cfg[cfg["search_role"] == "default"]
    default = def_rows.iloc[0].to_dict() if not def_rows.empty else None

    verdict = None
    if best is not None and default is not None and best["trial_id"] != default["trial_id"]:
        from tunelab.warehouse.compare import compare

        try:
            v = compare(con, {"trial_id": [default["trial_id"]]}, {"trial_id": [best["trial_id"]]}, obj["metric"],
                        history=True)
            verdict = v[(v["workload"] == obj["workload"]) & _at_load(v, obj["load"])]
        except Exception as e:  # a view: say why there is none
            verdict = pd.DataFrame([{"verdict": "not computed", "reason": f"{type(e).__name__}: {e}"}])

    diagnosis = None
    ids = [r["trial_id"] for r in (default, best) if r is not None]
    if ids and _has_table(con, "window_diagnoses"):
        d = con.execute("SELECT * FROM window_diagnoses WHERE trial_id IN (SELECT unnest(?))", [ids]).df()
        if not d.empty:
            d = d[(d["workload"] == obj["workload"]) & _at_load(d, obj["load"])]
            role = {default["trial_id"]: "default"} if default else {}
            if best:
                role[best["trial_id"]] = "best" if best["trial_id"] not in role else "default = best"
            d = d.assign(config=d["trial_id"].map(role), flagged_n=d["flagged"].fillna(False).astype(int))
            diagnosis = (d.groupby(["config", "bottleneck"], as_index=False)
                         .agg(windows_flagged=("flagged_n", "sum"), windows=("flagged_n", "size")))

    command = None
    if best is not None:
        plan = yaml.safe_load(s.get("plan_yaml") or "") or {}
        names = set((plan.get("env") or {})) | set(((plan.get("search") or {}).get("space") or {}).get("env") or {})
        env = {k: v for k, v in json.loads(best["env"] or "{}").items() if k in names}
        command = serve_command(plan.get("model") or best["model"], json.loads(best["engine_args"] or "{}"), env)

    plot = _plot(cfg, front, best, default, thr, lat, sweep_id, obj, plots_dir) if plots_dir is not None else None
    rep = TuningReport(sweep_id, cfg, front, best, default, verdict, diagnosis, command, plot,
                       price_per_gpu_hour=float(price) if price else None)
    _render(rep, s, obj, thr, lat)
    if notes:
        rep.lines += notes
        rep.markdown += "\n" + "\n".join(f"- {x}" for x in notes) + "\n"
    return rep


def _md(df: pd.DataFrame) -> str:
    return "\n".join(markdown_table(df))


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "-"
    if spec == ".4g" and isinstance(v, (int, float)) and abs(v) >= 1e4:
        return f"{v:,.0f}"  # 13,457 beside 6,821, not 1.346e+04
    return format(v, spec)


def _render(rep: TuningReport, s: pd.Series, obj: dict, thr: str, lat: str) -> None:
    grid = None if pd.isna(s["search_grid_size"]) else int(s["search_grid_size"])
    in_grid = None
    if rep.default is not None and s.get("search_space"):
        try:
            in_grid = default_in_space(SearchSpace.model_validate(json.loads(s["search_space"])),
                                       json.loads(rep.default["engine_args"] or "{}"),
                                       json.loads(rep.default["env"] or "{}"))
        except (ValueError, TypeError):  # a space this version cannot read: the phrase says less
            in_grid = None
    boots = boots_phrase(int(s["search_boots"]), grid, in_grid,
                         [(r.search_role, r.search_state, r.config_key) for r in rep.configs.itertuples()])
    slo = ", ".join(f"{k} <= {v:g}" for k, v in (obj.get("slo") or {}).items() if v is not None) or "none"
    head = (f"tuning report, sweep {rep.sweep_id}: {obj['direction']} {obj['metric']} at {obj['workload']} "
            f"{obj['load']} under SLO {slo} "
            f"(p{obj.get('slo_percentile', 90)} of each window; a boot meets it when its windows' excess over the "
            f"bounds averages <= 0)")
    spent = f"{boots}; {_fmt(s['search_gpu_minutes'], '.2f')} GPU-minutes; stopped: {s['search_stop_reason']}"
    lines = [head, spent]
    if s["search_stop_reason"] == "interrupted":
        lines.append(f"interrupted: the search was stopped (Ctrl-C or a cancel) after {int(s['search_boots'])} "
                     "boot(s); this report has the boots that finished, and its best is the best of those only")
    if not pd.isna(s["search_grid_size"]):
        g = int(s["search_grid_size"])
        lo, hi = auto_tune_boots(g)
        lines.append(f"the same space by other methods: the full grid {g} boots (+1 for the default as reference); "
                     f"vLLM's auto_tune.sh {lo}-{hi} boots (memory probe 1-9, every grid point once, a profiling "
                     "boot of the best)")
    if rep.best is None:
        lines.append("best under the SLO: none (no usable boot met it)")
    else:
        lines.append(f"best under the SLO: {rep.best['config_label']} [{rep.best['config_key']}] "
                     f"{obj['metric']} = {_fmt(rep.best['search_value'])}")
    if rep.default is not None:
        lines.append(f"default: {rep.default['config_label']} [{rep.default['config_key']}] "
                     f"{obj['metric']} = {_fmt(rep.default['search_value'])} ({rep.default['search_state']})")
    if rep.verdict is not None and not rep.verdict.empty:
        v = rep.verdict.iloc[0]
        if "rel_diff" in rep.verdict.columns:
            lines.append(f"verdict, best against the default: {v['verdict']} {_fmt(v['rel_diff'], '+.1%')} "
                         f"[{_fmt(v['rel_ci_low'], '+.1%')}, {_fmt(v['rel_ci_high'], '+.1%')}] "
                         f"({int(v['baseline_boots'])} vs {int(v['candidate_boots'])} boot(s))")
            if v["verdict"] == "inconclusive":
                lines.append("  one boot per config cannot tell a difference from boot-to-boot noise: confirm it "
                             "with a `replicates: auto` A/B of the two configs (docs/tuning.md)")
        else:
            lines.append(f"verdict, best against the default: {v['verdict']} ({v.get('reason')})")
    elif rep.best is not None and rep.default is not None and rep.best["trial_id"] == rep.default["trial_id"]:
        lines.append("verdict: the default is the best config found")
    if rep.diagnosis is not None and not rep.diagnosis.empty:
        for cfg_name, g in rep.diagnosis.groupby("config"):
            hit = [f"{r.bottleneck} ({r.windows_flagged}/{r.windows} windows)" for r in g.itertuples()
                   if r.windows_flagged]
            lines.append(f"bottleneck ({cfg_name}): {', '.join(hit) or 'none flagged'}")
    lines.append(f"frontier ({thr} against {lat}; cost at that load: output tokens per GPU-hour"
                 + (f", cost per million output tokens at {rep.price_per_gpu_hour:g} per GPU-hour"
                    if rep.price_per_gpu_hour else "; add --price-per-gpu-hour for the cost per million tokens")
                 + "): " + (", ".join(
        f"{r.config_label} ({_fmt(getattr(r, thr))}, {_fmt(getattr(r, lat) * 1000, '.1f')} ms, "
        f"{_fmt(r.output_tokens_per_gpu_hour, ',.0f')} tok/GPU-h"
        + (f", {_fmt(r.cost_per_million_output_tokens, '.3g')} per 1M tok" if rep.price_per_gpu_hour else "") + ")"
        for r in rep.frontier.itertuples()) or "no usable boot"))
    if rep.command:
        lines.append(f"deploy: {rep.command}")
    lines.append(f"configs tried ({len(rep.configs)}):")
    for r in rep.configs.itertuples():
        trial = "" if pd.isna(r.search_trial) else f"#{int(r.search_trial)} "
        # the boot's SLO violation (mean over its windows of the largest observed / bound - 1; <= 0 meets it)
        viol = "" if pd.isna(r.search_slo_violation) else \
            f", SLO violation {r.search_slo_violation:+.0%} ({'met' if r.search_slo_violation <= 0 else 'not met'})"
        lines.append(f"  {trial}{r.config_label} [{r.config_key}]: {r.search_state}, {obj['metric']} = "
                     f"{_fmt(r.search_value)}{viol}" + ("" if r.status == "ok" else f" ({r.status}"
                                                 + ("" if pd.isna(r.failure_class) else f": {r.failure_class}") + ")")
                     + ("" if pd.isna(r.search_reason) else f" (why: {r.search_reason})"))
    rep.lines = lines

    show = rep.configs[["config_label", "config_key", "search_role", "search_trial", "search_state", "status",
                        "failure_class", "quality_verdict", "search_value", thr, lat, "search_slo_violation",
                        "search_walk_down"]].copy()
    show["frontier"] = show["config_key"].isin(rep.frontier["config_key"])
    for c in ("search_value", thr, lat):  # 4 significant digits, not 588.0339488384463
        show[c] = show[c].map(lambda v: v if v is None or pd.isna(v) else float(f"{v:.4g}"))
    md = [f"# Tuning report: {rep.sweep_id}", "", head, "", spent, ""]
    md += ["## Best config under the SLO", ""] + [f"- {x}" for x in lines[2:] if not x.startswith(("deploy", "  ", "configs tried"))]
    if rep.command:
        md += ["", "Deploy it with:", "", "```bash", rep.command, "```"]
    if rep.verdict is not None and not rep.verdict.empty and "rel_diff" in rep.verdict.columns:
        md += ["", "## Verdict against the default", "", _md(rep.verdict[
            ["metric", "baseline_mean", "candidate_mean", "rel_diff", "rel_ci_low", "rel_ci_high", "verdict",
             "reason"]])]
    if rep.diagnosis is not None and not rep.diagnosis.empty:
        md += ["", "## Bottleneck diagnosis (window_diagnoses)", "", _md(rep.diagnosis)]
    fcols = ["config_label", "config_key", thr, lat, "output_tokens_per_gpu_hour"] + (
        ["cost_per_million_output_tokens"] if rep.price_per_gpu_hour else [])
    ftab = rep.frontier[fcols].copy() if not rep.frontier.empty else None
    if ftab is not None:
        for c in fcols[2:]:
            ftab[c] = ftab[c].map(lambda v: v if v is None or pd.isna(v) else float(f"{v:.4g}"))
    md += ["", "## Frontier", "", (_md(ftab) + (f"\n\nCost at {rep.price_per_gpu_hour:g} per GPU-hour; output tokens "
                                                "per GPU-hour = output_tokens_per_s at the cell x 3600 / GPUs per "
                                                "boot." if rep.price_per_gpu_hour else ""))
           if ftab is not None else "no usable boot"]
    md += ["", "## Configs tried", "", _md(show)]
    if rep.plot is not None:
        md += ["", f"![configs and frontier]({rep.plot})"]
    rep.markdown = "\n".join(md) + "\n"


def _plot(cfg: pd.DataFrame, front: pd.DataFrame, best: dict | None, default: dict | None, thr: str, lat: str,
          sweep_id: str, obj: dict, out_dir: Path) -> Path | None:
    from tunelab.reports.plots import _plt, _safe, _save

    d = cfg.dropna(subset=[thr, lat])
    if d.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for state, g in d.groupby("search_state"):
        ax.scatter(g[thr], g[lat] * 1000, s=22, alpha=0.7, label=f"{state} ({len(g)})")
    if not front.empty:
        ax.plot(front[thr], front[lat] * 1000, color="black", lw=1, marker="o", mfc="none", label="frontier")
    for row, mark, name in ((default, "s", "default"), (best, "*", "best under SLO")):
        if row is not None and not pd.isna(row.get(thr)) and not pd.isna(row.get(lat)):
            ax.scatter([row[thr]], [row[lat] * 1000], marker=mark, s=160, edgecolor="black", facecolor="gold"
                       if mark == "*" else "white", zorder=5, label=f"{name}: {row['config_label']}")
    bound = (obj.get("slo") or {}).get(lat.split("_")[0] + "_s")
    if bound is not None:
        ax.axhline(bound * 1000, color="red", ls="--", lw=1, label=f"SLO {lat.split('_')[0]} {bound * 1000:g} ms")
    ax.set_xlabel(f"{thr} (mean of windows) at {obj['workload']} {obj['load']}")
    ax.set_ylabel(f"{lat.removesuffix('_s').replace('_', ' ').upper()} (ms)")
    ax.grid(alpha=0.3)
    ax.margins(x=0.08, y=0.08)  # the default and the best sit at the ends of the range: keep their markers whole
    # below the axes, in two columns: beside them, config labels of a few engine args took half the figure's width
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    fig.suptitle(f"search {sweep_id}: configs tried and their frontier", fontsize=9)
    return _save(fig, out_dir, f"tuning_{_safe(sweep_id)}.png")
