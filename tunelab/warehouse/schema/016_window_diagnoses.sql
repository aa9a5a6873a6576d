-- tunelab warehouse, schema version 16: bottleneck diagnosis per measured window (tunelab/core/diagnosis.py, issue
-- "Tuning: find the best config under an SLO, and say which bottleneck holds it back", item 3). One row per window
-- and check (api_server, kv_cache, prefill_interference, client, gpu_floor), flagged or not, with the figures it
-- rests on and the remedy to try. Thresholds and sources: docs/measurement.md, "Bottleneck diagnosis".
CREATE TABLE IF NOT EXISTS window_diagnoses (
    trial_id    VARCHAR NOT NULL,
    workload    VARCHAR NOT NULL,
    load_kind   VARCHAR NOT NULL,
    load_value  DOUBLE NOT NULL,
    repeat      INTEGER NOT NULL,
    bottleneck  VARCHAR NOT NULL,   -- api_server | kv_cache | prefill_interference | client | gpu_floor
    flagged     BOOLEAN,            -- the evidence crosses the thresholds; NULL: evidence missing
    metric      VARCHAR,            -- the deciding figure, e.g. preemptions, itl_p99_over_p50, tpot_over_floor
    value       DOUBLE,             -- its value
    threshold   DOUBLE,             -- the threshold it is compared with
    summary     VARCHAR,            -- one line of evidence figures
    evidence    JSON,               -- every figure the check used
    remedy      VARCHAR,            -- what to try
    sources     VARCHAR,            -- where the figures come from (vLLM metric names, /proc, NVML, client stamps)
    PRIMARY KEY (trial_id, workload, load_kind, load_value, repeat, bottleneck)
);

-- CPU of the server's processes in the window by role (API server, engine core, workers), cores.
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS server_process_cpu JSON;

-- The flagged findings, with the config they were measured on: one row per window and bottleneck found.
CREATE OR REPLACE VIEW window_findings AS
SELECT t.sweep_id, t.config_label, t.replicate, d.trial_id, d.workload, d.load_kind, d.load_value, d.repeat,
       d.bottleneck, d.metric, d.value, d.threshold, d.summary, d.remedy
FROM window_diagnoses d
JOIN trials t USING (trial_id)
WHERE d.flagged
ORDER BY t.sweep_id, t.config_label, t.replicate, d.workload, d.load_kind, d.load_value, d.repeat, d.bottleneck;
