"""Re-judge stored trials with today's quality rules and bottleneck checks (``tunelab recheck``).

A trial's quality verdict and its window diagnoses are computed once, when the trial ends, by the code of that day.
When a rule changes (a check learns to tell a slow server frontend from a distorted client, a threshold is
corrected from measured cases), the trials already in the warehouse keep the old judgement, and A/Bs and searches
read it: a boot the old rule left out stays out. ``recheck`` runs the current quality suites
(``tasks.quality.validate_trial``, with the thresholds of the trial's own plan, ``sweeps.plan_yaml``) and the
current diagnosis (``tasks.bottleneck_evidence.window_diagnoses``) on the stored rows of each measured trial and replaces
``quality_checks``, ``trials.quality_verdict`` and ``window_diagnoses``, one transaction per trial.

A boot of a ``search:`` counts for the search only when its quality verdict is pass or warn, so its search state
follows the new verdict: a boot the old rule left out (state ``fail``, no value) gets its objective value and SLO
verdict from its stored windows (``search.objective_value``, the rule the search ran), one that the new rule
leaves out loses them, and ``sweeps.search_best_config_key`` is recomputed over the boots that are ``complete``
(met the SLO). A pruned boot stays pruned (the search stopped it early; it has no full record to judge).

What it reads is what the trial recorded (``requests``, ``measurements``, ``server_metrics``, ``gpu_samples``):
nothing is measured again, so a check whose inputs the trial did not record is skipped as it was then. The
``gpu_floor`` rows are kept as stored: that check needs the model's weight files and the GPU's bus width, which
belong to the host that ran the trial, and no rule of it changed by re-reading them. Likewise a finding the re-run
cannot judge (``flagged`` NULL: its inputs are gone, e.g. ``requests.chunk_offsets_s`` nulled to keep an exported
warehouse small) keeps its stored row when that row had a judgement: a recheck never replaces evidence with none.

The result bundle, where it is still on disk (``loaded_bundles.bundle_path``), gets the same new tables (atomic
``bundle.update_bundle_table``) and ``loaded_bundles`` its new sha256, so that a warehouse rebuilt from the bundles
holds the same judgement and ``tunelab load`` does not load it again. A warehouse rebuilt from exported Parquet
(bundles gone) is updated in place.

Rule versions (``quality_thresholds.RULE_VERSIONS``): each row says which version judged the stored rows and which
judges now; the re-judged rows are stamped with today's version. ``recheck(rules=N)`` also judges every trial under
version N's thresholds and returns that verdict beside today's (shown, not stored).

The flow moves data between ``tasks`` (the rules) and ``warehouse`` (the rows), which must not import each other:
that is why it lives here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb
import pandas as pd
import yaml

from tunelab.core import records as R
from tunelab.core.bundle import BundleError, read_bundle, update_bundle_table, verify_bundle
from tunelab.core.plan import Plan
from tunelab.core.quality_thresholds import RULES_VERSION, QualityThresholds, thresholds_for_version
from tunelab.core.search.config_tpe import objective_value
from tunelab.tasks.bottleneck_evidence import window_diagnoses
from tunelab.tasks.quality import validate_trial
from tunelab.tasks.quality.shape_checks import keep_shape_rows
from tunelab.warehouse.loader import DEFAULT_LOCK_TIMEOUT_S, open_warehouse

__all__ = ["RecheckRow", "recheck"]

#: The tables a trial's judgement is computed from.
_INPUTS = ("requests", "measurements", "server_metrics", "gpu_samples")


@dataclass
class RecheckRow:
    """What recheck did to one trial.

    Attributes:
        trial_id, sweep_id, config_label, replicate: the trial.
        old_verdict, new_verdict: ``trials.quality_verdict`` before and after (pass | warn | fail | unvalidated).
        old_failed, new_failed: names of the failed checks (``quality_checks.expectation``), before and after.
        old_flagged, new_flagged: ``{bottleneck: windows flagged}`` of ``window_diagnoses``, before and after.
        bundle: ``updated`` (the bundle on disk got the new tables), ``absent`` (no bundle on disk: the
            warehouse alone was updated), ``unchanged`` (nothing differed, nothing written) or ``not updated (why)``
            (the bundle could not be written: the trial is unchanged in the bundle and the warehouse).
        old_search_state, new_search_state, new_search_value: a search boot's ``trials.search_state`` (complete |
            infeasible | fail) before and after, and its objective value after (None: not a search boot, or the
            boot does not count).
        old_rule_version, new_rule_version: the quality rule version that judged the stored rows
            (``quality_checks.rule_version``; None: unversioned) and today's (``quality_thresholds.RULES_VERSION``).
        rules_version, rules_verdict, rules_failed: with ``recheck(rules=N)``, N and the verdict and failed checks
            under version N's thresholds (``quality_thresholds.thresholds_for_version``; the plan's own thresholds on
            top); None otherwise.
    """

    trial_id: str
    sweep_id: str
    config_label: str
    replicate: int
    old_verdict: str | None
    new_verdict: str
    old_failed: list[str] = field(default_factory=list)
    new_failed: list[str] = field(default_factory=list)
    old_flagged: dict[str, int] = field(default_factory=dict)
    new_flagged: dict[str, int] = field(default_factory=dict)
    bundle: str = "unchanged"
    old_search_state: str | None = None
    new_search_state: str | None = None
    new_search_value: float | None = None
    old_rule_version: int | None = None
    new_rule_version: int = RULES_VERSION
    rules_version: int | None = None
    rules_verdict: str | None = None
    rules_failed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when the verdict, the failed checks, the flagged windows or the search state differ."""
        return (self.old_verdict != self.new_verdict or sorted(self.old_failed) != sorted(self.new_failed)
                or self.old_flagged != self.new_flagged or self.old_search_state != self.new_search_state)


