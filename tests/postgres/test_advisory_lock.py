"""Advisory locks (plan locks, the GC fence) on PostgreSQL: held on pooled connections, taken
on the driver, retried once on a connection the server has ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.pool import NullPool

from checkpointd.core.metadata.db import TCP_KEEPALIVES, Database, _discard_if_dropped, lock_key
from tests.helpers import end_other_sessions


@pytest.fixture
def database(pg_url: str) -> Iterator[Database]:
    db = Database(pg_url)
    yield db
    db.dispose()


@pytest.fixture
def admin(pg_url: str):
    engine = create_engine(pg_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    yield engine
    engine.dispose()


def advisory_locks(admin, name: str) -> list[tuple[bool, str]]:
    """(granted, mode) of every session's hold or wait on the lock ``name`` in this test's database
    (pg_locks shows every database's: another test run's would count too)."""
    key = lock_key(name)
    with admin.connect() as connection:
        rows = connection.execute(text(
            "SELECT granted, mode FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND ((classid::bigint << 32) | objid::bigint) = :key "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"), {"key": key})
        return sorted((row.granted, row.mode) for row in rows)


def test_a_lock_is_held_until_released_and_a_second_taker_waits_for_it(database, admin):
    first, second = database.advisory_lock("plan:a"), database.advisory_lock("plan:a")
    first.acquire()
    assert advisory_locks(admin, "plan:a") == [(True, "ExclusiveLock")]
    taken = threading.Event()

    def take_second() -> None:
        with second:
            taken.set()

    waiter = threading.Thread(target=take_second)
    waiter.start()
    deadline = time.monotonic() + 10
    while advisory_locks(admin, "plan:a") != [(False, "ExclusiveLock"), (True, "ExclusiveLock")]:
        assert time.monotonic() < deadline, advisory_locks(admin, "plan:a")
        time.sleep(0.02)
    assert not taken.is_set()
    first.release()
    waiter.join(timeout=10)
    assert taken.is_set()
    assert advisory_locks(admin, "plan:a") == []


def test_shared_locks_are_held_together(database, admin):
    with database.advisory_lock("fence", shared=True), database.advisory_lock("fence", shared=True):
        assert advisory_locks(admin, "fence") == [(True, "ShareLock"), (True, "ShareLock")]
    assert advisory_locks(admin, "fence") == []


def test_a_lock_on_a_pooled_connection_the_server_ended_is_taken_on_a_new_one(database, admin):
    """With the pool's checkout check off, the dropped connection reaches the lock statement:
    the lock must notice the disconnect and take the lock once more on a fresh connection."""
    event.remove(database._locks_engine, "checkout", _discard_if_dropped)
    with database.advisory_lock("plan:b"):
        pass
    assert end_other_sessions(admin) >= 1
    lock = database.advisory_lock("plan:b")
    lock.acquire()
    try:
        assert advisory_locks(admin, "plan:b") == [(True, "ExclusiveLock")]
    finally:
        lock.release()
    assert advisory_locks(admin, "plan:b") == []


def test_connections_keep_tcp_alive_unless_the_url_says_otherwise(database: Database, pg_url: str) -> None:
    """Locks and work are held on connections with TCP keepalives, so that one whose network
    vanished (no farewell from the server) is seen dead in seconds; a URL's own setting wins."""
    lock = database.advisory_lock("keepalive-probe")
    with lock, database.engine.connect() as connection:
        for driver in (lock._connection.driver_connection, connection.connection.driver_connection):
            parameters = driver.info.get_parameters()
            assert {name: int(parameters[name]) for name in TCP_KEEPALIVES} == TCP_KEEPALIVES
    own = Database(pg_url + ("&" if "?" in pg_url else "?") + "keepalives_idle=60")
    try:
        with own.engine.connect() as connection:
            assert connection.connection.driver_connection.info.get_parameters()["keepalives_idle"] == "60"
    finally:
        own.dispose()
