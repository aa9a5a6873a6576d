"""benchmarks/versions_anchored_report.py: two runs' exports joined into one history and read through the product's
compare path. The committed H200 A/A with an anchor (evidence/h200-2026-12-03-aa-anchored) is split by sweep into two
runs here (an "earlier" and a "later" export, as two hosts would write them): the within-sweep section compares the
twin with the anchor, the across-sweep section reads the twin through the anchor and with ``--anchor none``, with the
plain Welch interval beside each."""

import importlib.util
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "evidence" / "h200-2026-12-03-aa-anchored" / "warehouse"


def _split_by_sweep(dest: Path) -> list[Path]:
    """One export folder per sweep of the committed run: every table's rows of that sweep's trials."""
    sweeps = [r[0] for r in duckdb.sql(f"SELECT sweep_id FROM '{FOLDER}/sweeps.parquet' ORDER BY started_at").fetchall()]
    runs = []
    for i, s in enumerate(sweeps):
        d = dest / f"run{i}" / "warehouse"
        d.mkdir(parents=True)
        con = duckdb.connect()
        tids = [r[0] for r in con.execute(f"SELECT trial_id FROM '{FOLDER}/trials.parquet' WHERE sweep_id = ?",
                                          [s]).fetchall()]
        for f in FOLDER.glob("*.parquet"):
            cols = [c[0] for c in con.execute(f"DESCRIBE SELECT * FROM '{f}'").fetchall()]
            if "trial_id" in cols:
                con.execute(f"COPY (SELECT * FROM '{f}' WHERE trial_id IN (SELECT unnest(?))) TO '{d / f.name}'", [tids])
            elif "sweep_id" in cols:
                con.execute(f"COPY (SELECT * FROM '{f}' WHERE sweep_id = ?) TO '{d / f.name}'", [s])
            else:
                con.execute(f"COPY (SELECT * FROM '{f}') TO '{d / f.name}'")
        con.close()
        runs.append(d.parent)
    return runs


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("versions_anchored_report",
                                                  ROOT / "benchmarks" / "versions_anchored_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    earlier, later = _split_by_sweep(tmp_path_factory.mktemp("runs"))
    return mod.tables(later, [earlier])


def test_boots_of_both_runs_are_in_one_history(text):
    boots = text.split("### The boots")[1].split("###")[0]
    rows = [ln for ln in boots.splitlines() if ln.startswith("| 2026")]
    assert len(rows) == 4 and all(r.rstrip(" |").endswith("3") for r in rows)  # 2 sweeps x 2 configs, 3 boots


def test_across_sweeps_reads_through_the_anchor_and_without_it(text):
    across = text.split("### Across sweeps")[1]
    rows = [ln.split("|") for ln in across.splitlines() if ln.startswith("| ") and "c=" in ln]
    assert len(rows) == 16  # 4 metrics x 4 cells
    assert all(r[7].strip() == "fixed sweep effects" for r in rows)  # anchored through the recorded anchor
    # an A/A: nothing called through the anchor, nor without it; Welch beside every row
    assert all(r[6].strip() == "no significant change" and r[9].strip() == "no significant change" for r in rows)
    assert all("%" in r[10] for r in rows)
    assert across.count("confirmed regressions (what raises the Prefect state Regression): none") == 4


def test_within_the_later_sweep_the_config_is_compared_with_the_anchor(text):
    within = text.split("### Within the later sweep")[1].split("###")[0]
    rows = [ln for ln in within.splitlines() if ln.startswith("| ") and "c=" in ln]
    assert len(rows) == 16 and " twin against anchor" in within.splitlines()[0]


def test_a_later_sweep_with_the_config_on_two_runtimes_reads_each_and_finds_an_injected_change(tmp_path):
    """The later sweep boots the twin on the pinned runtime and on a newer one (here: a copy of its twin boots on a
    runtime ``gpu-zz`` with output tokens/s x 0.8, a -20 % change injected): one within-sweep section per runtime
    against the anchor plus newer against pinned, and one across-sweep section per runtime; the pinned one is the
    A/A (nothing called), the newer one finds the -20 % in every cell, through the anchor too."""
    spec = importlib.util.spec_from_file_location("versions_anchored_report",
                                                  ROOT / "benchmarks" / "versions_anchored_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    earlier, later = _split_by_sweep(tmp_path)
    w = later / "warehouse"
    con = duckdb.connect()
    tids = [r[0] for r in con.execute(f"SELECT trial_id FROM '{w}/trials.parquet' WHERE config_label = 'twin'").fetchall()]
    for f in w.glob("*.parquet"):
        cols = [c[0] for c in con.execute(f"DESCRIBE SELECT * FROM '{f}'").fetchall()]
        if "trial_id" not in cols:
            continue
        sel = ", ".join(
            "trial_id || '-zz' AS trial_id" if c == "trial_id" else
            "'gpu-zz' AS runtime_name" if (c == "runtime_name" and f.stem == "trials") else
            "output_tokens_per_s * 0.8 AS output_tokens_per_s" if (c == "output_tokens_per_s" and f.stem == "measurements")
            else f'"{c}"' for c in cols)
        con.execute(f"COPY (SELECT * FROM '{f}' UNION ALL BY NAME SELECT {sel} FROM '{f}' "
                    f"WHERE trial_id IN (SELECT unnest(?))) TO '{f}.new' (FORMAT parquet)", [tids])
        Path(f"{f}.new").replace(f)
    con.close()
    text = mod.tables(later, [earlier])
    heads = [ln for ln in text.splitlines() if ln.startswith("### ")]
    assert sum("Within the later sweep" in h for h in heads) == 3, heads
    assert any("twin on gpu-zz against twin on gpu-0.25.1" in h for h in heads), heads
    assert sum(h.startswith("### Across sweeps") for h in heads) == 2, heads

    def rows(head_part: str) -> list[list[str]]:
        sec = [s for s in text.split("\n### ") if s.splitlines()[0].find(head_part) >= 0]
        assert len(sec) == 1, head_part
        return [ln.split("|") for ln in sec[0].splitlines() if ln.startswith("| output_tokens_per_s")]

    zz_within = rows("twin on gpu-zz against twin on gpu-0.25.1")
    assert len(zz_within) == 4 and all(r[4].strip() == "worse" and "-20.0%" in r[3] for r in zz_within)
    aa, zz = rows("against twin on gpu-0.25.1 in"), rows("against twin on gpu-zz in")
    assert all(r[6].strip() == "no significant change" for r in aa)  # the A/A across sweeps, through the anchor
    assert len(zz) == 4 and all(r[6].strip() == "worse" for r in zz)


def test_compare_warns_when_a_side_pools_cards_or_sweeps(tmp_path):
    """The committed H200 (2026-12-03) and H100 (2026-12-07) runs in one warehouse: `version=0.25.1` against
    `version=0.26.0` pools the twin of both cards and three sweeps on one side; the report says so before its table
    (a fresh user saw "worse" in 4 of 4 cells with no word about the cards), and a like-with-like selection says
    nothing."""
    from tunelab.flows.compare import compare
    from tunelab.reports.evidence import warehouse_from_parquet

    db = warehouse_from_parquet(FOLDER, tmp_path / "w.duckdb",
                                ROOT / "evidence" / "h100-2026-12-07-versions-anchored" / "warehouse")
    out = compare.fn({"vllm_version": "0.25.1"}, {"vllm_version": "0.26.0"}, db=str(db), with_regressions=False)
    note = out["mixed_sides"]
    assert note and "2 GPUs (NVIDIA H100 80GB HBM3, NVIDIA H200)" in note and "neither a within-sweep" in note
    assert out["markdown"].index("Mixed sides") < out["markdown"].index("| workload")
    like = compare.fn({"sweep_id": "latest", "config_label": "twin", "runtime_name": "gpu-0.25.1"},
                      {"sweep_id": "latest", "config_label": "twin", "runtime_name": "gpu-0.26.0"}, db=str(db),
                      with_regressions=False)
    assert like["mixed_sides"] is None and "Mixed sides" not in like["markdown"]
