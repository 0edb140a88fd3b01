"""Records a process appended to a pack and never synced (a batch aborted: a live diff's look, a
capture whose caller gave up; or a crash before the sync) are read back from the page cache on
the next open and indexed as stored, so a later batch may reference them without writing them
again: the open makes them durable first, then moves the pack's durable hint over them."""

from __future__ import annotations

import os
from pathlib import Path

from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.packs import PACK_HEADER


def _hint(pack: Path) -> int:
    with open(pack, "rb") as f:
        return PACK_HEADER.unpack(f.read(PACK_HEADER.size))[1]


def test_records_left_past_the_durable_hint_are_synced_on_open_before_they_count_as_stored(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(b"committed and synced\n" * 10)
    batch = store.batch()
    left = batch.put_bytes(b"appended by a batch that was then dropped\n" * 10)
    batch.abort()
    assert not store.has(left)
    store.close()
    [pack] = sorted((tmp_path / "packs").glob("pack-*.pack"))
    assert _hint(pack) < pack.stat().st_size, "the dropped batch's record lies past the hint"

    synced: list[int] = []
    real_fdatasync, real_pwrite = os.fdatasync, os.pwrite
    order: list[str] = []

    def fdatasync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(pack):
            synced.append(os.fstat(fd).st_size)
            order.append("sync")
        real_fdatasync(fd)

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if offset == 8 and os.readlink(f"/proc/self/fd/{fd}") == str(pack):
            order.append("hint")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "pwrite", pwrite)
    reopened = ContentStore(tmp_path)
    monkeypatch.undo()
    assert reopened.has(left), "an intact record is indexed again"
    assert synced == [pack.stat().st_size], "the pack is synced over it before the store is used"
    assert order == ["sync", "hint"], "the hint moves only once the disk holds what it covers"
    assert _hint(pack) == pack.stat().st_size
    with reopened.batch() as batch:
        assert batch.put_bytes(b"appended by a batch that was then dropped\n" * 10) == left
    reopened.close()
