"""Re-judge each SLA-search level of the starting-flags sweep from its stored windows with tunelab's own rule
(tunelab.sla_search.judge_level), the plan's sla_search spec and SLO: also the levels of the search the
interrupt cut short (its sla_searches row was never written)."""
import sys

import duckdb
import yaml

from tunelab.sla_search import ERROR_RATE, FAILED, SENT, SlaSearchSpec, judge_level, slo_limits

db, sweep = sys.argv[1], sys.argv[2]
con = duckdb.connect(db, read_only=True)
plan = yaml.safe_load(con.execute("select plan_yaml from sweeps where sweep_id = ?", [sweep]).fetchone()[0])
spec = SlaSearchSpec(**plan["sla_search"])
limits = slo_limits(spec, ttft_s=plan["slo"]["ttft_s"], tpot_s=plan["slo"]["tpot_s"])
rows = con.execute("""select t.config_label, m.load_value, m.repeat, m.ttft_p99_s, m.tpot_p99_s, m.num_requests,
                             m.failed from measurements m join trials t using (trial_id)
                      where t.sweep_id = ? and m.sla_search_window order by 1, 2, 3""", [sweep]).fetchall()
levels: dict = {}
for cfg, c, _rep, ttft, tpot, n, failed in rows:
    levels.setdefault((cfg, c), []).append({"ttft_p99_s": ttft, "tpot_p99_s": tpot, ERROR_RATE: failed / n, FAILED: failed, SENT: n})
print(f"limits {limits}; confidence {spec.confidence}, looks {spec.looks}, "
      f"min {spec.min_windows_per_level} / max {spec.max_windows_per_level} windows per level")
for (cfg, c), ws in levels.items():
    verdict, b = judge_level(ws, limits, spec)
    parts = [f"{m} {x.centre:.3g} [{x.low:.3g}, {x.high:.3g}] vs {x.limit:g}" for m, x in b.items()]
    print(f"{cfg:12s} c={c:<5g} {len(ws)} window(s): {verdict:9s} " + "; ".join(parts))
