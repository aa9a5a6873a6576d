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

from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger

from tunelab import paths
from tunelab.reports.report import ab_markdown, regressions_markdown
from tunelab.warehouse.compare import regressions
# The selector functions live with the warehouse queries; re-exported here, where the CLI and users find them.
from tunelab.warehouse.selection import SELECTOR_ALIASES, compare_frames, parse_selector, resolve_selector

__all__ = ["SELECTOR_ALIASES", "compare", "compare_frames", "parse_selector", "resolve_selector"]


@flow(name="compare", flow_run_name="compare {metric}", log_prints=True)
def compare(baseline: dict, candidate: dict, metric: str = "output_tokens_per_s", db: str | None = None,
            per_config: bool | None = None, min_boots: int = 2, with_regressions: bool = True,
            artifact_key: str = "ab-comparison", mixed_keys: bool = False) -> dict:
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
        mixed_keys: allow a pooled side to hold trials of several config keys (otherwise
            ``warehouse.selection.MixedConfigKeys``, a ValueError naming them); the keys pooled are reported.

    Returns:
        dict with ``rows`` (records of the comparison), ``verdicts`` ({verdict: count}), ``regressions``
        (records flagged regression/violation_unconfirmed), ``markdown``, ``baseline``/``candidate`` (resolved),
        ``mixed_keys`` (side -> config keys pooled on that side; empty unless ``mixed_keys`` let them mix).

    Raises:
        ValueError: bad selector or metric, or no warehouse at ``db``.
    """
    from tunelab.warehouse.migrate import connect

    logger = get_run_logger()
    dbp = Path(db) if db else paths.db_path()
    if not dbp.exists():
        raise ValueError(f"db: no warehouse at {dbp}; run a sweep first or pass db=PATH")
    con = connect(dbp, read_only=True)
    try:
        df = compare_frames(con, baseline, candidate, metric, per_config=per_config, min_boots=min_boots,
                            mixed_keys=mixed_keys)
        md = ab_markdown(df, df.attrs["baseline"], df.attrs["candidate"],
                         title="A/B comparison" + (" (config by config)" if "only_baseline" in df.attrs else ""))
        if df.attrs.get("mixed_keys"):
            md += "\n\nConfig keys pooled on purpose (--mix-keys): " + "; ".join(
                f"{side}: {', '.join(keys)}" for side, keys in df.attrs["mixed_keys"].items())
        if df.attrs.get("only_baseline") or df.attrs.get("only_candidate"):
            md += (f"\n\nConfigs on one side only (not compared): baseline {df.attrs.get('only_baseline')}, "
                   f"candidate {df.attrs.get('only_candidate')}")
        reg = pd.DataFrame()
        if with_regressions:
            reg = regressions(con, metric)
            md += "\n\n" + regressions_markdown(reg)
    finally:
        con.close()
    verdicts = df["verdict"].value_counts().to_dict() if len(df) else {}
    logger.info("compare %s: %s vs %s: %s", metric, df.attrs["baseline"], df.attrs["candidate"], verdicts or "no rows")
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(md, key=artifact_key, description=f"{metric}: {baseline} vs {candidate}")
    except Exception as e:  # a view; the result is returned anyway
        logger.warning("could not create the artifact: %s", e)
    flagged = reg[reg["status"].isin(["regression", "violation_unconfirmed"])] if len(reg) else reg
    return {"rows": df.astype(object).where(df.notna(), None).to_dict("records"), "verdicts": verdicts,
            "regressions": flagged.astype(str).to_dict("records") if len(flagged) else [],
            "markdown": md, "baseline": df.attrs["baseline"], "candidate": df.attrs["candidate"],
            "mixed_keys": df.attrs.get("mixed_keys", {})}
