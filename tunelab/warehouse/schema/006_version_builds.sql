-- tunelab warehouse, schema version 6: builds are grouped by release, and what a build's version says about it.
-- warehouse/versions.py defines every column. After this file, warehouse.migrate runs
-- warehouse.versions.refill_version_columns in the same transaction: it recomputes vllm_version_key (keys of
-- earlier versions held the local part, so '0.26.0+empty' was never grouped with '0.26.0') and fills these
-- columns for the rows already loaded.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS vllm_public_version VARCHAR;  -- "0.26.0" for "0.26.0+empty": the release group of the build
ALTER TABLE trials ADD COLUMN IF NOT EXISTS vllm_platform       VARCHAR;  -- build target from the local part: cpu, cu128, rocm624, tpu, xpu, empty, ...
ALTER TABLE trials ADD COLUMN IF NOT EXISTS vllm_build_date     DATE;     -- from a local segment dYYYYMMDD (setuptools-scm, modified tree)
ALTER TABLE trials ADD COLUMN IF NOT EXISTS vllm_untrusted      VARCHAR;  -- why the number cannot place the build among releases (0.1.devN: no release tag); vllm_version_key is then NULL

CREATE OR REPLACE VIEW trial_facts AS
SELECT t.trial_id, t.sweep_id, s.plan_name, s.source, s.host,
       t.config_key, t.config_label, t.replicate, t.runtime_name,
       t.vllm_version, t.vllm_release, t.vllm_version_key, t.vllm_pre, t.vllm_dev, t.vllm_commit, t.vllm_local,
       t.torch_version, t.cuda_version, t.driver_version, t.gpu_name, t.gpu_index, t.model,
       t.status, t.failure_class, t.failure_reason, t.eager_diagnosis, t.quality_verdict,
       t.boot_s, t.compile_cache, t.teardown_s, t.load_avg_1m,
       coalesce(t.started_at, s.started_at) AS run_at,
       t.vllm_public_version, t.vllm_platform, t.vllm_build_date, t.vllm_untrusted
FROM trials t LEFT JOIN sweeps s ON s.sweep_id = t.sweep_id;

CREATE OR REPLACE VIEW measurement_facts AS
SELECT m.*,
       f.sweep_id, f.source, f.config_key, f.config_label, f.replicate, f.runtime_name,
       f.vllm_version, f.vllm_release, f.vllm_version_key, f.gpu_name, f.model,
       f.status, f.quality_verdict, f.run_at, f.vllm_public_version
FROM measurements m JOIN trial_facts f ON f.trial_id = m.trial_id;

CREATE OR REPLACE VIEW boot_values AS
SELECT f.trial_id, f.sweep_id, f.source, f.config_key, f.config_label, f.replicate, f.runtime_name,
       f.vllm_version, f.vllm_release, f.vllm_version_key, f.gpu_name, f.model,
       f.status, f.quality_verdict, f.run_at,
       v.workload, v.load_kind, v.load_value, v.metric,
       avg(v.value)         AS boot_value,
       count(*)             AS repeats,
       stddev_samp(v.value) AS repeat_sd,
       v.metric LIKE '%\_per\_s' ESCAPE '\' AS higher_is_better,
       f.vllm_public_version
FROM measurement_values v JOIN trial_facts f ON f.trial_id = v.trial_id
GROUP BY ALL;
