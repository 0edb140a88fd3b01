"""What the metadata database costs a server stays within what README says: on PostgreSQL at most
81 connections under full load and 21 when idle (two pools and the group commit's own), which
``max_connections`` must allow per replica; on SQLite a write-ahead log grown by a bulk write is cut
back to 1 MiB when it is next reset and one written by many commits is checkpointed every 1 MiB
(it counts against the data directory's size), a migration keeps no connection of its own open, and the
PostgreSQL driver is never loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Column, Integer, LargeBinary, MetaData, Table, insert

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_BLOBS = Table("bounded_blobs", _metadata, Column("id", Integer, primary_key=True), Column("body", LargeBinary))


def test_a_replica_opens_at_most_81_postgresql_connections_and_keeps_21_when_idle() -> None:
    # No connection is opened: the pools are only built.
    database = Database("postgresql+psycopg://nobody@127.0.0.1:1/never_connected")
    try:
        pools = [database.engine.pool, database._locks_engine.pool]
        group_commit_writer = 1
        assert sum(pool.size() + pool._max_overflow for pool in pools) + group_commit_writer == 81
        assert sum(pool.size() for pool in pools) + group_commit_writer == 21
    finally:
        database.dispose()


def test_a_log_grown_by_a_bulk_write_is_cut_back_to_a_mebibyte(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        _metadata.create_all(database.engine)
        wal = tmp_path / "meta.db-wal"
        with database.engine.begin() as connection:  # one transaction of ~3 MiB: the log grows with it
            connection.execute(insert(_BLOBS), [{"body": os.urandom(4096)} for _ in range(750)])
        assert wal.stat().st_size > 3 << 20

        with database.engine.begin() as connection:  # the log, checkpointed since, starts again
            connection.execute(insert(_BLOBS), [{"body": b"small"}])

        assert wal.stat().st_size == 1 << 20
    finally:
        database.dispose()


def test_a_log_written_by_many_commits_is_checkpointed_every_mebibyte(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        _metadata.create_all(database.engine)
        for _ in range(160):  # 1.6 MiB in commits of 10 KiB
            with database.engine.begin() as connection:
                connection.execute(insert(_BLOBS), [{"body": os.urandom(10 << 10)}])

        size = (tmp_path / "meta.db-wal").stat().st_size
        assert (3 << 18) < size <= (1 << 20) + (64 << 10), \
            "the log started again after each mebibyte (not before), never growing past it by more than one commit"
    finally:
        database.dispose()


def _open_files_under(directory: Path) -> list[str]:
    return [target for fd in os.listdir("/proc/self/fd")
            if (target := os.path.realpath(f"/proc/self/fd/{fd}")).startswith(str(directory))]


def test_a_migration_leaves_no_connection_of_its_own_open(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        database.migrate()
        assert _open_files_under(tmp_path) == [], "the migration's connections are closed"
        with database.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM plans").scalar() == 0
    finally:
        database.dispose()
    assert _open_files_under(tmp_path) == []


def test_a_server_on_sqlite_never_loads_the_postgresql_driver(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from sqlalchemy import text\n"
        "from checkpointd.core.metadata.db import Database\n"
        f"database = Database('sqlite:///{tmp_path / 'meta.db'}')\n"
        "database.migrate()\n"
        "database.group_commit(lambda rows, items: None).submit(1)\n"
        "database.commit_unsynced(text('SELECT 1'))\n"
        "database.dispose()\n"
        "print(sorted(m for m in sys.modules if m == 'psycopg' or m.startswith('psycopg.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"


def test_postgresql_keeps_no_log_file_here_to_truncate() -> None:
    database = Database("postgresql+psycopg://nobody@127.0.0.1:1/never_connected")
    try:
        assert database.truncate_wal() is False, "nothing truncated, and no connection tried"
    finally:
        database.dispose()


def test_a_sqlite_servers_locks_are_always_taken_and_rows_committed_in_a_session_stay_readable(tmp_path: Path) -> None:
    """One process serves a SQLite database: its cross-replica locks are no-ops that are always
    taken; and a row committed in a session reads back after it without another round trip."""
    from datetime import UTC, datetime

    from checkpointd.core.metadata.models import PlanRow

    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        database.migrate()
        lock = database.advisory_lock("plan:any")
        assert lock.acquire(wait=False) is True and lock.acquire() is True
        lock.release()
        with database.session() as session:
            row = PlanRow(plan_id="p1", workspace_root="/w", last_sequence=0, create_time=datetime.now(UTC))
            session.add(row)
            session.commit()
        assert (row.plan_id, row.workspace_root) == ("p1", "/w")
    finally:
        database.dispose()
