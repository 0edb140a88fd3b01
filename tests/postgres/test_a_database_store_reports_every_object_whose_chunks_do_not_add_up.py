"""``DatabaseStore.damage`` (what fsck reports of the database store): every object whose row counts
more or fewer chunks than the database holds, none of them at all included, and no healthy object."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import text

from checkpointd.core.store.db_store import DatabaseStore

MIB = 1 << 20


def test_objects_missing_or_with_extra_chunks_are_reported_and_healthy_ones_are_not(database, tmp_path: Path):
    objects = DatabaseStore(database, tmp_path / "staging")
    try:
        with objects.batch() as batch:
            healthy_small = batch.put_bytes(b"healthy")
            healthy_large = batch.put_bytes(os.urandom(2 * MIB + 1))
            lost_one = batch.put_bytes(os.urandom(2 * MIB + 2))
            lost_all = batch.put_bytes(os.urandom(MIB + 3))
            lost_only = batch.put_bytes(b"its only chunk goes")
            extra = batch.put_bytes(b"one chunk too many")
        assert objects.damage() == []
        with database.engine.begin() as connection:
            connection.execute(text("DELETE FROM object_chunks WHERE digest = :d AND seq = 1"), {"d": lost_one})
            for digest in (lost_all, lost_only):
                connection.execute(text("DELETE FROM object_chunks WHERE digest = :d"), {"d": digest})
            connection.execute(text("INSERT INTO object_chunks (digest, seq, data) VALUES (:d, 1, :data)"),
                               {"d": extra, "data": b"stray"})
        assert sorted(objects.damage()) == sorted([(lost_one, "has 2 of its 3 chunks"),
                                                   (lost_all, "has 0 of its 2 chunks"),
                                                   (lost_only, "has 0 of its 1 chunks"),
                                                   (extra, "has 2 of its 1 chunks")])
        assert {healthy_small, healthy_large}.isdisjoint(subject for subject, _ in objects.damage())
    finally:
        objects.close()
