"""Group commit: concurrent writers share transactions, and one writer's failure is its own."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.exc import IntegrityError

from checkpointd.core.db import Database

_metadata = MetaData()
_ITEMS = Table("group_commit_items", _metadata, Column("key", String, primary_key=True), Column("group_size", Integer))


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'group.sqlite'}")
    _metadata.create_all(database.engine)
    yield database
    database.dispose()


def _stored(db: Database) -> dict[str, int]:
    with db.engine.connect() as connection:
        return dict(connection.execute(select(_ITEMS.c.key, _ITEMS.c.group_size)).all())


def _run_concurrently(submit, keys: list[str]) -> dict[str, BaseException | str]:
    outcomes: dict[str, BaseException | str] = {}

    def one(key: str) -> None:
        try:
            submit(key)
            outcomes[key] = "committed"
        except BaseException as exc:
            outcomes[key] = exc

    threads = [threading.Thread(target=one, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def _held_first_group(db: Database, write, expected_waiting: int):
    """A group commit whose first group waits until ``expected_waiting`` more items are queued,
    so that they must form a second, shared group."""
    released = threading.Event()
    queue = None

    def held(connection, keys):
        if not released.is_set():
            deadline = time.monotonic() + 10
            while len(queue._queue) < expected_waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            released.set()
        return write(connection, keys)

    queue = db.group_commit(held)
    return queue


def _insert_all(connection, keys: list[str]) -> None:
    connection.execute(insert(_ITEMS), [{"key": key, "group_size": len(keys)} for key in keys])


def test_items_queued_while_a_group_is_written_share_the_next_transaction(db):
    queue = _held_first_group(db, _insert_all, expected_waiting=5)
    first = threading.Thread(target=queue.submit, args=("leader",))
    first.start()
    time.sleep(0.05)
    outcomes = _run_concurrently(queue.submit, [f"k{i}" for i in range(5)])
    first.join(timeout=30)

    assert outcomes == {f"k{i}": "committed" for i in range(5)}
    stored = _stored(db)
    assert stored["leader"] == 1
    assert {stored[f"k{i}"] for i in range(5)} == {5}, "the five waiting items were written in one group"


def test_a_failing_item_fails_alone_and_the_rest_of_its_group_is_written(db):
    with db.transaction() as connection:
        connection.execute(insert(_ITEMS), {"key": "taken", "group_size": 0})
    queue = _held_first_group(db, _insert_all, expected_waiting=4)
    first = threading.Thread(target=queue.submit, args=("leader",))
    first.start()
    time.sleep(0.05)
    outcomes = _run_concurrently(queue.submit, ["a", "b", "taken", "c"])
    first.join(timeout=30)

    assert isinstance(outcomes["taken"], IntegrityError)
    assert {key: outcomes[key] for key in "abc"} == {key: "committed" for key in "abc"}
    stored = _stored(db)
    assert stored["taken"] == 0, "the existing row is untouched"
    assert {stored[key] for key in "abc"} == {1}, "after the shared transaction failed, each item was written alone"


def test_a_caller_alone_is_written_at_once_and_sees_its_own_error(db):
    queue = db.group_commit(_insert_all)
    queue.submit("solo")
    with pytest.raises(IntegrityError):
        queue.submit("solo")
    assert _stored(db) == {"solo": 1}
