"""``stored_size``/``stored_sizes`` (what GC reports as reclaimed, and the store's usage) count each
committed object's own chunks exactly once, however many objects the store holds, and nothing for
chunks whose object row is gone (they are no object of the store)."""

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


def test_each_object_counts_its_own_chunks_once_among_many(objects):
    sizes, contents = {}, {}
    with objects.batch() as batch:
        for n, size in enumerate([MIB + 3, 2 * MIB + 1, 5000, 70_000]):
            content = os.urandom(size) + bytes([n])
            digest = batch.put_bytes(content)
            sizes[digest], contents[digest] = size + 1, content
    assert objects.stored_sizes(sizes) == sizes
    assert {digest: objects.stored_size(digest) for digest in sizes} == sizes
    assert all(objects.read_bytes(digest) == content for digest, content in contents.items())


def test_chunks_left_without_their_object_row_are_not_stored_content(objects):
    with objects.batch() as batch:
        kept = batch.put_bytes(os.urandom(3000))
        orphaned = batch.put_bytes(os.urandom(4000))
    with objects.db.engine.begin() as connection:
        connection.execute(text("DELETE FROM objects WHERE digest = :d"), {"d": orphaned})
    assert objects.stored_size(orphaned) is None
    assert objects.stored_sizes([kept, orphaned]) == {kept: 3000}
