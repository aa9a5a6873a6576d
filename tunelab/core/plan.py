"""Experiment plans: the YAML a user writes, validated before anything starts, expanded into trials.

A plan names a model, a runtime (a vLLM installation made by ``tunelab runtime create``), a matrix of
``vllm serve`` engine args and of environment variables, the workloads to send, the load levels, the
warm-up, repeats and replicates (boots per config). ``Plan.trials()`` expands the matrices into
``Trial`` objects, each with a stable ``config_key``: the same configuration gives the same key on any
machine and in any key order, so the warehouse can follow one config across vLLM releases.

Matrix rule (engine_args and env): a YAML list is an axis to sweep; a scalar is fixed for every trial.
For engine args, ``true`` passes the bare flag (``--enforce-eager``), ``false`` omits it, ``null`` omits
it, anything else is passed as ``--flag value``.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from tunelab.core.load_profiles import (ConcurrencyProfile, LoadProfile, RateProfile, TraceProfile, WindowSpec,
                                   profiles_from_levels)
from tunelab.core.quality_thresholds import QualityThresholds
from tunelab.core.search.config_tpe import SearchSpec
from tunelab.core.search.sla import SlaSearchSpec
from tunelab.core.trial_order import boot_order
from tunelab.core.workloads import WORKLOAD_TYPES, WorkloadType

__all__ = [
    "MAX_WINDOW_PROMPT_TOKENS",
    "MAX_WINDOW_REQUESTS",
    "PlanError",
    "Workload",
    "Variant",
    "SLO",
    "CpuAffinity",
    "parse_cpus",
    "format_cpus",
    "ABBudget",
    "ABPlan",
    "PrecisionSpec",
    "MAX_AUTO_PAIRS",
    "Plan",
    "Trial",
    "load_plan",
    "requests_for_level",
    "config_key",
    "RESERVED_FLAGS",
    "unknown_env_warnings",
    "unknown_engine_args",
    "bad_engine_arg_values",
    "runtime_checks",
]

# Flags tunelab sets itself for every boot: a plan that sets them would break isolation between trials.
RESERVED_FLAGS = {"host", "port", "api-key", "model", "model-tag", "served-model-name"}
_FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Scalar = str | int | float | bool | None

#: Most measured requests in one window (``num_requests``, raised by ``requests_per_concurrency`` x c). A window's
#: prompts are built before it starts and held while it runs (``tunelab.core.plan_cost`` says why), so this bounds memory.
MAX_WINDOW_REQUESTS = 100_000
#: Most prompt tokens of one window (requests x ``prompt_tokens``): about 5 bytes of text per token, so about
#: 0.25 GB of prompt text held while the window runs.
MAX_WINDOW_PROMPT_TOKENS = 50_000_000


class PlanError(ValueError):
    """A plan that cannot run. The message names the file, the field path and what is allowed."""


def _norm_flag(name: str) -> str:
    """``--max_num_seqs`` / ``max_num_seqs`` / ``max-num-seqs`` -> ``max-num-seqs``."""
    return name.strip().lstrip("-").replace("_", "-").lower()


def _check_engine_args(v: dict) -> dict:
    """Normalise flag names and reject what is not a ``vllm serve`` flag a plan may set (shared by the plan's
    matrix and its variants)."""
    out = {}
    for raw, val in v.items():
        flag = _norm_flag(raw)
        if not _FLAG_RE.match(flag):
            raise ValueError(f"engine arg {raw!r} is not a vllm serve flag name (use e.g. 'enforce-eager')")
        if flag in RESERVED_FLAGS:
            raise ValueError(
                f"engine arg {raw!r} is set by tunelab for every boot (one of {sorted(RESERVED_FLAGS)}); remove it"
            )
        if isinstance(val, list) and not val:
            raise ValueError(f"engine arg {raw!r} has an empty list: give at least one value")
        out[flag] = val
    return out


def _check_env(v: dict) -> dict:
    """Reject invalid environment variable names and empty matrix axes."""
    for k, val in v.items():
        if not _ENV_RE.match(k):
            raise ValueError(f"env var name {k!r} is not a valid environment variable name")
        if isinstance(val, list) and not val:
            raise ValueError(f"env var {k!r} has an empty list: give at least one value")
    return v


class Workload(BaseModel):
    """One request pattern: the common fields below and a workload type (``tunelab.core.workloads``, told apart by
    ``type``; default ``fixed``: exact ``prompt_tokens``, fixed ``output_tokens``, as before the types). The
    YAML stays flat: every key that is not a common field (``type``, ``prompt_tokens``, ``output_tokens``,
    ``path``, ...) goes to the type (``profile``), e.g. ``{name: mix, type: distribution, prompt_tokens: {dist:
    lognormal, median: 200, sigma: 0.8}, output_tokens: 64, num_requests: 16}``. docs/workloads.md lists the
    types."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Identifier used in the warehouse, e.g. 'short_chat' or 'long_summary'.")
    num_requests: int = Field(strict=True, gt=0, description="Measured requests per load level and repeat.")
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="OpenAI-compatible endpoint: /v1/completions or /v1/chat/completions."
    )
    ignore_eos: bool = Field(True, description="Fixed output lengths so tokens/s compare across configs.")
    adapter: str | None = Field(
        None, description="A LoRA adapter the requests target: its NAME in the engine args' lora-modules "
                          "(NAME=PATH, with enable-lora); sent as the request's model. None: the base model.")
    shared_prefix_tokens: int = Field(
        0, ge=0, strict=True, description="Tokens of a prefix shared by every prompt (prefix-cache workloads); 0 = none."
    )
    profile: WorkloadType = Field(description="The workload type and its parameters (tunelab.core.workloads); in YAML "
                                              "its keys sit next to the common fields.")

    @model_validator(mode="before")
    @classmethod
    def _flat_type_fields(cls, data: Any) -> Any:
        # The YAML keeps today's flat shape: the keys that are not common fields are the type's parameters.
        if isinstance(data, dict) and "profile" not in data:
            data = dict(data)
            spec = {k: data.pop(k) for k in list(data) if k not in cls.model_fields}
            spec.setdefault("type", "fixed")
            data["profile"] = spec
        return data

    @property
    def type(self) -> str:
        """The workload type (``fixed``, ``distribution``, ``dataset``, ``trace``)."""
        return self.profile.type

    @property
    def prompt_tokens(self) -> int:
        """The longest prompt of the workload, tokens (fixed: every prompt's length)."""
        return self.profile.nominal_prompt_tokens

    @property
    def output_tokens(self) -> int:
        """The longest output of the workload, tokens (fixed: every request's ``max_tokens``)."""
        return self.profile.nominal_output_tokens

    def record(self, kv_block_tokens: int | None = None) -> dict[str, Any]:
        """``{name, type, parameters, file_sha256, endpoint, shared_prefix_tokens}`` of the workload (and
        ``adapter`` when it targets a LoRA adapter), as stored in ``trials.workloads``. With a shared prefix and
        the server's KV-cache block size ``kv_block_tokens`` (:func:`kv_block_tokens`), also ``kv_block_tokens``,
        ``shared_prefix_blocks`` (full blocks the prefix fills: what prefix caching can reuse) and, when it fills
        none, ``warnings`` (:func:`prefix_block_warning`)."""
        rec = {"name": self.name, **self.profile.record(), "endpoint": self.endpoint,
               "shared_prefix_tokens": self.shared_prefix_tokens}
        if self.shared_prefix_tokens and kv_block_tokens:
            rec["kv_block_tokens"] = int(kv_block_tokens)
            rec["shared_prefix_blocks"] = self.shared_prefix_tokens // int(kv_block_tokens)
            note = prefix_block_warning(self, int(kv_block_tokens))
            if note:
                rec["warnings"] = [note]
        if self.adapter is not None:
            rec["adapter"] = self.adapter
        return rec

    def dataset_filter_record(self) -> dict[str, Any] | None:
        """``{name, path, file_sha256, rule, records, used, skipped}`` of a dataset workload (``trials.dataset_filters``,
        ``tunelab.core.workloads.DatasetWorkload.filter_record``); None for another type."""
        fr = getattr(self.profile, "filter_record", None)
        return None if fr is None else {"name": self.name, **fr()}

    def dataset_note(self) -> str | None:
        """A line saying what a dataset workload skipped of its file (plan check, the sweep's log), or None."""
        if self.type != "dataset":
            return None
        read = self.profile.loaded()  # type: ignore[attr-defined]
        if not read.skipped:
            return None
        return (f"workloads {self.name!r}: {read.summary()} of {self.profile.path}: records with no "  # type: ignore[attr-defined]
                "(prompt, answer) pair are skipped, as vllm bench serve does (skip_unusable: false makes them errors)")

    @model_validator(mode="after")
    def _sessions_need_chat(self) -> "Workload":
        if getattr(self.profile, "has_sessions", False) and self.endpoint != "chat":
            raise ValueError(f"workload {self.name!r}: type {self.type} sends conversations, which only "
                             "/v1/chat/completions takes; set endpoint: chat")
        return self

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v):
            raise ValueError("use letters, digits, '_', '.', '-' only")
        return v

    @field_validator("num_requests")
    @classmethod
    def _num_requests_fits(cls, v: int) -> int:
        if v > MAX_WINDOW_REQUESTS:
            raise ValueError(f"{v:,} measured requests in one window is more than the limit of {MAX_WINDOW_REQUESTS:,} "
                             "(a window's prompts are built before it starts and held in memory while it runs); "
                             "use fewer requests and more repeats")
        return v

    @model_validator(mode="after")
    def _prefix_fits(self) -> "Workload":
        if self.shared_prefix_tokens and self.profile.exact_prompt_tokens is None:
            raise ValueError(f"shared_prefix_tokens needs a workload of type fixed (every prompt one length), got "
                             f"type {self.type}; set shared_prefix_tokens: 0 or use type: fixed")
        if self.shared_prefix_tokens >= self.prompt_tokens:
            raise ValueError("shared_prefix_tokens must be smaller than prompt_tokens")
        return self


