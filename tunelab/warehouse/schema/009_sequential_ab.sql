-- tunelab warehouse, schema version 9: what a `replicates: auto` sweep decided (flows/ab_auto.py). The sweep
-- booted A and B in interleaved pairs and stopped when every deciding cell was decided (always-valid paired
-- interval, tunelab.stats.sequential) or its budget was spent. NULL for every other sweep.
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_baseline VARCHAR;       -- the baseline config's label (A)
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_candidate VARCHAR;      -- the candidate config's label (B)
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_call VARCHAR;           -- better | worse | equivalent | mixed | undecided (B against A)
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_stop_reason VARCHAR;    -- decided | budget_boots | budget_gpu_minutes | max_pairs | unusable_pairs | no_pairs
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_boots INTEGER;          -- boots started, both sides
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_pairs INTEGER;          -- usable pairs analysed
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_gpu_minutes DOUBLE;     -- device-minutes of the A/B's trials (slot taken -> trial end)
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS ab_verdicts JSON;          -- per deciding cell: call, rel_change, ci_low, ci_high, mde, n_pairs, alpha, method
