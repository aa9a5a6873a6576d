"""The sweep's shape checks (``sweep_shape``: ``anchor_drift``, ``windows_multimodal``) as ``quality_checks`` rows.

Run by the sweep after every bundle is validated and before loading (results on disk first): they judge several
trials together, which the per-trial suites cannot. Rows go into the bundles of the trials they concern, suite
``sweep_shape``, severity ``warn``, stamped with today's rule version (``quality_thresholds.RULE_VERSIONS`` v4, v5):

* ``anchor_drift``: one row per (cell, metric) in every boot of the plan's anchor (``Plan.anchor_trial``'s
  runtime and config key); the boot's value is the mean of its windows, its order the start order in the sweep.
* ``windows_multimodal``: one row per (config, cell, metric) and boot, on that boot's windows alone (rule v5; v4
  pooled the config's boots, and boot-to-boot spread read as two modes).

A failed check (a trend, or two modes) makes a ``pass`` trial ``warn``, as a failed warn check of the per-trial
suites does; it never fails a trial. The metrics are those of the issue's A/A study (:data:`SHAPE_METRICS`).
Windows of an ``sla_search:`` and overloaded windows are left out, as in the comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from tunelab.core.bundle import read_bundle, update_bundle_table
from tunelab.core.load_profiles import load_label
from tunelab.core.quality_thresholds import RULES_VERSION
from tunelab.tasks.quality.sweep_shape import anchor_drift, windows_multimodal

__all__ = ["ANCHOR_DRIFT_MIN_BOOTS", "SHAPE_METRICS", "SHAPE_SUITE", "anchor_boot_warning", "record_shape_checks",
           "shape_check_lines", "shape_check_rows", "keep_shape_rows", "sweep_shape_step"]

#: The metrics the shape checks judge: output tokens/s, p50 TPOT, p50 TTFT, p99 ITL (issue 28's A/A study).
SHAPE_METRICS: tuple[str, ...] = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s", "itl_p99_s")
#: ``quality_checks.suite`` of these rows.
SHAPE_SUITE = "sweep_shape"
#: Fewest anchor boots in a sweep that ``anchor_drift`` tests a trend on (``sweep_shape.anchor_drift``'s
#: ``min_boots``): a slope on 3 points has 1 degree of freedom.
ANCHOR_DRIFT_MIN_BOOTS = 4
#: What one shape check row judges, for the summary lines.
_UNITS = {"anchor_drift": "cell x metric", "windows_multimodal": "boot x cell x metric"}


def anchor_boot_warning(anchor_boots: int) -> str | None:
    """The warning for a plan whose ``anchor:`` gets ``anchor_boots`` boots in a sweep (one a boot round), fewer
    than ``anchor_drift`` needs (:data:`ANCHOR_DRIFT_MIN_BOOTS`); None when it gets enough.
    Shown by ``tunelab plan check`` (the check would be skipped, leaving the anchor's trend unchecked)."""
    if anchor_boots >= ANCHOR_DRIFT_MIN_BOOTS:
        return None
    return (f"anchor: the anchor gets {anchor_boots} boot(s) in this sweep (one a boot round, replicates: "
            f"{anchor_boots}); the anchor_drift quality check needs {ANCHOR_DRIFT_MIN_BOOTS} and will be skipped, so "
            f"a trend of the host over the sweep goes unchecked: set replicates: {ANCHOR_DRIFT_MIN_BOOTS} or more "
            "(docs/quality.md, 'Rule versions')")


def shape_check_lines(rows: pd.DataFrame, anchor: bool) -> list[str]:
    """One line per shape check of a sweep: on how many groups it ran (and flagged), on how many it was skipped
    and why, or why it did not run at all.

    Args:
        rows: ``quality_checks`` rows (``expectation, success, detail``; one per trial a group concerns) of suite
            :data:`SHAPE_SUITE`, as :func:`shape_check_rows` returns or the warehouse holds; a group's rows in
            several trials count once.
        anchor: whether the plan has an ``anchor:`` (without one, ``anchor_drift`` has nothing to judge).
    """
    if len(rows):
        rows = rows.drop_duplicates(["expectation", "detail"])
    out = []
    for check, unit in _UNITS.items():
        g = rows[rows.expectation == check] if len(rows) else rows
        if not len(g):
            why = "the plan has no anchor:" if check == "anchor_drift" and not anchor else "no measured windows"
            out.append(f"shape check {check}: not run ({why})")
            continue
        ok = g["success"].astype("boolean")
        ran, skipped = g[ok.notna().to_numpy()], g[ok.isna().to_numpy()]
        line = f"shape check {check}: ran on {len(ran)} {unit}" + (
            f" ({int((ok == False).sum())} flagged)" if len(ran) else "")  # noqa: E712 - nullable
        if len(skipped):
            reasons = sorted({str(d).split("skipped: ", 1)[-1] for d in skipped["detail"]})
            line += f"; skipped on {len(skipped)}: " + "; ".join(reasons[:3]) + (
                f"; and {len(reasons) - 3} more reason(s)" if len(reasons) > 3 else "")
        out.append(line)
    return out


def _windows(meas: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    m = meas
    for flag in ("sla_search_window", "overloaded"):
        if flag in m.columns:
            m = m[~m[flag].astype("boolean").fillna(False).astype(bool)]
    m = m.assign(cell=[f"{w} {load_label(k, v)}" for w, k, v in zip(m.workload, m.load_kind, m.load_value)])
    cols = [c for c in metrics if c in m.columns]
    return m.melt(id_vars=["trial_id", "cell"], value_vars=cols, var_name="metric", value_name="value").dropna(
        subset=["value"])


def shape_check_rows(trials: pd.DataFrame, measurements: pd.DataFrame, anchor: tuple[str, str] | None, *,
                     metrics: Sequence[str] = SHAPE_METRICS) -> pd.DataFrame:
    """``quality_checks`` rows of the shape checks of one sweep.

    Args:
        trials: one row per trial of the sweep: ``trial_id, runtime_name, config_key, config_label, status,
            started_at`` (start order = boot order).
        measurements: their ``measurements`` rows (one per window).
        anchor: ``(runtime_name, config_key)`` of the plan's anchor, or None (no ``anchor_drift``).
        metrics: the measurement columns judged.

    Returns:
        Rows ``trial_id, suite, expectation, success, severity, observed, threshold, detail, rule_version``
        (``observed``/``threshold`` as text: the statistic and its limit; ``detail`` names the cell and metric).
    """
    ok = trials[trials["status"] == "ok"].sort_values(["started_at", "trial_id"]).reset_index(drop=True)
    ok = ok.assign(order=range(len(ok)), unit=list(zip(ok.runtime_name, ok.config_key)),
                   group=ok.config_label.astype(str) + " [" + ok.config_key.astype(str) + "]")
    win = _windows(measurements[measurements.trial_id.isin(ok.trial_id)], metrics).merge(
        ok[["trial_id", "order", "unit", "group"]], on="trial_id")
    out: list[dict] = []

    def emit(res: pd.DataFrame, key: str, trial_ids: dict) -> None:
        for r in res.itertuples(index=False):
            for tid in trial_ids.get(getattr(r, key) if key else None, []):
                out.append({"trial_id": tid, "suite": SHAPE_SUITE, "expectation": r.check, "success": r.success,
                            "severity": "warn", "observed": None if pd.isna(r.observed) else f"{r.observed:.4g}",
                            "threshold": None if pd.isna(r.threshold) else f"{r.threshold:.4g}",
                            "detail": f"{r.label}: {r.detail}"})

    if anchor is not None and len(win):
        a = win[win.unit == tuple(anchor)]
        if len(a):
            boots = a.groupby(["trial_id", "order", "cell", "metric"], as_index=False)["value"].mean()
            res = anchor_drift(boots, min_boots=ANCHOR_DRIFT_MIN_BOOTS)
            emit(res, "", {None: sorted(a.trial_id.unique())})
    if len(win):
        # One boot's windows at a time (rule v5): pooled over boots, boot-to-boot spread reads as two modes.
        per = win.assign(group=win.group + " " + win.cell + " boot " + win.trial_id.astype(str))
        res = windows_multimodal(per[["group", "metric", "value"]]).assign(
            grp=lambda d: [lbl.rsplit(" ", 1)[0] for lbl in d.label])
        emit(res, "grp", per.groupby("group")["trial_id"].apply(lambda s: sorted(s.unique())).to_dict())
    df = pd.DataFrame(out, columns=["trial_id", "suite", "expectation", "success", "severity", "observed",
                                    "threshold", "detail"])
    df["success"] = df["success"].astype("boolean")
    df["rule_version"] = RULES_VERSION
    return df


def record_shape_checks(bundles: Sequence[Path | None], anchor: tuple[str, str] | None) -> pd.DataFrame:
    """Compute the shape checks over a sweep's bundles and add their rows to each bundle's ``quality_checks``
    (earlier ``sweep_shape`` rows replaced); a ``pass`` trial with a failed row becomes ``warn``.

    Returns:
        The rows written (empty when no trial measured).

    Raises:
        BundleError: a bundle that cannot be read or written (``tunelab.core.bundle``).
    """
    tables = {Path(b): read_bundle(Path(b)) for b in bundles if b is not None}
    tables = {b: t for b, t in tables.items() if "trial" in t}
    if not tables:
        return pd.DataFrame()
    trials = pd.concat([t["trial"] for t in tables.values()], ignore_index=True)
    meas = [t["measurements"] for t in tables.values() if "measurements" in t and len(t["measurements"])]
    if not meas:
        return pd.DataFrame()
    rows = shape_check_rows(trials, pd.concat(meas, ignore_index=True), anchor)
    for b, t in tables.items():
        tid = t["trial"].iloc[0]["trial_id"]
        mine = rows[rows.trial_id == tid]
        if not len(mine):
            continue
        old = t.get("quality_checks", pd.DataFrame())
        if len(old) and "suite" in old.columns:
            old = old[old["suite"] != SHAPE_SUITE]
        update_bundle_table(b, "quality_checks", pd.concat([old, mine], ignore_index=True) if len(old) else mine)
        if t["trial"].iloc[0].get("quality_verdict") == "pass" and (mine["success"] == False).any():  # noqa: E712
            tdf = t["trial"].copy()
            tdf["quality_verdict"] = "warn"
            update_bundle_table(b, "trial", tdf)
    return rows


def sweep_shape_step(bundles: Sequence[Path | None], statuses: Sequence[dict | None], anchor: tuple[str, str] | None,
                     logger) -> None:
    """The sweep's call (``flows.sweep``, after validation, before loading): :func:`record_shape_checks`, the
    trial statuses' ``verdict`` brought up to date, one log line per failed check. Never fails the sweep: a
    check that cannot run is logged and the bundles keep their per-trial verdicts."""
    try:
        rows = record_shape_checks(bundles, anchor)
    except Exception as e:  # a view of the data's shape; never lose a sweep over it
        logger.warning("sweep shape checks could not run: %s: %s", type(e).__name__, e)
        return
    for line in shape_check_lines(rows, anchor is not None):  # which ran, which were skipped and why
        logger.info("%s", line)
    if not len(rows):
        return
    bad = rows[rows["success"] == False]  # noqa: E712 - a nullable boolean column
    for st, b in zip(statuses, bundles):
        if st is not None and b is not None and st.get("verdict") == "pass" and \
                (bad.trial_id == st.get("trial_id")).any():
            st["verdict"] = "warn"
    for r in bad.drop_duplicates(["expectation", "detail"]).itertuples(index=False):
        logger.warning("quality check %s/%s (severity warn): %s", SHAPE_SUITE, r.expectation, r.detail)


def keep_shape_rows(result, stored: pd.DataFrame):
    """A trial's re-judgement (``tasks.quality.validate_trial``'s ``QualityResult``) with its stored
    ``sweep_shape`` rows carried over (``tunelab recheck`` re-runs a trial's own suites only; these need the
    whole sweep): the rows appended, a ``pass`` verdict made ``warn`` where one of them failed."""
    import dataclasses

    if not len(stored) or "suite" not in stored.columns:
        return result
    shape = stored[stored["suite"] == SHAPE_SUITE]
    if not len(shape):
        return result
    shape = shape[[c for c in result.checks.columns if c in shape.columns]]
    checks = pd.concat([result.checks, shape], ignore_index=True)
    checks["success"] = checks["success"].astype("boolean")
    failed = (shape["success"].astype("boolean") == False).any()  # noqa: E712
    verdict = "warn" if result.verdict == "pass" and failed else result.verdict
    return dataclasses.replace(result, verdict=verdict, checks=checks)
