-- tunelab warehouse, schema version 3: what the trial flow records about GPU hygiene and teardown.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS gpu_clean_at_boot       BOOLEAN;  -- NULL on a CPU host
ALTER TABLE trials ADD COLUMN IF NOT EXISTS foreign_gpu_processes   INTEGER;  -- compute processes not started by tunelab
ALTER TABLE trials ADD COLUMN IF NOT EXISTS gpu_baseline_excess_mib DOUBLE;   -- used memory above the sweep's baseline at boot
ALTER TABLE trials ADD COLUMN IF NOT EXISTS teardown_clean          BOOLEAN;  -- FALSE: the group survived SIGKILL or the port stayed busy
ALTER TABLE trials ADD COLUMN IF NOT EXISTS health_s                DOUBLE;   -- Popen -> first /health 200 (boot_s is to ready)
