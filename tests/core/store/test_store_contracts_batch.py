"""Content store contracts that the model of test_store_contracts does not reach: the lock that
keeps a collection and captures apart, several threads of one batch writing the same object (the
races are made deterministic by letting the "other thread" write at the point it would), large
(loose) objects from write to deletion, and a damaged pack under ``compact_all``."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
import zlib

import pytest
import zstandard

from checkpointd.core.kernel.errors import DataLoss, ResourceExhausted
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store import packs as packs_module
from checkpointd.core.store.content_store import ContentStore, SharedExclusiveLock
from checkpointd.core.workspace.readworker import RECORD, pack_body
from tests.core.store.test_store_contracts import Model, check_store


def _packs(store: ContentStore):
    return sorted(store.packs_dir.glob("pack-*.pack"))


def _record(data: bytes) -> tuple[str, bytes]:
    kind, body = pack_body(data)
    digest = hashlib.sha256(data).hexdigest()
    return digest, RECORD.pack(bytes.fromhex(digest), kind, len(body)) + body


# -- the lock between a collection and captures ------------------------------------------------


@pytest.mark.parametrize("patience", [None, 60.0], ids=["waiting", "patient"])
def test_no_capture_enters_while_a_collection_holds_the_store(patience):
    """Whether the collection waited for captures or took the store within its patience, no new
    capture may enter until it is done, and then they may again."""
    lock = SharedExclusiveLock()
    with lock.exclusive(patience):
        assert lock.try_shared() is None
    release = lock.try_shared()
    assert release is not None
    release()


@pytest.mark.parametrize("patience", [None, 60.0], ids=["waiting", "patient"])
def test_a_collection_waits_for_the_capture_that_holds_the_store(patience):
    """A capture that entered first is let finish: the collection enters only once it leaves,
    and no capture enters meanwhile."""
    lock = SharedExclusiveLock()
    release = lock.try_shared()
    assert release is not None
    inside = threading.Event()
    leave = threading.Event()
    seen_inside = []

    def collect() -> None:
        with lock.exclusive(patience):
            seen_inside.append(lock.try_shared())
            inside.set()
            leave.wait()

    collector = threading.Thread(target=collect)
    collector.start()
    assert not inside.is_set()
    release()
    inside.wait()
    assert seen_inside == [None]
    leave.set()
    collector.join()
    again = lock.try_shared()
    assert again is not None
    again()


def test_captures_share_the_store():
    lock = SharedExclusiveLock()
    first, second = lock.try_shared(), lock.try_shared()
    assert first is not None and second is not None
    with lock.shared():
        third = lock.try_shared()
        assert third is not None
        third()
    first()
    second()
    with lock.exclusive(patience=5.0):
        pass


# -- several threads of one batch ---------------------------------------------------------------


def test_every_record_of_a_reader_batch_is_stored_when_another_thread_wrote_one_of_them_first(tmp_path, monkeypatch):
    """``put_records`` checks what is known, then writes: another thread of the batch may have
    written one of its objects in between. The others must still be stored."""
    store = ContentStore(tmp_path)
    contents = [os.urandom(300), os.urandom(300), os.urandom(300)]
    records = [_record(data) for data in contents]
    batch = store.batch()
    real = store._writable_pack
    raced = []

    def another_thread_first():
        if not raced:
            raced.append(True)
            batch.put_bytes(contents[0])
        return real()

    monkeypatch.setattr(store, "_writable_pack", another_thread_first)
    batch.put_records(records)
    assert raced
    batch.commit()
    monkeypatch.undo()
    for current in (store, ContentStore(tmp_path)):
        assert [current.read_bytes(digest) for digest, _ in records] == contents
        assert all(current.has(digest) for digest, _ in records)


@pytest.mark.parametrize("how", ["bytes", "fd"])
def test_a_large_object_written_by_two_threads_of_a_batch_is_stored_once(tmp_path, monkeypatch, how):
    """The thread that loses the race drops its staged copy: nothing is left in staging."""
    store = ContentStore(tmp_path / "store")
    data = os.urandom(store_module.COMPRESS_LIMIT + 10)
    source = tmp_path / "source"
    source.write_bytes(data)
    batch = store.batch()
    real_stage = batch._stage
    raced = []

    def write(into) -> str:
        if how == "bytes":
            return into.put_bytes(data)
        fd = os.open(source, os.O_RDONLY)
        try:
            digest, size = into.put_fd(fd, len(data))
        finally:
            os.close(fd)
        assert size == len(data)
        return digest

    def another_thread_first():
        staged = real_stage()
        if not raced:
            raced.append(True)
            write(batch)
        return staged

    monkeypatch.setattr(batch, "_stage", another_thread_first)
    digest = write(batch)
    assert raced
    batch.commit()
    assert list(store.staging.iterdir()) == []
    assert store.read_bytes(digest) == data and ContentStore(tmp_path / "store").read_bytes(digest) == data


# -- large (loose) objects ------------------------------------------------------------------------


def test_large_objects_from_write_to_deletion(tmp_path, monkeypatch):
    """Readable at once, stored once committed (synced one by one, or by one file-system sync
    past a threshold), sized as their file, deleted without a tombstone, gone after a reopen;
    an aborted one leaves nothing behind."""
    monkeypatch.setattr(store_module, "_SYNCFS_THRESHOLD", 1)
    file_system_syncs = []
    real_syncfs = store_module._syncfs
    monkeypatch.setattr(store_module, "_syncfs", lambda fd: (file_system_syncs.append(fd), real_syncfs(fd)))
    store = ContentStore(tmp_path / "store")
    with store.batch() as batch:
        alone = batch.put_bytes(os.urandom(store_module.COMPRESS_LIMIT + 5))
    assert file_system_syncs == [], "one large object is synced by itself"
    with store.batch() as batch:
        packed = batch.put_bytes(b"a small object beside them " * 8)
    contents = [os.urandom(store_module.COMPRESS_LIMIT + n) for n in (1, 2, 3)]
    source = tmp_path / "source"
    source.write_bytes(contents[2])
    batch = store.batch()
    digests = [batch.put_bytes(contents[0]), batch.put_bytes(contents[1])]
    fd = os.open(source, os.O_RDONLY)
    try:
        digests.append(batch.put_fd(fd, len(contents[2]))[0])
    finally:
        os.close(fd)
    assert digests == [hashlib.sha256(data).hexdigest() for data in contents]
    assert not any(store.has(d) for d in digests)
    assert [store.read_bytes(d) for d in digests] == contents
    batch.commit()
    assert len(file_system_syncs) == 1, "past the threshold, one file-system sync"
    assert list(store.staging.iterdir()) == []
    for digest, data in zip(digests, contents, strict=True):
        assert store.has(digest) and store.path_of(digest).is_file()
        assert store.stored_size(digest) == len(data) + 1
    pack_sizes = [p.stat().st_size for p in _packs(store)]
    with store.collecting():
        store.delete(digests[0])
    assert [p.stat().st_size for p in _packs(store)] == pack_sizes, "a loose object needs no tombstone"
    assert not store.has(digests[0]) and not store.path_of(digests[0]).exists()
    assert store.stored_size(digests[0]) is None
    with pytest.raises(DataLoss):
        store.read_bytes(digests[0])
    aborted = store.batch()
    dropped = aborted.put_bytes(os.urandom(store_module.COMPRESS_LIMIT + 4))
    aborted.abort()
    assert list(store.staging.iterdir()) == [] and not store.has(dropped)
    store.close()
    reopened = ContentStore(tmp_path / "store")
    assert sorted(reopened.iter_digests()) == sorted([packed, alone, *digests[1:]])
    assert [reopened.read_bytes(d) for d in digests[1:]] == contents[1:]


def test_a_large_object_whose_file_is_removed_under_the_store_has_no_size(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(os.urandom(store_module.COMPRESS_LIMIT + 1))
    store.path_of(digest).unlink()
    assert store.stored_size(digest) is None and store.stored_sizes([digest]) == {}
    with pytest.raises(DataLoss, match="missing"):
        store.read_bytes(digest)


# -- compaction -----------------------------------------------------------------------------------


def test_compacting_everything_leaves_a_damaged_pack_in_place_and_reclaims_nothing_from_it(tmp_path):
    """A pack damaged within its durable part keeps its bytes for repair, even when it holds dead
    records: ``compact_all`` neither removes it nor counts bytes it did not reclaim."""
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        kept = batch.put_bytes(os.urandom(400))
        doomed = batch.put_bytes(os.urandom(400))
    with store.collecting():
        store.delete(doomed)  # a dead record and its tombstone, in the same (active) pack
    with store.batch() as batch:
        damaged = batch.put_bytes(os.urandom(400))
        after = batch.put_bytes(os.urandom(400))
    kind_at = store._committed[damaged].offset - RECORD.size + 32
    store.close()
    [pack] = _packs(store)
    with open(pack, "r+b") as f:
        f.seek(kind_at)
        f.write(b"?")
    size = pack.stat().st_size
    reopened = ContentStore(tmp_path)
    assert reopened.has(kept) and not reopened.has(doomed)
    assert not reopened.has(damaged) and not reopened.has(after)
    with reopened.collecting():
        assert reopened.compact_all()[1] == 0
    assert pack.exists() and pack.stat().st_size == size
    assert reopened.read_bytes(kept) and [s for s, _ in reopened.damage()] == [pack.name]


@pytest.mark.parametrize(("dead_over_half", "compacted"), [(0, False), (1, True)],
                         ids=["exactly-half", "one-byte-more"])
def test_a_deletion_compacts_its_pack_once_more_than_half_of_it_is_dead(tmp_path, monkeypatch, dead_over_half,
                                                                         compacted):
    """Random bytes are stored raw, at their own length: the doomed record takes exactly half of
    the pack plus ``dead_over_half`` bytes (the tombstone goes to a new pack)."""
    store = ContentStore(tmp_path)
    kept_size = 100
    with store.batch() as batch:
        doomed = batch.put_bytes(os.urandom(kept_size + 16 + dead_over_half))
        kept = batch.put_bytes(os.urandom(kept_size))
    [pack] = _packs(store)
    size = pack.stat().st_size
    assert 2 * (RECORD.size + kept_size + 16 + dead_over_half) == size + dead_over_half
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", size)
    with store.collecting():
        store.delete(doomed)
    assert pack.exists() != compacted
    assert store.read_bytes(kept) and ContentStore(tmp_path).has(kept)
    assert not ContentStore(tmp_path).has(doomed)


def test_deleting_a_base_rewrites_every_live_dependent_whatever_was_deleted_before(tmp_path):
    """Versions stored as deltas of one base, half of them deleted first: deleting the base
    stores each remaining one whole, however the store orders its dependents."""
    store = ContentStore(tmp_path)
    base = b"".join(b"line %d of a file with many versions\n" % i for i in range(300))
    versions = [base.replace(b"line %d " % i, b"edited %d " % i) for i in range(8)]
    with store.batch() as batch:
        base_digest = batch.put_bytes(base)
    digests = []
    for data in versions:
        with store.batch() as batch:
            digests.append(batch.put_bytes(data, base_digest))
    assert all(store._committed[d].kind == b"Y" for d in digests)
    with store.collecting():
        for digest in digests[::2]:
            store.delete(digest)
        store.delete(base_digest)
    kept = list(zip(digests[1::2], versions[1::2], strict=True))
    for current in (store, ContentStore(tmp_path)):
        assert [current.read_bytes(d) for d, _ in kept] == [data for _, data in kept]
        assert not current.has(base_digest) and not any(current.has(d) for d in digests[::2])


def test_a_version_is_stored_as_a_delta_only_when_that_pays(tmp_path):
    """The storage policy: a delta is kept when it takes at most a quarter of the content, or less
    than 0.9 of the object compressed on its own; otherwise the version is stored whole.
    Versions sharing less and less of an incompressible base cross that line."""
    store = ContentStore(tmp_path)
    rng = random.Random(5)
    base = rng.randbytes(4000)
    with store.batch() as batch:
        base_digest = batch.put_bytes(base)
    versions = [base[:keep] + rng.randbytes(len(base) - keep) for keep in range(0, 1600, 40)]
    with store.batch() as batch:
        digests = [batch.put_bytes(data, base_digest) for data in versions]
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    outcomes = []
    for digest, data in zip(digests, versions, strict=True):
        delta = len(zstandard.ZstdCompressor(level=store_module.delta_level(len(data), len(base)), dict_data=dictionary,
                                             write_content_size=True).compress(data))
        whole = len(pack_body(data, store_module._ZSTD_WHOLE_LEVEL)[1])
        pays = delta * 4 <= len(data) or delta < whole * 0.9
        outcomes.append(pays)
        assert (store._committed[digest].kind == b"Y") == pays, (len(data), delta, whole)
        assert store.read_bytes(digest) == data
    assert any(outcomes) and not all(outcomes), outcomes


def _a_base_and_its_delta(store: ContentStore) -> tuple[bytes, str, bytes, str]:
    """A text stored whole and a version of it stored as a delta of it, the store then closed:
    (base, its digest, version, its digest)."""
    base = b"".join(b"line %d of a file an agent keeps editing\n" % i for i in range(300))
    version = base + b"one more line\n"
    with store.batch() as batch:
        base_digest = batch.put_bytes(base)
    with store.batch() as batch:
        version_digest = batch.put_bytes(version, base_digest)
    assert store._committed[version_digest].kind == b"Y"
    store.close()
    return base, base_digest, version, version_digest


def test_a_delta_fallen_back_on_at_open_may_itself_be_a_delta(tmp_path):
    """An object written as a delta, then again (by a batch cut short by a crash) as a delta that
    does not reproduce it: on open the bad record is dropped and the earlier delta, whose base is
    stored, is what reads back."""
    store = ContentStore(tmp_path)
    base, base_digest, version, digest = _a_base_and_its_delta(store)
    [pack] = _packs(store)
    garbage = zstandard.ZstdCompressor().compress(b"not the delta of anything " * 20)
    body = bytes.fromhex(base_digest) + bytes([1]) + garbage
    with open(pack, "ab") as f:
        f.write(bytes.fromhex(digest) + b"Y" + len(body).to_bytes(4, "big") + body)
    reopened = ContentStore(tmp_path)
    assert reopened.has(digest) and reopened.read_bytes(digest) == version
    # the dropped record is dead, the one fallen back on live again: every pack byte accounted for
    check_store(reopened, Model(committed={base_digest: base, digest: version}))


# -- a full disk ------------------------------------------------------------------------------------


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


class _FullFile:
    """A staged file on a full disk: every write fails."""

    def __init__(self, fd: int, mode: str) -> None:
        self._file = open(fd, mode)  # noqa: SIM115 - closed by __exit__

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("fails", ["writing", "syncing", "renaming"])
def test_a_large_object_that_the_disk_cannot_take_leaves_nothing_behind(tmp_path, monkeypatch, fails):
    """Whether the disk fills while the object is written, synced or renamed into place: the
    caller is told the store is full, the batch is reported aborted, and nothing is left staged,
    stored or readable."""
    store = ContentStore(tmp_path)
    data = os.urandom(store_module.COMPRESS_LIMIT + 7)
    finished = []
    with monkeypatch.context() as patch:
        if fails == "writing":
            patch.setattr(store_module.os, "fdopen", _FullFile)
        elif fails == "syncing":
            patch.setattr(store_module.os, "fsync", _full)
        else:
            patch.setattr(store_module.os, "replace", _full)
        with pytest.raises(ResourceExhausted), store.batch() as batch:
            batch.when_finished(finished.append)
            digest = batch.put_bytes(data)
    assert finished == [False]
    assert list(store.staging.iterdir()) == []
    assert not store.has(hashlib.sha256(data).hexdigest())
    if fails != "writing":
        with pytest.raises(DataLoss):
            store.read_bytes(digest)


def test_a_commit_that_cannot_sync_its_pack_aborts_the_batch(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    finished = []
    with monkeypatch.context() as patch:
        patch.setattr(packs_module.os, "fdatasync", _full)
        batch = store.batch()
        batch.when_finished(finished.append)
        digest = batch.put_bytes(b"cannot be made durable " * 4)
        with pytest.raises(ResourceExhausted):
            batch.commit()
    assert finished == [False] and not store.has(digest)
    with pytest.raises(DataLoss):
        store.read_bytes(digest)
    with store.batch() as batch:
        assert batch.put_bytes(b"cannot be made durable " * 4) == digest
    assert ContentStore(tmp_path).read_bytes(digest) == b"cannot be made durable " * 4


def test_a_pack_larger_than_the_read_ahead_of_its_replay_is_indexed_whole(tmp_path):
    """Replaying a pack on open reads it a few MiB at a time: records on both sides of every
    boundary (and headers that straddle one) must be found."""
    store = ContentStore(tmp_path)
    contents = [os.urandom(store_module.COMPRESS_LIMIT - n) for n in range(5)] + [os.urandom(50) for _ in range(3)]
    with store.batch() as batch:
        digests = [batch.put_bytes(data) for data in contents]
    [pack] = _packs(store)
    assert pack.stat().st_size > 4 << 20
    store.close()
    reopened = ContentStore(tmp_path)
    assert sorted(reopened.iter_digests()) == sorted(digests)
    assert [reopened.read_bytes(d) for d in digests] == contents


def test_appends_the_kernel_takes_a_few_bytes_at_a_time_are_completed(tmp_path, monkeypatch):
    """``pwrite`` may write less than it is given: the rest is written after it; a write of
    nothing at all means the disk is full, and the pack is left as it was."""
    store = ContentStore(tmp_path)
    real_pwrite = os.pwrite
    monkeypatch.setattr(packs_module.os, "pwrite", lambda fd, data, offset: real_pwrite(fd, data[:7], offset))
    contents = [b"appended seven bytes at a time " * 9, os.urandom(300)]
    with store.batch() as batch:
        digests = [batch.put_bytes(data) for data in contents]
    size = _packs(store)[0].stat().st_size
    monkeypatch.setattr(packs_module.os, "pwrite", lambda fd, data, offset: 0)
    with pytest.raises(ResourceExhausted), store.batch() as batch:
        batch.put_bytes(b"nothing of it is written " * 9)
    monkeypatch.undo()
    assert _packs(store)[0].stat().st_size == size
    assert [ContentStore(tmp_path).read_bytes(d) for d in digests] == contents


def _append_durable(store: ContentStore, records: bytes) -> None:
    """Appends ``records`` to the closed ``store``'s one pack, within its durable part (the header's
    hint moved to the new end), so that opening indexes them by their headers alone."""
    [pack] = _packs(store)
    with open(pack, "ab") as f:
        f.write(records)
    with open(pack, "r+b") as f:
        f.seek(8)
        f.write(pack.stat().st_size.to_bytes(8, "big"))


def _delta_record(digest: str, base: str) -> bytes:
    """A delta record as the pack holds it; its stream is never decoded (records within the
    durable part are indexed by their header)."""
    body = bytes.fromhex(base) + bytes([1]) + b"a zstd stream"
    return bytes.fromhex(digest) + b"Y" + len(body).to_bytes(4, "big") + body


def test_a_store_opens_when_a_superseded_delta_leads_back_to_its_own_object(tmp_path):
    """Two records of one object, both deltas: the earlier against a second object that is itself
    a delta of the first, the later against a base that is not stored. Nothing on that cycle
    resolves: both objects are dropped on open, and the rest of the pack is read as usual."""
    first, second, missing = (f"{i:02x}" * 32 for i in (1, 2, 9))
    whole = b"a whole object in the same pack"
    whole_record = hashlib.sha256(whole).digest() + b"R" + len(whole).to_bytes(4, "big") + whole
    records = whole_record + _delta_record(first, second) + _delta_record(first, missing) + _delta_record(second, first)
    (tmp_path / "packs").mkdir()
    (tmp_path / "packs" / "pack-000001.pack").write_bytes(b"CKPTPAK3" + (16 + len(records)).to_bytes(8, "big")
                                                          + records)
    store = ContentStore(tmp_path)
    assert sorted(store.iter_digests()) == [hashlib.sha256(whole).hexdigest()]
    assert store.read_bytes(hashlib.sha256(whole).hexdigest()) == whole and store.damage() == []


def test_a_commit_whose_records_another_commits_sync_covered_does_not_sync_again(tmp_path, monkeypatch):
    """Group commit: a commit that waited while another synced the pack up to (exactly) the end of
    its own records finds them durable and returns without a second fdatasync."""
    store = ContentStore(tmp_path)
    first, second = store.batch(), store.batch()
    digests = [first.put_bytes(os.urandom(200)), second.put_bytes(os.urandom(200))]
    pack = store._active
    entries = []
    second_waits = threading.Event()

    class AnnouncingLock:
        """The pack's sync lock, telling when a second committer has come to wait for it."""

        def __init__(self) -> None:
            self._lock = threading.Lock()

        def __enter__(self):
            entries.append(threading.current_thread())
            if len(entries) == 2:
                second_waits.set()
            self._lock.acquire()
            return self

        def __exit__(self, *exc) -> None:
            self._lock.release()

    pack._sync_lock = AnnouncingLock()
    syncs = []
    real_fdatasync = os.fdatasync
    waiter = threading.Thread(target=second.commit)

    def fdatasync(fd: int) -> None:
        syncs.append(fd)
        if len(syncs) == 1:  # while the first commit syncs, the second one comes to wait
            waiter.start()
            second_waits.wait()
        real_fdatasync(fd)

    monkeypatch.setattr(packs_module.os, "fdatasync", fdatasync)
    first.commit()
    waiter.join()
    assert len(syncs) == 1 and len(entries) == 2
    assert all(store.has(d) for d in digests)


