"""Trial selectors against the warehouse: parsing ``key=value`` text, resolving ``latest``/``previous``, and
the A/B comparison config by config (:func:`compare_frames`).

These are queries, not a workflow: the ``compare`` flow (``tunelab.flows.compare``) and the evidence report
(``tunelab.reports.evidence``) both call them. Selector keys: ``warehouse.compare.SELECTOR_KEYS``; symbolic
values and the per-config rule are explained in ``tunelab.flows.compare``'s module docstring.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd

from tunelab.warehouse.compare import SELECTOR_KEYS, compare as ab_compare, selector_where

__all__ = ["SELECTOR_ALIASES", "compare_frames", "parse_selector", "resolve_selector"]

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
        where, params = selector_where(sel)  # the same selector semantics as compare()
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
