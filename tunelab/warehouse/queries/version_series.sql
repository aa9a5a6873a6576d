-- Question: how did one config perform across vLLM versions and over time?
-- One row per (workload, load level, vLLM version, sweep), ordered by the parsed version
-- (trials.vllm_version_key, PEP 440 order: '0.9.2' < '0.10.0' < '0.11.0rc1' < '0.11.0'), then by date.
-- Builds are grouped by release: 0.26.0, 0.26.0+empty and 0.26.0+cu128 are one point (vllm_version = the
-- release, builds = its build strings); untrusted versions (0.1.devN: no release tag) have no key and are left out.
-- value = mean over the sweep's boots of each boot's mean over repeats; boot_sd = spread across boots.
-- Trials with status 'ok' and quality_verdict pass, warn or unvalidated.
-- Parameters:
--   $config_key  VARCHAR  the config
--   $metric      VARCHAR  e.g. 'output_tokens_per_s'
--   $workload    VARCHAR  one workload, or NULL for all
-- Run (Python):  warehouse.query.run_query(con, "version_series", config_key="abc", metric="output_tokens_per_s", workload=None)
SELECT config_key, gpu_name, workload, load_kind, load_value, metric,
       min(coalesce(vllm_public_version, vllm_version)) AS vllm_version, vllm_version_key, sweep_id,
       list(DISTINCT vllm_version ORDER BY vllm_version) AS builds,
       count(*)                 AS boots,
       avg(boot_value)          AS value,
       stddev_samp(boot_value)  AS boot_sd,
       min(boot_value)          AS min_value,
       max(boot_value)          AS max_value,
       sum(repeats)             AS repeats,
       list(DISTINCT runtime_name ORDER BY runtime_name) AS runtimes,
       min(run_at)              AS first_run_at
FROM boot_values
WHERE config_key = $config_key
  AND metric = $metric
  AND ($workload IS NULL OR workload = $workload)
  AND status = 'ok' AND quality_verdict IN ('pass', 'warn', 'unvalidated')
  AND vllm_version_key IS NOT NULL
GROUP BY config_key, gpu_name, workload, load_kind, load_value, metric, vllm_version_key, sweep_id
ORDER BY workload, load_kind, load_value, vllm_version_key, first_run_at
