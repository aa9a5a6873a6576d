-- tunelab warehouse, schema version 13: reasoning streams (issue 16, item 6). With a reasoning parser the
-- server streams the thinking (delta `reasoning`, older releases `reasoning_content`) before the answer's
-- `content`; TTFT and ITL count every token chunk, and the time to the first visible content is its own column.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS first_content_ts DOUBLE;    -- epoch s of the first visible content chunk
ALTER TABLE requests ADD COLUMN IF NOT EXISTS ttfc_s DOUBLE;              -- first_content_ts - send_ts, seconds
ALTER TABLE requests ADD COLUMN IF NOT EXISTS reasoning_chunks INTEGER;   -- chunks whose delta carried reasoning text
