"""A/B comparison of two sets of trials, and regression detection along vLLM versions or dates.

Method (both functions): **the unit of replication is the boot (trial)**, not the repeat.
Repeats on one server share that server's state (its memory layout, compiled graphs, the
host's load at that time), so their spread understates the difference between two boots of
the same config. Measured on an H200: the same config booted twice differed by 13-16 % while
repeats on one server spread 6-20 %; treating repeats as independent samples would call
that noise an effect. So repeats are averaged within each trial first, and every interval is
computed across trials.

The statistics live in ``tunelab.stats`` (``stats.verdict``, ``stats.family``, ``stats.intervals``); this module
selects the rows they judge. ``compare``: per (workload, load_kind, load_value), baseline and candidate boot means
are compared on the
log scale (``tunelab.stats.intervals.log_ab_intervals``): the effect is the ratio of geometric means, its
t interval ``exp(diff_log +- t se) - 1`` never crosses -100 %, and the variance of a boot's log value is
pooled over both sides of the cell and with the same cell's boot-to-boot variance of every other config in
the warehouse (history, on its degrees of freedom); a cell without history is moderated across the
comparison's cells by empirical Bayes (Smyth 2004). So 2 boots per side borrow degrees of freedom instead of
standing on 1-2 df (a Welch interval on 2 vs 2 boots called a 3x TPOT change "no significant change" on the
H200). Every row
carries ``mde_rel``, the minimum detectable effect at 80 % power at the design it ran.
Verdict: ``better`` / ``worse`` when the interval excludes zero
(direction-aware: throughput ``*_per_s`` higher is better, latency ``*_s`` lower is better),
``no_significant_change`` when it contains zero (read it with ``mde_rel``: effects smaller than that could
not have been seen), ``inconclusive`` when either side has fewer
than ``min_boots`` (default 2) boots: with one boot the boot-to-boot variance is unknown.
``not_applied`` when every boot of one side had an env var that its vLLM reported as unknown
(``trials.env_not_applied``, e.g. ``VLLM_USE_FASTOKENS`` on vLLM 0.21.0): that side ran without the
setting, so the difference is not an effect of it; the interval is still given, as an A/A noise check.
A cell with a value <= 0 (a ratio is undefined, e.g. goodput 0) falls back to Welch's interval of the
difference in the metric's unit, and says so.

``regressions``: per series (config_key, gpu, workload, load level), points are vLLM
versions in PEP 440 order (or sweeps in date order); the rule is ``tunelab.stats.regressions``. A point *violates* when it is worse than
the baseline (boot-weighted mean of the last ``baseline_window`` non-violating points) by more than ``threshold_rel`` AND the difference is outside the noise band
``noise_k * sd_boot * sqrt(1/n_baseline + 1/n_point)`` (sd_boot pooled across the series'
boots). A regression is confirmed when ``consecutive`` successive points violate against the
same baseline, as in the PyTorch HUD regression checker (pytorch/test-infra
``benchmark_regression_summary_report``: a trailing run of >= 2 violations is a regression).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from tunelab.core import records as R
from tunelab.stats.bounds import welch_interval
from tunelab.stats.family import family_adjust
from tunelab.stats.regressions import regression_table
from tunelab.stats.verdict import ABRecord, cell_verdicts, token_change

__all__ = [
    "LATENCY_METRICS",
    "SELECTOR_KEYS",
    "THROUGHPUT_METRICS",
    "VERDICTS",
    "compare",
    "metric_direction",
    "regressions",
]

#: Comparable throughput columns of ``measurements`` (higher is better): its ``*_per_s`` columns.
THROUGHPUT_METRICS = tuple(c for c in R.columns(R.Measurement) if c.endswith("_per_s"))
#: Comparable latency columns (lower is better): mean and percentiles of TTFT/TPOT/ITL/E2EL, and the window.
LATENCY_METRICS = R.LATENCY_COLUMNS + R.pick(R.Measurement, "duration_s")
SELECTOR_KEYS = (
    "trial_id", "sweep_id", "config_key", "config_label", "runtime_name", "vllm_version",
    "vllm_release", "gpu_name", "model",
)
VERDICTS = ("better", "worse", "no_significant_change", "inconclusive", "not_applied")


def metric_direction(metric: str) -> int:
    """+1 when higher is better (throughput, ``*_per_s``), -1 when lower is better (latency, ``*_s``).

    Raises:
        ValueError: for a name that is not a comparable ``measurements`` column.
    """
    if metric in THROUGHPUT_METRICS:
        return 1
    if metric in LATENCY_METRICS:
        return -1
    import difflib

    names = list(THROUGHPUT_METRICS + LATENCY_METRICS)
    close = difflib.get_close_matches(str(metric), names, n=3, cutoff=0.6)  # a typo's nearest names first
    raise ValueError(
        f"metric {metric!r} is not comparable"
        + (f" (did you mean {', '.join(repr(c) for c in close[:-1])}{' or ' if len(close) > 1 else ''}"
           f"{close[-1]!r}?)" if close else "")
        + f"; use one of {names}"
    )


def selector_where(selector: dict, alias: str = "f") -> tuple[str, list]:
    """SQL condition and its parameters selecting the ``trial_facts`` rows (aliased ``alias``) of a selector.

    ``selector``: ``{key: value or list of values}`` with keys of :data:`SELECTOR_KEYS`; a list means any of
    its values; ``vllm_version`` values select by release (see :func:`_version_clause`). Returns
    ``("f.k1 = ? AND f.k2 IN (?, ?)", [v1, v2a, v2b])`` for ``con.execute(f"... WHERE {where}", params)``.

    Raises:
        ValueError: an empty or non-dict selector, or unknown keys (names the allowed keys).
    """
    if not isinstance(selector, dict) or not selector:
        raise ValueError(f"a selector must be a non-empty dict with keys from {list(SELECTOR_KEYS)}, got {selector!r}")
    unknown = set(selector) - set(SELECTOR_KEYS)
    if unknown:
        raise ValueError(f"selector keys {sorted(unknown)} are unknown; use keys from {list(SELECTOR_KEYS)}")
    clauses, params = [], []
    for k, v in selector.items():
        if k == "vllm_version":
            clause, ps = _version_clause(list(v) if isinstance(v, (list, tuple, set)) else [v], alias)
            clauses.append(clause)
            params.extend(ps)
        elif isinstance(v, (list, tuple, set)):
            vals = list(v)
            clauses.append(f"{alias}.{k} IN ({', '.join('?' for _ in vals)})")
            params.extend(vals)
        else:
            clauses.append(f"{alias}.{k} = ?")
            params.append(v)
    return " AND ".join(clauses), params


def _version_clause(values: list, alias: str) -> tuple[str, list]:
    """SQL for a ``vllm_version`` selector: builds are grouped by release (``warehouse.versions``).

    A value without a local part (``0.26.0``) selects every build of that release: the exact string, and every
    version with the same public version (``0.26.0+empty``, ``0.26.0+cu128``; PEP 440 equal, so ``0.26`` works
    too). A value with a local part (``0.26.0+empty``) selects that build only. A value that is not a version
    is matched as a plain string.
    """
    from tunelab.warehouse.versions import parse_vllm_version

    ors, params = [], []
    for v in values:
        ors.append(f"{alias}.vllm_version = ?")
        params.append(v)
        try:
            pv = parse_vllm_version(str(v))
        except ValueError:
            continue
        if pv.local is None:
            ors.append(f"{alias}.vllm_public_version = ?")
            params.append(pv.public)
            if not pv.untrusted:
                ors.append(f"{alias}.vllm_version_key = ?")
                params.append(pv.sort_key)
    return "(" + " OR ".join(ors) + ")", params


def _trials(con, selector: dict) -> pd.DataFrame:
    where, params = selector_where(selector)
    return con.execute(
        f"""SELECT f.trial_id, f.status, f.quality_verdict, t.env_not_applied
            FROM trial_facts f JOIN trials t USING (trial_id) WHERE {where}""", params
    ).fetchdf()


def _not_applied(trials: pd.DataFrame, keep: list[str], side: str) -> list[dict]:
    """(side, trial_id, env) of the kept trials whose vLLM reported some of their env vars as unknown."""
    out = []
    for r in trials[trials.trial_id.isin(keep)].itertuples(index=False):
        names = json.loads(r.env_not_applied) if isinstance(r.env_not_applied, str) else []  # NULL: not recorded
        if names:
            out.append({"side": side, "trial_id": r.trial_id, "env": ", ".join(names)})
    return out


def _boot_values(con, trial_ids: list[str], metric: str) -> pd.DataFrame:
    """Per trial and cell, the mean of ``metric`` over the boot's windows; the windows of an ``sla_search:``
    (``measurements.sla_search_window``) are left out: a search window at a plan's level would be averaged in;
    so are overloaded open-loop windows (``measurements.overloaded``: a growing queue's latencies)."""
    cols = ["trial_id", "workload", "load_kind", "load_value", "boot_value", "repeats"]
    if not trial_ids:
        return pd.DataFrame(columns=cols)
    con.register("_tl_ids", pd.DataFrame({"trial_id": trial_ids}))
    try:
        return con.execute(
            f"""SELECT m.trial_id, m.workload, m.load_kind, m.load_value,
                       avg(m.{metric}) AS boot_value, count(m.{metric}) AS repeats
                FROM measurements m JOIN _tl_ids USING (trial_id)
                WHERE m.{metric} IS NOT NULL AND isfinite(m.{metric})
                  AND m.sla_search_window IS NOT TRUE  -- the plan's windows only (docs/sla_search.md; 019)
                  AND m.overloaded IS NOT TRUE  -- an open-loop window the server fell behind (021)
                GROUP BY ALL"""
        ).fetchdf()
    finally:
        con.unregister("_tl_ids")


def _token_counts(con, trial_ids: list[str]) -> dict[tuple, dict[str, tuple[int, float, float]]]:
    """Per cell ``(workload, load_kind, load_value)``, the ok requests' prompt and output token counts from the
    server's usage (``requests``) over ``trial_ids``: ``{"prompt": (n, mean, variance), "output": (...)}``."""
    if not trial_ids:
        return {}
    con.register("_tl_tok", pd.DataFrame({"trial_id": trial_ids}))
    try:
        rows = con.execute(
            """SELECT r.workload, r.load_kind, r.load_value,
                      count(r.prompt_tokens), avg(r.prompt_tokens), var_samp(r.prompt_tokens),
                      count(r.output_tokens), avg(r.output_tokens), var_samp(r.output_tokens)
               FROM requests r JOIN _tl_tok USING (trial_id) WHERE r.ok GROUP BY ALL"""
        ).fetchall()
    finally:
        con.unregister("_tl_tok")
    nan = (lambda x: math.nan if x is None else float(x))
    return {(w, k, float(v)): {"prompt": (int(n1), nan(m1), nan(v1)), "output": (int(n2), nan(m2), nan(v2))}
            for w, k, v, n1, m1, v1, n2, m2, v2 in rows}


def _history_prior(con, exclude: list[str], metric: str, quality: Sequence[str], statuses: Sequence[str]
                   ) -> pd.DataFrame:
    """Per cell, the pooled within-group variance of log boot values in the rest of the warehouse.

    Groups are (config_key, runtime_name, vllm_version, gpu_name): boots of one configuration on one release
    and GPU; the variance of a boot's log value (its relative boot-to-boot noise) is pooled over the groups
    with >= 2 boots, on ``sum(n_g - 1)`` df. Only GPUs of the compared trials count, and the compared trials
    themselves are left out, so the prior is independent of the data it is combined with. Columns: workload,
    load_kind, load_value, var_log, df.
    """
    cols = ["workload", "load_kind", "load_value", "var_log", "df"]
    if not exclude:
        return pd.DataFrame(columns=cols)
    con.register("_tl_ex", pd.DataFrame({"trial_id": exclude}))
    try:
        return con.execute(
            f"""WITH boots AS (
                    SELECT f.config_key, f.runtime_name, f.vllm_version, f.gpu_name, m.workload, m.load_kind,
                           m.load_value, m.trial_id, ln(avg(m.{metric})) AS y
                    FROM measurements m JOIN trial_facts f USING (trial_id)
                    WHERE f.status IN ({', '.join('?' for _ in statuses)})
                      AND f.quality_verdict IN ({', '.join('?' for _ in quality)})
                      AND m.trial_id NOT IN (SELECT trial_id FROM _tl_ex)
                      AND m.sla_search_window IS NOT TRUE AND m.overloaded IS NOT TRUE
                      AND coalesce(f.gpu_name, '') IN (SELECT DISTINCT coalesce(gpu_name, '') FROM trial_facts
                                                       WHERE trial_id IN (SELECT trial_id FROM _tl_ex))
                      AND m.{metric} IS NOT NULL AND isfinite(m.{metric})
                    GROUP BY ALL HAVING avg(m.{metric}) > 0),
                groups AS (
                    SELECT workload, load_kind, load_value, count(*) - 1 AS d, var_samp(y) * (count(*) - 1) AS ss
                    FROM boots GROUP BY config_key, runtime_name, vllm_version, gpu_name, workload, load_kind,
                                        load_value
                    HAVING count(*) >= 2)
                SELECT workload, load_kind, load_value, sum(ss) / sum(d) AS var_log, sum(d)::DOUBLE AS df
                FROM groups GROUP BY ALL""",
            [*statuses, *quality],
        ).fetchdf()
    finally:
        con.unregister("_tl_ex")


def _split(trials: pd.DataFrame, side: str, quality: Sequence[str], statuses: Sequence[str]):
    keep, excluded = [], []
    for r in trials.itertuples(index=False):
        if r.status not in statuses:
            excluded.append({"side": side, "trial_id": r.trial_id, "reason": f"status={r.status}"})
        elif r.quality_verdict not in quality:
            excluded.append({"side": side, "trial_id": r.trial_id, "reason": f"quality_verdict={r.quality_verdict}"})
        else:
            keep.append(r.trial_id)
    return keep, excluded


def compare(
    con: duckdb.DuckDBPyConnection,
    baseline: dict,
    candidate: dict,
    metric: str = "output_tokens_per_s",
    *,
    confidence: float = 0.95,
    quality: Iterable[str] = ("pass", "warn"),
    statuses: Iterable[str] = ("ok",),
    min_boots: int = 2,
    borrow: bool = True,
    history: bool = True,
    paired: bool = False,
) -> pd.DataFrame:
    """A/B comparison of ``candidate`` against ``baseline`` per (workload, load_kind, load_value).

    Args:
        con: an open warehouse connection (``warehouse.migrate.connect``).
        baseline, candidate: selectors, dicts of ``trial_facts`` columns
            (``config_key``, ``runtime_name``, ``vllm_version``, ``config_label``, ``sweep_id``,
            ``vllm_release``, ``gpu_name``, ``model``, ``trial_id``) to a value or a list of values.
            A trial may not match both.
        metric: a ``measurements`` column, e.g. ``output_tokens_per_s`` (tokens/s, higher is
            better) or ``ttft_p99_s`` (seconds, lower is better).
        confidence: two-sided confidence level of the interval.
        quality: ``quality_verdict`` values admitted (default pass and warn; add
            ``"unvalidated"`` for imported results).
        statuses: trial ``status`` values admitted.
        min_boots: boots needed on each side for a verdict other than ``inconclusive``.
        history: pool each cell's variance with the same cell's boot-to-boot variance of every other
            configuration in the warehouse (same GPU; the compared trials left out), on its degrees of
            freedom. Assumes the relative (log-scale) boot noise of a cell does not depend on the config.
        borrow: where a cell has no such history, moderate its variance with the other cells' (empirical
            Bayes, >= 3 cells, df capped for the cells' shared boots); False: the cell's own variance alone.
        paired: analyse boots as pairs (``stats.intervals.paired_log_intervals``): boot r of the baseline and
            boot r of the candidate in one sweep (same ``sweep_id`` and ``replicate``: an interleaved sweep runs
            them one after the other) form a pair, and the interval is that of the pairs' mean log ratio, so
            drift both boots share cancels. ``history`` is not used (it holds single boots' variance); a boot
            without a partner is left out (``attrs["excluded"]``); fewer than ``min_boots`` pairs in a cell is
            ``inconclusive``. Choose it by the design, not by which interval comes out narrower.

    The statistics are ``tunelab.stats``'s (``stats.verdict.cell_verdicts``: the interval and the verdict of each
    cell; ``stats.family.family_adjust``: the headline verdicts as one family); this function selects the rows.

    Returns:
        DataFrame, one row per (workload, load_kind, load_value) with the fields of ``stats.verdict.ABRecord``
        (each described there) as columns:
        ``metric, higher_is_better, baseline_boots, candidate_boots, baseline_repeats,
        candidate_repeats, baseline_mean, candidate_mean, baseline_boot_sd, candidate_boot_sd,
        diff, rel_diff, ci_low, ci_high, rel_ci_low, rel_ci_high, p_value, df, se_log, mde_rel,
        variance_source, verdict, reason, baseline_trials_excluded, candidate_trials_excluded``, then
        ``welch_ci_low, welch_ci_high`` (the plain per-cell Welch interval of ``diff`` on the boot means, beside the
        method), ``family_role, p_family, family_verdict, family_method`` (the headline verdict, Holm-adjusted over
        this comparison's rows; a report of several comparisons adjusts their union:
        ``warehouse.selection.report_family``) and ``baseline_/candidate_prompt_tokens``,
        ``baseline_/candidate_output_tokens`` (mean per ok request, server usage) with ``token_change`` (empty when
        the sides ran the same token counts, else what changed and by how much: ``stats.verdict.token_change``;
        a tokenizer change between releases shows here). Means are
        over boot means (repeats averaged first); ``diff = candidate_mean - baseline_mean`` in the metric's
        unit; ``rel_diff`` is the ratio of geometric means of the boot values - 1 and ``rel_ci_*`` its
        interval (log scale, never below -1); ``ci_*`` = ``rel_ci_* x baseline_mean`` (metric unit);
        ``df`` the t quantile's degrees of freedom (cell + borrowed); ``se_log`` the SE of the log ratio;
        ``mde_rel`` the relative effect detectable at 80 % power at this design; ``variance_source`` where
        the variance came from. A cell with values <= 0 uses Welch's interval of ``diff`` instead.
        ``df.attrs["excluded"]`` is a DataFrame (side, trial_id, reason) of trials left out
        (status, quality verdict, or no values for the metric); ``df.attrs["not_applied"]`` is a DataFrame
        (side, trial_id, env) of kept trials whose vLLM reported env vars as unknown (the verdict is
        ``not_applied`` when that holds for every boot of a side); ``df.attrs["method"]`` says how.

    Raises:
        ValueError: unknown metric or selector key, empty selector, overlapping selectors; with ``paired``, a
            side with two boots of one (sweep, replicate) (pairs would be ambiguous: narrow the selector).
    """
    direction = metric_direction(metric)
    quality, statuses = tuple(quality), tuple(statuses)
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    if min_boots < 2:
        raise ValueError("min_boots must be >= 2: boot-to-boot variance needs two boots per side")
    sides = _select_sides(con, baseline, candidate, metric, quality, statuses)
    cells, gb, gc = _cells(sides.vb, sides.vc)
    if paired:
        gb, gc, unpaired = _pair_up(con, gb, gc, cells, sides.vb.iloc[0:0])
        sides.exclude_unpaired(unpaired)
    empty = sides.vb.iloc[0:0]
    values = [(gb.get(cell, empty)["boot_value"].to_numpy(dtype=float),
               gc.get(cell, empty)["boot_value"].to_numpy(dtype=float)) for cell in cells]
    prior_var, prior_df = ([math.nan] * len(cells), [0.0] * len(cells)) if paired or not history else \
        _history_priors(con, sides.keep_b + sides.keep_c, metric, quality, statuses, cells, values)
    na_names = sorted({n for e in sides.not_applied.env for n in e.split(", ")}) if sides.na_sides else []
    verdicts = cell_verdicts(values, design="paired" if paired else "fixed", higher_is_better=direction > 0,
                             confidence=confidence, min_boots=min_boots, borrow=borrow, prior_var=prior_var,
                             prior_df=prior_df, not_applied_sides=sides.na_sides, not_applied_names=na_names)
    # Did both sides run the same work? Token counts per request from the server's usage (a tokenizer change
    # between releases moves them); the change and its size are named on the row.
    tok_b, tok_c = _token_counts(con, sides.keep_b), _token_counts(con, sides.keep_c)
    rows = [_cell_row(cell, values[i], gb.get(cell, empty), gc.get(cell, empty), verdicts[i],
                      tok_b, tok_c, sides, metric, direction, confidence)
            for i, cell in enumerate(cells)]
    out = pd.DataFrame(rows, columns=ABRecord.columns())
    # The headline verdicts of this comparison as one family (Holm); a report that joins several comparisons
    # (configs, metrics) adjusts their union again (warehouse.selection.compare_frames).
    out = family_adjust(out, alpha=1.0 - confidence)
    out.attrs = {}
    out.attrs["excluded"] = sides.excluded()
    out.attrs["not_applied"] = sides.not_applied
    out.attrs["method"] = _method_text(confidence, paired, borrow, min_boots)
    return out


@dataclass
class _Sides:
    """The trials of each side kept for the comparison, their boot values and what was left out, and why.

    ``keep_*``: trial ids kept; ``excl_*``: dicts (side, trial_id, reason) left out; ``vb``/``vc``: the boot
    values (``_boot_values``); ``not_applied``: DataFrame (side, trial_id, env) of kept trials whose vLLM reported
    env vars as unknown; ``na_sides``: the sides none of whose boots applied the setting.
    """

    keep_b: list[str]
    keep_c: list[str]
    excl_b: list[dict]
    excl_c: list[dict]
    vb: pd.DataFrame
    vc: pd.DataFrame
    not_applied: pd.DataFrame
    na_sides: list[str]

    def excluded(self) -> pd.DataFrame:
        """All trials left out, as a DataFrame (side, trial_id, reason)."""
        return pd.DataFrame(self.excl_b + self.excl_c, columns=["side", "trial_id", "reason"])

    def exclude_unpaired(self, unpaired: list[tuple[str, str]]) -> None:
        """Record the (side, trial_id) boots without a partner as left out of the pairs (once per trial)."""
        for side, tid in unpaired:
            excl = self.excl_b if side == "baseline" else self.excl_c
            if not any(e["trial_id"] == tid for e in excl):
                excl.append({"side": side, "trial_id": tid, "reason": "no partner boot (same sweep and replicate) "
                                                                      "on the other side: left out of the pairs"})


def _select_sides(con, baseline: dict, candidate: dict, metric: str, quality: Sequence[str],
                  statuses: Sequence[str]) -> _Sides:
    """Both sides' trials, filtered by status and quality, with their boot values of ``metric``.

    Raises:
        ValueError: the two selectors match a common trial.
    """
    tb, tc = _trials(con, baseline), _trials(con, candidate)
    overlap = set(tb.trial_id) & set(tc.trial_id)
    if overlap:
        raise ValueError(
            f"baseline and candidate selectors both match trials {sorted(overlap)[:3]}; make them disjoint"
        )
    keep_b, excl_b = _split(tb, "baseline", quality, statuses)
    keep_c, excl_c = _split(tc, "candidate", quality, statuses)
    vb, vc = _boot_values(con, keep_b, metric), _boot_values(con, keep_c, metric)
    for side, keep, vals, excl in (("baseline", keep_b, vb, excl_b), ("candidate", keep_c, vc, excl_c)):
        for tid in sorted(set(keep) - set(vals.trial_id)):
            excl.append({"side": side, "trial_id": tid, "reason": f"no {metric} values"})
    na = _not_applied(tb, keep_b, "baseline") + _not_applied(tc, keep_c, "candidate")
    not_applied = pd.DataFrame(na, columns=["side", "trial_id", "env"])
    # A side none of whose boots applied the setting did not test it (its vLLM ignored the env var).
    na_sides = [side for side, keep in (("baseline", keep_b), ("candidate", keep_c))
                if keep and set(keep) <= set(not_applied.trial_id[not_applied.side == side])]
    return _Sides(keep_b, keep_c, excl_b, excl_c, vb, vc, not_applied, na_sides)


def _cells(vb: pd.DataFrame, vc: pd.DataFrame) -> tuple[list[tuple], dict, dict]:
    """The (workload, load_kind, load_value) cells either side measured, in report order, and each side's boot
    values grouped by cell."""
    keys = ["workload", "load_kind", "load_value"]
    cells = sorted(set(map(tuple, vb[keys].itertuples(index=False))) | set(map(tuple, vc[keys].itertuples(index=False))),
                   key=lambda k: (str(k[0]), str(k[1]), float(k[2])))
    gb = {k: g for k, g in vb.groupby(keys)} if len(vb) else {}
    gc = {k: g for k, g in vc.groupby(keys)} if len(vc) else {}
    return cells, gb, gc


def _history_priors(con, exclude: list[str], metric: str, quality: Sequence[str], statuses: Sequence[str],
                    cells: list[tuple], values: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list, list]:
    """Per cell, the history's log-scale boot variance and its degrees of freedom (``_history_prior``), or
    (nan, 0) for a cell without history or with a value <= 0 (the log scale does not apply)."""
    prior_var, prior_df = [math.nan] * len(cells), [0.0] * len(cells)
    hist = _history_prior(con, exclude, metric, quality, statuses)
    hmap = {(r.workload, r.load_kind, float(r.load_value)): (float(r.var_log), float(r.df))
            for r in hist.itertuples(index=False)}
    for i, (xb, xc) in enumerate(values):
        if len(xb) and len(xc) and (xb > 0).all() and (xc > 0).all():
            prior_var[i], prior_df[i] = hmap.get((cells[i][0], cells[i][1], float(cells[i][2])), (math.nan, 0.0))
    return prior_var, prior_df


_NO_TOKENS = {"prompt": (0, math.nan, math.nan), "output": (0, math.nan, math.nan)}


def _cell_row(cell: tuple, values: tuple[np.ndarray, np.ndarray], b: pd.DataFrame, c: pd.DataFrame, verdict,
              tok_b: dict, tok_c: dict, sides: _Sides, metric: str, direction: int, confidence: float) -> dict:
    """One cell's ``ABRecord`` as a dict: the boot means and SDs, the verdict's interval, the plain Welch
    interval beside it and the token counts of both sides."""
    key = (cell[0], cell[1], float(cell[2]))
    tb_, tc_ = tok_b.get(key, _NO_TOKENS), tok_c.get(key, _NO_TOKENS)
    tokens = {"baseline_prompt_tokens": tb_["prompt"][1], "candidate_prompt_tokens": tc_["prompt"][1],
              "baseline_output_tokens": tb_["output"][1], "candidate_output_tokens": tc_["output"][1],
              "token_change": "; ".join(t for t in (token_change(w, tb_[w], tc_[w]) for w in ("prompt", "output"))
                                        if t)}
    xb, xc = values
    mb = float(xb.mean()) if len(xb) else math.nan
    mc = float(xc.mean()) if len(xc) else math.nan
    diff = mc - mb
    row = {
        "workload": cell[0], "load_kind": cell[1], "load_value": float(cell[2]), "metric": metric,
        "higher_is_better": direction > 0,
        "baseline_boots": len(xb), "candidate_boots": len(xc),
        "baseline_repeats": int(b["repeats"].sum()), "candidate_repeats": int(c["repeats"].sum()),
        "baseline_mean": mb, "candidate_mean": mc,
        "baseline_boot_sd": float(xb.std(ddof=1)) if len(xb) > 1 else math.nan,
        "candidate_boot_sd": float(xc.std(ddof=1)) if len(xc) > 1 else math.nan,
        "diff": diff, "rel_diff": diff / mb if mb else math.nan,
        "ci_low": math.nan, "ci_high": math.nan, "rel_ci_low": math.nan, "rel_ci_high": math.nan,
        "p_value": math.nan, "df": math.nan, "se_log": math.nan, "mde_rel": math.nan, "variance_source": "",
        "baseline_trials_excluded": len(sides.excl_b), "candidate_trials_excluded": len(sides.excl_c),
        **verdict.model_dump(exclude_unset=True), **tokens,
    }
    if len(xb) >= 2 and len(xc) >= 2:  # the plain per-cell Welch interval, reported beside the method's
        w = welch_interval(xb, xc, confidence)
        row.update(welch_ci_low=w.low, welch_ci_high=w.high)
    return ABRecord(**row).model_dump()


def _method_text(confidence: float, paired: bool, borrow: bool, min_boots: int) -> str:
    """The comparison's method in one sentence (``attrs["method"]``)."""
    return (
        f"repeats averaged per trial (boot); {confidence:.0%} t interval of the log ratio across boots"
        f"{' paired by sweep and replicate (mean of the pairs log ratios)' if paired else ''}, variance "
        f"{'of the pairs log ratios' if paired else 'pooled'} in the cell"
        f"{' and moderated across cells (empirical Bayes)' if borrow else ''}; MDE at 80 % "
        f"power; inconclusive below {min_boots} {'pairs' if paired else 'boots per side'}"
    )


def _pair_up(con, gb: dict, gc: dict, cells: list, empty: pd.DataFrame) -> tuple[dict, dict, list]:
    """Per cell, the baseline and candidate boots that form pairs (same sweep_id and replicate), in pair order;
    and (side, trial_id) of the boots left without a partner in some cell.

    Raises:
        ValueError: one side holds two boots of one (sweep_id, replicate).
    """
    ids = sorted({t for g in (*gb.values(), *gc.values()) for t in g["trial_id"]})
    keys = {}
    if ids:
        con.register("_tl_pair", pd.DataFrame({"trial_id": ids}))
        try:
            keys = {r[0]: (r[1], r[2]) for r in con.execute(
                "SELECT trial_id, sweep_id, replicate FROM trials JOIN _tl_pair USING (trial_id)").fetchall()}
        finally:
            con.unregister("_tl_pair")
    out_b, out_c, unpaired = {}, {}, set()
    for cell in cells:
        b, c = gb.get(cell, empty), gc.get(cell, empty)
        for side, g in (("baseline", b), ("candidate", c)):
            k = [keys.get(t) for t in g["trial_id"]]
            if len(set(k)) < len(k):
                raise ValueError(f"paired: the {side} selector matches two boots of one sweep and replicate in "
                                 f"{cell[0]} {cell[1]}={cell[2]:g}; pairs need one boot per side and replicate "
                                 "(select one config per side, e.g. config_key=...)")
        kb = {keys.get(t): t for t in b["trial_id"]}
        kc = {keys.get(t): t for t in c["trial_id"]}
        common = sorted(set(kb) & set(kc), key=lambda k: (str(k[0]), k[1]))
        unpaired |= {("baseline", kb[k]) for k in set(kb) - set(common)}
        unpaired |= {("candidate", kc[k]) for k in set(kc) - set(common)}
        out_b[cell] = b.set_index("trial_id").loc[[kb[k] for k in common]].reset_index()
        out_c[cell] = c.set_index("trial_id").loc[[kc[k] for k in common]].reset_index()
    return out_b, out_c, sorted(unpaired)


def regressions(
    con: duckdb.DuckDBPyConnection,
    metric: str = "output_tokens_per_s",
    threshold_rel: float = 0.05,
    consecutive: int = 2,
    *,
    order_by: str = "version",
    noise_k: float = 2.0,
    baseline_window: int = 3,
    config_key: str | Sequence[str] | None = None,
    quality: Iterable[str] = ("pass", "warn"),
    statuses: Iterable[str] = ("ok",),
) -> pd.DataFrame:
    """Find regressions of ``metric`` along vLLM versions (or sweep dates) per config.

    Method: trials (boots) that pass the status/quality filter are reduced to boot means
    (repeats averaged). Series key: (config_key, gpu_name, workload, load_kind, load_value).
    A point is one vLLM release (``order_by="version"``, PEP 440 order via
    ``trials.vllm_version_key``, never the raw string; builds that differ only in their local part, such as
    ``0.26.0`` and ``0.26.0+empty``, are one point, and untrusted versions such as ``0.1.devN`` are left out:
    ``warehouse.versions``) or one sweep (``order_by="date"``,
    by start time); its value is the mean over its boots. Walking the series, the baseline is
    the mean over the boots of the last ``baseline_window`` points that did not violate (a
    window, as the HUD's baseline aggregation, so one lucky point does not make every later
    point look worse). A point violates when it is worse than the baseline by more than
    ``threshold_rel`` (relative, direction-aware) AND the difference exceeds
    ``noise_k * sd * sqrt(1/n_baseline + 1/n_point)`` (n = boots), sd being the boot-to-boot SD pooled over
    the series (or, when no point has two boots, the robust successive-difference estimate
    ``median|diff| / (0.6745 * sqrt 2)`` over >= 3 points). ``consecutive`` successive
    violations confirm a regression (PyTorch HUD: trailing run >= 2).

    Returns:
        DataFrame, one row per point: series key, ``point`` (public version such as ``0.26.0``, or sweep_id),
        ``vllm_version`` (by version: the point's builds, comma-separated), ``vllm_version_key``, ``first_run_at``, ``boots``, ``value`` (mean of
        boot means), ``boot_sd``, ``baseline_point``, ``baseline_value``, ``rel_change``
        ((value - baseline)/baseline), ``worse_rel`` (positive = worse), ``noise_band`` (metric
        unit), ``mde_rel`` (the relative worsening this point would flag with 80 % power: the flag threshold
        ``max(threshold_rel, band / baseline)`` plus 0.84 SE), ``violation``, ``status`` (``baseline`` | ``ok`` | ``violation_unconfirmed`` |
        ``regression`` | ``insufficient_data``) and ``regression_start`` (first point of a
        confirmed regression).

    Raises:
        ValueError: unknown metric or order_by, threshold_rel < 0, consecutive < 1.
    """
    direction = metric_direction(metric)
    if order_by not in ("version", "date"):
        raise ValueError(f"order_by must be 'version' or 'date', got {order_by!r}")
    if threshold_rel < 0 or consecutive < 1 or baseline_window < 1:
        raise ValueError("threshold_rel must be >= 0, consecutive >= 1 and baseline_window >= 1")
    quality, statuses = list(quality), list(statuses)
    params: list = [*statuses, *quality]
    extra = ""
    if config_key is not None:
        keys = [config_key] if isinstance(config_key, str) else list(config_key)
        extra = f" AND f.config_key IN ({', '.join('?' for _ in keys)})"
        params += keys
    df = con.execute(
        f"""SELECT f.config_key, f.gpu_name, m.workload, m.load_kind, m.load_value,
                   f.trial_id, f.sweep_id, f.vllm_version, f.vllm_version_key, f.run_at,
                   coalesce(f.vllm_public_version, f.vllm_version) AS vllm_public_version,
                   avg(m.{metric}) AS boot_value
            FROM measurements m JOIN trial_facts f ON f.trial_id = m.trial_id
            WHERE f.status IN ({', '.join('?' for _ in statuses)})
              AND f.quality_verdict IN ({', '.join('?' for _ in quality)}) {extra}
              AND m.overloaded IS NOT TRUE  -- an open-loop window the server fell behind (021)
              AND m.{metric} IS NOT NULL AND isfinite(m.{metric})
            GROUP BY ALL""",
        params,
    ).fetchdf()
    series_keys = ["config_key", "gpu_name", "workload", "load_kind", "load_value"]
    if order_by == "version":
        df = df[df["vllm_version_key"].notna()]
    return regression_table(df, series_keys, metric, direction, order_by=order_by, threshold_rel=threshold_rel,
                            consecutive=consecutive, noise_k=noise_k, baseline_window=baseline_window)
