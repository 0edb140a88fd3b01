"""``Database.commit_unsynced`` commits one statement without waiting for the disk (a write whose
loss is harmless), on a pooled connection: every connection the pool hands out afterwards commits
synced again (SQLite ``synchronous=FULL``, PostgreSQL ``synchronous_commit`` on), also when setting
it back fails (that connection is never used again). Otherwise a rollback's safety checkpoint and
journal entry, committed on pooled connections, could be lost to a power cut once acknowledged.

A power cut is not something a test can cause: each commit reads the setting it runs under
(SQLAlchemy's commit event, observation only) and each pooled connection is asked for its own."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, event, insert, select, update
from sqlalchemy.exc import OperationalError

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_NOTES = Table("unsynced_notes", _metadata, Column("name", String, primary_key=True), Column("value", Integer))

#: What each database calls its setting, and its value for a synced commit and for an unsynced one.
_SETTING = {"sqlite": ("PRAGMA synchronous", 2, 1), "postgresql": ("SHOW synchronous_commit", "on", "off")}


def _database(url: str) -> Database:
    database = Database(url)
    _metadata.create_all(database.engine)
    with database.engine.begin() as connection:
        connection.execute(insert(_NOTES), [{"name": "n", "value": 0}])
    return database


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    if request.param == "sqlite":
        database = _database(f"sqlite:///{tmp_path / 'unsynced.sqlite'}")
        yield database
        database.dispose()
        return
    postgres = request.getfixturevalue("postgres")
    url = postgres.create()
    database = _database(url)
    yield database
    database.dispose()
    postgres.drop(url)


@pytest.fixture
def sqlite_db(tmp_path):
    database = _database(f"sqlite:///{tmp_path / 'unsynced.sqlite'}")
    yield database
    database.dispose()


def _setting(dbapi_connection, database: Database):
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_SETTING[database.dialect][0])
        return cursor.fetchone()[0]
    finally:
        cursor.close()


def _noting_commits(db: Database) -> list:
    """The setting each commit on a pooled connection runs under, in order."""
    seen: list = []

    @event.listens_for(db.engine, "commit")
    def _note(connection: Connection) -> None:
        seen.append(_setting(connection.connection.dbapi_connection, db))

    return seen


def _every_pooled_connections_setting(db: Database) -> list:
    """The setting of each connection the pool holds now, and of a new one, checked out together."""
    with contextlib.ExitStack() as stack:
        connections = [stack.enter_context(db.engine.connect()) for _ in range(db.engine.pool.checkedin() + 1)]
        return [_setting(connection.connection.dbapi_connection, db) for connection in connections]


def _bump(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(update(_NOTES).values(value=_NOTES.c.value + 1))


def _value(db: Database) -> int:
    with db.engine.connect() as connection:
        return connection.execute(select(_NOTES.c.value)).scalar_one()


def test_only_the_unsynced_commit_is_unsynced(db):
    commits = _noting_commits(db)
    _query, synced, unsynced = _SETTING[db.dialect]
    _bump(db)
    db.commit_unsynced(update(_NOTES).values(value=_NOTES.c.value + 10))
    _bump(db)

    assert commits == [synced, unsynced, synced]
    assert _value(db) == 12
    assert set(_every_pooled_connections_setting(db)) == {synced}


def test_a_connection_whose_setting_cannot_be_set_back_is_never_used_again(sqlite_db, monkeypatch):
    """SQLite sets the setting of the connection itself, and back after the commit (PostgreSQL's ends
    with its transaction): when setting it back fails, the connection is dropped rather than put back
    in the pool unsynced."""
    db = sqlite_db
    commits = _noting_commits(db)
    real = Connection.exec_driver_sql

    def failing_to_set_back(self, statement, *args, **kwargs):
        if statement == "PRAGMA synchronous=FULL":
            raise OperationalError(statement, (), Exception("injected: the connection cannot be set back"))
        return real(self, statement, *args, **kwargs)

    monkeypatch.setattr(Connection, "exec_driver_sql", failing_to_set_back)
    with pytest.raises(OperationalError, match="injected"):
        db.commit_unsynced(update(_NOTES).values(value=_NOTES.c.value + 10))
    monkeypatch.undo()

    assert _value(db) == 10, "the statement itself was committed"
    assert set(_every_pooled_connections_setting(db)) == {2}
    commits.clear()
    for _ in range(db.engine.pool.checkedin() + 1):
        _bump(db)
    assert set(commits) == {2}
