"""`tunelab compare` across sweeps goes through the anchor (issue 28.1): tunelab/warehouse/sweep_anchor.py and
the compare flow's "Across sweeps" section. Synthetic warehouses with a known sweep shift and no config effect."""

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from tunelab.core.plan import load_plan
from tunelab.warehouse.loader import insert_trial_tables
from tunelab.warehouse.migrate import connect
from tunelab.warehouse.sweep_anchor import plan_anchor, recorded_anchor
from tunelab.warehouse.synthetic import synthetic_trial

ANCHOR_PLAN = textwrap.dedent("""\
    name: nightly
    model: tiny-llama
    runtimes: {pinned: {}}
    anchor: {runtime: pinned, name: pinned}
    workloads: [{name: chat}]
    """)


def _add(con, **kw):
    st = synthetic_trial(**kw)
    trial = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in st.trial.items()}
    con.execute("BEGIN")
    insert_trial_tables(con, st.trial["trial_id"], {"sweep": pd.DataFrame([st.sweep]), "trial": pd.DataFrame([trial]),
                                                    **st.tables}, source="test")
    con.execute("COMMIT")


def _warehouse(path, *, plan_yaml, shift=0.2, history=False, boots=3, seed=1):
    """Sweep s1: config A and the anchor; sweep s2: config B (no effect) and the anchor, everything in s2
    shifted by ``shift`` (a sweep effect). ``history``: a config H in three more sweeps (sweep variance)."""
    import datetime as dt

    rng = np.random.default_rng(seed)
    akey = plan_anchor(ANCHOR_PLAN)[1]
    con = connect(path)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for i, (sweep, cfg, eff) in enumerate((("s1", "A", 0.0), ("s2", "B", shift))):
        for r in range(boots):
            for j, (rt, key) in enumerate((("synthetic", cfg), ("pinned", akey))):
                _add(con, sweep_id=sweep, config_key=key, runtime_name=rt, replicate=r, effect_rel=eff,
                     boot_sd_rel=0.01, repeat_sd_rel=0.005, rng=rng,
                     started_at=t0 + dt.timedelta(days=i, minutes=10 * (2 * r + j)))
    if history:
        for i, sweep in enumerate(("h1", "h2", "h3")):
            eff = (-0.1, 0.0, 0.1)[i]
            for r in range(2):
                _add(con, sweep_id=sweep, config_key="H", replicate=r, effect_rel=eff, boot_sd_rel=0.01, rng=rng,
                     started_at=t0 + dt.timedelta(days=10 + i, minutes=10 * r))
    con.execute("UPDATE sweeps SET plan_yaml = ? WHERE sweep_id IN ('s1', 's2')", [plan_yaml])
    con.close()
    return str(path)


def _compare(db, **kw):
    from tunelab.flows.compare import compare

    return compare.fn({"config_key": "A"}, {"config_key": "B"}, db=db, with_regressions=False, **kw)


def test_plan_anchor_is_the_key_the_plan_boots_its_anchor_under(tmp_path):
    text = textwrap.dedent("""\
        name: t
        model: /models/tiny
        runtimes: [cpu, new]
        engine_args: {max-model-len: 2048}
        variants: [{name: base}, {name: eager, engine_args: {enforce-eager: true}}]
        workloads: [{name: short, prompt_tokens: 32, output_tokens: 8, num_requests: 4}]
        concurrency: [1]
        replicates: 4
        """)
    text += "anchor: {runtime: cpu, name: pinned, engine_args: {max-model-len: 2048, max-num-seqs: 8}}\n"
    (tmp_path / "plan.yaml").write_text(text)
    at = load_plan(tmp_path / "plan.yaml").anchor_trial()
    assert plan_anchor(text) == (at.runtime, at.config_key)
    assert plan_anchor(text.split("anchor:")[0]) is None and plan_anchor("{not: [yaml") is None


