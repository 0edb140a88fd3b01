"""A rollback's request_id is recorded with its safety checkpoint, before the workspace changes,
so that a retry of a finished rollback answers with its result (AIP-155). A rollback that did
not finish must never be answered so: whoever drops its journal entry unapplied drops that
record too (engine/recovery.py ``Recovery.drop``, and ``take_over`` when it cannot finish it).

So must the journal when it drops an entry it cannot read (restore/journal.py
``RollbackJournal.get``): here the rollback is killed part-way, its entry is damaged, and the
client retries with the same request_id. Answered from the record, the retry would report the
rollback done over a workspace left half-way; it must run the rollback again instead."""

from __future__ import annotations

import pytest
from sqlalchemy import update
from ulid import ULID

from checkpointd.core.engine.requests import RollbackRequest, Scope
from checkpointd.core.metadata.models import RollbackJournalRow
from tests.core.restore.killed_rollbacks import killed_part_way, three_files_changed_since_a_target
from tests.core.restore.test_an_unreadable_journal_entry_is_dropped_and_the_server_starts import DAMAGE
from tests.core.restore.test_rollback_write_path_attacked import Plan

JOURNAL = RollbackJournalRow.__table__


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_the_retry_of_a_rollback_whose_entry_could_not_be_read_restores_the_target(
        plan: Plan, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    target = three_files_changed_since_a_target(plan)
    request = RollbackRequest(plan_id=plan.plan_id, checkpoint_id=target.checkpoint_id, scope=Scope.FILES,
                              request_id=str(ULID()))
    killed_part_way(monkeypatch, lambda: plan.engine.rollback(request))
    body = dict(plan.engine.journal.get(plan.plan_id).to_record())
    DAMAGE[damage](body)
    with plan.db.session() as session:
        session.connection().execute(update(JOURNAL).where(JOURNAL.c.plan_id == plan.plan_id).values(entry=body))
        session.commit()
    assert plan.state() not in (plan.files_of(target),), "the kill was not part-way"

    plan.engine.rollback(request)  # the client's retry, after the server came back

    assert plan.state() == plan.files_of(target), "the retry was answered as done over a half-way workspace"
    assert plan.engine.journal.plan_ids() == []
