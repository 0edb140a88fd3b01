"""The database store's round trips: while this process holds the replica GC fence no replica can
collect, so every digest it saw committed (each of several batches, not only the last) is answered
without asking the database again, and a small object is staged without a look-up (its insert
skips it if it exists). Counted with the engine's statement events, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import event

from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import DatabaseStore


class Statements:
    """The SQL the store's engine sends, while ``recording``."""

    def __init__(self, database: Database) -> None:
        self.sent: list[str] = []
        self.recording = False
        event.listen(database.engine, "before_cursor_execute", self._sent)

    def _sent(self, _connection, _cursor, statement, _parameters, _context, _executemany) -> None:
        if self.recording:
            self.sent.append(" ".join(statement.split()))

    def during(self, action) -> list[str]:
        self.sent, self.recording = [], True
        try:
            action()
        finally:
            self.recording = False
        return self.sent


def test_digests_committed_by_earlier_batches_are_known_without_a_query_while_the_fence_is_held(
        objects, database):
    statements = Statements(database)
    with objects.referencing():
        digests = []
        for n in range(3):  # batch after batch: what the first one stored is still known after the last
            with objects.batch() as batch:
                digests.append(batch.put_bytes(b"object %d" % n))
        assert statements.during(lambda: [objects.has(digest) for digest in digests]) == []
        assert all(objects.has(digest) for digest in digests)

        def put_known_again() -> None:
            with objects.batch() as batch:
                assert [batch.put_bytes(b"object %d" % n) for n in range(3)] == digests

        assert statements.during(put_known_again) == [], "a known object was staged and inserted again"
    assert len(list(objects.iter_digests())) == 3


def test_a_digest_looked_up_and_found_is_known_afterwards_and_one_not_found_is_not(objects, database, tmp_path):
    other = DatabaseStore(Database(database.url), tmp_path / "other")
    try:
        with other.batch() as batch:
            stored = batch.put_bytes(b"stored by another replica")
        absent = "0" * 64
        statements = Statements(database)
        with objects.referencing():
            assert objects.has(stored) and not objects.has(absent)
            assert statements.during(lambda: objects.has(stored)) == []
            assert len(statements.during(lambda: objects.has(absent))) == 1, "an absent digest was remembered"
            assert not objects.has(absent)
    finally:
        other.close()
        other.db.dispose()


def test_small_objects_are_staged_without_a_look_up(objects, database):
    """Inserting a small object that exists costs less than asking first: the commit is the only round trip."""
    with objects.batch() as batch:
        existing = batch.put_bytes(b"already stored")
    statements = Statements(database)
    batch = objects.batch()
    assert statements.during(lambda: (batch.put_bytes(b"new and small"), batch.put_bytes(b"already stored"))) \
        == [], "a small object was looked up before the commit"
    batch.commit()
    assert objects.read_bytes(existing) == b"already stored"
    assert len(list(objects.iter_digests())) == 2
