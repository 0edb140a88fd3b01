"""A caller of the group commit is told its rows are committed only once the transaction that holds
them has committed, on a connection whose commits wait for the disk (SQLite: WAL with
``synchronous=FULL``; PostgreSQL: ``synchronous_commit`` on), and a caller whose rows were in a
transaction that did not commit is told it failed, or is written again in a transaction of its own.

A power cut is not something a test can cause: SQLite's trace callback (observation only) records
each statement the group commit's connection runs, in order with each caller's answer, and each
transaction reads the settings its commit runs under."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Column, ForeignKey, Integer, MetaData, String, Table, event, insert, select, text
from sqlalchemy.exc import IntegrityError

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_PARENTS = Table("acked_parents", _metadata, Column("id", Integer, primary_key=True))
#: A row whose parent is missing fails only at COMMIT (a deferred foreign key).
_ITEMS = Table("acked_items", _metadata, Column("key", String, primary_key=True),
               Column("parent", Integer, ForeignKey("acked_parents.id", deferrable=True, initially="DEFERRED")))
_COUNTERS = Table("acked_counters", _metadata, Column("name", String, primary_key=True), Column("value", Integer))


class Interrupted(BaseException):
    """What is not an ``Exception`` (an interrupt): it fails a whole group, which is not written again."""


class Recorder:
    """The group commit's statements (``("sql", text)``, from its connection) and answers
    (``("ack", key, outcome)``), in the order they happened."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.settings: list[tuple] = []
        #: The keys the test inserts (found in the traced INSERTs).
        self.keys: tuple[str, ...] = ()

    def statement(self, sql: str) -> None:
        self.events.append(("sql", sql.strip().split()[0].upper(), sql))

    def ack(self, key: str, outcome: str) -> None:
        self.events.append(("ack", key, outcome))

    def committed_when_acknowledged(self) -> dict[str, tuple[bool, str]]:
        """For each answer: whether a COMMIT of a transaction that inserted the key had been run
        before it (with nothing rolled back since), and the answer."""
        pending: set[str] = set()
        committing: set[str] = set()  # the keys of the last COMMIT run: a ROLLBACK right after it undoes them
        committed: set[str] = set()
        answers: dict[str, tuple[bool, str]] = {}
        for event_ in self.events:
            if event_[0] == "ack":
                answers[event_[1]] = (event_[1] in committed, event_[2])
                continue
            _sql, verb, sql = event_
            if verb == "BEGIN":
                pending, committing = set(), set()
            elif verb == "INSERT":
                pending |= {key for key in self.keys if f"'{key}'" in sql}
            elif verb == "COMMIT":
                committed |= pending
                pending, committing = set(), pending
            elif verb == "ROLLBACK":
                committed -= committing
                pending, committing = set(), set()
        return answers


@pytest.fixture
def sqlite_db(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'acked.sqlite'}")
    recorder = Recorder()

    @event.listens_for(database.engine, "connect")
    def _trace(dbapi_connection, _record) -> None:
        dbapi_connection.set_trace_callback(recorder.statement)

    _metadata.create_all(database.engine)
    with database.engine.begin() as connection:
        connection.execute(insert(_PARENTS), [{"id": 1}])
        connection.execute(insert(_COUNTERS), [{"name": "groups", "value": 0}])
    recorder.events.clear()
    yield database, recorder
    database.dispose()


def _stored(database: Database) -> set[str]:
    with database.engine.connect() as connection:
        return set(connection.execute(select(_ITEMS.c.key)).scalars())


def _writer(recorder: Recorder, release: threading.Event | None = None, writing: threading.Event | None = None):
    """Inserts each (key, parent) of a group; the first group (with ``release``) waits for it, so
    that what is queued meanwhile forms the next group. Reads the commit's settings in each."""
    held = [release is not None]

    def write(rows, items) -> None:
        if held[0]:
            held[0] = False
            writing.set()
            assert release.wait(timeout=30)
        if any(parent == "interrupt" for _key, parent in items):
            raise Interrupted()
        rows.check([(text("PRAGMA synchronous"), {}), (text("PRAGMA journal_mode"), {})],
                   lambda results: recorder.settings.append(tuple(rows_[0][0] for rows_ in results)))
        rows.increment(_COUNTERS.c.value, _COUNTERS.c.name, ["groups"])
        rows.insert(_ITEMS, [{"key": key, "parent": parent} for key, parent in items])

    return write


