"""The SQLite metadata database (checkpoints' labels, plan states' digests, rollback journals) and
its log are readable by the server's user alone under any umask: the file is made private before
SQLite creates it, and SQLite gives its log and shared memory the database's mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from checkpointd.core.metadata.db import Database


@pytest.fixture
def open_umask():
    previous = os.umask(0o002)
    yield
    os.umask(previous)


def test_a_new_database_and_its_log_are_private_whatever_the_umask(tmp_path: Path, open_umask) -> None:
    path = tmp_path / "meta.db"
    database = Database(f"sqlite:///{path}")
    try:
        assert database.sqlite_path == str(path)
        database.migrate()
        with database.engine.connect() as connection:  # read: its log and shared memory exist
            connection.execute(text("SELECT count(*) FROM plans"))
            files = sorted(p.name for p in tmp_path.iterdir())
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    finally:
        database.dispose()
    assert files == ["meta.db", "meta.db-shm", "meta.db-wal"]
    assert modes == dict.fromkeys(files, 0o600)
