-- tunelab warehouse, schema version 18: a plan's `search:` (tunelab.core.search.tpe, flows/search.py). Every boot of a search
-- is a normal trial; these columns say which search trial it was and what it gave. NULL for every other trial/sweep.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_role VARCHAR;         -- default | search | walk_down
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_trial INTEGER;        -- optuna trial number (NULL for the default)
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_state VARCHAR;        -- complete | infeasible | pruned | fail
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_value DOUBLE;         -- objective at its cell, mean of windows
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_slo_violation DOUBLE; -- largest relative excess over an SLO bound (<= 0: met)
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_walk_down VARCHAR;    -- what the memory walk-down lowered, e.g. 'max-num-seqs 256 -> 128'
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_walked_from VARCHAR;  -- config_key of the config that failed for memory
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_objective JSON;       -- {metric, direction, workload, load, slo, slo_percentile}
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_space JSON;           -- the plan's search.space
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_stop_reason VARCHAR;  -- budget_boots | budget_gpu_minutes | space_exhausted
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_boots INTEGER;        -- boots used, the default's and walk-downs included
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_grid_size BIGINT;     -- configs in the space's full grid (NULL: continuous)
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_gpu_minutes DOUBLE;   -- device-minutes of the search's trials
ALTER TABLE sweeps ADD COLUMN IF NOT EXISTS search_best_config_key VARCHAR; -- best config meeting the SLO (NULL: none)
