"""PutPendingWrites' documented limits (``pending_writes``): a put of exactly a limit is recorded,
one byte, write or character past it is refused with the field and the limit, and records
nothing. In process, on SQLite (``tests/core/engine/conftest.engine``); the totals on PostgreSQL
and under racing replicas are tests/postgres/test_pending_writes_total.py."""

from __future__ import annotations

import pytest
from sqlmodel import col, update
from ulid import ULID

from checkpointd.core.engine import pending_writes
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.pending_writes import PendingWrite
from checkpointd.core.engine.requests import CreateRequest
from checkpointd.core.kernel.errors import InvalidArgument, Reason, ResourceExhausted
from checkpointd.core.metadata.models import WRITE_FRAMING_BYTES, CheckpointRow

# As the API documents them (protos/checkpoint/v1/checkpoint_service.proto, errors.proto), not
# read from the module: a limit changed there must fail here.
MAX_WRITES = 1000
MAX_TOTAL_BYTES = 16 << 20
MAX_CHECKPOINT_BYTES = 32 << 20
MAX_NAME = 256
MAX_VALUE_TYPE = 64
MAX_TASK_PATH = 1024

def _checkpoint(engine: Checkpoints) -> str:
    return engine.create(CreateRequest(plan_id=str(ULID()), state=b"s")).row.checkpoint_id


def _write(index: int, size: int = 1, task: str = "t", channel: str = "c", value_type: str = "bytes",
           task_path: str = "") -> PendingWrite:
    return PendingWrite(task, index, channel, value_type, b"v" * size, task_path)


def _refused(engine: Checkpoints, checkpoint_id: str, writes: list[PendingWrite], field: str, limit: int) -> None:
    with pytest.raises(InvalidArgument) as refused:
        pending_writes.put(engine.db, checkpoint_id, writes)
    assert refused.value.reason is Reason.FIELD_TOO_LONG
    assert (refused.value.metadata["field"], int(refused.value.metadata["limit"])) == (field, limit)


def test_each_limit_of_one_put_admits_its_bound_and_refuses_one_more(engine: Checkpoints) -> None:
    checkpoint_id = _checkpoint(engine)
    _refused(engine, checkpoint_id, [_write(i) for i in range(MAX_WRITES + 1)], "writes", MAX_WRITES)
    _refused(engine, checkpoint_id, [_write(0, MAX_TOTAL_BYTES - 1), _write(1, 2)], "writes.value", MAX_TOTAL_BYTES)
    _refused(engine, checkpoint_id, [_write(0, task="t" * (MAX_NAME + 1))], "writes.task_id", MAX_NAME)
    _refused(engine, checkpoint_id, [_write(0, channel="c" * (MAX_NAME + 1))], "writes.channel", MAX_NAME)
    _refused(engine, checkpoint_id, [_write(0, value_type="v" * (MAX_VALUE_TYPE + 1))], "writes.value_type",
             MAX_VALUE_TYPE)
    _refused(engine, checkpoint_id, [_write(0, task_path="p" * (MAX_TASK_PATH + 1))], "writes.task_path",
             MAX_TASK_PATH)
    assert pending_writes.list_for(engine.db, checkpoint_id) == []

    pending_writes.put(engine.db, checkpoint_id, [_write(i, task="a") for i in range(MAX_WRITES)])
    pending_writes.put(engine.db, checkpoint_id, [_write(0, MAX_TOTAL_BYTES - 1, task="b"), _write(1, 1, task="b")])
    pending_writes.put(engine.db, checkpoint_id, [_write(0, task="n" * MAX_NAME, channel="c" * MAX_NAME,
                                                         value_type="v" * MAX_VALUE_TYPE,
                                                         task_path="p" * MAX_TASK_PATH)])
    listed = pending_writes.list_for(engine.db, checkpoint_id)
    assert len(listed) == MAX_WRITES + 2 + 1


def test_a_checkpoint_takes_writes_up_to_exactly_its_limit_and_not_a_byte_more(engine: Checkpoints) -> None:
    checkpoint_id = _checkpoint(engine)
    framing = len("t") + len("c") + len("bytes") + WRITE_FRAMING_BYTES  # what a write costs besides its value
    first = MAX_CHECKPOINT_BYTES // 2
    pending_writes.put(engine.db, checkpoint_id, [_write(0, first - framing)])
    with pytest.raises(ResourceExhausted) as refused:
        pending_writes.put(engine.db, checkpoint_id, [_write(1, MAX_CHECKPOINT_BYTES - first - framing + 1)])
    assert refused.value.reason is Reason.PENDING_WRITES_FULL
    assert f"would total {MAX_CHECKPOINT_BYTES + 1} bytes, over {MAX_CHECKPOINT_BYTES}" in str(refused.value)
    pending_writes.put(engine.db, checkpoint_id, [_write(1, MAX_CHECKPOINT_BYTES - first - framing)])
    assert [(w.index, len(w.value)) for w in pending_writes.list_for(engine.db, checkpoint_id)] == [
        (0, first - framing), (1, MAX_CHECKPOINT_BYTES - first - framing)]
    # Full: a write of nothing still costs its names and framing, and is refused.
    with pytest.raises(ResourceExhausted):
        pending_writes.put(engine.db, checkpoint_id, [_write(2, 0)])


def test_a_checkpoint_already_past_its_limit_still_takes_puts_that_do_not_grow_it(engine: Checkpoints) -> None:
    """A checkpoint can hold more than the limit counts today (its writes were put by a release
    that counted no framing; migration 0007 totals them as this one does). A retried task putting
    its writes again, or an error superseded by a smaller one, adds nothing and is taken; a put
    that adds is refused."""
    checkpoint_id = _checkpoint(engine)
    pending_writes.put(engine.db, checkpoint_id, [_write(0, 10), _write(-1, 10)])
    with engine.db.session() as session:
        session.execute(update(CheckpointRow).where(col(CheckpointRow.checkpoint_id) == checkpoint_id)
                        .values(pending_write_bytes=MAX_CHECKPOINT_BYTES + 100))
        session.commit()
    pending_writes.put(engine.db, checkpoint_id, [_write(0, 10)])  # a retry: the first value is kept
    pending_writes.put(engine.db, checkpoint_id, [_write(-1, 10)])  # the same size again
    pending_writes.put(engine.db, checkpoint_id, [_write(-1, 3)])  # smaller
    with pytest.raises(ResourceExhausted):
        pending_writes.put(engine.db, checkpoint_id, [_write(1, 1)])
    assert [(w.index, len(w.value)) for w in pending_writes.list_for(engine.db, checkpoint_id)] == [(-1, 3), (0, 10)]
