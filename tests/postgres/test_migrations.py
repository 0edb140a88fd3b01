"""Schema migrations on SQLite and PostgreSQL: fresh databases, upgrades that keep data,
databases from before migrations, and a schema this server does not know."""

from __future__ import annotations

import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel, select

from checkpointd.core.metadata.db import (
    BASELINE_REVISION,
    SCHEMA_VERSION_TABLE,
    Database,
    DatabaseUrlError,
    SchemaError,
    alembic_config,
    known_revisions,
    normalize_url,
)
from checkpointd.core.metadata.models import CheckpointRow, ConfigRow, OperationRow
from tests.conftest import CHECKPOINTD, RunningServer

HEAD = known_revisions()[1]
FOUR_GIB = 4 << 30


def upgrade_to(url: str, revision: str) -> None:
    """Brings a database to one given revision, as an older checkpointd would have left it."""
    database = Database(url)
    try:
        with database.engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        database.dispose()


def execute(url: str, *statements: str, **params: object) -> list[tuple]:
    engine = create_engine(Database(url).url)
    try:
        with engine.begin() as connection:
            rows: list[tuple] = []
            for statement in statements:
                result = connection.execute(text(statement), params)
                if result.returns_rows:
                    rows.extend(tuple(r) for r in result)
            return rows
    finally:
        engine.dispose()


def add_baseline_rows(url: str) -> None:
    """Rows in every table of the baseline schema, written with SQL as the old server stored them."""
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    execute(
        url,
        "INSERT INTO plans (plan_id, workspace_root, last_sequence, create_time) "
        "VALUES ('01JPLAN0000000000000000001', '/srv/ws', 2, :now)",
        "INSERT INTO checkpoints (checkpoint_id, plan_id, sequence, phase, trigger, source_tool, description, "
        "labels, create_time, workspace_root, tree_digest, file_count, total_size_bytes, state_digest, "
        "state_size_bytes, skipped, ignore_patterns, excluded_paths, rollback_target_checkpoint_id) VALUES "
        "('01JCKPT0000000000000000001', '01JPLAN0000000000000000001', 1, 'execute', 'manual', 'edit', 'first', "
        "'{\"k\": \"v\"}', :now, '/srv/ws', :tree, 3, 1234, NULL, 0, '[]', '[\"*.log\"]', '[]', NULL), "
        "('01JCKPT0000000000000000002', '01JPLAN0000000000000000001', 2, 'rollback_safety', 'rollback', "
        "'checkpointd', 'safety', '{}', :now, '/srv/ws', :tree, 3, 1234, NULL, 0, '[[\"big.bin\", 99, "
        "\"too_large\"]]', '[]', '[]', '01JCKPT0000000000000000001')",
        "INSERT INTO operations (request_id, method, fingerprint, result, create_time) VALUES "
        "('req-1', 'CreateCheckpoint', :tree, '{\"checkpoint_id\": \"01JCKPT0000000000000000001\"}', :now)",
        "INSERT INTO config_values (plan_id, key, value, update_time) VALUES "
        "('', 'core.checkpoints.on_unavailable', '\"refuse\"', :now)",
        now=now, tree="ab" * 32,
    )


def assert_baseline_rows_intact(url: str) -> None:
    plans = execute(url, "SELECT plan_id, workspace_root, last_sequence FROM plans")
    assert plans == [("01JPLAN0000000000000000001", "/srv/ws", 2)]
    checkpoints = execute(url, "SELECT checkpoint_id, sequence, phase, description, file_count, total_size_bytes, "
                               "tree_digest, rollback_target_checkpoint_id FROM checkpoints ORDER BY sequence")
    assert checkpoints == [
        ("01JCKPT0000000000000000001", 1, "execute", "first", 3, 1234, "ab" * 32, None),
        ("01JCKPT0000000000000000002", 2, "rollback_safety", "safety", 3, 1234, "ab" * 32,
         "01JCKPT0000000000000000001"),
    ]
    database = Database(url)
    try:
        with database.session() as session:
            first = session.get(CheckpointRow, "01JCKPT0000000000000000001")
            assert first.labels == {"k": "v"} and first.ignore_patterns == ["*.log"]
            assert session.get(CheckpointRow, "01JCKPT0000000000000000002").skipped == [["big.bin", 99, "too_large"]]
            assert session.get(OperationRow, "req-1").result == {"checkpoint_id": "01JCKPT0000000000000000001"}
            config = session.exec(select(ConfigRow)).one()
            assert (config.key, config.value) == ("core.checkpoints.on_unavailable", "refuse")
    finally:
        database.dispose()


def schema_differences(url: str) -> list:
    database = Database(url)
    try:
        with database.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return [d for d in compare_metadata(context, SQLModel.metadata)
                    if not (d[0] == "remove_table" and d[1].name == SCHEMA_VERSION_TABLE)]
    finally:
        database.dispose()


def test_a_fresh_database_is_migrated_to_exactly_the_models(any_db_url):
    database = Database(any_db_url)
    try:
        assert database.schema_revision() is None
        assert database.migrate() == HEAD
        assert database.schema_revision() == HEAD
        assert database.migrate() == HEAD
    finally:
        database.dispose()
    assert schema_differences(any_db_url) == []


