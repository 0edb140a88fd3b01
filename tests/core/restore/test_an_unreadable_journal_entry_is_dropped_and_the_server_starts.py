"""A journal entry in the database that cannot be read (an unknown version, a field missing or of
the wrong type, a short record: a damaged row, or one a server of another format wrote) is logged
and dropped (journal.py ``RollbackJournal.get``): the safety checkpoint it names stays, holding
the workspace from before that rollback. It is never a reason for the server not to start, nor
for the plan to be refused: the restarted server serves it."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from checkpointd.core.metadata.models import CheckpointRow, RollbackJournalRow
from tests.core.restore.killed_rollbacks import killed_part_way, three_files_changed_since_a_target
from tests.core.restore.test_rollback_changes_attacked import _reopen
from tests.core.restore.test_rollback_write_path_attacked import Plan, write

JOURNAL = RollbackJournalRow.__table__

DAMAGE = {
    "unknown-version": lambda body: body.update(version=99),
    "field-missing": lambda body: body.pop("paths"),
    "field-of-the-wrong-type": lambda body: body.update(directories=7),
    "written-entry-cut-short": lambda body: body.update(written=[["a.txt", ["f", 420]]]),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_an_unreadable_journal_entry_is_dropped_and_its_plan_served(
        plan: Plan, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    target = three_files_changed_since_a_target(plan)
    killed_part_way(monkeypatch, lambda: plan.rollback(target))
    body = dict(plan.engine.journal.get(plan.plan_id).to_record())
    DAMAGE[damage](body)
    with plan.db.session() as session:
        session.connection().execute(update(JOURNAL).where(JOURNAL.c.plan_id == plan.plan_id).values(entry=body))
        session.commit()
    halfway = plan.state()

    restarted = _reopen(plan)  # a restarted server
    try:
        assert restarted.engine.journal.plan_ids() == []
        assert restarted.state() == halfway, "an entry that could not be read was applied"
        with restarted.db.session() as session:
            assert session.get(CheckpointRow, body["safety_checkpoint_id"]) is not None
        write(plan.root / "a.txt", "written after the restart\n")
        assert restarted.checkpoint().sequence > target.sequence
    finally:
        restarted.close()
