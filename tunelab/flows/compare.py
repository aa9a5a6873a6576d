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
from typing import Any

import duckdb
import pandas as pd
from prefect import flow, get_run_logger

from tunelab.reports.report import ab_markdown, regressions_markdown
from tunelab import paths
from tunelab.warehouse.compare import SELECTOR_KEYS, compare as ab_compare, regressions

__all__ = ["SELECTOR_ALIASES", "compare", "compare_frames", "parse_selector", "resolve_selector"]

SELECTOR_ALIASES = {"runtime": "runtime_name", "version": "vllm_version", "config": "config_label",
                    "key": "config_key", "sweep": "sweep_id", "gpu": "gpu_name", "release": "vllm_release"}
_CONFIG_KEYS = ("config_key", "config_label", "trial_id")


def parse_selector(text: str) -> dict[str, Any]:
    """``"runtime=cpu,version=0.32.0"`` -> ``{"runtime_name": "cpu", "vllm_version": "0.32.0"}``.

    Items are separated by commas; each is ``key=value`` (the first '=' splits, so a config label such as
    ``config=enforce-eager VLLM_USE_FASTOKENS=1`` works); ``a|b`` gives a list of values.

    Raises:
        ValueError: an item without '=' or an unknown key (names the allowed keys).
    """
    out: dict[str, Any] = {}
    for item in [s for s in text.split(",") if s.strip()]:
        if "=" not in item:
            raise ValueError(f"selector item {item.strip()!r} has no '='; write key=value, e.g. runtime=cpu")
        k, v = item.split("=", 1)
        k = SELECTOR_ALIASES.get(k.strip(), k.strip())
        if k not in SELECTOR_KEYS:
            raise ValueError(f"selector key {k!r} is unknown; use one of {list(SELECTOR_KEYS)} "
                             f"or the short names {sorted(SELECTOR_ALIASES)}")
        vals = [x.strip() for x in v.split("|")]
        out[k] = vals if len(vals) > 1 else vals[0]
    if not out:
        raise ValueError("empty selector: give at least one key=value, e.g. version=0.32.0")
    return out


def _nth(con: duckdb.DuckDBPyConnection, key: str, which: str) -> str:
    n = {"latest": 0, "previous": 1}[which]
    if key == "vllm_version":
        # One release per key (its builds share it; untrusted versions have none): the public version, which
        # as a selector selects every build of that release.
        rows = con.execute("SELECT min(coalesce(vllm_public_version, vllm_version)) FROM trial_facts "
                           "WHERE vllm_version_key IS NOT NULL GROUP BY vllm_version_key "
                           "ORDER BY vllm_version_key DESC").fetchall()
    else:
        rows = con.execute("SELECT sweep_id FROM trial_facts GROUP BY sweep_id ORDER BY max(run_at) DESC").fetchall()
    if len(rows) <= n:
        raise ValueError(f"{key}={which}: the warehouse has {len(rows)} distinct {key} value(s); "
                         f"'{which}' needs {n + 1}")
    return rows[n][0]


def resolve_selector(con: duckdb.DuckDBPyConnection, selector: dict[str, Any]) -> dict[str, Any]:
    """Replace symbolic values (``latest``/``previous`` of ``vllm_version`` or ``sweep_id``) by real ones.

    Raises:
        ValueError: the warehouse has too few versions/sweeps for the symbol.
    """
    out = {}
    for k, v in selector.items():
        k = SELECTOR_ALIASES.get(k, k)
        if k in ("vllm_version", "sweep_id") and v in ("latest", "previous"):
            v = _nth(con, k, v)
        out[k] = v
    return out


