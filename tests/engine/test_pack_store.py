"""The pack-based content store: durability bookkeeping, crash recovery, corruption, a full
disk, deletions; and the persisted stat index that spares a restarted server re-reading
unchanged files."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import zlib

import pytest
import zstandard

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture import stat_index as stat_index_module
from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.kernel.errors import DataLoss, ResourceExhausted
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store import packs as packs_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


def _packs(store: ContentStore):
    return sorted(store.packs_dir.glob("pack-*.pack"))


def test_objects_count_as_stored_only_once_committed_and_survive_a_reopen(tmp_path):
    store = ContentStore(tmp_path)
    batch = store.batch()
    digest = batch.put_bytes(b"small object " * 20)
    assert not store.has(digest) and store.read_bytes(digest) == b"small object " * 20
    batch.commit()
    assert store.has(digest)
    aborted = store.batch()
    dropped = aborted.put_bytes(b"never committed")
    aborted.abort()
    assert not store.has(dropped)
    reopened = ContentStore(tmp_path)
    assert reopened.has(digest) and reopened.read_bytes(digest) == b"small object " * 20


def test_a_torn_record_at_the_end_of_a_pack_is_cut_off_on_open(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        kept = [batch.put_bytes(f"object {i}".encode() * 30) for i in range(20)]
    pack = _packs(store)[-1]
    intact = pack.stat().st_size
    with open(pack, "ab") as f:
        f.write(b"\x12" * 32 + b"Z" + (5000).to_bytes(4, "big") + b"half a body")
    reopened = ContentStore(tmp_path)
    assert pack.stat().st_size == intact
    assert all(reopened.read_bytes(d) == f"object {i}".encode() * 30 for i, d in enumerate(kept))
    with reopened.batch() as batch:
        later = batch.put_bytes(b"written after recovery")
    assert ContentStore(tmp_path).read_bytes(later) == b"written after recovery"


def test_an_unsynced_record_whose_content_does_not_match_its_name_is_dropped_on_open(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        good = batch.put_bytes(b"good " * 40)
    pack = _packs(store)[-1]
    with open(pack, "ab") as f:
        f.write(bytes.fromhex("ab" * 32) + b"R" + (4).to_bytes(4, "big") + b"junk")
    reopened = ContentStore(tmp_path)
    assert not reopened.has("ab" * 32)
    assert reopened.read_bytes(good) == b"good " * 40


def test_corruption_of_a_packed_object_is_detected_on_read(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(bytes(range(256)) * 3)
    pack = _packs(store)[-1]
    data = bytearray(pack.read_bytes())
    data[-10] ^= 0xFF
    pack.write_bytes(bytes(data))
    with pytest.raises(DataLoss):
        ContentStore(tmp_path).read_bytes(digest)


def test_a_full_disk_while_appending_is_resource_exhausted_and_leaves_the_pack_intact(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        before = batch.put_bytes(b"before the disk filled up")
    size = _packs(store)[-1].stat().st_size
    real_pwrite = store_module.os.pwrite

    def full(fd, data, offset):
        real_pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "pwrite", full)
    with pytest.raises(ResourceExhausted), store.batch() as batch:
        batch.put_bytes(b"does not fit " * 100)
    monkeypatch.undo()
    assert _packs(store)[-1].stat().st_size == size
    with store.batch() as batch:
        after = batch.put_bytes(b"after space was freed")
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(before) == b"before the disk filled up"
    assert reopened.read_bytes(after) == b"after space was freed"


def test_deleted_objects_stay_deleted_after_a_reopen(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        doomed = batch.put_bytes(b"to be collected " * 10)
        kept = batch.put_bytes(b"still referenced " * 10)
    store.delete(doomed)
    with store.batch():
        pass
    reopened = ContentStore(tmp_path)
    assert not reopened.has(doomed) and reopened.has(kept)
    assert sorted(reopened.iter_digests()) == [kept]


def test_concurrent_batches_share_packs_and_every_committed_object_survives(tmp_path):
    store = ContentStore(tmp_path)
    written: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(30):
            data = f"worker {n} object {i} ".encode() * (1 + i % 7)
            with store.batch() as batch:
                digest = batch.put_bytes(data)
            with lock:
                written.append((digest, data))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reopened = ContentStore(tmp_path)
    assert all(reopened.read_bytes(digest) == data for digest, data in written)


def test_a_restarted_server_does_not_read_unchanged_files_again(tmp_path, monkeypatch):
    root = tmp_path / "ws"
    for i in range(30):
        write(root / f"d{i % 3}/f{i}.txt", f"file {i}\n")
    # Files just written are in the index's racy window (their ctime cannot be dated back): that
    # window is the index's tests' subject, not this one's.
    monkeypatch.setattr(stat_index_module, "RACY_WINDOW_NS", 0)
    workspace = Workspace(str(root))
    read: list[str] = []
    real = snapshot_module._read_files

    def spy(dir_fd, names, batch, *rest):
        read.extend(name for name, _similar in names)
        return real(dir_fd, names, batch, *rest)

    monkeypatch.setattr(snapshot_module, "_read_files", spy)

    def capture():
        store = ContentStore(tmp_path / "store")
        trees = Trees(store)
        index = StatIndex(tmp_path / "index.sqlite")
        with store.batch() as batch:
            result = Snapshotter(store, trees, index).capture(workspace, disk_rules(workspace, [], []), 1 << 30,
                                                              batch)
        index.close()
        return result

    first = capture()
    assert len(read) == 30
    read.clear()
    write(root / "d0/f0.txt", "changed while the server was down\n")
    second = capture()
    assert read == ["f0.txt"]
    assert second.tree != first.tree and second.file_count == 30


def test_a_mostly_deleted_pack_is_compacted_and_its_live_objects_survive(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 4096)
    store = ContentStore(tmp_path)
    contents = {}
    for i in range(12):
        with store.batch() as batch:
            data = f"object {i} ".encode() * 60 + os.urandom(1500)
            contents[batch.put_bytes(data)] = data
    first_pack = _packs(store)[0]
    in_first = [d for d, loc in store._committed.items() if loc.pack.path == first_pack]
    assert len(_packs(store)) > 1 and len(in_first) > 2
    survivor = in_first[0]
    for digest in in_first[1:]:
        store.delete(digest)
        del contents[digest]
    assert not first_pack.exists()
    assert store.read_bytes(survivor) == contents[survivor]
    reopened = ContentStore(tmp_path)
    assert sorted(reopened.iter_digests()) == sorted(contents)
    assert all(reopened.read_bytes(d) == data for d, data in contents.items())


def test_new_versions_are_stored_as_deltas_and_stay_readable_when_their_base_is_deleted(tmp_path):
    store = ContentStore(tmp_path)
    versions = [b"".join(b"line %d of a file that grows by one line per version\n" % i for i in range(n))
                for n in range(40, 52)]
    digests = []
    previous = ""
    for data in versions:
        with store.batch() as batch:
            previous = batch.put_bytes(data, previous)
        digests.append(previous)
    kinds = [store._committed[d].kind for d in digests]
    assert kinds.count(b"Y") >= len(versions) - 2, kinds
    assert max(store._committed[d].depth for d in digests) <= store_module.MAX_DELTA_DEPTH
    reopened = ContentStore(tmp_path)
    assert [reopened.read_bytes(d) for d in digests] == versions
    for digest in digests[:6]:
        reopened.delete(digest)
    assert [reopened.read_bytes(d) for d in digests[6:]] == versions[6:]
    again = ContentStore(tmp_path)
    assert [again.read_bytes(d) for d in digests[6:]] == versions[6:]
    assert not any(again.has(d) for d in digests[:6])


def _record(data: bytes, kind: bytes, body: bytes) -> bytes:
    return hashlib.sha256(data).digest() + kind + len(body).to_bytes(4, "big") + body


def test_compressible_objects_are_packed_as_zstd_and_read_back(tmp_path):
    store = ContentStore(tmp_path)
    text = b"def function_%d(argument):\n    return argument * 2\n" * 40
    with store.batch() as batch:
        digest = batch.put_bytes(text)
    assert store._committed[digest].kind == store_module.ZSTD
    assert store._committed[digest].length < len(text) // 4
    assert ContentStore(tmp_path).read_bytes(digest) == text


def test_a_pack_from_before_zstd_is_read_and_never_appended_to(tmp_path):
    """A store written by a server from before zstd: its pack (raw and zlib records) is read as
    it is; what is written now goes to a new pack, which such a server would refuse to open."""
    (tmp_path / "packs").mkdir()
    old_pack = tmp_path / "packs" / "pack-000001.pack"
    text, binary = b"an old text object\n" * 50, bytes(range(256))
    records = _record(text, b"Z", zlib.compress(text, 1)) + _record(binary, b"R", binary)
    old_pack.write_bytes(b"CKPTPAK1" + (16 + len(records)).to_bytes(8, "big") + records)
    before = old_pack.read_bytes()
    store = ContentStore(tmp_path)
    assert store.read_bytes(hashlib.sha256(text).hexdigest()) == text
    assert store.read_bytes(hashlib.sha256(binary).hexdigest()) == binary
    with store.batch() as batch:
        new = batch.put_bytes(b"written by this server\n" * 50)
    assert old_pack.read_bytes() == before
    packs = _packs(store)
    assert len(packs) == 2 and packs[-1].read_bytes()[:8] == b"CKPTPAK3"
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(new) == b"written by this server\n" * 50
    assert reopened.read_bytes(hashlib.sha256(text).hexdigest()) == text


def _large_versions() -> list[bytes]:
    """Versions of a ~60 KiB file, each edited near its top: past zlib's 32 KiB window."""
    lines = [b"line %05d of a large file that changes near its top in every version\n" % i for i in range(900)]
    return [b"".join([b"# version %d\n" % n, *lines[n:]]) for n in range(20)]


