"""The in-process engine the request_id and create tests drive: a real SQLite database and
content store, no file watcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.content_store import ContentStore


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Checkpoints]:
    (tmp_path / "workspaces").mkdir()
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    store = ContentStore(tmp_path / "store")
    engine = Checkpoints(db, store, ConfigStore(db), EngineSettings(tmp_path / "data", (str(tmp_path / "workspaces"),),
                                                                    watcher=False))
    try:
        yield engine
    finally:
        engine.close()
        store.close()
        db.dispose()
