"""A checkpoint's pending writes stay within MAX_CHECKPOINT_BYTES however many puts race: on
PostgreSQL two replicas' puts take turns on the checkpoint's row, so none of them counts the total
without the others' writes (each would pass alone, together they would not)."""

from __future__ import annotations

import threading
from pathlib import Path

from ulid import ULID

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine import pending_writes
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.pending_writes import MAX_CHECKPOINT_BYTES, PendingWrite
from checkpointd.core.engine.requests import CreateRequest, EngineSettings
from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.content_store import ContentStore

VALUE = 8 << 20  # four of them with their names are just over the limit


def test_racing_puts_never_take_a_checkpoint_past_its_limit(any_db_url: str, tmp_path: Path) -> None:
    db = Database(any_db_url)
    db.migrate()
    store = ContentStore(tmp_path / "store")
    engine = Checkpoints(db, store, ConfigStore(db), EngineSettings(tmp_path / "data", (str(tmp_path),),
                                                                    watcher=False))
    replicas = [db] if db.is_sqlite else [db, Database(any_db_url)]
    try:
        checkpoint_id = engine.create(CreateRequest(plan_id=str(ULID()), state=b"s")).row.checkpoint_id
        start = threading.Barrier(6)
        accepted: list[int] = []
        refused: list[ResourceExhausted] = []

        def put(task: int) -> None:
            start.wait()
            try:
                pending_writes.put(replicas[task % len(replicas)], checkpoint_id,
                                   [PendingWrite(f"task-{task}", 0, "c", "bytes", bytes([task]) * VALUE, "")])
                accepted.append(task)
            except ResourceExhausted as exc:
                refused.append(exc)

        threads = [threading.Thread(target=put, args=(task,)) for task in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(accepted) == MAX_CHECKPOINT_BYTES // VALUE - 1, (accepted, refused)
        assert len(refused) == 6 - len(accepted) and all(e.reason is Reason.PENDING_WRITES_FULL for e in refused)
        listed = pending_writes.list_for(db, checkpoint_id)
        assert sorted(w.task_id for w in listed) == sorted(f"task-{t}" for t in accepted)
    finally:
        engine.close()
        store.close()
        for replica in replicas:
            replica.dispose()
