"""Flow ``compare``: the A/B and regression report from the warehouse, as a Prefect artifact and a DataFrame.

``compare(baseline, candidate)`` selects two sets of trials from DuckDB with selectors (``runtime_name``,
``vllm_version``, ``config_label``, ``config_key``, ``sweep_id``, ``gpu_name``, ...; see
``warehouse.compare.SELECTOR_KEYS``), compares them per workload and load level with
``warehouse.compare.compare`` (boot-level Welch interval; the boot is the unit of replication) and adds
``warehouse.compare.regressions`` (consecutive violations along vLLM versions, the PyTorch HUD rule).

Selector values may be symbolic: ``vllm_version: latest`` / ``previous`` (the newest and second newest vLLM
release in the warehouse, PEP 440 order; untrusted versions such as ``0.1.devN`` are never one) and ``sweep_id: latest`` / ``previous`` (by start time). So the weekly
cross-version deployment compares ``{vllm_version: previous}`` with ``{vllm_version: latest}`` without anyone
editing it after an upgrade.

Comparing two vLLM versions only means something config by config: unless a selector names a config
(``config_key`` or ``config_label``), the comparison runs once per ``config_key`` found on both sides
(``per_config``) instead of pooling different configs.

A ``vllm_version`` value selects builds by release: ``0.26.0`` selects ``0.26.0``, ``0.26.0+empty`` and
``0.26.0+cu128``; ``0.26.0+empty`` selects that build only (``warehouse.compare._version_clause``).

Short selector names for the CLI: ``runtime`` -> ``runtime_name``, ``version`` -> ``vllm_version``,
``config`` -> ``config_label``, ``key`` -> ``config_key``, ``sweep`` -> ``sweep_id``, ``gpu`` -> ``gpu_name``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger

from tunelab.host import paths
from tunelab.reports.anchored import anchored_markdown
from tunelab.stats.family import family_adjust
from tunelab.reports.report import ab_markdown, regressions_markdown
from tunelab.warehouse.compare import regressions
# The selector functions live with the warehouse queries; re-exported here, where the CLI and users find them.
from tunelab.warehouse.selection import SELECTOR_ALIASES, compare_frames, parse_selector, resolve_selector
from tunelab.warehouse.series import confirm_by_alarm
from tunelab.warehouse.sweep_anchor import comparison_anchor, cross_sweep_compare, sweeps_of

__all__ = ["REGRESSION_EVENT", "REGRESSION_STATE", "SELECTOR_ALIASES", "compare", "compare_frames", "confirmed_regressions",
           "parse_selector", "regression_webhook", "resolve_selector"]

#: The Prefect event a comparison emits when it confirms a regression; attach an automation to it
#: (docs/prefect.md: "Notify on a regression"). Resource ``tunelab.metric.<metric>``; payload: ``metric``,
#: ``summary`` (one line), ``baseline``/``candidate`` (resolved selectors), ``confirmed`` (see
#: :func:`confirmed_regressions`). Prefect adds the flow run, flow, deployment and tags as related resources.
REGRESSION_EVENT = "tunelab.regression.confirmed"
#: Name of the final state (type COMPLETED: the comparison did its job) of a compare run that confirmed a
#: regression; Prefect emits ``prefect.flow-run.Regression`` for it, and the run list shows the name.
REGRESSION_STATE = "Regression"


#: Above the per-cell table when the two sides ran in different sweeps.
ACROSS_SWEEPS_NOTE = ("> The two sides ran in different sweeps. The per-cell table compares their boots as if they had "
                      "run together (no sweep term) and calls sweep-to-sweep shifts effects; the verdict of this "
                      "comparison is the **Across sweeps** section below (through the anchor, or unanchored and "
                      "widened), which also decides the confirmed regressions.")


def mixed_sides_note(con, baseline: dict, candidate: dict) -> str | None:
    """A warning (markdown quote) when a side pools boots of several GPUs, or when the sides share a sweep but one
    of them also holds boots of other sweeps (e.g. ``version=0.25.1`` over every sweep that ran it against
    ``version=0.26.0`` of one sweep): the per-cell table then treats a card's or a sweep's shift as part of the
    change, and the comparison is neither within one sweep nor across sweeps (no anchored section). None when the
    sides are alike. Found by a fresh user: an A/A of 0.25.1 across an H200 and an H100 read "worse" in 4 of 4
    cells with no word about the cards."""
    from tunelab.warehouse.compare import selector_where

    def facts(sel: dict) -> tuple[list[str], list[str]]:
        where, params = selector_where(sel)
        rows = con.execute(f"SELECT DISTINCT coalesce(f.gpu_name, '?'), f.sweep_id FROM trial_facts f WHERE {where} "
                           "AND f.status = 'ok'", params).fetchall()
        return sorted({r[0] for r in rows}), sorted({r[1] for r in rows})

    (gb, sb), (gc, sc) = facts(baseline), facts(candidate)
    lines = [f"{side} pools boots of {len(g)} GPUs ({', '.join(g)})" for side, g in (("the baseline", gb),
                                                                                  ("the candidate", gc)) if len(g) > 1]
    if set(sb) & set(sc) and set(sb) != set(sc):
        lines.append(f"the sides share sweep(s) {', '.join(sorted(set(sb) & set(sc)))} but the baseline holds "
                     f"{len(sb)} sweep(s) and the candidate {len(sc)}, so this is neither a within-sweep comparison "
                     "nor one across sweeps (which would go through the anchor)")
    if not lines:
        return None
    return ("> **Mixed sides**: " + "; ".join(lines) + ". The per-cell table treats every boot of a side as "
            "interchangeable, so a card's or a sweep's shift reads as the change. Compare like with like: add "
            "`sweep=...` (one sweep each side: across sweeps it goes through the anchor) or `gpu=...` to the "
            "selectors.")


@flow(name="compare", flow_run_name="compare {metric}", log_prints=True)
def compare(baseline: dict, candidate: dict, metric: str = "output_tokens_per_s", db: str | None = None,
            per_config: bool | None = None, min_boots: int = 2, with_regressions: bool = True,
            artifact_key: str = "ab-comparison", mixed_keys: bool = False, paired: bool = False,
            primary: dict | None = None, anchor: str | None = None) -> dict:
    """A/B comparison of two trial selections in the warehouse, plus regressions along vLLM versions.

    Args:
        baseline, candidate: selectors (dicts; keys of ``warehouse.compare.SELECTOR_KEYS`` or their short
            names; ``latest``/``previous`` allowed for ``vllm_version`` and ``sweep_id``).
        metric: a ``measurements`` column, e.g. ``output_tokens_per_s`` or ``ttft_p99_s``.
        db: DuckDB file (default ``<tunelab home>/warehouse.duckdb``), opened read-only.
        per_config: compare config by config (default: yes unless a selector names a config).
        min_boots: boots per side needed for a verdict (>= 2).
        with_regressions: add ``warehouse.compare.regressions`` for the same metric.
        artifact_key: key of the markdown artifact.
        paired: analyse boots of one sweep and replicate on both sides as pairs (``warehouse.compare.compare``;
            for interleaved sweeps with about 4 pairs or more: drift both boots share cancels).
        primary: the headline verdicts (a plan's ``primary:`` as a dict: ``metrics``, ``workloads``, ``loads``);
            the report's verdicts are adjusted as one family by Holm's method (``stats.family``), primary and
            secondary rows apart; default: every row is primary.
        anchor: the anchor of a comparison across sweeps, a config key or label (``--anchor``); default: the
            anchor the compared sweeps' plans recorded (``warehouse.sweep_anchor``). Used when the two sides
            share no sweep (the anchored section) and by the series alarm gate.
        mixed_keys: allow a pooled side to hold trials of several config keys (otherwise
            ``warehouse.selection.MixedConfigKeys``, a ValueError naming them); the keys pooled are reported.

    Returns:
        dict with ``rows`` (records of the comparison), ``verdicts`` ({verdict: count}: of the anchored section's
        rows when the sides ran in different sweeps, else of ``rows``; ``verdicts_from`` says which:
        ``across_sweeps`` | ``per_cell``), ``per_cell_verdicts`` ({verdict: count} of ``rows``), ``regressions``
        (records flagged regression/violation_unconfirmed), ``markdown``, ``baseline``/``candidate`` (resolved),
        ``mixed_keys`` (side -> config keys pooled on that side; empty unless ``mixed_keys`` let them mix),
        ``confirmed`` (:func:`confirmed_regressions`), ``anchored`` (records of
        ``warehouse.sweep_anchor.cross_sweep_compare`` when the sides ran in different sweeps: the verdict per
        cell through the anchor, or unanchored and widened; empty for a same-sweep comparison) and ``anchor``. When ``confirmed`` is not empty the run emits the Prefect
        event :data:`REGRESSION_EVENT` and ends in the state :data:`REGRESSION_STATE` (type COMPLETED, the
        summary as its message; calling the flow still returns this dict).

    Raises:
        ValueError: bad selector or metric, or no warehouse at ``db``.
    """
    from prefect.context import FlowRunContext

    from tunelab.warehouse.migrate import connect

    # Called as a plain function (``compare.fn``: `tunelab compare` without a Prefect server, which then starts
    # none): no run, so no run logger, artifact or event; the returned dict is the same.
    in_run = FlowRunContext.get() is not None
    logger = get_run_logger() if in_run else logging.getLogger("tunelab.compare")
    dbp = Path(db) if db else paths.db_path()
    if not dbp.exists():
        raise ValueError(f"db: no warehouse at {dbp}; run a sweep first or pass db=PATH")
    con = connect(dbp, read_only=True)
    try:
        df = compare_frames(con, baseline, candidate, metric, per_config=per_config, min_boots=min_boots,
                            mixed_keys=mixed_keys, paired=paired, primary=primary)
        md = ab_markdown(df, df.attrs["baseline"], df.attrs["candidate"],
                         title="A/B comparison" + (" (config by config)" if "only_baseline" in df.attrs else ""))
        if df.attrs.get("mixed_keys"):
            md += "\n\nConfig keys pooled on purpose (--mix-keys): " + "; ".join(
                f"{side}: {', '.join(keys)}" for side, keys in df.attrs["mixed_keys"].items())
        if df.attrs.get("only_baseline") or df.attrs.get("only_candidate"):
            md += (f"\n\nConfigs on one side only (not compared): baseline {df.attrs.get('only_baseline')}, "
                   f"candidate {df.attrs.get('only_candidate')}")
        # Across sweeps the comparison goes through the anchor (or says it is unanchored, widened): issue 28.1.
        try:
            xs = cross_sweep_compare(con, df.attrs["baseline"], df.attrs["candidate"], metric, anchor=anchor)
        except ValueError as e:
            if anchor is not None:  # a bad --anchor is the user's to fix
                raise
            # a section beside the report: its failure must not take the comparison with it
            logger.warning("the cross-sweep (anchored) section could not be computed: %s", e)
            xs = None
        if xs is not None and len(xs) and "p_value" in xs.columns:
            # The cross-sweep rows are the comparison's headline (the per-cell rows above carry no sweep term and
            # call about twice the nominal false calls across sweeps: issue 28): one family, Holm-adjusted.
            xs = family_adjust(xs)
        mixed = mixed_sides_note(con, df.attrs["baseline"], df.attrs["candidate"])
        if mixed:  # before the table: a side pooling cards or sweeps reads their shift as the change
            title, _, rest = md.partition("\n")
            md = title + "\n\n" + mixed + "\n" + rest
        if xs is not None:
            # Say it before the per-cell table a reader sees first (found by a fresh user: an A/A across two sweeps
            # read "better" there and "no significant change" in the section below).
            if len(xs):
                title, _, rest = md.partition("\n")
                md = title + "\n\n" + ACROSS_SWEEPS_NOTE + "\n" + rest
            md += "\n\n" + anchored_markdown(xs)
            unit = xs.attrs["anchor"]
        else:
            unit = comparison_anchor(con, sorted(set(sweeps_of(con, df.attrs["baseline"]))
                                                 | set(sweeps_of(con, df.attrs["candidate"]))), anchor)[0]
        reg = pd.DataFrame()
        if with_regressions:
            reg = regressions(con, metric)
            md += "\n\n" + regressions_markdown(reg)
            # The event fires only on an alarm: a rule regression needs a change point too (series: issue 28.4),
            # in the series divided by the anchor where the sweeps booted one.
            reg = confirm_by_alarm(con, reg, metric, anchor_key=unit[1] if unit else None,
                                   anchor_runtime=unit[0] if unit else None)
    finally:
        con.close()
    per_cell = df["verdict"].value_counts().to_dict() if len(df) else {}
    # Across sweeps the verdicts are the anchored section's (the per-cell rows carry no sweep term; the report says
    # to read the section): a script reading `verdicts` got "worse" for an A/A across two cards (a fresh user).
    across = xs is not None and len(xs) > 0 and "verdict" in xs.columns
    verdicts = xs["verdict"].value_counts().to_dict() if across else per_cell
    logger.info("compare %s: %s vs %s: %s%s", metric, df.attrs["baseline"], df.attrs["candidate"],
                verdicts or "no rows", " (across sweeps)" if across else "")
    try:
        from prefect.artifacts import create_markdown_artifact

        from tunelab.reports.artifacts import ab_artifact_markdown

        if in_run:  # verdicts first, in a table narrow enough for the UI's frame (reports.artifacts)
            create_markdown_artifact(ab_artifact_markdown(df, md), key=artifact_key,
                                     description=f"{metric}: {baseline} vs {candidate}")
    except Exception as e:  # a view; the result is returned anyway
        logger.warning("could not create the artifact: %s", e)
    flagged = reg[reg["status"].isin(["regression", "regression_no_alarm", "violation_unconfirmed"])] if len(reg) else reg
    out = {"rows": df.astype(object).where(df.notna(), None).to_dict("records"), "verdicts": verdicts,
           "verdicts_from": "across_sweeps" if across else "per_cell", "per_cell_verdicts": per_cell,
           "mixed_sides": mixed,
           "regressions": flagged.astype(str).to_dict("records") if len(flagged) else [],
           "markdown": md, "baseline": df.attrs["baseline"], "candidate": df.attrs["candidate"],
           "mixed_keys": df.attrs.get("mixed_keys", {}),
           "anchored": [] if xs is None else xs.astype(object).where(xs.notna(), None).to_dict("records"),
           "anchor": None if unit is None else f"{unit[0]}/{unit[1]}"}
    confirmed = confirmed_regressions(df, reg, df.attrs["candidate"].get("vllm_version"), cross=xs)
    out["confirmed"] = confirmed
    if not confirmed or not in_run:
        return out
    summary = (f"tunelab: {len(confirmed)} confirmed regression(s) of {metric} "
               f"({_sel_text(df.attrs['candidate'])} vs {_sel_text(df.attrs['baseline'])}): "
               + "; ".join(c["what"] for c in confirmed[:3]) + (" ..." if len(confirmed) > 3 else ""))
    logger.warning("%s", summary)
    from prefect.events import emit_event
    from prefect.states import Completed

    emit_event(event=REGRESSION_EVENT,
               resource={"prefect.resource.id": f"tunelab.metric.{metric}", "prefect.resource.name": metric},
               payload={"metric": metric, "summary": summary, "baseline": df.attrs["baseline"],
                        "candidate": df.attrs["candidate"], "confirmed": confirmed[:50]})
    # A state of its own (type COMPLETED: the flow did its job) that the run list shows and automations match.
    return Completed(name=REGRESSION_STATE, message=summary[:500], data=out)


def _sel_text(sel: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sel.items())


def confirmed_regressions(ab: pd.DataFrame, reg: pd.DataFrame, versions: str | list[str] | None = None,
                          cross: pd.DataFrame | None = None) -> list[dict]:
    """What a comparison confirms as a regression, as JSON-ready dicts with a one-line ``what``:

    - ``kind='ab_worse'``: a primary A/B row whose headline verdict (``family_verdict``: Holm-adjusted over the
      report's verdicts, ``stats.family``) is ``worse``; a per-cell ``worse`` that the family adjustment does not
      keep raises nothing. Keys ``config_key``, ``workload``, ``load``, ``rel_diff``, ``ci`` ([low, high],
      relative, the per-cell interval), ``p_family``. When the two sides ran in different sweeps (``cross``: the
      rows of ``warehouse.sweep_anchor.cross_sweep_compare``, family-adjusted), those rows decide instead: they
      carry the sweep-to-sweep variance (anchored, or unanchored and widened), the per-cell rows do not;
    - ``kind='series'``: a point of ``warehouse.compare.regressions`` with status ``regression`` (``consecutive``
      violations along vLLM versions, the PyTorch HUD rule) that ``warehouse.series.confirm_by_alarm`` kept
      (a series of 8 points or more also needs a change-point alarm); ``violation_unconfirmed`` points are not
      confirmed and not listed. With ``versions`` (the candidate's resolved ``vllm_version``) only points of
      those releases: the weekly ``previous`` vs ``latest`` run reports what the latest release broke, not every
      regression of the history again. Keys ``config_key``, ``gpu``, ``workload``, ``load``, ``version``,
      ``baseline_version``, ``rel_change``.
    """
    from tunelab.core.load_profiles import load_label

    out: list[dict] = []
    if cross is not None and len(cross):
        if "family_verdict" not in cross.columns:
            cross = family_adjust(cross)
        ab = cross.rename(columns={"rel": "rel_diff", "rel_low": "rel_ci_low", "rel_high": "rel_ci_high"})
    if len(ab) and "family_verdict" in ab.columns:
        headline = ab[(ab["family_verdict"] == "worse") & (ab["family_role"] == "primary")]
    else:  # rows from before family control: the per-cell verdict
        headline = ab[ab["verdict"] == "worse"] if len(ab) else ab
    for r in (headline.itertuples(index=False) if len(headline) else []):
        key = str(getattr(r, "config_key", "") or "")
        load = load_label(r.load_kind, r.load_value)
        out.append({"kind": "ab_worse", "config_key": key, "workload": str(r.workload), "load": load,
                    "rel_diff": float(r.rel_diff), "ci": [float(r.rel_ci_low), float(r.rel_ci_high)],
                    "p_family": None if pd.isna(getattr(r, "p_family", None)) else float(r.p_family),
                    "what": f"{key or 'pooled'} {r.workload} {load}: {r.rel_diff * 100:+.1f}% "
                            f"[{r.rel_ci_low * 100:+.1f}%, {r.rel_ci_high * 100:+.1f}%]"})
    wanted = [versions] if isinstance(versions, str) else list(versions or [])
    for r in (reg[reg["status"] == "regression"].itertuples(index=False) if len(reg) else []):
        if wanted and not any(v == str(r.point) or v.startswith(f"{r.point}+") or str(r.point).startswith(f"{v}+")
                              for v in wanted):
            continue
        load = load_label(r.load_kind, r.load_value)
        change = None if pd.isna(r.rel_change) else float(r.rel_change)
        out.append({"kind": "series", "config_key": str(r.config_key), "gpu": str(r.gpu_name),
                    "workload": str(r.workload), "load": load, "version": str(r.point),
                    "baseline_version": str(r.baseline_point), "rel_change": change,
                    "what": f"{r.config_key} {r.workload} {load} at {r.point}: "
                            f"{'?' if change is None else format(change * 100, '+.1f')}% vs {r.baseline_point}"})
    return out


def regression_webhook(url: str, block_name: str = "tunelab-regressions",
                       automation_name: str = "tunelab: regression confirmed") -> tuple[Any, Any]:
    """Call ``url`` (HTTP POST, JSON) whenever a comparison emits :data:`REGRESSION_EVENT`: saves a Prefect
    ``Webhook`` block ``block_name`` (overwritten if it exists) and creates the automation ``automation_name``
    (an existing one of that name is deleted first), on the server of ``PREFECT_API_URL``.

    The webhook's body is ``{"text": <summary>, "metric": ..., "flow_run": <flow run id>, "confirmed": [...]}``
    (Prefect's Jinja template over the event); ``text`` is what Slack and Mattermost incoming webhooks show.

    Returns:
        (block document id, the created ``prefect.automations.Automation``).

    Raises:
        ValueError: ``url`` is not an http(s) URL.
    """
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url {url!r}: give the webhook's http(s) URL, e.g. https://hooks.slack.com/services/...")
    from prefect.automations import Automation
    from prefect.blocks.webhook import Webhook
    from prefect.events.actions import CallWebhook
    from prefect.events.schemas.automations import EventTrigger, Posture

    block_id = Webhook(method="POST", url=url).save(block_name, overwrite=True)
    try:
        Automation.read(name=automation_name).delete()
    except ValueError:  # Automation.read raises ValueError when none has that name
        pass
    payload = ('{"text": {{ event.payload.summary | tojson }}, "metric": {{ event.payload.metric | tojson }}, '
               '"flow_run": "{{ event.related | selectattr(\'role\', \'equalto\', \'flow-run\') | map(attribute=\'id\') '
               '| first | default(\'\') | replace(\'prefect.flow-run.\', \'\') }}", "confirmed": {{ event.payload.confirmed | tojson }}}')
    auto = Automation(name=automation_name, description="tunelab: POST to a webhook when a comparison confirms a regression",
                      trigger=EventTrigger(expect={REGRESSION_EVENT}, posture=Posture.Reactive, threshold=1),
                      actions=[CallWebhook(block_document_id=block_id, payload=payload)]).create()
    return block_id, auto
