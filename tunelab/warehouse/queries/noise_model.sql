-- Question: how noisy is each config's metric, level by level: between boots and between windows of a boot?
-- Per (runtime, config, GPU, workload, load level, metric), from all trustworthy history (status 'ok',
-- quality pass/warn/unvalidated), on the log scale (a component's sqrt is about a relative SD, a CV):
--   var_window = pooled variance of a boot's windows around the boot mean (MSW), df_window = sum(n_k - 1)
--   var_boot   = max(0, (MSB - MSW) / n0), n0 = (N - sum n_k^2 / N) / (K - 1), df_boot = K - 1
-- (one-way nested ANOVA, method of moments; Kalibera and Jones 2013). boot_s: mean seconds to ready;
-- window_s: mean seconds of a measured window. tunelab.warehouse.noise_history.noise_model() is the reference and
-- adds the request level (within-window sampling noise) for latency metrics; docs/statistics.md says how to
-- read it. Cells with one boot have var_boot NULL. Only the plan's own windows: an sla_search: window
-- (measurements.sla_search_window, migration 019) overloads the server on purpose and is left out, as in compare.
-- Parameters:
--   $metric      VARCHAR  a measurements column, e.g. 'output_tokens_per_s'; NULL for all
--   $config_key  VARCHAR  one config, or NULL for all
-- Run (Python):  warehouse.query.run_query(con, "noise_model", metric="output_tokens_per_s", config_key=None)
WITH w AS (
    SELECT f.runtime_name, f.config_key, f.gpu_name, v.workload, v.load_kind, v.load_value, v.metric,
           v.trial_id, ln(v.value) AS y, f.boot_s, m.duration_s
    FROM measurement_values v
    JOIN trial_facts f USING (trial_id)
    JOIN measurements m USING (trial_id, workload, load_kind, load_value, repeat)
    WHERE f.status = 'ok' AND f.quality_verdict IN ('pass', 'warn', 'unvalidated')
      AND m.sla_search_window IS NOT TRUE  -- the plan's windows only (docs/sla_search.md; 019)
      AND m.overloaded IS NOT TRUE  -- an open-loop window the server fell behind (021)
      AND v.value > 0 AND isfinite(v.value)
      AND ($metric IS NULL OR v.metric = $metric)
      AND ($config_key IS NULL OR f.config_key = $config_key)
),
b AS (
    SELECT runtime_name, config_key, gpu_name, workload, load_kind, load_value, metric, trial_id,
           count(*) AS n, avg(y) AS ybar, coalesce(var_samp(y) * (count(*) - 1), 0) AS ss,
           any_value(boot_s) AS boot_s, avg(duration_s) AS window_s
    FROM w GROUP BY ALL
),
c AS (
    SELECT runtime_name, config_key, gpu_name, workload, load_kind, load_value, metric,
           count(*) AS boots, sum(n) AS windows,
           sum(n * ybar) / sum(n) AS grand,
           sum(ss) AS ssw, sum(n - 1) AS dfw, sum(n * n) AS sum_n2, sum(n * ybar * ybar) AS sum_ny2,
           avg(boot_s) AS boot_s, sum(window_s * n) / sum(n) AS window_s
    FROM b GROUP BY ALL
),
s AS (
    SELECT *, ssw / nullif(dfw, 0) AS msw,
           -- sum n_k (ybar_k - grand)^2 = sum n_k ybar_k^2 - N grand^2
           greatest(sum_ny2 - windows * grand * grand, 0) / nullif(boots - 1, 0) AS msb,
           (windows - sum_n2 / windows) / nullif(boots - 1, 0) AS n0
    FROM c
)
SELECT runtime_name, config_key, gpu_name, workload, load_kind, load_value, metric, boots, windows,
       exp(grand) AS mean_value,
       greatest((msb - coalesce(msw, 0)) / n0, 0) AS var_boot,
       msw AS var_window,
       (boots - 1)::DOUBLE AS df_boot, dfw::DOUBLE AS df_window,
       sqrt(greatest((msb - coalesce(msw, 0)) / n0, 0)) AS sd_boot_rel, sqrt(msw) AS sd_window_rel,
       window_s, boot_s
FROM s
ORDER BY runtime_name, config_key, workload, load_kind, load_value, metric
