-- tunelab warehouse, schema version 5: where a request ends, what the warm-up reached, how busy the client
-- kept the window, and whether the server compiled during the window (tasks/metrics.py, tasks/measure.py).
-- NULL for rows measured before version 5 and for imported `vllm bench serve` results.
--
-- requests.end_ts keeps its meaning (the stream's last byte, after the usage-only chunk and [DONE]); E2EL and
-- TPOT end at last_token_ts from version 5 on (before: at end_ts). For older rows the last token is
-- send_ts + chunk_offsets_s[-1].
ALTER TABLE requests ADD COLUMN IF NOT EXISTS last_token_ts DOUBLE;  -- epoch s of the last chunk carrying generated text: the request's end
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS peak_in_flight INTEGER;          -- most requests in flight at once in the window
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS in_flight_while_sending DOUBLE;  -- mean in flight from the first to the last send: the client's own evidence for client_bound
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS warmup_requests INTEGER;         -- warm-up requests sent before this load level's windows (0: none)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS warmup_peak_in_flight INTEGER;   -- most warm-up requests in flight at once (a concurrency level: its concurrency)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS compile_during_window BOOLEAN;   -- the server log shows compilation / graph capture written during the window; NULL: log not read
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS compile_log_lines VARCHAR;       -- those log lines, one per line (at most 20)
