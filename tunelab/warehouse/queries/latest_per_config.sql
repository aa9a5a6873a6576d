-- Question: what is the latest trustworthy result of each config on each runtime, per workload and load level?
-- Trustworthy: trial status 'ok' and quality_verdict pass, warn (passed with warnings) or unvalidated
-- (e.g. vllm-bench imports); 'fail' is left out. "Latest" = the trial (boot) that started last.
-- value = mean over that trial's repeats (view boot_values); repeat_sd = spread of the repeats.
-- Parameters:
--   $config_key  VARCHAR  one config, or NULL for all
--   $metric      VARCHAR  a measurements column, e.g. 'output_tokens_per_s', 'ttft_p99_s'; NULL for all
-- Run (Python):  warehouse.query.run_query(con, "latest_per_config", config_key=None, metric="output_tokens_per_s")
-- Run (duckdb CLI): PREPARE q AS <this statement>; EXECUTE q(config_key := NULL, metric := 'output_tokens_per_s');
SELECT config_key, config_label, runtime_name, vllm_version, gpu_name,
       workload, load_kind, load_value, metric,
       boot_value AS value, repeats, repeat_sd, higher_is_better,
       trial_id, sweep_id, quality_verdict, run_at
FROM boot_values
WHERE status = 'ok'
  AND quality_verdict IN ('pass', 'warn', 'unvalidated')
  AND ($config_key IS NULL OR config_key = $config_key)
  AND ($metric IS NULL OR metric = $metric)
QUALIFY row_number() OVER (
    PARTITION BY config_key, runtime_name, workload, load_kind, load_value, metric
    ORDER BY run_at DESC NULLS LAST, trial_id DESC) = 1
ORDER BY config_key, runtime_name, workload, load_kind, load_value, metric
