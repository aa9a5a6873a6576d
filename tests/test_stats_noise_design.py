"""Noise model (tunelab/stats/noise_model.py, warehouse/noise_history.py, queries/noise_model.sql) on synthetic data with known
variance components, and the design math (tunelab/stats/design.py)."""

import math

import numpy as np
import pandas as pd
import pytest

from tunelab.stats.design import ab_half_width, optimal_design, pilot_design
from tunelab.stats.noise_model import quantile_factor, request_components, variance_components


def _nested(rng, *, cells=200, boots=4, windows=3, sd_boot=0.08, sd_window=0.05, base=1000.0):
    rows = []
    for c in range(cells):
        for k in range(boots):
            b = rng.normal(0, sd_boot)
            for j in range(windows):
                rows.append({"cell": c, "trial_id": f"{c}/{k}", "value": base * math.exp(b + rng.normal(0, sd_window)),
                             "window_s": 10.0, "boot_s": 60.0})
    return pd.DataFrame(rows)


def test_components_are_recovered_on_average_over_many_cells():
    # 1000 cells of 4 boots x 3 windows, true SDs 8 % (boot) and 5 % (window). The estimator is unbiased
    # (before truncation): the mean over cells is within 3 SE of the truth (SE from the cells' spread; the
    # uncorrected variance of boot means is 4 SE off).
    comp = variance_components(_nested(np.random.default_rng(0), cells=1000), ["cell"])
    for col, truth in (("var_boot_raw", 0.08**2), ("var_window", 0.05**2)):
        est = comp[col]
        assert abs(est.mean() - truth) < 3 * est.std() / math.sqrt(len(est)), (col, est.mean(), truth)
    assert (comp.df_boot == 3).all() and (comp.df_window == 8).all() and (comp.boots == 4).all()
    assert comp.window_s.iloc[0] == 10.0 and comp.boot_s.iloc[0] == 60.0


def test_one_cell_with_many_boots_is_within_stated_tolerance():
    # one cell, 60 boots x 5 windows: var_boot within 30 % and var_window within 12 % (about 2 SE each)
    comp = variance_components(_nested(np.random.default_rng(1), cells=1, boots=60, windows=5), ["cell"]).iloc[0]
    assert comp.sd_boot_rel == pytest.approx(0.08, rel=0.15)  # sd within 15 % = variance within ~30 %
    assert comp.sd_window_rel == pytest.approx(0.05, rel=0.06)


def test_unbalanced_cells_and_a_single_boot():
    df = _nested(np.random.default_rng(2), cells=1, boots=5, windows=4)
    df = df.drop(index=[0, 1, 5]).reset_index(drop=True)  # boots with 2, 3, 4, 4, 4 windows
    one = _nested(np.random.default_rng(3), cells=1, boots=1, windows=3).assign(cell=9)
    comp = variance_components(pd.concat([df, one]), ["cell"]).set_index("cell")
    assert comp.loc[0, "windows"] == 17 and comp.loc[0, "df_window"] == 12
    assert math.isnan(comp.loc[9, "var_boot"]) and comp.loc[9, "df_boot"] == 0
    with pytest.raises(ValueError, match="missing columns"):
        variance_components(df.drop(columns=["value"]), ["cell"])


def test_request_component_and_quantile_factors():
    rng = np.random.default_rng(4)
    r = pd.DataFrame({"cell": 0, "trial_id": np.repeat(["a", "b"], 500), "repeat": np.tile(np.repeat([0, 1], 250), 2),
                      "tpot_s": np.exp(rng.normal(-6, 0.2, 1000))})
    rc = request_components(r, ["cell"], "tpot_s").iloc[0]
    assert rc.var_request == pytest.approx(0.04, rel=0.15) and rc.requests_per_window == 250
    assert quantile_factor("tpot_mean_s") == 1.0
    assert quantile_factor("tpot_p50_s") == pytest.approx(math.pi / 2, rel=1e-6)
    assert quantile_factor("ttft_p99_s") > quantile_factor("ttft_p90_s") > quantile_factor("ttft_p50_s")
    assert math.isnan(quantile_factor("output_tokens_per_s"))


def test_warehouse_noise_model_and_sql_agree(tmp_path):
    import json

    from tunelab.warehouse.loader import insert_trial_tables
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.noise_history import noise_model
    from tunelab.warehouse.query import run_query
    from tunelab.warehouse.synthetic import synthetic_trial

    con = connect(":memory:")
    rng = np.random.default_rng(5)
    for r in range(5):
        st = synthetic_trial(sweep_id="sw", config_key="A", replicate=r, boot_sd_rel=0.08, repeat_sd_rel=0.04,
                             repeats=4, requests_per_repeat=20, rng=rng)
        trial = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in st.trial.items()}
        con.execute("BEGIN")
        insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]),
                                                        "trial": pd.DataFrame([trial]), **st.tables}, source="test")
        con.execute("COMMIT")
    py = noise_model(con, "output_tokens_per_s").iloc[0]
    sql = run_query(con, "noise_model", metric="output_tokens_per_s", config_key="A").iloc[0]
    assert (py.boots, py.windows) == (5, 20)
    for col in ("var_boot", "var_window", "df_boot", "df_window", "window_s"):
        assert sql[col] == pytest.approx(py[col], rel=1e-9), col
    assert 0.02 < py.sd_boot_rel < 0.2 and 0.02 < py.sd_window_rel < 0.07
    lat = noise_model(con, "ttft_p50_s").iloc[0]  # latency: the request level is filled in
    assert lat.requests_per_window == 20 and lat.var_request > 0
    assert lat.var_window_slow == pytest.approx(max(0.0, lat.var_window - lat.var_request_part))
    con.close()


