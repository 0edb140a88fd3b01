"""A workspace file read through ``put_fd`` is stored as ``put_bytes`` stores the same content: a small
one compressed in one chunk (what a capture's many small files cost the database), a large one
streamed raw in 1 MiB chunks; each reads back exactly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import DatabaseStore

MIB = 1 << 20


@pytest.fixture
def objects(any_db_url: str, tmp_path: Path) -> Iterator[DatabaseStore]:
    database = Database(any_db_url)
    database.migrate()
    store = DatabaseStore(database, tmp_path / "staging")
    yield store
    store.close()
    database.dispose()


def stored_as(store: DatabaseStore, digest: str) -> tuple[str, int, int]:
    """(encoding, chunk count, stored bytes) of a committed object."""
    with store.db.engine.connect() as connection:
        encoding, chunks = connection.execute(text("SELECT encoding, chunk_count FROM objects WHERE digest = :d"),
                                              {"d": digest}).one()
    return encoding, chunks, store.stored_size(digest)


@pytest.mark.parametrize("size", [100_000, MIB, 3 * MIB + 5], ids=["small", "one-chunk", "large"])
def test_a_file_read_through_put_fd_is_stored_as_its_bytes_would_be(objects, tmp_path, size):
    content = (b"a line of a workspace file that compresses well\n" * (size // 48 + 1))[:size]
    source = tmp_path / "file.txt"
    source.write_bytes(content)
    with objects.batch() as batch:
        fd = os.open(source, os.O_RDONLY)
        try:
            digest, read = batch.put_fd(fd, size)
        finally:
            os.close(fd)
    assert read == size
    encoding, chunks, stored = stored_as(objects, digest)
    if size <= MIB:
        assert (encoding, chunks) == ("Z", 1) and stored < size // 10, "a small file was stored uncompressed"
    else:
        assert (encoding, chunks, stored) == ("R", 4, size)
    assert objects.read_bytes(digest) == content
