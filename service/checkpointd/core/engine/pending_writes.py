"""Pending writes: what tasks wrote after a checkpoint, kept with it until a later checkpoint
holds them (PutPendingWrites / ListPendingWrites; LangGraph's ``put_writes``).

A write is keyed by (checkpoint, task, index). A repeated put keeps the first value of a regular
write (index >= 0: a retried task must not change what the first attempt recorded) and replaces a
special one (negative index: an error or interrupt is superseded by the next). The rows go with
their checkpoint through the foreign key's ON DELETE CASCADE, whatever deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import LargeBinary, cast
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, func, select

from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import InvalidArgument, NotFound, Reason, ResourceExhausted
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PendingWriteRow

MAX_WRITES = 1000
MAX_TOTAL_BYTES = 16 * 1024 * 1024
#: All of one checkpoint's pending writes (values and names): ListPendingWrites answers them in
#: one message, which must stay within the server's 64 MiB, so a put past this is refused.
MAX_CHECKPOINT_BYTES = 32 * 1024 * 1024
MAX_NAME = 256
MAX_VALUE_TYPE = 64
MAX_TASK_PATH = 1024


@dataclass(frozen=True)
class PendingWrite:
    task_id: str
    index: int
    channel: str
    value_type: str
    value: bytes
    task_path: str


def _validated(writes: list[PendingWrite]) -> list[PendingWrite]:
    if not writes:
        raise InvalidArgument(Reason.MISSING_FIELD, "writes is required", field="writes")
    if len(writes) > MAX_WRITES:
        raise InvalidArgument(Reason.FIELD_TOO_LONG, f"at most {MAX_WRITES} writes", field="writes", limit=MAX_WRITES)
    if sum(len(w.value) for w in writes) > MAX_TOTAL_BYTES:
        raise InvalidArgument(Reason.FIELD_TOO_LONG, f"the values total more than {MAX_TOTAL_BYTES} bytes",
                              field="writes.value", limit=MAX_TOTAL_BYTES)
    for write in writes:
        for field, value in (("writes.task_id", write.task_id), ("writes.channel", write.channel)):
            if not value:
                raise InvalidArgument(Reason.MISSING_FIELD, f"{field} is required", field=field)
            validation.text(value, MAX_NAME, field)
        validation.text(write.value_type, MAX_VALUE_TYPE, "writes.value_type")
        validation.text(write.task_path, MAX_TASK_PATH, "writes.task_path")
    return writes


def _not_found(checkpoint_id: str) -> NotFound:
    return NotFound(Reason.CHECKPOINT_NOT_FOUND, f"checkpoint {checkpoint_id} not found", checkpoint_id=checkpoint_id)


def put(db: Database, checkpoint_id: str, writes: list[PendingWrite]) -> None:
    """Records the writes in one transaction; a concurrent put of the same keys is retried once
    (the second attempt sees the first's rows)."""
    checkpoint_id = validation.checkpoint_id(checkpoint_id)
    writes = _validated(writes)
    for attempt in range(2):
        try:
            _put_once(db, checkpoint_id, writes)
            return
        except IntegrityError:
            # The key was inserted meanwhile (the retry keeps or replaces it), or the checkpoint was deleted.
            if attempt:
                raise _not_found(checkpoint_id) from None


def _put_once(db: Database, checkpoint_id: str, writes: list[PendingWrite]) -> None:
    with db.session() as session:
        # Locked (PostgreSQL): concurrent puts to one checkpoint take turns, so none of them
        # counts the total without the others' rows (MAX_CHECKPOINT_BYTES).
        if session.get(CheckpointRow, checkpoint_id, with_for_update=True) is None:
            raise _not_found(checkpoint_id)
        for write in writes:
            row = session.get(PendingWriteRow, (checkpoint_id, write.task_id, write.index))
            if row is not None and write.index >= 0:
                continue
            row = row or PendingWriteRow(checkpoint_id=checkpoint_id, task_id=write.task_id, idx=write.index)
            row.channel, row.value_type, row.value, row.task_path = (
                write.channel, write.value_type, write.value, write.task_path)
            session.add(row)
        session.flush()
        # length() of a blob is its size in bytes, read from the record's header without its
        # content (a put must not read every value the checkpoint holds); the names are text.
        size = _bytes_in_sqlite if db.is_sqlite else func.octet_length
        held = session.exec(select(func.coalesce(func.sum(
            func.length(PendingWriteRow.value) + size(PendingWriteRow.channel) + size(PendingWriteRow.task_id)
            + size(PendingWriteRow.value_type) + size(PendingWriteRow.task_path)), 0)).where(
            PendingWriteRow.checkpoint_id == checkpoint_id)).one()
        if held > MAX_CHECKPOINT_BYTES:
            session.rollback()
            raise ResourceExhausted(Reason.PENDING_WRITES_FULL,
                                    f"checkpoint {checkpoint_id}'s pending writes would total {held} bytes, over "
                                    f"{MAX_CHECKPOINT_BYTES}; nothing of this put was recorded",
                                    checkpoint_id=checkpoint_id, limit=MAX_CHECKPOINT_BYTES)
        session.commit()


def _bytes_in_sqlite(column):
    """A text column's size in bytes (SQLite's length() of text counts characters)."""
    return func.length(cast(column, LargeBinary))


def list_for(db: Database, checkpoint_id: str) -> list[PendingWrite]:
    checkpoint_id = validation.checkpoint_id(checkpoint_id)
    with db.session() as session:
        if session.get(CheckpointRow, checkpoint_id) is None:
            raise _not_found(checkpoint_id)
        rows = session.exec(select(PendingWriteRow).where(PendingWriteRow.checkpoint_id == checkpoint_id).order_by(
            col(PendingWriteRow.task_path), col(PendingWriteRow.task_id), col(PendingWriteRow.idx))).all()
    return [PendingWrite(r.task_id, r.idx, r.channel, r.value_type, r.value, r.task_path) for r in rows]
