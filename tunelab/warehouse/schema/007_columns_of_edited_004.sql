-- tunelab warehouse, schema version 7: the columns that edits of 004_receive_stamps.sql added after it was
-- first committed (same_read_itl_frac, load_processes, trials.measurement_notes). A warehouse that applied an
-- earlier 004 lacks them; on every other warehouse these statements change nothing. Applied migrations are
-- no longer edited: warehouse/migrate.py compares each applied file's sha256 with the recorded one.
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS same_read_itl_frac DOUBLE;
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS load_processes     INTEGER;
ALTER TABLE trials ADD COLUMN IF NOT EXISTS measurement_notes VARCHAR;