def test_cross_sweep_compare_goes_through_the_recorded_anchor(tmp_path):
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    out = _compare(db)
    xs = pd.DataFrame(out["anchored"])
    assert len(xs) == 1 and bool(xs.anchored.iloc[0]) and xs.method.iloc[0] == "fixed sweep effects"
    assert out["anchor"] == f"pinned/{plan_anchor(ANCHOR_PLAN)[1]}"
    row = xs.iloc[0]
    # the +20 % sweep shift cancels through the anchor; the plain Welch interval on boot means keeps it
    assert row.verdict == "no significant change" and row.rel_low < 0 < row.rel_high
    assert row.welch_rel_low > 0.1
    md = out["markdown"]
    assert "## Across sweeps: anchored through pinned/" in md and "Welch on boot means" in md
    # said before the per-cell table that reads the sweep shift as an effect (found by a fresh user)
    assert md.index("The two sides ran in different sweeps") < md.index("| workload")
    assert "| anchored |" in md and "no significant change" in md
    # a verdict of B against A in its own rows is left as it was (same rows as without the section)
    assert out["rows"] and "verdict" in out["rows"][0]
    # the summary a script reads (`--json` "verdicts") is the anchored section's, not the per-cell rows' that read
    # the +20 % sweep shift as an effect (a fresh user: "worse" there for an A/A across two cards)
    assert out["verdicts_from"] == "across_sweeps" and out["verdicts"] == {"no significant change": 1}
    assert out["per_cell_verdicts"] == pd.DataFrame(out["rows"]).verdict.value_counts().to_dict()
    assert "better" in out["per_cell_verdicts"] or "worse" in out["per_cell_verdicts"]


def test_unanchored_cross_sweep_is_labelled_and_widened_by_history(tmp_path):
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=None, history=True)
    xs = pd.DataFrame(_compare(db)["anchored"])
    row = xs.iloc[0]
    assert not row.anchored and row.method == "unanchored" and row.anchored_text == "unanchored"
    assert "widened by the history's sweep variance" in row.note and row.var_sweep > 0
    # never narrower than the within-sweep (Welch) interval
    assert row.rel_high - row.rel_low > row.welch_rel_high - row.welch_rel_low
    md = _compare(db)["markdown"]
    assert "## Across sweeps: unanchored" in md


def test_anchor_none_gives_the_same_comparison_without_the_anchor(tmp_path):
    """``--anchor none``: the recorded anchor is left out on purpose, to show what it adds: the +20 % sweep shift
    stays in the estimate and the interval is widened by the history's sweep variance."""
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN, history=True)
    through, without = (pd.DataFrame(_compare(db, anchor=a)["anchored"]).iloc[0] for a in (None, "none"))
    assert through.anchored and not without.anchored and without.method == "unanchored"
    assert abs(through.rel) < 0.05 < without.rel  # the shift cancels only through the anchor
    assert without.rel_high - without.rel_low > through.rel_high - through.rel_low
    md = _compare(db, anchor="None")["markdown"]
    assert "## Across sweeps: unanchored" in md and "left out on purpose (`--anchor none`)" in md
    # each row's note is named by its row (config, runtimes, workload, load), in the table's order
    notes = md.split("Notes, per row:")[1].strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("- ") and " chat " in notes[0] and "SD " in notes[0]


def test_anchor_option_overrides_and_same_sweep_stays_as_it_was(tmp_path):
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=None)
    key = plan_anchor(ANCHOR_PLAN)[1]
    for name in (key, "pinned-label-absent"):
        if name == key:
            xs = pd.DataFrame(_compare(db, anchor=name)["anchored"])
            assert bool(xs.anchored.iloc[0]) and xs.verdict.iloc[0] == "no significant change"
        else:
            with pytest.raises(ValueError, match="--anchor 'pinned-label-absent'"):
                _compare(db, anchor=name)
    from tunelab.flows.compare import compare

    same = compare.fn({"config_key": "A"}, {"config_key": key}, db=db, with_regressions=False)
    assert same["anchored"] == [] and "Across sweeps" not in same["markdown"]
    assert same["verdicts_from"] == "per_cell" and same["verdicts"] == same["per_cell_verdicts"]


def test_series_default_anchor_is_the_recorded_one(tmp_path):
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    con = connect(db, read_only=True)
    try:
        assert recorded_anchor(con) == plan_anchor(ANCHOR_PLAN)
        con2 = None
    finally:
        con.close()
    db2 = _warehouse(tmp_path / "w2.duckdb", plan_yaml=None)
    con2 = connect(db2, read_only=True)
    try:
        assert recorded_anchor(con2) is None
    finally:
        con2.close()


