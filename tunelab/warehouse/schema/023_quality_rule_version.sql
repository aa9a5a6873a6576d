-- tunelab warehouse, schema version 21: the version of the quality rules that judged each quality_checks row
-- (tunelab.core.quality_thresholds.RULE_VERSIONS; a changed threshold or check after data were judged is a new
-- version). NULL: the row was judged before versions were stamped ("unversioned"); `tunelab recheck` stamps today's.
ALTER TABLE quality_checks ADD COLUMN IF NOT EXISTS rule_version INTEGER;
