"""Typed records: one per warehouse table, the one source of its columns.

Each record (a pydantic model) lists every column of one table with its type, unit and where its value comes
from. From it derive: the Parquet schema of a result bundle's table (:func:`arrow_schema`: column types are
fixed, never inferred from the values), the columns the loader accepts, ``tasks.metrics.MEASUREMENT_COLUMNS``
and ``REQUEST_COLUMNS``, the metric lists of ``warehouse.compare`` and the quality suites' required columns.
The SQL schema (``tunelab/warehouse/schema/*.sql`` after all migrations) must have the same columns with the
same types; ``tests/test_records.py`` fails when a column exists in one of {record, bundle written by the trial
flow, SQL schema} and not in the others.

Adding a column: add the field here (type, ``description`` with its unit and source), add a new numbered
migration ``ALTER TABLE ... ADD COLUMN``, and set the value where the row is built.

Ids come from one function each: :func:`trial_id`, :func:`sweep_id`, :func:`import_sweep_id`,
:func:`measurement_key` (the config key is ``plan.config_key``).

Units: seconds in ``*_s``, epoch seconds in ``*_ts``, rates in ``*_per_s``, memory in MiB/GiB as named,
tokens as integers.

Domain layer: imports only pydantic, pyarrow, the standard library and other domain modules (load_profiles).
"""

from __future__ import annotations

import datetime as _dt
import json
import secrets
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Mapping

import pyarrow as pa
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from tunelab.core.load_profiles import LOAD_KINDS

__all__ = [
    "LATENCIES",
    "LATENCY_COLUMNS",
    "PERCENTILES",
    "RECORDS",
    "BootPhaseRow",
    "GpuSample",
    "Measurement",
    "MeasurementKey",
    "QualityCheck",
    "Record",
    "RecordError",
    "Request",
    "ServerMetric",
    "SlaSearch",
    "Sweep",
    "TrialRow",
    "WindowAggregate",
    "WindowDiagnosis",
    "arrow_schema",
    "columns",
    "frame",
    "import_sweep_id",
    "measurement_key",
    "pick",
    "record_for",
    "sql_type",
    "sweep_id",
    "to_row",
    "trial_id",
]


# -- column types --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Col:
    """Storage of one column: its Arrow type in a bundle and its type in DuckDB (``duckdb_columns().data_type``)."""

    arrow: pa.DataType
    sql: str


