-- tunelab warehouse, schema version 1.
-- Units: seconds (suffix _s), tokens as integers, rates as *_per_s, memory in MiB/GiB as named.
-- Every table is keyed by what it describes; trial_id is "<sweep_id>/<config_key>/r<replicate>".

CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id        VARCHAR PRIMARY KEY,   -- e.g. 20261129T091500Z-demo-3f2a
    plan_name       VARCHAR NOT NULL,
    plan_yaml       VARCHAR,               -- the plan as given, for re-running
    host            VARCHAR,
    started_at      TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ,
    tunelab_version VARCHAR,
    source          VARCHAR DEFAULT 'tunelab'   -- 'tunelab' or 'vllm-bench-import'
);

CREATE TABLE IF NOT EXISTS trials (
    trial_id            VARCHAR PRIMARY KEY,
    sweep_id            VARCHAR NOT NULL,
    config_key          VARCHAR NOT NULL,  -- stable hash of model + engine args + env (not runtime)
    config_label        VARCHAR,           -- human label, e.g. "enforce-eager=true"
    replicate           INTEGER NOT NULL,  -- boot number of this config in the sweep (0-based)
    runtime_name        VARCHAR,
    vllm_version        VARCHAR,           -- raw string as the runtime reports it
    vllm_release        VARCHAR,           -- "0.32.0"
    vllm_release_major  INTEGER,
    vllm_release_minor  INTEGER,
    vllm_release_patch  INTEGER,
    vllm_pre            VARCHAR,           -- "rc1", NULL for a final release
    vllm_dev            INTEGER,           -- dev number, NULL if none
    vllm_commit         VARCHAR,           -- git commit from a "+g<sha>" local part, NULL if none
    vllm_local          VARCHAR,           -- full local suffix ("cpu", "cu130", ...)
    torch_version       VARCHAR,
    transformers_version VARCHAR,
    fastokens_version   VARCHAR,
    cuda_version        VARCHAR,
    driver_version      VARCHAR,
    gpu_name            VARCHAR,           -- 'cpu' when no GPU
    gpu_index           INTEGER,
    model               VARCHAR,
    engine_args         JSON,              -- {flag: value} as passed to vllm serve
    env                 JSON,              -- trial env, secrets redacted
    env_not_applied     JSON,              -- env vars vLLM reported as unknown
    effective_config    JSON,              -- what vLLM reports it used (max_num_batched_tokens, ...)
    command             VARCHAR,           -- the vllm serve command line, secrets redacted
    status              VARCHAR NOT NULL,  -- ok | boot_failed | failed | cancelled | gpu_busy
    failure_class       VARCHAR,           -- oom_weights | oom_kv_cache | oom_graph_capture | insufficient_free_memory | invalid_config | timeout | crash | ...
    failure_reason      VARCHAR,
    eager_diagnosis     VARCHAR,           -- result of re-booting a failed config with --enforce-eager
    boot_s              DOUBLE,            -- Popen -> ready (health 200 + one real completion)
    compile_cache       VARCHAR,           -- cold | warm
    teardown_s          DOUBLE,
    started_at          TIMESTAMPTZ,
    finished_at         TIMESTAMPTZ,
    load_avg_1m         DOUBLE,            -- host load at measurement start (noise context)
    quality_verdict     VARCHAR,           -- pass | warn | fail | unvalidated
    log_path            VARCHAR
);

CREATE TABLE IF NOT EXISTS boot_phases (
    trial_id    VARCHAR NOT NULL,
    phase       VARCHAR NOT NULL,   -- weights_load | model_load | torch_compile | dynamo | inductor | graph_capture | init_engine | kv_cache | ...
    seconds     DOUBLE,
    gib         DOUBLE,
    tokens      BIGINT,
    detail      VARCHAR,
    PRIMARY KEY (trial_id, phase)
);

