"""Closing the database store (server shutdown) while a capture is between its objects and its row
must not let go of the replica GC fence under it: another replica's collection stays out. Closing
ends the thread that keeps the fence. (PostgreSQL: the fence is an advisory lock there.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from checkpointd.core.metadata.db import Database
from checkpointd.core.store.content_store import Postponed
from checkpointd.core.store.db_store import DatabaseStore


def held_advisory_locks(database: Database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                                       "AND database = (SELECT oid FROM pg_database WHERE datname = "
                                       "current_database())")).scalar()


def test_close_while_a_user_references_the_store_keeps_other_replicas_collections_out(pg_url, tmp_path: Path):
    database = Database(pg_url)
    database.migrate()
    closing = DatabaseStore(Database(pg_url), tmp_path / "closing")
    collector = DatabaseStore(Database(pg_url), tmp_path / "collector")
    try:
        with closing.referencing():
            closing.close()
            assert held_advisory_locks(database) == 1
            with pytest.raises(Postponed), collector.collecting(patience=0.2):
                pytest.fail("a collection ran while a user of the closed store still referenced it")
    finally:
        for store in (closing, collector):
            store.close()
            store.db.dispose()
        database.dispose()


def test_close_ends_the_thread_that_keeps_the_fence(pg_url, tmp_path: Path):
    database = Database(pg_url)
    database.migrate()
    objects = DatabaseStore(database, tmp_path / "staging")
    try:
        with objects.referencing():
            pass
        keeper = objects._fence_keeper
        assert keeper is not None and keeper.is_alive()
        objects.close()
        keeper.join(timeout=30)
        assert not keeper.is_alive()
    finally:
        database.dispose()
