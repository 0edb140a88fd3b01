"""Content store promises at their edges (written from the survivors of `make mutants --module
store`): what is made durable before a commit returns, what a reopened store indexes, how a
reader-process batch and a legacy zlib delta read back, and the lock a collection takes."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
import time
import types
import zlib

import pytest
import zstandard

from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.errors import DataLoss, ResourceExhausted
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store import packs as packs_module
from checkpointd.core.store.content_store import ContentStore, Postponed, SharedExclusiveLock
from checkpointd.core.workspace.readworker import RECORD, pack_body


def _packs(store: ContentStore):
    return sorted(store.packs_dir.glob("pack-*.pack"))


def _durable_hint(path) -> int:
    """The length a pack's header says is durable (see module docstring of content_store)."""
    return int.from_bytes(path.read_bytes()[8:16], "big")


def _versions(lines: int = 300) -> tuple[bytes, bytes]:
    first = b"".join(b"line %d of a file that an agent keeps editing\n" % i for i in range(lines))
    return first, first + b"one more line\n"


def test_a_commit_makes_its_packed_objects_durable_before_it_returns(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(b"an object a checkpoint row is about to reference " * 4)
    location = store._committed[digest]
    assert _durable_hint(location.pack.path) >= location.offset + location.length
    with store.batch() as batch:
        later = batch.put_bytes(b"a second commit to the same pack " * 4)
    location = store._committed[later]
    assert _durable_hint(location.pack.path) >= location.offset + location.length


def test_deleting_a_base_makes_its_rewritten_dependents_durable(tmp_path):
    """A delta is stored in full before its base goes: that full record must be durable before
    the base's tombstone can be, or a crash would lose the object."""
    store = ContentStore(tmp_path)
    first, second = _versions()
    with store.batch() as batch:
        base = batch.put_bytes(first)
    with store.batch() as batch:
        dependent = batch.put_bytes(second, base)
    assert store._committed[dependent].kind == b"Y"
    store.delete(base)
    location = store._committed[dependent]
    assert location.kind != b"Y"
    assert _durable_hint(location.pack.path) >= location.offset + location.length
    assert ContentStore(tmp_path).read_bytes(dependent) == second


def test_every_deletion_is_counted(tmp_path):
    """``deletions`` tells a capture that objects it may reuse are gone (see capturer)."""
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digests = [batch.put_bytes(f"object {i}".encode() * 10) for i in range(2)]
    before = store.deletions
    store.delete(digests[0])
    after_one = store.deletions
    store.delete(digests[1])
    assert before != after_one != store.deletions != before


def test_commits_report_one_durable_wait_and_an_empty_commit_none(tmp_path, monkeypatch):
    waits = []

    class Recording(telemetry.Sink):
        def made_durable(self, what, seconds):
            waits.append((what, seconds))

    monkeypatch.setattr(telemetry, "_sink", Recording())
    store = ContentStore(tmp_path)
    with store.batch():
        pass
    assert waits == []
    before = time.perf_counter()
    with store.batch() as batch:
        batch.put_bytes(b"packed, synced " * 10)
    elapsed = time.perf_counter() - before
    [(what, seconds)] = waits
    assert what == telemetry.Durable.OBJECTS and 0 <= seconds <= elapsed


def test_syncfs_falls_back_to_a_global_sync_only_when_it_fails(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(store_module.os, "sync", lambda: synced.append("sync"))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        monkeypatch.setattr(store_module, "_libc", types.SimpleNamespace(syncfs=lambda fd: 0))
        store_module._syncfs(fd)
        assert synced == []
        monkeypatch.setattr(store_module, "_libc", types.SimpleNamespace(syncfs=lambda fd: -1))
        store_module._syncfs(fd)
        assert synced == ["sync"]
    finally:
        os.close(fd)


def test_large_objects_are_indexed_again_on_reopen(tmp_path):
    store = ContentStore(tmp_path)
    data = os.urandom(store_module.COMPRESS_LIMIT + 10)
    with store.batch() as batch:
        digest = batch.put_bytes(data)
    reopened = ContentStore(tmp_path)
    assert reopened.has(digest) and reopened.read_bytes(digest) == data
    assert reopened.stored_size(digest) == len(data) + 1


def test_stored_size_is_the_record_of_a_packed_object_and_none_for_an_unknown_one(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(os.urandom(500))
    assert store.stored_size(digest) == RECORD.size + 500
    assert store.stored_size("ab" * 32) is None


def test_a_reopened_store_appends_to_its_last_pack(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(os.urandom(300))
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "PACK_ROTATE_BYTES", _packs(store)[0].stat().st_size)
        with store.batch() as batch:
            batch.put_bytes(b"before the restart " * 10)
    store.close()
    assert len(_packs(store)) == 2
    reopened = ContentStore(tmp_path)
    with reopened.batch() as batch:
        after = batch.put_bytes(b"after the restart " * 10)
    assert len(_packs(reopened)) == 2 and reopened._committed[after].pack.number == 2
    assert ContentStore(tmp_path).read_bytes(after) == b"after the restart " * 10


def test_a_pack_that_reached_the_rotation_size_takes_no_more_records(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(os.urandom(300))
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", _packs(store)[0].stat().st_size)
    with store.batch() as batch:
        later = batch.put_bytes(os.urandom(300))
    assert len(_packs(store)) == 2 and store._committed[later].pack.number == 2


def test_a_zlib_delta_against_a_base_longer_than_zlibs_window_reads_back(tmp_path):
    """Deltas written before zstd use the base's last 32 KiB as their dictionary."""
    (tmp_path / "packs").mkdir()
    base, version = _versions(lines=1200)
    assert len(base) > 32768
    compressor = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, base[-32768:])
    delta = hashlib.sha256(base).digest() + bytes([1]) + compressor.compress(version) + compressor.flush()
    records = b"".join(hashlib.sha256(data).digest() + kind + len(body).to_bytes(4, "big") + body
                       for data, kind, body in [(base, b"S", zstandard.ZstdCompressor().compress(base)),
                                                (version, b"X", delta)])
    (tmp_path / "packs" / "pack-000001.pack").write_bytes(b"CKPTPAK2" + (16 + len(records)).to_bytes(8, "big")
                                                          + records)
    store = ContentStore(tmp_path)
    assert store.read_bytes(hashlib.sha256(version).hexdigest()) == version


def test_a_pack_truncated_under_an_open_store_is_data_loss(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(os.urandom(2000))
    pack = _packs(store)[0]
    os.truncate(pack, pack.stat().st_size - 100)
    with pytest.raises(DataLoss):
        store.read_bytes(digest)


def test_objects_from_reader_processes_are_stored_once_and_read_back(tmp_path):
    """``put_records``: whole records made by a reader process, raw or zstd."""
    store = ContentStore(tmp_path)
    contents = [os.urandom(700), b"compressible text, compressible text\n" * 50]
    records = []
    for data in contents:
        kind, body = pack_body(data)
        records.append((hashlib.sha256(data).hexdigest(), RECORD.pack(hashlib.sha256(data).digest(), kind,
                                                                         len(body)) + body))
    assert records[1][1][32:33] == b"S"
    with store.batch() as batch:
        batch.put_records(records + records[:1])
    size = _packs(store)[0].stat().st_size
    with store.batch() as batch:
        batch.put_records(records)
    assert _packs(store)[0].stat().st_size == size, "objects already stored are not written again"
    for reopen in (False, True):
        current = ContentStore(tmp_path) if reopen else store
        assert [current.read_bytes(digest) for digest, _ in records] == contents


def test_a_new_version_whose_base_cannot_be_read_is_stored_whole(tmp_path):
    store = ContentStore(tmp_path)
    first, second = _versions()
    with store.batch() as batch:
        base = batch.put_bytes(first)
    pack = _packs(store)[0]
    location = store._committed[base]
    with open(pack, "r+b") as f:
        f.seek(location.offset + location.length - 5)
        f.write(b"XXXXX")
    with store.batch() as batch:
        digest = batch.put_bytes(second, base)
    assert store.read_bytes(digest) == second


def test_a_record_superseded_by_another_batch_is_dead_and_compacted_away(tmp_path):
    """Two batches write the same object at once; the second commit's record wins and the
    first one is dead weight that `gc --compact` reclaims."""
    store = ContentStore(tmp_path)
    one, two = store.batch(), store.batch()
    data = os.urandom(1000)
    digest = one.put_bytes(data)
    assert two.put_bytes(data) == digest
    one.commit()
    two.commit()
    with store.collecting():
        packs, reclaimed = store.compact_all()
    assert packs == 1 and reclaimed == RECORD.size + 1000
    assert ContentStore(tmp_path).read_bytes(digest) == data


def test_a_file_that_grew_since_it_was_sized_is_stored_whole(tmp_path):
    path = tmp_path / "growing"
    path.write_bytes(b"0123456789" * 10)
    store = ContentStore(tmp_path / "store")
    fd = os.open(path, os.O_RDONLY)
    try:
        with store.batch() as batch:
            digest, size = batch.put_fd(fd, 50)
    finally:
        os.close(fd)
    assert size == 100 and store.read_bytes(digest) == b"0123456789" * 10


def test_a_full_disk_while_starting_a_pack_is_resource_exhausted(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module, "fsync_dir", full)
    with pytest.raises(ResourceExhausted), store.batch() as batch:
        batch.put_bytes(b"the first object of a new pack " * 4)


def test_an_unsynced_delta_that_reproduces_its_object_is_kept_on_open(tmp_path):
    """A batch that never committed leaves its records past the durable hint; on open each is
    verified, and a delta that reads back right counts as stored (see the one that does not,
    test_pack_store)."""
    store = ContentStore(tmp_path)
    first, second = _versions()
    with store.batch() as batch:
        base = batch.put_bytes(first)
    unfinished = store.batch()
    digest = unfinished.put_bytes(second, base)
    assert store._staged.first(digest).kind == b"Y"
    store.close()
    reopened = ContentStore(tmp_path)
    assert reopened.has(digest) and reopened.read_bytes(digest) == second


def test_a_damaged_record_at_the_very_end_of_a_durable_pack_is_kept_for_repair(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        kept = batch.put_bytes(os.urandom(400))
        damaged = batch.put_bytes(os.urandom(400))
    store.close()
    pack = _packs(store)[0]
    size = pack.stat().st_size
    assert _durable_hint(pack) == size
    location_kind_at = size - 400 - RECORD.size + 32
    with open(pack, "r+b") as f:
        f.seek(location_kind_at)
        f.write(b"?")
    reopened = ContentStore(tmp_path)
    assert pack.stat().st_size == size, "bytes within the durable part are never cut off"
    assert reopened.has(kept) and not reopened.has(damaged)
    assert [subject for subject, _ in reopened.damage()] == [pack.name]


def test_delta_chains_stop_at_the_maximum_depth_whatever_wrote_their_first_version(tmp_path):
    """Reading an object costs one record per delta on its chain: a version whose base is
    MAX_DELTA_DEPTH deltas deep is stored whole (the base written by this store, or found on
    open). The bound is the store's policy: a read costs at most 17 records."""
    depth = 16
    for reopen in (False, True):
        root = tmp_path / f"reopened-{reopen}"
        store = ContentStore(root)
        versions = [b"".join(b"line %d of a file that grows by one line per version\n" % i
                             for i in range(n)) for n in range(300, 300 + depth + 2)]
        with store.batch() as batch:
            previous = batch.put_bytes(versions[0])
        if reopen:
            store.close()
            store = ContentStore(root)
        kinds = []
        for data in versions[1:]:
            with store.batch() as batch:
                previous = batch.put_bytes(data, previous)
            kinds.append(store._committed[previous].kind)
        assert kinds == [b"Y"] * depth + [b"S"], (reopen, kinds)


def test_a_collection_waits_for_a_capture_younger_than_its_patience(monkeypatch):
    """A holder of the shared side that entered less than ``patience`` ago is not stuck: the
    exclusive side waits for it (holding new holders back), it does not give up. The lock's
    clock is frozen so that the holder never ages."""
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(monotonic=lambda: 1000.0))
    lock = SharedExclusiveLock()
    release = lock.try_shared()
    released = threading.Event()
    outcome = []

    def exclusive() -> None:
        try:
            with lock.exclusive(patience=0.05):
                outcome.append(("taken", "after the holder left" if released.is_set() else "while it held"))
        except Postponed:
            outcome.append("postponed")

    asking = threading.Thread(target=exclusive)
    asking.start()
    while asking.is_alive():
        other = lock.try_shared()
        if other is None:
            break  # new holders are held back: the exclusive side waits for the present one
        other()
    released.set()
    release()
    asking.join()
    assert outcome == [("taken", "after the holder left")]


def test_a_pack_is_compacted_once_more_than_half_of_it_is_dead_to_the_byte(tmp_path, monkeypatch):
    """``delete`` compacts a pack other than the active one when its dead records take more
    than half of it: here one byte more than half."""
    store = ContentStore(tmp_path)
    live_size = 100
    with store.batch() as batch:  # random bytes: stored raw, at their own length
        doomed = batch.put_bytes(os.urandom(live_size + 17))
        kept = batch.put_bytes(os.urandom(live_size))
    [pack] = _packs(store)
    size = pack.stat().st_size
    assert 2 * (RECORD.size + live_size + 17) == size + 1
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", size)  # the tombstone starts a new pack
    store.delete(doomed)
    assert not pack.exists(), "the pack was not compacted"
    assert store.read_bytes(kept) and ContentStore(tmp_path).has(kept)


def test_pack_files_are_readable_and_writable_by_their_owner_only(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(b"workspace content is private " * 4)
    assert [pack.stat().st_mode & 0o777 for pack in _packs(store)] == [0o600]


def test_a_pack_file_removed_under_an_open_store_is_reported_as_damage(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(b"in a pack that goes missing " * 4)
    [pack] = _packs(store)
    pack.unlink()
    [(subject, detail)] = store.damage()
    assert subject == pack.name and "cannot be read" in detail


def _raw_record(data: bytes, kind: bytes = b"R", body: bytes | None = None) -> bytes:
    body = data if body is None else body
    return hashlib.sha256(data).digest() + kind + len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("bad", [_raw_record(os.urandom(200), body=os.urandom(200)),
                                 _raw_record(b"a delta cut short", kind=b"Y", body=b"short")],
                         ids=["does-not-verify", "delta-too-short-for-its-header"])
def test_an_unsynced_bad_record_ends_the_pack_even_if_a_good_one_follows(tmp_path, bad):
    """Past the durable hint, the first record that does not verify (or is a delta too short for
    its header) is where a crash cut the writes short: it and everything after it are cut off."""
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        kept = batch.put_bytes(os.urandom(200))
    [pack] = _packs(store)
    intact = pack.stat().st_size
    later = os.urandom(200)
    with open(pack, "ab") as f:
        f.write(bad + _raw_record(later))
    reopened = ContentStore(tmp_path)
    assert pack.stat().st_size == intact
    assert reopened.has(kept) and not reopened.has(hashlib.sha256(later).hexdigest())


def test_an_unsynced_delta_that_does_not_reproduce_its_object_is_dropped_on_open(tmp_path):
    store = ContentStore(tmp_path)
    first, second = _versions()
    with store.batch() as batch:
        base = batch.put_bytes(first)
    [pack] = _packs(store)
    garbage = zstandard.ZstdCompressor().compress(b"not the delta of anything " * 20)
    body = bytes.fromhex(base) + bytes([1]) + garbage
    with open(pack, "ab") as f:
        f.write(_raw_record(second, kind=b"Y", body=body))
    store.close()
    reopened = ContentStore(tmp_path)
    assert not reopened.has(hashlib.sha256(second).hexdigest())
    assert reopened.read_bytes(base) == first


def test_a_large_object_is_readable_before_its_batch_commits(tmp_path):
    store = ContentStore(tmp_path)
    data = os.urandom(store_module.COMPRESS_LIMIT + 10)
    batch = store.batch()
    digest = batch.put_bytes(data)
    assert not store.has(digest) and store.read_bytes(digest) == data
    batch.commit()
    assert store.read_bytes(digest) == data


def test_closing_a_store_closes_its_pack_files(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(b"an object in a pack " * 4)
    fds = [pack.fd for pack in store._packs]
    assert fds
    store.close()
    for fd in fds:
        with pytest.raises(OSError) as closed:
            os.fstat(fd)
        assert closed.value.errno == errno.EBADF


def test_a_pack_cut_short_within_its_durable_part_does_not_index_the_cut_record(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        kept = batch.put_bytes(os.urandom(300))
        cut = batch.put_bytes(os.urandom(300))
    store.close()
    [pack] = _packs(store)
    os.truncate(pack, pack.stat().st_size - 10)
    reopened = ContentStore(tmp_path)
    assert reopened.has(kept) and not reopened.has(cut)
    assert reopened.read_bytes(kept)
    assert reopened.damage() == []  # cut back to its last whole record, like a torn tail
    with reopened.batch() as batch:
        batch.put_bytes(b"appended to the same pack " * 4)
    assert _packs(reopened) == [pack]


def test_a_file_too_short_to_hold_a_pack_header_is_not_a_pack(tmp_path):
    (tmp_path / "packs").mkdir()
    (tmp_path / "packs" / "pack-000001.pack").write_bytes(b"CKPT")
    with pytest.raises(DataLoss, match="is not a pack"):
        ContentStore(tmp_path)


def test_a_reopened_store_appends_to_its_last_pack_after_one_from_before_zstd_deltas(tmp_path):
    (tmp_path / "packs").mkdir()
    old = os.urandom(100)
    records = _raw_record(old)
    (tmp_path / "packs" / "pack-000001.pack").write_bytes(b"CKPTPAK2" + (16 + len(records)).to_bytes(8, "big")
                                                          + records)
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(b"in the first pack written now " * 4)
    store.close()
    reopened = ContentStore(tmp_path)
    with reopened.batch() as batch:
        after = batch.put_bytes(b"after the restart " * 10)
    assert len(_packs(reopened)) == 2 and reopened._committed[after].pack.number == 2


def test_damage_names_a_delta_whose_base_is_not_stored(tmp_path):
    store = ContentStore(tmp_path)
    first, second = _versions()
    with store.batch() as batch:
        base = batch.put_bytes(first)
    with store.batch() as batch:
        dependent = batch.put_bytes(second, base)
    assert store.damage() == []
    del store._committed[base]  # a defect of the store's own bookkeeping
    assert store.damage() == [(dependent, f"is stored as a delta of {base}, which is not stored")]


def test_a_full_disk_while_staging_a_large_object_is_resource_exhausted(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    real_open = os.open

    def full(path, flags, *rest, **kwargs):
        if str(path).startswith(str(store.staging)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *rest, **kwargs)

    patched_os = types.ModuleType("os")
    patched_os.__dict__.update(os.__dict__)
    patched_os.open = full
    monkeypatch.setattr(store_module, "os", patched_os)
    with pytest.raises(ResourceExhausted), store.batch() as batch:
        batch.put_bytes(os.urandom(store_module.COMPRESS_LIMIT + 10))


def test_a_large_object_is_synced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source, target):
        events.append(("rename", str(source)))
        real_replace(source, target)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    monkeypatch.setattr(store_module.os, "replace", replace)
    with store.batch() as batch:
        batch.put_bytes(os.urandom(store_module.COMPRESS_LIMIT + 10))
    [(_, staged)] = [event for event in events if event[0] == "rename"]
    assert events.index(("fsync", staged)) < events.index(("rename", staged))


def test_an_object_of_exactly_the_packed_size_limit_reads_back(tmp_path):
    data = b"compressible line of a large generated file\n" * (store_module.COMPRESS_LIMIT // 44 + 1)
    data = data[:store_module.COMPRESS_LIMIT]
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(data)
    assert store._committed[digest].kind == b"S"
    assert store.read_bytes(digest) == data and ContentStore(tmp_path).read_bytes(digest) == data


def test_a_full_disk_while_syncing_a_pack_is_resource_exhausted(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        batch.put_bytes(b"a pack exists " * 4)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packs_module.os, "fdatasync", full)
    with pytest.raises(ResourceExhausted), store.batch() as batch:
        batch.put_bytes(b"cannot be made durable " * 4)


def test_a_large_object_whose_source_cannot_be_read_leaves_nothing_staged(tmp_path):
    store = ContentStore(tmp_path / "store")
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # read() fails: EISDIR
    try:
        with pytest.raises(OSError), store.batch() as batch:
            batch.put_fd(directory, store_module.COMPRESS_LIMIT + 1)
    finally:
        os.close(directory)
    assert list(store.staging.iterdir()) == []


def _chain(store: ContentStore, length: int, lines: int = 300) -> tuple[list[bytes], list[str]]:
    """``length`` versions of a text of ``lines`` lines, each stored as a delta of the one before."""
    text = _versions(lines)[0]
    versions = [text.replace(b"line %d " % i, b"edit %d " % i) for i in range(length)]
    digests: list[str] = []
    for data in versions:
        with store.batch() as batch:
            digests.append(batch.put_bytes(data, digests[-1] if digests else ""))
    assert [store._committed[d].depth for d in digests] == list(range(length))
    return versions, digests


def test_a_version_deep_in_a_chain_is_hashed_once_when_read(tmp_path, monkeypatch):
    """Reading a delta decodes its chain of bases without hashing each link: the object's own
    digest covers them (a damaged link changes what the chain decodes to)."""
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, 8)
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(data=b""):
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(store_module.hashlib, "sha256", counting)
    assert store.read_bytes(digests[-1]) == versions[-1]
    assert len(hashed) == 1


def test_a_chain_of_zstd_deltas_is_decoded_in_one_pass(tmp_path, monkeypatch):
    """Zstd deltas down to a zstd base are decoded together with one decompression context
    (making one per link cost ~13 µs a link, ten times the decoding)."""
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, 8)
    assert store._committed[digests[0]].kind == store_module.ZSTD
    per_link: list[int] = []
    real = store_module.zstd_decompress
    monkeypatch.setattr(store_module, "zstd_decompress", lambda body, base=None: per_link.append(1)
                        or real(body, base))
    assert [store.read_bytes(d) for d in digests] == versions
    assert per_link == [1], "only the base, read whole, is decoded on its own"


def test_a_chain_over_a_base_that_looks_like_a_zstd_dictionary_reads_back(tmp_path):
    """A base is a dictionary of raw content whatever its first bytes: one that starts with the
    magic number of a trained zstd dictionary (a file that is one) is not taken for one."""
    store = ContentStore(tmp_path)
    text = _versions()[0]
    versions = [b"\x37\xa4\x30\xec" + text]
    versions += [versions[0].replace(b"line %d " % i, b"edit %d " % i) for i in range(3)]
    digests: list[str] = []
    for data in versions:
        with store.batch() as batch:
            digests.append(batch.put_bytes(data, digests[-1] if digests else ""))
    assert [store._committed[d].depth for d in digests] == [0, 1, 2, 3]
    assert [ContentStore(tmp_path).read_bytes(d) for d in digests] == versions


def test_a_chain_over_a_raw_base_is_decoded_link_by_link(tmp_path):
    store = ContentStore(tmp_path)
    rng = random.Random(3)
    versions = [rng.randbytes(3000)]
    versions += [versions[0][:100 * i] + b"edit" + versions[0][100 * i + 4:] for i in range(1, 4)]
    digests: list[str] = []
    for data in versions:
        with store.batch() as batch:
            digests.append(batch.put_bytes(data, digests[-1] if digests else ""))
    assert store._committed[digests[0]].kind == b"R" and store._committed[digests[-1]].depth == 3
    assert [ContentStore(tmp_path).read_bytes(d) for d in digests] == versions


@pytest.mark.parametrize("damaged", [0, 3, 6])
def test_a_damaged_link_of_a_chain_is_the_object_named(tmp_path, damaged):
    """A record damaged in a chain: reading it or any version above it fails naming that record's
    object (as when each link was hashed), the versions below it still read."""
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, 8)
    location = store._committed[digests[damaged]]
    with open(_packs(store)[0], "r+b") as f:
        f.seek(location.offset + location.length - 3)
        f.write(b"\xff\x00\xff")
    for index, digest in enumerate(digests):
        if index < damaged:
            assert store.read_bytes(digest) == versions[index]
        else:
            with pytest.raises(DataLoss) as raised:
                store.read_bytes(digest)
            assert raised.value.metadata["digest"] == digests[damaged]


def test_versions_over_a_base_damaged_without_a_decoding_error_are_never_returned(tmp_path):
    """A byte flipped in a base stored raw (incompressible) decodes without any error, to other
    bytes: every version stored as a delta over it is refused, naming the base, never returned."""
    store = ContentStore(tmp_path)
    rng = random.Random(7)
    base = rng.randbytes(4000)
    with store.batch() as batch:
        digests = [batch.put_bytes(base)]
    assert store._committed[digests[0]].kind == b"R"
    versions = [base]
    for i in range(4):
        version = bytearray(versions[-1])
        version[1000 + i * 500:1010 + i * 500] = rng.randbytes(10)
        versions.append(bytes(version))
        with store.batch() as batch:
            digests.append(batch.put_bytes(versions[-1], digests[-1]))
    assert [store._committed[d].depth for d in digests] == [0, 1, 2, 3, 4]
    location = store._committed[digests[0]]
    with open(_packs(store)[0], "r+b") as f:
        f.seek(location.offset + 1200)
        f.write(bytes([base[1200] ^ 0xFF]))
    for digest in digests:
        with pytest.raises(DataLoss) as raised:
            store.read_bytes(digest)
        assert raised.value.metadata["digest"] == digests[0]
