-- Question: which bottleneck holds each config back, in how many of its windows, and what to try?
-- One row per config x bottleneck flagged in at least one window (view window_findings, table window_diagnoses;
-- checks and thresholds: tunelab/core/bottleneck_rules.py, docs/measurement.md "Bottleneck diagnosis").
-- windows = windows flagged; checked = windows where the check had its evidence (flagged true or false);
-- value_median = median of the deciding figure over the flagged windows (unit: see metric).
-- Parameters:
--   $sweep_id  VARCHAR  one sweep, or NULL for all
-- Run (Python):  warehouse.query.run_query(con, "bottlenecks", sweep_id=None)
-- Run (duckdb CLI): PREPARE q AS <this statement>; EXECUTE q(sweep_id := NULL);
SELECT t.sweep_id, t.config_label, d.bottleneck, any_value(d.metric) AS metric,
       count(*) FILTER (WHERE d.flagged) AS windows,
       count(*) FILTER (WHERE d.flagged IS NOT NULL) AS checked,
       median(d.value) FILTER (WHERE d.flagged) AS value_median,
       any_value(d.remedy) AS remedy
FROM window_diagnoses d
JOIN trials t USING (trial_id)
WHERE ($sweep_id IS NULL OR t.sweep_id = $sweep_id)
GROUP BY t.sweep_id, t.config_label, d.bottleneck
HAVING count(*) FILTER (WHERE d.flagged) > 0
ORDER BY t.sweep_id, t.config_label, windows DESC, d.bottleneck
