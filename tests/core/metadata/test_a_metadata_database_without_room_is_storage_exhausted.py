"""A write the metadata database had no room for is told apart from every other failure
(``storage_exhausted``: the server answers RESOURCE_EXHAUSTED / STORAGE_EXHAUSTED and keeps serving):
SQLite's SQLITE_FULL, PostgreSQL's disk_full, ENOSPC or EDQUOT, found in the error or in what caused
it (up to eight links down); anything else is not taken for a full disk."""

from __future__ import annotations

import errno
import sqlite3

import psycopg
import pytest
from sqlalchemy import Column, Integer, LargeBinary, MetaData, Table, event, select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.metadata.db import Database, storage_exhausted

_metadata = MetaData()
_ROWS = Table("roomy_rows", _metadata, Column("id", Integer, primary_key=True), Column("body", LargeBinary))


def _exhausted(error: BaseException) -> bool:
    found = storage_exhausted(error)
    return isinstance(found, ResourceExhausted) and found.reason is Reason.STORAGE_EXHAUSTED


def _chain(links: int, last: BaseException) -> BaseException:
    """An error ``links`` links above ``last`` (each raised from the one below it)."""
    error = last
    for n in range(links):
        above = RuntimeError(f"link {n}")
        above.__cause__ = error
        error = above
    return error


def test_a_group_commit_that_fills_a_sqlite_database_is_storage_exhausted(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'small.sqlite'}")
    try:
        _metadata.create_all(database.engine)
        with database.engine.connect() as connection:
            pages = connection.exec_driver_sql("PRAGMA page_count").scalar()

        @event.listens_for(database.engine, "connect")
        def _small_disk(dbapi_connection, _record) -> None:  # injected: room for a few pages more
            dbapi_connection.execute(f"PRAGMA max_page_count={pages + 4}")

        database.engine.dispose()
        queue = database.group_commit(lambda rows, bodies: rows.insert(_ROWS, [{"id": None, "body": body}
                                                                                 for body in bodies]))
        queue.submit(b"fits")
        with pytest.raises(OperationalError) as full:
            queue.submit(b"x" * (64 << 10))

        assert full.value.orig.sqlite_errorcode == sqlite3.SQLITE_FULL
        assert _exhausted(full.value)
        assert _exhausted(_chain(3, full.value))
        with database.engine.connect() as connection:
            assert connection.execute(select(_ROWS.c.body)).scalars().all() == [b"fits"]
        queue.submit(b"a small row still fits")
    finally:
        database.dispose()


def test_a_full_postgresql_disk_is_storage_exhausted():
    disk_full = psycopg.errors.DiskFull("could not extend file: No space left on device")
    error = DBAPIError.instance("INSERT", (), disk_full, psycopg.Error)
    assert _exhausted(error)
    assert _exhausted(_chain(2, error))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_found_in_what_caused_an_error_is_storage_exhausted(code):
    no_room = OSError(code, "no room")
    assert _exhausted(no_room)
    assert _exhausted(_chain(7, no_room)), "eight links down"
    context = RuntimeError("raised while handling it")
    context.__context__ = no_room
    assert _exhausted(context)


def test_other_errors_are_not_taken_for_a_full_disk():
    assert storage_exhausted(OSError(errno.EACCES, "denied")) is None
    assert storage_exhausted(RuntimeError("anything")) is None
    assert storage_exhausted(IntegrityError("INSERT", (), sqlite3.IntegrityError("UNIQUE constraint failed"))) is None
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = sqlite3.SQLITE_BUSY
    assert storage_exhausted(DBAPIError.instance("INSERT", (), busy, sqlite3.Error)) is None
    assert storage_exhausted(_chain(8, OSError(errno.ENOSPC, "too far down to be looked for"))) is None
    looping = RuntimeError("a cause that loops")
    looping.__cause__ = RuntimeError("back")
    looping.__cause__.__cause__ = looping
    assert storage_exhausted(looping) is None
