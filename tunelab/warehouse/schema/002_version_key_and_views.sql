-- tunelab warehouse, schema version 2: version sort key, bundle bookkeeping, views for the common joins.
-- Views are bound when queried, so later migrations may add columns to the tables they read.

-- PEP 440 sort key of vllm_version (warehouse/versions.py: VllmVersion.sort_key); ORDER BY this,
-- never by the raw vllm_version string ('0.9.2' > '0.10.0' as strings).
ALTER TABLE trials ADD COLUMN IF NOT EXISTS vllm_version_key VARCHAR;

ALTER TABLE loaded_bundles ADD COLUMN IF NOT EXISTS bundle_path   VARCHAR;  -- where it was loaded from
ALTER TABLE loaded_bundles ADD COLUMN IF NOT EXISTS bundle_format INTEGER;  -- manifest bundle_format
ALTER TABLE loaded_bundles ADD COLUMN IF NOT EXISTS rows_loaded   BIGINT;   -- all tables together

-- One row per trial (one boot of one config on one runtime) with its sweep.
-- run_at: when the trial started (falls back to the sweep's start).
CREATE OR REPLACE VIEW trial_facts AS
SELECT t.trial_id, t.sweep_id, s.plan_name, s.source, s.host,
       t.config_key, t.config_label, t.replicate, t.runtime_name,
       t.vllm_version, t.vllm_release, t.vllm_version_key, t.vllm_pre, t.vllm_dev, t.vllm_commit, t.vllm_local,
       t.torch_version, t.cuda_version, t.driver_version, t.gpu_name, t.gpu_index, t.model,
       t.status, t.failure_class, t.failure_reason, t.eager_diagnosis, t.quality_verdict,
       t.boot_s, t.compile_cache, t.teardown_s, t.load_avg_1m,
       coalesce(t.started_at, s.started_at) AS run_at
FROM trials t LEFT JOIN sweeps s ON s.sweep_id = t.sweep_id;

-- measurements (trial x workload x load level x repeat) with the trial's identity and verdicts.
CREATE OR REPLACE VIEW measurement_facts AS
SELECT m.*,
       f.sweep_id, f.source, f.config_key, f.config_label, f.replicate, f.runtime_name,
       f.vllm_version, f.vllm_release, f.vllm_version_key, f.gpu_name, f.model,
       f.status, f.quality_verdict, f.run_at
FROM measurements m JOIN trial_facts f ON f.trial_id = m.trial_id;

-- The numeric per-repeat metrics in long form: one row per (trial, workload, load level, repeat, metric).
-- Lets SQL take the metric name as a parameter. NULL values are dropped.
CREATE OR REPLACE VIEW measurement_values AS
SELECT trial_id, workload, load_kind, load_value, "repeat", metric, value
FROM (
    UNPIVOT (SELECT trial_id, workload, load_kind, load_value, "repeat",
                    request_throughput_per_s, output_tokens_per_s, total_tokens_per_s, goodput_per_s,
                    achieved_concurrency, duration_s,
                    ttft_mean_s, ttft_p50_s, ttft_p90_s, ttft_p95_s, ttft_p99_s,
                    tpot_mean_s, tpot_p50_s, tpot_p90_s, tpot_p95_s, tpot_p99_s,
                    itl_mean_s,  itl_p50_s,  itl_p90_s,  itl_p95_s,  itl_p99_s,
                    e2el_mean_s, e2el_p50_s, e2el_p90_s, e2el_p95_s, e2el_p99_s
             FROM measurements)
    ON COLUMNS(* EXCLUDE (trial_id, workload, load_kind, load_value, "repeat"))
    INTO NAME metric VALUE value
);

-- The unit of replication is the boot: repeats on one server are averaged first.
-- One row per (trial, workload, load level, metric): boot_value = mean over repeats.
-- higher_is_better: throughput-like metrics (*_per_s) are better when higher, latencies (*_s) when lower.
CREATE OR REPLACE VIEW boot_values AS
SELECT f.trial_id, f.sweep_id, f.source, f.config_key, f.config_label, f.replicate, f.runtime_name,
       f.vllm_version, f.vllm_release, f.vllm_version_key, f.gpu_name, f.model,
       f.status, f.quality_verdict, f.run_at,
       v.workload, v.load_kind, v.load_value, v.metric,
       avg(v.value)         AS boot_value,
       count(*)             AS repeats,
       stddev_samp(v.value) AS repeat_sd,
       v.metric LIKE '%\_per\_s' ESCAPE '\' AS higher_is_better
FROM measurement_values v JOIN trial_facts f ON f.trial_id = v.trial_id
GROUP BY ALL;

-- Boot phases with the trial's identity (boot time per phase across versions and configs).
CREATE OR REPLACE VIEW boot_phase_facts AS
SELECT b.*, f.config_key, f.config_label, f.runtime_name, f.vllm_version, f.vllm_version_key,
       f.gpu_name, f.status, f.compile_cache, f.run_at
FROM boot_phases b JOIN trial_facts f ON f.trial_id = b.trial_id;

-- Requests with the trial's identity (request-level percentiles across trials).
CREATE OR REPLACE VIEW request_facts AS
SELECT r.*, f.config_key, f.config_label, f.runtime_name, f.vllm_version, f.vllm_version_key,
       f.gpu_name, f.status, f.quality_verdict, f.run_at
FROM requests r JOIN trial_facts f ON f.trial_id = r.trial_id;
