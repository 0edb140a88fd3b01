"""A PostgreSQL advisory lock (a plan's lock, the GC fence) lives on a session of its own. Whatever
fails while it is taken or given back, no session is left holding it that no one will release (every
other replica would wait for that plan or collection for ever): a lock whose holder cannot be read,
or that cannot be unlocked, ends its session, and the lock with it. The end of a holder's session
is seen without a round trip, and a connection whose network vanishes silently is given up by TCP
keepalives within about 25 s.

Faults are injected where the driver would raise (the statements the lock sends)."""

from __future__ import annotations

import select
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from checkpointd.core.metadata import db as db_module
from checkpointd.core.metadata.db import Database, lock_key
from checkpointd.core.metadata.rows import was_dropped


@pytest.fixture
def pg(postgres) -> Iterator[tuple[Database, object]]:
    url = postgres.create()
    database = Database(url)
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    yield database, admin
    admin.dispose()
    database.dispose()
    postgres.drop(url)


def _holders(admin, name: str) -> list[int]:
    """The pids of the sessions holding (or waiting for) the lock ``name``."""
    with admin.connect() as connection:
        return sorted(connection.execute(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND ((classid::bigint << 32) | objid::bigint) = :key"), {"key": lock_key(name)}).scalars())


def _taken_by_another_session(admin, name: str) -> bool:
    """Whether another session takes the lock, waiting for it as a replica would (a session that
    ended releases its locks once the server has seen it go) but not for ever."""
    with admin.connect() as connection:
        connection.execute(text("SET lock_timeout = '20s'"))
        try:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": lock_key(name)})
        except DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "55P03":  # lock_not_available: still held
                return False
            raise
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key(name)})
        return True


def test_a_lock_whose_holding_session_cannot_be_read_is_released_with_its_session(pg, monkeypatch):
    database, admin = pg

    def unreadable(_connection):
        raise psycopg.OperationalError("injected: the session's start cannot be read")

    monkeypatch.setattr(db_module, "_session_of", unreadable)
    lock = database.advisory_lock("plan:unreadable")
    with pytest.raises(DBAPIError, match="injected"):
        lock.acquire()
    monkeypatch.undo()

    assert lock.holder is None
    assert _taken_by_another_session(admin, "plan:unreadable"), "no session is left holding the lock"
    assert _holders(admin, "plan:unreadable") == []


def test_a_lock_that_cannot_be_unlocked_is_released_by_ending_its_session(pg):
    database, admin = pg
    lock = database.advisory_lock("plan:stuck")
    lock.acquire()
    assert _holders(admin, "plan:stuck") == [lock.holder.pid]
    lock._unlock_sql = "SELECT pg_advisory_unlock_that_fails(%s)"  # the unlock statement fails

    lock.release()

    assert lock.holder is None
    assert _taken_by_another_session(admin, "plan:stuck"), "the session that held it is gone, and the lock with it"
    assert _holders(admin, "plan:stuck") == []


def test_the_end_of_a_lock_holders_session_is_seen_without_a_round_trip(pg):
    database, admin = pg
    kept, ended = database.advisory_lock("plan:kept"), database.advisory_lock("plan:ended")
    kept.acquire()
    ended.acquire()
    try:
        assert not kept.session_ended() and not ended.session_ended()
        with admin.connect() as connection:
            assert connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": ended.holder.pid}).scalar()
        # The server's farewell reaches the socket: wait for it (not for a time).
        readable, _, _ = select.select([ended._connection.driver_connection.fileno()], [], [], 30)
        assert readable, "the ended session's socket never turned readable"

        assert ended.session_ended() is True
        assert kept.session_ended() is False
    finally:
        kept.release()
        ended.release()
    assert _holders(admin, "plan:kept") == []
    assert _taken_by_another_session(admin, "plan:ended")


def test_a_connection_whose_network_vanished_is_given_up_within_25_seconds(pg):
    database, _admin = pg
    lock = database.advisory_lock("keepalive")
    with lock, database.engine.connect() as connection:
        for driver in (lock._connection.driver_connection, connection.connection.driver_connection):
            given = {name: int(value) for name, value in driver.info.get_parameters().items()
                     if name.startswith("keepalives")}
            assert given["keepalives"] != 0, "TCP keepalives are on"
            assert given["keepalives_idle"] + given["keepalives_interval"] * given["keepalives_count"] == 25


def test_a_lock_asked_for_without_waiting_is_taken_only_when_free(pg):
    database, admin = pg
    first, second = database.advisory_lock("fence:try"), database.advisory_lock("fence:try")
    assert first.acquire(wait=False) is True
    try:
        assert second.acquire(wait=False) is False, "a held lock is refused at once"
        assert second.holder is None
        assert len(_holders(admin, "fence:try")) == 1, "the refused taker does not queue for it"
    finally:
        first.release()
    assert second.acquire(wait=False) is True
    second.release()
    assert _holders(admin, "fence:try") == []


def test_statements_run_in_a_locks_session_commit_together_only_while_it_is_held(pg):
    database, admin = pg
    with admin.connect() as connection:
        connection.execute(text("CREATE TABLE fenced (n integer PRIMARY KEY)"))
    lock = database.advisory_lock("gc")
    with pytest.raises(RuntimeError, match="lock held"):
        lock.run_in_session([("INSERT INTO fenced VALUES (%s)", (0,))])
    with lock:
        lock.run_in_session([("INSERT INTO fenced VALUES (%s)", (1,)), ("INSERT INTO fenced VALUES (%s)", (2,))])
        with pytest.raises(DBAPIError) as failed:
            lock.run_in_session([("INSERT INTO fenced VALUES (%s)", (3,)),
                                 ("INSERT INTO fenced (n) VALUES (%s)", (1,))])
        assert failed.value.statement == "INSERT INTO fenced VALUES (%s)", "the error names what was run"
    with pytest.raises(RuntimeError, match="lock held"):
        lock.run_in_session([("INSERT INTO fenced VALUES (%s)", (4,))])
    with admin.connect() as connection:
        assert sorted(connection.execute(text("SELECT n FROM fenced")).scalars()) == [1, 2], \
            "the failed transaction's first row was not committed either"


def test_a_lock_statement_that_fails_but_not_by_a_dropped_connection_is_not_tried_again(pg):
    """Only a pooled connection the server ended is worth a second attempt; any other failure (a
    lock wait cut short by a timeout, here a statement that fails) is the caller's at once, and the
    connection it failed on is closed rather than pooled."""
    database, admin = pg
    checkouts: list[int] = []
    invalidated: list[int] = []
    event.listen(database._locks_engine, "checkout", lambda *_args: checkouts.append(1))
    event.listen(database._locks_engine.pool, "invalidate", lambda *_args: invalidated.append(1))
    lock = database.advisory_lock("plan:failing")
    lock._lock_sql = "SELECT pg_advisory_lock_that_fails(%s)"  # the lock statement fails

    with pytest.raises(DBAPIError, match="pg_advisory_lock_that_fails"):
        lock.acquire()

    assert len(checkouts) == 1, "tried once"
    assert lock.holder is None
    assert len(invalidated) == 1, "the connection it failed on is closed, not pooled"
    assert _taken_by_another_session(admin, "plan:failing")


def test_a_closed_driver_connection_is_seen_dropped_without_touching_its_socket(pg):
    database, _admin = pg
    url = database.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    connection = psycopg.connect(url)
    assert was_dropped(connection) is False
    connection.close()
    assert was_dropped(connection) is True
