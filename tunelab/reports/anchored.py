"""Markdown of a comparison across sweeps (``warehouse.sweep_anchor.cross_sweep_compare``): one row per cell."""

from __future__ import annotations

import math

import pandas as pd

from tunelab.core.load_profiles import load_label

__all__ = ["anchored_markdown"]


def _pct(x: float) -> str:
    return "?" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def anchored_markdown(xs: pd.DataFrame) -> str:
    """The section ``Across sweeps`` of the compare report.

    One row per config and cell: the verdict, the ratio - 1 of candidate to baseline with its interval (the model
    of ``stats.anchored``: log value = config + sweep + boot noise), ``anchored`` or ``unanchored``, the method,
    and the plain Welch interval on the boots' log values (no sweep term) beside it. ``xs.attrs`` name the anchor
    and where it came from (the plans the sweeps recorded, or ``--anchor``).
    """
    a = xs.attrs.get("anchor")
    src = {"plan": "the anchor the sweeps' plans booted", "--anchor": "given with --anchor"}.get(
        xs.attrs.get("anchor_source", "none"), "")
    sweeps = xs.attrs.get("sweeps", {})
    head = (f"## Across sweeps: {'anchored through ' + a[0] + '/' + a[1] + ' (' + src + ')' if a else 'unanchored'}\n\n"
            f"Baseline sweeps {', '.join(sweeps.get('baseline', []))}; candidate sweeps "
            f"{', '.join(sweeps.get('candidate', []))}. Intervals are 95 % per cell; "
            + ("the sweep effect cancels through the anchor (docs/statistics.md, \"How `tunelab compare` "
               "picks anchored or unanchored\")." if a else
               "the anchor was left out on purpose (`--anchor none`): each interval is widened by the warehouse "
               "history's sweep-to-sweep variance (never narrower than these boots' own within-sweep interval; the "
               "per-cell table above may be narrower, as it borrows the history's boot variance)."
               if xs.attrs.get("anchor_source", "").startswith("--anchor") else
               "no anchor links the sweeps: each interval is widened by the warehouse history's sweep-to-sweep "
               "variance (never narrower than these boots' own within-sweep interval; the per-cell table above may be "
               "narrower, as it borrows the history's boot variance); add `anchor:` to the plans."))
    if not len(xs):
        return head + "\n\nNo cell has boots of both sides."
    lines = ["| config | runtime | workload | load | verdict | change [95 % CI] | anchored | method | Welch on boot means (%, log scale) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in xs.itertuples(index=False):
        lines.append(f"| {r.config_key} | {getattr(r, 'runtimes', '')} | {r.workload} | {load_label(r.load_kind, r.load_value)} | {r.verdict} | "
                     f"{_pct(r.rel)} [{_pct(r.rel_low)}, {_pct(r.rel_high)}] | "
                     f"{'anchored' if r.anchored else 'unanchored'} | {r.method} | "
                     f"[{_pct(r.welch_rel_low)}, {_pct(r.welch_rel_high)}] |")
    # One note per row, named by its row and in the table's order (found by a fresh user: a sorted set of notes
    # put the widest row's "SD 10.1 %" last and read as the first row's "SD 0.0 %").
    notes = [f"- {r.config_key} {getattr(r, 'runtimes', '')} {r.workload} {load_label(r.load_kind, r.load_value)}: "
             f"{r.note}" for r in xs.itertuples(index=False) if r.note]
    return head + "\n\n" + "\n".join(lines) + ("\n\nNotes, per row:\n\n" + "\n".join(notes) if notes else "")
