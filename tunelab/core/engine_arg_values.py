"""Values of ``vllm serve`` engine args that vLLM would reject, found before any server starts.

A plan's names are checked against the runtime's own parser (``Runtime.serve_flags``, ``plan.unknown_engine_args``);
this module checks the *values*: ``dtype: fp13`` or ``gpu-memory-utilization: 1.5`` would otherwise only fail when
a server boots (``invalid_config``), and in a ``search:`` that is one boot of the budget spent on a typo.

Two sources, in this order:

1. The runtime's facts (``Runtime.serve_choices``: the ``choices`` of each option of the parser vLLM itself builds,
   read by the runtime's own interpreter and cached in ``runtime_facts.json``). Exact for that vLLM version.
2. Otherwise (no registered runtime on this machine, or facts written before choices were read) the tables below:
   :data:`ENUM_CHOICES`, copied from ``vllm serve --help=all`` of vLLM 0.32.0 (the ``choices`` of its parser, as
   ``{a,b,c}`` in the help), and :data:`NUMERIC_RULES`, the type and range each numeric option's help states.

Only values a plan sets are judged: ``null`` and ``false`` omit the flag (``plan`` module docstring), so they are
never wrong. Domain layer: the standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["ENUM_CHOICES", "ENUM_SOURCE", "NUMERIC_RULES", "NumericRule", "value_problem"]

#: Where :data:`ENUM_CHOICES` comes from (named in error messages).
ENUM_SOURCE = "`vllm serve --help=all` of vLLM 0.32.0"

#: Allowed values of the common enumerated ``vllm serve`` options (flag name without dashes -> choices), from
#: ``vllm serve --help=all`` of vLLM 0.32.0 (the parser's ``choices``). A runtime's own facts replace these.
ENUM_CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": ("auto", "bfloat16", "float", "float16", "float32", "half"),
    "kv-cache-dtype": ("auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                       "fp8_per_token_head", "int4_per_token_head", "int8_per_token_head", "nvfp4", "nvfp4_4over6",
                       "nvfp4_ds_mla", "turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                       "turboquant_k8v4", "ultraquant_4bit"),
    "performance-mode": ("balanced", "interactivity", "throughput"),
    "scheduling-policy": ("fcfs", "priority"),
    "prefix-caching-hash-algo": ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
    "runner": ("auto", "draft", "generate", "pooling"),
    "convert": ("auto", "classify", "embed", "none"),
    "mamba-cache-dtype": ("auto", "bfloat16", "float16", "float32"),
    "mamba-ssm-cache-dtype": ("auto", "bfloat16", "float16", "float32"),
    "lora-dtype": ("auto", "bfloat16", "float16"),
    "max-lora-rank": ("1", "8", "16", "32", "64", "128", "256", "320", "512"),
    "logprobs-mode": ("processed_logits", "processed_logprobs", "raw_logits", "raw_logprobs"),
    "expert-placement-strategy": ("linear", "round_robin"),
}


@dataclass(frozen=True)
class NumericRule:
    """The values a numeric option accepts: ``integer`` (else any finite number) in ``[low, high]``, with
    ``low_open`` / ``high_open`` making that end exclusive (None: unbounded). ``human_readable``: vLLM also takes
    a string such as ``32k`` or ``1M`` (and ``auto`` when ``auto_ok``), as for ``max-model-len``."""

    integer: bool
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    human_readable: bool = False
    auto_ok: bool = False

    def describe(self) -> str:
        """The rule in words, e.g. ``an integer >= 1`` or ``a number in (0, 1]``."""
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            rng = f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            rng = f" {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            rng = f" {'<' if self.high_open else '<='} {self.high:g}"
        else:
            rng = ""
        extra = " (or a size such as 32k" + (", or auto)" if self.auto_ok else ")") if self.human_readable else ""
        return kind + rng + extra


#: Type and range of the common numeric ``vllm serve`` options, as their ``--help`` (vLLM 0.32.0) states them.
NUMERIC_RULES: dict[str, NumericRule] = {
    "gpu-memory-utilization": NumericRule(integer=False, low=0, high=1, low_open=True),  # "from 0 to 1"
    "max-num-seqs": NumericRule(integer=True, low=1),
    "max-num-batched-tokens": NumericRule(integer=True, low=1, human_readable=True),
    "max-model-len": NumericRule(integer=True, low=1, human_readable=True, auto_ok=True),
    "tensor-parallel-size": NumericRule(integer=True, low=1),
    "pipeline-parallel-size": NumericRule(integer=True, low=1),
    "data-parallel-size": NumericRule(integer=True, low=1),
    "block-size": NumericRule(integer=True, low=1),
    "cpu-offload-gb": NumericRule(integer=False, low=0),
    "max-num-partial-prefills": NumericRule(integer=True, low=1),
    "long-prefill-token-threshold": NumericRule(integer=True, low=0),
    "stream-interval": NumericRule(integer=True, low=1),
    "seed": NumericRule(integer=True),
}

#: ``32k``, ``1.5M``, ``2G``: vLLM's human-readable integers (``human_readable_int``).
_HUMAN_INT = re.compile(r"^\d+(\.\d+)?[kKmMgGtT]?$")


def _numeric_problem(value: Any, rule: NumericRule) -> str | None:
    if isinstance(value, str):
        v = value.strip()
        if rule.human_readable and (_HUMAN_INT.match(v) or (rule.auto_ok and v.lower() == "auto")):
            return None
        try:
            value = float(v) if not rule.integer else int(v)
        except ValueError:
            return f"{value!r} is not {rule.describe()}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not {rule.describe()}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not {rule.describe()}"
    if rule.integer and not (isinstance(value, int) or float(value).is_integer()):
        return f"{value!r} is not {rule.describe()}"
    if rule.low is not None and (value <= rule.low if rule.low_open else value < rule.low):
        return f"{value!r} is out of range: {rule.describe()}"
    if rule.high is not None and (value >= rule.high if rule.high_open else value > rule.high):
        return f"{value!r} is out of range: {rule.describe()}"
    return None


def value_problem(flag: str, value: Any, facts_choices: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """Why ``vllm serve --<flag> <value>`` would be rejected, or None when it is accepted (or not judged).

    Args:
        flag: the option name without dashes, normalised (``kv-cache-dtype``).
        value: the plan's value (YAML scalar). ``None`` and ``False`` omit the flag and are never wrong; ``True``
            passes the bare flag, which an option taking a value rejects.
        facts_choices: the runtime's facts (``Runtime.serve_choices``: option name -> its allowed values as
            strings, for every option that has choices), or None when they were not read: then
            :data:`ENUM_CHOICES` decides. Either way an option without choices is checked by :data:`NUMERIC_RULES`.

    Returns:
        One phrase naming the bad value and what is allowed, e.g. ``'fp13' is not one of: auto, bfloat16, ...``.
    """
    if value is None or value is False:
        return None
    allowed = (facts_choices.get(flag) if facts_choices is not None else ENUM_CHOICES.get(flag))
    if allowed is not None:
        if value is True or str(value) not in allowed:
            return f"{value!r} is not one of: {', '.join(allowed)}"
        return None
    rule = NUMERIC_RULES.get(flag)
    if rule is None:
        return None
    return _numeric_problem(value, rule)
