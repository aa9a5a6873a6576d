"""Verdict tables of an A/A evidence run with an anchor (evidence/h200-2026-12-03-aa-anchored): the within-sweep A/A
(twin against the anchor, per sweep) and the A/A across sweeps (twin in the second sweep against twin in the first,
through the anchor), through the product's own comparison path (``tunelab.flows.compare.compare``, as ``tunelab
compare`` runs it), each row with the plain Welch interval on boot means beside it (metric's unit and relative to the
baseline's mean).

Run: ``python benchmarks/aa_anchored_report.py evidence/h200-2026-12-03-aa-anchored [--twin twin --anchor anchor]``.
Prints markdown: per comparison, per metric and cell, the product's interval and verdict, the headline (Holm)
verdict, the anchored row where the sides ran in different sweeps, and Welch; then the false calls counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tunelab.flows.compare import compare  # noqa: E402
from tunelab.reports.evidence import warehouse_from_parquet  # noqa: E402
from tunelab.stats.bounds import welch_interval  # noqa: E402
from tunelab.warehouse.boot_rows import boot_rows  # noqa: E402

METRICS = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s", "itl_p99_s")


def _welch(con, metric: str, base: dict, cand: dict, cell: tuple) -> str:
    v = boot_rows(con, metric)
    v = v[(v.workload == cell[0]) & (v.load_value == cell[1])]

    def side(sel):  # every key of the selector that boot_rows has (sweep_id, config_label, runtime_name)
        mask = np.ones(len(v), dtype=bool)
        for k, val in sel.items():
            mask &= (v[k] == val).to_numpy()
        return v[mask].value.to_numpy(float)

    a, b = side(base), side(cand)
    if len(a) < 2 or len(b) < 2:
        return "-"
    w = welch_interval(a, b, 0.95)
    m = float(np.mean(a))
    return f"{w.low:+.4g}, {w.high:+.4g} ({w.low / m:+.1%}, {w.high / m:+.1%})"


def tables(folder: Path, twin: str = "twin", anchor: str = "anchor") -> str:
    with tempfile.TemporaryDirectory() as tmp:
        db = warehouse_from_parquet(folder / "warehouse", Path(tmp) / "w.duckdb")
        con = duckdb.connect(str(db), read_only=True)
        sweeps = [r[0] for r in con.execute("SELECT sweep_id FROM sweeps ORDER BY started_at").fetchall()]
        pairs = {f"within sweep {i + 1} ({s[-4:]}): {twin} vs {anchor}":
                 ({"sweep_id": s, "config_label": anchor}, {"sweep_id": s, "config_label": twin})
                 for i, s in enumerate(sweeps)}
        for i in range(1, len(sweeps)):
            pairs[f"across sweeps: {twin} in sweep {i + 1} vs {twin} in sweep 1"] = (
                {"sweep_id": sweeps[0], "config_label": twin}, {"sweep_id": sweeps[i], "config_label": twin})
        out, counts = [], []
        for name, (b, c) in pairs.items():
            out += [f"\n### {name}\n",
                    "| metric | cell | per cell [95 %] | verdict | headline (Holm) | anchored [95 %] | anchored verdict "
                    "| Welch on boot means: difference (relative) |", "|---|---|---|---|---|---|---|---|"]
            confirmed = []
            for m in METRICS:
                res = compare.fn(b, c, metric=m, db=str(db), with_regressions=False)
                confirmed += res["confirmed"]
                xs = pd.DataFrame(res["anchored"])
                for r in pd.DataFrame(res["rows"]).itertuples():
                    cell = (r.workload, float(r.load_value))
                    anch, av = "-", "-"
                    if len(xs):
                        x = xs[(xs.workload == r.workload) & (xs.load_value == r.load_value)]
                        if len(x):
                            x = x.iloc[0]
                            anch = f"{x.rel:+.1%} [{x.rel_low:+.1%}, {x.rel_high:+.1%}] ({x.method})"
                            av = f"{x.verdict} / {x.family_verdict}"
                            counts.append({"comparison": name, "path": "anchored", "metric": m,
                                           "false": x.verdict in ("better", "worse"),
                                           "half_width": (x.rel_high - x.rel_low) / 2})
                    counts.append({"comparison": name, "path": "per cell", "metric": m,
                                   "false": r.verdict in ("better", "worse"),
                                   "half_width": (r.rel_ci_high - r.rel_ci_low) / 2})
                    out.append(f"| {m} | {r.workload} c={r.load_value:g} | {r.rel_diff:+.1%} [{r.rel_ci_low:+.1%}, "
                               f"{r.rel_ci_high:+.1%}] | {r.verdict} | {r.family_verdict} | {anch} | {av} | "
                               f"{_welch(con, m, b, c, cell)} |")
            out.append(f"\nconfirmed regressions (what raises the Prefect state Regression): {confirmed or 'none'}")
        con.close()
    df = pd.DataFrame(counts)
    out.append("\n### False calls\n")
    out.append("| comparison | path | verdicts | false calls |")
    out.append("|---|---|---|---|")
    for (name, path), g in df.groupby(["comparison", "path"], sort=False):
        out.append(f"| {name} | {path} | {len(g)} | {int(g['false'].sum())} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--twin", default="twin")
    ap.add_argument("--anchor", default="anchor")
    a = ap.parse_args()
    print(tables(a.folder, a.twin, a.anchor))


if __name__ == "__main__":
    main()