def _plan_inputs(plan_yaml: str | None) -> tuple[QualityThresholds, bool | None, str | None]:
    """The plan's quality thresholds, whether every workload fixed its output length (ignore_eos), and a note when
    the thresholds are not the plan's own.

    A stored plan that today's Plan model no longer accepts (fields renamed since) still gives its ``quality:``
    section when that parses; else the defaults, with a note saying so (a recheck rewrites verdicts: it must not
    judge by other thresholds than the plan's without saying it)."""
    raw = yaml.safe_load(plan_yaml) if plan_yaml else None
    if not isinstance(raw, dict):
        return QualityThresholds(), None, "no stored plan: default quality thresholds used"
    try:
        plan = Plan.model_validate(raw)
        return plan.quality, all(w.ignore_eos for w in plan.workloads), None
    except Exception:  # noqa: BLE001 - an old plan: its thresholds alone, or the defaults
        try:
            return QualityThresholds(**(raw.get("quality") or {})), None, None
        except Exception as e:  # noqa: BLE001
            first = str(e).splitlines()
            return QualityThresholds(), None, (f"its stored plan's quality: section is not valid today "
                                               f"({' '.join(first[:3])}): default quality thresholds used")


def _stored_rule_version(checks: pd.DataFrame) -> int | None:
    """The rule version stamped on a trial's stored ``quality_checks`` rows (None: unversioned rows)."""
    if "rule_version" not in checks.columns or checks["rule_version"].isna().all():
        return None
    return int(checks["rule_version"].max())


def _flagged(diag: pd.DataFrame) -> dict[str, int]:
    if diag is None or len(diag) == 0:
        return {}
    f = diag[diag["flagged"].fillna(False).astype(bool)]
    return {str(k): int(v) for k, v in f.groupby("bottleneck").size().items()}


def _failed(checks: pd.DataFrame) -> list[str]:
    if checks is None or len(checks) == 0:
        return []
    return sorted(str(e) for e in checks.loc[checks["success"].astype("boolean").eq(False).fillna(False),
                                             "expectation"])


_USABLE = ("pass", "warn")


def _search_state(trial: dict, meas: pd.DataFrame, objective: dict | None, verdict: str
                  ) -> tuple[str | None, float | None, float | None]:
    """(search_state, search_value, search_slo_violation) of a measured search boot under ``verdict``, by the rule of
    ``search.SearchRunner`` (a boot counts when its quality verdict is pass or warn). A boot that is not part of a
    search, or was pruned, keeps what it has."""
    state = trial.get("search_state")
    if not objective or pd.isna(trial.get("search_role")) or state == "pruned":
        return state, trial.get("search_value"), trial.get("search_slo_violation")
    if verdict not in _USABLE:
        return "fail", None, None
    ov = objective_value(meas, objective["metric"], objective["workload"], objective["load"],
                         objective.get("slo") or {}, int(objective.get("slo_percentile") or 90))
    if ov.value is None:
        return "fail", None, None
    return ("complete" if ov.feasible else "infeasible"), ov.value, ov.violation