def test_a_lone_caller_returns_only_after_the_commit_of_its_rows_on_a_synced_connection(sqlite_db):
    database, recorder = sqlite_db
    recorder.keys = ("solo", "again")
    queue = database.group_commit(_writer(recorder))

    queue.submit(("solo", 1))
    recorder.ack("solo", "committed")
    with pytest.raises(IntegrityError):
        queue.submit(("solo", 1))
    recorder.ack("again", "failed")

    assert recorder.committed_when_acknowledged()["solo"] == (True, "committed")
    assert recorder.settings == [(2, "wal"), (2, "wal")], "each commit: synchronous=FULL, in WAL mode"
    assert _stored(database) == {"solo"}


def test_each_caller_of_a_group_is_answered_after_the_commit_that_holds_its_rows(sqlite_db):
    """A group whose COMMIT fails (one row's parent is missing): no caller is told committed by it;
    the others are written again alone and answered after their own commits; the bad row fails."""
    database, recorder = sqlite_db
    recorder.keys = ("leader", "a", "b", "orphan", "c")
    release, writing = threading.Event(), threading.Event()
    queue = database.group_commit(_writer(recorder, release, writing))

    futures = {"leader": queue.submit_nowait(("leader", 1))}
    assert writing.wait(timeout=30)
    for key, parent in (("a", 1), ("b", 1), ("orphan", 99), ("c", 1)):
        futures[key] = queue.submit_nowait((key, parent))
    for key, future in futures.items():
        future.add_done_callback(lambda done, key=key: recorder.ack(
            key, "failed" if done.exception() is not None else "committed"))
    release.set()
    for future in futures.values():
        future.exception(timeout=30)
    queue.close()

    answers = recorder.committed_when_acknowledged()
    assert answers == {"leader": (True, "committed"), "a": (True, "committed"), "b": (True, "committed"),
                       "c": (True, "committed"), "orphan": (False, "failed")}
    assert isinstance(futures["orphan"].exception(), IntegrityError)
    verbs = [event_[1] for event_ in recorder.events if event_[0] == "sql" and event_[1] in ("COMMIT", "ROLLBACK")]
    assert verbs == ["COMMIT", "COMMIT", "ROLLBACK", "COMMIT", "COMMIT", "COMMIT", "ROLLBACK", "COMMIT"], \
        "the leader's group, the shared group that failed at its commit, then each of its rows alone"
    assert set(recorder.settings) == {(2, "wal")}
    assert _stored(database) == {"leader", "a", "b", "c"}


def test_a_group_interrupted_by_what_is_not_an_exception_fails_every_caller_in_it(sqlite_db):
    database, recorder = sqlite_db
    recorder.keys = ("leader", "a", "stop", "b")
    release, writing = threading.Event(), threading.Event()
    queue = database.group_commit(_writer(recorder, release, writing))

    leader = queue.submit_nowait(("leader", 1))
    assert writing.wait(timeout=30)
    group = [queue.submit_nowait(item) for item in (("a", 1), ("stop", "interrupt"), ("b", 1))]
    release.set()
    assert leader.result(timeout=30) is None
    for future in group:
        assert isinstance(future.exception(timeout=30), Interrupted)
    queue.submit(("after", 1))
    queue.close()

    assert _stored(database) == {"leader", "after"}, "the interrupted group was not written again, one by one"


def test_the_group_writer_commits_with_synchronous_commit_on_postgresql(postgres):
    url = postgres.create()
    database = Database(url)
    try:
        _metadata.create_all(database.engine)
        with database.engine.begin() as connection:
            connection.execute(insert(_COUNTERS), [{"name": "groups", "value": 0}])
            connection.execute(insert(_PARENTS), [{"id": 1}])
        seen: list[str] = []

        def write(rows, items) -> None:
            rows.check([(text("SELECT current_setting('synchronous_commit')"), {})],
                       lambda results: seen.append(results[0][0][0]))
            rows.increment(_COUNTERS.c.value, _COUNTERS.c.name, ["groups"])
            rows.insert(_ITEMS, [{"key": key, "parent": parent} for key, parent in items])

        database.group_commit(write).submit(("pg", 1))
        database.commit_unsynced(text("UPDATE acked_counters SET value = value + 1"))
        database.group_commit(write).submit(("pg again", 1))

        assert seen == ["on", "on"]
        assert _stored(database) == {"pg", "pg again"}
    finally:
        database.dispose()
        postgres.drop(url)
