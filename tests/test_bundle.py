"""Result bundles: layout, manifest, atomic writes and updates (tunelab/core/bundle.py)."""

import json

import pandas as pd
import pytest

from tunelab.core.bundle import (
    MANIFEST_NAME,
    BundleError,
    list_bundles,
    read_bundle,
    read_manifest,
    update_bundle_table,
    verify_bundle,
    write_bundle,
)
from tunelab.warehouse.synthetic import synthetic_trial


def _trial(**kw):
    return synthetic_trial(sweep_id="20261129T0000Z-demo", config_key="cfg1", requests_per_repeat=5, **kw)


def test_write_layout_manifest_and_roundtrip(tmp_path):
    st = _trial()
    path = write_bundle(tmp_path, st.sweep, st.trial, st.tables)
    assert path == tmp_path / "20261129T0000Z-demo" / "20261129T0000Z-demo__synthetic__cfg1__r0"
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["trial_id"] == "20261129T0000Z-demo/synthetic/cfg1/r0"
    assert manifest["bundle_format"] == 1
    assert set(manifest["files"]) == {"sweep", "trial", "measurements", "requests", "boot_phases", "quality_checks"}
    assert manifest["files"]["requests"]["rows"] == len(st.tables["requests"])
    assert all(len(e["sha256"]) == 64 for e in manifest["files"].values())
    tables = read_bundle(path)
    assert len(tables["trial"]) == 1
    assert json.loads(tables["trial"].at[0, "engine_args"]) == st.trial["engine_args"]
    pd.testing.assert_frame_equal(tables["measurements"], st.tables["measurements"], check_dtype=False)
    assert list_bundles(tmp_path) == [path]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


def test_missing_trial_id_column_is_filled_and_foreign_rows_refused(tmp_path):
    st = _trial()
    m = st.tables["measurements"].drop(columns=["trial_id"])
    path = write_bundle(tmp_path, st.sweep, st.trial, {"measurements": m})
    assert set(read_bundle(path)["measurements"]["trial_id"]) == {st.trial["trial_id"]}
    bad = st.tables["measurements"].copy()
    bad.loc[0, "trial_id"] = "other/trial/r0"
    with pytest.raises(BundleError, match="other/trial/r0"):
        write_bundle(tmp_path, st.sweep, st.trial, {"measurements": bad})
    with pytest.raises(BundleError, match="unknown bundle tables"):
        write_bundle(tmp_path, st.sweep, st.trial, {"measurement": m})


def test_interrupted_write_leaves_no_loadable_bundle(tmp_path, monkeypatch):
    import tunelab.core.bundle as b

    st = _trial()
    real = b._write_parquet
    calls = {"n": 0}

    def failing(df, path):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (injected)")
        real(df, path)

    monkeypatch.setattr(b, "_write_parquet", failing)
    with pytest.raises(OSError, match="injected"):
        write_bundle(tmp_path, st.sweep, st.trial, st.tables)
    assert list_bundles(tmp_path) == []
    assert list((tmp_path / st.sweep["sweep_id"]).iterdir()) == []  # temp folder removed


def test_folder_without_manifest_is_refused(tmp_path):
    st = _trial()
    path = write_bundle(tmp_path, st.sweep, st.trial, st.tables)
    (path / MANIFEST_NAME).unlink()
    assert list_bundles(tmp_path) == []
    with pytest.raises(BundleError, match="no manifest.json"):
        read_bundle(path)


def test_corrupted_file_is_named(tmp_path):
    st = _trial()
    path = write_bundle(tmp_path, st.sweep, st.trial, st.tables)
    with open(path / "requests.parquet", "ab") as f:
        f.write(b"garbage")
    with pytest.raises(BundleError, match=r"requests\.parquet.*corrupted"):
        verify_bundle(path)


def test_update_table_rewrites_manifest_atomically(tmp_path):
    st = _trial(quality_verdict="unvalidated")
    path = write_bundle(tmp_path, st.sweep, st.trial, {"measurements": st.tables["measurements"]})
    before = read_manifest(path)
    checks = pd.DataFrame([{"suite": "requests", "expectation": "ttft_positive", "success": False, "severity": "warn"}])
    update_bundle_table(path, "quality_checks", checks)
    trial = read_bundle(path)["trial"]
    trial.loc[0, "quality_verdict"] = "warn"
    update_bundle_table(path, "trial", trial)
    after = verify_bundle(path)
    assert after["generation"] == 2
    assert after["files"]["trial"]["file"] != before["files"]["trial"]["file"]
    assert not (path / before["files"]["trial"]["file"]).exists()  # old file removed after commit
    tables = read_bundle(path)
    assert tables["trial"].at[0, "quality_verdict"] == "warn"
    assert tables["quality_checks"].at[0, "trial_id"] == st.trial["trial_id"]
    with pytest.raises(BundleError, match="differs"):
        bad = trial.copy()
        bad.loc[0, "trial_id"] = "x/y/r1"
        update_bundle_table(path, "trial", bad)


def test_rewrite_of_same_trial_replaces_bundle(tmp_path):
    st = _trial()
    write_bundle(tmp_path, st.sweep, st.trial, st.tables)
    st2 = _trial()
    path = write_bundle(tmp_path, st2.sweep, st2.trial, {"measurements": st2.tables["measurements"]})
    assert set(read_manifest(path)["files"]) == {"sweep", "trial", "measurements"}
    assert len(list_bundles(tmp_path)) == 1
