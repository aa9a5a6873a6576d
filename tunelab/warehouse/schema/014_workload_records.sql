-- tunelab warehouse, schema version 14: what each workload of a trial was (issue 16: workload types).
-- A workload is a type (fixed, distribution, dataset, trace, ...) with parameters, and a dataset or trace
-- workload reads a file; the trial records them so a result names the exact lengths, file and seed it used.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS workloads JSON;      -- JSON list of {name, type, parameters, file_sha256}
