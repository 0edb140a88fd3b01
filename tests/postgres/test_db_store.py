"""The content store kept in the database (--store db), on SQLite and PostgreSQL: the same
interface and guarantees as the disk store, and a GC fence that spans replicas."""

from __future__ import annotations

import hashlib
import inspect
import os
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.metadata.db import Database
from checkpointd.core.store import content_store as store
from checkpointd.core.store import db_store
from checkpointd.core.store.db_store import DatabaseStore, StoreKind, open_store

MIB = 1 << 20


#: Disk-store only: where a loose object lives, and whole pack records from reader processes
#: (a scan into the database store reads its files in the server).
#: Packs are the disk store's own: `checkpointd gc --compact` repacks only a disk store.
DISK_ONLY = frozenset({"path_of", "put_records", "compact_all"})


def public_names(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("disk", "database"), [(store.ContentStore, DatabaseStore), (store.Batch, db_store.Batch)],
                         ids=["store", "batch"])
def test_the_database_store_offers_everything_the_disk_store_does(disk, database):
    """Callers use either store through the same interface: names and parameters must match."""
    missing = public_names(disk) - DISK_ONLY - public_names(database)
    assert missing == set(), f"{database.__qualname__} lacks {sorted(missing)}"
    for name in public_names(disk) - DISK_ONLY:
        if callable(getattr(disk, name)) and not isinstance(getattr(disk, name), type):
            assert parameters(getattr(database, name)) == parameters(getattr(disk, name)), name


@pytest.fixture
def database(any_db_url: str) -> Iterator[Database]:
    database = Database(any_db_url)
    database.migrate()
    yield database
    database.dispose()


@pytest.fixture
def objects(database: Database, tmp_path: Path) -> DatabaseStore:
    return DatabaseStore(database, tmp_path / "staging")


def a_replica(database: Database, tmp_path: Path, name: str) -> DatabaseStore:
    """Another server process's store on the same database (its own connections and staging)."""
    return DatabaseStore(Database(database.url), tmp_path / name)


def incompressible(size: int, seed: bytes = b"") -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(seed + counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:size])


def stored_rows(database: Database, digest: str) -> tuple[int, int]:
    with database.engine.connect() as connection:
        objects = connection.execute(text("SELECT count(*) FROM objects WHERE digest = :d"), {"d": digest}).scalar()
        chunks = connection.execute(text("SELECT count(*) FROM object_chunks WHERE digest = :d"),
                                    {"d": digest}).scalar()
    return objects, chunks


@pytest.mark.parametrize("content", [b"", b"small", b"a" * (3 * MIB), incompressible(100), incompressible(MIB),
                                     incompressible(MIB + 1), incompressible(3 * MIB + 17)],
                         ids=["empty", "small", "compressible-3MiB", "random-100", "random-1MiB", "random-1MiB+1",
                              "random-3MiB+17"])