def test_across_sweeps_the_anchored_family_decides_the_regression_not_the_per_cell_rows(tmp_path):
    """A -20 % sweep shift and no config effect: the per-cell row (no sweep term) calls B worse, the anchored row
    sees no change; the confirmed regressions (what raises the Prefect Regression state) follow the anchored,
    Holm-adjusted rows. Without the anchor in the plan, the unanchored widened rows decide the same way."""
    from tunelab.flows.compare import confirmed_regressions

    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN, shift=-0.2)
    out = _compare(db)
    per_cell = [r for r in out["rows"] if r["verdict"] == "worse"]
    assert per_cell, out["rows"]  # the sweep shift alone makes the per-cell row call it worse
    xs = pd.DataFrame(out["anchored"])
    assert {"family_verdict", "p_family"} <= set(xs.columns) and (xs.family_verdict != "worse").all()
    assert out["confirmed"] == []
    # The same per-cell rows without the cross-sweep rows would have confirmed it (the old behaviour).
    ab = pd.DataFrame(out["rows"])
    assert [c["kind"] for c in confirmed_regressions(ab, pd.DataFrame())] == ["ab_worse"] * len(per_cell)


def test_each_side_keeps_to_its_own_selections_sweeps(tmp_path):
    """Found by a fresh user: a baseline selected in sweep s1 whose config also ran in the candidate's sweep s2 had
    its s2 boots pulled in, and the 'across sweeps' rows compared within s2. Each side's boots now come from its
    own selection's sweeps only; the anchor links them."""
    import datetime as dt

    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    con = connect(db)
    rng = np.random.default_rng(5)
    for r in range(3):  # config A also in s2, 50 % slower there: it must not enter a baseline selected in s1
        _add(con, sweep_id="s2", config_key="A", replicate=10 + r, effect_rel=-0.5, boot_sd_rel=0.01, rng=rng,
             started_at=dt.datetime(2026, 1, 2, 5, r, tzinfo=dt.timezone.utc))
    con.close()
    from tunelab.flows.compare import compare

    out = compare.fn({"config_key": "A", "sweep_id": "s1"}, {"config_key": "B"}, db=db, with_regressions=False)
    xs = pd.DataFrame(out["anchored"])
    assert len(xs) == 1 and bool(xs.anchored.iloc[0]) and xs.method.iloc[0] == "fixed sweep effects", xs.T
    # the 20 % sweep shift cancels through the anchor; A's slow s2 boots did not make B look +100 % better
    assert xs.verdict.iloc[0] == "no significant change" and xs.rel_high.iloc[0] < 0.5


def test_the_same_config_in_two_sweeps_is_compared_through_the_anchor(tmp_path):
    """An A/A across sweeps (issue 28's two-sweep A/A): config A in sweep s1 and again in s2, everything in s2
    shifted by +20 %. This was refused ("a and b are both ..."); now each side's boots are its own sweep's, the
    anchor takes the shift out, and the plain Welch interval on boot means keeps it."""
    import datetime as dt

    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    con = connect(db)
    rng = np.random.default_rng(9)
    akey = plan_anchor(ANCHOR_PLAN)[1]
    for r in range(3):  # A in s2 too, with s2's +20 % sweep effect and no config effect
        _add(con, sweep_id="s2", config_key="A", replicate=10 + r, effect_rel=0.2, boot_sd_rel=0.01,
             repeat_sd_rel=0.005, rng=rng, started_at=dt.datetime(2026, 1, 2, 6, r, tzinfo=dt.timezone.utc))
    con.close()
    from tunelab.flows.compare import compare

    out = compare.fn({"config_key": "A", "sweep_id": "s1"}, {"config_key": "A", "sweep_id": "s2"}, db=db,
                     with_regressions=False)
    xs = pd.DataFrame(out["anchored"])
    assert len(xs) == 1 and bool(xs.anchored.iloc[0]), xs.T
    assert out["anchor"] == f"pinned/{akey}"
    row = xs.iloc[0]
    assert row.verdict == "no significant change" and row.rel_low < 0 < row.rel_high
    assert row.welch_rel_low > 0.1  # the sweep shift, seen by the plain interval
    assert out["confirmed"] == []
    # Both sides in the same sweep is not a comparison across sweeps: refused with the fix named.
    from tunelab.warehouse.anchored_compare import anchored_cells

    con = connect(db, read_only=True)
    try:
        with pytest.raises(ValueError, match="give each side its own sweeps"):
            anchored_cells(con, "output_tokens_per_s", ("synthetic", "A"), ("synthetic", "A"),
                           side_sweeps=(["s1", "s2"], ["s2"]))
    finally:
        con.close()