CREATE TABLE IF NOT EXISTS measurements (
    trial_id                VARCHAR NOT NULL,
    workload                VARCHAR NOT NULL,
    load_kind               VARCHAR NOT NULL,   -- concurrency | rate
    load_value              DOUBLE NOT NULL,    -- target concurrency or requests/s
    repeat                  INTEGER NOT NULL,
    num_requests            INTEGER,
    completed               INTEGER,
    failed                  INTEGER,
    duration_s              DOUBLE,             -- first send -> last end of measured requests
    request_throughput_per_s DOUBLE,
    output_tokens_per_s     DOUBLE,
    total_tokens_per_s      DOUBLE,
    goodput_per_s           DOUBLE,             -- requests/s meeting every SLO of the plan
    achieved_concurrency    DOUBLE,             -- sum(E2EL) / duration
    total_input_tokens      BIGINT,
    total_output_tokens     BIGINT,
    ttft_mean_s DOUBLE, ttft_p50_s DOUBLE, ttft_p90_s DOUBLE, ttft_p95_s DOUBLE, ttft_p99_s DOUBLE,
    tpot_mean_s DOUBLE, tpot_p50_s DOUBLE, tpot_p90_s DOUBLE, tpot_p95_s DOUBLE, tpot_p99_s DOUBLE,
    itl_mean_s  DOUBLE, itl_p50_s  DOUBLE, itl_p90_s  DOUBLE, itl_p95_s  DOUBLE, itl_p99_s  DOUBLE,
    e2el_mean_s DOUBLE, e2el_p50_s DOUBLE, e2el_p90_s DOUBLE, e2el_p95_s DOUBLE, e2el_p99_s DOUBLE,
    client_cpu_frac         DOUBLE,             -- load generator CPU time / wall time
    client_bound            BOOLEAN,
    PRIMARY KEY (trial_id, workload, load_kind, load_value, repeat)
);

CREATE TABLE IF NOT EXISTS requests (
    trial_id                VARCHAR NOT NULL,
    workload                VARCHAR NOT NULL,
    load_kind               VARCHAR NOT NULL,
    load_value              DOUBLE NOT NULL,
    repeat                  INTEGER NOT NULL,
    request_index           INTEGER NOT NULL,
    ok                      BOOLEAN NOT NULL,
    error                   VARCHAR,            -- reason of a failed request
    send_ts                 DOUBLE,             -- epoch seconds
    first_token_ts          DOUBLE,             -- first chunk carrying generated text
    end_ts                  DOUBLE,             -- last byte
    chunk_offsets_s         DOUBLE[],           -- every content chunk, seconds after send_ts
    prompt_tokens           INTEGER,            -- from the server's usage
    output_tokens           INTEGER,            -- from the server's usage
    requested_output_tokens INTEGER,
    finish_reason           VARCHAR,
    ttft_s                  DOUBLE,
    tpot_s                  DOUBLE,
    e2el_s                  DOUBLE,
    itl_mean_s              DOUBLE
    -- Key: (trial_id, workload, load_kind, load_value, repeat, request_index). Not declared as a
    -- PRIMARY KEY: the index over millions of rows cost 2.5x ingest time (benchmarks/warehouse_ingest.py);
    -- uniqueness is checked when the bundle is written (tasks/bundle.py) and the loader replaces a
    -- trial's rows as a whole (delete-then-insert by trial_id).
);

CREATE TABLE IF NOT EXISTS server_metrics (
    trial_id    VARCHAR NOT NULL,
    workload    VARCHAR NOT NULL,
    load_kind   VARCHAR NOT NULL,
    load_value  DOUBLE NOT NULL,
    repeat      INTEGER NOT NULL,
    metric      VARCHAR NOT NULL,   -- tunelab's canonical name, e.g. preemptions, kv_cache_usage
    kind        VARCHAR NOT NULL,   -- counter_delta | histogram | gauge
    value       DOUBLE,             -- counter delta, gauge value, histogram mean
    count       DOUBLE,             -- histogram observations in the window
    sum         DOUBLE,
    source_name VARCHAR,            -- the vLLM metric name actually read
    null_reason VARCHAR,            -- why value is NULL (metric absent in this version, ...)
    PRIMARY KEY (trial_id, workload, load_kind, load_value, repeat, metric)
);

CREATE TABLE IF NOT EXISTS gpu_samples (
    trial_id            VARCHAR NOT NULL,
    ts                  DOUBLE NOT NULL,
    gpu_index           INTEGER NOT NULL,
    memory_used_mib     DOUBLE,
    utilization_pct     DOUBLE,
    sm_clock_mhz        DOUBLE,
    mem_clock_mhz       DOUBLE,
    power_w             DOUBLE,
    temperature_c       DOUBLE,
    throttle_reasons    BIGINT
);

CREATE TABLE IF NOT EXISTS quality_checks (
    trial_id    VARCHAR NOT NULL,
    suite       VARCHAR NOT NULL,
    expectation VARCHAR NOT NULL,
    success     BOOLEAN,
    severity    VARCHAR,            -- fail | warn
    observed    VARCHAR,
    threshold   VARCHAR,
    detail      VARCHAR
);

CREATE TABLE IF NOT EXISTS loaded_bundles (
    bundle_id   VARCHAR PRIMARY KEY,   -- = trial_id
    sha256      VARCHAR NOT NULL,      -- manifest hash
    loaded_at   TIMESTAMPTZ
);