def _best_key(con: Any, sweep_id: str, objective: dict) -> str | None:
    """The best ``complete`` boot's config key (the search's rule: the SLO met, then the objective)."""
    order = "DESC" if objective.get("direction", "maximize") == "maximize" else "ASC"
    r = con.execute(f"SELECT config_key FROM trials WHERE sweep_id = ? AND search_state = 'complete' "
                    f"AND search_value IS NOT NULL ORDER BY search_value {order}, started_at LIMIT 1",
                    [sweep_id]).fetchall()
    return r[0][0] if r else None


def _store_best(con: Any, sweep_id: str, objective: dict, bundle_paths: dict[str, str],
                warn: Callable[[str], None] | None = None) -> None:
    """Recompute ``sweeps.search_best_config_key``; when it changed, write it to the warehouse and to the sweep
    row every bundle of the sweep carries (the loader upserts the sweep row from them)."""
    old = con.execute("SELECT search_best_config_key FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchall()[0][0]
    new = _best_key(con, sweep_id, objective)
    if new == old:
        return
    con.execute("UPDATE sweeps SET search_best_config_key = ? WHERE sweep_id = ?", [new, sweep_id])
    for (tid,) in con.execute("SELECT trial_id FROM trials WHERE sweep_id = ?", [sweep_id]).fetchall():
        bpath = bundle_paths.get(tid)
        if bpath and Path(bpath).is_dir():
            try:
                sdf = read_bundle(Path(bpath))["sweep"].copy()
                sdf["search_best_config_key"] = new
                update_bundle_table(Path(bpath), "sweep", sdf)
            except (BundleError, OSError) as e:
                if warn is not None:  # the warehouse holds the new best; this bundle's sweep row keeps the old one
                    warn(f"sweep {sweep_id}: the search's best is now {new}, but bundle {bpath} could not be "
                         f"updated ({type(e).__name__}: {e}); `tunelab load` would bring back {old}")
                continue
            con.execute("UPDATE loaded_bundles SET sha256 = ? WHERE bundle_id = ?",
                        [verify_bundle(Path(bpath))["manifest_sha256"], tid])


_WINDOW = ["workload", "load_kind", "load_value", "repeat", "bottleneck"]
# rule_version too: rows judged by an earlier version are restamped with the version that judged them now.
_CHECK_COLS = ["suite", "expectation", "success", "severity", "observed", "threshold", "detail", "rule_version"]
_DIAG_COLS = _WINDOW + ["flagged", "metric", "value", "threshold", "summary", "evidence", "remedy", "sources"]


def _differs(old: pd.DataFrame, new: pd.DataFrame, cols: list[str], key: list[str]) -> bool:
    """Whether two tables of one trial hold different rows (compared as text, in key order)."""
    if len(old) != len(new):
        return True
    if len(old) == 0:
        return False

    def canon(df: pd.DataFrame) -> list[tuple[str, ...]]:
        d = df.reindex(columns=cols).astype(object).where(df.reindex(columns=cols).notna(), None)
        rows = [tuple(_canon_cell(v) for v in r) for r in d.itertuples(index=False)]
        return sorted(rows)
    return canon(old) != canon(new)


def _canon_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str) and v[:1] == "{":
        try:  # JSON text: key order and spacing are not content
            return json.dumps(json.loads(v), sort_keys=True)
        except ValueError:
            return v
    if isinstance(v, float):
        return format(v, ".12g")
    return str(v)


