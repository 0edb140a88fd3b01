"""The content store's contract, checked against a model rather than mutant by mutant: whatever
sequence of writes (packed whole, as deltas, from a file descriptor, as a reader process's
records), aborted and crashed batches, deletions, compactions, torn tails and reopens it sees,

- every committed object is stored and reads back exactly, before and after a reopen;
- an object that was never committed is not counted as stored while the store is open (after a
  crash, a record that reads back right may be indexed), and a deleted one stays deleted;
- an object up to the packed size limit is packed, taking at most its length and a record header;
- every byte of every pack is accounted for: its header, the live records, the dead ones
  (``compact_all`` reclaims exactly those) and the tombstones;
- nothing is reported as damage.

Packs are shrunk so that a few objects fill one: rotations, compactions on delete and carried
tombstones happen within a few steps."""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.packs import DELETED, PACK_HEADER
from checkpointd.core.workspace.readworker import RECORD, pack_body

#: A pack holds about three text objects.
ROTATE_BYTES = 4096


def _text(file: int, version: int) -> bytes:
    """Version ``version`` of a text file: each version edits one more line (a delta of the one
    before is far smaller than the whole)."""
    rng = random.Random(file)
    lines = [b"%d: %x\n" % (i, rng.getrandbits(64)) for i in range(120)]
    for v in range(version):
        lines[(v * 7 + file) % len(lines)] = b"edit %d of file %d\n" % (v, file)
    return b"".join(lines)


def _random(seed: int, size: int) -> bytes:
    return random.Random(seed * 1000 + size).randbytes(size)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: What is written: a version of a text file (the previous version named as ``similar``), or
#: random bytes, stored raw (the shortest below the size worth compressing).
CONTENT = st.one_of(
    st.tuples(st.just("text"), st.integers(0, 3), st.integers(0, 5)),
    st.tuples(st.just("random"), st.integers(0, 4), st.sampled_from([1, 63, 64, 700])),
)
#: How it is written: put_bytes, put_bytes naming the previous version, put_fd (sized right, or
#: sized short as for a file that grew), or put_records (a reader process's whole record).
HOW = st.sampled_from(["bytes", "similar", "fd", "fd-grown", "records"])
WRITES = st.lists(st.tuples(CONTENT, HOW), min_size=1, max_size=4)
STEP = st.one_of(
    st.tuples(st.just("commit"), WRITES),
    st.tuples(st.just("abort"), WRITES),
    st.tuples(st.just("crash"), WRITES),
    st.tuples(st.just("race"), CONTENT),
    st.tuples(st.just("delete"), st.integers(0, 40)),
    st.tuples(st.just("delete-unknown"), CONTENT),
    st.tuples(st.just("compact"), st.none()),
    st.tuples(st.just("reopen"), st.none()),
    st.tuples(st.just("torn"), st.tuples(CONTENT, st.floats(0.01, 0.99))),
)


def _data(content) -> tuple[bytes, str]:
    """(content, the digest of its previous version: "" if there is none)."""
    if content[0] == "text":
        _, file, version = content
        return _text(file, version), _digest(_text(file, version - 1)) if version else ""
    _, seed, size = content
    return _random(seed, size), ""


@dataclass
class Model:
    """What the store must hold: committed objects, and objects written but never committed
    (which a reopen after a crash may find and index, since their records read back right)."""

    committed: dict[str, bytes] = field(default_factory=dict)
    uncommitted: dict[str, bytes] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)


def _write(batch, content, how: str, scratch: Path) -> tuple[str, bytes]:
    data, previous = _data(content)
    digest = _digest(data)
    if how == "bytes":
        assert batch.put_bytes(data) == digest
    elif how == "similar":
        assert batch.put_bytes(data, previous) == digest
    elif how.startswith("fd"):
        path = scratch / "source"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            expected = len(data) // 2 if how == "fd-grown" else len(data)
            assert batch.put_fd(fd, expected, previous) == (digest, len(data))
        finally:
            os.close(fd)
    else:
        kind, body = pack_body(data)
        batch.put_records([(digest, RECORD.pack(bytes.fromhex(digest), kind, len(body)) + body)])
    assert batch.reuse(digest)
    return digest, data


def _tombstone_bytes(path: Path) -> int:
    """Bytes of the deletion records in a pack file, read from the file itself."""
    raw = path.read_bytes()
    offset, total = PACK_HEADER.size, 0
    while offset + RECORD.size <= len(raw):
        _, kind, length = RECORD.unpack_from(raw, offset)
        if kind == DELETED:
            total += RECORD.size
        offset += RECORD.size + length
    assert offset == len(raw), f"{path.name} ends in a partial record"
    return total


def check_store(store: ContentStore, model: Model) -> None:
    """The store holds exactly the model's committed objects, and accounts for every pack byte."""
    assert set(store.iter_digests()) == set(model.committed)
    for digest, data in model.committed.items():
        assert store.has(digest)
        assert store.read_bytes(digest) == data
    for digest in model.deleted - set(model.committed):
        assert not store.has(digest) and store.stored_size(digest) is None
    sizes = store.stored_sizes([*model.committed, *model.deleted])
    assert set(sizes) == set(model.committed)
    for digest, data in model.committed.items():  # small objects are packed, never larger than raw
        assert not store.path_of(digest).exists()
        assert sizes[digest] <= RECORD.size + len(data)
    assert store.damage() == []
    packs = sorted(store.packs_dir.glob("pack-*.pack"))
    assert packs == [pack.path for pack in store._packs]
    for pack in store._packs:
        live = sum(sizes[digest] for digest, location in store._committed.items() if location.pack is pack)
        on_disk = pack.path.stat().st_size
        assert on_disk == pack.size
        assert on_disk == PACK_HEADER.size + live + store._dead.get(pack, 0) + _tombstone_bytes(pack.path), \
            f"{pack.path.name}: bytes unaccounted for"


