-- tunelab warehouse, schema version 15: multi-turn sessions (issue 16, item 4). Each turn of a session sends the
-- conversation so far; the prefix cache can serve the part it has seen, which the server reports per request
-- (usage.prompt_tokens_details.cached_tokens, with vllm serve --enable-prompt-tokens-details).
ALTER TABLE requests ADD COLUMN IF NOT EXISTS session_index INTEGER;        -- the session in its window (0-based)
ALTER TABLE requests ADD COLUMN IF NOT EXISTS turn INTEGER;                 -- the turn in its session (0-based)
ALTER TABLE requests ADD COLUMN IF NOT EXISTS cached_prompt_tokens INTEGER; -- prompt tokens from the prefix cache

-- Per turn of a multi-turn workload: how much of the prompt the prefix cache served, and the TTFT that follows.
-- The window's server-side counters (vLLM /metrics prefix_cache_hits / prefix_cache_queries) are in server_metrics.
CREATE OR REPLACE VIEW turn_prefix_cache AS
SELECT trial_id, workload, load_kind, load_value, repeat, turn,
       count(*) AS requests,
       count(*) FILTER (WHERE ok) AS ok_requests,
       avg(prompt_tokens) AS prompt_tokens_mean,
       avg(cached_prompt_tokens) AS cached_prompt_tokens_mean,
       sum(cached_prompt_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_prompt_tokens IS NOT NULL), 0)
           AS cached_frac,
       median(ttft_s) FILTER (WHERE ok) AS ttft_p50_s
FROM requests
WHERE turn IS NOT NULL
GROUP BY ALL;
