"""Suite ``conditions``: was each window measured under the conditions it claims?

* ``cache_not_cold`` (warn): a window whose prompts share no prefix by design (``measurements.unique_prompts``)
  showed prefix-cache hits above :data:`COLD_CACHE_MAX_HIT_FRAC` of its queried tokens (``server_metrics``
  ``prefix_cache_hits`` / ``prefix_cache_queries``): the cache was not cold (a reset that did not take,
  ``measurements.prefix_cache_reset``; vLLM answers 200 with ``{"success": false}`` while blocks are in use,
  PR 12284), so its TTFT is not a cold prefill's.
* ``overloaded`` (warn): an open-loop window in which the server fell behind its arrivals
  (``measurements.overloaded``, ``tasks.metrics.overload``): its latencies are those of a growing queue. The
  window is left out of comparisons (``warehouse.compare``), so the trial's other windows still count; warn,
  not fail, for that reason.

Like ``suites``, the expectation classes come in as ``gxe`` so importing this module does not import GX.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tunelab.tasks.quality.catalogue import _MEASUREMENT_KEY
from tunelab.tasks.quality.suites import _bool_obj, _Collector, _label, _num, _Plan, _Skip, _Spec, _worst

__all__ = ["COLD_CACHE_MAX_HIT_FRAC", "suite_conditions"]

#: Largest prefix-cache hit fraction (hit tokens / queried tokens) of a unique-prompt window that still counts as
#: cold. Not 0: a chat template's fixed text (a default system prompt) can fill a KV block that every request
#: shares (Qwen2.5's is about 30 tokens, 1 block of 16 on a GPU: 6 % of a 256-token prompt); 0.25 leaves room
#: for that with 128-token prompts, and a reset that did not take after a window of the same workload shows far
#: more (128 of 256 queried tokens in the report that led to this check).
COLD_CACHE_MAX_HIT_FRAC = 0.25


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["load_value"] = _num(out["load_value"])
    out["repeat"] = _num(out["repeat"])
    return out


def _cache_not_cold(gxe: Any, meas: pd.DataFrame | None, sm: pd.DataFrame | None, out: _Collector) -> None:
    thr = f"<= {COLD_CACHE_MAX_HIT_FRAC} of queried tokens"
    if meas is None or "unique_prompts" not in meas.columns:
        out.skips.append(_Skip("cache_not_cold", "unique_prompts not recorded", thr))
        return
    uniq = meas[_bool_obj(meas["unique_prompts"]).map(lambda v: v is True)]
    if uniq.empty:
        out.skips.append(_Skip("cache_not_cold", "no window of unique prompts", thr))
        return
    if sm is None:
        out.skips.append(_Skip("cache_not_cold", "no server_metrics rows", thr))
        return
    counters = sm[sm["metric"].isin(("prefix_cache_hits", "prefix_cache_queries"))
                  & (sm["kind"] == "counter_delta")]
    wide = _keyed(counters).pivot_table(index=_MEASUREMENT_KEY, columns="metric", values="value",
                                        aggfunc="sum").reset_index()
    if not {"prefix_cache_hits", "prefix_cache_queries"} <= set(wide.columns):
        out.skips.append(_Skip("cache_not_cold", "no prefix_cache_hits/queries counters in server_metrics", thr))
        return
    cols = [*_MEASUREMENT_KEY, "prefix_cache_reset"] if "prefix_cache_reset" in uniq.columns else _MEASUREMENT_KEY
    f = _keyed(uniq[cols]).merge(wide, on=_MEASUREMENT_KEY, how="inner")
    f = f[_num(f["prefix_cache_queries"]) > 0].reset_index(drop=True)
    if f.empty:
        out.skips.append(_Skip("cache_not_cold", "no unique-prompt window with prefix-cache queries", thr))
        return
    f["prefix_hit_frac"] = _num(f["prefix_cache_hits"]) / _num(f["prefix_cache_queries"])
    f["label"] = _label(f, _MEASUREMENT_KEY)
    observed = _worst(f, "prefix_hit_frac")
    hot = f[f["prefix_hit_frac"] > COLD_CACHE_MAX_HIT_FRAC]
    if not hot.empty and "prefix_cache_reset" in f.columns:
        i = hot.index[0]
        observed += (f"; {int(f.at[i, 'prefix_cache_hits'])} of {int(f.at[i, 'prefix_cache_queries'])} queried "
                     f"tokens hit, reset before it: {f.at[i, 'prefix_cache_reset']}")
    out.plans.append(_Plan(f, [_Spec(
        "cache_not_cold",
        gxe.ExpectColumnValuesToBeBetween(column="prefix_hit_frac", max_value=COLD_CACHE_MAX_HIT_FRAC),
        thr, observed)]))


def _overloaded(gxe: Any, meas: pd.DataFrame | None, out: _Collector) -> None:
    if meas is None or "overloaded" not in meas.columns:
        out.skips.append(_Skip("overloaded", "overloaded not recorded", "false"))
        return
    flag = _bool_obj(meas["overloaded"])
    if not flag.notna().any():
        out.skips.append(_Skip("overloaded", "no open-loop window judged (closed loop cannot outrun the server)",
                               "false"))
        return
    f = meas[flag.notna()].copy().reset_index(drop=True)
    f["overloaded"] = _bool_obj(f["overloaded"])
    f["label"] = _label(f, _MEASUREMENT_KEY)
    hit = f["overloaded"].map(lambda v: v is True).to_numpy(dtype=bool)
    observed = f"{int(np.sum(hit))} of {len(f)} open-loop windows overloaded"
    if hit.any():
        observed += f" ({', '.join(f.loc[hit, 'label'].head(3))}; left out of comparisons)"
    out.plans.append(_Plan(f, [_Spec(
        "overloaded", gxe.ExpectColumnValuesToBeInSet(column="overloaded", value_set=[False]), "false",
        observed)]))


def suite_conditions(gxe: Any, meas: pd.DataFrame | None, sm: pd.DataFrame | None, out: _Collector) -> None:
    """Add the ``cache_not_cold`` and ``overloaded`` checks (module docstring) to ``out``: a plan each, or a skip
    with its reason (column not recorded, no window it applies to)."""
    _cache_not_cold(gxe, meas, sm, out)
    _overloaded(gxe, meas, out)
