-- tunelab warehouse, schema version 4: how each window's receive timestamps were taken, and how busy the
-- load generator was and with how many processes (tasks.loadgen.LevelResult). NULL for windows measured before version 4 and for
-- imported `vllm bench serve` results. And the trial's measurement notes, which were kept in failure_reason before.
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS rx_stamps         VARCHAR;  -- 'kernel' | 'read' | 'mixed'
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS read_delay_p99_s  DOUBLE;   -- p99 of read time - kernel receive time: what read-time stamps would have added
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS loop_lag_p99_s    DOUBLE;   -- p99 event-loop wake-up lateness of the busiest load process
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS same_read_itl_frac DOUBLE;  -- inter-chunk gaps whose two chunks came in one read (client behind)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS load_processes     INTEGER; -- load-generator processes of the window (plan.load_processes)
ALTER TABLE trials ADD COLUMN IF NOT EXISTS measurement_notes VARCHAR; -- what the measurement noticed about its windows (client, stamps, prompts), one per line
