-- Question: in one sweep, how does each engine config (and runtime) do per workload and load level?
-- Parameters: $sweep_id; $all_quality (false: only trials whose quality verdict is pass or warn, as every
-- comparison does by default; true: every measured trial). One row per (runtime, config, workload, load level): means over boots and repeats,
-- the repeat-to-repeat coefficient of variation (noise), how many boots/repeats, and the quality verdicts.
-- Speculative decoding (issue 16, item 7): spec_acceptance_rate = Σ accepted / Σ draft tokens and
-- spec_mean_acceptance_length = 1 + Σ accepted / Σ drafts over the level's windows (vLLM's definitions,
-- vllm/v1/spec_decode/metrics.py; as tasks/server_metrics.spec_decode_acceptance per window), from the
-- server_metrics deltas of vLLM's /metrics; NULL where the server exposed no spec-decode counters.
-- Run: duckdb .tunelab/warehouse.duckdb -c "SET VARIABLE sweep_id = '...';" then replace $sweep_id by
-- getvariable('sweep_id'), or from Python: con.execute(sql, {"sweep_id": "..."}).
SELECT
    t.runtime_name                                   AS runtime,
    t.vllm_version,
    t.config_label                                   AS config,
    t.config_key,
    m.workload,
    m.load_kind,
    m.load_value,
    count(DISTINCT t.trial_id)                       AS boots,
    count(*)                                         AS repeats,
    avg(m.output_tokens_per_s)                       AS output_tokens_per_s,
    stddev_samp(m.output_tokens_per_s) / nullif(avg(m.output_tokens_per_s), 0) AS output_tps_cv,
    avg(m.ttft_p50_s)                                AS ttft_p50_s,
    avg(m.tpot_p50_s)                                AS tpot_p50_s,
    -- ratios of sums, not means of per-window ratios: a window with more drafts weighs more, as in vLLM's own
    -- cumulative figure; only windows where both counters of a ratio were read (a counter reset leaves NULL)
    sum(sd.accepted_tokens) FILTER (WHERE sd.draft_tokens IS NOT NULL)
        / nullif(sum(sd.draft_tokens) FILTER (WHERE sd.accepted_tokens IS NOT NULL), 0) AS spec_acceptance_rate,
    1 + sum(sd.accepted_tokens) FILTER (WHERE sd.drafts IS NOT NULL)
        / nullif(sum(sd.drafts) FILTER (WHERE sd.accepted_tokens IS NOT NULL), 0) AS spec_mean_acceptance_length,
    avg(m.itl_p50_s)                                 AS itl_p50_s,
    avg(m.e2el_p95_s)                                AS e2el_p95_s,
    sum(m.failed)                                    AS failed_requests,
    sum(m.completed)                                 AS completed_requests,
    -- the plan's slo: (per request, vllm bench serve --goodput rule); NULL without one. slo_attainment: the share of
    -- the completed requests that met every bound: goodput / request throughput of each window, both counted over
    -- its steady part (else the whole window), as a ratio of sums of counts over the windows
    avg(m.goodput_per_s)                             AS goodput_per_s,
    sum(m.goodput_per_s * CASE WHEN m.steady_state THEN m.steady_s ELSE m.duration_s END)
        / nullif(sum(m.request_throughput_per_s * CASE WHEN m.steady_state THEN m.steady_s ELSE m.duration_s END)
                 FILTER (WHERE m.goodput_per_s IS NOT NULL), 0) AS slo_attainment,
    avg(t.boot_s)                                    AS boot_s,
    string_agg(DISTINCT t.quality_verdict, ',' ORDER BY t.quality_verdict) AS quality,
    -- env vars that vLLM reported as unknown on some boot of this config (JSON list; NULL when all applied)
    max(CASE WHEN json_array_length(t.env_not_applied) > 0 THEN CAST(t.env_not_applied AS VARCHAR) END) AS env_not_applied
FROM measurements m
JOIN trials t USING (trial_id)
-- one row per measured window at most (server_metrics' key minus metric), so the join never multiplies rows
LEFT JOIN (
    SELECT trial_id, workload, load_kind, load_value, repeat,
           max(value) FILTER (WHERE metric = 'spec_decode_drafts')          AS drafts,
           max(value) FILTER (WHERE metric = 'spec_decode_draft_tokens')    AS draft_tokens,
           max(value) FILTER (WHERE metric = 'spec_decode_accepted_tokens') AS accepted_tokens
    FROM server_metrics
    WHERE metric IN ('spec_decode_drafts', 'spec_decode_draft_tokens', 'spec_decode_accepted_tokens')
    GROUP BY ALL
) sd ON sd.trial_id = m.trial_id AND sd.workload = m.workload AND sd.load_kind = m.load_kind
    AND sd.load_value = m.load_value AND sd.repeat = m.repeat
WHERE t.sweep_id = $sweep_id
  AND (t.quality_verdict IN ('pass', 'warn') OR $all_quality)
GROUP BY ALL
ORDER BY m.workload, m.load_kind, m.load_value, runtime, config;