def compare_frames(con: duckdb.DuckDBPyConnection, baseline: dict, candidate: dict,
                   metric: str = "output_tokens_per_s", per_config: bool | None = None,
                   **kwargs: Any) -> pd.DataFrame:
    """A/B comparison (``warehouse.compare.compare``) after resolving symbols; per config key unless a
    selector names a config or ``per_config=False``. Extra ``kwargs`` go to ``compare`` (confidence,
    quality, statuses, min_boots).

    Returns:
        The rows of ``compare`` with ``config_key`` and ``config_label`` columns in front; ``attrs`` keep
        ``method``, ``excluded`` and ``not_applied`` (all configs together).

    Raises:
        ValueError: see ``warehouse.compare.compare`` and :func:`resolve_selector`.
    """
    b, c = resolve_selector(con, baseline), resolve_selector(con, candidate)
    if per_config is None:
        per_config = not any(k in b or k in c for k in _CONFIG_KEYS)
    if not per_config:
        df = ab_compare(con, b, c, metric, **kwargs)
        df.insert(0, "config_label", b.get("config_label", "") if b.get("config_label") == c.get("config_label") else "")
        df.insert(0, "config_key", "")
        df.attrs["baseline"], df.attrs["candidate"] = b, c
        return df

    def keys(sel: dict) -> dict[str, str]:
        from tunelab.warehouse.compare import _where  # the same selector semantics as compare()

        where, params = _where(sel)
        return dict(con.execute(f"SELECT f.config_key, any_value(f.config_label) FROM trial_facts f WHERE {where} "
                                "GROUP BY f.config_key", params).fetchall())

    kb, kc = keys(b), keys(c)
    frames, excluded, not_applied, method = [], [], [], ""
    for key in sorted(set(kb) & set(kc)):
        df = ab_compare(con, {**b, "config_key": key}, {**c, "config_key": key}, metric, **kwargs)
        df.insert(0, "config_label", kb[key])
        df.insert(0, "config_key", key)
        excluded.append(df.attrs.get("excluded"))
        not_applied.append(df.attrs.get("not_applied"))
        method = df.attrs.get("method", method)
        df.attrs = {}  # pandas compares attrs on concat; a DataFrame in attrs cannot be compared
        frames.append(df)
    out = pd.concat(frames, ignore_index=True) if frames else ab_compare(con, b, c, metric, **kwargs).iloc[0:0]
    if not frames:
        out.insert(0, "config_label", "")
        out.insert(0, "config_key", "")
    out.attrs["method"] = (method or "") + "; compared config by config (same config_key on both sides)"
    ex = [e for e in excluded if e is not None and len(e)]
    out.attrs["excluded"] = pd.concat(ex, ignore_index=True) if ex else pd.DataFrame(columns=["side", "trial_id", "reason"])
    na = [e for e in not_applied if e is not None and len(e)]
    out.attrs["not_applied"] = pd.concat(na, ignore_index=True) if na else pd.DataFrame(columns=["side", "trial_id", "env"])
    out.attrs["baseline"], out.attrs["candidate"] = b, c
    out.attrs["only_baseline"] = sorted(set(kb) - set(kc))
    out.attrs["only_candidate"] = sorted(set(kc) - set(kb))
    return out


@flow(name="compare", flow_run_name="compare {metric}", log_prints=True)
def compare(baseline: dict, candidate: dict, metric: str = "output_tokens_per_s", db: str | None = None,
            per_config: bool | None = None, min_boots: int = 2, with_regressions: bool = True,
            artifact_key: str = "ab-comparison") -> dict:
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

    Returns:
        dict with ``rows`` (records of the comparison), ``verdicts`` ({verdict: count}), ``regressions``
        (records flagged regression/violation_unconfirmed), ``markdown``, ``baseline``/``candidate`` (resolved).

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
        df = compare_frames(con, baseline, candidate, metric, per_config=per_config, min_boots=min_boots)
        md = ab_markdown(df, df.attrs["baseline"], df.attrs["candidate"],
                         title="A/B comparison" + (" (config by config)" if "only_baseline" in df.attrs else ""))
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
            "markdown": md, "baseline": df.attrs["baseline"], "candidate": df.attrs["candidate"]}
