"""Packs are replayed in the order they were written, by number, also once the numbers outgrow
the six digits of their names (every compaction starts a pack): a deletion recorded in
pack-1000000 ends the record in pack-999999, and a reopened store must not index it again."""

from __future__ import annotations

import os
from pathlib import Path

from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import ContentStore


def _put(store: ContentStore, data: bytes) -> str:
    with store.batch() as batch:
        return batch.put_bytes(data)


def test_a_deletion_in_a_seven_digit_pack_ends_a_record_in_a_six_digit_one(tmp_path: Path, monkeypatch) -> None:
    store = ContentStore(tmp_path)
    deleted = _put(store, os.urandom(1000))
    old = _put(store, os.urandom(5000))  # keeps the pack from being compacted when the other goes
    store.close()
    packs = tmp_path / "packs"
    (packs / "pack-000001.pack").rename(packs / "pack-999999.pack")

    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 1)  # every append after a record starts a pack
    store = ContentStore(tmp_path)
    kept = _put(store, os.urandom(3000))
    with store.collecting():
        store.delete(deleted)
    store.close()
    assert (packs / "pack-999999.pack").exists() and (packs / "pack-1000000.pack").exists()

    reopened = ContentStore(tmp_path)
    try:
        assert not reopened.has(deleted), "the deleted object came back"
        assert reopened.has(old) and reopened.has(kept)
        assert (packs / "pack-999999.pack").exists()
    finally:
        reopened.close()