def _reopen(store: ContentStore, root: Path, model: Model) -> ContentStore:
    store.close()
    reopened = ContentStore(root)
    for digest in [d for d in model.uncommitted if reopened.has(d)]:
        model.committed[digest] = model.uncommitted.pop(digest)
    model.uncommitted.clear()
    return reopened


def _compact(store: ContentStore) -> None:
    """``compact_all`` reclaims exactly the dead bytes (and the tombstones no older pack needs);
    afterwards nothing is dead, and a second one has nothing to do."""
    before = sum(p.stat().st_size for p in store.packs_dir.glob("pack-*.pack"))
    dead = sum(store._dead.values())
    with store.collecting():
        compacted, reclaimed = store.compact_all()
    after = sum(p.stat().st_size for p in store.packs_dir.glob("pack-*.pack"))
    assert reclaimed == max(0, before - after)
    assert (compacted == 0) == (dead == 0)
    assert not any(store._dead.values())
    with store.collecting():
        assert store.compact_all() == (0, 0)


def _run(steps, root: Path) -> None:
    scratch = root / "scratch"
    scratch.mkdir()
    store = ContentStore(root / "store")
    model = Model()
    try:
        for name, argument in steps:
            if name in ("commit", "abort", "crash"):
                batch = store.batch()
                written = dict(_write(batch, content, how, scratch) for content, how in argument)
                for digest in written:
                    assert store.has(digest) == (digest in model.committed), "counted before its commit"
                if name == "commit":
                    batch.commit()
                    model.committed.update(written)
                    for digest in written:
                        model.uncommitted.pop(digest, None)
                else:
                    for digest, data in written.items():
                        if digest not in model.committed:
                            model.uncommitted[digest] = data
                    if name == "abort":
                        batch.abort()
                    else:
                        store = _reopen(store, root / "store", model)
            elif name == "race":
                data, _ = _data(argument)
                one, two = store.batch(), store.batch()
                digest = one.put_bytes(data)
                assert two.put_bytes(data) == digest
                one.commit()
                two.commit()
                model.committed[digest] = data
                model.uncommitted.pop(digest, None)
            elif name == "delete":
                if model.committed:
                    digest = sorted(model.committed)[argument % len(model.committed)]
                    pack = store._committed[digest].pack
                    with store.collecting():
                        store.delete(digest)
                    if pack in store._packs and pack.damaged_at is None:
                        assert store._dead[pack] * 2 <= pack.size, "a pack more than half dead was kept"
                    del model.committed[digest]
                    model.uncommitted.pop(digest, None)
                    model.deleted.add(digest)
            elif name == "delete-unknown":
                data, _ = _data(argument)
                if _digest(data) not in model.committed:
                    with store.collecting():
                        store.delete(_digest(data))
            elif name == "compact":
                _compact(store)
            elif name == "reopen":
                store = _reopen(store, root / "store", model)
            else:  # a record cut short by a crash at the end of the last pack
                content, fraction = argument
                data, _ = _data(content)
                kind, body = pack_body(data)
                record = RECORD.pack(bytes.fromhex(_digest(data)), kind, len(body)) + body
                store.close()
                packs = sorted((root / "store" / "packs").glob("pack-*.pack"))
                if packs:
                    intact = packs[-1].stat().st_size
                    with open(packs[-1], "ab") as f:
                        f.write(record[:max(1, int(len(record) * fraction))])
                store = _reopen(store, root / "store", model)
                if packs:
                    assert packs[-1].stat().st_size == intact, "the torn record was not cut off"
            check_store(store, model)
        store = _reopen(store, root / "store", model)
        check_store(store, model)
        _compact(store)
        check_store(store, model)
        store = _reopen(store, root / "store", model)
        check_store(store, model)
    finally:
        store.close()


@settings(max_examples=45, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=14))
def test_any_sequence_of_store_operations_keeps_exactly_the_committed_objects(steps, tmp_path_factory, monkeypatch):
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", ROTATE_BYTES)
    _run(steps, tmp_path_factory.mktemp("store"))


@pytest.mark.parametrize("steps", [
    # a delta chain, its base deleted (the dependents rewritten whole), compacted, reopened
    [("commit", [(("text", 0, v), "similar")]) for v in range(5)]
    + [("delete", 0), ("delete", 1), ("compact", None), ("reopen", None)],
    # a crash with deltas past the durable hint, then a torn tail
    [("commit", [(("text", 1, 0), "bytes")]), ("crash", [(("text", 1, 1), "similar"), (("text", 1, 2), "similar")]),
     ("torn", (("text", 2, 0), 0.5)), ("delete", 0), ("compact", None)],
    # aborted records, superseded records, deletions that compact a pack and carry tombstones
    [("abort", [(("random", 0, 700), "bytes"), (("text", 3, 0), "records")]),
     ("race", ("random", 0, 700)), ("race", ("text", 3, 0)),
     ("commit", [(("random", 1, 700), "fd"), (("random", 2, 700), "fd-grown"), (("random", 3, 64), "records")]),
     ("delete", 0), ("delete", 0), ("reopen", None), ("delete", 0), ("compact", None), ("delete", 0)],
], ids=["delta-chain", "crash-and-torn-tail", "dead-records-and-tombstones"])
def test_known_sequences_keep_exactly_the_committed_objects(steps, tmp_path, monkeypatch):
    """Sequences the property above may not draw in its examples, always run."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", ROTATE_BYTES)
    _run(steps, tmp_path)
