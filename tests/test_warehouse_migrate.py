"""Schema migrations (tunelab/warehouse/migrate.py): from empty, from version 1, idempotent re-open."""

import duckdb
import pytest

from tunelab.warehouse.migrate import applied_versions, connect, list_migrations, migrate


def _views(con):
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def test_migrate_from_empty(tmp_path):
    db = tmp_path / "wh.duckdb"
    con = connect(db)
    versions = [m.version for m in list_migrations()]
    assert versions[:2] == [1, 2]
    assert applied_versions(con) == versions
    assert {"measurement_facts", "boot_values", "trial_facts"} <= _views(con)
    cols = {r[0] for r in con.execute("DESCRIBE trials").fetchall()}
    assert "vllm_version_key" in cols
    con.close()
    con = connect(db)  # re-open: nothing new to apply
    assert migrate(con) == []
    con.close()


def test_migrate_from_version_1_keeps_data(tmp_path):
    db = tmp_path / "wh.duckdb"
    con = connect(db, target_version=1)
    assert applied_versions(con) == [1]
    assert "measurement_facts" not in _views(con)
    con.execute("INSERT INTO sweeps (sweep_id, plan_name) VALUES ('s1', 'p')")
    con.execute(
        "INSERT INTO trials (trial_id, sweep_id, config_key, replicate, status, quality_verdict) "
        "VALUES ('s1/c/r0', 's1', 'c', 0, 'ok', 'pass')"
    )
    con.execute(
        "INSERT INTO measurements (trial_id, workload, load_kind, load_value, repeat, output_tokens_per_s) "
        "VALUES ('s1/c/r0', 'chat', 'concurrency', 4, 0, 100.0), ('s1/c/r0', 'chat', 'concurrency', 4, 1, 110.0)"
    )
    con.close()
    con = connect(db)
    assert applied_versions(con)[:2] == [1, 2]
    rows = con.execute(
        "SELECT config_key, boot_value, repeats FROM boot_values WHERE metric = 'output_tokens_per_s'"
    ).fetchall()
    assert rows == [("c", 105.0, 2)]
    assert con.execute("SELECT vllm_version_key FROM trials").fetchall() == [(None,)]
    con.close()


def test_failed_migration_rolls_back(tmp_path):
    schema = tmp_path / "schema"
    schema.mkdir()
    (schema / "001_a.sql").write_text("CREATE TABLE a (x INTEGER);")
    (schema / "002_b.sql").write_text("CREATE TABLE b (y INTEGER); SELECT * FROM no_such_table;")
    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    with pytest.raises(RuntimeError, match="002_b.sql"):
        migrate(con, schema_dir=schema)
    assert applied_versions(con) == [1]
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "b" not in tables and "a" in tables


def test_bad_migration_name_is_refused(tmp_path):
    (tmp_path / "1_init.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="NNN_<what>.sql"):
        list_migrations(tmp_path)


def test_migration_6_groups_stored_builds_by_release_and_flags_untagged_builds(tmp_path):
    # A warehouse written before migration 6: keys held the local part, untagged builds had a key.
    db = tmp_path / "wh.duckdb"
    con = connect(db, target_version=5)
    old_keys = {"0.26.0": "000000.000026.000000.000000|9000000|0000000|1000000|",
                "0.26.0+empty": "000000.000026.000000.000000|9000000|0000000|1000000|+empty",
                "0.1.dev123+gabc1234": "000000.000001.000000.000000|0000000|0000000|0000123|+gabc1234",
                "0.10.2.dev5+g1234abc.d20250901": "000000.000010.000002.000000|0000000|0000000|0000005|+g1234abc.d20250901"}
    for i, (v, key) in enumerate(old_keys.items()):
        con.execute("INSERT INTO trials (trial_id, sweep_id, config_key, replicate, status, vllm_version, "
                    "vllm_version_key) VALUES (?, 's', 'c', ?, 'ok', ?, ?)", [f"s/c/r{i}", i, v, key])
    con.close()
    con = connect(db)
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT vllm_version, vllm_version_key, vllm_public_version, vllm_platform, vllm_build_date, vllm_untrusted "
        "FROM trial_facts").fetchall()}
    con.close()
    assert rows["0.26.0"][0] == rows["0.26.0+empty"][0] == old_keys["0.26.0"]
    assert rows["0.26.0+empty"][1:4] == ("0.26.0", "empty", None)
    assert rows["0.1.dev123+gabc1234"][0] is None and "untagged" in rows["0.1.dev123+gabc1234"][4]
    assert str(rows["0.10.2.dev5+g1234abc.d20250901"][3]) == "2025-09-01"
