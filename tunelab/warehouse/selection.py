"""Trial selectors against the warehouse: parsing ``key=value`` text, resolving ``latest``/``previous``, and
the A/B comparison config by config (:func:`compare_frames`).

These are queries, not a workflow: the ``compare`` flow (``tunelab.flows.compare``) and the evidence report
(``tunelab.reports.evidence``) both call them. Selector keys: ``warehouse.compare.SELECTOR_KEYS``; symbolic
values and the per-config rule are explained in ``tunelab.flows.compare``'s module docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb
import pandas as pd

from tunelab.stats.family import family_adjust
from tunelab.warehouse.compare import SELECTOR_KEYS, compare as ab_compare, selector_where

__all__ = ["SELECTOR_ALIASES", "MixedConfigKeys", "check_config_keys", "compare_frames", "matched_trials", "parse_selector", "family_text",
           "primary_mask", "report_family", "require_matches", "resolve_selector"]

SELECTOR_ALIASES = {"runtime": "runtime_name", "version": "vllm_version", "config": "config_label",
                    "key": "config_key", "sweep": "sweep_id", "gpu": "gpu_name", "release": "vllm_release"}
_CONFIG_KEYS = ("config_key", "config_label", "trial_id")


class MixedConfigKeys(ValueError):
    """A side of a pooled comparison selects trials of more than one ``config_key`` (e.g. a label that two plans
    gave to different configs: one had one more env var). The message lists the keys with their labels and
    sweeps; ``keys`` maps the side ("baseline"/"candidate") to ``[(config_key, label, [sweep ids]), ...]``."""

    def __init__(self, message: str, keys: dict[str, list[tuple[str, str, list[str]]]]):
        super().__init__(message)
        self.keys = keys


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
        # Sweeps with results only (an ok trial), as `tunelab report` picks its default sweep: a sweep cancelled
        # before any trial finished is not the "latest" a comparison means (found by a fresh user).
        rows = con.execute("SELECT sweep_id FROM trial_facts GROUP BY sweep_id HAVING bool_or(status = 'ok') "
                           "ORDER BY max(run_at) DESC").fetchall()
    if len(rows) <= n:
        what = f"{key} value(s)" if key == "vllm_version" else "sweep(s) with results (an ok trial)"
        raise ValueError(f"{key}={which}: the warehouse has {len(rows)} {what}; '{which}' needs {n + 1}")
    return rows[n][0]


def _gpu_name(con: duckdb.DuckDBPyConnection, value: Any) -> Any:
    """The warehouse's GPU name that ``gpu=value`` means: the exact name, else the one name equal to it ignoring
    case, else the one name holding it as a case-insensitive substring (``h100``); else ``value`` unchanged."""
    if isinstance(value, (list, tuple, set)):
        return [_gpu_name(con, v) for v in value]
    names = [r[0] for r in con.execute("SELECT DISTINCT gpu_name FROM trial_facts WHERE gpu_name IS NOT NULL "
                                       "ORDER BY 1").fetchall()]
    text = str(value).strip()
    if text in names:
        return text
    for hits in ([n for n in names if n.lower() == text.lower()], [n for n in names if text.lower() in n.lower()]):
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ValueError(f"gpu={text!r} matches {len(hits)} GPU names in the warehouse: "
                             f"{', '.join(repr(h) for h in hits)}; give a part of the name that only one of "
                             "them holds, or the whole name")
    return value


def resolve_selector(con: duckdb.DuckDBPyConnection, selector: dict[str, Any]) -> dict[str, Any]:
    """Replace symbolic values (``latest``/``previous`` of ``vllm_version`` or ``sweep_id``) by real ones, and a
    ``gpu_name`` that is a case-insensitive part of one GPU name in the warehouse (``gpu=h100``) by that name.

    Raises:
        ValueError: the warehouse has too few versions/sweeps for the symbol, or a ``gpu_name`` part fits several
            GPU names (names them).
    """
    out = {}
    for k, v in selector.items():
        k = SELECTOR_ALIASES.get(k, k)
        if k in ("vllm_version", "sweep_id") and v in ("latest", "previous"):
            v = _nth(con, k, v)
        elif k == "gpu_name":
            v = _gpu_name(con, v)
        out[k] = v
    return out


_SHORT_NAMES = {v: k for k, v in SELECTOR_ALIASES.items()}


def _item_text(key: str, value: Any) -> str:
    vals = list(value) if isinstance(value, (list, tuple, set)) else [value]
    return f"{_SHORT_NAMES.get(key, key)}={'|'.join(str(v) for v in vals)}"


def _ok_count(con: duckdb.DuckDBPyConnection, sel: dict) -> int:
    if not sel:
        return con.execute("SELECT count(*) FROM trial_facts WHERE status = 'ok'").fetchone()[0]
    where, params = selector_where(sel)
    return con.execute(f"SELECT count(*) FROM trial_facts f WHERE {where} AND f.status = 'ok'", params).fetchone()[0]


def _values_text(con: duckdb.DuckDBPyConnection, key: str, value: Any, within: dict, limit: int = 12) -> str:
    """The values ``key`` has among the ok trials ``within`` selects, with a "did you mean" for ``value``."""
    where, params = selector_where(within) if within else ("TRUE", [])
    order = "max(f.run_at) DESC" if key == "sweep_id" else "1"  # sweeps latest first, as `_what_exists` lists them
    found = [str(r[0]) for r in con.execute(f"SELECT f.{key} FROM trial_facts f WHERE {where} AND f.status = 'ok' "
                                            f"AND f.{key} IS NOT NULL GROUP BY 1 ORDER BY {order}", params).fetchall()]
    import difflib

    wanted = list(value) if isinstance(value, (list, tuple, set)) else [value]
    close: list[str] = []
    for w in wanted:
        if str(w) in found:
            continue
        # compared ignoring case ('nvidia h200' is 'NVIDIA H200'), suggested as the warehouse spells it
        low = {f.lower(): f for f in found}
        close += [low[c] for c in difflib.get_close_matches(str(w).lower(), list(low), n=3, cutoff=0.6)
                  if low[c] not in close]
    name = _SHORT_NAMES.get(key, key)
    shown = ", ".join(found[:limit]) + (f", ... ({len(found)} in all)" if len(found) > limit else "")
    return ((f"did you mean {' or '.join(f'{name}={c}' for c in close)}? " if close else "")
            + f"{name} values {'there' if within else 'in the warehouse'}: {shown or 'none'}")


def require_matches(con: duckdb.DuckDBPyConnection, selector: dict[str, Any], side: str = "selector",
                    text: str | None = None) -> dict[str, Any]:
    """The resolved selector (:func:`resolve_selector`) when it selects an ok trial; else an error naming the
    ``key=value`` it fails on and the values that key has, with a "did you mean" for a near one.

    The failing item is the first that matches no ok trial by itself (values listed: the warehouse's); when every
    item matches some, the first that leaves nothing together with the items before it (values listed: those
    among the trials the items before it select).

    Args:
        side: named in the message ("baseline", "candidate").
        text: the selector as the user wrote it, quoted in the message.

    Raises:
        ValueError: see above, and :func:`resolve_selector`.
    """
    shown = text if text is not None else ",".join(_item_text(k, v) for k, v in selector.items())
    head = f"the {side} selector {shown!r}"
    try:
        sel = resolve_selector(con, selector)
    except ValueError as e:
        raise ValueError(f"{head}: {e}") from None
    if _ok_count(con, sel):
        return sel
    for k, v in sel.items():
        if not _ok_count(con, {k: v}):
            raise ValueError(f"{head} selects no trial with results: no ok trial has {_item_text(k, v)}; "
                             + _values_text(con, k, v, {}))
    before: dict[str, Any] = {}
    for k, v in sel.items():
        if not _ok_count(con, {**before, k: v}):
            raise ValueError(f"{head} selects no trial with results: {_item_text(k, v)} matches none together with "
                             f"{', '.join(_item_text(a, b) for a, b in before.items())}; "
                             + _values_text(con, k, v, before))
        before[k] = v
    return sel  # not reached: the whole selector matched nothing, so some item did


def _keys_of(con: duckdb.DuckDBPyConnection, sel: dict) -> list[tuple[str, str, list[str]]]:
    """``(config_key, a label, [sweep ids])`` of the ok trials ``sel`` selects (``compare``'s selector semantics)."""
    where, params = selector_where(sel)
    rows = con.execute(f"SELECT f.config_key, any_value(f.config_label), list(DISTINCT f.sweep_id ORDER BY f.sweep_id) "
                       f"FROM trial_facts f WHERE {where} AND f.status = 'ok' GROUP BY f.config_key ORDER BY 1",
                       params).fetchall()
    return [(k, lab, list(sw)) for k, lab, sw in rows]


def matched_trials(con: duckdb.DuckDBPyConnection, selector: dict) -> int:
    """How many trials with ``status = 'ok'`` a selector selects (symbols resolved; ``compare``'s semantics).

    Raises:
        ValueError: see :func:`resolve_selector`.
    """
    where, params = selector_where(resolve_selector(con, selector))
    return con.execute(f"SELECT count(*) FROM trial_facts f WHERE {where} AND f.status = 'ok'", params).fetchone()[0]


def check_config_keys(con: duckdb.DuckDBPyConnection, baseline: dict, candidate: dict,
                      per_config: bool | None = None, mixed_keys: bool = False) -> dict[str, list[str]]:
    """Whether a comparison would pool trials of several ``config_key``s on one side (see :func:`compare_frames`);
    a check the CLI runs before it starts the ``compare`` flow.

    Returns:
        side ("baseline"/"candidate") -> the config keys that side pools, for the sides with more than one
        (only when ``mixed_keys``); ``{}`` when every side has one key or the comparison runs config by config.

    Raises:
        MixedConfigKeys: a side selects several keys and ``mixed_keys`` is False.
        ValueError: see :func:`resolve_selector`.
    """
    b, c = resolve_selector(con, baseline), resolve_selector(con, candidate)
    if per_config is None:
        per_config = not any(k in b or k in c for k in _CONFIG_KEYS)
    if per_config:
        return {}
    mixed = {side: ks for side, ks in (("baseline", _keys_of(con, b)), ("candidate", _keys_of(con, c))) if len(ks) > 1}
    if mixed and not mixed_keys:
        lines = [f"{side} selects {len(ks)} config keys: " + "; ".join(
            f"{k!r} ({lab!r}, sweep(s) {', '.join(sw[:3])}{' ...' if len(sw) > 3 else ''})" for k, lab, sw in ks)
            for side, ks in mixed.items()]
        raise MixedConfigKeys(
            "a pooled comparison would mix configs: " + " | ".join(lines) + ". Narrow the selector to one key "
            "(key=KEY, or sweep=ID where the label is unambiguous), compare config by config (--per-config), "
            "or pool them on purpose with --mix-keys (mixed_keys=True)", mixed)
    return {side: [k for k, _, _ in ks] for side, ks in mixed.items()}


def primary_mask(rows: pd.DataFrame, primary: Mapping[str, Any] | None) -> list[bool] | None:
    """Per A/B row, whether it is a headline (primary) verdict of ``primary`` (a plan's ``primary:`` as a dict:
    ``metrics``, optional ``workloads`` and ``loads`` by label such as ``c=32``); None when none is named."""
    if not primary:
        return None
    from tunelab.core.load_profiles import load_label

    metrics, wls, loads = (primary.get("metrics") or []), primary.get("workloads"), primary.get("loads")
    return [(r.metric in metrics) and (not wls or r.workload in wls)
            and (not loads or load_label(r.load_kind, r.load_value) in loads) for r in rows.itertuples(index=False)]


def report_family(rows: pd.DataFrame, *, confidence: float = 0.95, primary: Mapping[str, Any] | None = None
                  ) -> pd.DataFrame:
    """The rows of one A/B report (configs x cells x metrics) with their headline verdicts adjusted as one
    family (``stats.family.family_adjust``, Holm), primary and secondary rows by ``primary`` (:func:`primary_mask`).
    ``attrs`` are kept."""
    attrs = dict(rows.attrs)
    out = family_adjust(rows, alpha=1.0 - confidence, primary=primary_mask(rows, primary))
    attrs["family"] = family_text(out, confidence)
    out.attrs = attrs
    return out


def family_text(rows: pd.DataFrame, confidence: float = 0.95) -> str:
    """One line on how a report's verdicts were judged: per-cell intervals, and the families' adjustment."""
    fams = sorted({m for m in rows.get("family_method", pd.Series(dtype=str)) if m})
    return (f"intervals and the per-cell verdict are per cell ({confidence:.0%}, unadjusted); the headline verdict "
            f"(family_verdict) holds the family-wise error rate at {1 - confidence:.0%}: "
            + ("; ".join(fams) if fams else "no verdict to adjust") + " (Holm's step-down method)")


def compare_frames(con: duckdb.DuckDBPyConnection, baseline: dict, candidate: dict,
                   metric: str = "output_tokens_per_s", per_config: bool | None = None,
                   mixed_keys: bool = False, primary: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> pd.DataFrame:
    """A/B comparison (``warehouse.compare.compare``) after resolving symbols; per config key unless a
    selector names a config or ``per_config=False``. Extra ``kwargs`` go to ``compare`` (confidence,
    quality, statuses, min_boots, paired).

    A pooled comparison (not per config) never mixes config keys on one side silently: a label names a config
    only within its plan (a sweep with one more env var gives the same label another key), so a side that
    selects ok trials of two or more keys raises :class:`MixedConfigKeys` unless ``mixed_keys=True`` (then the
    keys pooled per side are in ``attrs["mixed_keys"]``).

    The headline verdicts of all rows together are one family (:func:`report_family`: Holm; ``primary`` names
    the headline metrics, workloads and loads, the rest are secondary).

    Returns:
        The rows of ``compare`` with ``config_key`` and ``config_label`` columns in front; ``attrs`` keep
        ``method``, ``excluded`` and ``not_applied`` (all configs together), ``mixed_keys`` (side -> keys
        pooled; empty when each side has one key or the comparison ran config by config).

    Raises:
        MixedConfigKeys: see above (a ValueError naming the keys, their labels and sweeps, and the fix).
        ValueError: see ``warehouse.compare.compare`` and :func:`resolve_selector`.
    """
    b, c = resolve_selector(con, baseline), resolve_selector(con, candidate)
    if per_config is None:
        per_config = not any(k in b or k in c for k in _CONFIG_KEYS)
    if not per_config:
        mixed = check_config_keys(con, b, c, per_config=False, mixed_keys=mixed_keys)
        df = ab_compare(con, b, c, metric, **kwargs)
        df.attrs["mixed_keys"] = mixed
        df.insert(0, "config_label", b.get("config_label", "") if b.get("config_label") == c.get("config_label") else "")
        df.insert(0, "config_key", "")
        df.attrs["baseline"], df.attrs["candidate"] = b, c
        return report_family(df, confidence=kwargs.get("confidence", 0.95), primary=primary)

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
    out.attrs["mixed_keys"] = {}
    out.attrs["only_baseline"] = sorted(set(kb) - set(kc))
    out.attrs["only_candidate"] = sorted(set(kc) - set(kb))
    return report_family(out, confidence=kwargs.get("confidence", 0.95), primary=primary)
