-- Question: how did each config move over the scheduled runs (and vLLM releases), against the sweep's anchor?
-- One row per (config_key, gpu_name, workload, load level, metric, sweep, vLLM release): a point of a series.
-- config_label: the config's label in the point's latest trial (a label is the plan's name for a key, e.g. 'twin').
-- log_value = mean over the point's boots of ln(boot value) (boot value = mean over its repeats); log_sd = their
-- spread. With $anchor_key (the anchor config's key), anchor_log_value is the anchor's mean ln(boot value) in the
-- same sweep, GPU, workload and load level, and adjusted_log_value = log_value - anchor_log_value (NULL where the
-- sweep ran no anchor there): what the sweep shares with the anchor (machine, drivers, host load) cancels.
-- $anchor_runtime narrows the anchor to one runtime (an anchor is a config on a pinned runtime, and a config key
-- does not depend on the runtime: the same config on the release under test is the series, on the pinned one the
-- anchor). The anchor's own rows are left out. Builds of one release are one point (vllm_version = the release);
-- untrusted versions have NULL vllm_version_key (kept here for ordering by time; warehouse.series drops them
-- when ordering by release). Trials with status 'ok' and quality_verdict pass, warn or unvalidated.
-- Order: by series, then run_at (time); warehouse.series.release_series re-orders by release on request.
-- Parameters:
--   $metric      VARCHAR  e.g. 'output_tokens_per_s'
--   $config_key  VARCHAR  one config, or NULL for all
--   $workload    VARCHAR  one workload, or NULL for all
--   $anchor_key  VARCHAR  the anchor config's key, or NULL for no adjustment
--   $anchor_runtime VARCHAR  the anchor's runtime name, or NULL for any runtime
-- Run (Python):  warehouse.query.run_query(con, "release_series", metric="output_tokens_per_s",
--                    config_key=None, workload=None, anchor_key=None, anchor_runtime=None)
WITH bv AS (
    SELECT * FROM boot_values
    WHERE metric = $metric AND status = 'ok' AND quality_verdict IN ('pass', 'warn', 'unvalidated')
      AND boot_value > 0 AND isfinite(boot_value)
      AND ($workload IS NULL OR workload = $workload)
),
pts AS (
    SELECT config_key, gpu_name, workload, load_kind, load_value, metric, sweep_id, vllm_version_key,
           min(coalesce(vllm_public_version, vllm_version)) AS vllm_version,
           arg_max(config_label, run_at) AS config_label,
           list(DISTINCT vllm_version ORDER BY vllm_version) AS builds,
           bool_and(higher_is_better) AS higher_is_better,
           count(*)                   AS boots,
           avg(ln(boot_value))        AS log_value,
           stddev_samp(ln(boot_value)) AS log_sd,
           min(run_at)                AS run_at
    FROM bv
    WHERE ($config_key IS NULL OR config_key = $config_key)
      AND NOT coalesce(config_key = $anchor_key AND ($anchor_runtime IS NULL OR runtime_name = $anchor_runtime), false)
    GROUP BY config_key, gpu_name, workload, load_kind, load_value, metric, sweep_id, vllm_version_key
),
anchor AS (
    SELECT gpu_name, workload, load_kind, load_value, sweep_id,
           avg(ln(boot_value)) AS anchor_log_value, count(*) AS anchor_boots
    FROM bv
    WHERE config_key = $anchor_key AND ($anchor_runtime IS NULL OR runtime_name = $anchor_runtime)
    GROUP BY gpu_name, workload, load_kind, load_value, sweep_id
)
SELECT p.config_key, p.config_label, p.gpu_name, p.workload, p.load_kind, p.load_value, p.metric, p.sweep_id,
       p.vllm_version, p.vllm_version_key, p.builds, p.higher_is_better, p.boots, p.log_value, p.log_sd, p.run_at,
       a.anchor_log_value, coalesce(a.anchor_boots, 0) AS anchor_boots,
       p.log_value - a.anchor_log_value AS adjusted_log_value
FROM pts p
LEFT JOIN anchor a ON a.sweep_id = p.sweep_id AND a.gpu_name IS NOT DISTINCT FROM p.gpu_name
     AND a.workload = p.workload AND a.load_kind = p.load_kind AND a.load_value = p.load_value
ORDER BY p.config_key, p.gpu_name, p.workload, p.load_kind, p.load_value, p.run_at, p.vllm_version_key
