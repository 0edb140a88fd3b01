"""Attacks on the pending writes' running total (helper-54, 4 December), on SQLite and PostgreSQL:
puts racing deletions from two replicas, and the limit keeping a ListPendingWrites answer within one
message however small the writes."""

from __future__ import annotations

import random
import threading

from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.core.engine import pending_writes
from checkpointd.core.engine.pending_writes import PendingWrite
from checkpointd.core.engine.requests import CreateRequest
from checkpointd.core.kernel.errors import NotFound, ResourceExhausted
from checkpointd.core.metadata.db import Database
from checkpointd.server import MAX_SEND_BYTES
from tests.postgres.conftest import Engine
from tests.postgres.test_pending_writes_total import _write


def test_puts_racing_deletions_of_their_checkpoints_neither_deadlock_nor_drift(
        engine: Engine, any_db_url: str) -> None:
    """Held: puts from two replicas to 20 checkpoints while DeleteCheckpoint and DeleteCheckpoints
    take them: every put lands or finds its checkpoint gone (no deadlock, no IntegrityError), and
    what is left has exact totals."""
    plan = str(ULID())
    ids = [engine.checkpoints.create(CreateRequest(plan_id=plan, state=b"s")).row.checkpoint_id for _ in range(20)]
    keep = engine.checkpoints.create(CreateRequest(plan_id=str(ULID()), state=b"s")).row.checkpoint_id
    other = Database(any_db_url)
    failures: list[BaseException] = []
    start = threading.Barrier(5)

    def putter(worker: int) -> None:
        start.wait()
        chosen = random.Random(worker)
        for step in range(150):
            checkpoint_id = chosen.choice([*ids, keep])
            try:
                pending_writes.put((engine.db, other)[worker % 2], checkpoint_id,
                                   [_write(f"t{worker}", step, 10), _write("s", -1, worker * 3 + step % 5)])
            except NotFound:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
                return

    def deleter() -> None:
        start.wait()
        try:
            for checkpoint_id in ids[::3]:
                engine.checkpoints.delete(checkpoint_id)
            engine.checkpoints.delete_matching(plan, "")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=putter, args=(w,)) for w in range(4)] + [threading.Thread(target=deleter)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        other.dispose()
    assert failures == []
    recorded, stored = engine.total(keep)
    assert recorded == stored > 0
    assert engine.findings() == []


def test_writes_within_the_cap_fit_in_one_list_answer(engine: Engine, monkeypatch) -> None:
    assert MAX_SEND_BYTES == 2 * pending_writes.MAX_CHECKPOINT_BYTES  # the ratio the cap relies on
    cap = 30_000
    monkeypatch.setattr(pending_writes, "MAX_CHECKPOINT_BYTES", cap)
    checkpoint_id = engine.checkpoint()
    index = 0
    try:
        while True:
            pending_writes.put(engine.db, checkpoint_id,
                               [PendingWrite("t", index + n, "c", "", b"v", "") for n in range(1000)])
            index += 1000
    except ResourceExhausted:
        pass
    for n in range(index, index + 1000):  # up to the cap
        try:
            pending_writes.put(engine.db, checkpoint_id, [PendingWrite("t", n, "c", "", b"v", "")])
        except ResourceExhausted:
            break
    writes = pending_writes.list_for(engine.db, checkpoint_id)
    answer = pb.ListPendingWritesResponse(writes=[
        pb.PendingWrite(task_id=w.task_id, index=w.index, channel=w.channel, value_type=w.value_type,
                        value=w.value, task_path=w.task_path) for w in writes])
    assert answer.ByteSize() <= 2 * cap, f"{len(writes)} writes, {answer.ByteSize()} bytes in one answer"
