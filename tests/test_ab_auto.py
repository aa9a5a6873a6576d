"""``replicates: auto``: the plan's A/B declaration, and the real ``tuning_sweep`` flow booting A and B in pairs with a
FAKE trial body (no server: a synthetic bundle with an injected effect and boot-level noise, see
``tunelab.warehouse.synthetic``) on a FAKE one-GPU inventory (as tests/test_flows.py and
tests/fakes/fake_sweep_cli.py do). Prefect runs ephemeral.

The sweep stops early when the effect is large and runs to its budget when there is none."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml

from tunelab.core.plan import Plan, PlanError, load_plan

_FAKE_LOG: list[dict] = []
#: Relative throughput effect of the candidate config (max-num-batched-tokens 2048) in the fake trials.
_EFFECT = {"value": 0.0}
BOOT_SD = 0.03


def _plan_dict(**ab) -> dict:
    return {"name": "ab-auto", "model": "fake-model", "runtime": "gpu-fake",
            "engine_args": {"max-num-batched-tokens": [8192, 2048]},
            "workloads": [{"name": "chat", "prompt_tokens": 16, "output_tokens": 8, "num_requests": 6}],
            "concurrency": [4], "repeats": 3, "replicates": "auto",
            "ab": {"baseline": "max-num-batched-tokens=8192", "metrics": ["output_tokens_per_s"], "loads": ["c=4"],
                   **ab}}


# -- the plan ----------------------------------------------------------------------------------------------------
def test_plan_auto_expands_to_interleaved_pairs_up_to_the_budget():
    plan = Plan.model_validate(_plan_dict(budget={"boots": 8}))
    a, b = plan.ab_pair()
    assert a.label == "max-num-batched-tokens=8192" and b.label == "max-num-batched-tokens=2048"
    order = [(t.label.split("=")[1], t.replicate) for t in plan.trials()]
    # abba: A B, B A, A B, B A; boot i of each side is pair i.
    assert order == [("8192", 0), ("2048", 0), ("2048", 1), ("8192", 1), ("8192", 2), ("2048", 2), ("2048", 3),
                     ("8192", 3)]
    plan = Plan.model_validate(_plan_dict(budget={"boots": 8}, order="abab", baseline="max-num-batched-tokens=2048"))
    assert [t.label.split("=")[1] for t in plan.trials()][:4] == ["2048", "8192", "2048", "8192"]
    assert len(Plan.model_validate(_plan_dict(budget={"gpu_minutes": 5})).trials()) == 40  # MAX_AUTO_PAIRS pairs


def test_a_budget_too_small_to_decide_without_history_is_warned_before_any_boot(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tunelab.cli import app
    from tunelab.flows.ab_auto import ab_cells, budget_warnings
    from tunelab.stats.sequential import first_finite_pair

    assert first_finite_pair(0.05) == 3 and first_finite_pair(0.0125) == 4  # no finite interval before that pair
    small = Plan.model_validate(_plan_dict(budget={"boots": 4}))  # 2 pairs, one cell at alpha 0.05: needs 3
    (msg,) = budget_warnings(small, {})
    assert "2 pair(s) cannot decide 1 of 1 cell(s)" in msg and "at least 6" in msg
    # with history of both configs for the cell (the noise model's prior) the first pair already has an interval
    assert budget_warnings(small, {ab_cells(small)[0]: (0.05, 8.0)}) == []
    assert budget_warnings(Plan.model_validate(_plan_dict(budget={"boots": 6})), {}) == []
    # four cells share alpha: 0.0125 each needs 4 pairs, so 6 boots no longer suffice
    four = Plan.model_validate(_plan_dict(budget={"boots": 6}, metrics=["output_tokens_per_s", "tpot_p50_s",
                                                                        "ttft_p50_s", "e2el_p50_s"]))
    assert "until pair 4" in budget_warnings(four, {})[0]
    # plan check says so (an empty tunelab home: no warehouse, no history)
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    p = tmp_path / "small.yaml"
    p.write_text(json.dumps(_plan_dict(budget={"boots": 4})))
    r = CliRunner().invoke(app, ["plan", "check", str(p)])
    assert "ab.budget: 2 pair(s) cannot decide" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("change, message", [
    ({"ab": None}, "replicates: auto needs an `ab:` declaration"),
    ({"replicates": 2}, "ab: an A/B declaration decides a sweep only with replicates: auto"),
    ({"engine_args": {"max-num-batched-tokens": [1, 2, 3]}}, "compares two configs, but this plan gives 3"),
    ({"ab": {"metrics": ["output_tokens_per_s"], "budget": {}}}, "give boots and/or gpu_minutes"),
    ({"ab": {"metrics": ["output_tokens_ps"], "budget": {"boots": 8}}}, "did you mean 'output_tokens_per_s'"),
    ({"ab": {"metrics": ["tpot_p50_s"], "loads": ["c=32"], "budget": {"boots": 8}}},
     r"ab.loads\[0\]: 'c=32' is not a load level of the plan; use one of \['c=4'\]"),
    ({"ab": {"metrics": ["tpot_p50_s"], "baseline": "eager", "budget": {"boots": 8}}}, "ab.baseline: 'eager'"),
    ({"ab": {"metrics": ["tpot_p50_s"], "budget": {"boots": 2}}}, "boots"),
])
def test_plan_ab_errors_name_the_field_and_the_fix(tmp_path, change, message):
    d = _plan_dict(budget={"boots": 8})
    d.update(change)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(PlanError, match=message):
        load_plan(p)


# -- the sweep on a FAKE host --------------------------------------------------------------------------------------
def _fake_trial_flow():
    from prefect import flow

    from tunelab.core.bundle import write_bundle
    from tunelab.flows.trial import trial_row_base
    from tunelab.warehouse.synthetic import synthetic_trial

    @flow(name="trial", validate_parameters=False)
    def fake_trial(trial, trial_id, plan, runtime, ctx, window_check=None):
        """FAKE trial: no server; a synthetic bundle whose throughput has the candidate's effect and a boot-level
        factor drawn per boot (seeded by config and boot), plus 1 % window-to-window noise."""
        candidate = str(trial.engine_args.get("max-num-batched-tokens")) == "2048"
        rng = np.random.default_rng([int(candidate), trial.replicate, 14])
        row = trial_row_base(trial, trial_id, ctx.sweep.sweep_id, runtime, ctx)
        syn = synthetic_trial(sweep_id=ctx.sweep.sweep_id, config_key=trial.config_key, replicate=trial.replicate,
                              effect_rel=_EFFECT["value"] if candidate else 0.0, boot_sd_rel=BOOT_SD,
                              repeat_sd_rel=0.01, requests_per_repeat=6, chunk_offsets=4, rng=rng)
        tables = {k: v.assign(trial_id=trial_id) for k, v in syn.tables.items() if k != "quality_checks"}
        m = tables["measurements"]  # the columns the quality gate needs that synthetic trials leave out
        tables["measurements"] = m.assign(tpot_p50_s=m["tpot_mean_s"], itl_mean_s=m["tpot_mean_s"],
                                          achieved_concurrency=m["load_value"], client_cpu_frac=0.1)
        row.update(status="ok", boot_s=0.5, teardown_s=0.1, teardown_clean=True,
                   finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
        _FAKE_LOG.append({"candidate": candidate, "replicate": trial.replicate})
        return write_bundle(Path(ctx.results_dir), ctx.sweep, row, tables)

    return fake_trial


@pytest.fixture
def fake_host(monkeypatch):
    import tunelab.flows.sweep as S
    from tunelab.host.runtime import Runtime
    from tunelab.tasks.gpu import GpuInfo, Inventory

    rt = Runtime(name="gpu-fake", device="cuda", python=sys.executable, versions={"vllm": "0.32.0"})
    monkeypatch.setattr(S, "run_trial", _fake_trial_flow())
    monkeypatch.setattr(S, "inventory", lambda: Inventory(True, driver_version="fake", cuda_version="12.9", gpus=[
        GpuInfo(0, "FAKE H200", "GPU-fake-0", 143771.0, 500.0)]))
    monkeypatch.setattr(S, "preflight", lambda plan: {"gpu-fake": rt})
    monkeypatch.setattr(S, "stop_leftovers", lambda log=None: [])
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    _FAKE_LOG.clear()


def _sweep(tmp_path: Path, effect: float, **ab):
    from tunelab.flows.sweep import tuning_sweep

    _EFFECT["value"] = effect
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(_plan_dict(**ab)))
    return tuning_sweep(str(p), db=str(tmp_path / "wh.duckdb"), results=str(tmp_path / "results"), plots=False)


def _sweep_row(out) -> dict:
    con = duckdb.connect(out.db, read_only=True)
    try:
        cur = con.execute("SELECT * FROM sweeps WHERE sweep_id = ?", [out.sweep_id])
        return dict(zip([d[0] for d in cur.description], cur.fetchone()))
    finally:
        con.close()


def test_large_effect_stops_early(fake_host, tmp_path):
    out = _sweep(tmp_path, 0.30, budget={"boots": 16})
    ab = out.ab
    assert ab.stop_reason == "decided" and ab.call == "better"
    assert 4 <= ab.boots < 16 and ab.boots == len(_FAKE_LOG) == len(out.trials)  # stopped before the budget
    v = ab.verdicts[0]
    assert v["ci_low"] > 0 and v["ci_low"] < 0.30 < v["ci_high"] and v["n_pairs"] == ab.pairs == ab.boots // 2
    # Boots in pairs, A B then B A: never two pairs of the same order in a row.
    sides = [e["candidate"] for e in _FAKE_LOG]
    assert sides[:4] == [False, True, True, False] and all(sides[i] != sides[i + 1] for i in range(0, len(sides), 2))
    row = _sweep_row(out)  # recorded with the sweep
    assert (row["ab_call"], row["ab_stop_reason"], row["ab_boots"], row["ab_pairs"]) == ("better", "decided",
                                                                                        ab.boots, ab.pairs)
    assert row["ab_candidate"] == "max-num-batched-tokens=2048" and row["ab_gpu_minutes"] > 0
    assert '"call": "better"' in row["ab_verdicts"]


def test_no_effect_runs_to_the_budget(fake_host, tmp_path):
    out = _sweep(tmp_path, 0.0, budget={"boots": 12})
    ab = out.ab
    assert ab.call == "undecided" and ab.stop_reason == "budget_boots"
    assert ab.boots == 12 == len(_FAKE_LOG) and ab.pairs == 6
    v = ab.verdicts[0]
    assert v["call"] == "undecided" and v["ci_low"] < 0 < v["ci_high"]
    assert _sweep_row(out)["ab_call"] == "undecided"