def requests_for_level(plan: "Plan", workload: Workload, profile: LoadProfile) -> int:
    """Measured requests per window of ``workload`` at ``profile``: the profile's rule
    (``LoadProfile.measured_requests``) over the workload's ``num_requests`` and the plan's
    ``requests_per_concurrency``."""
    return profile.measured_requests(workload.num_requests, plan.requests_per_concurrency)


#: vLLM's KV-cache block size (tokens) when ``block-size`` is not set, by runtime device: the CPU backend sets 128
#: (vllm/platforms/cpu.py, ``check_and_update_config``: ``cache_config.block_size = 128`` when unset; the CPU
#: runtime's boot log shows it), CUDA's ``CacheConfig`` default is 16 (vllm/config/cache.py).
DEFAULT_KV_BLOCK_TOKENS: dict[str, int] = {"cpu": 128, "cuda": 16}


def kv_block_tokens(engine_args: dict[str, Any], device: str) -> int:
    """The KV-cache block size of a server, tokens: the config's ``block-size``, else the device's default
    (:data:`DEFAULT_KV_BLOCK_TOKENS`; 16 for a device not listed)."""
    b = engine_args.get("block-size")
    if isinstance(b, int) and not isinstance(b, bool) and b > 0:
        return b
    return DEFAULT_KV_BLOCK_TOKENS.get(device, 16)


def prefix_block_warning(workload: "Workload", block_tokens: int) -> str | None:
    """A line when ``workload``'s shared prefix is shorter than one KV-cache block of ``block_tokens``: vLLM's
    prefix cache reuses whole blocks only (a block is hashed once full), so such a prefix gives 0 cache hits and
    the workload measures no prefix caching. None otherwise."""
    n = workload.shared_prefix_tokens
    if 0 < n < block_tokens:
        return (f"workloads {workload.name!r}: shared_prefix_tokens {n} is shorter than the server's KV-cache block "
                f"of {block_tokens} tokens; the prefix cache reuses whole blocks only, so it will show 0 prefix-cache "
                f"hits; use shared_prefix_tokens >= {block_tokens} (a multiple of it) or a smaller block-size")
    return None


def prefix_block_warnings(plan: "Plan", runtimes: dict) -> list[str]:
    """:func:`prefix_block_warning` for every workload and distinct block size of the plan's trials (the config's
    ``block-size`` or the runtime device's default); one line per (workload, block size), naming the configs."""
    hits: dict[tuple[str, int], list[str]] = {}
    for t in plan.trials():
        rt = runtimes.get(t.runtime)
        b = kv_block_tokens(t.engine_args, getattr(rt, "device", "cuda") if rt is not None else "cuda")
        for w in plan.workloads:
            if prefix_block_warning(w, b):
                labels = hits.setdefault((w.name, b), [])
                if t.label not in labels:
                    labels.append(t.label)
    by_name = {w.name: w for w in plan.workloads}
    return [f"{prefix_block_warning(by_name[name], b)} (config(s) {', '.join(repr(x) for x in labels)})"
            for (name, b), labels in hits.items()]


#: config.json keys that give a model's positions, in the order vLLM reads them (vllm/config/model.py,
#: ``_get_and_verify_max_len``: the smallest of those present).
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                  "max_sequence_length", "max_seq_length", "seq_len")


def model_positions(model_dir: str | Path) -> tuple[int, str] | None:
    """The longest sequence a model takes, tokens, and where it comes from, read from ``config.json`` as vLLM
    derives it (``_get_and_verify_max_len``): the smallest of :data:`_POSITION_KEYS` present (in ``text_config``
    for a multimodal config), times ``rope_scaling.factor`` when RoPE scaling is set (a ``yarn`` scaling scales
    ``original_max_position_embeddings``; ``su``, ``longrope`` and ``llama3`` scalings are already in the
    positions). None when there is no readable config.json or no such key.
    """
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    found = [(cfg[k], k) for k in _POSITION_KEYS if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)
             and cfg[k] > 0]
    if not found:
        return None
    n, key = min(found)
    where = f"config.json {key}: {n}"
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict):
        kind = rs.get("rope_type", rs.get("type"))
        factor = rs.get("factor")
        if kind not in ("su", "longrope", "llama3") and isinstance(factor, (int, float)) and factor > 1:
            if kind == "yarn" and isinstance(rs.get("original_max_position_embeddings"), int):
                n = rs["original_max_position_embeddings"]
                where = f"config.json rope_scaling original_max_position_embeddings: {n}"
            n = int(n * factor)
            where += f" x rope_scaling {kind} factor {factor:g}"
    return n, where


def model_context_errors(plan: "Plan") -> list[str]:
    """Every ``max-model-len`` the plan sets (base, matrix values, variants, search space) that is above the
    model's positions (:func:`model_positions` of ``plan.model``): vLLM refuses it at boot (``User-specified
    max_model_len ... is greater than the derived max_model_len``) after the whole start-up, so the config would
    be ``invalid_config`` on every boot. Not judged when the model has no readable config.json, or when the plan
    sets ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` (vLLM's own override). One line per value, naming the field, the
    model's limit and its source, and the fix."""
    envs = [plan.env, *(v.env for v in plan.variants)]
    if any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in e for e in envs):
        return []
    limit = model_positions(plan.model)
    if limit is None:
        return []
    n, where = limit
    out = []
    for field, flag, value, _rts in _engine_arg_values(plan):
        if flag == "max-model-len" and isinstance(value, int) and not isinstance(value, bool) and value > n:
            out.append(f"{field}: {value} is above the model's {n} positions ({where}, {plan.model}); vLLM "
                       f"refuses it at boot; set max-model-len <= {n} (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in env "
                       "if the model really handles longer sequences)")
    return out


class SLO(BaseModel):
    """Service-level objectives for goodput (as ``vllm bench serve --goodput``): a request counts as good
    when every given bound holds. Seconds."""

    model_config = ConfigDict(extra="forbid")
    ttft_s: float | None = Field(None, gt=0, description="Upper bound on TTFT, seconds.")
    tpot_s: float | None = Field(None, gt=0, description="Upper bound on TPOT, seconds.")
    e2el_s: float | None = Field(None, gt=0, description="Upper bound on end-to-end latency, seconds.")


class Variant(BaseModel):
    """One named deviation from the plan's base engine args/env (instead of a full matrix): e.g. the
    seeds' one-change-at-a-time diagnostics. Values here are scalars (no matrix axes)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="Label shown in reports; default: the changed settings.")
    engine_args: dict[str, Scalar] = Field(default_factory=dict, description="vllm serve flags to add or override.")
    env: dict[str, Scalar] = Field(default_factory=dict, description="Environment variables to add or override.")
    runtimes: list[str] | None = Field(None, description="Only on these runtimes (default: all of the plan's).")

    _flags = field_validator("engine_args")(classmethod(lambda cls, v: _check_engine_args(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))


class Anchor(BaseModel):
    """The plan's fixed reference (``anchor:``): one runtime and one config that never change between sweeps
    (e.g. a pinned vLLM release with its default engine args). Every boot round of the sweep boots it once,
    between the candidates (``interleave``), so a comparison of configs or releases measured in different sweeps
    can go through it (``tunelab.stats.anchored``, docs/statistics.md "Anchored comparisons"). Values are scalars:
    an anchor is one config, not a matrix. When it launches the same server as one of the plan's configs on its
    runtime, that config is the anchor (no extra boot)."""

    model_config = ConfigDict(extra="forbid")
    runtime: str = Field(description="Runtime of the anchor; one of the plan's runtimes.")
    name: str = Field("anchor", description="Label of the anchor's boots in reports.")
    engine_args: dict[str, Scalar] = Field(default_factory=dict, description="vllm serve flags of the anchor.")
    env: dict[str, Scalar] = Field(default_factory=dict, description="Environment variables of the anchor.")

    _flags = field_validator("engine_args")(classmethod(lambda cls, v: _check_engine_args(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))


#: At most this many A/B pairs when a ``replicates: auto`` budget gives GPU-minutes only (a bound for the plan's
#: trial list; the GPU-minutes stop the sweep long before on any real server).
MAX_AUTO_PAIRS = 20


def parse_cpus(text: str | list[int], field: str = "cpu_affinity") -> tuple[int, ...]:
    """CPU numbers of a CPU list: ``"0-3,8"`` -> ``(0, 1, 2, 3, 8)`` (sorted, unique); a list of ints is taken as
    it is.

    Raises:
        ValueError: empty, malformed or negative (the message names ``field`` and gives an example).
    """
    if isinstance(text, list):
        if not text or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in text):
            raise ValueError(f"{field}: a CPU list is non-negative CPU numbers, got {text!r}; e.g. '0-3' or [0, 1]")
        return tuple(sorted(set(text)))
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ValueError(f"{field}: {text!r} is not a CPU list; write it as taskset -c does, e.g. '0-3,8'")
        lo = int(m.group(1))
        out.update(range(lo, int(m.group(2) or lo) + 1))
    return tuple(sorted(out))


def format_cpus(cpus: tuple[int, ...] | list[int] | set[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``."""
    s = sorted(set(cpus))
    parts, i = [], 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


class CpuAffinity(BaseModel):
    """Where the server and the load run (``cpu_affinity:`` in a plan): CPU lists as ``taskset -c`` writes them
    (``"0-7"``, ``"0-3,8"``) or lists of CPU numbers. ``server``: every process and thread of ``vllm serve``
    (API server, engine core, workers; ``tasks.host_load.pin_tree``); ``load``: the measurement's event loop and
    its load processes. Disjoint, so neither competes with the other for a core. Either may be left out (not
    pinned). Checked against the CPUs tunelab may use when the trial starts."""

    model_config = ConfigDict(extra="forbid")
    server: str | list[int] | None = Field(None, description="CPUs of the server's processes, e.g. '0-7'.")
    load: str | list[int] | None = Field(None, description="CPUs of the load generator, e.g. '8-11'.")

    @model_validator(mode="after")
    def _cpus_ok(self) -> "CpuAffinity":
        s, ld = self.server_cpus(), self.load_cpus()
        if s and ld and set(s) & set(ld):
            raise ValueError(f"cpu_affinity: server and load share CPUs {format_cpus(set(s) & set(ld))}; give them "
                             "cores of their own, e.g. server: '0-7', load: '8-11'")
        return self

    def server_cpus(self) -> tuple[int, ...] | None:
        """The server's CPUs, or None (not pinned)."""
        return None if self.server is None else parse_cpus(self.server, "cpu_affinity.server")

    def load_cpus(self) -> tuple[int, ...] | None:
        """The load generator's CPUs, or None (not pinned)."""
        return None if self.load is None else parse_cpus(self.load, "cpu_affinity.load")