def test_content_comes_back_exactly_through_another_replica(objects, database, tmp_path, content):
    with objects.batch() as batch:
        digest = batch.put_bytes(content)
    assert digest == hashlib.sha256(content).hexdigest()
    assert objects.has(digest)
    other = a_replica(database, tmp_path, "other")
    assert other.has(digest)
    assert other.read_bytes(digest) == content
    assert b"".join(other.iter_chunks(digest)) == content
    assert stored_rows(database, digest) == (1, max(1, -(-len(content) // MIB)))


def test_files_are_streamed_in_and_deduplicated(objects, database, tmp_path):
    content = incompressible(2 * MIB + 5, b"file")
    source = tmp_path / "big.bin"
    source.write_bytes(content)
    with objects.batch() as batch:
        fd = os.open(source, os.O_RDONLY)
        try:
            digest, size = batch.put_fd(fd, len(content))
        finally:
            os.close(fd)
        assert batch.put_bytes(content) == digest
    assert (digest, size) == (hashlib.sha256(content).hexdigest(), len(content))
    assert stored_rows(database, digest) == (1, 3)
    with objects.batch() as batch:
        assert batch.put_bytes(content) == digest
    assert stored_rows(database, digest) == (1, 3)
    assert objects.read_bytes(digest) == content
    assert list(objects.staging.iterdir()) == []


def test_staged_objects_are_readable_before_commit_and_gone_after_abort(objects, database, tmp_path):
    big = incompressible(MIB + 100, b"staged")
    with pytest.raises(RuntimeError), objects.batch() as batch:
        small_digest = batch.put_bytes(b"staged small")
        big_digest = batch.put_bytes(big)
        assert objects.read_bytes(small_digest) == b"staged small"
        assert objects.read_bytes(big_digest) == big
        assert not objects.has(small_digest) and batch.reuse(small_digest)
        raise RuntimeError("abort the batch")
    assert not objects.has(small_digest) and not objects.has(big_digest)
    assert stored_rows(database, big_digest) == (0, 0)
    with pytest.raises(DataLoss):
        objects.read_bytes(small_digest)
    assert list(objects.staging.iterdir()) == []


@pytest.mark.parametrize("size", [100, MIB + 100], ids=["small", "large"])
def test_an_object_two_open_batches_staged_stays_readable_when_one_of_them_aborts(objects, size):
    """Two diffs write the same new tree node, each into a batch it reads back and aborts: the
    first one's abort leaves the second's copy readable (as in the disk store)."""
    content = incompressible(size, b"twice")
    first, second = objects.batch(), objects.batch()
    digest = first.put_bytes(content)
    assert second.put_bytes(content) == digest
    first.abort()
    try:
        assert objects.read_bytes(digest) == content
    finally:
        second.abort()
    with pytest.raises(DataLoss):
        objects.read_bytes(digest)
    assert list(objects.staging.iterdir()) == []


def test_when_finished_reports_commit_and_abort(objects):
    outcomes: list[bool] = []
    with objects.batch() as batch:
        batch.when_finished(outcomes.append)
        batch.put_bytes(b"one")
    batch = objects.batch()
    batch.when_finished(outcomes.append)
    batch.put_bytes(b"two")
    batch.abort()
    assert outcomes == [True, False]


def test_threads_writing_one_batch_store_each_object_once(objects, database):
    contents = [incompressible(2000, bytes([i % 7])) for i in range(70)]
    with objects.batch() as batch:
        threads = [threading.Thread(target=lambda c=chunk: batch.put_bytes(c)) for chunk in contents]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(objects.iter_digests()) == sorted({hashlib.sha256(c).hexdigest() for c in contents})


def test_corrupt_or_missing_chunks_are_data_loss(objects, database):
    with objects.batch() as batch:
        digest = batch.put_bytes(incompressible(MIB + 10, b"corrupt"))
    with database.engine.begin() as connection:
        connection.execute(text("UPDATE object_chunks SET data = :data WHERE digest = :d AND seq = 1"),
                           {"data": b"garbage", "d": digest})
    with pytest.raises(DataLoss, match="corrupt"):
        objects.read_bytes(digest)
    with database.engine.begin() as connection:
        connection.execute(text("DELETE FROM object_chunks WHERE digest = :d AND seq = 1"), {"d": digest})
    with pytest.raises(DataLoss, match="missing chunk 1"):
        objects.read_bytes(digest)


def test_a_corrupt_compressed_object_is_data_loss(objects, database):
    with objects.batch() as batch:
        digest = batch.put_bytes(b"compress me " * 100)
    with database.engine.begin() as connection:
        connection.execute(text("UPDATE object_chunks SET data = :data WHERE digest = :d"),
                           {"data": b"not zlib", "d": digest})
    with pytest.raises(DataLoss, match="unreadable"):
        objects.read_bytes(digest)


def test_a_compressed_row_that_inflates_past_a_chunk_is_data_loss_not_inflated(objects, database):
    """Objects are compressed only up to one chunk (1 MiB): a row that inflates further is damaged
    and is refused before its content is held in memory whole."""
    with objects.batch() as batch:
        digest = batch.put_bytes(b"compress me " * 100)
    with database.engine.begin() as connection:
        connection.execute(text("UPDATE object_chunks SET data = :data WHERE digest = :d"),
                           {"data": zlib.compress(bytes(64 * MIB), 9), "d": digest})
    with pytest.raises(DataLoss, match="inflates past"):
        objects.read_bytes(digest)


def test_delete_and_iter_digests(objects):
    with objects.batch() as batch:
        digests = [batch.put_bytes(b"object %d" % i) for i in range(5)]
    assert sorted(objects.iter_digests()) == sorted(digests)
    deletions = objects.deletions
    objects.delete(digests[0])
    assert objects.deletions != deletions
    assert not objects.has(digests[0])
    assert sorted(objects.iter_digests()) == sorted(digests[1:])


def test_a_collection_on_one_replica_is_seen_by_the_others_cache(pg_url, tmp_path):
    """A replica that saw an object (and remembers it) must not trust that after another
    replica's garbage collection deleted it. (PostgreSQL only: a SQLite file has one server.)"""
    database = Database(pg_url)
    database.migrate()
    objects = a_replica(database, tmp_path, "referencing")
    with objects.referencing():
        with objects.batch() as batch:
            digest = batch.put_bytes(b"soon collected")
        assert objects.has(digest)
    deletions = objects.deletions
    collector = a_replica(database, tmp_path, "collector")
    with collector.collecting():
        collector.delete(digest)
    with objects.referencing():
        assert not objects.has(digest)
        with objects.batch() as batch:
            assert not batch.reuse(digest)
            batch.put_bytes(b"soon collected")
    assert objects.deletions != deletions
    assert objects.read_bytes(digest) == b"soon collected"
    database.dispose()


def test_a_collection_that_deletes_nothing_leaves_the_replicas_caches_alone(pg_url, tmp_path):
    """Only a deletion makes the other replicas forget what they saw (and their next captures
    scan fully): a collection that deleted nothing changes no replica's ``deletions``."""
    database = Database(pg_url)
    database.migrate()
    objects = a_replica(database, tmp_path, "referencing")
    with objects.referencing(), objects.batch() as batch:
        digest = batch.put_bytes(b"kept")
    deletions = objects.deletions
    collector = a_replica(database, tmp_path, "collector")
    with collector.collecting():
        pass
    with objects.referencing():
        assert objects.has(digest)
    assert objects.deletions == deletions
    database.dispose()


def waiting_advisory_locks(database: Database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                                       " AND database = (SELECT oid FROM pg_database WHERE datname = "
                                       "current_database())")).scalar()


def test_collection_waits_for_every_replica_that_is_referencing(pg_url, tmp_path):
    """It waits without queueing for the lock (a queued request would hold back every replica's
    new captures behind one that may be stuck), and within its patience when it has one."""
    database = Database(pg_url)
    database.migrate()
    referencing, collecting = a_replica(database, tmp_path, "a"), a_replica(database, tmp_path, "b")
    entered = threading.Event()
    attempts: list[int] = []

    def collect() -> None:
        with collecting.collecting():
            entered.set()

    try:
        with referencing.referencing():
            with pytest.raises(store.Postponed, match="another replica"), collecting.collecting(patience=0.2):
                pytest.fail("collected while another replica references the store")
            collector = threading.Thread(target=collect)
            collector.start()
            for _ in range(20):
                attempts.append(waiting_advisory_locks(database))
                assert collector.is_alive() and not entered.is_set()
                time.sleep(0.01)
            with referencing.referencing():
                pass  # a second user on the referencing replica is not held back by the collection
        collector.join(timeout=60)
        assert entered.is_set()
        assert attempts == [0] * len(attempts), "the collection queued for the lock"
    finally:
        database.dispose()


def test_open_store_refuses_unknown_kinds(database, tmp_path):
    assert isinstance(open_store(StoreKind.DB.value, database, tmp_path), DatabaseStore)
    assert isinstance(open_store("disk", database, tmp_path), store.ContentStore)
    with pytest.raises(ValueError, match="'s3' is not a valid StoreKind"):
        open_store("s3", database, tmp_path)


@pytest.mark.timeout(120)
def test_a_replica_that_never_stops_referencing_still_lets_a_collection_in(pg_url, tmp_path):
    """Two threads take turns so that this replica always has a user of the fence; the waiting
    collection on another replica must still get its turn (the fence is let go between turns)."""
    database = Database(pg_url)
    database.migrate()
    busy, collector = a_replica(database, tmp_path, "busy"), a_replica(database, tmp_path, "gc")
    collected = threading.Event()
    overlap = threading.Semaphore(0)

    def keep_referencing() -> None:
        while not collected.is_set():
            with busy.referencing():
                overlap.release()
                overlap.acquire(timeout=0.05)
                with busy.batch() as batch:
                    batch.put_bytes(os.urandom(64))

    workers = [threading.Thread(target=keep_referencing) for _ in range(2)]
    try:
        for worker in workers:
            worker.start()
        with collector.collecting():
            collected.set()
    finally:
        collected.set()
        for worker in workers:
            worker.join()
        database.dispose()
    assert collected.is_set()


def test_stored_size_counts_the_stored_bytes(objects):
    with objects.batch() as batch:
        compressible = batch.put_bytes(b"z" * 100_000)
        raw = batch.put_bytes(incompressible(MIB + 3))
    assert 0 < objects.stored_size(compressible) < 100_000
    assert objects.stored_size(raw) == MIB + 3
    assert objects.stored_size("0" * 64) is None
    # In bulk, more than one query's worth: the same figures, and nothing for what is not stored.
    with objects.batch() as batch:
        many = [batch.put_bytes(b"object %d " % n * 50) for n in range(1200)]
    staged = objects.batch()
    pending = staged.put_bytes(b"not committed")
    wanted = [compressible, raw, "0" * 64, pending, *many]
    assert objects.stored_sizes(wanted) == {digest: objects.stored_size(digest)
                                            for digest in (compressible, raw, *many)}
    staged.abort()


def held_advisory_locks(database: Database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                                       "AND database = (SELECT oid FROM pg_database WHERE datname = "
                                       "current_database())")).scalar()


def test_close_lets_go_of_the_replica_fence_at_once(pg_url, tmp_path):
    database = Database(pg_url)
    database.migrate()
    objects = a_replica(database, tmp_path, "closing")
    try:
        with objects.referencing():
            assert held_advisory_locks(database) == 1
        objects.close()
        assert held_advisory_locks(database) == 0
    finally:
        database.dispose()