def test_a_key_on_several_runtimes_is_paired_runtime_by_runtime(tmp_path):
    """The versions case: config A in sweep s1 on one runtime; in sweep s2 on that runtime and on a newer one.
    Without a runtime in the candidate's selector the key is on two runtimes there: both are compared with the
    baseline's one runtime (the key was dropped silently before), each row naming its runtimes."""
    import datetime as dt

    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    con = connect(db)
    rng = np.random.default_rng(11)
    for r in range(3):
        for rt in ("synthetic", "newer"):
            _add(con, sweep_id="s2", config_key="A", runtime_name=rt, replicate=20 + r, effect_rel=0.2,
                 boot_sd_rel=0.01, repeat_sd_rel=0.005, rng=rng,
                 started_at=dt.datetime(2026, 1, 2, 7, 2 * r + (rt == "newer"), tzinfo=dt.timezone.utc))
    con.close()
    from tunelab.flows.compare import compare

    out = compare.fn({"config_key": "A", "sweep_id": "s1"}, {"config_key": "A", "sweep_id": "s2"}, db=db,
                     with_regressions=False)
    xs = pd.DataFrame(out["anchored"])
    assert sorted(xs.runtimes) == ["synthetic", "synthetic -> newer"], xs.T
    assert (xs.verdict == "no significant change").all() and xs.anchored.all()
    assert "| A | synthetic -> newer |" in out["markdown"]


def _cross(db, anchor, baseline=None, candidate=None):
    from tunelab.warehouse.sweep_anchor import cross_sweep_compare

    con = connect(db, read_only=True)
    try:
        return cross_sweep_compare(con, baseline or {"config_key": "A"}, candidate or {"config_key": "B"},
                                   "output_tokens_per_s", anchor=anchor)
    finally:
        con.close()


def test_anchor_that_is_a_compared_side_says_so_and_lists_the_anchors(tmp_path):
    """Found by a fresh user: ``--anchor <the twin's key>`` said "... give one config key" (or compared nothing);
    the anchor can be none of the compared sides, and the message names the side and the configs that can be."""
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    akey = plan_anchor(ANCHOR_PLAN)[1]
    for name, side in (("A", "baseline"), ("B", "candidate")):
        with pytest.raises(ValueError) as e:
            _cross(db, name)
        msg = str(e.value)
        assert f"--anchor {name!r} names the {side} (synthetic/{name} " in msg, msg
        assert "the anchor cannot be one of the compared sides" in msg and "give one config key" not in msg
        # the pinned anchor is in both sweeps; A and B are each in one (and a side): only the anchor is offered
        assert f"can serve as anchor (measured in every compared sweep): {akey} ({akey!r} on pinned)" in msg
        assert f"--anchor KEY (e.g. --anchor {akey}), or --anchor none" in msg


def test_anchor_bogus_names_the_value_and_the_valid_anchors(tmp_path):
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=ANCHOR_PLAN)
    akey = plan_anchor(ANCHOR_PLAN)[1]
    con = connect(db)
    con.execute("UPDATE trials SET config_label = 'the-anchor' WHERE config_key = ?", [akey])
    con.close()
    with pytest.raises(ValueError) as e:
        _cross(db, "bogus")
    msg = str(e.value)
    assert msg.startswith("--anchor 'bogus': no ok trial has that config key or label in the compared sweeps (s1, s2)")
    assert f"{akey} ('the-anchor' on pinned)" in msg and "--anchor none" in msg
    # the label works as the key does
    assert _cross(db, "the-anchor").attrs["anchor"] == ("pinned", akey)


def test_anchor_key_is_matched_ignoring_case(tmp_path):
    """Keys are lower-case hex; ``--anchor NONE`` was accepted, ``--anchor 630C1D61A446`` was not."""
    db = _warehouse(tmp_path / "w.duckdb", plan_yaml=None)
    akey = plan_anchor(ANCHOR_PLAN)[1]
    assert akey != akey.upper()
    xs = _cross(db, f" {akey.upper()} ")
    assert xs.attrs["anchor"] == ("pinned", akey) and xs.attrs["anchor_source"] == "--anchor"
    assert bool(xs.anchored.iloc[0]) and xs.anchored_text.iloc[0] == f"anchored through pinned/{akey}"
