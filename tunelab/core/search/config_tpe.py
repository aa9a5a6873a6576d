"""Search over engine args and env with boots as the cost (a plan's ``search:`` section): the pure pieces.

A plan with ``search:`` names a space (engine args and env names -> a list of values or a ``{low, high, step|log}``
range), an objective (``maximize``/``minimize`` a ``measurements`` column at one workload and load level, under
the plan's ``slo:``) and a budget (``boots`` and/or ``gpu_minutes``). :func:`run_search` asks optuna's
``TPESampler`` (seeded from the plan's ``seed``) for a config, boots it through a callback (the sweep's trial
runner through the design ``designs.config_search``; a simulated objective in the tests), tells optuna the result and goes on until the
budget is spent. One optuna trial = one boot of one config. docs/tuning.md says how and why.

- **Objective** (:func:`objective_value`): the mean over the boot's windows of the metric at the objective's cell.
  The SLO is a constraint, not a penalty: a window meets it when each bound of ``slo:`` holds at the
  ``slo_percentile`` (``ttft_p90_s <= slo.ttft_s`` ...); the boot's violation (largest ``observed / bound - 1``
  over the bounds, mean of windows) goes to optuna as a constraint (``TPESampler(constraints_func=...)``), so TPE
  learns where the feasible region is, and only feasible configs can be "best".
- **Pruning** (:func:`prune_decision`): after each measured window of the objective cell the flow reports the
  running mean (``trial.report``); once ``prune.after_windows`` windows are in, a config whose mean is worse than
  the best feasible value so far by more than ``prune.margin`` (relative) is stopped and told as ``PRUNED``.
- **Memory walk-down** (:func:`walk_down`): a boot that failed for memory is information, as in vLLM's
  ``benchmarks/auto_tune/auto_tune.sh``: the same config is booted again with ``--gpu-memory-utilization``,
  ``--max-model-len`` or ``--max-num-seqs`` lowered (which one depends on the failure class), up to
  ``walk_down.max_steps`` times; the failed boot stays in the record. Every walk-down boot counts against the
  budget, and optuna is told each walk-down boot whose config is a point of the space (``study.add_trial``).
- **What optuna is told of a failed boot** (:data:`CONFIG_FAILURES`): a config failure (out of memory, an invalid
  config) is *infeasible*: the worst value and a violated constraint (:data:`CONFIG_FAILURE_VIOLATION`), which TPE's
  ``constraints_func`` uses to steer away from the region; an environment fault (timeout, crash, ...) is
  ``TrialState.FAIL``, which TPE ignores. A suggestion that repeats a booted config costs no boot; after
  :data:`MAX_REPEATS` of them in a row the next boot is an unbooted config drawn at random (seeded), and the search
  ends ``space_exhausted`` only when no unbooted config is left to draw.
- **Guided by the diagnosis** (``search.guide``, :data:`REMEDY_MOVES`): after a boot whose windows at the
  objective's cell flag a bottleneck (``window_diagnoses``) whose remedy is an engine arg of the space, the next
  boot is that config with the knob moved one value of the space (``api-server-count`` up, ...), enqueued in optuna
  (``study.enqueue_trial``); at most one such move per boot, so TPE's own suggestions go on between them. The boot
  records why (``SearchRecord.reason``, ``trials.search_reason``).

Domain layer: imports only pydantic, optuna, pandas, the standard library and ``load_profiles`` (never ``plan``,
which imports this module).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CONFIG_FAILURES",
    "CONFIG_FAILURE_VIOLATION",
    "MEMORY_FAILURES",
    "BootOutcome",
    "boots_phrase",
    "default_in_space",
    "flagged_bottlenecks",
    "guided_move",
    "REMEDY_MOVES",
    "VLLM_DEFAULTS",
    "ObjectiveValue",
    "SearchBoot",
    "SearchBudget",
    "SearchObjective",
    "SearchOutcome",
    "SearchRange",
    "SearchRecord",
    "SearchSpace",
    "SearchSpec",
    "config_of",
    "distributions",
    "grid_keys",
    "grid_params",
    "grid_size",
    "objective_value",
    "plain_number",
    "prune_decision",
    "range_values",
    "run_search",
    "space_params",
    "walk_down",
]

Scalar = str | int | float | bool | None

#: Boot failure classes (tasks.bootlog) that a smaller memory footprint can cure: the walk-down tries them again.
MEMORY_FAILURES = ("oom_kv_cache", "oom_graph_capture", "insufficient_free_memory", "oom_weights")
#: Boot failure classes that are a property of the config (the same config fails the same way on the same host):
#: optuna is told such a boot as *infeasible* (a violated constraint and the worst value), so TPE learns the
#: region to avoid. Any other failure (timeout, crash, a corrupt compile cache, a busy GPU, a port conflict, a
#: measurement error, the quality gate) is an environment fault and is told ``TrialState.FAIL``, which TPE ignores:
#: it says nothing about the config. Why: TPE leaves FAIL trials out of its model (optuna issues 2864, 3472), so
#: with FAIL it kept sampling the region that runs out of memory.
CONFIG_FAILURES = MEMORY_FAILURES + ("invalid_config",)
#: The constraint value optuna is told for a config failure: far above any SLO excess (``observed / bound - 1``),
#: so TPE ranks a config that did not boot below every config that ran, as ``objective_value`` does for no data.
CONFIG_FAILURE_VIOLATION = 1e9


class SearchRange(BaseModel):
    """A numeric range of one search dimension: ``{low, high}`` with ``step`` (a grid) or ``log: true`` (sampled
    on the log scale); integers when ``low``, ``high`` (and ``step``) are integers."""

    model_config = ConfigDict(extra="forbid")
    low: int | float = Field(description="Lowest value (included).")
    high: int | float = Field(description="Highest value (included).")
    step: int | float | None = Field(None, gt=0, description="Grid step from low; None: continuous (or every integer).")
    log: bool = Field(False, description="Sample on the log scale (low > 0; not with step).")

    @model_validator(mode="after")
    def _ok(self) -> "SearchRange":
        for k in ("low", "high", "step"):
            v = getattr(self, k)
            if isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
                raise ValueError(f"{k}: a finite number, got {v!r}")
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.step is not None:
            raise ValueError("give step or log, not both")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0, got {self.low}")
        return self

    @property
    def integer(self) -> bool:
        """True when every value is an integer."""
        return all(isinstance(v, int) for v in (self.low, self.high, self.step if self.step is not None else 1))


SpaceValue = SearchRange | list[Scalar]


class SearchSpace(BaseModel):
    """What the search varies: engine args and env names -> a list of values or a range. Names are checked as the
    plan's ``engine_args``/``env`` (Plan's validator; against the runtimes' facts in ``plan check`` and ``run``)."""

    model_config = ConfigDict(extra="forbid")
    engine_args: dict[str, SpaceValue] = Field(default_factory=dict, description="vllm serve flags to search.")
    env: dict[str, SpaceValue] = Field(default_factory=dict, description="Environment variables to search.")

    @model_validator(mode="after")
    def _not_empty(self) -> "SearchSpace":
        if not self.engine_args and not self.env:
            raise ValueError("the search space is empty: give at least one engine arg or env var to vary, e.g. "
                             "space: {engine_args: {max-num-seqs: [64, 128, 256]}}")
        for kind, d in (("engine_args", self.engine_args), ("env", self.env)):
            for k, v in d.items():
                if isinstance(v, list) and not v:
                    raise ValueError(f"{kind}.{k}: an empty list; give at least one value")
        return self


