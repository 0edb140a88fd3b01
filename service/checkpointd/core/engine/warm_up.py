"""The start-up warm-up: a rollback's statements run once, in a transaction that is rolled back."""

from __future__ import annotations

import logging

from sqlalchemy import delete
from sqlalchemy.exc import SQLAlchemyError

from checkpointd.core.engine.idempotency import operation, replayed
from checkpointd.core.engine.parts import EngineParts
from checkpointd.core.engine.records import OPERATIONS, KnownPlan, NewCheckpoint, new_row, write_checkpoints
from checkpointd.core.engine.recovery import JOURNAL
from checkpointd.core.engine.restoring import newest_state
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.metadata.rows import CoreRows
from checkpointd.core.restore.journal import JournalEntry

log = logging.getLogger("checkpointd.engine")

#: The warm-up's plan and request id: ids no client can send (not a ULID; not printable).
WARM_UP_PLAN = "checkpointd-warm-up"
WARM_UP_REQUEST_ID = "\x01checkpointd-warm-up"


def warm_up(parts: EngineParts) -> None:
    """Runs the queries of a rollback once, in a transaction that is rolled back, on a key no
    client can use: SQLAlchemy compiles a statement the first time it runs it, which cost a
    process's first rollback about 8 ms. For a sidecar, the first rollback may be its only one."""
    plan_id, request_id = WARM_UP_PLAN, WARM_UP_REQUEST_ID
    try:
        parts.journal.get(plan_id)
        parts.db.commit_unsynced(delete(JOURNAL).where(JOURNAL.c.plan_id == plan_id))
    except SQLAlchemyError as exc:
        log.warning("warming up the journal's statements failed (%s)", exc)
    with parts.db.session() as session:
        try:
            replayed(session, request_id, "Rollback", "")
            session.get(CheckpointRow, plan_id)
            session.add(PlanRow(plan_id=plan_id))
            session.flush()
            newest_state(session, plan_id)
            record = new_row(KnownPlan(plan_id, None), None, [], [], None, 0,
                             phase=Phase.ROLLBACK_SAFETY.value, trigger=Trigger.ROLLBACK.value,
                             source_tool="", description="", labels={})
            rows = CoreRows(session.connection())
            write_checkpoints(rows, [NewCheckpoint(record)])
            rows.insert(OPERATIONS, [operation(request_id, "Rollback", "", {})])
            parts.journal.put(JournalEntry(plan_id, "", "", "", "", (), "", ()), session)
        except SQLAlchemyError as exc:
            log.warning("warming up the database statements failed (%s); the first rollback will be slower", exc)
        finally:
            session.rollback()
