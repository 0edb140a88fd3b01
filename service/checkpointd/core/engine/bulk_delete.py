"""Deleting every checkpoint that matches a filter, in one plan or across plans
(CheckpointService.DeleteCheckpoints): how a caller purges a run it labelled, or empties a plan.

Each plan's matches are deleted under that plan's lock, as a single DeleteCheckpoint would be, and
read again under it, so a checkpoint recorded meanwhile is judged by the same filter. Content shared
with other checkpoints stays: the store's garbage collection decides what is unreferenced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import col, select

from checkpointd.core.engine import filtering
from checkpointd.core.engine.parts import EngineParts
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.engine.requests import Checkpoint
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import InvalidArgument, Reason
from checkpointd.core.metadata.models import CheckpointRow

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement



def conditions(wanted: filtering.Filter, plan_id: str = "") -> list[ColumnElement[bool]]:
    """The WHERE terms of a parsed AIP-160 filter, in one plan or (plan_id empty) in all."""
    terms: list[ColumnElement[bool]] = []
    if plan_id:
        terms.append(col(CheckpointRow.plan_id) == plan_id)
    if wanted.phase:
        terms.append(col(CheckpointRow.phase) == wanted.phase)
    if wanted.trigger:
        terms.append(col(CheckpointRow.trigger) == wanted.trigger)
    if wanted.source_tool is not None:
        terms.append(col(CheckpointRow.source_tool) == wanted.source_tool)
    for key, value in wanted.labels:
        terms.append(col(CheckpointRow.labels)[key].as_string() == value)
    return terms


def delete_matching(parts: EngineParts, recovery: Recovery, plan_id: str, filter_text: str) -> list[Checkpoint]:
    """Deletes the checkpoints ``filter_text`` selects in ``plan_id`` (every plan when empty, which
    then needs a filter: an empty one would mean every checkpoint of the server); returns them."""
    wanted, plans = plans_matching(parts, plan_id, filter_text)
    return [checkpoint for plan in plans for checkpoint in delete_in_plan(parts, recovery, plan, wanted)]


def plans_matching(parts: EngineParts, plan_id: str, filter_text: str) -> tuple[filtering.Filter, list[str]]:
    """The parsed filter and the plans holding a checkpoint it selects (see ``delete_matching``):
    a caller on an event loop deletes from each with ``delete_in_plan``, waiting for a busy plan
    on the loop rather than in a thread."""
    plan_id = validation.plan_id(plan_id, required=False)
    if not plan_id and not filter_text.strip():
        raise InvalidArgument(Reason.MISSING_FIELD, "filter is required when plan_id is empty "
                              "(an empty filter across every plan would delete everything)", field="filter")
    wanted = filtering.parse_filter(filter_text)
    with parts.db.session() as session:
        plans = sorted(session.exec(select(CheckpointRow.plan_id).where(*conditions(wanted, plan_id)).distinct()).all())
    return wanted, plans


def delete_in_plan(parts: EngineParts, recovery: Recovery, plan: str, wanted: filtering.Filter) -> list[Checkpoint]:
    """Deletes, under the plan's lock, what ``wanted`` selects in ``plan`` at that moment."""
    with recovery.deleting(plan), parts.db.session() as session:
        rows = list(session.exec(select(CheckpointRow).where(*conditions(wanted, plan))).all())
        for row in rows:
            session.delete(row)
        session.commit()
        return [Checkpoint(row) for row in rows]