class SearchObjective(BaseModel):
    """What the search optimises: ``maximize`` a throughput (``*_per_s``) or ``minimize`` a latency column of
    ``measurements`` at one workload and one load level, under the plan's ``slo:`` checked at ``slo_percentile``."""

    model_config = ConfigDict(extra="forbid")
    maximize: str | None = Field(None, description="A *_per_s column, e.g. output_tokens_per_s or goodput_per_s.")
    minimize: str | None = Field(None, description="A latency column, e.g. tpot_p90_s.")
    workload: str | None = Field(None, description="The workload; default: the plan's first.")
    load: str | None = Field(None, description="The load level by label (c=32, '2 req/s'); default: the plan's last.")
    slo_percentile: Literal[50, 90, 95, 99] = Field(
        90, description="Percentile of each window at which the plan's SLO bounds are checked.")

    @model_validator(mode="after")
    def _one(self) -> "SearchObjective":
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError("give exactly one of maximize (a *_per_s column) or minimize (a latency column), e.g. "
                             "objective: {maximize: output_tokens_per_s, load: c=32}")
        m = self.metric
        if self.maximize is not None and not m.endswith("_per_s"):
            raise ValueError(f"maximize: {m!r} is not a throughput (*_per_s) column; minimize a latency instead")
        if self.minimize is not None and not m.endswith("_s"):
            raise ValueError(f"minimize: {m!r} is not a latency (*_s) column")
        return self

    @property
    def metric(self) -> str:
        """The measurements column optimised."""
        return self.maximize or self.minimize  # type: ignore[return-value]

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        """optuna's direction."""
        return "maximize" if self.maximize is not None else "minimize"


class SearchBudget(BaseModel):
    """What the search may spend: boots (every boot: the default, the search's configs and walk-down boots)
    and/or GPU-minutes (device-minutes of trial wall time, slot taken -> trial ended, x devices)."""

    model_config = ConfigDict(extra="forbid")
    boots: int | None = Field(None, strict=True, description="Most boots, the default's included (>= 2).")
    gpu_minutes: float | None = Field(None, allow_inf_nan=False, description="Most device-minutes of the trials.")

    @model_validator(mode="after")
    def _some(self) -> "SearchBudget":
        if self.boots is None and self.gpu_minutes is None:
            raise ValueError("give boots and/or gpu_minutes, e.g. budget: {boots: 12, gpu_minutes: 60}")
        if self.boots is not None and self.boots < 2:
            raise ValueError(f"boots: {self.boots} leaves no boot for the search (the plan's default config takes "
                             "the first); give at least 2")
        if self.gpu_minutes is not None and self.gpu_minutes <= 0:
            raise ValueError(f"gpu_minutes: {self.gpu_minutes} is no budget; give a positive number of minutes")
        return self


class PruneRule(BaseModel):
    """Stop a config early: after ``after_windows`` windows of the objective cell, when their mean is worse than
    the best feasible value so far by more than ``margin`` (relative)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    after_windows: int = Field(1, strict=True, ge=1, description="Windows of the objective cell before judging.")
    margin: float = Field(0.25, gt=0, lt=1, description="Worse than the best by more than this (relative).")


class WalkDown(BaseModel):
    """Re-boot a config that failed for memory with a smaller footprint (:func:`walk_down`)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    max_steps: int = Field(3, strict=True, ge=1, le=10, description="Most walk-down boots per suggested config.")


class SearchSpec(BaseModel):
    """A plan's ``search:`` section (docs/tuning.md)."""

    model_config = ConfigDict(extra="forbid")
    space: SearchSpace
    objective: SearchObjective
    budget: SearchBudget
    prune: PruneRule = Field(default_factory=PruneRule)
    walk_down: WalkDown = Field(default_factory=WalkDown)
    guide: bool = Field(True, description=(
        "After a boot whose diagnosis flags a bottleneck whose remedy is an engine arg of the space "
        "(REMEDY_MOVES: api_server -> api-server-count up; kv_cache -> gpu-memory-utilization up, else "
        "max-num-seqs down; prefill_interference -> max-num-batched-tokens down), boot that config with the knob "
        "moved one value next (at most one such move per boot). false: TPE alone."))


# -- space -> optuna ---------------------------------------------------------------------------------------------
def _pname(kind: str, name: str) -> str:
    return name if kind == "engine_args" else f"env.{name}"


def distributions(space: SearchSpace) -> dict[str, Any]:
    """optuna distributions of the space: a list -> ``CategoricalDistribution``; an integer range ->
    ``IntDistribution``; a float range -> ``FloatDistribution`` (``step`` or ``log`` as given). Env names are
    prefixed ``env.``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for kind in ("engine_args", "env"):
        for name, v in sorted(getattr(space, kind).items()):
            if isinstance(v, list):
                out[_pname(kind, name)] = CategoricalDistribution(v)
            elif v.integer:
                out[_pname(kind, name)] = IntDistribution(int(v.low), int(v.high), log=v.log,
                                                          step=int(v.step) if v.step is not None else 1)
            else:
                out[_pname(kind, name)] = FloatDistribution(float(v.low), float(v.high), log=v.log,
                                                            step=float(v.step) if v.step is not None else None)
    return out


def grid_size(space: SearchSpace) -> int | None:
    """Configs in the full grid of the space; None when a dimension is continuous (a float range without step)."""
    n = 1
    for kind in ("engine_args", "env"):
        for v in getattr(space, kind).values():
            if isinstance(v, list):
                n *= len(v)
            elif v.integer:
                n *= (int(v.high) - int(v.low)) // int(v.step or 1) + 1
            elif v.step is not None:
                n *= int(math.floor((v.high - v.low) / v.step + 1e-9)) + 1
            else:
                return None
    return n


def plain_number(v: Any) -> Any:
    """``v`` with an integral float as an int (``3.0`` -> ``3``); anything else unchanged. A float range
    (``{low: 2, high: 3, step: 0.5}``) gives floats; ``vllm serve --max-num-seqs 3.0`` is rejected
    (``invalid int value: '3.0'``) where ``3`` is taken, and a float option reads ``3`` as well as ``3.0``."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return v


