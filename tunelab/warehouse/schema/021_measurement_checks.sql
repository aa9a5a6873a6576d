-- tunelab warehouse, schema version 21: measurement facts the numbers depend on (issue "Measurement").
-- requests.first_chunk_tokens: tokens of the first token chunk (the server's usage on it,
-- stream_options.continuous_usage_stats); TPOT = (E2EL - TTFT) / (output_tokens - first_chunk_tokens).
ALTER TABLE requests ADD COLUMN IF NOT EXISTS first_chunk_tokens INTEGER;
-- measurements: the prefix-cache reset right before the window and what came of it (a 200 with
-- {"success": false} did not take), whether the window's prompts share no prefix by design (quality check
-- cache_not_cold), control calls retried on a fresh connection, and an open-loop window the server fell behind
-- (overloaded: left out of comparisons, as sla_search_window).
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS prefix_cache_reset VARCHAR;
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS unique_prompts BOOLEAN;
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS control_retries INTEGER;
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS overloaded BOOLEAN;
-- trials.flag_proof: positive proof per env flag read from the live server (tunelab.tasks.flag_proof), e.g.
-- VLLM_USE_FASTOKENS proven by fastokens' native extension mapped in the API-server processes:
-- {flag: {value, status: proven | contradicted | unprovable, evidence}}.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS flag_proof JSON;
