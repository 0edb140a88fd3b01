"""What the engine keeps per plan stays bounded for a server that sees plans without end:
per-plan locks go with their last user, remembered plans beyond a limit are forgotten and
read again when next used."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest
from sqlalchemy import event
from ulid import ULID

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine import plan_registry as plans_module
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import open_store


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Checkpoints, list[str]]]:
    """The engine on a SQLite file, and the SQL statements it runs from now on."""
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    store = open_store("disk", db, tmp_path)
    engine = Checkpoints(db, store, ConfigStore(db), EngineSettings(tmp_path, (str(tmp_path),), watcher=False))
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    try:
        yield engine, statements
    finally:
        engine.close()
        store.close()
        db.dispose()


def plan_reads(statements: list[str]) -> int:
    return sum(1 for sql in statements if sql.lstrip().upper().startswith("SELECT") and "FROM plans" in sql)


def test_plans_beyond_the_limit_are_forgotten_oldest_first_and_read_again(engine, monkeypatch):
    checkpoints, statements = engine
    monkeypatch.setattr(plans_module, "MAX_REMEMBERED_PLANS", 3)
    plans = [str(ULID()) for _ in range(4)]
    for plan_id in plans:
        checkpoints.create(CreateRequest(plan_id=plan_id, state=b"first"))

    statements.clear()
    assert checkpoints.create(CreateRequest(plan_id=plans[-1], state=b"again")).row.sequence == 2
    assert plan_reads(statements) == 0, "the newest plan is still remembered"
    assert checkpoints.create(CreateRequest(plan_id=plans[0], state=b"again")).row.sequence == 2
    assert plan_reads(statements) == 1, "the oldest plan was forgotten and is read again"


def test_a_plan_lock_is_dropped_with_its_last_user_and_still_serializes(engine):
    checkpoints, _ = engine
    plan_id = str(ULID())
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with checkpoints.registry.lock(plan_id):
            inside.set()
            release.wait(10)

    with futures.ThreadPoolExecutor(2) as pool:
        holder = pool.submit(hold)
        assert inside.wait(10)
        waiter = pool.submit(checkpoints.create, CreateRequest(plan_id=plan_id, state=b"s"))
        with pytest.raises(futures.TimeoutError):
            waiter.result(timeout=0.3)
        assert set(checkpoints.plan_locks._entries) == {plan_id}
        release.set()
        holder.result(10)
        assert waiter.result(10).row.sequence == 1
    for _ in range(3):
        checkpoints.create(CreateRequest(plan_id=str(ULID()), state=b"s"))
    assert checkpoints.plan_locks._entries == {}