def test_versions_of_a_file_larger_than_zlibs_window_are_zstd_deltas_of_the_whole_previous_one(tmp_path):
    store = ContentStore(tmp_path)
    versions = _large_versions()
    digests, previous = [], ""
    for data in versions:
        with store.batch() as batch:
            previous = batch.put_bytes(data, previous)
        digests.append(previous)
    kinds = [store._committed[d].kind for d in digests]
    assert kinds.count(b"Y") >= len(versions) - 2, kinds
    assert all(store._committed[d].length < 1024 for d in digests if store._committed[d].kind == b"Y")
    assert max(store._committed[d].depth for d in digests) == store_module.MAX_DELTA_DEPTH < len(versions) - 1, \
        "a chain longer than MAX_DELTA_DEPTH must restart from a whole object"
    reopened = ContentStore(tmp_path)
    assert [reopened.read_bytes(d) for d in digests] == versions
    assert reopened.damage() == []
    for digest in digests[:5]:  # bases deleted: their dependents are rewritten whole first
        reopened.delete(digest)
    assert [reopened.read_bytes(d) for d in digests[5:]] == versions[5:]
    again = ContentStore(tmp_path)
    assert [again.read_bytes(d) for d in digests[5:]] == versions[5:]
    assert not any(again.has(d) for d in digests[:5])


