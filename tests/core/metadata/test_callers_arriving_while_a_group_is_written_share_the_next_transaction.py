"""While a group is written (by a caller or by the group commit's own thread), callers that arrive
wait their turn, and the next group writes all of them in one transaction: one commit (one log sync)
for all. A caller that began a transaction of its own beside the group being written would pay a
sync of its own, and a stream of callers would never share one.

Each caller's arrival is observed, not waited for with a sleep: a caller either waits on the group
commit's turn (seen by wrapping the condition's ``wait``) or begins a transaction (seen by wrapping
the transaction factory)."""

from __future__ import annotations

import contextlib
import threading

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_ITEMS = Table("turn_items", _metadata, Column("key", String, primary_key=True), Column("group_size", Integer))


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'turns.sqlite'}")
    _metadata.create_all(database.engine)
    yield database
    database.dispose()


def _group_sizes(db: Database) -> dict[str, int]:
    with db.engine.connect() as connection:
        return dict(connection.execute(select(_ITEMS.c.key, _ITEMS.c.group_size)).all())


@pytest.mark.parametrize("first_writer", ["a caller", "the group commit's thread"])
def test_callers_arriving_while_a_group_is_written_wait_and_share_the_next_transaction(db, first_writer):
    release, writing = threading.Event(), threading.Event()
    arrived = threading.Semaphore(0)
    began_beside: list[str] = []
    open_transactions = [0]

    def write(rows, keys) -> None:
        if "first" in keys:
            writing.set()
            assert release.wait(timeout=30)
        rows.insert(_ITEMS, [{"key": key, "group_size": len(keys)} for key in keys])

    queue = db.group_commit(write)
    real_transaction, real_wait = queue._transaction, queue._turn.wait

    @contextlib.contextmanager
    def noting_transaction():
        if open_transactions[0]:
            began_beside.append(threading.current_thread().name)
            arrived.release()
        open_transactions[0] += 1
        try:
            with real_transaction() as rows:
                yield rows
        finally:
            open_transactions[0] -= 1

    def noting_wait(*args, **kwargs):
        arrived.release()
        return real_wait(*args, **kwargs)

    queue._transaction = noting_transaction
    queue._turn.wait = noting_wait

    if first_writer == "a caller":
        first = threading.Thread(target=queue.submit, args=("first",))
        first.start()
    else:
        first = queue.submit_nowait("first")
    assert writing.wait(timeout=30)
    callers = [threading.Thread(target=queue.submit, args=(key,), name=key) for key in ("k1", "k2", "k3")]
    for caller in callers:
        caller.start()
        assert arrived.acquire(timeout=30), "the caller neither waited nor began a transaction"
    release.set()
    for caller in callers:
        caller.join(timeout=30)
    if first_writer == "a caller":
        first.join(timeout=30)
    else:
        first.result(timeout=30)
    queue.close()

    assert began_beside == [], "no caller began a transaction beside the group being written"
    assert _group_sizes(db) == {"first": 1, "k1": 3, "k2": 3, "k3": 3}


def test_an_item_queued_without_waiting_while_a_caller_writes_a_group_is_written_when_it_ends(db):
    """A create on the event loop queues its row and returns; when the caller leading the group being
    written is done, the group commit's own thread writes that row (nobody else is left to)."""
    release, writing = threading.Event(), threading.Event()

    def write(rows, keys) -> None:
        if "first" in keys:
            writing.set()
            assert release.wait(timeout=30)
        rows.insert(_ITEMS, [{"key": key, "group_size": len(keys)} for key in keys])

    queue = db.group_commit(write)
    first = threading.Thread(target=queue.submit, args=("first",))
    first.start()
    assert writing.wait(timeout=30)
    queued = queue.submit_nowait("queued")
    release.set()
    first.join(timeout=30)

    assert queued.result(timeout=30) is None
    queue.close()
    assert _group_sizes(db) == {"first": 1, "queued": 1}