#: Values of one range that :func:`range_values` lists at most (a longer grid: None).
MAX_RANGE_VALUES = 10_000


def range_values(r: SearchRange) -> list[int | float] | None:
    """The values the search can give for range ``r``, in order, as they reach ``vllm serve`` (integral floats as
    ints, :func:`plain_number`): ``low, low + step, ...`` up to ``high`` (every integer of an integer range without
    step). None when the range is continuous (a float range without step) or has more than
    :data:`MAX_RANGE_VALUES` values. Float steps are rounded to 10 decimals (``0.1 * 3`` is ``0.3``)."""
    if r.integer:
        step = int(r.step) if r.step is not None else 1
        n = (int(r.high) - int(r.low)) // step + 1
        return None if n > MAX_RANGE_VALUES else list(range(int(r.low), int(r.high) + 1, step))
    if r.step is None:
        return None
    n = int(math.floor((r.high - r.low) / r.step + 1e-9)) + 1
    if n > MAX_RANGE_VALUES:
        return None
    return [plain_number(round(r.low + i * r.step, 10)) for i in range(n)]


def default_in_space(space: SearchSpace, base_args: dict[str, Scalar], base_env: dict[str, str]) -> bool | None:
    """Whether the plan's default config (``base_args``, ``base_env``) is one of the space's configs: each of its
    settings of a name of the space is a value of that dimension (an unset engine arg counts as ``null``/``false``;
    env values compare as strings, booleans as ``1``/``0``). None when a dimension is continuous (no finite grid)."""
    for kind, base in (("engine_args", base_args), ("env", base_env)):
        for name, dim in getattr(space, kind).items():
            have = base.get(name)
            vals = dim if isinstance(dim, list) else range_values(dim)
            if vals is None:
                return None
            if kind == "env":
                same = have is not None and str(have) in {("1" if x else "0") if isinstance(x, bool) else
                                                          str(plain_number(x)) for x in vals if x is not None}
                same = same or (have is None and None in vals)
            elif have is None or have is False:
                same = any(x is None or x is False for x in vals)
            else:
                same = any(x == have and isinstance(x, bool) == isinstance(have, bool) for x in vals)
            if not same:
                return False
    return True


def boots_phrase(boots: int, grid: int | None, default_in_grid: bool | None,
                 records: list[tuple[str, str | None, str]]) -> str:
    """What a search's boots were, in words: ``2 boots (the default + 1 of a grid of 2 configs)``, ``3 boots (3 of
    a grid of 3 configs, the default among them)``, ``5 boots (the default + 4 config(s) of a continuous space (no
    finite grid))``, with ``+ N walk-down(s)`` and ``+ N cancelled`` (boots an interruption ended) when there were.

    Args:
        boots: boots started (``SearchOutcome.boots``, ``sweeps.search_boots``).
        grid: the grid's size (None: continuous).
        default_in_grid: whether the default is a config of the grid (:func:`default_in_space`; None: not known).
        records: (role, search state, config key) of each boot (``SearchRecord`` / ``trials.search_*``).
    """
    done = [(role, key) for role, state, key in records if state != "cancelled"]
    cancelled = len(records) - len(done)
    walk_downs = sum(role == "walk_down" for role, _ in done)
    default_done = any(role == "default" for role, _ in done)
    in_grid = {key for role, key in done if role == "search" or (role == "default" and default_in_grid)}
    parts: list[str] = []
    if default_done and not (grid is not None and default_in_grid):
        parts.append("the default")
    if grid is None:
        parts.append(f"{len(in_grid)} config(s) of a continuous space (no finite grid)")
    else:
        parts.append(f"{len(in_grid)} of a grid of {grid} configs"
                     + (", the default among them" if default_done and default_in_grid else ""))
    if walk_downs:
        parts.append(f"{walk_downs} walk-down(s)")
    if cancelled:
        parts.append(f"{cancelled} cancelled")
    return f"{boots} boot{'' if boots == 1 else 's'} ({' + '.join(parts)})"


def config_of(params: dict[str, Any], base_args: dict[str, Scalar], base_env: dict[str, str]
              ) -> tuple[dict[str, Scalar], dict[str, str]]:
    """(engine_args, env) of a suggestion: the plan's base config with the params set (``env.X`` -> env var X;
    a boolean env value as ``1``/``0``; a None env value unsets it). An integral float (``3.0``, from a float
    range) is set as an int (``3``): what ``vllm serve`` gets and what the trial records."""
    args, env = dict(base_args), dict(base_env)
    for k, v in params.items():
        v = plain_number(v)
        if k.startswith("env."):
            name = k[4:]
            if v is None:
                env.pop(name, None)
            else:
                env[name] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        else:
            args[k] = v
    return args, env


# -- objective under the SLO -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectiveValue:
    """One boot's value at the objective cell: ``value`` (mean over windows, None when no window), ``windows``,
    ``violation`` (largest relative excess over an SLO bound, mean over windows; <= 0: the SLO holds)."""

    value: float | None
    windows: int
    violation: float

    @property
    def feasible(self) -> bool:
        return self.value is not None and self.violation <= 0


def _load_labels(m: pd.DataFrame) -> list[str]:
    from tunelab.core.load_profiles import load_label

    return [load_label(k, v) for k, v in zip(m["load_kind"], m["load_value"])]


def cell_rows(measurements: pd.DataFrame | None, workload: str, load: str) -> pd.DataFrame:
    """The windows of ``measurements`` at ``workload`` and load level ``load`` (a label), in measured order."""
    if measurements is None or measurements.empty:
        return pd.DataFrame()
    m = measurements[measurements["workload"] == workload]
    if m.empty:
        return m
    return m[[lab == load for lab in _load_labels(m)]]


def objective_value(measurements: pd.DataFrame | None, metric: str, workload: str, load: str,
                    slo: dict[str, float | None], percentile: int = 90) -> ObjectiveValue:
    """The objective of one boot (see the module docstring).

    Args:
        measurements: the boot's ``measurements`` rows (a bundle's table).
        metric, workload, load: the objective's column and cell.
        slo: ``{ttft_s, tpot_s, e2el_s}`` bounds in seconds (None: no bound).
        percentile: the percentile column at which each bound is checked.
    """
    rows = cell_rows(measurements, workload, load)
    if rows.empty or metric not in rows.columns:
        return ObjectiveValue(None, 0, math.inf)
    vals = pd.to_numeric(rows[metric], errors="coerce").dropna()
    if vals.empty:
        return ObjectiveValue(None, 0, math.inf)
    excess: list[pd.Series] = []
    for name, bound in slo.items():
        if bound is None:
            continue
        col = f"{name.removesuffix('_s')}_p{percentile}_s"
        obs = pd.to_numeric(rows[col], errors="coerce") if col in rows.columns else pd.Series([math.inf] * len(rows))
        excess.append(obs.fillna(math.inf) / bound - 1.0)
    violation = float(pd.concat(excess, axis=1).max(axis=1).mean()) if excess else -1.0
    return ObjectiveValue(float(vals.mean()), int(len(vals)), violation if math.isfinite(violation) else 1e9)