def test_a_pack_from_before_zstd_deltas_is_read_and_never_appended_to(tmp_path):
    """A store whose last pack a server from before zstd deltas wrote (magic CKPTPAK2): such a
    server would cut a pack off at a record kind it does not know, so a pack that may hold zstd
    deltas is a new one (CKPTPAK3), which it refuses to open instead."""
    (tmp_path / "packs").mkdir()
    old_pack = tmp_path / "packs" / "pack-000001.pack"
    first = _large_versions()[0]
    records = _record(first, b"S", zstandard.ZstdCompressor().compress(first))
    old_pack.write_bytes(b"CKPTPAK2" + (16 + len(records)).to_bytes(8, "big") + records)
    before = old_pack.read_bytes()
    store = ContentStore(tmp_path)
    base = hashlib.sha256(first).hexdigest()
    assert store.read_bytes(base) == first
    second = _large_versions()[1]
    with store.batch() as batch:
        new = batch.put_bytes(second, base)
    assert store._committed[new].kind == b"Y" and store._committed[new].base == base
    assert old_pack.read_bytes() == before
    packs = _packs(store)
    assert len(packs) == 2 and packs[-1].read_bytes()[:8] == b"CKPTPAK3"
    assert ContentStore(tmp_path).read_bytes(new) == second


