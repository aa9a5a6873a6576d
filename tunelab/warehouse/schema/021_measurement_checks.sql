-- tunelab warehouse, schema version 21: measurement facts the numbers depend on (issue "Measurement").
-- requests.first_chunk_tokens: tokens of the first token chunk (the server's usage on it,
-- stream_options.continuous_usage_stats); TPOT = (E2EL - TTFT) / (output_tokens - first_chunk_tokens).
ALTER TABLE requests ADD COLUMN IF NOT EXISTS first_chunk_tokens INTEGER;
