-- tunelab warehouse, schema version 22: what a dataset workload did with its file (issue 29: real ShareGPT).
-- A dataset workload skips records that give no (prompt, answer) pair, as vllm bench serve does, and clips a text
-- prompt to the server's context when it sends it (tunelab.core.workloads.DATASET_RULE). The trial records, per dataset
-- workload, the file's sha256, the rule and the counts, so a result says which records it could have drawn from.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS dataset_filters JSON;  -- JSON list of {name, path, file_sha256, rule, records, used, skipped: {reason: count}}
