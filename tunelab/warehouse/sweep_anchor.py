"""Which anchor a comparison across sweeps goes through, and the anchored rows ``tunelab compare`` shows.

A sweep records its plan (``sweeps.plan_yaml``); a plan's ``anchor:`` is one runtime and one config, booted in
every round under the key ``plan.Plan.anchor_trial`` gives it (``config_key`` of the plan's model id, the
anchor's engine args and env; the runtime is the anchor's ``runtime``). So the anchor of a sweep is found again
in the warehouse from the recorded plan alone, whatever label its boots carry (an anchor that launches the same
server as one of the plan's configs shares that config's key and label).

:func:`cross_sweep_compare` is what the compare flow runs: when the baseline's and the candidate's trials share
no sweep, each config found on both sides is compared per cell through the anchor
(``warehouse.anchored_compare.anchored_cells``); without an anchor the result is labelled unanchored and its
interval widened by the sweep-to-sweep variance of the warehouse's history (never narrower than the within-sweep
interval). Same-sweep comparisons are left to ``warehouse.compare`` unchanged (None is returned).
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pandas as pd
import yaml

from tunelab.core.plan import Anchor, _env_str, config_key
from tunelab.stats.anchored import sweep_variance
from tunelab.warehouse.anchored_compare import anchored_cells
from tunelab.warehouse.boot_rows import boot_rows
from tunelab.warehouse.compare import metric_direction, selector_where

__all__ = ["NO_ANCHOR", "anchor_choices", "comparison_anchor", "cross_sweep_compare", "plan_anchor", "recorded_anchor", "resolve_anchor", "sweep_anchors", "sweeps_of"]

Unit = tuple[str, str]


def plan_anchor(plan_yaml: str | None) -> Unit | None:
    """``(runtime, config_key)`` of a recorded plan's ``anchor:`` (as ``Plan.anchor_trial`` keys it), or None.

    Only the ``anchor:`` and ``model`` fields are read (a recorded plan may name files of another host); a plan
    text that is not YAML, or an anchor that does not validate, gives None: such a sweep has no usable anchor.
    """
    if not plan_yaml:
        return None
    try:
        data = yaml.safe_load(plan_yaml)
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("anchor"), dict) or not data.get("model"):
        return None
    try:
        a = Anchor.model_validate(data["anchor"])
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None
    env = {k: _env_str(v) for k, v in a.env.items() if v is not None}
    return a.runtime, config_key(Path(str(data["model"])).name, dict(a.engine_args), env)


def sweep_anchors(con: duckdb.DuckDBPyConnection, sweep_ids: list[str]) -> dict[str, Unit | None]:
    """Sweep id -> the anchor its recorded plan booted (:func:`plan_anchor`), None where it had none."""
    rows = con.execute("SELECT sweep_id, plan_yaml FROM sweeps WHERE sweep_id IN (SELECT unnest(?))",
                       [list(sweep_ids)]).fetchall()
    found = {s: plan_anchor(y) for s, y in rows}
    return {s: found.get(s) for s in sweep_ids}


#: ``--anchor none``: compare across sweeps without the anchor (labelled unanchored, widened by the history's sweep
#: variance), beside the anchored verdict.
NO_ANCHOR = "none"


def sweeps_of(con: duckdb.DuckDBPyConnection, selector: dict) -> list[str]:
    """The sweeps holding ok trials of a (resolved) selector, sorted."""
    where, params = selector_where(selector)
    return [r[0] for r in con.execute(f"SELECT DISTINCT f.sweep_id FROM trial_facts f WHERE {where} "
                                      "AND f.status = 'ok' ORDER BY 1", params).fetchall()]


def anchor_choices(con: duckdb.DuckDBPyConnection, sweep_ids: list[str],
                   exclude: list[Unit] | tuple[Unit, ...] = ()) -> list[tuple[str, str, str]]:
    """``(runtime, config_key, label)`` of the configs ``--anchor`` can name for a comparison over ``sweep_ids``:
    ok trials in every one of those sweeps, a key on one runtime there (``--anchor KEY`` names it alone), not a
    unit of ``exclude`` (the compared sides). Sorted by key."""
    sweeps = sorted(set(sweep_ids))
    rows = con.execute("SELECT runtime_name, config_key, min(config_label), count(DISTINCT sweep_id) FROM trials "
                       "WHERE status = 'ok' AND sweep_id IN (SELECT unnest(?)) GROUP BY 1, 2 ORDER BY 2, 1",
                       [sweeps]).fetchall()
    runtimes_of: dict[str, int] = {}
    for _, k, _, _ in rows:
        runtimes_of[str(k)] = runtimes_of.get(str(k), 0) + 1
    skip = {(str(r), str(k)) for r, k in exclude}
    return [(str(r), str(k), str(lab)) for r, k, lab, n in rows
            if n == len(sweeps) and runtimes_of[str(k)] == 1 and (str(r), str(k)) not in skip]


def _choices_text(con: duckdb.DuckDBPyConnection, sweep_ids: list[str], exclude=()) -> str:
    """The valid anchors and the flag to use, for an ``--anchor`` error."""
    ok = anchor_choices(con, sweep_ids, exclude)
    if not ok:
        return (f"no other config was measured in every compared sweep ({', '.join(sorted(set(sweep_ids)))}), so "
                f"none can serve as anchor: use --anchor {NO_ANCHOR} (the comparison unanchored, its interval widened)")
    return (f"configs that can serve as anchor (measured in every compared sweep): "
            + ", ".join(f"{k} ({lab!r} on {r})" for r, k, lab in ok)
            + f"; use --anchor KEY (e.g. --anchor {ok[0][1]}), or --anchor {NO_ANCHOR} to compare without an anchor")


def _label_of(con: duckdb.DuckDBPyConnection, unit: Unit) -> str:
    row = con.execute("SELECT min(config_label) FROM trials WHERE runtime_name = ? AND config_key = ?",
                      list(unit)).fetchone()
    return str(row[0]) if row and row[0] is not None else ""


def resolve_anchor(con: duckdb.DuckDBPyConnection, text: str, sweep_ids: list[str],
                   sides: dict[str, list[Unit]] | None = None) -> Unit:
    """The unit ``--anchor CONFIG_KEY_OR_LABEL`` names: ok trials of that config key (or else label) in the sweeps.

    A config key is matched case-insensitively (keys are lower-case hex; ``630C1D61A446`` works), a label exactly.
    ``sides``: side ("baseline"/"candidate") -> the units ``(runtime, config_key)`` it compares; the anchor may
    be none of them.

    Raises:
        ValueError: no such trials (names the value), the name fits configs on several runtimes or keys, or it
            names a compared side (names the side); each message lists the configs that can serve as anchor
            (:func:`anchor_choices`) and the flag to use.
    """
    name = text.strip()
    side_units = [tuple(u) for us in (sides or {}).values() for u in us]
    for col, value in (("lower(config_key)", name.lower()), ("config_label", name)):
        units = [(str(r), str(k)) for r, k in con.execute(
            f"SELECT DISTINCT runtime_name, config_key FROM trials WHERE {col} = ? AND status = 'ok' "
            "AND sweep_id IN (SELECT unnest(?)) ORDER BY 1, 2", [value, list(sweep_ids)]).fetchall()]
        if not units:
            continue
        hit = [(side, u) for side, us in (sides or {}).items() for u in us if tuple(u) in units]
        if hit:
            named = " and ".join(f"the {side} ({u[0]}/{u[1]} {_label_of(con, tuple(u))!r})" for side, u in hit)
            raise ValueError(f"--anchor {text!r} names {named}: the anchor cannot be one of the compared sides "
                             "(it is a third config, measured in every compared sweep, that links them); "
                             + _choices_text(con, sweep_ids, side_units))
        if len(units) == 1:
            return units[0]
        raise ValueError(f"--anchor {text!r}: names {len(units)} configs in sweeps {sweep_ids} "
                         f"({', '.join(f'{r}/{k}' for r, k in units)}), so it cannot pick one; "
                         + _choices_text(con, sweep_ids, side_units))
    raise ValueError(f"--anchor {text!r}: no ok trial has that config key or label in the compared sweeps "
                     f"({', '.join(sweep_ids)}); " + _choices_text(con, sweep_ids, side_units))


def comparison_anchor(con: duckdb.DuckDBPyConnection, sweep_ids: list[str],
                      anchor: str | None = None, sides: dict[str, list[Unit]] | None = None
                      ) -> tuple[Unit | None, str]:
    """The anchor of a comparison over ``sweep_ids`` and where it came from: ``(unit, "--anchor")`` for a given
    config key or label (:func:`resolve_anchor`), ``(None, "--anchor none")`` for ``anchor="none"`` (the same
    comparison without the anchor, to see what it adds), else ``(unit, "plan")`` when every sweep's recorded plan
    booted the same anchor, else ``(None, "none")``. ``sides``: the compared units per side, which ``anchor``
    may not name (:func:`resolve_anchor`).

    Raises:
        ValueError: a bad ``anchor`` (:func:`resolve_anchor`).
    """
    if anchor is not None and anchor.strip().lower() == NO_ANCHOR:
        return None, f"--anchor {NO_ANCHOR}"
    if anchor is not None:
        return resolve_anchor(con, anchor, sweep_ids, sides), "--anchor"
    recorded = set(sweep_anchors(con, sweep_ids).values()) if sweep_ids else set()
    if len(recorded) == 1 and None not in recorded:
        return next(iter(recorded)), "plan"
    return None, "none"


def recorded_anchor(con: duckdb.DuckDBPyConnection) -> Unit | None:
    """The one anchor the warehouse's sweeps recorded (``tunelab series``' default ``--anchor``): the unit when
    every sweep whose plan had ``anchor:`` booted the same one; None when none did or they differ."""
    ids = [r[0] for r in con.execute("SELECT sweep_id FROM sweeps ORDER BY 1").fetchall()]
    found = {u for u in sweep_anchors(con, ids).values() if u is not None}
    return next(iter(found)) if len(found) == 1 else None


def _units(con: duckdb.DuckDBPyConnection, selector: dict) -> dict[str, list[str]]:
    where, params = selector_where(selector)
    out: dict[str, list[str]] = {}
    for r, k in con.execute(f"SELECT DISTINCT f.runtime_name, f.config_key FROM trial_facts f WHERE {where} "
                            "AND f.status = 'ok' ORDER BY 1, 2", params).fetchall():
        out.setdefault(str(k), []).append(str(r))
    return out


def _runtime_pairs(ub: dict[str, list[str]], uc: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """``(config_key, baseline runtime, candidate runtime)`` for every key on both sides. A key on one runtime a
    side is one pair (the nightly case: last week's release against tonight's). A key on several runtimes is
    paired runtime by runtime where both sides have that runtime, and a side with one runtime is paired with each
    of the other side's (a pinned baseline against every release of the candidate's sweep); what cannot be paired
    either way (several runtimes on both sides, none shared) is left out."""
    pairs = []
    for k in sorted(set(ub) & set(uc)):
        rbs, rcs = ub[k], uc[k]
        if len(rbs) == 1 or len(rcs) == 1:
            pairs += [(k, rb, rc) for rb in rbs for rc in rcs]
        else:
            pairs += [(k, r, r) for r in sorted(set(rbs) & set(rcs))]
    return pairs


def _history_sweep_var(con: duckdb.DuckDBPyConnection, metric: str, anchor: Unit | None) -> dict[tuple, tuple]:
    """Per cell, ``(var_sweep, df)`` from every boot in the warehouse (the anchor's own history first)."""
    v = boot_rows(con, metric)
    if not len(v):
        return {}
    v = v.assign(config=v.runtime_name + "/" + v.config_key, sweep=v.sweep_id)
    out = {}
    for cell, c in v.groupby(["workload", "load_kind", "load_value"], sort=True):
        vs, dfs, _ = (math.nan, 0.0, "")
        if anchor is not None:
            vs, dfs, _ = sweep_variance(c[["config", "sweep", "value"]], [f"{anchor[0]}/{anchor[1]}"])
        if not (math.isfinite(vs) and dfs > 0):
            vs, dfs, _ = sweep_variance(c[["config", "sweep", "value"]])
        if math.isfinite(vs) and dfs > 0:
            out[(cell[0], cell[1], float(cell[2]))] = (vs, dfs)
    return out


def _verdict(low: float, high: float, direction: int) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    if low > 0 or high < 0:
        return "better" if (low > 0) == (direction > 0) else "worse"
    return "no significant change"


def cross_sweep_compare(con: duckdb.DuckDBPyConnection, baseline: dict, candidate: dict, metric: str, *,
                        anchor: str | None = None, confidence: float = 0.95) -> pd.DataFrame | None:
    """Per config found on both sides and per cell, the candidate against the baseline across sweeps.

    Args:
        con: a warehouse connection.
        baseline, candidate: resolved selectors (``warehouse.selection.resolve_selector``).
        metric: a numeric ``measurements`` column.
        anchor: ``--anchor``: a config key or label of the anchor (:func:`resolve_anchor`); None: the anchor the
            sweeps' plans recorded, when every compared sweep recorded the same one.
        confidence: two-sided level.

    Returns:
        None when the two sides share a sweep (the same-sweep comparison stands as it is). Otherwise the rows of
        ``anchored_cells`` with ``config_key``, ``runtimes`` (``baseline's -> candidate's``, one name when the
        same), ``verdict`` (better / worse / no significant change /
        inconclusive, from the interval and the metric's direction) and ``anchored_text`` (``anchored through
        <runtime/key>`` or ``unanchored``) in front; ``attrs``: ``anchor`` (unit or None), ``anchor_source``
        (``--anchor``, ``plan`` or ``none``), ``sweeps`` ({side: [ids]}).

    Raises:
        ValueError: a bad ``--anchor`` (:func:`resolve_anchor`: no such config, or one of the compared sides).
    """
    sb, sc = sweeps_of(con, baseline), sweeps_of(con, candidate)
    if not sb or not sc or set(sb) & set(sc):
        return None
    sweeps = sorted(set(sb) | set(sc))
    ub, uc = _units(con, baseline), _units(con, candidate)
    sides = {side: [(r, k) for k, rs in u.items() for r in rs] for side, u in (("baseline", ub), ("candidate", uc))}
    unit, source = comparison_anchor(con, sweeps, anchor, sides)
    # A config is followed across sweeps by its key (independent of the runtime, so across vLLM releases).
    pairs = _runtime_pairs(ub, uc)
    if not pairs and len(ub) == 1 and len(uc) == 1:  # one config a side, two keys (a flag against another)
        (kb, rb), (kc, rc) = next(iter(ub.items())), next(iter(uc.items()))
        if len(rb) == 1 and len(rc) == 1:
            pairs = [(f"{kb} -> {kc}", rb[0], rc[0])]
    history = _history_sweep_var(con, metric, unit)
    direction = metric_direction(metric)
    frames = []
    for key, rb, rc in pairs:
        kb, _, kc = key.partition(" -> ")
        b_unit, c_unit = (rb, kb), (rc, kc or kb)
        if unit is not None and unit in (b_unit, c_unit):
            continue  # the anchor compared with itself links nothing
        # Each side's boots from its own selection's sweeps only (a config that also ran in the other side's
        # sweeps stays out of this side: found by a fresh user).
        df = anchored_cells(con, metric, b_unit, c_unit, unit, sweep_ids=sweeps, confidence=confidence,
                            sweep_var=history, side_sweeps=(sb, sc))
        if not len(df):
            continue
        df.insert(0, "config_key", key)
        df.insert(1, "runtimes", rb if rb == rc else f"{rb} -> {rc}")
        frames.append(df)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(out):
        out.insert(1, "verdict", [_verdict(lo, hi, direction) for lo, hi in zip(out.rel_low, out.rel_high)])
        out.insert(2, "anchored_text", ["anchored through " + (a or "a shared config") if ok else "unanchored"
                                        for ok, a in zip(out.anchored, out.anchor)])
    out.attrs.update(anchor=unit, anchor_source=source, sweeps={"baseline": sb, "candidate": sc})
    return out
