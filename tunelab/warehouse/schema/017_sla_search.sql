-- tunelab warehouse, schema version 17: SLA search on one boot (issue "Tuning: find the best config under an SLO",
-- item 1). Per trial and workload: the highest load (concurrency or request rate) at which the plan's slo: held,
-- found by growing the level geometrically and bisecting (tunelab/core/search/sla.py, docs/sla_search.md). The search's
-- windows are ordinary measurements rows at their load levels; this row is its verdict.
CREATE TABLE IF NOT EXISTS sla_searches (
    trial_id                      VARCHAR NOT NULL,
    workload                      VARCHAR NOT NULL,
    load_kind                     VARCHAR NOT NULL,  -- concurrency | rate
    verdict                       VARCHAR NOT NULL,  -- found | met_at_max | none
    max_load                      DOUBLE,            -- highest level counted as meeting the SLO; NULL: none
    max_load_shown                BOOLEAN,           -- its bounds were under the limits (else: point estimate)
    first_fail                    DOUBLE,            -- lowest level counted as failing; NULL: met_at_max
    nearest_load                  DOUBLE,            -- verdict none: the level closest to its limits
    goodput_per_s                 DOUBLE,            -- at max_load, mean of its windows
    request_throughput_per_s      DOUBLE,            -- at max_load
    output_tokens_per_s           DOUBLE,            -- at max_load
    knee_load                     DOUBLE,            -- knee of the latency-throughput curve (Kneedle)
    knee_request_throughput_per_s DOUBLE,            -- at the knee
    limits                        JSON,              -- metric -> limit judged
    spec                          JSON,              -- the plan's sla_search
    levels                        JSON,              -- every level tried, in order, with verdict and bounds
    levels_tried                  INTEGER,
    windows                       INTEGER,
    summary                       VARCHAR,           -- one line, as the sweep report prints it
    PRIMARY KEY (trial_id, workload)
);

-- One row per SLA search with its config, for comparing configs by the load they sustain under the SLO.
CREATE OR REPLACE VIEW sla_search_results AS
SELECT t.sweep_id, t.config_key, t.config_label, t.runtime_name, t.replicate, s.trial_id, s.workload, s.load_kind,
       s.verdict, s.max_load, s.max_load_shown, s.first_fail, s.nearest_load, s.goodput_per_s,
       s.request_throughput_per_s, s.output_tokens_per_s, s.knee_load, s.levels_tried, s.windows, s.summary
FROM sla_searches s JOIN trials t USING (trial_id);