def test_a_store_written_before_packs_is_read_whole(tmp_path):
    """Stores from before packs keep every object loose, zlib (``Z``) or raw (``R``) after a
    one-byte header: they open, read back, are sized and deleted like large objects; a loose file
    with another header, or content that is not its name's, is data loss."""
    objects = {b"Z": b"a text file compressed with zlib\n" * 40, b"R": os.urandom(500)}
    digests = {}
    for kind, data in objects.items():
        digest = digests[kind] = hashlib.sha256(data).hexdigest()
        path = tmp_path / "objects" / digest[:2] / digest[2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(kind + (zlib.compress(data) if kind == b"Z" else data))
    bad = {"no header": b"?" + b"x" * 10, "wrong content": b"R" + b"not what its name says"}
    for reason, content in bad.items():
        digest = digests[reason] = hashlib.sha256(reason.encode()).hexdigest()
        path = tmp_path / "objects" / digest[:2] / digest[2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    store = ContentStore(tmp_path)
    assert sorted(store.iter_digests()) == sorted(digests.values())
    for kind, data in objects.items():
        assert store.read_bytes(digests[kind]) == data
        assert store.stored_size(digests[kind]) == store.path_of(digests[kind]).stat().st_size
    for reason in bad:
        with pytest.raises(DataLoss):
            store.read_bytes(digests[reason])
    with store.collecting():
        store.delete(digests[b"Z"])
    assert not ContentStore(tmp_path).has(digests[b"Z"])
    assert ContentStore(tmp_path).read_bytes(digests[b"R"]) == objects[b"R"]


def test_an_object_fallen_back_on_at_open_stays_the_base_of_its_deltas(tmp_path):
    """An object whose latest record is a delta of a base that is not stored falls back on its
    earlier, whole record; a version stored as a delta of that object still resolves through it."""
    store = ContentStore(tmp_path)
    base, base_digest, version, version_digest = _a_base_and_its_delta(store)
    # a later record of the base, a delta of something never stored
    _append_durable(store, _delta_record(base_digest, "ab" * 32))
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(base_digest) == base and reopened.read_bytes(version_digest) == version
    check_store(reopened, Model(committed={base_digest: base, version_digest: version}))


def test_an_object_falls_back_past_a_record_whose_chain_leads_back_to_it(tmp_path):
    """Two later records of the base: a delta of its own version (a chain back to the base), then a
    delta of something never stored. The base falls back past both to its whole record, and the
    version reads through it: nothing some record makes readable is dropped."""
    store = ContentStore(tmp_path)
    base, base_digest, version, version_digest = _a_base_and_its_delta(store)
    _append_durable(store, _delta_record(base_digest, version_digest) + _delta_record(base_digest, "ab" * 32))
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(base_digest) == base and reopened.read_bytes(version_digest) == version
    check_store(reopened, Model(committed={base_digest: base, version_digest: version}))
    assert reopened.damage() == []


def test_a_large_object_stays_readable_while_its_commit_renames_it_into_place(tmp_path, monkeypatch):
    """Between the rename of a staged large object to its final name and the index update, a
    reader holding the staged name finds the object under its final one."""
    store = ContentStore(tmp_path)
    data = os.urandom(store_module.COMPRESS_LIMIT + 3)
    batch = store.batch()
    digest = batch.put_bytes(data)
    read_meanwhile = []
    real_replace = os.replace

    def replace(source, target):
        real_replace(source, target)
        read_meanwhile.append(store.read_bytes(digest) == data)

    monkeypatch.setattr(store_module.os, "replace", replace)
    batch.commit()
    assert read_meanwhile == [True] and store.has(digest)
