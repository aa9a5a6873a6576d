-- tunelab warehouse, schema version 20: why a search booted a config (tunelab.core.search.tpe, the plan's `search.guide`).
-- After a boot whose diagnosis (window_diagnoses, at the objective's cell) flags a bottleneck whose remedy is an
-- engine arg of the search space (search.REMEDY_MOVES), the next boot is that config with the knob moved one value
-- of the space; this column says which flag and which move. NULL: TPE's own suggestion, the default, a walk-down,
-- every trial that is no search boot.
ALTER TABLE trials ADD COLUMN IF NOT EXISTS search_reason VARCHAR;  -- e.g. 'diagnosis: api_server flagged in 2/2 windows of boot 1 (default) -> api-server-count 1 -> 2'