def test_compact_all_rewrites_every_pack_with_dead_records_and_keeps_deletions(tmp_path, monkeypatch):
    """`checkpointd gc --compact`: a pack compacts by itself only once half of it is dead."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 16384)
    store = ContentStore(tmp_path)
    contents = {}
    for _ in range(24):
        data = os.urandom(1500)
        with store.batch() as batch:
            contents[batch.put_bytes(data)] = data
    doomed = [d for d in contents if store._committed[d].pack is store._packs[0]][:2]
    doomed.append(next(d for d in contents if store._committed[d].pack is store._active))
    for digest in doomed:
        store.delete(digest)
        del contents[digest]
    size_before = sum(p.stat().st_size for p in _packs(store))
    with store.collecting():
        packs, reclaimed = store.compact_all()
    assert packs == 2 and reclaimed > 0
    assert sum(p.stat().st_size for p in _packs(store)) == size_before - reclaimed
    with store.collecting():
        assert store.compact_all() == (0, 0)
    with store.batch() as batch:
        contents[batch.put_bytes(b"written after the compaction")] = b"written after the compaction"
    reopened = ContentStore(tmp_path)
    assert sorted(reopened.iter_digests()) == sorted(contents)
    assert all(reopened.read_bytes(d) == data for d, data in contents.items())
    assert reopened.damage() == []


def test_zlib_deltas_written_before_zstd_deltas_still_read(tmp_path):
    (tmp_path / "packs").mkdir()
    base, version = _versions_of_a_file()
    compressor = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, base[-32768:])
    delta = hashlib.sha256(base).digest() + bytes([1]) + compressor.compress(version) + compressor.flush()
    records = _record(base, b"S", zstandard.ZstdCompressor().compress(base)) + _record(version, b"X", delta)
    (tmp_path / "packs" / "pack-000001.pack").write_bytes(b"CKPTPAK2" + (16 + len(records)).to_bytes(8, "big")
                                                          + records)
    store = ContentStore(tmp_path)
    digest = hashlib.sha256(version).hexdigest()
    assert store._committed[digest].kind == b"X" and store.read_bytes(digest) == version
    assert store.damage() == []


def test_a_zstd_record_claiming_more_than_a_packed_object_holds_is_corrupt_not_allocated(tmp_path):
    too_big = bytes(2 * store_module.COMPRESS_LIMIT)
    frame = zstandard.ZstdCompressor().compress(too_big)
    with pytest.raises(zstandard.ZstdError, match="claims"):
        packs_module.zstd_decompress(frame)
    with pytest.raises(zstandard.ZstdError, match="claims"):
        packs_module.zstd_decompress_chain([zstandard.ZstdCompressor().compress(b"base" * 100), frame])
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        kept = batch.put_bytes(b"kept object " * 100)
    pack = _packs(store)[-1]
    intact = pack.stat().st_size
    with open(pack, "ab") as f:
        f.write(_record(too_big, store_module.ZSTD, frame))
    reopened = ContentStore(tmp_path)
    assert pack.stat().st_size == intact, "an unverifiable record past the durable end is a torn tail"
    assert reopened.read_bytes(kept) == b"kept object " * 100


def _versions_of_a_file() -> tuple[bytes, bytes]:
    """Two versions of one file: the second is stored as a delta against the first."""
    first = b"".join(b"line %d of a file that an agent keeps editing\n" % i for i in range(300))
    return first, first + b"one more line\n"


def _fill_until_rotated(store: ContentStore, pack_number: int) -> list[str]:
    """Commits live filler objects until the active pack is no longer ``pack_number``."""
    filler = []
    while store._active is None or store._active.number == pack_number:
        with store.batch() as batch:
            filler.append(batch.put_bytes(os.urandom(1500)))
    return filler


def test_a_deleted_delta_stays_deleted_when_the_pack_of_its_tombstone_is_compacted(tmp_path, monkeypatch):
    """GC deletes B (a delta of A) and A; the pack holding their tombstones is later compacted
    while an older pack still holds B's record. A reopened store must not count B as stored
    (its base is gone), so the next checkpoint that needs B writes it again."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 8192)
    store = ContentStore(tmp_path)
    first, second = _versions_of_a_file()
    with store.batch() as batch:
        a = batch.put_bytes(first)
    a_pack = store._committed[a].pack
    beside_a = _fill_until_rotated(store, a_pack.number)
    with store.batch() as batch:
        b = batch.put_bytes(second, a)
    assert store._committed[b].kind == b"Y" and store._committed[b].base == a
    b_pack = store._committed[b].pack
    kept = _fill_until_rotated(store, b_pack.number)  # B's pack stays mostly live: never compacted
    tombstone_pack = store._active
    store.delete(b)
    store.delete(a)
    assert not store.has(a) and not store.has(b)
    # More objects in the tombstones' pack; GC deletes them and A's neighbours: both packs are
    # compacted, and only B's pack still holds a record of B (or of A).
    doomed = _fill_until_rotated(store, tombstone_pack.number)
    for digest in [*beside_a, *doomed]:
        if store._committed[digest].pack in (a_pack, tombstone_pack):
            store.delete(digest)
    assert not a_pack.path.exists() and not tombstone_pack.path.exists(), "both packs must have been compacted"
    assert b_pack.path.exists()
    store.close()

    reopened = ContentStore(tmp_path)
    assert not reopened.has(b) and not reopened.has(a)
    assert all(reopened.has(digest) for digest in kept)
    with reopened.batch() as batch:
        assert batch.put_bytes(second, a) == b
    assert reopened.read_bytes(b) == second
    reopened.close()
    assert ContentStore(tmp_path).read_bytes(b) == second


