"""The PostgreSQL group writer (``PostgresRows``) writes every group on one dedicated connection.
When a transaction fails and cannot even be rolled back, or the database ends the session before
the COMMIT, that connection is never used again: the caller is told the error that failed its
transaction (not the rollback's), nothing of it is committed, and the next group is written on a
new connection. (The SQLite writer's counterpart:
test_a_group_writer_whose_transaction_cannot_be_rolled_back_is_never_used_again.py.)

The failures are injected on a proxy of the driver connection (ROLLBACK raises; COMMIT first has
the session ended by an administrator's ``pg_terminate_backend``)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, event, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import NullPool

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_ITEMS = Table("pg_writer_items", _metadata, Column("key", String, primary_key=True))


class _Proxy:
    """The writer's driver connection, with ``before(sql)`` run before each statement it executes."""

    def __init__(self, driver: psycopg.Connection, before) -> None:
        self._driver = driver
        self._before = before
        self.closed = False

    def execute(self, sql, *args, **kwargs):
        self._before(sql.strip().upper())
        return self._driver.execute(sql, *args, **kwargs)

    def close(self) -> None:
        self.closed = True
        self._driver.close()

    def __getattr__(self, name: str):
        return getattr(self._driver, name)


@pytest.fixture
def db(postgres) -> Iterator[Database]:
    url = postgres.create()
    database = Database(url)
    _metadata.create_all(database.engine)
    yield database
    database.dispose()
    postgres.drop(url)


def _stored(db: Database) -> set[str]:
    with db.engine.connect() as connection:
        return set(connection.execute(select(_ITEMS.c.key)).scalars())


def _queue(db: Database):
    return db.group_commit(lambda rows, keys: rows.insert(_ITEMS, [{"key": key} for key in keys]))


def test_every_group_is_written_on_one_connection(db):
    opened: list[object] = []
    event.listen(db.engine, "connect", lambda dbapi_connection, _record: opened.append(dbapi_connection))
    db.engine.dispose()  # every connection from now on is a new one
    queue = _queue(db)
    for n in range(5):
        queue.submit(f"k{n}")
    with pytest.raises(IntegrityError):
        queue.submit("k0")  # a failed transaction, rolled back, keeps its connection
    queue.submit("k5")
    assert len(opened) == 1
    assert _stored(db) == {f"k{n}" for n in range(6)}


def test_a_writer_that_cannot_roll_back_is_closed_and_the_next_group_is_written_on_a_new_one(db):
    queue = _queue(db)
    queue.submit("first")
    writer = db._writer

    def rollback_fails(sql: str) -> None:
        if sql == "ROLLBACK":
            raise psycopg.OperationalError("injected: cannot roll back")

    broken = writer._driver = _Proxy(writer._driver, rollback_fails)
    with pytest.raises(IntegrityError):
        queue.submit("first")  # its INSERT fails, then its ROLLBACK
    assert broken.closed, "the connection left in the failed transaction is closed"
    queue.submit("next")
    assert db._writer is not writer
    assert _stored(db) == {"first", "next"}


def test_a_session_ended_before_the_commit_fails_its_group_and_the_next_is_written_on_a_new_connection(
        db, postgres):
    admin = create_engine(db.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    queue = _queue(db)
    queue.submit("first")
    writer = db._writer
    pid = writer._driver.info.backend_pid

    def end_the_session_at_commit(sql: str) -> None:
        if sql == "COMMIT":
            with admin.connect() as connection:
                assert connection.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid}).scalar()

    writer._driver = _Proxy(writer._driver, end_the_session_at_commit)
    try:
        with pytest.raises(DBAPIError) as raised:
            queue.submit("lost")
        assert not isinstance(raised.value, IntegrityError)
        queue.submit("next")
        assert db._writer is not writer
        assert _stored(db) == {"first", "next"}, "a group whose COMMIT never reached the database was kept"
    finally:
        admin.dispose()