def test_upgrading_a_baseline_database_keeps_every_row(any_db_url):
    upgrade_to(any_db_url, BASELINE_REVISION)
    add_baseline_rows(any_db_url)

    database = Database(any_db_url)
    try:
        assert database.migrate() == HEAD
    finally:
        database.dispose()

    assert_baseline_rows_intact(any_db_url)
    assert schema_differences(any_db_url) == []
    # 0002 widened the workspace total: more than PostgreSQL's INTEGER holds now fits.
    execute(any_db_url, "UPDATE checkpoints SET total_size_bytes = :size WHERE sequence = 1", size=FOUR_GIB)
    assert execute(any_db_url, "SELECT total_size_bytes FROM checkpoints WHERE sequence = 1") == [(FOUR_GIB,)]


def test_a_database_from_before_migrations_is_adopted_and_upgraded(any_db_url):
    upgrade_to(any_db_url, BASELINE_REVISION)
    add_baseline_rows(any_db_url)
    execute(any_db_url, f"DROP TABLE {SCHEMA_VERSION_TABLE}")

    database = Database(any_db_url)
    try:
        assert database.schema_revision() is None
        assert database.migrate() == HEAD
        assert database.schema_revision() == HEAD
    finally:
        database.dispose()
    assert_baseline_rows_intact(any_db_url)


def test_a_database_with_only_some_checkpointd_tables_is_refused(any_db_url):
    upgrade_to(any_db_url, BASELINE_REVISION)
    execute(any_db_url, f"DROP TABLE {SCHEMA_VERSION_TABLE}", "DROP TABLE operations")
    database = Database(any_db_url)
    try:
        with pytest.raises(SchemaError, match="some checkpointd tables"):
            database.migrate()
    finally:
        database.dispose()


def test_a_schema_from_a_newer_server_is_refused_and_left_alone(any_db_url):
    upgrade_to(any_db_url, HEAD)
    execute(any_db_url, f"UPDATE {SCHEMA_VERSION_TABLE} SET version_num = '9999'")
    database = Database(any_db_url)
    try:
        with pytest.raises(SchemaError, match=f"revision 9999, which this checkpointd does not know .its newest is "
                                              f"{HEAD}."):
            database.migrate()
    finally:
        database.dispose()
    assert execute(any_db_url, f"SELECT version_num FROM {SCHEMA_VERSION_TABLE}") == [("9999",)]


def test_the_server_refuses_to_start_on_an_unknown_schema(any_db_url, short_tmp: Path):
    upgrade_to(any_db_url, HEAD)
    execute(any_db_url, f"UPDATE {SCHEMA_VERSION_TABLE} SET version_num = '9999'")
    server = RunningServer(Path(short_tmp) / f"newer-{abs(hash(any_db_url))}", db_url=any_db_url)
    with pytest.raises(RuntimeError, match="checkpointd exited") as failed:
        server.start()
    assert "a newer checkpointd has migrated this database" in str(failed.value)


def test_unsupported_database_urls_are_refused_by_serve(tmp_path):
    result = subprocess.run([CHECKPOINTD, "serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0",
                             "--db-url", "mysql://root@127.0.0.1/checkpointd"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "unsupported database URL scheme 'mysql'" in result.stdout + result.stderr


def test_replicas_starting_together_migrate_once(pg_url):
    """Four servers' startups race on an empty PostgreSQL database; the advisory lock lets one
    migrate while the others wait, then find the schema current."""
    errors: list[BaseException] = []
    revisions: list[str] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        database = Database(pg_url)
        try:
            barrier.wait()
            revisions.append(database.migrate())
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)
        finally:
            database.dispose()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert revisions == [HEAD] * 4
    assert execute(pg_url, f"SELECT version_num FROM {SCHEMA_VERSION_TABLE}") == [(HEAD,)]
    tables = set(inspect(create_engine(Database(pg_url).url)).get_table_names())
    assert {"plans", "checkpoints", "operations", "config_values", "objects", "object_chunks"} <= tables


@pytest.mark.parametrize(("url", "normalized"), [
    ("sqlite:////var/lib/checkpointd/meta.db", "sqlite:////var/lib/checkpointd/meta.db"),
    ("postgresql://cp:pw@db:5432/checkpointd", "postgresql+psycopg://cp:pw@db:5432/checkpointd"),
    ("postgres://db/checkpointd", "postgresql+psycopg://db/checkpointd"),
    ("postgresql+psycopg://db/checkpointd", "postgresql+psycopg://db/checkpointd"),
])
def test_database_urls_select_sqlite_or_postgresql_with_psycopg(url, normalized):
    assert normalize_url(url) == normalized


@pytest.mark.parametrize("url", ["mysql://root:secret@db/checkpointd", "postgresql+psycopg2://u:secret@db/x",
                                 "not a url with secret"])
def test_other_database_urls_are_refused_without_echoing_them(url):
    with pytest.raises(DatabaseUrlError) as refused:
        normalize_url(url)
    assert "secret" not in str(refused.value)