def _compact_away(store: ContentStore, pack, keep: tuple[str, ...] = ()) -> None:
    """Deletes what lives in ``pack`` but ``keep``, so that it is compacted."""
    for digest in [d for d, location in store._committed.items() if location.pack is pack and d not in keep]:
        store.delete(digest)
    assert not pack.path.exists()


def test_a_deleted_object_stays_deleted_when_its_tombstone_is_carried_through_compactions(tmp_path, monkeypatch):
    """The tombstone of an object is carried from a compacted pack while an older pack holds
    the object's record; the tombstone of an object stored again since is not."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 8192)
    store = ContentStore(tmp_path)
    gone_data, back_data = os.urandom(1000), os.urandom(1000)
    with store.batch() as batch:
        gone = batch.put_bytes(gone_data)
        back = batch.put_bytes(back_data)
    old_pack = store._committed[gone].pack
    _fill_until_rotated(store, old_pack.number)
    store.delete(gone)
    store.delete(back)
    tombstones = store._active
    with store.batch() as batch:
        batch.put_bytes(back_data)
    _fill_until_rotated(store, tombstones.number)
    _compact_away(store, tombstones, keep=(back,))
    assert old_pack.path.exists()
    for _ in range(2):  # the carried tombstones' pack compacted in turn
        carrier = store._active
        _fill_until_rotated(store, carrier.number)
        _compact_away(store, carrier, keep=(back,))
    _fill_until_rotated(store, store._active.number)  # records after the carried tombstones
    live = sorted(store.iter_digests())
    store.close()
    reopened = ContentStore(tmp_path)
    assert sorted(reopened.iter_digests()) == live and reopened.damage() == []
    assert not reopened.has(gone)
    assert reopened.read_bytes(back) == back_data
    assert back in set(reopened.iter_digests()) and gone not in set(reopened.iter_digests())


def test_a_delta_left_by_an_aborted_batch_is_not_indexed_once_its_base_is_gone(tmp_path, monkeypatch):
    """A batch that aborts leaves its records in the pack; a reopened store reads them. One that
    is a delta against an object since deleted (and compacted away) must not count as stored."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 8192)
    store = ContentStore(tmp_path)
    first, second = _versions_of_a_file()
    with store.batch() as batch:
        a = batch.put_bytes(first)
    a_pack = store._committed[a].pack
    _fill_until_rotated(store, a_pack.number)
    aborted = store.batch()
    b = aborted.put_bytes(second, a)
    aborted.abort()
    _fill_until_rotated(store, store._active.number)
    _compact_away(store, a_pack)
    store.close()
    reopened = ContentStore(tmp_path)
    assert not reopened.has(a) and not reopened.has(b)
    with reopened.batch() as batch:
        batch.put_bytes(second)
    assert ContentStore(tmp_path).read_bytes(b) == second


def test_an_object_written_whole_and_as_a_delta_at_once_survives_the_deletion_of_the_base(tmp_path, monkeypatch):
    """Two batches write the same object at once, one whole, one as a delta; the whole one
    commits, the delta's batch aborts. Its base is then deleted and compacted away: a reopened
    store must read the object from its whole record, not drop it with the delta."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 8192)
    store = ContentStore(tmp_path)
    first, second = _versions_of_a_file()
    with store.batch() as batch:
        a = batch.put_bytes(first)
    a_pack = store._committed[a].pack
    _fill_until_rotated(store, a_pack.number)
    whole, delta = store.batch(), store.batch()
    b = whole.put_bytes(second)
    assert delta.put_bytes(second, a) == b
    whole.commit()
    delta.abort()
    _fill_until_rotated(store, store._active.number)
    _compact_away(store, a_pack)
    assert store.read_bytes(b) == second
    store.close()
    reopened = ContentStore(tmp_path)
    assert reopened.has(b) and reopened.read_bytes(b) == second