def prune_decision(values: list[float], best: float | None, rule: PruneRule,
                   direction: Literal["maximize", "minimize"]) -> bool:
    """Whether a config whose objective-cell windows so far gave ``values`` is clearly worse than ``best`` (the best
    feasible value so far; None: nothing to compare with, never prune)."""
    if not rule.enabled or best is None or len(values) < rule.after_windows or not values:
        return False
    mean = sum(values) / len(values)
    if direction == "maximize":
        return mean < best * (1.0 - rule.margin)
    return mean > best * (1.0 + rule.margin)


# -- memory walk-down --------------------------------------------------------------------------------------------
#: vLLM's defaults when a plan does not set the flag (vLLM 0.2x: EngineArgs).
_DEFAULT_GMU = 0.9
_DEFAULT_MAX_NUM_SEQS = 256
_MIN_GMU = 0.5


def walk_down(engine_args: dict[str, Scalar], failure_class: str | None, min_model_len: int = 0
              ) -> tuple[dict[str, Scalar], str] | None:
    """The next, smaller config to boot after a memory failure, or None (not a memory failure, or nothing left
    to lower).

    Which knob, by failure class (``tasks.bootlog``):

    - ``oom_kv_cache`` (no memory for the KV cache, or it cannot hold one ``max-model-len`` sequence): halve
      ``max-model-len`` when the plan sets one (never below ``min_model_len``, the longest request of the plan),
      else halve ``max-num-seqs`` (from vLLM's default 256 when unset);
    - ``oom_graph_capture``: halve ``max-num-seqs`` (CUDA graphs are captured up to it), then
      ``gpu-memory-utilization`` - 0.05;
    - ``insufficient_free_memory`` / ``oom_weights``: ``gpu-memory-utilization`` - 0.05 (not below 0.5), as
      auto_tune.sh walks it down from 0.98.

    Returns:
        (engine_args, what changed in words).
    """
    if failure_class not in MEMORY_FAILURES:
        return None
    args = dict(engine_args)

    def lower_seqs() -> str | None:
        cur = args.get("max-num-seqs")
        cur_i = int(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else _DEFAULT_MAX_NUM_SEQS
        if cur_i <= 1:
            return None
        args["max-num-seqs"] = max(1, cur_i // 2)
        return f"max-num-seqs {cur_i} -> {args['max-num-seqs']}"

    def lower_len() -> str | None:
        cur = args.get("max-model-len")
        if not isinstance(cur, int) or isinstance(cur, bool):
            return None
        new = max(cur // 2, min_model_len)
        if new >= cur:
            return None
        args["max-model-len"] = new
        return f"max-model-len {cur} -> {new}"

    def lower_gmu() -> str | None:
        cur = args.get("gpu-memory-utilization")
        cur_f = float(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else _DEFAULT_GMU
        new = round(cur_f - 0.05, 2)
        if new < _MIN_GMU:
            return None
        args["gpu-memory-utilization"] = new
        return f"gpu-memory-utilization {cur_f:g} -> {new:g}"

    order = {"oom_kv_cache": (lower_len, lower_seqs), "oom_graph_capture": (lower_seqs, lower_gmu),
             "insufficient_free_memory": (lower_gmu,), "oom_weights": (lower_gmu,)}[failure_class]
    for step in order:
        what = step()
        if what:
            return args, what
    return None


# -- guided by the diagnosis -------------------------------------------------------------------------------------
#: The moves the search tries after a boot whose diagnosis flags a bottleneck (``search.guide``): bottleneck ->
#: (engine arg, ``up``/``down``), in order of preference. They are the one-knob parts of the seeds' remedies
#: (``diagnosis.REMEDIES``): api_server "--api-server-count N (several API server processes)"; kv_cache "raise
#: --gpu-memory-utilization; ... lower --max-num-seqs"; prefill_interference "a smaller --max-num-batched-tokens".
#: The other remedies are no move along a dimension (VLLM_USE_FASTOKENS, chunked prefill on, a realistic
#: max-model-len), and the client and gpu_floor findings have none (no serving flag cures them).
REMEDY_MOVES: dict[str, list[tuple[str, str]]] = {
    "api_server": [("api-server-count", "up")],
    "kv_cache": [("gpu-memory-utilization", "up"), ("max-num-seqs", "down")],
    "prefill_interference": [("max-num-batched-tokens", "down")],
}

#: vLLM's defaults of the knobs of :data:`REMEDY_MOVES` that a config may leave unset, the value a move starts from
#: (``vllm serve --help`` of vLLM 0.32.0, the version of the ``engine_arg_values`` table). ``api-server-count``:
#: unset, ``vllm/entrypoints/cli/serve.py`` resolves it to the data-parallel size, 1 for one engine without data
#: parallelism (what a search boots). A knob unset and not here (``max-num-seqs``, ``max-num-batched-tokens``: their
#: defaults depend on the model, the GPU and the usage context) is not moved.
VLLM_DEFAULTS: dict[str, Scalar] = {"api-server-count": 1, "gpu-memory-utilization": 0.9}

_UNSET = object()


def flagged_bottlenecks(diagnoses: pd.DataFrame | None, workload: str, load: str) -> dict[str, int]:
    """Bottleneck -> windows flagged at the objective's cell (``workload``, load label ``load``) of a boot's
    ``window_diagnoses`` rows (one per window and bottleneck, ``flagged`` True/False/None); only bottlenecks flagged
    in at least one window."""
    rows = cell_rows(diagnoses, workload, load)
    if rows.empty or "flagged" not in rows.columns or "bottleneck" not in rows.columns:
        return {}
    hit = rows[rows["flagged"].eq(True).fillna(False).astype(bool)]
    counts = hit.groupby("bottleneck").size()
    return {str(b): int(n) for b, n in counts.items() if n > 0}


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ordered(dim: SpaceValue) -> list[int | float] | None:
    """The numeric values of a dimension in ascending order (a list: its numbers sorted; a range: its values),
    None when continuous."""
    if isinstance(dim, list):
        return sorted({v for v in dim if _is_num(v)})
    return range_values(dim)


def _param_of(kind: str, name: str, dim: SpaceValue, args: dict[str, Scalar], env: dict[str, str]) -> Any:
    """The value of dimension ``name`` that gives a config's setting (as optuna takes it), or ``_UNSET`` when the
    config does not set it or sets a value that is not one of the space's."""
    have = (args if kind == "engine_args" else env).get(name)
    if have is None:  # unset: a value only when the space lists null
        return None if isinstance(dim, list) and None in dim else _UNSET
    if kind == "env":
        vals = dim if isinstance(dim, list) else (range_values(dim) or [])
        for x in vals:
            if x is not None and (("1" if x else "0") if isinstance(x, bool) else str(plain_number(x))) == have:
                return x
        return _UNSET
    if isinstance(dim, list):
        return next((x for x in dim if x == have and isinstance(x, bool) == isinstance(have, bool)), _UNSET)
    if not _is_num(have):
        return _UNSET
    vals = range_values(dim)
    if vals is None:
        return float(have) if dim.low <= have <= dim.high else _UNSET
    return have if have in vals else _UNSET


def guided_move(space: SearchSpace, engine_args: dict[str, Scalar], env: dict[str, str],
                bottlenecks: dict[str, int], windows: int, boot_label: str,
                booted: Callable[[dict[str, Scalar]], bool]) -> tuple[dict[str, Any], str] | None:
    """The config to try next after a boot whose diagnosis flagged ``bottlenecks``, or None.

    For each flagged bottleneck (most windows first) and each of its :data:`REMEDY_MOVES` whose knob is an engine
    arg of the space: the knob's current value (the boot's, else :data:`VLLM_DEFAULTS`, else no move), its next
    value of the space strictly above (``up``) or below (``down``) it (a list: its numbers sorted; a range: its
    values; a continuous range: no move). The first move whose config (the boot's with that knob moved) was not
    booted (``booted(engine_args)``) is the answer.

    Args:
        space: the search space. engine_args, env: the boot's config.
        bottlenecks: bottleneck -> windows flagged at the objective's cell (:func:`flagged_bottlenecks`).
        windows: the boot's windows at that cell (for the reason). boot_label: e.g. ``boot 1 (default)``.
        booted: whether a config (engine args; the boot's env) was booted already.

    Returns:
        (optuna params to enqueue: the moved knob and every other dimension the boot sets to a value of the space,
        so the next boot is its neighbour; dimensions it leaves unset are left to the sampler; the reason in words).
    """
    dists = distributions(space)
    for b, n in sorted(bottlenecks.items(), key=lambda kv: (-kv[1], list(REMEDY_MOVES).index(kv[0])
                                                             if kv[0] in REMEDY_MOVES else len(REMEDY_MOVES))):
        if n <= 0:
            continue
        for knob, way in REMEDY_MOVES.get(b, []):
            dim = space.engine_args.get(knob)
            if dim is None:
                continue
            cur = engine_args.get(knob)
            if cur is None or cur is False:
                cur = VLLM_DEFAULTS.get(knob)
            if not _is_num(cur):
                continue
            vals = _ordered(dim)
            if not vals:
                continue
            nxt = min((v for v in vals if v > cur), default=None) if way == "up" else \
                max((v for v in vals if v < cur), default=None)
            if nxt is None:
                continue
            moved = {**engine_args, knob: plain_number(nxt)}
            if booted(moved):
                continue
            params: dict[str, Any] = {}
            for kind in ("engine_args", "env"):
                for name, d in getattr(space, kind).items():
                    v = _param_of(kind, name, d, engine_args, env)
                    if v is not _UNSET:
                        params[_pname(kind, name)] = v
            params[knob] = nxt
            for pn, v in params.items():  # as the distribution takes it
                dist = type(dists[pn]).__name__
                if dist == "IntDistribution" and _is_num(v):
                    params[pn] = int(v)
                elif dist == "FloatDistribution" and _is_num(v):
                    params[pn] = float(v)
            reason = (f"diagnosis: {b} flagged in {n}/{max(windows, n)} windows of {boot_label} -> {knob} "
                      f"{plain_number(cur)} -> {plain_number(nxt)}")
            return params, reason
    return None


# -- the loop ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchBoot:
    """One boot the loop asks for: the config, its role (``default``, ``search``, ``walk_down``), the optuna
    trial number (None for the default), what the walk-down changed, and ``window_check``: call it with the
    boot's measurements so far after each window; True means stop measuring (pruned)."""

    engine_args: dict[str, Scalar]
    env: dict[str, str]
    role: str
    number: int | None
    walked: str | None
    window_check: Callable[[pd.DataFrame], bool]


@dataclass
class BootOutcome:
    """What a boot gave back: ``status`` (``ok``, ``boot_failed``, ...), ``failure_class`` (``pruned`` when
    ``window_check`` stopped it), its measurements, whether its quality verdict lets it count (``usable``), its
    device-minutes, the trial id it was recorded under, and ``bottlenecks``: bottleneck -> windows flagged at the
    objective's cell by its diagnosis (:func:`flagged_bottlenecks` of its ``window_diagnoses``; empty: none)."""

    status: str
    failure_class: str | None = None
    measurements: pd.DataFrame | None = None
    usable: bool = True
    gpu_minutes: float = 0.0
    trial_id: str | None = None
    bottlenecks: dict[str, int] = field(default_factory=dict)


@dataclass
class SearchRecord:
    """One boot of the search, as recorded (``trials.search_*``, migrations 018 and 020). ``reason``: why the search
    chose it when an earlier boot's diagnosis did (:func:`guided_move`); None: TPE's own suggestion, the default, a
    walk-down."""

    role: str
    number: int | None
    engine_args: dict[str, Scalar]
    env: dict[str, str]
    config_key: str
    state: str  # complete | infeasible | pruned | fail | cancelled (interrupted while it ran)
    value: float | None = None
    violation: float | None = None
    failure_class: str | None = None
    walked: str | None = None
    walked_from: str | None = None
    gpu_minutes: float = 0.0
    trial_id: str | None = None
    boot: int = 0  # 1-based boot number in the search (the default is 1)
    reason: str | None = None
    told: str | None = None  # what optuna was told: complete | infeasible | pruned | fail; None: not told


@dataclass
class SearchOutcome:
    """The search: every boot's record, the best feasible config's key (None: none met the SLO), why it stopped
    (``budget_boots``, ``budget_gpu_minutes``, ``space_exhausted``, or ``interrupted``: an interruption such as
    Ctrl-C ended a boot, which is then recorded ``cancelled``), boots started, GPU-minutes, and the grid size of
    the space (None: continuous)."""

    records: list[SearchRecord] = field(default_factory=list)
    best_key: str | None = None
    stop_reason: str = "budget_boots"
    boots: int = 0
    gpu_minutes: float = 0.0
    grid_size: int | None = None
    study: Any = None  # the optuna study (its trials' states: what optuna was told)

    def best(self) -> SearchRecord | None:
        return next((r for r in self.records if r.config_key == self.best_key and r.state == "complete"), None)


def _key(args: dict, env: dict) -> str:
    canon = {k: v for k, v in args.items() if v is not None and v is not False}
    blob = json.dumps({"a": canon, "e": env}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: Suggestions in a row that repeat a config already booted, after which the search stops (``space_exhausted``).
MAX_REPEATS = 30
#: Largest grid whose configs :func:`grid_keys` lists (to tell when every one has been booted).
MAX_LISTED_GRID = 10_000


def grid_keys(space: SearchSpace, base_args: dict[str, Scalar], base_env: dict[str, str],
              key: Callable[[dict, dict], str]) -> set[str] | None:
    """The config keys of every config of the space's grid (each applied to the base config, as
    :func:`config_of`), or None when they are not listed: a float dimension (its values as optuna builds them
    need not match a list made here), or more than :data:`MAX_LISTED_GRID` configs. The default config is one of
    them when its settings are values of the space."""
    params = grid_params(space)
    if params is None:
        return None
    return {key(*config_of(p, base_args, base_env)) for p in params}


def grid_params(space: SearchSpace) -> list[dict[str, Any]] | None:
    """The optuna params (``{name: value}``, env names as ``env.X``) of every config of the space's grid, in a
    fixed order, or None when not listed (as :func:`grid_keys`)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    axes: list[tuple[str, list]] = []
    for name, d in distributions(space).items():
        if isinstance(d, CategoricalDistribution):
            axes.append((name, list(d.choices)))
        elif isinstance(d, IntDistribution):
            axes.append((name, list(range(d.low, d.high + 1, d.step))))
        else:
            return None
    if math.prod(len(v) for _, v in axes) > MAX_LISTED_GRID:
        return None
    names = [n for n, _ in axes]
    return [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in axes))]


def _random_params(dists: dict[str, Any], rng: Any) -> dict[str, Any]:
    """One config drawn at random from the optuna distributions (``rng``: a ``random.Random``): a categorical
    choice, an integer of the range's steps, a float uniform on the range (on the log scale with ``log``)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out: dict[str, Any] = {}
    for name, d in dists.items():
        if isinstance(d, CategoricalDistribution):
            out[name] = d.choices[rng.randrange(len(d.choices))]
        elif isinstance(d, IntDistribution):
            out[name] = rng.randrange(d.low, d.high + 1, d.step)
        elif d.log:
            out[name] = math.exp(rng.uniform(math.log(d.low), math.log(d.high)))
        elif d.step is not None:
            out[name] = d.low + d.step * rng.randrange(int(math.floor((d.high - d.low) / d.step + 1e-9)) + 1)
        else:
            out[name] = rng.uniform(d.low, d.high)
    return out


def space_params(space: SearchSpace, engine_args: dict[str, Scalar], env: dict[str, str]) -> dict[str, Any] | None:
    """The optuna params of a config when it is a point of the space (every dimension set to one of its values, as
    the distribution takes it), else None. Used to tell optuna a boot it did not suggest (a walk-down)."""
    dists = distributions(space)
    params: dict[str, Any] = {}
    for kind in ("engine_args", "env"):
        for name, d in getattr(space, kind).items():
            v = _param_of(kind, name, d, engine_args, env)
            if v is _UNSET:
                return None
            pn = _pname(kind, name)
            dist = type(dists[pn]).__name__
            v = int(v) if dist == "IntDistribution" and _is_num(v) else float(v) if (
                dist == "FloatDistribution" and _is_num(v)) else v
            if not dists[pn]._contains(dists[pn].to_internal_repr(v)):
                return None
            params[pn] = v
    return params


def run_search(spec: SearchSpec, *, base_args: dict[str, Scalar], base_env: dict[str, str], seed: int,
               workload: str, load: str, slo: dict[str, float | None], boot: Callable[[SearchBoot], BootOutcome],
               min_model_len: int = 0, key: Callable[[dict, dict], str] | None = None,
               log: Callable[[str], Any] = lambda s: None, outcome: SearchOutcome | None = None,
               config_failure_as: Literal["infeasible", "fail"] = "infeasible") -> SearchOutcome:
    """Boot the plan's default config, then the configs TPE suggests, until the budget is spent.

    Args:
        spec: the plan's ``search:``.
        base_args, base_env: the plan's base config (the default; the space's values replace its settings).
        seed: the TPE sampler's seed (the plan's ``seed``).
        workload, load: the objective's cell (resolved by the plan). slo: the plan's SLO bounds.
        boot: boots one config and returns its :class:`BootOutcome` (the sweep's trial runner, or a simulation).
        min_model_len: the plan's longest request (the walk-down keeps ``max-model-len`` at or above it).
        key: config key of (engine_args, env) (``plan.config_key`` bound to the model); default: a hash of both.
        log: one line per event.
        outcome: filled in as the search goes (default: a new one), so that the caller still has what the search
            knew when an interruption ends it.
        config_failure_as: how optuna is told a boot that failed for its config (:data:`CONFIG_FAILURES`):
            ``infeasible`` (the default: the worst value and a violated constraint) or ``fail``
            (``TrialState.FAIL``, as before issue 29; kept so benchmarks/search_failures.py can compare the two).

    Raises:
        Whatever ``boot`` raises. An interruption (an exception that is not an ``Exception``: KeyboardInterrupt,
        SystemExit, Prefect's TerminationSignal) first records the boot it ended as ``cancelled`` (counted in
        ``boots``) and sets ``stop_reason`` to ``interrupted`` in ``outcome``.
    """
    loop = _SearchLoop(spec, base_args=base_args, base_env=base_env, seed=seed, workload=workload, load=load,
                       slo=slo, boot=boot, min_model_len=min_model_len, key=key or _key, log=log,
                       outcome=outcome if outcome is not None else SearchOutcome(),
                       config_failure_as=config_failure_as)
    out = loop.out
    # The plan's default config first: the reference of the verdict and the first bar for pruning.
    loop.boot_one(dict(base_args), dict(base_env), "default", None, None, None, None)
    # Every config of the grid, to stop once each was booted (the default may be one of them).
    loop.grid = grid_keys(spec.space, base_args, base_env, loop.key) if out.grid_size is not None else None
    while True:
        stop = loop.stop_reason()
        if stop:
            out.stop_reason = stop
            break
        ot = loop.study.ask(loop.dists)
        args, env = config_of(ot.params, base_args, base_env)
        k = loop.key(args, env)
        if k in loop.seen:
            if not loop.tell_repeat(ot, k):
                out.stop_reason = "space_exhausted"
                break
            continue
        loop.repeats = 0
        rec = loop.boot_one(args, env, "search", ot.number, None, None, ot, ot.user_attrs.get("guide_reason"))
        rec.told = _tell(loop.study, ot, rec, loop.TrialState, loop.direction, config_failure_as)
        loop.walk_down_from(rec, env, ot.number)
    return out


def _label(role: str, number: int | None) -> str:
    """A boot's role and optuna trial number as the log writes them (``search #3``, ``default``)."""
    return f"{role}{'' if number is None else f' #{number}'}"


class _SearchLoop:
    """The state of one :func:`run_search` (its optuna study, the outcome so far, the configs booted by key, the
    best objective value) and its steps: boot one config, the stop rule, a repeated suggestion, the walk-down."""

    def __init__(self, spec: SearchSpec, *, base_args: dict[str, Scalar], base_env: dict[str, str], seed: int,
                 workload: str, load: str, slo: dict[str, float | None], boot: Callable[[SearchBoot], BootOutcome],
                 min_model_len: int, key: Callable[[dict, dict], str], log: Callable[[str], Any],
                 outcome: SearchOutcome, config_failure_as: str) -> None:
        import optuna
        from optuna.trial import TrialState

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.spec, self.base_args, self.base_env, self.workload, self.load, self.slo = (
            spec, base_args, base_env, workload, load, slo)
        self.boot, self.min_model_len, self.key, self.log = boot, min_model_len, key, log
        self.config_failure_as, self.TrialState = config_failure_as, TrialState
        self.obj, self.budget, self.direction = spec.objective, spec.budget, spec.objective.direction
        self.dists = distributions(spec.space)
        with warnings.catch_warnings():  # constraints_func is marked experimental in optuna 4
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=min(5, max(2, (self.budget.boots or 10) // 4)),
                constraints_func=lambda ft: [ft.user_attrs.get("violation", 0.0)])
        self.study = optuna.create_study(direction=self.direction, sampler=sampler)
        self.out = outcome
        self.out.grid_size, self.out.study = grid_size(spec.space), self.study
        self.seen: dict[str, SearchRecord] = {}
        self.best: float | None = None
        self.grid: set[str] | None = None
        self.repeats = 0
        self.rng = random.Random(seed)  # the draw after repeated suggestions (seeded: the search stays reproducible)

    def better(self, a: float, b: float | None) -> bool:
        """Whether objective value ``a`` beats ``b`` (None: no value yet) in the objective's direction."""
        return b is None or (a > b if self.direction == "maximize" else a < b)

    def budget_stop(self) -> str | None:
        """``budget_boots`` / ``budget_gpu_minutes`` when one more boot (of the mean GPU-minutes so far) would
        exceed the budget, else None."""
        budget, out = self.budget, self.out
        if budget.boots is not None and out.boots + 1 > budget.boots:
            return "budget_boots"
        if budget.gpu_minutes is not None and out.boots:
            per_boot = out.gpu_minutes / out.boots
            if out.gpu_minutes + per_boot > budget.gpu_minutes:
                return "budget_gpu_minutes"
        return None

    def stop_reason(self) -> str | None:
        """Why the search stops before its next suggestion (the budget, or ``space_exhausted`` once every config
        of the grid was booted), or None to go on."""
        stop = self.budget_stop()
        if stop:
            return stop
        if self.grid is not None and self.grid <= self.seen.keys():
            return "space_exhausted"
        if self.grid is None and self.out.grid_size is not None and len(
                {r.config_key for r in self.out.records if r.role != "walk_down"}) >= self.out.grid_size + 1:
            return "space_exhausted"
        return None

    def window_check(self, optuna_trial: Any) -> Callable[[pd.DataFrame], bool]:
        """The pruning check of one boot: called with its measurements after each window, it reports the mean
        objective value so far to optuna and returns True to stop measuring (:func:`prune_decision`)."""
        window_vals: list[float] = []

        def check(meas: pd.DataFrame) -> bool:
            rows = cell_rows(meas, self.workload, self.load)
            vals = pd.to_numeric(rows[self.obj.metric], errors="coerce").dropna().tolist() if not rows.empty else []
            if len(vals) > len(window_vals):
                window_vals[:] = vals
                if optuna_trial is not None:
                    optuna_trial.report(sum(vals) / len(vals), len(vals))
                return prune_decision(vals, self.best, self.spec.prune, self.direction)
            return False

        return check

    def run_boot(self, args: dict, env: dict, role: str, number: int | None, walked: str | None,
                 walked_from: str | None, optuna_trial: Any) -> BootOutcome:
        """Boot one config; an interruption records it ``cancelled`` (counted in boots), sets ``interrupted`` and
        is raised again."""
        try:
            return self.boot(SearchBoot(args, env, role, number, walked, self.window_check(optuna_trial)))
        except BaseException as e:
            if isinstance(e, Exception):
                raise
            out = self.out
            out.boots += 1  # started, and what it measured is in its (cancelled) bundle
            out.records.append(SearchRecord(role=role, number=number, engine_args=args, env=env,
                                            config_key=self.key(args, env), state="cancelled", walked=walked,
                                            walked_from=walked_from, boot=out.boots))
            out.stop_reason = "interrupted"
            self.log(f"search boot {out.boots} ({_label(role, number)}): cancelled "
                     f"({type(e).__name__}); the search stops here")
            raise

    def score(self, rec: SearchRecord, res: BootOutcome) -> None:
        """Set a boot's state, objective value and SLO violation from its outcome, and the best config when it is
        feasible and better."""
        obj = self.obj
        if res.failure_class == "pruned":
            ov = objective_value(res.measurements, obj.metric, self.workload, self.load, self.slo, obj.slo_percentile)
            rec.state, rec.value, rec.violation = "pruned", ov.value, ov.violation
        elif res.status == "ok" and res.usable:
            ov = objective_value(res.measurements, obj.metric, self.workload, self.load, self.slo, obj.slo_percentile)
            if ov.value is not None:
                rec.value, rec.violation = ov.value, ov.violation
                rec.state = "complete" if ov.feasible else "infeasible"
                if ov.feasible and self.better(ov.value, self.best):
                    self.best = ov.value
                    self.out.best_key = rec.config_key

    def log_boot(self, rec: SearchRecord, res: BootOutcome) -> None:
        """One log line of a recorded boot: its state, value, SLO excess, why it did not count, walk-down, why."""
        obj = self.obj
        # Why a boot did not count, in the log line: its failure class, else its status, else the quality gate.
        why = res.failure_class or (None if rec.state != "fail" else
                                    f"status {res.status}" if res.status != "ok" else
                                    "left out by the quality gate (verdict not pass/warn)" if not res.usable else
                                    f"no {obj.metric} at {self.workload} {self.load}")
        self.log(f"search boot {self.out.boots} ({_label(rec.role, rec.number)}): {rec.state}"
                 f"{'' if rec.value is None else f' {obj.metric}={rec.value:.4g}'}"
                 f"{'' if rec.violation is None or rec.violation <= 0 else f' (SLO exceeded by {rec.violation:.0%})'}"
                 f"{'' if not why else f' [{why}]'}{'' if not rec.walked else f' walk-down: {rec.walked}'}"
                 f"{'' if not rec.reason else f' (why: {rec.reason})'}")

    def guide(self, rec: SearchRecord, res: BootOutcome) -> None:
        """Enqueue the neighbour the boot's diagnosis points to (at most one)."""
        TrialState = self.TrialState
        if not self.spec.guide or rec.state not in ("complete", "infeasible") or not res.bottlenecks:
            return
        label = f"boot {rec.boot} ({_label(rec.role, rec.number)})"
        move = guided_move(self.spec.space, rec.engine_args, rec.env, res.bottlenecks,
                           len(cell_rows(res.measurements, self.workload, self.load)), label,
                           lambda a: self.key(a, rec.env) in self.seen)
        if move is None:
            return
        params, reason = move
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        self.study.enqueue_trial(params, user_attrs={"guide_reason": reason}, skip_if_exists=True)
        if len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))) > waiting:
            self.log(f"search: the next boot follows the {reason}")

    def boot_one(self, args: dict, env: dict, role: str, number: int | None, walked: str | None,
                 walked_from: str | None, optuna_trial: Any, reason: str | None = None) -> SearchRecord:
        """Boot one config under the pruning check, record, score and log it, and follow its diagnosis."""
        res = self.run_boot(args, env, role, number, walked, walked_from, optuna_trial)
        out = self.out
        out.boots += 1
        out.gpu_minutes += res.gpu_minutes
        rec = SearchRecord(role=role, number=number, engine_args=args, env=env, config_key=self.key(args, env),
                           state="fail", failure_class=res.failure_class, walked=walked, walked_from=walked_from,
                           gpu_minutes=res.gpu_minutes, trial_id=res.trial_id, reason=reason)
        self.score(rec, res)
        out.records.append(rec)
        rec.boot = out.boots
        self.seen[rec.config_key] = rec
        self.log_boot(rec, res)
        self.guide(rec, res)
        return rec

    def tell_repeat(self, ot: Any, k: str) -> bool:
        """A suggestion of a config already booted: tell optuna what it gave, at no boot (and say so: no
        suggestion is silent); after :data:`MAX_REPEATS` in a row, enqueue an unbooted config drawn at random.
        False when no unbooted config is left."""
        self.repeats += 1
        prev = self.seen[k]
        told = _tell(self.study, ot, prev, self.TrialState, self.direction, self.config_failure_as)
        self.log(f"search #{ot.number}: the config of search boot {prev.boot} ({_label(prev.role, prev.number)}) "
                 f"again; told its result ({told}), no boot")
        if self.repeats >= MAX_REPEATS:
            # The sampler keeps proposing booted configs (e.g. one that failed): that is not an exhausted
            # space while configs are left. Boot an unbooted one drawn at random instead.
            fresh = _unbooted(self.spec.space, self.dists, self.base_args, self.base_env, self.key, self.seen,
                              self.rng)
            if fresh is None:
                return False
            self.study.enqueue_trial(fresh, user_attrs={"guide_reason": f"{self.repeats} suggestions in a row "
                                                        "repeated booted configs: an unbooted config drawn at random"})
            self.log(f"search: {self.repeats} suggestions in a row repeated booted configs; the next boot is an "
                     "unbooted config drawn at random")
            self.repeats = 0
        return True

    def walk_down_from(self, rec: SearchRecord, env: dict, number: int | None) -> None:
        """A boot that failed for memory is information: walk its footprint down (:func:`walk_down`) until it
        boots, the steps or the budget run out, or the next config was booted already."""
        spec = self.spec
        cur, steps = rec, 0
        while (cur.state == "fail" and spec.walk_down.enabled and steps < spec.walk_down.max_steps
               and self.budget_stop() is None):
            nxt = walk_down(cur.engine_args, cur.failure_class, self.min_model_len)
            if nxt is None:
                break
            wargs, what = nxt
            if self.key(wargs, env) in self.seen:
                break
            steps += 1
            cur = self.boot_one(wargs, env, "walk_down", number, what, cur.config_key, None)
            # A walk-down boot is information about its own config: told when that config is a point of the space.
            params = space_params(spec.space, wargs, env)
            if params is not None:
                cur.told = _add(self.study, self.dists, params, cur, self.TrialState, self.direction,
                                self.config_failure_as)


def _unbooted(space: SearchSpace, dists: dict[str, Any], base_args: dict, base_env: dict,
              key: Callable[[dict, dict], str], seen: dict, rng: Any) -> dict[str, Any] | None:
    """Params of a config not booted yet, drawn at random (``rng``): from the listed grid when there is one (None
    when every config was booted), else up to 1000 random draws of the distributions (None when all were booted)."""
    grid = grid_params(space)
    if grid is not None:
        left = [p for p in grid if key(*config_of(p, base_args, base_env)) not in seen]
        return left[rng.randrange(len(left))] if left else None
    for _ in range(1000):
        p = _random_params(dists, rng)
        if key(*config_of(p, base_args, base_env)) not in seen:
            return p
    return None


def _told(rec: SearchRecord, direction: str, config_failure_as: str) -> tuple[str, float | None, float]:
    """What optuna is told of a boot: (kind, value, violation). ``complete``/``infeasible``: its value and SLO
    violation; a config failure (:data:`CONFIG_FAILURES`) told ``infeasible``: the worst value (-inf when
    maximising, +inf when minimising) and :data:`CONFIG_FAILURE_VIOLATION`; ``pruned``; ``fail`` otherwise."""
    if rec.state in ("complete", "infeasible") and rec.value is not None:
        return rec.state, rec.value, float(rec.violation or 0.0)
    if rec.state == "pruned":
        return "pruned", None, 0.0
    if rec.failure_class in CONFIG_FAILURES and config_failure_as == "infeasible":
        return "infeasible", (-math.inf if direction == "maximize" else math.inf), CONFIG_FAILURE_VIOLATION
    return "fail", None, 0.0


def _tell(study: Any, ot: Any, rec: SearchRecord, TrialState: Any, direction: str = "maximize",
          config_failure_as: str = "infeasible") -> str:
    """Tell optuna a boot's result (:func:`_told`) on the asked trial ``ot``; returns what it was told."""
    kind, value, violation = _told(rec, direction, config_failure_as)
    if value is not None:
        ot.set_user_attr("violation", violation)
        study.tell(ot, value)
    elif kind == "pruned":
        study.tell(ot, state=TrialState.PRUNED)
    else:
        study.tell(ot, state=TrialState.FAIL)
    return kind


def _add(study: Any, dists: dict[str, Any], params: dict[str, Any], rec: SearchRecord, TrialState: Any,
         direction: str, config_failure_as: str) -> str:
    """Tell optuna a boot it did not suggest (a walk-down) as a finished trial of ``params``; returns what it was
    told."""
    import optuna

    kind, value, violation = _told(rec, direction, config_failure_as)
    state = TrialState.COMPLETE if value is not None else TrialState.PRUNED if kind == "pruned" else TrialState.FAIL
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions={k: dists[k] for k in params}, value=value, state=state,
        user_attrs={"violation": violation, "walk_down": rec.walked or ""},
        # What TPE's after_trial stores for a told trial; add_trial skips after_trial, so set it here.
        system_attrs={"constraints": (violation,)} if value is not None else {}))
    return kind
