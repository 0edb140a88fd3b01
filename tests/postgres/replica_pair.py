"""Two replicas of ``checkpointd serve --store db`` in one process, on one PostgreSQL database,
and the tools to end one of their database sessions: for tests that attack what replicas do when
the database drops a session holding one of their locks (the fixtures ``pair`` and ``admin`` are
in this package's conftest)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text
from ulid import ULID

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings
from checkpointd.core.maintenance.retention import Maintenance
from checkpointd.core.metadata.db import Database, lock_key
from checkpointd.core.store.db_store import DatabaseStore


class Replica:
    """One replica of ``checkpointd serve --store db`` in this process: its own database
    connections (and so its own advisory-lock sessions), content store and data dir."""

    def __init__(self, root: Path, url: str, workspaces: Path, name: str) -> None:
        self.db = Database(url)
        self.db.migrate()
        self.store = DatabaseStore(self.db, root / name / "db-store-staging")
        self.config = ConfigStore(self.db)
        self.checkpoints = Checkpoints(self.db, self.store, self.config,
                                       EngineSettings(root / name / "data", (str(workspaces),), watcher=False))
        self.maintenance = Maintenance(self.db, self.store, self.checkpoints.trees, self.config,
                                       self.checkpoints.delete)

    def create(self, plan_id: str, workspace: Path | None = None, state: bytes = b"", **fields):
        return self.checkpoints.create(CreateRequest(plan_id=plan_id, state=state,
                                                     workspace_root=str(workspace or ""), **fields)).row

    def close(self) -> None:
        self.checkpoints.close()
        self.store.close()
        self.db.dispose()


def workspace_in(workspaces: Path) -> Path:
    path = workspaces / str(ULID())
    path.mkdir()
    return path


def _key_parts(name: str) -> tuple[int, int]:
    """pg_locks shows a bigint advisory key as (classid, objid): its high and low 32 bits."""
    unsigned = lock_key(name) & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def holders(admin, name: str) -> set[int]:
    """The backend pids holding the advisory lock ``name`` (shared or exclusive)."""
    classid, objid = _key_parts(name)
    with admin.connect() as connection:
        return set(connection.execute(text(
            "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = :c "
            "AND objid = :o AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
            {"c": classid, "o": objid}).scalars().all())


def end_session(admin, pid: int) -> None:
    """Ends one PostgreSQL session, as a restarted pooler or proxy, an administrator or
    ``idle_session_timeout`` ends an idle connection, and waits until it is gone."""
    with admin.connect() as connection:
        assert connection.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid}).scalar()


def fence_pid(replica: Replica) -> int:
    """The backend of the session in which ``replica`` holds the content store's GC fence."""
    connection = replica.store._replica_fence._connection
    assert connection is not None, "the replica does not hold the GC fence"
    return connection.driver_connection.info.backend_pid


def stored_garbage(first: Replica, second: Replica, workspaces: Path) -> tuple[Path, bytes]:
    """A workspace holding ``shared.txt`` whose content (and a state) is stored but referenced by no
    checkpoint (its checkpoint, recorded through ``first``, was deleted through ``second``): what a
    collection deletes, and what a new checkpoint of that workspace reuses instead of storing."""
    workspace = workspace_in(workspaces)
    shared = b"file content both checkpoints share " * 40
    (workspace / "shared.txt").write_bytes(shared)
    doomed = first.create(str(ULID()), workspace, state=b"old state")
    second.checkpoints.delete(doomed.checkpoint_id)
    return workspace, shared