def test_optimal_design_reaches_the_target_at_least_cost_and_follows_kalibera_jones():
    # c=32 on the H200: boot SD 5 %, window SD 8 % (1 s windows: much of it request sampling), boot 80 s.
    d = optimal_design(0.05**2, 0.08**2, boot_s=80.0, window_s=10.0, half_width=0.05)
    assert d.reachable and d.half_width <= 0.05
    assert d.half_width == pytest.approx(ab_half_width(0.05**2, 0.08**2, d.boots_per_config, d.windows_per_boot))
    # least cost: no other (boots, windows) that reaches the target is cheaper
    for nw in range(1, 21):
        for nb in range(2, 41):
            if ab_half_width(0.05**2, 0.08**2, nb, nw) <= 0.05:
                assert nb * (80 + nw * 10) >= d.gpu_s_per_config - 1e-9
                break
    # more windows when boots are dearer relative to windows (K&J: n_w ~ sqrt(var_w c_b / (var_b c_w)))
    cheap_boot = optimal_design(0.05**2, 0.08**2, boot_s=5.0, window_s=10.0, half_width=0.05)
    dear_boot = optimal_design(0.05**2, 0.08**2, boot_s=500.0, window_s=1.0, half_width=0.05)
    assert cheap_boot.windows_per_boot < d.windows_per_boot <= dear_boot.windows_per_boot


def test_unreachable_target_says_what_it_would_take():
    # boot SD 10 % (c=1 on the H200): +-3 % needs more than 40 boots per side
    d = optimal_design(0.10**2, 0.11**2, boot_s=80.0, window_s=12.0, half_width=0.03)
    assert not d.reachable and d.half_width > 0.03 and "out of reach" in d.note and d.boots_per_config == 40


def test_pilot_and_bad_input():
    p = pilot_design()
    assert p.pilot and (p.boots_per_config, p.windows_per_boot) == (3, 3) and math.isnan(p.half_width)
    with pytest.raises(ValueError, match="var_boot"):
        optimal_design(-1.0, 0.01, 60.0, 10.0, 0.03)
    with pytest.raises(ValueError, match="half_width"):
        optimal_design(0.01, 0.01, 60.0, 10.0, 0.0)


def test_sla_search_windows_are_left_out_of_the_noise_model_in_python_and_sql():
    import json

    from tunelab.warehouse.loader import insert_trial_tables
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.noise_history import noise_model
    from tunelab.warehouse.query import run_query
    from tunelab.warehouse.synthetic import synthetic_trial

    def insert(con, st):
        trial = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in st.trial.items()}
        con.execute("BEGIN")
        insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]),
                                                        "trial": pd.DataFrame([trial]), **st.tables}, source="test")
        con.execute("COMMIT")

    con = connect(":memory:")
    rng = np.random.default_rng(11)
    boots = [synthetic_trial(sweep_id="sw", config_key="A", replicate=r, boot_sd_rel=0.05, repeat_sd_rel=0.03,
                             repeats=3, requests_per_repeat=20, rng=rng) for r in range(4)]
    for st in boots:
        insert(con, st)

    def figures():
        py = noise_model(con, "output_tokens_per_s").iloc[0]
        sql = run_query(con, "noise_model", metric="output_tokens_per_s", config_key="A").iloc[0]
        lat = noise_model(con, "ttft_p50_s").iloc[0]
        return ((int(py.boots), int(py.windows), py.var_boot, py.var_window),
                (int(sql.boots), int(sql.windows), sql.var_boot, sql.var_window),
                (lat.var_request, lat.requests_per_window))

    clean = figures()
    # a fifth boot of only SLA-search windows (overloaded: -80 %, noisy, its own requests): left out
    st = synthetic_trial(sweep_id="sla", config_key="A", replicate=9, effect_rel=-0.8, repeat_sd_rel=0.3,
                         repeats=3, requests_per_repeat=50, rng=rng)
    st.tables["measurements"]["sla_search_window"] = True
    insert(con, st)
    # and SLA-search windows inside a plan boot, at the plan's level: boot 0 again with three more windows
    # (repeats 3..5, throughput -80 %, requests 10x slower) marked as the search's
    st0 = boots[0]
    m, q = st0.tables["measurements"].copy(), st0.tables["requests"].copy()
    m["sla_search_window"] = None
    extra_m, extra_q = m.copy(), q.copy()
    extra_m["repeat"] += 3
    extra_m["sla_search_window"] = True
    extra_m["output_tokens_per_s"] *= 0.2
    extra_q["repeat"] += 3
    extra_q["ttft_s"] *= 10 * rng.lognormal(0, 0.5, len(extra_q))
    st0.tables["measurements"] = pd.concat([m, extra_m], ignore_index=True)
    st0.tables["requests"] = pd.concat([q, extra_q], ignore_index=True)
    insert(con, st0)
    after = figures()
    assert after[0][:2] == clean[0][:2] == after[1][:2] == (4, 12)
    for a, b in zip(after, clean):
        assert a == pytest.approx(b, rel=1e-9)
    con.close()
