"""The rollback journal (core/restore/journal.py) keeps one entry per plan in the database that
every replica shares. Writing, rewriting or removing one plan's entry never touches another
plan's (the entry of a rollback killed in another plan must still be there, as it was, to be
finished), and on PostgreSQL an entry another replica wrote, or removed, is seen at once: no
replica keeps its own idea of which plans have one (on SQLite one process owns the database
and may)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from checkpointd.core.metadata.db import Database
from checkpointd.core.restore.journal import Goal, JournalEntry, RollbackJournal
from checkpointd.core.workspace.windows import Window

A, B = "01JA0000000000000000000000", "01JB0000000000000000000000"


def _entry(plan_id: str, **fields) -> JournalEntry:
    return JournalEntry(plan_id=plan_id, workspace_root=f"/w/{plan_id}", target_checkpoint_id=f"t-{plan_id}",
                        safety_checkpoint_id=f"s-{plan_id}", safety_tree="tree", paths=(), temp_tag=plan_id.lower(),
                        directories=("",), request_id=f"r-{plan_id}", last_sequence=3, **fields)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'meta.db'}"
        return
    postgres = request.getfixturevalue("postgres")
    url = postgres.create()
    try:
        yield url
    finally:
        postgres.drop(url)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    opened = Database(database_url)
    opened.migrate()
    try:
        yield opened
    finally:
        opened.dispose()


def test_writing_and_removing_one_plans_entry_leaves_the_others_as_they_were(db: Database) -> None:
    journal = RollbackJournal(db)
    theirs = _entry(B, goal=Goal.UNDO, interim=("p",))
    journal.put(_entry(A))
    journal.put(theirs)

    ours = replace(_entry(A), opened=(Window("ro", 0o555, 2049, 77, 5),))
    journal.put(ours)
    assert journal.get(B) == theirs
    ours = replace(ours, opened=())  # the window closed: journaled without waiting for the disk
    journal.put_unsynced(ours)
    assert journal.get(A) == ours
    assert journal.get(B) == theirs
    journal.remove(A)

    assert journal.get(A) is None
    assert journal.get(B) == theirs
    assert journal.plan_ids() == [B]
    assert journal.may_have(B)


def test_on_postgresql_an_entry_another_replica_writes_or_removes_is_seen_at_once(postgres) -> None:
    url = postgres.create()
    ours_db, theirs_db = Database(url), Database(url)
    try:
        ours_db.migrate()
        ours, theirs = RollbackJournal(ours_db), RollbackJournal(theirs_db)  # both started before the rollback
        ours.put(_entry(A))
        assert theirs.may_have(A) and theirs.get(A) == _entry(A)
        theirs.remove(A)
        assert ours.get(A) is None
        ours.put(_entry(A, goal=Goal.UNDO))  # the plan's next rollback, killed too
        assert theirs.may_have(A) and theirs.get(A) == _entry(A, goal=Goal.UNDO)
    finally:
        ours_db.dispose()
        theirs_db.dispose()
        postgres.drop(url)
