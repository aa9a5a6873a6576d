"""Verdict tables of a cross-version comparison across sweeps through the anchor (issue "verdicts over time"): a
later sweep boots the anchor (a pinned release, default engine args) and a config on a newer vLLM release; earlier
sweeps booted the same config and the anchor on the pinned release. The earlier runs' exports and the later one's
are joined into one warehouse (``reports.evidence.warehouse_from_parquet``) and read with the product's compare path
(``tunelab.flows.compare.compare``, as ``tunelab compare`` runs it):

- **within the later sweep**: the config on the newer release against the anchor on the pinned one (one sweep:
  no sweep term; the reference figure); where the later sweep booted the config on several runtimes (the pinned
  release too), each against the anchor and the newest against the pinned one (sorted by runtime name);
- **across sweeps**, the config in each earlier sweep (pinned release) against the config in the later sweep
  (newer release): the per-cell rows (``compare()``, which treats every boot as interchangeable), the anchored
  row (the "Across sweeps" section) and the same comparison with ``--anchor none`` (unanchored, widened by the
  history's sweep variance); the plain Welch interval on boot means beside each; one section per runtime of the
  config in the later sweep (on the pinned release it is an A/A across sweeps).

Run: ``python benchmarks/versions_anchored_report.py LATER_RUN EARLIER_RUN... [--config twin --anchor anchor]``
(evidence folders holding ``warehouse/*.parquet``). Prints markdown.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aa_anchored_report import _welch  # noqa: E402  (the plain Welch interval on one cell's boot means)

from tunelab.flows.compare import compare  # noqa: E402
from tunelab.reports.evidence import warehouse_from_parquet  # noqa: E402

METRICS = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s", "itl_p99_s")


def _pct(x: float) -> str:
    return f"{x:+.1%}" if np.isfinite(x) else "n/a"


def _by_cell(records: list[dict]) -> dict[tuple, pd.Series]:
    df = pd.DataFrame(records)
    return {(r.workload, float(r.load_value)): r for _, r in df.iterrows()} if len(df) else {}


def tables(later: Path, earlier: list[Path], config: str = "twin", anchor: str = "anchor") -> str:
    """The markdown of the comparisons above; raises FileNotFoundError for a folder without Parquet."""
    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = warehouse_from_parquet(earlier[0] / "warehouse", Path(tmp) / "w.duckdb",
                                    *[e / "warehouse" for e in earlier[1:]], later / "warehouse")
        con = duckdb.connect(str(db), read_only=True)
        try:
            info = con.execute("SELECT sweep_id, config_label, runtime_name, gpu_name, count(*) FROM trials "
                               "WHERE status = 'ok' GROUP BY ALL ORDER BY 1, 2").fetchdf()
            sweeps = [r[0] for r in con.execute("SELECT sweep_id FROM sweeps ORDER BY started_at").fetchall()]
            out += ["### The boots", "", "| sweep | config | runtime | GPU | ok boots |", "|---|---|---|---|---|"]
            out += [f"| {r.sweep_id} | {r.config_label} | {r.runtime_name} | {r.gpu_name} | {r[5]} |"
                    for r in info.itertuples()]
            last = sweeps[-1]
            # the config's runtimes in the later sweep (a plan may boot it on the pinned release too: an A/A across
            # sweeps and the cross-version comparison within the sweep); the pinned one first
            rts = [r[0] for r in con.execute(
                "SELECT DISTINCT runtime_name FROM trials WHERE sweep_id = ? AND config_label = ? AND status = 'ok' "
                "ORDER BY 1", [last, config]).fetchall()]
            several = len(rts) > 1

            def later(rt: str) -> dict:
                sel = {"sweep_id": last, "config_label": config}
                return {**sel, "runtime_name": rt} if several else sel

            pairs = [(f"{config}{f' on {rt}' if several else ''} against {anchor}",
                      {"sweep_id": last, "config_label": anchor}, later(rt)) for rt in rts]
            if several:
                pairs.append((f"{config} on {rts[-1]} against {config} on {rts[0]}", later(rts[0]), later(rts[-1])))
            for title, b, c in pairs:
                out += ["", f"### Within the later sweep ({last}): {title}", "",
                        "| metric | cell | per cell [95 %] | verdict | headline (Holm) | Welch on boot means: difference (relative) |",
                        "|---|---|---|---|---|---|"]
                for m in METRICS:
                    res = compare.fn(b, c, metric=m, db=str(db), with_regressions=False)
                    for r in res["rows"]:
                        cell = (r["workload"], float(r["load_value"]))
                        out.append(f"| {m} | {cell[0]} c={cell[1]:g} | {_pct(r['rel_diff'])} [{_pct(r['rel_ci_low'])}, "
                                   f"{_pct(r['rel_ci_high'])}] | {r['verdict']} | {r['family_verdict']} | "
                                   f"{_welch(con, m, b, c, cell)} |")
            for s in sweeps[:-1]:
                for rt in rts:
                    b, c = {"sweep_id": s, "config_label": config}, later(rt)
                    out += ["", f"### Across sweeps: {config} in {s} against {config}"
                                f"{f' on {rt}' if several else ''} in {last}", "",
                            "| metric | cell | per cell, sweep ignored [95 %] | verdict | anchored [95 %] | verdict | "
                            "method | without the anchor (`--anchor none`) [95 %] | verdict | Welch on boot means: difference (relative) |",
                            "|---|---|---|---|---|---|---|---|---|---|"]
                    confirmed: dict[str, list] = {}
                    for m in METRICS:
                        res = compare.fn(b, c, metric=m, db=str(db))  # with regressions: what raises the state
                        bare = compare.fn(b, c, metric=m, db=str(db), with_regressions=False, anchor="none")
                        xa, xn = _by_cell(res["anchored"]), _by_cell(bare["anchored"])
                        for r in res["rows"]:
                            cell = (r["workload"], float(r["load_value"]))
                            a, n = xa.get(cell), xn.get(cell)
                            anch = ("-", "-", "-") if a is None else (
                                f"{_pct(a.rel)} [{_pct(a.rel_low)}, {_pct(a.rel_high)}]", a.verdict, a.method)
                            none = ("-", "-") if n is None else (
                                f"{_pct(n.rel)} [{_pct(n.rel_low)}, {_pct(n.rel_high)}]", n.verdict)
                            out.append(f"| {m} | {cell[0]} c={cell[1]:g} | {_pct(r['rel_diff'])} [{_pct(r['rel_ci_low'])}, "
                                       f"{_pct(r['rel_ci_high'])}] | {r['verdict']} | {anch[0]} | {anch[1]} | {anch[2]} | "
                                       f"{none[0]} | {none[1]} | {_welch(con, m, b, c, cell)} |")
                        confirmed[m] = res["confirmed"]
                    out += [""] + [f"- {m}: confirmed regressions (what raises the Prefect state Regression): "
                                   f"{v or 'none'}" for m, v in confirmed.items()]
        finally:
            con.close()
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("later", type=Path)
    ap.add_argument("earlier", type=Path, nargs="+")
    ap.add_argument("--config", default="twin")
    ap.add_argument("--anchor", default="anchor")
    a = ap.parse_args()
    print(tables(a.later, a.earlier, a.config, a.anchor))


if __name__ == "__main__":
    main()
