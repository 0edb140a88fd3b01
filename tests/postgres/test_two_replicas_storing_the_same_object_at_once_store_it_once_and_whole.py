"""Two replicas commit batches holding the same objects at the same moment: the second one's insert
waits on the first one's uncommitted rows. If the first commits, the second stores nothing of them
again (no duplicate chunk refuses its commit); if the first aborts, the second stores them itself.
Either way each object is there once, whole, and readable through both replicas.
(PostgreSQL: a SQLite file has one server.)"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import DatabaseStore

MIB = 1 << 20


def sessions_waiting_for_a_lock(database: Database) -> int:
    """Sessions of this database waiting for a lock (a row's inserting transaction, here)."""
    with database.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND wait_event_type = 'Lock'")).scalar()


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-aborts"])
def test_the_same_objects_stored_by_two_replicas_at_once_are_stored_once_and_whole(pg_url, tmp_path: Path,
                                                                                   first_commits):
    database = Database(pg_url)
    database.migrate()
    first = DatabaseStore(Database(pg_url), tmp_path / "first")
    second = DatabaseStore(Database(pg_url), tmp_path / "second")
    contents = [b"small and shared", os.urandom(2 * MIB + 7), os.urandom(300)]
    digests = sorted(hashlib.sha256(c).hexdigest() for c in contents)
    inserted, release = threading.Event(), threading.Event()
    real_insert = first._insert

    def insert_then_hold(connection, pending) -> None:
        real_insert(connection, pending)  # its rows are in, uncommitted
        inserted.set()
        assert release.wait(60)
        if not first_commits:
            raise RuntimeError("the first replica's batch fails after its inserts")

    first._insert = insert_then_hold
    outcome: dict[str, object] = {}

    def store_through(name: str, store: DatabaseStore) -> None:
        try:
            with store.batch() as batch:
                for content in contents:
                    batch.put_bytes(content)
            outcome[name] = "committed"
        except BaseException as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=store_through, args=("first", first))]
    try:
        threads[0].start()
        assert inserted.wait(60)
        threads.append(threading.Thread(target=store_through, args=("second", second)))
        threads[1].start()
        while sessions_waiting_for_a_lock(database) == 0:  # the second insert waits on the first's rows
            assert threads[1].is_alive(), outcome
        release.set()
        for thread in threads:
            thread.join(60)
        assert outcome["second"] == "committed"
        assert (outcome["first"] == "committed") if first_commits else isinstance(outcome["first"], RuntimeError)
        with database.engine.connect() as connection:
            rows = connection.execute(text("SELECT digest FROM objects ORDER BY digest")).scalars().all()
        assert rows == digests
        assert second.damage() == []
        for store in (first, second):
            assert sorted(hashlib.sha256(store.read_bytes(d)).hexdigest() for d in digests) == digests
    finally:
        release.set()
        for store in (first, second):
            store.close()
            store.db.dispose()
        database.dispose()
