"""The database content store (--store db) on SQLite, one server: a checkpoint's commit confirms the
GC fence with the one statement SQLite runs (the GC epoch, no advisory lock) and is recorded."""

from __future__ import annotations

from pathlib import Path

from ulid import ULID

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import open_store


def test_a_checkpoint_commits_through_the_database_store_on_sqlite(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("content")
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    store = open_store("db", db, tmp_path)
    engine = Checkpoints(db, store, ConfigStore(db), EngineSettings(tmp_path / "data", (str(tmp_path / "ws"),),
                                                                    watcher=False))
    try:
        plan_id = str(ULID())
        first = engine.create(CreateRequest(plan_id=plan_id, state=b"s1", workspace_root=str(tmp_path / "ws"))).row
        second = engine.create(CreateRequest(plan_id=plan_id, state=b"s2")).row
        assert (first.sequence, second.sequence) == (1, 2)
        assert engine.get(first.checkpoint_id, with_state=True).state == b"s1"
    finally:
        engine.close()
        store.close()
        db.dispose()