class ABBudget(BaseModel):
    """What a ``replicates: auto`` A/B may spend before it stops undecided: boots (both sides together) and/or
    GPU-minutes (device-minutes of trial wall time, boot to teardown; on a CPU runtime its one device)."""

    model_config = ConfigDict(extra="forbid")
    boots: int | None = Field(None, strict=True, ge=4, description="Most boots, A and B together (>= 4: two pairs).")
    gpu_minutes: float | None = Field(None, gt=0, allow_inf_nan=False,
                                      description="Most device-minutes of trial wall time, A and B together.")

    @model_validator(mode="after")
    def _some(self) -> "ABBudget":
        if self.boots is None and self.gpu_minutes is None:
            raise ValueError("give boots and/or gpu_minutes, e.g. budget: {boots: 12, gpu_minutes: 15}")
        return self


class PrecisionSpec(BaseModel):
    """A precision instead of counts (``precision:`` in a plan; issue 14 item 3): tunelab reads each config's
    noise model from the warehouse (``warehouse.noise_history``) and chooses windows per boot (``repeats``) and boots per
    config (``replicates``) for the least GPU time (``stats.design.optimal_design``); a config with no history
    starts with a pilot (``stats.design.pilot_design``). ``tunelab.reports.design_plan`` does it; ``plan check`` and the
    sweep's opening lines print the design chosen."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field("output_tokens_per_s", description="The measurements column whose A/B interval must "
                                                            "reach the half-width, e.g. output_tokens_per_s, tpot_p50_s.")
    half_width: float = Field(gt=0, lt=1, allow_inf_nan=False,
                              description="Target half-width of the 95 % interval of candidate/baseline - 1 "
                                          "(relative: 0.03 = +-3 %).")
    loads: list[str] | None = Field(None, description="Load levels that must reach it, by label (c=32, '2 req/s'); "
                                                      "default: every level of the plan.")
    workloads: list[str] | None = Field(None, description="Workloads that must reach it; default: all of the plan's.")
    max_boots: int = Field(40, strict=True, ge=2, le=200, description="Most boots per config the design may ask for.")
    max_windows: int = Field(20, strict=True, ge=1, le=200, description="Most windows (repeats) per boot.")

    _metric_ok = field_validator("metric")(classmethod(lambda cls, v: _check_metric(v, "metric")))


def _check_metric(m: str, field: str) -> str:
    """A throughput (``*_per_s``) or latency column of measurements, else ValueError naming ``field``."""
    from tunelab.core import records as R

    allowed = [c for c in R.columns(R.WindowAggregate) if c.endswith("_per_s") or c in R.LATENCY_COLUMNS]
    if m not in allowed:
        close = difflib.get_close_matches(m, allowed, n=1)
        raise ValueError(f"{field}: {m!r} is not a throughput (*_per_s) or latency column of measurements"
                         f"{f'; did you mean {close[0]!r}?' if close else ''} (allowed: {', '.join(allowed)})")
    return m


class PrimarySpec(BaseModel):
    """The headline verdicts of the plan's A/B report (``primary:``; ``tunelab.stats.family``): these metrics at
    these workloads and load levels form the family whose error rate Holm's method controls; the other rows are
    labelled secondary (adjusted among themselves). Absent: every row of the report is a headline verdict."""

    model_config = ConfigDict(extra="forbid")
    metrics: list[str] = Field(min_length=1, description="Measurements columns of the headline verdicts, e.g. "
                                                         "[output_tokens_per_s]; these are also compared.")
    workloads: list[str] | None = Field(None, description="Workloads of the headline verdicts; default: all.")
    loads: list[str] | None = Field(None, description="Load levels of the headline verdicts, by label (c=32); "
                                                      "default: all.")

    @field_validator("metrics")
    @classmethod
    def _metrics_ok(cls, v: list[str]) -> list[str]:
        return [_check_metric(m, f"primary.metrics[{i}]") for i, m in enumerate(v)]


class ABPlan(BaseModel):
    """The A/B that decides a ``replicates: auto`` sweep (``ab:`` in a plan): the plan's two configs (its matrix,
    variants or runtimes must give exactly two trials per boot round), the cells that decide (metrics x load
    levels x workloads), the equivalence margin, the error rate and the budget. The sweep interleaves A and B
    boots, after each pair calls ``tunelab.stats.sequential.sequential_ab`` per cell (at ``alpha / cells``,
    Bonferroni, so the error rate holds over all cells and looks) and stops when every cell is decided or the
    budget is spent (``flows.ab_auto``)."""

    model_config = ConfigDict(extra="forbid")
    baseline: str | None = Field(None, description="Which of the two configs is A (the baseline): its label, "
                                                   "variant name or runtime; default: the first.")
    metrics: list[str] = Field(min_length=1, description="measurements columns that decide, e.g. "
                                                         "[output_tokens_per_s, tpot_p50_s].")
    loads: list[str] | None = Field(None, description="Load levels that decide, by label (c=32, '2 req/s'); "
                                                      "default: every level of the plan.")
    workloads: list[str] | None = Field(None, description="Workloads that decide; default: all of the plan's.")
    margin: float | None = Field(None, gt=0, lt=1, description="Equivalence margin, relative (0.03 = +-3 %); "
                                                               "None: no 'equivalent' call, only a difference.")
    alpha: float = Field(0.05, gt=0, le=0.5, description="Error rate over all looks and cells together.")
    budget: ABBudget
    order: Literal["abba", "abab"] = Field(
        "abba", description="Boot order of the pairs: A,B,B,A,A,B,... (abba: a linear drift cancels over two "
                            "pairs) or A,B,A,B,...")
    min_pairs: int = Field(2, strict=True, ge=2, description="Pairs before the first look (a paired SD needs 2).")

    @field_validator("metrics")
    @classmethod
    def _metrics_ok(cls, v: list[str]) -> list[str]:
        from tunelab.core import records as R

        allowed = [c for c in R.columns(R.WindowAggregate) if c.endswith("_per_s") or c in R.LATENCY_COLUMNS]
        for i, m in enumerate(v):
            if m not in allowed:
                close = difflib.get_close_matches(m, allowed, n=1)
                raise ValueError(f"metrics[{i}]: {m!r} is not a throughput (*_per_s) or latency column of "
                                 f"measurements{f'; did you mean {close[0]!r}?' if close else ''} (allowed: "
                                 f"{', '.join(allowed)})")
        return v

    def higher_is_better(self, metric: str) -> bool:
        """True for a throughput (``*_per_s``), False for a latency (``*_s``)."""
        return metric.endswith("_per_s")


class Plan(BaseModel):
    """A validated experiment plan. Construct with :func:`load_plan` to get file-aware error messages."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Plan name; part of the sweep id and of folder names: letters, digits, '_', '.', '-'.")
    model: str = Field(description="Path to a local model directory (relative paths are relative to the plan file's folder, then the current directory).")
    runtime: str = Field("cpu", description="Runtime name made by `tunelab runtime create`; to compare several, use `runtimes:`.")
    runtimes: list[str] | None = Field(None, description="Several runtimes (vLLM versions) to run every config on.")
    engine_args: dict[str, Scalar | list[Scalar]] = Field(
        default_factory=dict, description="vllm serve flags; a list is a matrix axis, a scalar is fixed."
    )
    env: dict[str, Scalar | list[Scalar]] = Field(
        default_factory=dict, description="Environment variables; a list is a matrix axis, a scalar is fixed."
    )
    allow_unknown_env: list[str] = Field(
        default_factory=list,
        description="VLLM_* environment variable names the plan sets on purpose although a runtime's vLLM does not "
                    "know them (e.g. read by a plugin, or new in a later release): such a name is a warning, not a "
                    "plan error. Any other VLLM_* name that no runtime of the plan knows is refused as a typo.")
    variants: list[Variant] = Field(
        default_factory=list,
        description="Named deviations from the base config, each one trial config (x the matrix axes, if any).",
    )
    workloads: list[Workload] = Field(min_length=1)
    concurrency: list[StrictInt] = Field(default_factory=lambda: [1], description="Concurrency levels (max in-flight requests).")
    requests_per_concurrency: int = Field(
        0, ge=0, strict=True,
        description="At a concurrency level c, send max(workload.num_requests, requests_per_concurrency x c) "
                    "measured requests, so high levels are really reached and low levels stay short; 0 = off.",
    )
    request_rates: list[float] = Field(default_factory=list, description="Request rates (req/s) with random arrivals; empty = none.")
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=False, description="Gamma shape of inter-arrival gaps; 1.0 = Poisson (as vllm bench serve).")
    trace_speedups: list[float] = Field(default_factory=list, description="Trace replay levels: each replays the "
                                        "trace workloads' arrival times divided by it (1.0 = as recorded); empty = none.")
    warmup_requests: int = Field(4, strict=True, ge=0, description="Warm-up requests per load level before its measured windows, excluded from numbers; a minimum: a concurrency level warms up with at least its concurrency, a rate level with at least one second of its arrivals (LoadProfile.warmup_requests in tunelab.core.load_profiles); 0 turns warm-up off.")
    repeats: int = Field(2, strict=True, ge=1, description="Measured repeats per load level on one server.")
    closed_loop_start: Literal["staggered", "together"] = Field(
        "staggered", description="How a concurrency level's slots start a window: 'staggered' (default) spreads the "
                                 "c slots' first requests over one request's duration as the warm-up measured it (c / "
                                 "the warm-up's requests per second; at most half a duration window; a count window only "
                                 "from 4 waves of c requests), so equal-length "
                                 "requests do not run in lockstep waves that a short window catches in one phase; "
                                 "'together' sends the first c at once (waves on purpose; what every window "
                                 "did before this field). Either way the ramp-up is outside the window's figures.")
    window: WindowSpec | None = Field(
        None, description="How long a measured window runs: absent = the workload's num_requests requests (the "
                          "default); {duration_s: 10} = sending for 10 s. Either way its figures count only the "
                          "steady part (tunelab.tasks.metrics.steady_interval).")
    replicates: Annotated[int, Field(strict=True, ge=1)] | Literal["auto"] = Field(
        1, description="Boots per config (the unit of noise for A/B verdicts), or 'auto': boot A and B in "
                       "interleaved pairs until the A/B declared in `ab` is decided or its budget is spent.")
    ab: ABPlan | None = Field(None, description="The A/B of a `replicates: auto` plan (see ABPlan).")
    precision: PrecisionSpec | None = Field(
        None, description="A precision instead of counts: tunelab chooses replicates and repeats from the "
                          "warehouse's noise model (see PrecisionSpec); excludes explicit replicates / repeats.")
    primary: PrimarySpec | None = Field(
        None, description="The headline verdicts of the sweep's A/B (metrics, workloads, load levels; see "
                          "PrimarySpec); the rest of the A/B rows are labelled secondary.")
    interleave: Literal["balanced", "round_robin", "shuffle"] = Field(
        "balanced", description="Order of boots (tunelab.core.trial_order): balanced = ABBA, rounds alternately in plan "
                                "order and reversed (A B | B A: a linear drift cancels); round_robin = A B A B; "
                                "shuffle = a seeded permutation per round (randomised blocks)."
    )
    anchor: Anchor | None = Field(
        None, description="A fixed reference booted once per round between the candidates, so that sweeps can be "
                          "compared through it (see Anchor), e.g. {runtime: gpu-0.25.1, engine_args: {}}.")
    seed: int = Field(0, strict=True, description="Seed for prompts, arrivals and shuffles.")
    boot_timeout_s: float = Field(600.0, gt=0, allow_inf_nan=False, description="Give up on a boot after this many seconds.")
    request_timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False, description="Per-request timeout, seconds.")
    load_processes: int = Field(
        1, ge=1, le=64, strict=True,
        description="Load-generator processes per window (each its own event loop and share of the load); a "
                    "concurrency window uses at most one per in-flight request, so concurrency 1 always runs in one. "
                    "Raise it when a window's notes say the client was busy and fell behind or was client-bound.",
    )
    cpu_affinity: CpuAffinity | None = Field(
        None, description="Pin the server's processes and the load generator to CPUs of their own (less host noise; "
                          "see CpuAffinity); absent: the kernel places them.")
    eager_diagnosis: bool = Field(False, description="Re-boot a config that failed to boot with only --enforce-eager added "
                                  "and say what that shows (graphs, or memory/configuration). Off by default: it "
                                  "costs up to one more boot timeout per failed config (docs/warehouse.md).")
    slo: SLO = Field(default_factory=SLO)
    quality: QualityThresholds = Field(default_factory=QualityThresholds)
    search: SearchSpec | None = Field(
        None, description="Search over engine args and env with boots as the cost (tunelab.core.search.config_tpe, flows.record_search, "
                          "docs/tuning.md): space, objective under the plan's slo, budget.")
    price_per_gpu_hour: Annotated[float, Field(gt=0)] | None = Field(
        None, description="What one GPU-hour costs you (any currency, e.g. 3.5): the tuning report then gives the "
                          "cost per million output tokens beside each frontier point (reports.tuning); "
                          "`tunelab tuning-report --price-per-gpu-hour` overrides it.")
    sla_search: SlaSearchSpec | None = Field(
        None, description="On each booted server, after the plan's windows: search the highest load (concurrency "
                          "or rate) at which the plan's slo holds (tunelab.core.search.sla, docs/sla_search.md), e.g. "
                          "{load: concurrency, start: 1, max: 256, resolution: 0.1}.")

    @field_validator("runtime", mode="before")
    @classmethod
    def _runtime_scalar(cls, v):
        if isinstance(v, list):
            raise ValueError("one runtime name here; to run on several runtimes use `runtimes: [a, b]`")
        return v

    @field_validator("name")
    @classmethod
    def _plan_name_ok(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", v):
            raise ValueError("use letters, digits, '_', '.', '-' (it becomes part of folder names), e.g. 'nightly-h200'")
        return v

    _flags_ok = field_validator("engine_args")(classmethod(lambda cls, v: _check_engine_args(v)))
    _env_ok = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))

    @field_validator("search")
    @classmethod
    def _search_names_ok(cls, v: SearchSpec | None) -> SearchSpec | None:
        # The space's names are checked (and flag names normalised) as the plan's own engine_args / env.
        if v is None:
            return v
        try:
            args = _check_engine_args(v.space.engine_args)
            _check_env(v.space.env)
        except ValueError as e:
            raise ValueError(f"space: {e}") from None
        return v.model_copy(update={"space": v.space.model_copy(update={"engine_args": args})})

    # The level lists are checked by their profiles (tunelab.core.load_profiles): range, finiteness, distinct levels.
    @field_validator("concurrency")
    @classmethod
    def _conc_ok(cls, v: list[int]) -> list[int]:
        profiles_from_levels(ConcurrencyProfile, v)
        return v

    @field_validator("request_rates")
    @classmethod
    def _rates_ok(cls, v: list[float]) -> list[float]:
        profiles_from_levels(RateProfile, v)
        return v

    @field_validator("trace_speedups")
    @classmethod
    def _speedups_ok(cls, v: list[float]) -> list[float]:
        profiles_from_levels(TraceProfile, v)
        return v

    @model_validator(mode="after")
    def _has_load(self) -> "Plan":
        if not self.concurrency and not self.request_rates and not self.trace_speedups:
            raise ValueError("give at least one load level: concurrency, request_rates or trace_speedups")
        self._check_trace()
        for args, _env in self.configs():
            mml = args.get("max-model-len")
            if isinstance(mml, int) and not isinstance(mml, bool):
                for i, w in enumerate(self.workloads):
                    # A dataset's requests are clipped to the context one by one when sent (tunelab.core.workloads
                    # DATASET_RULE): its longest record does not make every request fail.
                    if w.type != "dataset" and w.prompt_tokens + w.output_tokens > mml:
                        raise ValueError(
                            f"workloads[{i}] ({w.name}): prompt_tokens + output_tokens = "
                            f"{w.prompt_tokens + w.output_tokens} exceeds max-model-len {mml}: every request would "
                            "be rejected; shorten the workload or raise max-model-len")
        for i, v in enumerate(self.variants):
            for rt in v.runtimes or []:
                if rt not in self.runtime_names():
                    raise ValueError(f"variants[{i}].runtimes: {rt!r} is not one of the plan's runtimes {self.runtime_names()}")
        for i, w in enumerate(self.workloads):
            for lp in self.load_profiles():
                n = requests_for_level(self, w, lp)
                field = "requests_per_concurrency" if n > w.num_requests else f"workloads[{i}].num_requests"
                if n > MAX_WINDOW_REQUESTS:
                    raise ValueError(f"{field}: {n:,} measured requests in the window of {w.name} at {lp.label}, "
                                     f"more than the limit of {MAX_WINDOW_REQUESTS:,}; lower it")
                if n * w.prompt_tokens > MAX_WINDOW_PROMPT_TOKENS:
                    raise ValueError(f"{field}: the window of {w.name} at {lp.label} holds {n:,} prompts of "
                                     f"{w.prompt_tokens:,} tokens = {n * w.prompt_tokens:,} prompt tokens, more than "
                                     f"the limit of {MAX_WINDOW_PROMPT_TOKENS:,} (its prompts are held in memory "
                                     "while it runs); fewer requests per window or shorter prompts")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names must be unique, got {names}")
        self._check_distinct_configs()
        self._check_anchor()
        self._check_ab()
        self._check_search()
        self._check_precision()
        self._check_primary()
        self._check_sla_search()
        return self

    def _check_distinct_configs(self) -> None:
        """Every config of a runtime launches a different server. Two with the same launch (a matrix value given
        twice, ``false`` beside null for a flag, two variants with the same overrides) have one config key, so
        their boots would write one bundle and the second would replace the first's results."""
        for rt in self.runtime_names():
            seen: dict[str, str] = {}
            for name, args, env in self._named_configs(rt):
                launch = {**_canonical_args(args), **env}
                what = name or (" ".join(f"{k}={v}" for k, v in launch.items()) or "the base config")
                key = config_key(self.model_id(), args, env)
                if key in seen:
                    raise ValueError(
                        f"engine_args/env/variants: two configs launch the same server on runtime {rt!r} "
                        f"({seen[key]!r} and {what!r}; a repeated matrix value, false beside null, or two variants "
                        "with the same overrides): their results would overwrite each other; remove the repeat "
                        "(more boots of one config: replicates)")
                seen[key] = what

    def _check_anchor(self) -> None:
        """``anchor:`` runs on one of the plan's runtimes, in a plan of fixed boot rounds."""
        a = self.anchor
        if a is None:
            return
        if a.runtime not in self.runtime_names():
            raise ValueError(f"anchor.runtime: {a.runtime!r} is not one of the plan's runtimes {self.runtime_names()}; "
                             f"add it to runtimes: (or name one of them)")
        if self.replicates == "auto" or self.search is not None:
            raise ValueError("anchor: a replicates: auto or search: sweep chooses its own boots; the anchor needs fixed "
                             "boot rounds (replicates: N): remove anchor, or run the anchor in a plain sweep")

    def anchor_trial(self, rep: int = 0) -> "Trial | None":
        """The anchor's trial of boot round ``rep`` (None without ``anchor:``)."""
        a = self.anchor
        if a is None:
            return None
        env = {k: _env_str(x) for k, x in a.env.items() if x is not None}
        return Trial(runtime=a.runtime, model=self.model, model_id=self.model_id(), engine_args=dict(a.engine_args),
                     env=env, replicate=rep, axes=self.axes(), name=a.name)

    def _check_sla_search(self) -> None:
        """``sla_search`` judges the plan's ``slo:`` bounds (at least one latency bound), and its load fits the
        workloads (a multi-turn workload needs concurrency) and the window limits at its highest level."""
        spec = self.sla_search
        if spec is None:
            return
        limits = spec.limits(**self.slo.model_dump())
        if len(limits) < 2:  # the error rate alone
            raise ValueError("sla_search: needs a latency bound in the plan's slo: to search under, e.g. slo: "
                             "{ttft_s: 0.5, tpot_s: 0.05} (each read at sla_search.percentile, default p99)")
        for i, w in enumerate(self.workloads):
            if spec.load == "rate" and getattr(w.profile, "has_sessions", False):
                raise ValueError(f"sla_search.load: workloads[{i}] ({w.name}) is multi-turn, which runs at a "
                                 "concurrency (sessions in flight); use sla_search: {load: concurrency}")
            top = (ConcurrencyProfile(concurrency=int(spec.max)) if spec.load == "concurrency"
                   else RateProfile(rate_per_s=spec.max, burstiness=self.burstiness))
            n = requests_for_level(self, w, top)
            if n > MAX_WINDOW_REQUESTS or n * w.prompt_tokens > MAX_WINDOW_PROMPT_TOKENS:
                raise ValueError(f"sla_search.max: the window of {w.name} at {top.label} holds {n:,} requests of "
                                 f"{w.prompt_tokens:,} prompt tokens, more than a window may hold (at most "
                                 f"{MAX_WINDOW_REQUESTS:,} requests, {MAX_WINDOW_PROMPT_TOKENS:,} prompt tokens); "
                                 "lower sla_search.max or requests_per_concurrency")

    def _check_precision(self) -> None:
        """``precision`` replaces the counts: it excludes an explicit ``replicates`` / ``repeats`` (and
        ``replicates: auto``, which stops by its own rule) and names only load levels and workloads that exist."""
        if self.precision is None:
            return
        given = [f for f in ("replicates", "repeats") if f in self.model_fields_set]
        if self.replicates == "auto":
            raise ValueError("precision: replicates: auto stops by its own sequential rule; use `ab: {margin, "
                             "budget}` for it, or remove replicates: auto to let precision choose the counts")
        if given:
            raise ValueError(f"precision: tunelab chooses boots per config (replicates) and windows per boot "
                             f"(repeats) from the noise model; remove {' and '.join(given)} "
                             f"({', '.join(f'{f}: {getattr(self, f)}' for f in given)}), or remove precision to "
                             "give the counts yourself")
        labels = [p.label for p in self.load_profiles()]
        for i, lab in enumerate(self.precision.loads or []):
            if lab not in labels:
                raise ValueError(f"precision.loads[{i}]: {lab!r} is not a load level of the plan; use one of {labels}")
        wl = [w.name for w in self.workloads]
        for i, name in enumerate(self.precision.workloads or []):
            if name not in wl:
                raise ValueError(f"precision.workloads[{i}]: {name!r} is not a workload of the plan; use one of {wl}")

    def _check_primary(self) -> None:
        """``primary`` names only workloads and load levels of the plan."""
        if self.primary is None:
            return
        labels = [p.label for p in self.load_profiles()]
        for i, lab in enumerate(self.primary.loads or []):
            if lab not in labels:
                raise ValueError(f"primary.loads[{i}]: {lab!r} is not a load level of the plan; use one of {labels}")
        wl = [w.name for w in self.workloads]
        for i, name in enumerate(self.primary.workloads or []):
            if name not in wl:
                raise ValueError(f"primary.workloads[{i}]: {name!r} is not a workload of the plan; use one of {wl}")

    def _check_search(self) -> None:
        """``search:`` varies one base config on one runtime, one boot per config: no matrix axes, variants,
        replicates or several runtimes beside it; its objective names a workload and a load level of the plan."""
        if self.search is None:
            return
        if self.replicates != 1:
            raise ValueError("search: one boot per config (replicates: 1); the search's budget decides the boots")
        if self.precision is not None:
            raise ValueError("search: one boot per config, so precision: (which chooses boots per config) does not "
                             "apply; remove precision, or confirm the search's winner in a separate A/B plan")
        if self.variants or len(self.runtime_names()) > 1 or self.axes():
            raise ValueError("search: the base config is one config on one runtime: give engine_args / env as "
                             "scalars (no matrix lists), no variants and one runtime; put what varies in search.space")
        obj = self.search.objective
        wl = [w.name for w in self.workloads]
        if obj.workload is not None and obj.workload not in wl:
            raise ValueError(f"search.objective.workload: {obj.workload!r} is not a workload of the plan; use one of {wl}")
        labels = [p.label for p in self.load_profiles()]
        if obj.load is not None and obj.load not in labels:
            raise ValueError(f"search.objective.load: {obj.load!r} is not a load level of the plan; use one of {labels}")
        longest = max(w.prompt_tokens + w.output_tokens for w in self.workloads)
        mml = self.search.space.engine_args.get("max-model-len")
        low = min((x for x in mml if isinstance(x, int)), default=None) if isinstance(mml, list) else \
            (int(mml.low) if mml is not None else None)
        if low is not None and low < longest:
            raise ValueError(f"search.space.engine_args.max-model-len: {low} is below the plan's longest request "
                             f"(prompt + output = {longest} tokens): every request would be rejected there")

    def search_cell(self) -> tuple[str, str]:
        """(workload, load label) of the search's objective: as given, else the plan's first workload and its
        last (highest) load level."""
        assert self.search is not None
        obj = self.search.objective
        return obj.workload or self.workloads[0].name, obj.load or self.load_profiles()[-1].label

    def name_check_trials(self) -> list["Trial"]:
        """The trials whose engine-arg and env names are checked against the runtimes' facts: the plan's trials
        and, with ``search:``, one per runtime setting every name of the search space."""
        out = self.trials()
        if self.search is not None:
            sp = self.search.space

            def first(v: Any) -> Any:
                return v[0] if isinstance(v, list) else v.low

            for t in list(out):
                args = {**t.engine_args, **{k: first(v) for k, v in sp.engine_args.items()}}
                env = {**t.env, **{k: _env_str(first(v)) for k, v in sp.env.items()}}
                out.append(t.model_copy(update={"engine_args": args, "env": env, "name": "search space"}))
        return out

    def _check_ab(self) -> None:
        """``replicates: auto`` needs ``ab`` and exactly two trials per boot round; ``ab`` names what exists."""
        if self.replicates != "auto":
            if self.ab is not None:
                raise ValueError("ab: an A/B declaration decides a sweep only with replicates: auto; set "
                                 "replicates: auto or remove ab")
            return
        if self.search is not None:
            raise ValueError("replicates: auto cannot be used beside search: (the search runs one boot per config); "
                             "remove replicates, and confirm the search's winner with a separate replicates: auto "
                             "A/B plan (its config against the default)")
        if self.ab is None:
            raise ValueError("replicates: auto needs an `ab:` declaration (metrics, budget; e.g. ab: {metrics: "
                             "[output_tokens_per_s], loads: [c=32], budget: {boots: 12}})")
        pair = self._round(0)
        if len(pair) != 2:
            raise ValueError(f"replicates: auto compares two configs, but this plan gives {len(pair)} per boot round "
                             f"({', '.join(t.label + ' on ' + t.runtime for t in pair)}); keep one matrix axis "
                             "with two values, two variants, or two runtimes")
        if self.ab.baseline is not None and not any(self.ab.baseline in (t.label, t.name, t.runtime) for t in pair):
            raise ValueError(f"ab.baseline: {self.ab.baseline!r} is neither config; use one of "
                             f"{sorted({t.label for t in pair} | {t.runtime for t in pair})}")
        labels = [p.label for p in self.load_profiles()]
        for i, lab in enumerate(self.ab.loads or []):
            if lab not in labels:
                raise ValueError(f"ab.loads[{i}]: {lab!r} is not a load level of the plan; use one of {labels}")
        wl = [w.name for w in self.workloads]
        for i, name in enumerate(self.ab.workloads or []):
            if name not in wl:
                raise ValueError(f"ab.workloads[{i}]: {name!r} is not a workload of the plan; use one of {wl}")

    def ab_pair(self) -> tuple["Trial", "Trial"]:
        """(A, B) of a ``replicates: auto`` plan at boot 0: the baseline named by ``ab.baseline`` first.

        Raises:
            ValueError: not a ``replicates: auto`` plan.
        """
        if self.replicates != "auto" or self.ab is None:
            raise ValueError("ab_pair: only for a plan with replicates: auto and ab")
        a, b = self._round(0)
        if self.ab.baseline is not None and self.ab.baseline not in (a.label, a.name, a.runtime):
            a, b = b, a
        return a, b

    def max_boots(self) -> int:
        """Boots per config the plan allows: ``replicates``, or for ``auto`` half the budget's boots (or
        :data:`MAX_AUTO_PAIRS` when the budget gives GPU-minutes only)."""
        if self.replicates != "auto":
            return int(self.replicates)
        assert self.ab is not None
        return self.ab.budget.boots // 2 if self.ab.budget.boots else MAX_AUTO_PAIRS

    # -- expansion ---------------------------------------------------------------------------
    def load_profiles(self) -> list[LoadProfile]:
        """The plan's load levels as profiles (tunelab.core.load_profiles), in order: the ``concurrency`` levels,
        then the ``request_rates`` (each with the plan's ``burstiness``)."""
        return (profiles_from_levels(ConcurrencyProfile, self.concurrency)
                + profiles_from_levels(RateProfile, self.request_rates, burstiness=self.burstiness)
                + profiles_from_levels(TraceProfile, self.trace_speedups))

    def _check_trace(self) -> None:
        """Trace levels replay the workloads' own arrival times: every workload needs them, a duration window
        cannot hold them, and the slowest replay must end within the window's deadline."""
        if not self.trace_speedups:
            return
        for i, w in enumerate(self.workloads):
            if not w.profile.has_arrivals:
                raise ValueError(f"trace_speedups: workloads[{i}] ({w.name}) is of type {w.type}, which has no arrival "
                                 "times to replay; give every workload type: trace, or remove trace_speedups")
        if self.window is not None and self.window.duration_s is not None:
            raise ValueError("trace_speedups with window: {duration_s}: a trace sets its window's length; remove one")
        slowest = min(self.trace_speedups)
        budget_s = self.request_timeout_s * (self.repeats + 1)
        for i, w in enumerate(self.workloads):
            specs = w.profile.request_specs(w.num_requests, self.seed)
            span_s = (specs[-1].arrival_offset_s or 0.0) / slowest
            if span_s >= budget_s:
                raise ValueError(f"workloads[{i}] ({w.name}): its {w.num_requests} requests of the trace span "
                                 f"{span_s:.0f} s at speedup {slowest:g}, not less than the window's deadline of "
                                 f"request_timeout_s x (repeats + 1) = {budget_s:.0f} s; fewer num_requests, a "
                                 "higher speedup or a longer request_timeout_s")

    def runtime_names(self) -> list[str]:
        """Runtimes this plan runs on, in order."""
        return list(self.runtimes) if self.runtimes else [self.runtime]

    def model_id(self) -> str:
        """Machine-independent model identity used in config keys: the model folder's name."""
        return Path(self.model).name

    def configs(self, runtime: str | None = None) -> list[tuple[dict[str, Scalar], dict[str, str]]]:
        """Cartesian product of the engine-arg and env matrices, as (engine_args, env) pairs; with
        ``variants``, each variant's overrides applied to every matrix point (variants restricted to other
        runtimes are left out for ``runtime``)."""
        return [(a, e) for _, a, e in self._named_configs(runtime)]

    def _named_configs(self, runtime: str | None = None) -> list[tuple[str | None, dict, dict]]:
        base = _expand(self.engine_args, self.env)
        if not self.variants:
            return [(None, a, e) for a, e in base]
        out = []
        single = len(base) == 1
        for args, env in base:
            for v in self.variants:
                if runtime is not None and v.runtimes is not None and runtime not in v.runtimes:
                    continue
                env2 = {**env, **{k: _env_str(x) for k, x in v.env.items() if x is not None}}
                # A variant's name labels it only when no matrix axis also varies.
                out.append((v.name if single else None, {**args, **v.engine_args}, env2))
        return out

    def axes(self) -> tuple[str, ...]:
        """Names of the engine args and env vars that vary across trials (the matrix axes), plus
        'runtime' when several runtimes are compared. Used for short trial labels."""
        ax = [_norm_flag(k) for k, v in self.engine_args.items() if isinstance(v, list) and len(v) > 1]
        ax += [k for k, v in self.env.items() if isinstance(v, list) and len(v) > 1]
        for v in self.variants:
            ax += [k for k in v.engine_args if k not in ax] + [k for k in v.env if k not in ax]
        return tuple(ax)

    def _round(self, rep: int) -> list["Trial"]:
        """The trials of boot round ``rep``: every config on every runtime once, in plan order."""
        out = []
        for rt in self.runtime_names():
            for name, args, env in self._named_configs(rt):
                out.append(Trial(runtime=rt, model=self.model, model_id=self.model_id(), engine_args=args, env=env,
                                 replicate=rep, axes=self.axes(), name=name))
        return out

    def trials(self) -> list["Trial"]:
        """Expand into trials: configs x runtimes x replicates, interleaved so that boots of the
        configs alternate (A B A B ...) and machine drift over the sweep does not look like an effect.

        ``replicates: auto``: the longest sequence the budget allows, in pairs (A, B) in ``ab.order``
        (``abba``: A B, B A, A B, ...); the sweep runs it pair by pair and stops when the A/B is decided."""
        if self.replicates == "auto":
            out: list[Trial] = []
            for rep in range(self.max_boots()):
                a, b = self.ab_pair()
                a, b = a.model_copy(update={"replicate": rep}), b.model_copy(update={"replicate": rep})
                out += [b, a] if (self.ab and self.ab.order == "abba" and rep % 2 == 1) else [a, b]
            return out
        rounds: list[list[Trial]] = []
        anchor_key = None
        for rep in range(self.replicates):
            rnd = self._round(rep)
            at = self.anchor_trial(rep)
            if at is not None:
                # The anchor is one of the plan's configs when it launches the same server on its runtime.
                same = [t for t in rnd if (t.runtime, t.config_key) == (at.runtime, at.config_key)]
                if not same:
                    rnd.append(at)
                anchor_key = (at.runtime, at.config_key)
            rounds.append(rnd)
        # Order positions by (runtime, config key): one anchor unit in every round (tunelab.core.trial_order).
        keyed = [[(t.runtime, t.config_key, t.replicate) for t in rnd] for rnd in rounds]
        by_key = {(t.runtime, t.config_key, t.replicate): t for rnd in rounds for t in rnd}
        out_keys = boot_order([[k[:2] for k in rnd] for rnd in keyed], self.interleave, seed=self.seed,
                              anchor=anchor_key)
        rep_of = [rep for rep, rnd in enumerate(rounds) for _ in rnd]
        return [by_key[(*k, rep)] for k, rep in zip(out_keys, rep_of)]


