-- Question: which configs got worse from one vLLM version to the next, beyond noise, and stayed worse?
-- Points: per (config_key, gpu_name, workload, load level) one point per vLLM version, in PEP 440 order
-- (vllm_version_key; builds of one release such as 0.26.0 and 0.26.0+empty are one point, vllm_version names the
-- release and builds lists them; untrusted versions have no key); value = mean over boots of each boot's mean over repeats.
-- A point violates when it is worse than the previous point by more than $threshold_rel (relative,
-- direction-aware: *_per_s higher is better, *_s lower is better) AND by more than the noise band
-- $noise_k * sd * sqrt(1/n_prev + 1/n), sd = boot-to-boot SD pooled over the series (NULL when no
-- version has 2 boots -> violation NULL = insufficient data).
-- regression_start: this point AND the next one both violate against the previous point
-- (two consecutive violations, the PyTorch HUD rule). This is the simplified SQL form;
-- warehouse.compare.regressions() is the full rule (baseline = last non-violating point, any run length).
-- Trials with status 'ok' and quality_verdict pass or warn.
-- Parameters:
--   $metric         VARCHAR  e.g. 'output_tokens_per_s'
--   $threshold_rel  DOUBLE   e.g. 0.05
--   $noise_k        DOUBLE   e.g. 2.0
--   $config_key     VARCHAR  one config, or NULL for all
-- Run (Python):  warehouse.query.run_query(con, "regressions", metric="output_tokens_per_s",
--                    threshold_rel=0.05, noise_k=2.0, config_key=None)
WITH pts AS (
    SELECT config_key, gpu_name, workload, load_kind, load_value, metric, vllm_version_key,
           min(coalesce(vllm_public_version, vllm_version)) AS vllm_version,
           list(DISTINCT vllm_version ORDER BY vllm_version) AS builds, bool_and(higher_is_better) AS hib,
           count(*) AS n, avg(boot_value) AS value, var_samp(boot_value) AS v, min(run_at) AS first_run_at
    FROM boot_values
    WHERE metric = $metric AND status = 'ok' AND quality_verdict IN ('pass', 'warn')
      AND vllm_version_key IS NOT NULL AND ($config_key IS NULL OR config_key = $config_key)
    GROUP BY config_key, gpu_name, workload, load_kind, load_value, metric, vllm_version_key
),
noise AS (
    SELECT config_key, gpu_name, workload, load_kind, load_value,
           sqrt(sum((n - 1) * v) FILTER (WHERE n > 1) / nullif(sum(n - 1) FILTER (WHERE n > 1), 0)) AS sd
    FROM pts GROUP BY ALL
),
seq AS (
    SELECT p.*, noise.sd,
           lag(vllm_version) OVER w AS prev_version, lag(value) OVER w AS prev_value, lag(n) OVER w AS prev_n,
           lead(value) OVER w AS next_value, lead(n) OVER w AS next_n
    FROM pts p JOIN noise USING (config_key, gpu_name, workload, load_kind, load_value)
    WINDOW w AS (PARTITION BY p.config_key, p.gpu_name, p.workload, p.load_kind, p.load_value ORDER BY p.vllm_version_key)
),
f AS (
    SELECT *,
           (CASE WHEN hib THEN prev_value - value ELSE value - prev_value END) / prev_value AS worse_rel,
           $noise_k * sd * sqrt(1.0 / prev_n + 1.0 / n) AS noise_band,
           (CASE WHEN hib THEN prev_value - next_value ELSE next_value - prev_value END) / prev_value AS next_worse_rel,
           $noise_k * sd * sqrt(1.0 / prev_n + 1.0 / next_n) AS next_noise_band
    FROM seq
)
SELECT config_key, gpu_name, workload, load_kind, load_value, metric, vllm_version, vllm_version_key, builds,
       first_run_at, n AS boots, value, prev_version, prev_value, worse_rel, noise_band,
       worse_rel > $threshold_rel AND abs(value - prev_value) > noise_band AS violation,
       (worse_rel > $threshold_rel AND abs(value - prev_value) > noise_band)
         AND (next_worse_rel > $threshold_rel AND abs(next_value - prev_value) > next_noise_band) AS regression_start
FROM f
ORDER BY config_key, gpu_name, workload, load_kind, load_value, vllm_version_key
