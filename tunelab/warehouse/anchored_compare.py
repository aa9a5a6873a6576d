"""Anchored A/B per cell from the warehouse: ``stats.anchored.anchored_difference`` over ``boot_rows``.

The function the compare path calls for a comparison across sweeps (docs/statistics.md, "Anchored comparisons"):
two (runtime, config) units and the plan's anchor, every boot of them in the chosen sweeps, one row per cell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict

import duckdb
import pandas as pd

from tunelab.stats.anchored import anchored_difference, interaction_variance
from tunelab.warehouse.boot_rows import boot_rows

__all__ = ["anchored_cells"]

Unit = tuple[str, str]


def _name(u: Unit) -> str:
    return f"{u[0]}/{u[1]}"


def anchored_cells(con: duckdb.DuckDBPyConnection, metric: str, baseline: Unit, candidate: Unit,
                   anchor: Unit | None = None, *, sweep_ids: Sequence[str] | None = None,
                   confidence: float = 0.95, drift: bool | str = "auto",
                   sweep_var: Mapping[tuple, tuple[float, float]] | None = None,
                   side_sweeps: tuple[Sequence[str], Sequence[str]] | None = None) -> pd.DataFrame:
    """Per (workload, load_kind, load_value), the candidate against the baseline through the anchor.

    Args:
        con: a warehouse connection.
        metric: a numeric ``measurements`` column (``output_tokens_per_s``, ``tpot_p50_s``, ...).
        baseline, candidate, anchor: ``(runtime_name, config_key)`` units; the anchor links sweeps (None: no
            anchor; a cross-sweep comparison is then labelled unanchored and widened).
        sweep_ids: the sweeps whose boots enter (None: every sweep holding a boot of the three units).
        confidence, drift: as in :func:`tunelab.stats.anchored.anchored_difference`.
        sweep_var: per cell ``(workload, load_kind, load_value)``, ``(var_sweep, df)`` from a longer history
            (the warehouse's), used where the comparison is unanchored (``anchored_difference``'s ``sweep_var``).
        side_sweeps: ``(baseline's sweeps, candidate's sweeps)``: each side's boots only from the sweeps its
            selector chose (a config that also ran in the other side's sweeps is not pulled in from there); the
            anchor's boots come from every sweep in ``sweep_ids``. None: every boot of a unit in ``sweep_ids``.
            With ``baseline == candidate`` (one config in two sweeps: an A/A across sweeps, a pinned config
            tonight against last week) the two lists must not overlap, and the config's boots are split by them.

    Returns:
        One row per cell: ``workload, load_kind, load_value, metric`` and the fields of
        :class:`~tunelab.stats.anchored.AnchoredDifference` (``rel``, ``rel_low``, ``rel_high``, ``df``,
        ``method``, ``anchored``, ``cross_sweep``, ``note``, ``welch_*`` ...). A cell where a side has no boots is
        left out.

    Raises:
        ValueError: a bad metric (from ``boot_rows``), a unit without boots (names it), the same unit on both sides
            without two disjoint ``side_sweeps``.
    """
    units = [baseline, candidate] + ([anchor] if anchor is not None else [])
    same = tuple(baseline) == tuple(candidate)
    if same and (side_sweeps is None or set(side_sweeps[0]) & set(side_sweeps[1])):
        raise ValueError(f"baseline and candidate are both {_name(baseline)}: the same config is compared with itself "
                         "only across sweeps; give each side its own sweeps (sweep_id=... in each selector)")
    v = boot_rows(con, metric, sweep_ids=sweep_ids)
    v = v.assign(config=v.runtime_name + "/" + v.config_key)
    # The config x sweep interaction (how far a config's gap to the anchor moves from sweep to sweep, which the
    # anchor does not cancel) from every other config of these sweeps: with only the three units, the anchor alone
    # spans the sweeps and it cannot be estimated (the CPU A/A across two sessions made 11.6 % false calls so).
    others = v[~v.config.isin([_name(baseline), _name(candidate)])].rename(
        columns={"sweep_id": "sweep", "boot_order": "order"})
    v = v[v.config.isin([_name(u) for u in units])].copy()
    names = {"baseline": _name(baseline), "candidate": _name(candidate)}
    if side_sweeps is not None:
        if not same:
            for u, own in zip((baseline, candidate), side_sweeps):
                v = v[~((v.config == _name(u)) & ~v.sweep_id.isin(list(own)))]
        else:
            # One config in two sweeps (an A/A across sweeps, or tonight's run of a pinned config against last
            # week's): its boots are told apart by the side whose sweeps they ran in.
            names = {"baseline": _name(baseline) + " (baseline)", "candidate": _name(candidate) + " (candidate)"}
            mine = v.config == _name(baseline)
            v.loc[mine & v.sweep_id.isin(list(side_sweeps[0])), "config"] = names["baseline"]
            v.loc[mine & v.sweep_id.isin(list(side_sweeps[1])), "config"] = names["candidate"]
            v = v[v.config != _name(baseline)]
    for role, u in (("baseline", baseline), ("candidate", candidate)):
        if not (v.config == names[role]).any():
            raise ValueError(f"{role} {names[role] if same else u} has no ok boots with {metric} in the chosen sweeps")
    v = v.rename(columns={"sweep_id": "sweep", "boot_order": "order"})
    rows = []
    for (w, lk, lv), c in v.groupby(["workload", "load_kind", "load_value"], sort=True):
        if not ((c.config == names["baseline"]).any() and (c.config == names["candidate"]).any()):
            continue
        o = others[(others.workload == w) & (others.load_kind == lk) & (others.load_value == lv)]
        inter = interaction_variance(o[["config", "sweep", "order", "value"]]) if len(o) else (math.nan, 0.0)
        r = anchored_difference(c[["config", "sweep", "order", "value"]], names["baseline"], names["candidate"],
                                _name(anchor) if anchor is not None else None, confidence=confidence, drift=drift,
                                sweep_var=(sweep_var or {}).get((w, lk, float(lv))),
                                interaction_var=inter if inter[1] > 0 else None)
        rows.append({"workload": w, "load_kind": lk, "load_value": float(lv), "metric": metric, **asdict(r)})
    return pd.DataFrame(rows)
