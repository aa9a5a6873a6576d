-- tunelab warehouse, schema version 12: where a trial ran and how its boot went when it was retried
-- (issue: several GPUs and several hosts). Trials of one sweep may run on several hosts (flows/hosts.py);
-- a transient boot failure (port in use, a corrupted compile cache) is booted once more.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS host VARCHAR;               -- the host that ran the trial (TUNELAB_HOST or its host name)
ALTER TABLE trials ADD COLUMN IF NOT EXISTS gpu_uuids VARCHAR;          -- NVML UUIDs of its GPUs, comma-separated
ALTER TABLE trials ADD COLUMN IF NOT EXISTS boot_attempts INTEGER;      -- boots started: 1, or 2 after a transient failure
ALTER TABLE trials ADD COLUMN IF NOT EXISTS boot_retry_reason VARCHAR;  -- 'class: reason' of the retried failure
ALTER TABLE trials ADD COLUMN IF NOT EXISTS failure_retryable BOOLEAN;  -- the failure says nothing about the config