def _json_text(value: Any) -> Any:
    """dict/list -> JSON text (sorted keys), as the JSON columns are stored; text and None pass through."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


_TS = _Col(pa.timestamp("us", tz="UTC"), "TIMESTAMP WITH TIME ZONE")

Text = Annotated[str, _Col(pa.string(), "VARCHAR")]
Int32 = Annotated[int, _Col(pa.int32(), "INTEGER")]
Int64 = Annotated[int, _Col(pa.int64(), "BIGINT")]
Float = Annotated[float, _Col(pa.float64(), "DOUBLE")]
Bool = Annotated[bool, _Col(pa.bool_(), "BOOLEAN")]
Timestamp = Annotated[_dt.datetime, _TS]
Date = Annotated[_dt.date, _Col(pa.date32(), "DATE")]
JsonText = Annotated[str, BeforeValidator(_json_text), _Col(pa.string(), "JSON")]
FloatList = Annotated[list[float], _Col(pa.list_(pa.float64()), "DOUBLE[]")]


class RecordError(ValueError):
    """A row does not fit its record: an unknown column or a value of the wrong type (the message names the
    table, the column and the fix)."""


class Record(BaseModel):
    """Base of the table records. ``TABLE``: the warehouse table; ``BUNDLE``: the bundle table (file) name."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    TABLE: ClassVar[str]
    BUNDLE: ClassVar[str]

    def update(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """Set several columns at once (``values`` then ``more``), each validated like an assignment.

        Raises:
            RecordError: a name that is not a column of this record.
            pydantic.ValidationError: a value of the wrong type.
        """
        for key, value in {**(values or {}), **more}.items():
            if key not in type(self).model_fields:
                raise RecordError(f"{key!r} is not a column of {self.TABLE} (tunelab/core/records.py {type(self).__name__})")
            setattr(self, key, value)


def _f(description: str, default: Any = None) -> Any:
    return Field(default, description=description)


# -- sweeps --------------------------------------------------------------------------------------------------
class Sweep(Record):
    """One execution of a plan (``sweeps``): built by ``flows.sweep`` (``vllm_bench_import`` for imports)."""

    TABLE: ClassVar[str] = "sweeps"
    BUNDLE: ClassVar[str] = "sweep"

    sweep_id: Text = Field(description="Id of the sweep, see :func:`sweep_id` / :func:`import_sweep_id`.")
    plan_name: Text = Field(description="The plan's ``name``.")
    plan_yaml: Text | None = _f("The plan file as given, for re-running.")
    host: Text | None = _f("Host name the sweep ran on (socket.gethostname()).")
    started_at: Timestamp | None = _f("When the sweep started (UTC).")
    finished_at: Timestamp | None = _f("When the sweep finished (UTC); None in bundles written before the end.")
    tunelab_version: Text | None = _f("tunelab.__version__ of the orchestrator.")
    source: Text | None = _f("'tunelab' or 'vllm-bench-import' (the SQL default is 'tunelab').", "tunelab")
    ab_baseline: Text | None = _f("replicates: auto: the baseline config's label (A) (flows.ab_auto; 009).")
    ab_candidate: Text | None = _f("replicates: auto: the candidate config's label (B) (009).")
    ab_call: Text | None = _f("better | worse | equivalent | mixed | undecided: B against A over the deciding "
                              "cells (009).")
    ab_stop_reason: Text | None = _f("decided | budget_boots | budget_gpu_minutes | max_pairs | unusable_pairs | "
                                     "no_pairs (009).")
    ab_boots: Int32 | None = _f("Boots the A/B started, both sides (009).")
    ab_pairs: Int32 | None = _f("Usable A/B pairs analysed (009).")
    ab_gpu_minutes: Float | None = _f("Device-minutes of the A/B's trial wall time (009).")
    ab_verdicts: JsonText | None = _f("Per deciding cell: workload, load, metric, call, rel_change, ci_low, ci_high "
                                      "(always-valid interval), mde, n_pairs, alpha, method; JSON list (009).")
    search_objective: JsonText | None = _f("search: {metric, direction, workload, load, slo, slo_percentile} of the "
                                           "plan's objective (tunelab.core.search.config_tpe; 018).")
    search_space: JsonText | None = _f("search: the plan's search.space, JSON (018).")
    search_stop_reason: Text | None = _f("search: budget_boots | budget_gpu_minutes | space_exhausted (018).")
    search_boots: Int32 | None = _f("search: boots used, the default's and the memory walk-downs' included (018).")
    search_grid_size: Int64 | None = _f("search: configs in the full grid of the space; None when continuous (018).")
    search_gpu_minutes: Float | None = _f("search: device-minutes of its trials (slot taken -> trial end) (018).")
    search_best_config_key: Text | None = _f("search: config_key of the best config meeting the SLO; None: none (018).")


# -- trials --------------------------------------------------------------------------------------------------
class TrialRow(Record):
    """One boot of one engine config on one runtime (``trials``): built by ``flows.trial`` (``trial_row_base``
    before boot, then boot/measure/teardown results); version columns are filled by the loader from
    ``vllm_version`` (``warehouse.versions.version_columns``) when None."""

    TABLE: ClassVar[str] = "trials"
    BUNDLE: ClassVar[str] = "trial"

    trial_id: Text = Field(description="Id of the trial, see :func:`trial_id`.")
    sweep_id: Text = Field(description="The sweep's id.")
    config_key: Text = Field(description="plan.config_key: hash of model + engine args + env (not the runtime).")
    config_label: Text | None = _f("Human label of the config, e.g. 'enforce-eager=true' (plan.Trial.label).")
    replicate: Int32 = Field(description="Boot number of this config in the sweep (0-based).")
    runtime_name: Text | None = _f("The plan's runtime name the server ran on.")
    vllm_version: Text | None = _f("vLLM version string as the runtime reports it (else the boot log).")
    vllm_release: Text | None = _f("Release part, e.g. '0.32.0' (loader, warehouse.versions).")
    vllm_release_major: Int32 | None = _f("Major release number (loader).")
    vllm_release_minor: Int32 | None = _f("Minor release number (loader).")
    vllm_release_patch: Int32 | None = _f("Patch release number (loader).")
    vllm_pre: Text | None = _f("Pre-release, e.g. 'rc1'; None for a final release (loader).")
    vllm_dev: Int32 | None = _f("Dev number; None if none (loader).")
    vllm_commit: Text | None = _f("Git commit from a '+g<sha>' local part (loader).")
    vllm_local: Text | None = _f("Full local suffix ('cpu', 'cu130', ...) (loader).")
    torch_version: Text | None = _f("torch version of the runtime.")
    transformers_version: Text | None = _f("transformers version of the runtime.")
    fastokens_version: Text | None = _f("fastokens version of the runtime.")
    cuda_version: Text | None = _f("CUDA version of the host (NVML inventory).")
    driver_version: Text | None = _f("NVIDIA driver version (NVML inventory).")
    gpu_name: Text | None = _f("GPU name; 'cpu' when no GPU.")
    gpu_index: Int32 | None = _f("NVML index of the (first) GPU; None on CPU.")
    model: Text | None = _f("Model id of the plan.")
    engine_args: JsonText | None = _f("{flag: value} passed to vllm serve, as JSON text.")
    env: JsonText | None = _f("The server's env on top of the runtime's (secrets redacted), as JSON text.")
    env_not_applied: JsonText | None = _f("Env vars of the plan that vLLM reported as unknown, JSON list.")
    flag_proof: JsonText | None = _f("Positive proof per env flag, read from the live server (tasks.flag_proof): "
                                     "{flag: {value, status: proven | contradicted | unprovable, evidence}}; e.g. "
                                     "VLLM_USE_FASTOKENS proven by fastokens' extension mapped in the API-server "
                                     "processes (021).")
    effective_config: JsonText | None = _f("What vLLM reports it used (boot log), as JSON text.")
    command: Text | None = _f("The vllm serve command line, secrets redacted.")
    status: Text = Field(description="ok | boot_failed | failed | cancelled | gpu_busy | incomplete (killed after "
                                     "some windows, which its bundle kept).")
    failure_class: Text | None = _f("oom_weights | oom_kv_cache | ... | measurement_error (tasks.bootlog).")
    failure_reason: Text | None = _f("Why the trial failed, whole (terminal output shortens it).")
    eager_diagnosis: Text | None = _f("Result of re-booting a failed config with --enforce-eager.")
    boot_s: Float | None = _f("Popen -> ready (health 200 + one real completion), seconds.")
    compile_cache: Text | None = _f("cold | warm (boot log).")
    teardown_s: Float | None = _f("Teardown of the process group, seconds.")
    started_at: Timestamp | None = _f("When the trial started (UTC).")
    finished_at: Timestamp | None = _f("When the trial's bundle was written (UTC).")
    load_avg_1m: Float | None = _f("Host 1-minute load average at the start (noise context).")
    quality_verdict: Text | None = _f("pass | warn | fail | unvalidated (tasks.quality).")
    log_path: Text | None = _f("The server's log file.")
    vllm_version_key: Text | None = _f("PEP 440 sort key of the release (loader; migration 002, 006).")
    gpu_clean_at_boot: Bool | None = _f("GPU free of foreign processes at boot; None on CPU (migration 003).")
    foreign_gpu_processes: Int32 | None = _f("Compute processes on the GPU not started by tunelab (003).")
    gpu_baseline_excess_mib: Float | None = _f("Used GPU memory above the sweep's baseline at boot, MiB (003).")
    teardown_clean: Bool | None = _f("False: the group survived SIGKILL or the port stayed busy (003).")
    health_s: Float | None = _f("Popen -> first /health 200, seconds (003).")
    measurement_notes: Text | None = _f("What the measurement noticed about its windows, one per line (004).")
    vllm_public_version: Text | None = _f("Release group of the build, '0.26.0' for '0.26.0+empty' (loader, 006).")
    vllm_platform: Text | None = _f("Build target from the local part: cpu, cu128, ... (loader, 006).")
    vllm_build_date: Date | None = _f("Date from a local segment dYYYYMMDD (loader, 006).")
    vllm_untrusted: Text | None = _f("Why the version cannot place the build among releases (loader, 006).")
    host: Text | None = _f("Host the trial ran on (flows.devices.host_name: TUNELAB_HOST or the host name; 012).")
    gpu_uuids: Text | None = _f("NVML UUIDs of the trial's GPUs, comma-separated, in gpu order (012).")
    boot_attempts: Int32 | None = _f("Boots started: 1, or 2 when a transient failure was retried (012).")
    boot_retry_reason: Text | None = _f("'failure_class: reason' of the transient boot failure that was retried (012).")
    failure_retryable: Bool | None = _f("The failure can pass on another boot (transient, timeout, unclean "
                                        "device): it says nothing about the config (012).")
    workloads: JsonText | None = _f("The plan's workloads as measured: JSON list of {name, type, parameters, "
                                    "file_sha256} (tunelab.core.workloads; sha256 of a dataset or trace file read; 014).")
    dataset_filters: JsonText | None = _f("Dataset workloads: JSON list of {name, path, file_sha256, rule, records, "
                                          "used, skipped: {reason: count}}: the records of the file the trial could "
                                          "draw from and why the others were skipped (tunelab.core.workloads."
                                          "DATASET_RULE; 022). None: no dataset workload.")
    search_role: Text | None = _f("search: default (the plan's base config) | search (a TPE suggestion) | "
                                  "walk_down (a smaller footprint after a memory failure) (flows.record_search; 018).")
    search_trial: Int32 | None = _f("search: the optuna trial number of the suggestion; None for the default (018).")
    search_state: Text | None = _f("search: complete | infeasible (SLO not met) | pruned | fail (018).")
    search_value: Float | None = _f("search: the objective at its cell, mean over the boot's windows (018).")
    search_slo_violation: Float | None = _f("search: largest relative excess of a window percentile over an SLO "
                                            "bound, mean of windows; <= 0: the SLO held (018).")
    search_walk_down: Text | None = _f("search: what the memory walk-down lowered, e.g. 'max-num-seqs 256 -> 128' "
                                       "(018).")
    search_walked_from: Text | None = _f("search: config_key of the config whose memory failure this boot walked "
                                         "down from (018).")
    search_reason: Text | None = _f("search: why the search booted this config when an earlier boot's diagnosis "
                                    "chose it (search.guide), e.g. 'diagnosis: api_server flagged in 2/2 windows of "
                                    "boot 1 (default) -> api-server-count 1 -> 2'; None: TPE's own suggestion, the "
                                    "default, a walk-down (020).")


# -- boot phases ---------------------------------------------------------------------------------------------
class BootPhaseRow(Record):
    """One phase of a trial's boot (``boot_phases``), parsed from the server log by ``tasks.bootlog``."""

    TABLE: ClassVar[str] = "boot_phases"
    BUNDLE: ClassVar[str] = "boot_phases"

    trial_id: Text = Field(description="The trial's id.")
    phase: Text = Field(description="weights_load | model_load | torch_compile | graph_capture | kv_cache | ...")
    seconds: Float | None = _f("Duration of the phase, seconds.")
    gib: Float | None = _f("Memory the phase reports, GiB.")
    tokens: Int64 | None = _f("Tokens the phase reports (KV cache size).")
    detail: Text | None = _f("The log line's detail.")


# -- measurements --------------------------------------------------------------------------------------------
#: Percentiles reported for every latency (``*_p50_s`` ... ``*_p99_s``).
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
#: The latencies with mean and percentiles in ``measurements``.
LATENCIES: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
#: Their columns in ``measurements``: ``<latency>_<mean|p50|...>_s`` in this order, seconds.
LATENCY_COLUMNS: tuple[str, ...] = tuple(
    f"{m}_{s}_s" for m in LATENCIES for s in ("mean", *(f"p{p}" for p in PERCENTILES))
)
_LATENCY_TEXT = {
    "ttft": "TTFT (send -> first chunk with text)",
    "tpot": "TPOT ((E2EL - TTFT) / (output_tokens - 1))",
    "itl": "ITL (gaps between content chunks, pooled over ok requests)",
    "e2el": "E2EL (send -> last chunk with text)",
}


class MeasurementKey(Record):
    """The key of a measured window: trial x workload x load level x repeat (see :func:`measurement_key`)."""

    TABLE: ClassVar[str] = "measurements"
    BUNDLE: ClassVar[str] = "measurements"

    trial_id: Text = Field(description="The trial's id.")
    workload: Text = Field(description="The plan's workload name.")
    load_kind: Text = Field(description="concurrency | rate.")
    load_value: Float = Field(description="Target concurrency, or requests/s for a rate.")
    repeat: Int32 = Field(description="Repeat number of the window at this level (0-based).")


class _Throughput(MeasurementKey):
    num_requests: Int32 | None = _f("Measured requests of the window.")
    completed: Int32 | None = _f("Requests that were ok (tasks.metrics.derive_request).")
    failed: Int32 | None = _f("Requests that failed.")
    duration_s: Float | None = _f("First send -> last end of the measured requests, seconds.")
    request_throughput_per_s: Float | None = _f("completed / duration_s.")
    output_tokens_per_s: Float | None = _f("Output tokens of ok requests / duration_s.")
    total_tokens_per_s: Float | None = _f("(Prompt + output tokens of ok requests) / duration_s.")
    goodput_per_s: Float | None = _f("Requests/s meeting every SLO of the plan (vllm bench --goodput rule).")
    achieved_concurrency: Float | None = _f("sum(E2EL to the stream's end) / duration_s (Little's law).")
    peak_in_flight: Int32 | None = _f("Most requests in flight at once in the window (005).")
    in_flight_while_sending: Float | None = _f("Mean in flight from the first to the last send (005).")
    total_input_tokens: Int64 | None = _f("Prompt tokens of ok requests (server usage).")
    total_output_tokens: Int64 | None = _f("Output tokens of ok requests (server usage).")


_Latencies = create_model(
    "_Latencies",
    __base__=_Throughput,
    **{
        col: (Float | None, _f(f"{col.split('_')[1]} of {_LATENCY_TEXT[col.split('_')[0]]} over ok requests, s."))
        for col in LATENCY_COLUMNS
    },
)


class WindowAggregate(_Latencies):  # type: ignore[misc,valid-type]
    """The columns ``tasks.metrics.aggregate`` computes from a window's requests (key included)."""

    client_cpu_frac: Float | None = _f("Load generator CPU time / wall time.")
    client_bound: Bool | None = _f("The client's own evidence says it could not keep up (tasks.metrics).")
    steady_state: Bool | None = _f("Throughputs and latencies count only the steady part (tasks.metrics."
                                   "steady_interval); False: the window had none, all of it counts; None: "
                                   "whole window, rows before 008 (008).")
    steady_s: Float | None = _f("Seconds of the steady part: the rates' denominator when steady_state (008).")
    ramp_s: Float | None = _f("Seconds from the first send to the steady part (ramp-up), excluded (008).")
    drain_s: Float | None = _f("Seconds from the steady part's end to the window's end (drain), excluded (008).")
    steady_requests: Int32 | None = _f("Requests sent in the steady part: the ones whose latencies count (008).")
    ramp_requests: Int32 | None = _f("Requests sent before the steady part, left out of the latencies (008).")
    drain_requests: Int32 | None = _f("Requests sent after the steady part, left out of the latencies (008).")


class Measurement(WindowAggregate):
    """One measured window (``measurements``): :class:`WindowAggregate` plus what the load generator
    (``tasks.loadgen.LevelResult``) and ``tasks.measure`` record about the window (migrations 004, 005)."""

    rx_stamps: Text | None = _f("'kernel' | 'read' | 'mixed': how receive times were taken (004).")
    read_delay_p99_s: Float | None = _f("p99 of read time - kernel receive time, seconds (004).")
    loop_lag_p99_s: Float | None = _f("p99 event-loop wake-up lateness of the busiest load process, s (004).")
    same_read_itl_frac: Float | None = _f("Inter-chunk gaps whose two chunks came in one read (004).")
    load_processes: Int32 | None = _f("Load-generator processes of the window (plan.load_processes) (004).")
    warmup_requests: Int32 | None = _f("Warm-up requests sent before this level's windows (005).")
    warmup_peak_in_flight: Int32 | None = _f("Most warm-up requests in flight at once (005).")
    compile_during_window: Bool | None = _f("Server log shows compilation during the window; None: not read (005).")
    compile_log_lines: Text | None = _f("Those log lines, one per line, at most 20 (005).")
    window_duration_s: Float | None = _f("The plan's window duration, seconds (sends stop then); None: a window of "
                                         "a number of requests (008).")
    stagger_s: Float | None = _f("Closed loop: the slots' first requests were spread over this many seconds (slot k "
                                 "of c at k/c of it; plan.closed_loop_start 'staggered': one warm-up request's "
                                 "duration, so equal-length requests do not run in lockstep waves); 0: all at once; "
                                 "None: an open loop or rows before 024 (024).")
    host_other_cpu_frac: Float | None = _f("CPU time of processes not tunelab's / the host's CPU time in the window "
                                           "(0..1; tasks.host_load.covariates; 011).")
    host_steal_frac: Float | None = _f("CPU time stolen by the hypervisor / the host's CPU time in the window (011).")
    host_cpu_mhz: Float | None = _f("Mean CPU frequency at the window's end, MHz; None: not readable (011).")
    server_cpus: Text | None = _f("The server's CPUs (plan cpu_affinity.server, e.g. '0-7'); None: not pinned (011).")
    load_cpus: Text | None = _f("The load generator's CPUs (plan cpu_affinity.load); None: not pinned (011).")
    server_process_cpu: JsonText | None = _f("CPU of the server's processes in the window by role: {api_server | "
                                             "engine_core | worker | other: {cpu, busiest_thread, processes}}, cores "
                                             "(CPU s / wall s; tasks.host_load.server_process_cpu); None: not "
                                             "sampled (016).")
    sla_search_window: Bool | None = _f("True: a window of the plan's sla_search (tasks.sla_search), judged by the "
                                        "search's SLO bounds, left out of the quality gate's load checks and of "
                                        "compare / A/B level means; None: one of the plan's own windows (019).")
    prefix_cache_reset: Text | None = _f("Outcome of POST /reset_prefix_cache right before the window (tasks.measure."
                                         "reset_prefix_cache): 'ok' | 'not_taken: ...' (200 with success=false) | "
                                         "'unavailable: HTTP <code>' | 'error: ...' (021).")
    unique_prompts: Bool | None = _f("True: no two prompts of the window share a prefix by design (generated prompts, "
                                     "no shared_prefix_tokens, not multi-turn): prefix-cache hits mean the cache was "
                                     "not cold (quality check cache_not_cold) (021).")
    control_retries: Int32 | None = _f("Control calls (/tokenize, /metrics, cache reset) retried on a fresh "
                                       "connection since the previous window (tasks.loadgen.control) (021).")
    overloaded: Bool | None = _f("Open loop: the server fell behind the arrivals (completions behind arrivals, "
                                 "in-flight and TTFT growing over the window; tasks.metrics.overload); left out of "
                                 "comparisons; None: not an open-loop window (021).")


# -- requests ------------------------------------------------------------------------------------------------
class Request(Record):
    """One measured request (``requests``), from ``tasks.metrics.derive_request``. Key: measurement key +
    ``request_index`` (unique per bundle, checked by the bundle writer; not indexed in SQL)."""

    TABLE: ClassVar[str] = "requests"
    BUNDLE: ClassVar[str] = "requests"

    trial_id: Text = Field(description="The trial's id.")
    workload: Text = Field(description="The plan's workload name.")
    load_kind: Text = Field(description="concurrency | rate.")
    load_value: Float = Field(description="Target concurrency, or requests/s.")
    repeat: Int32 = Field(description="Repeat number of the window (0-based).")
    request_index: Int32 = Field(description="Index of the request in its window.")
    ok: Bool = Field(description="The request succeeded (tasks.metrics.derive_request).")
    error: Text | None = _f("Reason of a failed request.")
    send_ts: Float | None = _f("Epoch seconds of the send.")
    first_token_ts: Float | None = _f("Epoch s of the first chunk carrying generated tokens of any kind (content, "
                                      "reasoning, tool call).")
    end_ts: Float | None = _f("Epoch s of the stream's last byte (after the usage chunk and [DONE]).")
    last_token_ts: Float | None = _f("Epoch s of the last chunk carrying generated text: the request's end (005).")
    chunk_offsets_s: FloatList | None = _f("Every token chunk (content, reasoning, tool call), seconds after send_ts.")
    prompt_tokens: Int32 | None = _f("Prompt tokens from the server's usage.")
    output_tokens: Int32 | None = _f("Output tokens from the server's usage.")
    requested_output_tokens: Int32 | None = _f("max_tokens sent.")
    finish_reason: Text | None = _f("The server's finish_reason.")
    ttft_s: Float | None = _f("TTFT, seconds.")
    tpot_s: Float | None = _f("TPOT, seconds.")
    e2el_s: Float | None = _f("E2EL (to the last token), seconds.")
    itl_mean_s: Float | None = _f("Mean gap between token chunks, seconds.")
    first_content_ts: Float | None = _f("Epoch s of the first chunk with visible content (after any reasoning) (013).")
    ttfc_s: Float | None = _f("Time to first visible content, seconds: first_content_ts - send_ts; None when the "
                              "whole budget went to reasoning (013).")
    reasoning_chunks: Int32 | None = _f("Chunks whose delta carried reasoning / reasoning_content (013).")
    session_index: Int32 | None = _f("Multi-turn workloads: the request's session in its window (0-based) (015).")
    turn: Int32 | None = _f("Multi-turn workloads: the request's turn in its session (0-based) (015).")
    cached_prompt_tokens: Int32 | None = _f("Prompt tokens served from the prefix cache (usage.prompt_tokens_details."
                                            "cached_tokens; needs vllm serve --enable-prompt-tokens-details) (015).")
    first_chunk_tokens: Int32 | None = _f("Tokens in the first token chunk (the server's usage on it, stream_options."
                                          "continuous_usage_stats); TPOT divides by output_tokens minus these. None: "
                                          "the server did not say, TPOT divides by output_tokens - 1 (021).")


# -- server metrics, GPU samples, quality checks -------------------------------------------------------------
class ServerMetric(Record):
    """One vLLM ``/metrics`` value over a window (``server_metrics``), from ``tasks.server_metrics``."""

    TABLE: ClassVar[str] = "server_metrics"
    BUNDLE: ClassVar[str] = "server_metrics"

    trial_id: Text = Field(description="The trial's id.")
    workload: Text = Field(description="The plan's workload name.")
    load_kind: Text = Field(description="concurrency | rate.")
    load_value: Float = Field(description="Target concurrency, or requests/s.")
    repeat: Int32 = Field(description="Repeat number of the window (0-based).")
    metric: Text = Field(description="tunelab's canonical name, e.g. preemptions, kv_cache_usage.")
    kind: Text = Field(description="counter_delta | histogram | gauge.")
    value: Float | None = _f("Counter delta, gauge value or histogram mean over the window.")
    count: Float | None = _f("Histogram observations in the window.")
    sum: Float | None = _f("Histogram sum in the window.")
    source_name: Text | None = _f("The vLLM metric name actually read.")
    null_reason: Text | None = _f("Why value is None (metric absent in this version, ...).")


class GpuSample(Record):
    """One NVML sample during the measurement (``gpu_samples``), from ``tasks.gpu.GpuSampler``."""

    TABLE: ClassVar[str] = "gpu_samples"
    BUNDLE: ClassVar[str] = "gpu_samples"

    trial_id: Text = Field(description="The trial's id.")
    ts: Float = Field(description="Epoch seconds of the sample.")
    gpu_index: Int32 = Field(description="NVML index.")
    memory_used_mib: Float | None = _f("Used GPU memory, MiB.")
    utilization_pct: Float | None = _f("GPU utilization, percent.")
    sm_clock_mhz: Float | None = _f("SM clock, MHz.")
    mem_clock_mhz: Float | None = _f("Memory clock, MHz.")
    power_w: Float | None = _f("Power draw, W.")
    temperature_c: Float | None = _f("Temperature, degrees C.")
    throttle_reasons: Int64 | None = _f("NVML clock-event reason bits.")


class QualityCheck(Record):
    """One expectation result (``quality_checks``), from ``tasks.quality.validate_trial``."""

    TABLE: ClassVar[str] = "quality_checks"
    BUNDLE: ClassVar[str] = "quality_checks"

    trial_id: Text = Field(description="The trial's id.")
    suite: Text = Field(description="Suite name (tasks.quality.CHECKS).")
    expectation: Text = Field(description="Check name (tasks.quality.CHECKS).")
    success: Bool | None = _f("Passed; None: skipped.")
    severity: Text | None = _f("fail | warn.")
    observed: Text | None = _f("What was observed, as text.")
    threshold: Text | None = _f("The limit, as text.")
    detail: Text | None = _f("What was checked, and the failing rows.")
    rule_version: Int32 | None = _f("Version of the quality rules that judged this row (quality_thresholds."
                                    "RULES_VERSION); None: judged before versions were stamped (021).")


class WindowDiagnosis(Record):
    """One bottleneck check of one measured window (``window_diagnoses``), from ``tunelab.core.bottleneck_rules`` (checks,
    thresholds) via ``tasks.bottleneck_evidence.window_diagnoses``: one row per window and bottleneck, flagged or not (016)."""

    TABLE: ClassVar[str] = "window_diagnoses"
    BUNDLE: ClassVar[str] = "window_diagnoses"

    trial_id: Text = Field(description="The trial's id.")
    workload: Text = Field(description="The plan's workload name.")
    load_kind: Text = Field(description="concurrency | rate.")
    load_value: Float = Field(description="Target concurrency, or requests/s.")
    repeat: Int32 = Field(description="Repeat number of the window (0-based).")
    bottleneck: Text = Field(description="api_server | kv_cache | prefill_interference | client | gpu_floor "
                                         "(diagnosis.BOTTLENECKS).")
    flagged: Bool | None = _f("The evidence crosses the check's thresholds; False: it does not; None: evidence "
                              "missing (no GPU, /metrics not read, processes not sampled).")
    metric: Text | None = _f("The deciding figure's name, e.g. api_server_busiest_thread (cores), preemptions, "
                             "itl_p99_over_p50, client_cpu_frac, tpot_over_floor.")
    value: Float | None = _f("The deciding figure's value, in its unit.")
    threshold: Float | None = _f("The threshold it is compared with (diagnosis constants).")
    summary: Text | None = _f("One line of evidence figures, for reports.")
    evidence: JsonText | None = _f("Every figure the check used, {name: value}, JSON.")
    remedy: Text | None = _f("What to try (diagnosis.REMEDIES).")
    sources: Text | None = _f("Where the figures come from (vLLM metric names, /proc, NVML, client stamps).")


class SlaSearch(Record):
    """The SLA search of one trial and workload (``sla_searches``): the highest load at which the plan's ``slo:``
    held on this server, from ``tunelab.core.search.sla.search`` via ``tasks.sla_search`` (plan ``sla_search:``; 017).
    Its windows are ordinary ``measurements`` rows at their load levels."""

    TABLE: ClassVar[str] = "sla_searches"
    BUNDLE: ClassVar[str] = "sla_searches"

    trial_id: Text = Field(description="The trial's id.")
    workload: Text = Field(description="The plan's workload name.")
    load_kind: Text = Field(description="concurrency | rate: what was searched.")
    verdict: Text = Field(description="found (max_load passed, first_fail failed, within the resolution) | "
                                      "met_at_max (the spec's max passed) | none (the lowest level failed) | "
                                      "interrupted (cut short by a cancel or an error: max_load / first_fail "
                                      "are the bracket so far, not narrowed to the resolution).")
    max_load: Float | None = _f("Highest level counted as meeting the SLO (concurrency or requests/s); None: none.")
    max_load_shown: Bool | None = _f("max_load's upper bounds were under every limit (True), or the level stayed "
                                     "undecided at the window cap and its point estimate was under (False).")
    first_fail: Float | None = _f("Lowest level counted as failing the SLO; None: met_at_max.")
    nearest_load: Float | None = _f("verdict none: the level tried closest to its limits (largest SLO ratio "
                                    "smallest).")
    goodput_per_s: Float | None = _f("Mean goodput of max_load's windows, requests/s meeting every slo: bound.")
    request_throughput_per_s: Float | None = _f("Mean completed requests/s of max_load's windows.")
    output_tokens_per_s: Float | None = _f("Mean output tokens/s of max_load's windows.")
    knee_load: Float | None = _f("Knee of the latency-throughput curve of the levels tried (Kneedle: max of scaled "
                                 "throughput - scaled SLO ratio; docs/sla_search.md); None: under 3 levels.")
    knee_request_throughput_per_s: Float | None = _f("Mean completed requests/s at the knee.")
    limits: JsonText | None = _f("The metrics judged and their limits, {ttft_p99_s: 0.5, error_rate: 0.01}, JSON.")
    spec: JsonText | None = _f("The plan's sla_search (start, max, growth, resolution, windows, percentile, "
                               "confidence), JSON.")
    levels: JsonText | None = _f("Every level in the order tried: level, windows, verdict (pass | fail | "
                                 "undecided), counted_as, mean throughputs, per metric centre/low/high; JSON list.")
    levels_tried: Int32 | None = _f("Levels tried.")
    windows: Int32 | None = _f("Measured windows of the search.")
    summary: Text | None = _f("One line, as the sweep report prints it.")


#: bundle table name -> record, in bundle order (``bundle.BUNDLE_TABLES``).
RECORDS: dict[str, type[Record]] = {
    r.BUNDLE: r for r in (TrialRow, Sweep, BootPhaseRow, Measurement, Request, ServerMetric, GpuSample, QualityCheck,
                          WindowDiagnosis, SlaSearch)
}


# -- derived views -------------------------------------------------------------------------------------------
def record_for(table: str) -> type[Record]:
    """The record of a bundle table name (``trial``) or warehouse table name (``trials``).

    Raises:
        RecordError: no record has that name.
    """
    for r in RECORDS.values():
        if table in (r.BUNDLE, r.TABLE):
            return r
    raise RecordError(f"no record for table {table!r}; known: {sorted(RECORDS)}")


def columns(record: type[Record]) -> tuple[str, ...]:
    """The record's columns in order."""
    return tuple(record.model_fields)


def pick(record: type[Record], *names: str) -> tuple[str, ...]:
    """``names``, checked to be columns of ``record`` (for column lists kept elsewhere, e.g. a check's
    required columns).

    Raises:
        RecordError: a name is not a column of the record.
    """
    unknown = [n for n in names if n not in record.model_fields]
    if unknown:
        raise RecordError(f"{unknown} are not columns of {record.TABLE} (tunelab/core/records.py {record.__name__})")
    return tuple(names)


def _col(record: type[Record], name: str) -> _Col:
    field = record.model_fields[name]
    # ``Text | None`` keeps the Annotated metadata inside the Optional; ``Text`` puts it on the field.
    candidates = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        candidates.extend(getattr(arg, "__metadata__", ()))
    for m in candidates:
        if isinstance(m, _Col):
            return m
    raise RecordError(f"{record.__name__}.{name} has no column type (use one of the types of tunelab/core/records.py)")


def sql_type(record: type[Record], name: str) -> str:
    """DuckDB type of a column, as ``duckdb_columns().data_type`` names it (``VARCHAR``, ``DOUBLE[]``, ...)."""
    return _col(record, name).sql


def arrow_schema(record: type[Record], names: list[str] | tuple[str, ...] | None = None) -> pa.Schema:
    """The Arrow schema of the record's columns (all, or ``names`` in that order): the type a bundle's
    Parquet file has for each column. Every field is nullable (NOT NULL is enforced by the warehouse).

    Raises:
        RecordError: a name is not a column of the record.
    """
    names = columns(record) if names is None else pick(record, *names)
    return pa.schema([pa.field(n, _col(record, n).arrow, nullable=True) for n in names])


def to_row(record: type[Record], row: Mapping[str, Any] | Record, *, full: bool = True) -> dict[str, Any]:
    """Validate one row against its record and return it as a dict of column -> value.

    Args:
        record: the table's record.
        row: a dict (or a record instance) of column values.
        full: every column (None where not given, the default of ``source``); False: only the columns given.

    Raises:
        RecordError: naming the table and the column that is unknown or has a wrong value, and the fix.
    """
    if isinstance(row, Record):
        row = row.model_dump(exclude_unset=not full)
    try:
        obj = record.model_validate(dict(row))
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise RecordError(
            f"{record.TABLE} row does not fit tunelab/core/records.py {record.__name__}: {problems}. A new column needs "
            "a field there and a new tunelab/warehouse/schema migration"
        ) from None
    return obj.model_dump(exclude_unset=not full)


def frame(record: type[Record], df: Any, *, without: tuple[str, ...] = ()) -> Any:
    """A table's rows (a pandas DataFrame) with the record's columns, in the record's order.

    Args:
        record: the table's record.
        df: a pandas DataFrame. One without columns (built from no rows) is returned as it is: a bundle then
            leaves the table out, as before.
        without: record columns to leave out (``trial_id``, which the bundle writer adds).

    Returns:
        The frame; every record column (but ``without``) is present, None where no row gave it. Values are
        those given; each column was checked to convert to its Arrow type (:func:`arrow_schema`).

    Raises:
        RecordError: a column the record does not have, or a value that does not fit its column's type.
    """
    if len(df.columns) == 0:
        return df
    wanted = [c for c in columns(record) if c not in without]
    unknown = [c for c in df.columns if c not in wanted]
    if unknown:
        raise RecordError(f"{record.TABLE} rows have columns {unknown} that tunelab/core/records.py {record.__name__} "
                          "does not have: add them there and in a new tunelab/warehouse/schema migration")
    df = df.reindex(columns=wanted)
    for col in wanted:
        try:
            pa.array(df[col], type=_col(record, col).arrow, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise RecordError(f"{record.TABLE}.{col}: values do not fit {_col(record, col).arrow}: {exc}") from exc
    return df


# -- ids -----------------------------------------------------------------------------------------------------
def _part(name: str, value: Any, allow_slash: bool = False) -> str:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{name} must be a non-empty string, got {value!r}")
    if not allow_slash and "/" in value:
        raise RecordError(f"{name} {value!r} must not contain '/' (it separates the parts of a trial_id)")
    return value


def trial_id(sweep_id: str, config_key: str, runtime: str, replicate: int) -> str:
    """The id of a trial: ``<sweep_id>/<runtime>/<config_key>/r<replicate>``.

    Parts: the sweep's id (:func:`sweep_id`), the plan's runtime name (one config on two runtimes is two
    trials), ``plan.config_key`` (hash of model + engine args + env), and the boot number of that config on
    that runtime in the sweep (0-based). This is the format sweeps have written since the runtime became part
    of the id; bundle folders replace '/' by '__'.

    Raises:
        RecordError: an empty part, '/' in config_key or runtime, or a negative replicate.
    """
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 0:
        raise RecordError(f"replicate must be an integer >= 0, got {replicate!r}")
    return (f"{_part('sweep_id', sweep_id, allow_slash=True)}/{_part('runtime', runtime)}/"
            f"{_part('config_key', config_key)}/r{replicate}")


def sweep_id(started: _dt.datetime, plan_name: str, token: str | None = None) -> str:
    """The id of a sweep: ``<started, UTC, %Y%m%dT%H%M%SZ>-<plan name>-<token>``, e.g.
    ``20261129T091500Z-demo-3f2a``; ``token`` is 4 random hex digits unless given (two sweeps of one plan in
    the same second differ).

    Raises:
        RecordError: ``started`` without a time zone, or an empty plan name.
    """
    if not isinstance(started, _dt.datetime) or started.tzinfo is None:
        raise RecordError(f"started must be a timezone-aware datetime (UTC), got {started!r}")
    token = secrets.token_hex(2) if token is None else token
    return f"{started.astimezone(_dt.timezone.utc):%Y%m%dT%H%M%SZ}-{_part('plan_name', plan_name, True)}-{token}"


def import_sweep_id(source: str, sha256: str) -> str:
    """The id of the sweep of an imported result file: ``<source>-<first 12 hex digits of its sha256>``, so
    importing the same file twice gives the same id."""
    return f"{_part('source', source)}-{_part('sha256', sha256)[:12]}"


def measurement_key(workload: str, load_kind: str, load_value: float, repeat: int) -> dict[str, Any]:
    """The key of a measured window without the trial (``workload``, ``load_kind``, ``load_value`` as float,
    ``repeat`` as int): the columns every ``measurements``, ``requests`` and ``server_metrics`` row of that
    window starts with.

    Raises:
        RecordError: ``load_kind`` not one of the load profiles' kinds (``load_profiles.LOAD_KINDS``), or a
            negative repeat.
    """
    if load_kind not in LOAD_KINDS:
        raise RecordError(f"load_kind must be one of {list(LOAD_KINDS)}, got {load_kind!r}")
    if int(repeat) < 0:
        raise RecordError(f"repeat must be >= 0, got {repeat!r}")
    return {"workload": workload, "load_kind": load_kind, "load_value": float(load_value), "repeat": int(repeat)}
