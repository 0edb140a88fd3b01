"""Opening a store settles every delta's chain of bases (``PackReplay``). An object with
several records (two batches wrote it at once) falls back on an earlier record when its latest
is a delta that does not resolve; a chain from that earlier record may lead back to the object
itself. The store must still open, keep every object some record of it makes readable, and drop
only what no record can reproduce."""

from __future__ import annotations

import hashlib
import random

from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.packs import DELTAS, PACK_HEADER, ZSTD_DELTA
from checkpointd.core.workspace.readworker import RECORD


def _fake_delta_record(digest: str, base: str) -> bytes:
    """A delta record as a pack holds it (header only is read on open: it is never decoded)."""
    body = bytes.fromhex(base) + bytes([1]) + b"a zstd stream"
    return RECORD.pack(bytes.fromhex(digest), ZSTD_DELTA, len(body)) + body


def _append_durable(pack, records: bytes) -> None:
    """Appends ``records`` to ``pack`` and moves its durable hint to the new end (as a sync would)."""
    with open(pack, "r+b") as f:
        magic, _hint = PACK_HEADER.unpack(f.read(PACK_HEADER.size))
        f.seek(0, 2)
        f.write(records)
        end = f.tell()
        f.seek(0)
        f.write(PACK_HEADER.pack(magic, end))


def test_an_object_falls_back_past_a_record_whose_chain_leads_back_to_it(tmp_path):
    rng = random.Random(7)
    first = bytes(rng.randrange(256) for _ in range(3000))
    second = first[:2000] + b"changed" + first[2007:]
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        first_digest = batch.put_bytes(first)
    with store.batch() as batch:
        second_digest = batch.put_bytes(second, first_digest, first)
    assert store._committed[second_digest].kind in DELTAS, "the test needs second stored as a delta of first"
    store.close()
    missing = hashlib.sha256(b"never stored").hexdigest()
    # Two later records of `first`: a delta against `second` (a chain back to `first`), then one
    # against an object that is not stored.
    (pack,) = sorted((tmp_path / "packs").glob("pack-*.pack"))
    _append_durable(pack, _fake_delta_record(first_digest, second_digest) + _fake_delta_record(first_digest, missing))

    reopened = ContentStore(tmp_path)
    try:
        # `first` falls back past both deltas to its whole record; `second` reads through it.
        assert sorted(reopened.iter_digests()) == sorted([first_digest, second_digest])
        assert reopened.read_bytes(first_digest) == first
        assert reopened.read_bytes(second_digest) == second
        assert reopened.damage() == []
    finally:
        reopened.close()
