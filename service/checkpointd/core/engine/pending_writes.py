"""Pending writes: what tasks wrote after a checkpoint, kept with it until a later checkpoint
holds them (PutPendingWrites / ListPendingWrites; LangGraph's ``put_writes``).

A write is keyed by (checkpoint, task, index). A repeated put keeps the first value of a regular
write (index >= 0: a retried task must not change what the first attempt recorded) and replaces a
special one (negative index: an error or interrupt is superseded by the next). The rows go with
their checkpoint through the foreign key's ON DELETE CASCADE, whatever deletes it.

A checkpoint's writes are bounded (MAX_CHECKPOINT_BYTES) by the total each put leaves on the
checkpoint's row (``pending_write_bytes``), read and updated under the row's lock: a put costs the
same however many writes the checkpoint already holds (summing them made a fan-out of n puts cost
O(n^2)). ``checkpointd fsck`` checks the total against the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import InvalidArgument, NotFound, Reason, ResourceExhausted
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import WRITE_FRAMING_BYTES, CheckpointRow, PendingWriteRow, stored_bytes

MAX_WRITES = 1000
MAX_TOTAL_BYTES = 16 * 1024 * 1024
#: All of one checkpoint's pending writes (values, names and their framing, see ``_size``):
#: ListPendingWrites answers them in one message, which must stay within the server's 64 MiB, so a
#: put past this is refused.
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
    """Records the writes in one transaction; one that failed on a key inserted meanwhile (only a
    replica of a release before 0007, which takes no turn, can do that) is retried once: the
    second attempt sees the first's rows."""
    checkpoint_id = validation.checkpoint_id(checkpoint_id)
    chosen = _last_word(_validated(writes))
    for attempt in range(2):
        try:
            _put_once(db, checkpoint_id, chosen)
            return
        except IntegrityError:
            if attempt:
                raise _not_found(checkpoint_id) from None


def _last_word(writes: list[PendingWrite]) -> dict[tuple[str, int], PendingWrite]:
    """What a put asks of each key: a regular write's first value, a special one's last."""
    chosen: dict[tuple[str, int], PendingWrite] = {}
    for write in writes:
        key = (write.task_id, write.index)
        if write.index < 0 or key not in chosen:
            chosen[key] = write
    return chosen


def _put_once(db: Database, checkpoint_id: str, chosen: dict[tuple[str, int], PendingWrite]) -> None:
    with db.session() as session:
        # First, and in the order a deletion takes them (the checkpoint, then its writes through
        # the cascade): the row's lock on PostgreSQL, the write lock on SQLite (an UPDATE begins
        # the transaction; a read would not). Concurrent puts to one checkpoint take turns from
        # here, each reading the total the one before left.
        held = session.execute(
            update(CheckpointRow).where(col(CheckpointRow.checkpoint_id) == checkpoint_id)
            .values(pending_write_bytes=col(CheckpointRow.pending_write_bytes))
            .returning(col(CheckpointRow.pending_write_bytes))
            .execution_options(synchronize_session=False)).scalar_one_or_none()
        if held is None:
            raise _not_found(checkpoint_id)
        stored = {(task_id, index): size for task_id, index, size in session.execute(
            select(PendingWriteRow.task_id, PendingWriteRow.idx, stored_bytes(db.is_sqlite)).where(
                PendingWriteRow.checkpoint_id == checkpoint_id,
                col(PendingWriteRow.task_id).in_({task_id for task_id, _ in chosen})))}
        added: list[PendingWrite] = []
        replaced: list[PendingWrite] = []
        grown = 0
        for key, write in chosen.items():
            if key not in stored:
                added.append(write)
                grown += _size(write)
            elif write.index < 0:
                replaced.append(write)
                grown += _size(write) - stored[key]
        if grown > 0 and held + grown > MAX_CHECKPOINT_BYTES:
            raise ResourceExhausted(Reason.PENDING_WRITES_FULL,
                                    f"checkpoint {checkpoint_id}'s pending writes would total {held + grown} bytes, "
                                    f"over {MAX_CHECKPOINT_BYTES}; nothing of this put was recorded",
                                    checkpoint_id=checkpoint_id, limit=MAX_CHECKPOINT_BYTES)
        if added:
            session.execute(insert(PendingWriteRow), [
                {"checkpoint_id": checkpoint_id, "task_id": w.task_id, "idx": w.index, "channel": w.channel,
                 "value_type": w.value_type, "value": w.value, "task_path": w.task_path} for w in added])
        for write in replaced:
            session.execute(
                update(PendingWriteRow).where(col(PendingWriteRow.checkpoint_id) == checkpoint_id,
                                              col(PendingWriteRow.task_id) == write.task_id,
                                              col(PendingWriteRow.idx) == write.index)
                .values(channel=write.channel, value_type=write.value_type, value=write.value,
                        task_path=write.task_path)
                .execution_options(synchronize_session=False))
        if grown:
            session.execute(update(CheckpointRow).where(col(CheckpointRow.checkpoint_id) == checkpoint_id)
                            .values(pending_write_bytes=held + grown).execution_options(synchronize_session=False))
        session.commit()


def _size(write: PendingWrite) -> int:
    """A write's bytes as ``stored_bytes`` counts them once it is stored."""
    return len(write.value) + sum(len(text.encode()) for text in (write.channel, write.task_id, write.value_type,
                                                                   write.task_path)) + WRITE_FRAMING_BYTES


def list_for(db: Database, checkpoint_id: str) -> list[PendingWrite]:
    checkpoint_id = validation.checkpoint_id(checkpoint_id)
    with db.session() as session:
        if session.get(CheckpointRow, checkpoint_id) is None:
            raise _not_found(checkpoint_id)
        rows = session.exec(select(PendingWriteRow).where(PendingWriteRow.checkpoint_id == checkpoint_id).order_by(
            col(PendingWriteRow.task_path), col(PendingWriteRow.task_id), col(PendingWriteRow.idx))).all()
    return [PendingWrite(r.task_id, r.idx, r.channel, r.value_type, r.value, r.task_path) for r in rows]
