"""The group commit writes on one dedicated connection. When a transaction fails and cannot even be
rolled back, that connection is closed (which discards the transaction) and a new one writes the next
group: no later caller's rows go into what is left of the failed transaction, and the caller is told
the error that failed it, not the rollback's. Every group is otherwise written on the one connection.

The rollback's failure is injected (a proxy of the driver connection whose ROLLBACK raises)."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import Column, MetaData, String, Table, event, select
from sqlalchemy.exc import IntegrityError

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_ITEMS = Table("rolled_items", _metadata, Column("key", String, primary_key=True))


class _RollbackFails:
    """The driver connection, except that ROLLBACK fails."""

    def __init__(self, driver: sqlite3.Connection) -> None:
        self._driver = driver
        self.closed = False

    def execute(self, sql: str, *args):
        if sql.strip().upper() == "ROLLBACK":
            raise sqlite3.OperationalError("injected: cannot roll back")
        return self._driver.execute(sql, *args)

    def close(self) -> None:
        self.closed = True
        self._driver.close()

    def __getattr__(self, name: str):
        return getattr(self._driver, name)


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'rolled.sqlite'}")
    _metadata.create_all(database.engine)
    yield database
    database.dispose()


def _stored(db: Database) -> set[str]:
    with db.engine.connect() as connection:
        return set(connection.execute(select(_ITEMS.c.key)).scalars())


def test_a_writer_that_cannot_roll_back_is_closed_and_the_next_group_is_written_on_a_new_one(db):
    queue = db.group_commit(lambda rows, keys: rows.insert(_ITEMS, [{"key": key} for key in keys]))
    queue.submit("first")
    writer = db._writer
    broken = writer._driver = _RollbackFails(writer._driver)

    with pytest.raises(IntegrityError):
        queue.submit("first")  # its INSERT fails, then its ROLLBACK

    assert broken.closed, "the connection left in the failed transaction is closed"
    other = sqlite3.connect(db.sqlite_path, isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")  # raises "database is locked" while its write lock is held
        other.execute("ROLLBACK")
    finally:
        other.close()
    queue.submit("next")
    assert db._writer is not writer
    assert _stored(db) == {"first", "next"}


def test_every_group_is_written_on_one_connection(db):
    opened: list[object] = []
    event.listen(db.engine, "connect", lambda dbapi_connection, _record: opened.append(dbapi_connection))
    db.engine.dispose()  # every connection from now on is a new one
    queue = db.group_commit(lambda rows, keys: rows.insert(_ITEMS, [{"key": key} for key in keys]))

    for n in range(5):
        queue.submit(f"k{n}")
    with pytest.raises(IntegrityError):
        queue.submit("k0")  # a failed transaction, rolled back, keeps its connection
    queue.submit("k5")

    assert len(opened) == 1
    assert _stored(db) == {f"k{n}" for n in range(6)}
