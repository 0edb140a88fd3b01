"""Group commit: concurrent writers share transactions, and one writer's failure is its own."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.exc import IntegrityError

from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.metadata.rows import CoreRows

_metadata = MetaData()
_ITEMS = Table("group_commit_items", _metadata, Column("key", String, primary_key=True), Column("group_size", Integer))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """SQLite writes groups on a dedicated driver connection, PostgreSQL through Core: both run."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'group.sqlite'}"
        return
    postgres = request.getfixturevalue("postgres")
    url = postgres.create()
    yield url
    postgres.drop(url)


@pytest.fixture
def db(db_url):
    database = Database(db_url)
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
    so that they must form a second, shared group; and an event set once the first group is being written."""
    released = threading.Event()
    writing = threading.Event()
    queue = None

    def held(rows, keys):
        if not released.is_set():
            writing.set()
            deadline = time.monotonic() + 10
            while len(queue._queue) < expected_waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            released.set()
        return write(rows, keys)

    queue = db.group_commit(held)
    return queue, writing


def _insert_all(rows, keys: list[str]) -> None:
    rows.insert(_ITEMS, [{"key": key, "group_size": len(keys)} for key in keys])


def test_items_queued_while_a_group_is_written_share_the_next_transaction(db):
    queue, writing = _held_first_group(db, _insert_all, expected_waiting=5)
    first = threading.Thread(target=queue.submit, args=("leader",))
    first.start()
    assert writing.wait(timeout=30)
    outcomes = _run_concurrently(queue.submit, [f"k{i}" for i in range(5)])
    first.join(timeout=30)

    assert outcomes == {f"k{i}": "committed" for i in range(5)}
    stored = _stored(db)
    assert stored["leader"] == 1
    assert {stored[f"k{i}"] for i in range(5)} == {5}, "the five waiting items were written in one group"


def test_a_failing_item_fails_alone_and_the_rest_of_its_group_is_written(db):
    with db.engine.begin() as connection:
        connection.execute(insert(_ITEMS), {"key": "taken", "group_size": 0})
    queue, writing = _held_first_group(db, _insert_all, expected_waiting=4)
    first = threading.Thread(target=queue.submit, args=("leader",))
    first.start()
    assert writing.wait(timeout=30)
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


def test_the_group_writer_stores_every_column_exactly_as_core_does(db_url):
    """On SQLite the group writer bypasses the ORM layer: its rows must read back byte for byte
    like rows Core wrote (dates, JSON, NULLs), and it numbers checkpoints (reading a column of the
    numbered row) like Core does."""
    database = Database(db_url)
    database.migrate()
    try:
        plans, checkpoints = PlanRow.__table__, CheckpointRow.__table__
        with database.engine.begin() as connection:
            connection.execute(insert(plans), [{"plan_id": "p1", "workspace_root": "/w", "last_sequence": 0,
                                                 "create_time": datetime.now(UTC)}])

        def record(checkpoint_id: str) -> dict[str, object]:
            return {"checkpoint_id": checkpoint_id, "plan_id": "p1", "sequence": 0, "phase": "execute",
                    "trigger": "manual", "source_tool": "tool \u00e9", "description": "",
                    "labels": {"k": "v\u00e9"}, "create_time": datetime(2026, 11, 30, 5, 6, 7, 123456, tzinfo=UTC),
                    "workspace_root": "/w", "tree_digest": "ab" * 32, "file_count": 3, "total_size_bytes": 2**40,
                    "state_digest": None, "state_size_bytes": 0, "skipped": [["a/b", "UNREADABLE", "x"]],
                    "ignore_patterns": ["*.log"], "excluded_paths": [], "rollback_target_checkpoint_id": None,
                    "pending_write_bytes": 0}

        roots_read = []

        def write(rows, items):
            sequence, root = rows.increment(plans.c.last_sequence, plans.c.plan_id, ["p1"],
                                            also=plans.c.workspace_root)["p1"]
            roots_read.append(root)
            rows.insert(checkpoints, [{**item, "sequence": sequence} for item in items])

        with database.engine.begin() as connection:
            write(CoreRows(connection), [record("by-core")])
        database.group_commit(write).submit(record("by-group"))

        columns = [column.name for column in checkpoints.columns if column.name != "checkpoint_id"]
        with database.engine.connect() as connection:
            stored = {row[0]: row[1:] for row in connection.exec_driver_sql(
                f"SELECT checkpoint_id, {', '.join(columns)} FROM checkpoints")}
        by_core = dict(zip(columns, stored["by-core"], strict=True))
        by_group = dict(zip(columns, stored["by-group"], strict=True))
        assert (by_core.pop("sequence"), by_group.pop("sequence")) == (1, 2)
        assert roots_read == ["/w", "/w"]
        assert by_group == by_core
    finally:
        database.dispose()


def test_items_submitted_without_waiting_are_written_together_by_the_group_commits_thread(db):
    writers: list[str] = []

    def insert_noting_the_writer(rows, keys):
        writers.append(threading.current_thread().name)
        _insert_all(rows, keys)

    queue, writing = _held_first_group(db, insert_noting_the_writer, expected_waiting=5)
    first = queue.submit_nowait("leader")
    assert writing.wait(timeout=30)
    rest = [queue.submit_nowait(f"k{i}") for i in range(5)]

    for future in [first, *rest]:
        assert future.result(timeout=30) is None
    stored = _stored(db)
    assert stored["leader"] == 1
    assert {stored[f"k{i}"] for i in range(5)} == {5}, "the five queued items were written in one group"
    assert set(writers) == {"group-commit"}


def test_prepare_runs_before_its_items_transaction_and_a_failing_prepare_fails_only_its_item(db):
    seen_before_prepare: dict[str, dict[str, int]] = {}

    def prepare_noting(key: str):
        return lambda: seen_before_prepare.setdefault(key, _stored(db))

    def refuse() -> None:
        raise OSError(28, "No space left on device")

    queue, writing = _held_first_group(db, _insert_all, expected_waiting=3)
    first = queue.submit_nowait("leader")
    assert writing.wait(timeout=30)
    a = queue.submit_nowait("a", prepare=prepare_noting("a"))
    b = queue.submit_nowait("b", prepare=refuse)
    c = queue.submit_nowait("c", prepare=prepare_noting("c"))

    assert first.result(timeout=30) is None and a.result(timeout=30) is None and c.result(timeout=30) is None
    with pytest.raises(OSError, match="No space left"):
        b.result(timeout=30)
    stored = _stored(db)
    assert "b" not in stored
    assert stored["a"] == stored["c"] == 2, "the items whose prepare succeeded shared a transaction"
    assert "a" not in seen_before_prepare["a"] and "c" not in seen_before_prepare["c"], "prepare ran first"


def test_waiting_and_not_waiting_callers_share_one_queue(db):
    queue, writing = _held_first_group(db, _insert_all, expected_waiting=4)
    first = threading.Thread(target=queue.submit, args=("leader",))
    first.start()
    assert writing.wait(timeout=30)
    not_waiting = [queue.submit_nowait(key) for key in ("n1", "n2")]
    outcomes = _run_concurrently(queue.submit, ["w1", "w2"])
    first.join(timeout=30)

    assert outcomes == {"w1": "committed", "w2": "committed"}
    assert all(future.result(timeout=30) is None for future in not_waiting)
    assert set(_stored(db)) == {"leader", "n1", "n2", "w1", "w2"}


def test_close_writes_what_was_queued_without_waiting_and_then_refuses(db):
    queue = db.group_commit(_insert_all)
    queued = [queue.submit_nowait(f"q{i}") for i in range(3)]
    queue.close()

    assert all(future.done() and future.result() is None for future in queued)
    assert set(_stored(db)) == {"q0", "q1", "q2"}
    with pytest.raises(RuntimeError, match="closed"):
        queue.submit_nowait("late")
