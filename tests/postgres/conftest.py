"""Fixtures for the scale-out tests: throwaway PostgreSQL databases, replica servers sharing one, and
the checkpoint engine in process on either database."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from sqlmodel import func, select
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2_grpc
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings
from checkpointd.core.maintenance.fsck import FindingKind, check
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PendingWriteRow, stored_bytes
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import DatabaseStore
from tests.conftest import PostgresDatabases, RunningServer
from tests.postgres.replica_pair import Replica


@pytest.fixture
def pg_url(postgres: PostgresDatabases) -> Iterator[str]:
    """A fresh, empty PostgreSQL database of this test's own (dropped afterwards)."""
    url = postgres.create()
    yield url
    postgres.drop(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each engine: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return request.getfixturevalue("pg_url")


class Replicas:
    """Several `checkpointd serve` processes on one database, each with a data dir of its own,
    all accepting workspaces under one shared root (as pods mounting the same workspace)."""

    def __init__(self, base: Path, db_url: str) -> None:
        self.base = base
        self.db_url = db_url
        self.shared_root = base / "shared"
        self.shared_root.mkdir()
        self.servers: list[RunningServer] = []
        self._channels: list[grpc.Channel] = []

    def start(self, count: int, *extra: str) -> list[RunningServer]:
        started = []
        for _ in range(count):
            base = Path(tempfile.mkdtemp(prefix="r-", dir=self.base))
            server = RunningServer(base, db_url=self.db_url,
                                   extra_args=("--store", "db", "--workspace-root", str(self.shared_root), *extra))
            self.servers.append(server)
            started.append(server)
        return started

    def stub(self, server: RunningServer) -> checkpoint_service_pb2_grpc.CheckpointServiceStub:
        channel = grpc.insecure_channel(server.tcp_target)
        self._channels.append(channel)
        return checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)

    def workspace(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="ws-", dir=self.shared_root))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        for server in self.servers:
            server.stop()


@pytest.fixture
def replicas(short_tmp: Path, pg_url: str) -> Iterator[Replicas]:
    group = Replicas(Path(tempfile.mkdtemp(prefix="g-", dir=short_tmp)), pg_url)
    yield group
    group.close()


@pytest.fixture
def two_replicas(replicas: Replicas) -> tuple[Callable, Callable, Replicas]:
    """Two running replicas (--store db, no shared data dir); returns their stubs and the group."""
    first, second = replicas.start(2)
    first.start()
    second.start()
    return replicas.stub(first), replicas.stub(second), replicas


@pytest.fixture
def pair(pg_url: str, tmp_path: Path) -> Iterator[tuple[Replica, Replica, Path]]:
    """Two in-process replicas on one fresh PostgreSQL database, and the directory of their workspaces."""
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    first = Replica(tmp_path, pg_url, workspaces, "a")
    second = Replica(tmp_path, pg_url, workspaces, "b")
    try:
        yield first, second, workspaces
    finally:
        first.close()
        second.close()


@pytest.fixture
def admin(pg_url: str) -> Iterator:
    """A connection pool outside the replicas, to end their sessions (``replica_pair.end_session``)."""
    engine = create_engine(pg_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    yield engine
    engine.dispose()


@dataclass
class Engine:
    db: Database
    store: ContentStore
    checkpoints: Checkpoints

    def checkpoint(self) -> str:
        return self.checkpoints.create(CreateRequest(plan_id=str(ULID()), state=b"s")).row.checkpoint_id

    def total(self, checkpoint_id: str) -> tuple[int, int]:
        """The total recorded on the row, and what the rows hold."""
        with self.db.session() as session:
            recorded = session.get(CheckpointRow, checkpoint_id).pending_write_bytes
            stored = session.exec(select(func.coalesce(func.sum(stored_bytes(self.db.is_sqlite)), 0)).where(
                PendingWriteRow.checkpoint_id == checkpoint_id)).one()
        return recorded, stored

    def findings(self) -> list[tuple[FindingKind, str, str]]:
        return [(p.kind, p.subject, p.detail) for p in check(self.db, self.store).problems]


@pytest.fixture
def engine(any_db_url: str, tmp_path: Path) -> Iterator[Engine]:
    db = Database(any_db_url)
    db.migrate()
    store = ContentStore(tmp_path / "store")
    checkpoints = Checkpoints(db, store, ConfigStore(db), EngineSettings(tmp_path / "data", (str(tmp_path),),
                                                                         watcher=False))
    try:
        yield Engine(db, store, checkpoints)
    finally:
        checkpoints.close()
        store.close()
        db.dispose()


@pytest.fixture
def database(any_db_url: str) -> Iterator[Database]:
    """A migrated metadata database on SQLite and on PostgreSQL (``any_db_url``)."""
    database = Database(any_db_url)
    database.migrate()
    yield database
    database.dispose()


@pytest.fixture
def objects(database: Database, tmp_path: Path) -> Iterator[DatabaseStore]:
    """The database content store (``--store db``) on ``database``, closed after the test."""
    store = DatabaseStore(database, tmp_path / "staging")
    yield store
    store.close()
