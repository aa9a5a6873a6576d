-- Question: is config/runtime B better or worse than A on one metric, per workload and load level,
-- beyond boot-to-boot noise?
-- Method: the unit of replication is the boot (trial): repeats are averaged per trial (view boot_values),
-- then Welch's t interval (95 %) of mean(B) - mean(A) across boots. The t quantile comes from a table
-- at floor(Welch df) (slightly conservative). Fewer than 2 boots on a side -> 'inconclusive'.
-- Only trials with status 'ok' and quality_verdict pass or warn are used. A quick screen in SQL only:
-- warehouse.compare.compare() is the reference and differs (docs/statistics.md): it works on the log scale
-- (ratio intervals never below -100 %), borrows variance from history and across cells (a Welch interval
-- on 2 vs 2 boots has 1-2 df and misses even 3x changes), and states the minimum detectable effect.
-- Parameters:
--   $metric               VARCHAR  e.g. 'output_tokens_per_s' (higher is better) or 'ttft_p99_s' (lower is better)
--   $baseline_config_key  VARCHAR  config of A
--   $baseline_runtime     VARCHAR  runtime_name of A, or NULL for any
--   $candidate_config_key VARCHAR  config of B (may equal A's when comparing runtimes)
--   $candidate_runtime    VARCHAR  runtime_name of B, or NULL for any
--   The two selections must not overlap (a trial counted on both sides makes the result meaningless).
-- Run (Python):  warehouse.query.run_query(con, "ab_comparison", metric="output_tokens_per_s",
--                    baseline_config_key="abc", baseline_runtime=None, candidate_config_key="def", candidate_runtime=None)
WITH sides AS (
    SELECT 'baseline' AS side, * FROM boot_values
    WHERE config_key = $baseline_config_key AND ($baseline_runtime IS NULL OR runtime_name = $baseline_runtime)
    UNION ALL
    SELECT 'candidate' AS side, * FROM boot_values
    WHERE config_key = $candidate_config_key AND ($candidate_runtime IS NULL OR runtime_name = $candidate_runtime)
),
s AS (
    SELECT workload, load_kind, load_value, metric, bool_and(higher_is_better) AS higher_is_better,
           count(*)             FILTER (WHERE side = 'baseline')  AS baseline_boots,
           count(*)             FILTER (WHERE side = 'candidate') AS candidate_boots,
           avg(boot_value)      FILTER (WHERE side = 'baseline')  AS baseline_mean,
           avg(boot_value)      FILTER (WHERE side = 'candidate') AS candidate_mean,
           var_samp(boot_value) FILTER (WHERE side = 'baseline')  AS vb,
           var_samp(boot_value) FILTER (WHERE side = 'candidate') AS vc
    FROM sides
    WHERE metric = $metric AND status = 'ok' AND quality_verdict IN ('pass', 'warn')
    GROUP BY ALL
),
w AS (
    SELECT *, candidate_mean - baseline_mean AS diff,
           vb / baseline_boots + vc / candidate_boots AS se2,
           (vb / baseline_boots + vc / candidate_boots) ^ 2
             / nullif((vb / baseline_boots) ^ 2 / (baseline_boots - 1) + (vc / candidate_boots) ^ 2 / (candidate_boots - 1), 0)
             AS welch_df
    FROM s
),
t975(df, q) AS (VALUES (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
    (8, 2.306), (9, 2.262), (10, 2.228), (11, 2.201), (12, 2.179), (13, 2.160), (14, 2.145), (15, 2.131),
    (16, 2.120), (17, 2.110), (18, 2.101), (19, 2.093), (20, 2.086), (21, 2.080), (22, 2.074), (23, 2.069),
    (24, 2.064), (25, 2.060), (26, 2.056), (27, 2.052), (28, 2.048), (29, 2.045), (30, 2.042), (40, 2.021),
    (60, 2.000), (120, 1.980), (1000000, 1.960)),
ci AS (
    SELECT w.*,
           (SELECT max_by(q, df) FROM t975 WHERE t975.df <= greatest(1, floor(coalesce(w.welch_df, 1)))) AS t_crit
    FROM w
)
SELECT workload, load_kind, load_value, metric, higher_is_better, baseline_boots, candidate_boots,
       baseline_mean, candidate_mean, diff, diff / baseline_mean AS rel_diff,
       diff - t_crit * sqrt(se2) AS ci_low, diff + t_crit * sqrt(se2) AS ci_high, welch_df,
       CASE
         WHEN baseline_boots < 2 OR candidate_boots < 2 THEN 'inconclusive'
         WHEN diff - t_crit * sqrt(se2) > 0 OR diff + t_crit * sqrt(se2) < 0 THEN
              CASE WHEN (diff > 0) = higher_is_better THEN 'better' ELSE 'worse' END
         ELSE 'no_significant_change'
       END AS verdict
FROM ci
ORDER BY workload, load_kind, load_value
