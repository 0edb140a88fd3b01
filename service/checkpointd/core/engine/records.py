"""Checkpoint rows as the create and rollback paths write them: built without the ORM, numbered
and inserted with the request_id records of the same transaction."""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from ulid import ULID

from checkpointd.core.capture.snapshot import CaptureResult
from checkpointd.core.metadata.models import CheckpointRow, OperationRow, PlanRow, utcnow
from checkpointd.core.metadata.rows import RowWriter

PLANS = PlanRow.__table__
CHECKPOINTS = CheckpointRow.__table__
OPERATIONS = OperationRow.__table__


@dataclass(frozen=True, slots=True)
class KnownPlan:
    """What a checkpoint needs of its plan; a plan's root never changes once recorded."""

    plan_id: str
    workspace_root: str | None


#: A checkpoint as the create and rollback paths write it: the ``checkpoints`` table's columns,
#: derived from the table, without the ORM's per-attribute bookkeeping.
CheckpointRecord = make_dataclass("CheckpointRecord", [column.name for column in CHECKPOINTS.columns], slots=True)


def _record_values(record: CheckpointRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__slots__}


class PlanRootRecorded(Exception):
    """A checkpoint was captured for its plan as remembered, but the plan's row names another
    workspace root: another replica recorded one meanwhile. Its transaction writes nothing."""


@dataclass(slots=True)
class NewCheckpoint:
    record: CheckpointRecord
    #: The request_id's row (AIP-155), when the request carried one.
    operation: dict[str, object] | None = None


def _skipped_json(capture: CaptureResult) -> list[list[object]]:
    return [[s.path, s.size, s.reason] for s in capture.skipped]


def write_checkpoints(rows: RowWriter, new: list[NewCheckpoint]) -> None:
    """Numbers and inserts new checkpoints of distinct plans (callers hold their plans' locks).

    Incrementing the plans' counters locks their rows (PostgreSQL) or the database (SQLite)
    until the transaction ends, so a number is never handed out twice. The same statement reads
    each plan's workspace root, which the checkpoint must have been captured under (none for a
    state-only one): a remembered plan is thereby checked without a read of its own. Checks
    queued on ``rows`` (``RowWriter.check``) run with the numbering, and may refuse the transaction."""
    numbered = rows.increment(PLANS.c.last_sequence, PLANS.c.plan_id, [n.record.plan_id for n in new],
                              also=PLANS.c.workspace_root)
    for item in new:
        sequence, root = numbered[item.record.plan_id]
        if root != item.record.workspace_root:
            raise PlanRootRecorded(f"plan {item.record.plan_id} has a workspace root recorded by another replica")
        item.record.sequence = sequence
    rows.insert(CHECKPOINTS, [_record_values(n.record) for n in new])
    operations = [n.operation for n in new if n.operation is not None]
    if operations:
        rows.insert(OPERATIONS, operations)


def new_row(plan: PlanRow | KnownPlan, capture: CaptureResult | None, patterns: list[str],
            excluded: list[str], state_digest: str | None, state_size: int, *, phase: str, trigger: str,
            source_tool: str, description: str, labels: dict[str, str],
            rollback_target_checkpoint_id: str | None = None) -> CheckpointRecord:
    """A new checkpoint, numbered when inserted."""
    return CheckpointRecord(
        checkpoint_id=str(ULID()),
        plan_id=plan.plan_id,
        sequence=0,
        phase=phase,
        trigger=trigger,
        source_tool=source_tool,
        description=description,
        labels=labels,
        create_time=utcnow(),
        workspace_root=plan.workspace_root if capture else None,
        tree_digest=capture.tree if capture else None,
        file_count=capture.file_count if capture else 0,
        total_size_bytes=capture.total_size if capture else 0,
        state_digest=state_digest,
        state_size_bytes=state_size,
        skipped=_skipped_json(capture) if capture else [],
        ignore_patterns=patterns,
        excluded_paths=excluded,
        rollback_target_checkpoint_id=rollback_target_checkpoint_id,
        pending_write_bytes=0,
    )
