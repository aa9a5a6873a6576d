-- tunelab warehouse, schema version 19: which measured windows the plan's `sla_search:` ran (tasks/sla_search.py).
-- The search pushes the server past its SLO on purpose; its windows are judged by the search's own SLO bounds, so
-- the quality gate's load checks and the compare / A/B per-level means leave them out (docs/sla_search.md).
-- TRUE: a search window; NULL (or FALSE): one of the plan's own windows.
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS sla_search_window BOOLEAN;