def _as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def _expand(engine_args: dict, env: dict) -> list[tuple[dict, dict]]:
    keys_a = sorted(engine_args)
    keys_e = sorted(env)
    axes = [_as_list(engine_args[k]) for k in keys_a] + [_as_list(env[k]) for k in keys_e]
    out = []
    for combo in itertools.product(*axes):
        a = dict(zip(keys_a, combo[: len(keys_a)]))
        e = {k: _env_str(v) for k, v in zip(keys_e, combo[len(keys_a):]) if v is not None}
        out.append((a, e))
    return out


def _env_str(v: Scalar) -> str:
    # vLLM parses boolean env vars with int(...): "true" would crash it, so booleans become "1"/"0".
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _canonical_args(engine_args: dict[str, Scalar]) -> dict[str, Scalar]:
    """Drop flags that are omitted at launch (false/null) so that `enforce-eager: false` and no flag
    at all are the same config; stringify numbers consistently."""
    out = {}
    for k, v in engine_args.items():
        if v is None or v is False:
            continue
        out[_norm_flag(k)] = v
    return out


def config_key(model_id: str, engine_args: dict[str, Scalar], env: dict[str, str]) -> str:
    """Stable 12-hex-digit key of an engine configuration: sha256 over canonical JSON of the model id,
    the launched engine args and the env. Independent of key order, of the runtime (so one config can be
    followed across vLLM releases) and of the machine."""
    payload = {
        "model": model_id,
        "engine_args": _canonical_args(engine_args),
        "env": {k: str(v) for k, v in env.items()},
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class Trial(BaseModel):
    """One boot of one engine config on one runtime. ``trial_id`` is set by the sweep."""

    model_config = ConfigDict(frozen=True)
    runtime: str
    model: str
    model_id: str
    engine_args: dict[str, Scalar]
    env: dict[str, str]
    replicate: int = 0
    axes: tuple[str, ...] | None = None
    name: str | None = None

    @property
    def config_key(self) -> str:
        """See :func:`config_key`."""
        return config_key(self.model_id, self.engine_args, self.env)

    @property
    def label(self) -> str:
        """Human label of the config, e.g. ``enforce-eager VLLM_USE_FASTOKENS=1``. When the plan's matrix
        axes are known only they are shown (``enforce-eager=false`` stays visible as ``no enforce-eager``);
        'default' if nothing is set."""
        if self.name:
            return self.name
        args = _canonical_args(self.engine_args)
        keys_a = sorted(self.engine_args) if self.axes is None else [k for k in sorted(self.engine_args) if k in self.axes]
        keys_e = sorted(self.env) if self.axes is None else [k for k in sorted(self.env) if k in self.axes]
        parts = []
        for k in keys_a:
            if k not in args:
                parts.append(f"no {k}" if self.axes is not None else "")
            else:
                parts.append(k if args[k] is True else f"{k}={args[k]}")
        parts += [f"{k}={self.env[k]}" for k in keys_e]
        return " ".join(p for p in parts if p) or "default"

    def serve_args(self) -> list[str]:
        """The trial's engine args as ``vllm serve`` argv (without model, host, port, api key)."""
        argv: list[str] = []
        for k, v in sorted(_canonical_args(self.engine_args).items()):
            argv.append(f"--{k}")
            if v is not True:
                argv.append(str(v))
        return argv

    def with_eager(self) -> "Trial":
        """The same trial with only ``--enforce-eager`` added (the seeds' boot diagnostic)."""
        args = dict(self.engine_args)
        args["enforce-eager"] = True
        return self.model_copy(update={"engine_args": args})


#: Where the allowed fields of a section are described (an unknown field's hint); other fields: the demo plan.
_SECTION_DOCS = {"search": "docs/tuning.md", "sla_search": "docs/sla_search.md", "precision": "docs/statistics.md"}
#: An example for a required field that is missing, by its location.
_MISSING_EXAMPLES = {
    "search.objective": "objective: {maximize: output_tokens_per_s, workload: short_chat, load: c=4}",
    "search.space": "space: {engine_args: {max-num-seqs: [64, 128, 256]}}",
    "search.budget": "budget: {boots: 12, gpu_minutes: 60}",
    "precision.half_width": "precision: {metric: output_tokens_per_s, half_width: 0.05, loads: [c=32]}",
}


#: Names pydantic gives the members of a union in an error's location (``replicates.constrained-int``,
#: ``replicates.literal['auto']``): internals, not fields of the plan.
_UNION_MEMBER = re.compile(r"^(constrained-\w+|literal\[.*\]|int|float|str|bool|list\[.*\]|dict\[.*\]|"
                           r"function-\w+\[.*\])$")


def _format_errors(path: str, err: ValidationError) -> str:
    merged: dict[str, list[str]] = {}
    for loc, msg in _error_lines(err):
        merged.setdefault(loc, [])
        if msg not in merged[loc]:
            merged[loc].append(msg)
    # A union's members fail one by one ("greater than or equal to 1", "should be 'auto'"): one line, "or"-joined.
    lines = [f"{path}: invalid plan ({len(merged)} problem(s)):"]
    lines += [f"  - {loc}: {'; or '.join(msgs)}" for loc, msgs in merged.items()]
    return "\n".join(lines)


def _error_lines(err: ValidationError) -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        parts = [p for p in e["loc"] if not (isinstance(p, str) and _UNION_MEMBER.match(p))]
        for i in range(len(parts) - 1, -1, -1):
            # A workload's type fields sit next to its common fields in the YAML: name them there.
            if parts[i] == "profile" and i >= 2 and parts[i - 2] == "workloads":
                tag = i + 1 < len(parts) and parts[i + 1] in WORKLOAD_TYPES
                parts[i: i + 1 + tag] = [] if tag or e["type"] != "union_tag_invalid" else ["type"]
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in parts).replace(".[", "[")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            where = _SECTION_DOCS.get(str(parts[0])) if len(parts) > 1 else None
            msg = (f"unknown field (check the spelling; see {where or 'experiments/demo.yaml'} for the allowed "
                   "fields)")
        elif e["type"] == "missing":
            msg = "required field is missing"
            if loc in _MISSING_EXAMPLES:
                msg += f", e.g. {_MISSING_EXAMPLES[loc]}"
        elif e["type"] == "literal_error":
            # pydantic names the allowed values, not the one written: "got 'later'" says which line to fix.
            msg = f"{msg}, got {e.get('input')!r}"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError: noise here
            # A check across fields (a model validator) has no location; its message leads with the field it is
            # about ("sla_search: needs a latency bound ..."): name that field instead of the whole plan.
            lead = re.match(r"([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*): (.+)", msg, re.S) if not loc else None
            if lead:
                loc, msg = lead.group(1), lead.group(2)
        out.append((loc or "<plan>", msg))
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a key written twice. YAML 1.2 says keys are unique, but
    PyYAML keeps the last value silently, so ``max-num-seqs`` written twice would sweep only the second value
    without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; PyYAML resolves it itself
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key; PyYAML's own error says so below
                continue
            if first != line:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"key {key!r} is written twice (lines {first} and {line}); YAML keeps only the last, so write "
                    "it once (a list of values sweeps them: key: [a, b])", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file.

    Raises:
        PlanError: unreadable file, YAML syntax error, a key written twice in one mapping (named with both
            lines), or a field that fails validation; the message
            names the file and each field path (e.g. ``workloads[0].prompt_tokens``) with what is allowed.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError(f"{p}: cannot read plan file: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise PlanError(f"{p}: not UTF-8 text (byte {e.start}): save the plan as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise PlanError(f"{p}: not valid YAML: {str(e).replace('<unicode string>', str(p))}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{p}: a plan is a YAML mapping with at least 'name', 'model' and 'workloads'")
    # A workload's relative file path (dataset, trace), like the model's: the plan's folder first, then the
    # current directory. Before validation, which reads the file.
    for w in data.get("workloads") or []:
        if isinstance(w, dict) and isinstance(w.get("path"), str) and not Path(w["path"]).is_absolute():
            cand = p.parent / w["path"]
            if cand.exists():
                w["path"] = os.path.normpath(cand)
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        raise PlanError(_format_errors(str(p), e)) from None
    # Resolve a relative model path against the plan's folder first, then the current directory. A model that is
    # in neither is named by the plan-folder path (relative to the current directory where it can be), so that
    # the fix a message suggests (`tunelab model tiny PATH`) builds it where this plan looks first.
    mp = Path(plan.model)
    if not mp.is_absolute():
        cand = (p.parent / mp)
        if cand.exists():
            model = str(cand)
        elif mp.exists():
            model = str(mp)
        else:
            try:
                model = os.path.relpath(cand)
            except ValueError:  # another drive (Windows): keep the plan-folder path as it is
                model = str(cand)
        plan = plan.model_copy(update={"model": model})
    # max-model-len against the model's positions (config.json), before any boot: one that is too long fails
    # every boot as invalid_config after the whole start-up.
    ctx_errors = model_context_errors(plan)
    if ctx_errors:
        raise PlanError(f"{p}: " + "\n".join(ctx_errors))
    return plan


def _facts(runtimes: dict, method: str, what: str) -> tuple[dict[str, frozenset[str] | None], list[str]]:
    """Each runtime's fact (``Runtime.vllm_env_names`` / ``serve_flags``: cached, read in the runtime's own
    interpreter) and one warning per runtime whose reading raised. Such a runtime is not judged, as when its
    probe found nothing: the check is optional and must not stop a plan check or a sweep."""
    known, warnings = {}, []
    for name, rt in runtimes.items():
        try:
            known[name] = getattr(rt, method)()
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the trials can still run
            known[name] = None
            warnings.append(f"runtime {name!r}: its {what} could not be read ({type(exc).__name__}: {exc}); "
                            f"that check is skipped for its trials")
    return known, warnings


def runtime_checks(plan: "Plan", runtimes: dict) -> tuple[list[str], list[str]]:
    """The checks of a plan against its runtimes' facts, as one call that never raises.

    Runs :func:`unknown_engine_args` and :func:`bad_engine_arg_values` (errors and warnings),
    :func:`unknown_env_errors` (errors), :func:`prefix_block_warnings` and :func:`unknown_env_warnings`
    (warnings). These
    checks only save a failed or misleading boot, so they must never stop a sweep or a plan check themselves:
    a check that raises (whatever the cause, e.g. an interpreter bug while reading a runtime) is skipped and
    becomes one warning that names it and the exception.

    Returns:
        (errors, warnings), one line each. Errors are plan errors (an engine-arg name or value no runtime accepts,
        a VLLM_* name no runtime knows that the plan does not allow).

    Args:
        plan: the validated plan.
        runtimes: runtime name -> ``tunelab.host.runtime.Runtime``.
    """
    errors: list[str] = []
    warnings: list[str] = []
    # A check that cannot run is a warning, never a failed plan: the boot would then fail as invalid_config.
    for check, what, fallback in ((unknown_engine_args, "name", "a misspelt name"),
                                  (bad_engine_arg_values, "value", "a bad value")):
        try:
            e, w = check(plan, runtimes)
            errors += e
            warnings += w
        except Exception as exc:  # noqa: BLE001
            warnings.append(f"engine-arg {what} check skipped ({type(exc).__name__}: {exc}); {fallback} will "
                            "show as a boot failure (invalid_config) instead")
    try:
        warnings += [n for n in (w.dataset_note() for w in plan.workloads) if n]
        warnings += prefix_block_warnings(plan, runtimes)
    except Exception as exc:  # noqa: BLE001
        warnings.append(f"dataset / shared-prefix notes skipped ({type(exc).__name__}: {exc})")
    try:
        env_errors = unknown_env_errors(plan, runtimes)
        errors += [msg for _name, msg in env_errors]
        refused = {f"env {name}:" for name, _msg in env_errors}
        # A refused name is one error; its per-runtime warnings would only repeat it.
        warnings += [w for w in unknown_env_warnings(plan, runtimes) if not any(w.startswith(r) for r in refused)]
    except Exception as exc:  # noqa: BLE001
        warnings.append(f"VLLM_* env name check skipped ({type(exc).__name__}: {exc}); an unknown variable will "
                        "show in the boot log and in trials.env_not_applied instead")
    return errors, warnings


def unknown_env_errors(plan: "Plan", runtimes: dict) -> list[tuple[str, str]]:
    """``VLLM_*`` names the plan sets that no runtime of the plan knows (``Runtime.vllm_env_names``) and that
    ``allow_unknown_env`` does not list: a typo such as ``VLLM_USE_FASTOKNS``, which vLLM would only warn about
    at boot and run without, so every trial of the config would measure the default. A name that some runtimes
    know and others do not stays a warning (:func:`unknown_env_warnings`: comparing releases across a new
    variable is a legitimate plan). Runtimes whose names cannot be read are not judged; with none judged,
    nothing is refused.

    Returns:
        ``(name, message)`` per refused name; the message names where the plan sets it, the closest known name
        (difflib) and the fix (correct it, or list it in ``allow_unknown_env``).
    """
    known_by, _ = _facts(runtimes, "vllm_env_names", "VLLM_* variable names")
    judged = {n: k for n, k in known_by.items() if k is not None}
    if not judged:
        return []
    allowed = set(plan.allow_unknown_env)
    names = sorted({k for t in plan.name_check_trials() if t.runtime in judged for k in t.env
                    if k.startswith("VLLM_") and k not in allowed})
    pool = sorted(set().union(*judged.values()))
    out = []
    for k in names:
        if any(k in known for known in judged.values()):
            continue
        where = ("search.space.env" if plan.search is not None and k in plan.search.space.env else
                 "env" if k in plan.env else
                 next((f"variants[{i}].env" for i, v in enumerate(plan.variants) if k in v.env), "env"))
        close = difflib.get_close_matches(k, pool, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        vers = ", ".join(f"{n} (vLLM {runtimes[n].vllm_version or '?'})" for n in judged)
        out.append((k, f"{where}: {k} is not a VLLM_* variable of runtime(s) {vers} (not in vllm/envs.py){hint}; "
                       "vLLM would ignore it and run with the default; correct the name, or list it in "
                       f"allow_unknown_env: [{k}] if it is meant"))
    return out


def unknown_env_warnings(plan: "Plan", runtimes: dict) -> list[str]:
    """One line per (runtime, env var) where a trial sets a ``VLLM_*`` variable that the runtime's vLLM does
    not know (``Runtime.vllm_env_names``): vLLM would only warn at boot and run without it, so those trials
    do not test the setting (the boot log confirms it and ``trials.env_not_applied`` records it). A warning,
    not an error: comparing a release that lacks a flag with one that has it is a legitimate plan. A runtime
    whose names cannot be read is not judged; when reading them raised, a line says so.

    Args:
        plan: the validated plan.
        runtimes: runtime name -> ``tunelab.host.runtime.Runtime``.
    """
    known_by, out = _facts(runtimes, "vllm_env_names", "VLLM_* variable names")
    affected: dict[tuple[str, str], list[str]] = {}
    for t in plan.name_check_trials():
        known = known_by.get(t.runtime)
        if known is None:
            continue
        for k in sorted(t.env):
            if k.startswith("VLLM_") and k not in known:
                labels = affected.setdefault((t.runtime, k), [])
                if t.label not in labels:
                    labels.append(t.label)
    for (rt_name, k), labels in affected.items():
        rt = runtimes[rt_name]
        close = difflib.get_close_matches(k, sorted(known_by[rt_name]), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"env {k}: unknown to vLLM {rt.vllm_version or '?'} of runtime {rt_name!r} (not in its "
                   f"vllm/envs.py){hint}; it will not be applied, so config(s) {', '.join(repr(x) for x in labels)} "
                   "run as if it were unset there")
    return out


def _flag_known(flag: str, known: frozenset[str]) -> bool:
    """Whether ``vllm serve`` accepts ``flag`` (normalised: lower case, no dashes). One-letter names are short
    options that vLLM spells in upper case (``-O``) and the plan lower-cases, so they are left to vLLM."""
    return len(flag) == 1 or flag in known


def unknown_engine_args(plan: "Plan", runtimes: dict) -> tuple[list[str], list[str]]:
    """Engine args of the plan that ``vllm serve`` would reject, found before any server starts.

    Compares every engine-arg name of every trial with the option names of its runtime's ``vllm serve``
    (``Runtime.serve_flags``: read from vLLM's own argument parser, cached per vLLM version).

    Returns:
        (errors, warnings), one line each. An error is a name no runtime of the plan accepts (a typo: every
        boot of the config would fail; the line says which flag is close). A warning is a name that some of
        the plan's runtimes accept and others do not (comparing releases across a new flag is a legitimate
        plan; those trials will fail to boot with ``invalid_config``). A runtime whose flags cannot be read
        is not judged; when reading them raised, a warning says so.

    Args:
        plan: the validated plan.
        runtimes: runtime name -> ``tunelab.host.runtime.Runtime``.
    """
    known_by, read_warnings = _facts(runtimes, "serve_flags", "`vllm serve` option names")
    judged = {n: k for n, k in known_by.items() if k is not None}
    if not judged:
        return [], read_warnings
    unknown_in: dict[str, list[str]] = {}
    for t in plan.name_check_trials():
        known = judged.get(t.runtime)
        if known is None:
            continue
        for flag in sorted(t.engine_args):
            if not _flag_known(flag, known):
                rts = unknown_in.setdefault(flag, [])
                if t.runtime not in rts:
                    rts.append(t.runtime)
    errors, warnings = [], list(read_warnings)
    for flag, rts in unknown_in.items():
        accepted_by = [n for n, k in judged.items() if _flag_known(flag, k)]
        if not accepted_by:
            pool = sorted(set().union(*judged.values()))
            close = difflib.get_close_matches(flag, pool, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; see `vllm serve --help=all` for the names"
            vers = ", ".join(f"{n} (vLLM {runtimes[n].vllm_version or '?'})" for n in judged)
            where = ("search.space.engine_args" if plan.search is not None and flag in plan.search.space.engine_args
                     and flag not in plan.engine_args else "engine_args")
            errors.append(f"{where}: {flag!r} is not a `vllm serve` option of runtime(s) {vers}{hint}")
        else:
            for n in rts:
                warnings.append(f"engine arg {flag!r}: unknown to vLLM {runtimes[n].vllm_version or '?'} of runtime "
                                f"{n!r} (accepted by {', '.join(repr(a) for a in accepted_by)}); its trials on "
                                f"{n!r} will fail to boot (invalid_config)")
    return errors, warnings


def _engine_arg_values(plan: "Plan") -> list[tuple[str, str, Any, list[str]]]:
    """Every engine-arg value the plan sets, as (field path, flag, value, runtimes it runs on): the base
    ``engine_args`` (each value of a matrix list), each variant's, and each value of ``search.space.engine_args``
    (a range's ``low`` and ``high``)."""
    rts = plan.runtime_names()
    out: list[tuple[str, str, Any, list[str]]] = []
    for flag, v in plan.engine_args.items():
        for i, x in enumerate(v) if isinstance(v, list) else [(None, v)]:
            out.append((f"engine_args.{flag}" + ("" if i is None else f"[{i}]"), flag, x, rts))
    for j, var in enumerate(plan.variants):
        vrts = [r for r in rts if var.runtimes is None or r in var.runtimes]
        for flag, x in var.engine_args.items():
            out.append((f"variants[{j}].engine_args.{flag}", flag, x, vrts))
    if plan.search is not None:
        for flag, v in plan.search.space.engine_args.items():
            if isinstance(v, list):
                for i, x in enumerate(v):
                    out.append((f"search.space.engine_args.{flag}[{i}]", flag, x, rts))
            else:
                for end in ("low", "high"):
                    out.append((f"search.space.engine_args.{flag}.{end}", flag, getattr(v, end), rts))
    return out


def bad_engine_arg_values(plan: "Plan", runtimes: dict) -> tuple[list[str], list[str]]:
    """Engine-arg values of the plan that ``vllm serve`` would reject (``dtype: fp13``,
    ``gpu-memory-utilization: 1.5``), found before any server starts, in the base config, the variants and the
    ``search:`` space.

    The allowed values of an option come from its runtime's facts (``Runtime.serve_choices``, read from vLLM's own
    parser) when they were read; else (a runtime not registered on this machine, or facts without choices) from
    ``tunelab.core.engine_arg_values``' table of the common enumerated options and its numeric type/range rules.

    Returns:
        (errors, warnings), one line each. An error is a value no runtime of the plan accepts; it names the field
        (``search.space.engine_args.dtype[1]``), the value and the allowed values; for a range of the space, the
        values it steps through are judged too (``{low: 2, high: 3, step: 0.5}`` of ``max-num-seqs`` gives 2.5,
        an error naming ``search.space.engine_args.max-num-seqs``). A warning is a value some of
        the plan's runtimes accept and others do not (their trials will fail to boot with ``invalid_config``).

    Args:
        plan: the validated plan.
        runtimes: runtime name -> ``tunelab.host.runtime.Runtime`` (those found on this machine; may be empty).
    """
    from tunelab.core.engine_arg_values import ENUM_SOURCE, value_problem

    # A runtime whose facts cannot be read is judged by the table; the name check already warns about it.
    facts, _ = _facts({n: r for n, r in runtimes.items() if hasattr(r, "serve_choices")}, "serve_choices",
                      "`vllm serve` option choices")
    errors: list[str] = []
    warnings: list[str] = []
    for field, flag, value, rts in _engine_arg_values(plan):
        if not rts:
            continue
        bad = {r: value_problem(flag, value, facts.get(r)) for r in rts}
        wrong = [r for r, why in bad.items() if why]
        if not wrong:
            continue
        why = bad[wrong[0]]
        src = ", ".join(dict.fromkeys(
            f"vLLM {runtimes[r].vllm_version or '?'} of runtime {r!r}" if facts.get(r) is not None
            else f"tunelab's table from {ENUM_SOURCE}" for r in wrong))
        if len(wrong) == len(rts):
            errors.append(f"{field}: {why} ({src})")
        else:
            ok = [r for r in rts if r not in wrong]
            warnings.append(f"{field}: {why} on {src} (accepted by {', '.join(repr(r) for r in ok)}); its trials "
                            "there will fail to boot (invalid_config)")
    e, w = _bad_range_values(plan, runtimes, facts)
    return errors + e, warnings + w


def _range_text(r: Any) -> str:
    parts = [f"low: {r.low}", f"high: {r.high}"] + ([f"step: {r.step}"] if r.step is not None else []) + \
        (["log: true"] if r.log else [])
    return "{" + ", ".join(parts) + "}"


def _bad_range_values(plan: "Plan", runtimes: dict, facts: dict) -> tuple[list[str], list[str]]:
    """The values *inside* each range of ``search.space.engine_args`` that ``vllm serve`` would reject (its ends are
    judged as any value): a float step on an integer option (``max-num-seqs: {low: 2, high: 3, step: 0.5}``
    gives 2.5), a step that skips the choices of an enumerated option, a continuous float range on an integer
    option. One line per range naming the field, the bad values and the fix; an error when no runtime accepts
    them, else a warning (as :func:`bad_engine_arg_values`)."""
    from tunelab.core.engine_arg_values import ENUM_SOURCE, value_problem
    from tunelab.core.search.config_tpe import SearchRange, range_values

    if plan.search is None:
        return [], []
    rts = plan.runtime_names()
    errors: list[str] = []
    warnings: list[str] = []
    for flag, v in plan.search.space.engine_args.items():
        if not isinstance(v, SearchRange) or not rts:
            continue
        vals = range_values(v)
        if vals is None and not v.integer:  # continuous: any number between the ends, so a non-integer among them
            probe = math.floor(v.low) + 0.5
            probe = probe + 1 if probe < v.low else probe
            vals = [probe if probe <= v.high else (v.low + v.high) / 2]
            steps = "takes any number between its ends, e.g."
        else:
            steps = "steps through"
        inner = [x for x in vals or [] if x != v.low and x != v.high]  # the ends are judged as values
        bad = {r: [(x, why) for x in inner if (why := value_problem(flag, x, facts.get(r)))] for r in rts}
        wrong = [r for r in rts if bad[r]]
        if not wrong:
            continue
        shown = bad[wrong[0]]
        listed = ", ".join(f"{x:g}" for x, _ in shown[:5]) + (f" (+{len(shown) - 5} more)" if len(shown) > 5 else "")
        why = shown[0][1]
        fix = ("give integer low, high and step (e.g. step: 1), so that every value is an integer, or list the "
               "values" if "not an integer" in why else
               "choose low, high and step so that every value it steps through is allowed, or list the values")
        src = ", ".join(dict.fromkeys(
            f"vLLM {runtimes[r].vllm_version or '?'} of runtime {r!r}" if facts.get(r) is not None
            else f"tunelab's table from {ENUM_SOURCE}" for r in wrong))
        field = f"search.space.engine_args.{flag}"
        line = f"{field}: the range {_range_text(v)} {steps} {listed}, which `vllm serve` rejects: {why} ({src})"
        if len(wrong) == len(rts):
            errors.append(f"{line}; {fix}")
        else:
            ok = [r for r in rts if r not in wrong]
            warnings.append(f"{line}; accepted by {', '.join(repr(r) for r in ok)}; its trials elsewhere will fail "
                            f"to boot (invalid_config); {fix}")
    return errors, warnings
