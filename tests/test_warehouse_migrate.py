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


def _schema(tmp_path, files):
    schema = tmp_path / "schema"
    schema.mkdir(exist_ok=True)
    for name, text in files.items():
        (schema / name).write_text(text)
    return schema


def test_an_applied_migration_whose_file_changed_is_an_error_naming_it(tmp_path):
    """Editing a migration after it was applied is caught on the next migrate, with the file and the fix."""
    from tunelab.warehouse.migrate import MigrationError

    schema = _schema(tmp_path, {"001_a.sql": "CREATE TABLE a (x INTEGER);"})
    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    assert migrate(con, schema_dir=schema) == [1]
    (schema / "001_a.sql").write_text("CREATE TABLE a (x INTEGER, y INTEGER);")
    with pytest.raises(MigrationError, match=r"001_a\.sql was changed after it was applied.*new migration 002_"):
        migrate(con, schema_dir=schema)
    con.close()


def test_a_recorded_migration_without_its_file_is_an_error(tmp_path):
    from tunelab.warehouse.migrate import MigrationError

    schema = _schema(tmp_path, {"001_a.sql": "CREATE TABLE a (x INTEGER);", "002_b.sql": "CREATE TABLE b (y INTEGER);"})
    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    migrate(con, schema_dir=schema)
    (schema / "002_b.sql").unlink()
    with pytest.raises(MigrationError, match=r"version 2 \(002_b\.sql\).*newer tunelab"):
        migrate(con, schema_dir=schema)
    con.close()


def test_a_view_that_no_longer_binds_is_an_error_naming_it(tmp_path):
    """A migration that drops a column a view reads leaves the view unbindable: named after migrating."""
    from tunelab.warehouse.migrate import MigrationError

    schema = _schema(tmp_path, {"001_a.sql": "CREATE TABLE a (x INTEGER, y INTEGER); CREATE VIEW a_y AS SELECT y FROM a;"})
    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    migrate(con, schema_dir=schema)
    _schema(tmp_path, {"002_drop_y.sql": "ALTER TABLE a DROP COLUMN y;"})
    with pytest.raises(MigrationError, match=r"view a_y no longer binds"):
        migrate(con, schema_dir=schema)
    con.close()


def test_every_view_of_the_real_schema_binds(tmp_path):
    from tunelab.warehouse.migrate import check_views

    con = connect(tmp_path / "wh.duckdb")
    check_views(con)  # raises on a view that does not bind
    n = con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'").fetchone()[0]
    assert n >= 3
    con.close()


def _old_004_warehouse(tmp_path, commit_sha: str):
    """A warehouse migrated to version 6 whose schema_migrations records an earlier text of 004 and whose tables
    lack what later edits of 004 added: what a warehouse created before those edits looks like."""
    from tunelab.warehouse.migrate import HISTORICAL_SHA256

    db = tmp_path / "old.duckdb"
    con = connect(db, target_version=6)
    con.execute("ALTER TABLE measurements DROP COLUMN same_read_itl_frac")
    con.execute("ALTER TABLE measurements DROP COLUMN load_processes")
    con.execute("ALTER TABLE trials DROP COLUMN measurement_notes")
    assert commit_sha in HISTORICAL_SHA256["004_receive_stamps.sql"]
    con.execute("UPDATE schema_migrations SET sha256 = ? WHERE version = 4", [commit_sha])
    con.close()
    return db


def test_a_warehouse_with_the_first_004_is_accepted_and_gets_its_columns(tmp_path):
    """The one known case: 004 was edited after it was created (3d4dd94 -> 030a9ac -> 34786d3 -> 2656508). A
    warehouse that recorded the first text opens, and migration 007 adds the columns the edits added."""
    db = _old_004_warehouse(tmp_path, "8a9d0137f82d00cd85e6235b10753fa6ec488486f8347b310c97956badcdc289")
    con = connect(db)
    assert 7 in applied_versions(con)
    mcols = {r[0] for r in con.execute("DESCRIBE measurements").fetchall()}
    tcols = {r[0] for r in con.execute("DESCRIBE trials").fetchall()}
    assert {"same_read_itl_frac", "load_processes"} <= mcols and "measurement_notes" in tcols
    con.close()


def test_an_unknown_hash_of_004_is_still_an_error(tmp_path):
    """Only the listed earlier texts are accepted: any other recorded hash of 004 is an edit."""
    from tunelab.warehouse.migrate import MigrationError

    db = tmp_path / "wh.duckdb"
    connect(db, target_version=6).close()
    con = duckdb.connect(str(db))
    con.execute("UPDATE schema_migrations SET sha256 = ? WHERE version = 4", ["0" * 64])
    con.close()
    with pytest.raises(MigrationError, match=r"004_receive_stamps\.sql was changed"):
        connect(db)


def test_historical_hashes_are_the_texts_in_git_history():
    """Each accepted earlier hash differs from the file's current hash (else it would be no history), and the
    table names only files that exist."""
    from tunelab.warehouse.migrate import HISTORICAL_SHA256

    current = {m.name: m.sha256 for m in list_migrations()}
    for name, hashes in HISTORICAL_SHA256.items():
        assert name in current
        assert current[name] not in hashes and all(len(h) == 64 for h in hashes)
