-- tunelab warehouse, schema version 24: staggered closed-loop starts (issue 28.2: lockstep waves).
-- Equal-length requests sent together under a closed loop finish together and refill together: the window runs in
-- waves, and a short window lands in one phase or the other (bimodal windows on the H200). A plan's
-- closed_loop_start 'staggered' (the default) spreads a level's c slots' first requests over one request's
-- duration; the window records over how many seconds (0: all at once; NULL: an open loop or an older row).
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS stagger_s DOUBLE;  -- seconds the slots' first sends were spread over
