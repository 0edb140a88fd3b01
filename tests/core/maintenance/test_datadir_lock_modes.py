"""Who may share a data directory and a SQLite database: servers share the data dir unless one
collects garbage or writes a disk store (then it is alone), an offline command is alone, and a
SQLite database is served by one process. Each refusal names what holds it and what to do.
Real flocks on real files (two opens of one file conflict as two processes would)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.maintenance import datadir_lock as module
from checkpointd.core.maintenance.datadir_lock import (
    LOCK_NAME,
    DataDirBusy,
    DataDirLock,
    OfflineCommand,
    ServingLock,
    held_offline,
    needs_data_dir_lock,
)
from checkpointd.core.metadata.db import Database

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        yield database
    finally:
        database.dispose()


def refusal(lock) -> str:
    with pytest.raises(DataDirBusy) as busy:
        lock.acquire()
    return str(busy.value)


def test_servers_without_gc_share_the_data_dir_and_a_collector_or_disk_writer_is_alone(tmp_path):
    first = DataDirLock.for_server(tmp_path, "db", gc_interval_seconds=0).acquire()
    second = DataDirLock.for_server(tmp_path, "db", gc_interval_seconds=0).acquire()
    assert not first.exclusive and not second.exclusive
    collector = DataDirLock.for_server(tmp_path, "db", gc_interval_seconds=0.5)
    assert collector.exclusive and not collector.disk_store_writer
    assert "garbage collection needs it alone" in refusal(collector)
    disk = DataDirLock.for_server(tmp_path, "disk", gc_interval_seconds=0)
    assert disk.exclusive and disk.disk_store_writer
    assert "takes one server at a time" in refusal(disk) and "--store db" in refusal(disk)
    first.release()
    assert "takes one server at a time" in refusal(disk), "one sharer is still there"
    second.release()
    with collector:
        assert "is locked by a garbage collection" in refusal(DataDirLock.for_server(tmp_path, "db", 0))
        assert "takes one server at a time" in refusal(disk)
    with disk:
        assert "takes one server at a time" in refusal(DataDirLock.for_server(tmp_path, "disk", 0))
        assert "garbage collection needs it alone" in refusal(collector)
        assert "is locked by a garbage collection" in refusal(DataDirLock.for_server(tmp_path, "db", 0))


def test_the_lock_file_is_private_and_released_twice_harmlessly(tmp_path):
    (tmp_path / LOCK_NAME).touch(mode=0o644)
    os.chmod(tmp_path / LOCK_NAME, 0o644)
    lock = DataDirLock(tmp_path, exclusive=True).acquire()
    assert stat.S_IMODE(os.stat(tmp_path / LOCK_NAME).st_mode) == 0o600
    lock.release()
    lock.release()
    with DataDirLock(tmp_path, exclusive=True):
        pass


def test_a_refused_lock_keeps_no_descriptor_open(tmp_path):
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with DataDirLock(tmp_path, exclusive=True):
        before = open_fds()
        for _ in range(5):
            refusal(DataDirLock(tmp_path, exclusive=False))
        assert open_fds() == before


def test_a_file_system_that_cannot_lock_is_logged_and_the_lock_still_releases(tmp_path, monkeypatch, caplog):
    real_flock = module.fcntl.flock
    calls: list[int] = []

    def no_locks(fd: int, operation: int) -> None:
        calls.append(operation)
        if operation != module.fcntl.LOCK_UN:
            raise OSError(37, "No locks available")
        real_flock(fd, operation)

    monkeypatch.setattr(module.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="checkpointd"):
        lock = DataDirLock(tmp_path, exclusive=True).acquire()
    assert "cross-process GC protection is off" in caplog.text and "No locks available" in caplog.text
    lock.release()
    assert calls[-1] == module.fcntl.LOCK_UN


def test_gc_is_fenced_by_the_data_dir_except_for_the_database_store_on_postgresql(sqlite):
    postgresql = Database(PG_URL)
    try:
        assert needs_data_dir_lock("disk", sqlite) and needs_data_dir_lock("disk", postgresql)
        assert needs_data_dir_lock("db", sqlite)
        assert not needs_data_dir_lock("db", postgresql)
    finally:
        postgresql.dispose()


def test_an_offline_command_needs_the_data_dir_and_the_sqlite_database_alone(tmp_path, sqlite):
    gc = OfflineCommand("checkpointd gc", " (or run GC inside it with --gc-interval)")
    serving = ServingLock(Path(sqlite.sqlite_path))
    with serving:
        message = refusal_of_offline(tmp_path, "db", sqlite, gc)
        assert f"the SQLite database {sqlite.sqlite_path} is served by a running checkpointd" in message
        assert "checkpointd gc needs the database alone: stop that server first (or run GC inside it" in message
        assert not (tmp_path / LOCK_NAME).exists() or refusal_free(tmp_path), "the data dir was let go"
    with DataDirLock(tmp_path, exclusive=False):
        message = refusal_of_offline(tmp_path, "db", sqlite, gc)
        assert "in use by another checkpointd process; checkpointd gc needs it alone: stop that process first " \
               "(or run GC inside it" in message
    with held_offline(tmp_path, "disk", sqlite, gc):
        assert "already served by another checkpointd; SQLite takes one server" in refusal(serving)
        assert "is locked by a garbage collection" in refusal(DataDirLock(tmp_path, exclusive=False))
    with serving, DataDirLock(tmp_path, exclusive=True):
        pass


def test_an_offline_command_on_postgresql_with_the_database_store_holds_nothing(tmp_path):
    postgresql = Database(PG_URL)
    try:
        with DataDirLock(tmp_path, exclusive=True), held_offline(tmp_path, "db", postgresql):
            pass
        with DataDirLock(tmp_path, exclusive=True):
            message = refusal_of_offline(tmp_path, "disk", postgresql, OfflineCommand())
        assert "an offline command needs it alone: stop that process first" in message
    finally:
        postgresql.dispose()


def refusal_of_offline(data_dir: Path, store: str, db: Database, command: OfflineCommand) -> str:
    with pytest.raises(DataDirBusy) as busy, held_offline(data_dir, store, db, command):
        pass
    return str(busy.value)


def refusal_free(data_dir: Path) -> bool:
    """Whether the data dir can be taken alone now."""
    with DataDirLock(data_dir, exclusive=True):
        return True


def test_a_server_given_a_symlink_to_a_served_sqlite_database_is_refused(tmp_path):
    """Two servers on one SQLite database (one through a symlink to its file) would each trust what
    it keeps in memory, and a collection in one would delete what the other's next checkpoint reuses."""
    from checkpointd.server import CheckpointdServer, ServerSettings

    for name in ("a", "b", "ws"):
        (tmp_path / name).mkdir()
    common = {"listen": ("127.0.0.1:0",), "workspace_roots": (str(tmp_path / "ws"),), "store": "db"}
    first = CheckpointdServer(ServerSettings(data_dir=tmp_path / "a", **common))
    try:
        (tmp_path / "b" / "alias.db").symlink_to(tmp_path / "a" / "checkpointd.db")
        with pytest.raises(DataDirBusy, match=r"alias\.db is already served by another checkpointd"):
            CheckpointdServer(ServerSettings(data_dir=tmp_path / "b", db_url=f"sqlite:///{tmp_path / 'b' / 'alias.db'}",
                                             **common)).stop(0)
        alias = Database(f"sqlite:///{tmp_path / 'b' / 'alias.db'}")
        with pytest.raises(DataDirBusy, match="is served by a running checkpointd; an offline command needs"), \
                held_offline(tmp_path / "b", "db", alias):
            pass
        alias.dispose()
    finally:
        first.stop(0)
