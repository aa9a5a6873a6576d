-- tunelab warehouse, schema version 8: steady-state windows (tasks/metrics.py steady_interval, docs/measurement.md
-- "Steady-state windows"). From version 8 a window's throughputs and latency percentiles count only its steady
-- part, where the target load held: the ramp-up before (the first wave being sent) and the drain after (the last
-- requests finishing after the last send) are recorded here and excluded. NULL for rows measured before version 8
-- and for imported `vllm bench serve` results, whose figures count the whole window.
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS steady_state BOOLEAN;       -- figures over the steady part; false: the window had none, all of it counts
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS steady_s DOUBLE;           -- seconds of the steady part (the rates' denominator)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS ramp_s DOUBLE;             -- seconds of ramp-up excluded (first send -> steady part)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS drain_s DOUBLE;            -- seconds of drain excluded (steady part -> window end)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS steady_requests INTEGER;   -- requests sent in the steady part (their latencies count)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS ramp_requests INTEGER;     -- requests sent during the ramp-up, excluded
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS drain_requests INTEGER;    -- requests sent during the drain, excluded
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS window_duration_s DOUBLE;  -- the plan's window duration (sends stop then); NULL: a window of a number of requests