def _keep_stored(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """``new`` diagnoses (without ``trial_id``) with the stored ``old`` row kept for every ``gpu_floor`` finding and
    every finding ``new`` could not judge (flagged NULL) that ``old`` had judged."""
    if old is None or len(old) == 0:
        return new
    old = old.drop(columns=["trial_id"], errors="ignore")
    judged = old[(old["bottleneck"] == "gpu_floor") | old["flagged"].notna()]
    if len(new):
        k_new = new[_WINDOW].astype(str).agg("|".join, axis=1)
        k_old = judged[_WINDOW].astype(str).agg("|".join, axis=1)
        replace = set(k_old[judged["bottleneck"] == "gpu_floor"]) | (
            set(k_new[new["flagged"].isna()]) & set(k_old))
        keep_new = new[~k_new.isin(replace)]
        take_old = judged[k_old.isin(replace) | ~k_old.isin(set(k_new))]
    else:
        keep_new, take_old = new, judged
    return pd.concat([d for d in (keep_new, take_old) if len(d)], ignore_index=True) if len(take_old) else keep_new


def _json_col(df: pd.DataFrame, col: str) -> pd.DataFrame:
    """DuckDB returns JSON columns as text already; a dict (from a fresh computation) is written as JSON."""
    if col in df.columns:
        df[col] = df[col].map(lambda v: json.dumps(v, sort_keys=True, default=str) if isinstance(v, dict) else v)
    return df


def recheck(db: str | Path, sweeps: list[str] | None = None, *, dry_run: bool = False,
            lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S, warn: Callable[[str], None] | None = None,
            rules: int | None = None) -> list[RecheckRow]:
    """Re-run today's quality suites and bottleneck checks on stored trials and store the new judgement.

    Args:
        db: the DuckDB warehouse file.
        sweeps: sweep ids to recheck (None: every sweep). Unknown ids raise.
        dry_run: compute and return the rows, write nothing.
        lock_timeout_s: how long to wait for another process holding the warehouse (``open_warehouse``).
        warn: called with one line per sweep judged by other thresholds than its plan's (its stored plan's
            ``quality:`` no longer valid: the defaults are used).
        rules: also judge each trial under this earlier rule version (``RecheckRow.rules_verdict``; only shown,
            never stored).

    Returns:
        One :class:`RecheckRow` per measured trial (``trials.status = 'ok'``), in sweep, config, replicate order.
        Trials that did not measure (boot_failed, failed, cancelled) have nothing to judge and are not returned.

    Raises:
        ValueError: a sweep id that is not in the warehouse (naming the ids that are); an unknown ``rules``.
        warehouse.loader.WarehouseLocked: another process held the warehouse for ``lock_timeout_s``.
        duckdb.Error: ``db`` is not a DuckDB file.

    A trial whose bundle cannot be written keeps its old judgement in the bundle and the warehouse; its row's
    ``bundle`` says why (``not updated (...)``) and the others go on.
    """
    if rules is not None:
        thresholds_for_version(rules)  # an unknown version is refused before the warehouse is opened
    # a dry run reads only: it must not wait for (or block) a reader that holds the file
    con = duckdb.connect(str(db), read_only=True) if dry_run else open_warehouse(db, lock_timeout_s=lock_timeout_s)
    try:
        known = {r[0]: r[1] for r in con.execute("SELECT sweep_id, plan_yaml FROM sweeps").fetchall()}
        cols = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                          "WHERE table_name = 'sweeps'").fetchall()}
        objectives = ({r[0]: json.loads(r[1]) for r in con.execute(
            "SELECT sweep_id, search_objective FROM sweeps WHERE search_objective IS NOT NULL").fetchall()}
            if "search_objective" in cols else {})
        if sweeps:
            missing = [s for s in sweeps if s not in known]
            if missing:
                listed = ", ".join(sorted(known)[-5:]) or "none"
                raise ValueError(f"--sweep {', '.join(missing)}: not in {db} (latest sweeps: {listed})")
        chosen = list(sweeps) if sweeps else sorted(known)
        trials = con.execute(
            "SELECT * FROM trials WHERE status = 'ok' AND sweep_id IN (SELECT unnest(?)) "
            "ORDER BY sweep_id, config_label, replicate, trial_id", [chosen]).df()
        plans = {s: _plan_inputs(known.get(s)) for s in chosen}
        for sid, (_, _, note) in plans.items():
            if note and warn is not None:
                warn(f"sweep {sid}: {note}")
        bundle_paths = dict(con.execute("SELECT bundle_id, bundle_path FROM loaded_bundles").fetchall())
        out: list[RecheckRow] = []
        for trial in trials.to_dict("records"):
            tid = trial["trial_id"]
            th, ignore_eos, _ = plans[trial["sweep_id"]]
            tables = {t: con.execute(f"SELECT * FROM {t} WHERE trial_id = ?", [tid]).df() for t in _INPUTS}
            old_checks = con.execute("SELECT * FROM quality_checks WHERE trial_id = ?", [tid]).df()
            old_diag = con.execute("SELECT * FROM window_diagnoses WHERE trial_id = ?", [tid]).df()
            judged = dict(trial)
            if ignore_eos is not None:
                judged["ignore_eos"] = ignore_eos
            # the sweep's shape checks (rules v4) judge the sweep's trials together: kept as stored
            res = keep_shape_rows(validate_trial(tables, judged, th), old_checks)
            diag = window_diagnoses(tables["measurements"], tables["requests"], tables["server_metrics"],
                                    tables["gpu_samples"], model=None, gpu_name=None, gpu_index=None)
            diag = _keep_stored(diag, old_diag)
            diag = _json_col(diag.assign(trial_id=tid), "evidence")
            objective = objectives.get(trial["sweep_id"])
            state, value, violation = _search_state(trial, tables["measurements"], objective, res.verdict)
            row = RecheckRow(tid, trial["sweep_id"], trial["config_label"], int(trial["replicate"]),
                             trial.get("quality_verdict"), res.verdict, _failed(old_checks), _failed(res.checks),
                             _flagged(old_diag), _flagged(diag),
                             old_search_state=trial.get("search_state") if objective else None,
                             new_search_state=state if objective else None,
                             new_search_value=value if objective else None,
                             old_rule_version=_stored_rule_version(old_checks))
            if rules is not None:
                # the plan's own thresholds (those it set) on top of version N's defaults
                other = validate_trial(tables, judged, thresholds_for_version(rules, th.model_dump(exclude_unset=True)))
                row.rules_version, row.rules_verdict, row.rules_failed = rules, other.verdict, _failed(other.checks)
            out.append(row)
            wcols = list(R.columns(R.WindowDiagnosis))
            # Rows are rewritten when anything in them differs, not only the judgement: a rule may add evidence
            # (figures, a summary) without changing a verdict, and the stored rows should be today's.
            if dry_run or not (row.changed or _differs(old_checks, res.checks, _CHECK_COLS, ["suite", "expectation"])
                               or _differs(old_diag, diag, _DIAG_COLS, _WINDOW)):
                continue
            # The bundle first, then the warehouse: a bundle that cannot be written (read-only, gone, not a bundle)
            # leaves this trial as it was in both, said in its row, and the recheck goes on with the next. A crash
            # between the two leaves a bundle newer than its `loaded_bundles` sha, which `tunelab load` loads
            # again: the same rows this would have written.
            bpath, new_sha = bundle_paths.get(tid), None
            if bpath and Path(bpath).is_dir():
                try:
                    tdf = read_bundle(Path(bpath))["trial"].copy()
                    tdf["quality_verdict"] = res.verdict
                    if objective:
                        tdf["search_state"], tdf["search_value"], tdf["search_slo_violation"] = (state, value,
                                                                                                 violation)
                    update_bundle_table(Path(bpath), "quality_checks", res.checks)
                    update_bundle_table(Path(bpath), "window_diagnoses", diag[wcols])
                    update_bundle_table(Path(bpath), "trial", tdf)
                    new_sha = verify_bundle(Path(bpath))["manifest_sha256"]
                except (BundleError, OSError) as e:
                    row.bundle = f"not updated ({type(e).__name__}: {e}); this trial is unchanged in the warehouse"
                    continue
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("DELETE FROM quality_checks WHERE trial_id = ?", [tid])
                con.register("_tl_checks", res.checks)
                con.execute("INSERT INTO quality_checks BY NAME SELECT * FROM _tl_checks")
                con.unregister("_tl_checks")
                con.execute("UPDATE trials SET quality_verdict = ? WHERE trial_id = ?", [res.verdict, tid])
                if objective:
                    con.execute("UPDATE trials SET search_state = ?, search_value = ?, search_slo_violation = ? "
                                "WHERE trial_id = ?", [state, value, violation, tid])
                con.execute("DELETE FROM window_diagnoses WHERE trial_id = ?", [tid])
                if len(diag):
                    con.register("_tl_diag", diag[wcols])
                    con.execute("INSERT INTO window_diagnoses BY NAME SELECT * FROM _tl_diag")
                    con.unregister("_tl_diag")
                if new_sha is not None:
                    con.execute("UPDATE loaded_bundles SET sha256 = ? WHERE bundle_id = ?", [new_sha, tid])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            row.bundle = "updated" if new_sha is not None else "absent"
        if not dry_run:
            for sid, objective in objectives.items():
                if sid in chosen:
                    _store_best(con, sid, objective, bundle_paths, warn)
        return out
    finally:
        con.close()
