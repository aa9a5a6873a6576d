"""Reports of a sweep: the comparison table (per config, workload and load level) as a DataFrame, a rich
table for the terminal and markdown for a Prefect artifact. The SQL is ``warehouse/queries/sweep_comparison.sql``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

__all__ = ["comparison_frame", "comparison_markdown", "print_comparison"]

_SQL = Path(__file__).resolve().parent.parent / "warehouse" / "queries" / "sweep_comparison.sql"


def comparison_frame(db_path: Path, sweep_id: str) -> pd.DataFrame:
    """One row per (runtime, config, workload, load level) of the sweep; latencies in seconds.
    Opens the DuckDB file read-only (the sweep's writer has already closed it)."""
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return con.execute(_SQL.read_text(), {"sweep_id": sweep_id}).df()
    finally:
        con.close()


def _fmt_row(r: pd.Series) -> dict[str, str]:
    def ms(x: Any) -> str:
        return "-" if pd.isna(x) else f"{x * 1000:.1f}"

    cv = r.get("output_tps_cv")
    return {
        "runtime": str(r["runtime"]),
        "config": str(r["config"]),
        "workload": str(r["workload"]),
        "load": f"c={int(r['load_value'])}" if r["load_kind"] == "concurrency" else f"{r['load_value']:g} req/s",
        "boots x repeats": f"{int(r['boots'])}x{int(r['repeats'] // max(r['boots'], 1))}",
        "output tok/s": "-" if pd.isna(r["output_tokens_per_s"]) else f"{r['output_tokens_per_s']:.1f}",
        "cv": "-" if pd.isna(cv) else f"{cv * 100:.0f}%",
        "TTFT p50 ms": ms(r["ttft_p50_s"]),
        "TPOT p50 ms": ms(r["tpot_p50_s"]),
        "ITL p50 ms": ms(r["itl_p50_s"]),
        "E2EL p95 ms": ms(r["e2el_p95_s"]),
        "failed": str(int(r["failed_requests"] or 0)),
        "quality": str(r["quality"]),
    }


def comparison_markdown(df: pd.DataFrame, sweep_id: str, statuses: list[dict] | None = None) -> str:
    """Markdown report: the trials with their status, then the comparison table."""
    lines = [f"# tunelab sweep `{sweep_id}`", ""]
    if statuses:
        lines += ["## Trials", "", "| trial | config | runtime | status | failure | boot s |", "|---|---|---|---|---|---|"]
        for s in statuses:
            b = s.get("boot_s")
            lines.append(f"| `{s['trial_id'].split('/', 1)[-1]}` | {s['config']} | {s['runtime']} | {s['status']} | "
                         f"{s.get('failure_class') or ''} | {'' if b is None or pd.isna(b) else f'{b:.1f}'} |")
        lines.append("")
    lines += ["## Comparison (means over boots and repeats; cv = repeat-to-repeat spread of output tok/s)", ""]
    if df.empty:
        lines.append("_no measurements_")
        return "\n".join(lines)
    rows = [_fmt_row(r) for _, r in df.iterrows()]
    cols = list(rows[0])
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in rows:
        lines.append("| " + " | ".join(r[c] for c in cols) + " |")
    return "\n".join(lines)


def print_comparison(df: pd.DataFrame, title: str = "comparison") -> None:
    """Print the comparison as a rich table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    if df.empty:
        Console().print("(no measurements)")
        return
    rows = [_fmt_row(r) for _, r in df.iterrows()]
    for c in rows[0]:
        t.add_column(c, justify="right" if c not in ("runtime", "config", "workload", "quality") else "left")
    for r in rows:
        t.add_row(*r.values())
    Console(width=200).print(t)
