"""The content store kept in the metadata database (``--store db``), so replicas on one
PostgreSQL need no shared file system.

Same interface and guarantees as ``store.ContentStore``: objects are named by the SHA-256
of their content; a ``Batch`` stages them (small ones in memory, large ones in a local
temporary file) and ``Batch.commit`` writes them all in one database transaction, which a
caller commits before the metadata that references them. Staged objects are readable
before their batch commits. Each object is an ``objects`` row plus 1 MiB ``object_chunks``
(one zlib-compressed chunk when that is smaller), inserted in the same transaction.

The GC fence spans replicas: ``referencing`` holds a shared PostgreSQL advisory lock while
any thread of this process references objects (and a moment longer, for the next one), and
``collecting`` an exclusive one. While a process holds the shared lock no replica can
collect, so it trusts the digests it has seen committed without asking the database again.
A collection never queues for the exclusive lock (a queued request would hold back every
replica's shared ones): it tries, for a bounded time, and is postponed if it cannot have it.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from checkpointd.core.kernel.cancellation import NEVER, Cancellation
from checkpointd.core.kernel.errors import DataLoss, Reason, ResourceExhausted
from checkpointd.core.kernel.private_files import private_dir, private_opener
from checkpointd.core.metadata.db import AdvisoryLock, Database
from checkpointd.core.metadata.models import ContentStoreStateRow, ObjectChunkRow, ObjectRow, utcnow
from checkpointd.core.store.content_store import (
    ContentStore,
    Postponed,
    SharedExclusiveLock,
    UnreadableSource,
    read_source,
    read_source_chunk,
    run_finish_callbacks,
)
from checkpointd.core.store.packs import zlib_decompress
from checkpointd.core.store.replica_fence import FENCE_LOCK, ReplicaFence
from checkpointd.core.store.staging import StagedObjects

_RAW = "R"
_ZLIB = "Z"
#: Objects up to this size are compressed in memory when that makes them smaller; also the chunk size.
_CHUNK = 1 << 20
#: Digests remembered as present; the set is dropped when it grows past this.
_KNOWN_LIMIT = 500_000
#: Chunk bytes sent to the database in one round trip.
_INSERT_BUFFER = 8 << 20
#: PostgreSQL SQLSTATE class 53: insufficient resources (disk full, out of memory, too many connections).
_SQLSTATE_RESOURCES = "53"

_objects = ObjectRow.__table__
_chunks = ObjectChunkRow.__table__
_state = ContentStoreStateRow.__table__
#: A collection's writes on PostgreSQL, run by the driver on its lock's session (``delete``).
_BUMP_GC_EPOCH = f"UPDATE {_state.name} SET gc_epoch = gc_epoch + 1 WHERE id = 1"
_DELETE_OBJECT = f"DELETE FROM {_objects.name} WHERE digest = %s"
_DELETE_CHUNKS = f"DELETE FROM {_chunks.name} WHERE digest = %s"


class StoreKind(enum.StrEnum):
    """Where content lives: files under the data dir, or rows in the metadata database."""

    DISK = "disk"
    DB = "db"


def open_store(kind: str, db: Database, data_dir: Path) -> ContentStore | DatabaseStore:
    """The content store the server was configured with; unknown kinds are refused."""
    match StoreKind(kind):
        case StoreKind.DISK:
            return ContentStore(data_dir / "store")
        case StoreKind.DB:
            return DatabaseStore(db, data_dir / "db-store-staging")


def _storage_error(exc: Exception) -> Exception:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(Reason.STORAGE_EXHAUSTED, f"content store staging is full: {exc.strerror}")
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None) or ""
    if sqlstate.startswith(_SQLSTATE_RESOURCES):
        return ResourceExhausted(Reason.STORAGE_EXHAUSTED, f"the database cannot store more content: {exc}")
    return exc


@dataclass(frozen=True)
class _Staged:
    """An object written by an open batch: its encoded body in memory, or raw in a temporary file."""

    encoding: str
    size: int
    body: bytes | None = None
    path: Path | None = None

    def chunks(self) -> Iterator[bytes]:
        """The stored chunks, as they will be inserted."""
        if self.body is not None:
            yield self.body
            return
        with open(self.path, "rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk


class DatabaseStore(ReplicaFence):
    def __init__(self, db: Database, staging: Path) -> None:
        self.db = db
        self.staging = staging
        private_dir(self.staging, parents=True)
        self._clear_staging()
        self._staged: StagedObjects[_Staged] = StagedObjects()
        self._local_fence = SharedExclusiveLock()
        self._replica_fence = db.advisory_lock(FENCE_LOCK, shared=True)
        #: Guards the replica fence's state below and ``_known``.
        self._fence = threading.Condition()
        #: This process's users of the replica fence: token -> when it entered (monotonic seconds).
        self._fence_users: dict[object, float] = {}
        self._fence_held_since: float | None = None
        self._fence_last_left = 0.0
        self._fence_keeper: threading.Thread | None = None
        #: A commit found the fence's session lost (``confirm_fence``): it is taken afresh.
        self._fence_lost = False
        #: While a collection runs here on PostgreSQL: its exclusive lock, whose session deletes.
        self._collector_lock: AdvisoryLock | None = None
        self._closed = False
        #: Digests seen committed. Trusted only while this process holds the replica fence,
        #: during which no replica can collect; forgotten when a collection happened meanwhile.
        self._known: set[str] = set()
        #: Bumped whenever ``_known`` is dropped, so a look-up that raced a drop is not remembered.
        self._generation = 0
        self._gc_epoch: int | None = None
        #: Whether the running collection has bumped the GC epoch (its first ``delete`` does).
        self._epoch_bumped = False
        self._deletions = 0

    def _clear_staging(self) -> None:
        """Leftovers of an interrupted batch were never referenced; drop them."""
        for leftover in self.staging.iterdir():
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    # -- reading ------------------------------------------------------------------------

    def _seen(self, digest: str) -> bool:
        """Known committed without asking the database (trusted while the replica fence is held)."""
        return self._fence_held_since is not None and not self._fence_lost and digest in self._known

    def has(self, digest: str) -> bool:
        generation = self._generation
        if self._seen(digest):
            return True
        with self.db.engine.connect() as connection:
            found = connection.execute(select(_objects.c.digest).where(_objects.c.digest == digest)).first()
        if found is not None:
            self._remember([digest], generation)
        return found is not None

    def _remember(self, digests: list[str], generation: int) -> None:
        """Remembers digests seen committed, unless the fence was let go or ``_known`` dropped since."""
        with self._fence:
            if self._fence_held_since is None or generation != self._generation:
                return
            if len(self._known) + len(digests) > _KNOWN_LIMIT:
                self._forget_known()
            self._known.update(digests)

    def _forget_known(self) -> None:
        """Called with ``_fence`` held."""
        self._known.clear()
        self._generation += 1

    def batch(self) -> Batch:
        return Batch(self)

    def read_bytes(self, digest: str) -> bytes:
        return b"".join(self.iter_chunks(digest))

    def iter_chunks(self, digest: str) -> Iterator[bytes]:
        """Yields an object's content, verifying its digest as it goes."""
        hasher = hashlib.sha256()
        for chunk in self._content(digest):
            hasher.update(chunk)
            yield chunk
        if hasher.hexdigest() != digest:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is corrupt", digest=digest)

    def _content(self, digest: str) -> Iterator[bytes]:
        """A committed object, or one still staged by an open batch (checked between two
        looks at the database, as the batch may commit and forget it in between)."""
        first = self._first_chunk(digest)
        if first is None:
            staged = self._staged.first(digest)
            if staged is not None:
                try:
                    opened = open(staged.path, "rb") if staged.path else None  # noqa: SIM115 - closed below
                except FileNotFoundError:
                    opened = None
                if staged.body is not None or opened is not None:
                    yield from _decode(staged.encoding, _staged_chunks(staged, opened), digest)
                    return
            first = self._first_chunk(digest)
            if first is None:
                raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is missing", digest=digest)
        encoding, chunk_count, data = first
        yield from _decode(encoding, self._committed_chunks(digest, chunk_count, data), digest)

    def _first_chunk(self, digest: str) -> tuple[str, int, bytes] | None:
        query = (select(_objects.c.encoding, _objects.c.chunk_count, _chunks.c.data)
                 .join(_chunks, (_chunks.c.digest == _objects.c.digest) & (_chunks.c.seq == 0))
                 .where(_objects.c.digest == digest))
        with self.db.engine.connect() as connection:
            row = connection.execute(query).first()
        return None if row is None else (row[0], row[1], bytes(row[2]))

    def _committed_chunks(self, digest: str, chunk_count: int, first: bytes) -> Iterator[bytes]:
        """One query per further chunk: memory stays at one chunk and no connection is held between them."""
        yield first
        for seq in range(1, chunk_count):
            with self.db.engine.connect() as connection:
                data = connection.execute(
                    select(_chunks.c.data).where(_chunks.c.digest == digest, _chunks.c.seq == seq)).scalar()
            if data is None:
                raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is missing chunk {seq}", digest=digest)
            yield bytes(data)

    # -- removal ------------------------------------------------------------------------

    @property
    def deletions(self) -> int:
        """Changes whenever objects may have been deleted, here or (as seen when this process
        takes the GC fence) by another replica's collection: whoever caches "this object
        exists" can tell it may be stale."""
        return self._deletions

    def compact_mostly_dead(self) -> None:
        """Nothing to compact: the database store keeps no packs (a deleted row is the database's
        to reuse)."""

    def delete(self, digest: str) -> None:
        """Called under ``collecting``; the first delete of a collection bumps the GC epoch in
        its transaction, so every replica forgets what it knew once it takes the fence again."""
        with self._fence:
            self._forget_known()
            self._deletions += 1
        collector = self._collector_lock
        if collector is not None and collector.holder is not None:
            # PostgreSQL: on the session holding the collection's lock (see ``collecting``).
            statements = [] if self._epoch_bumped else [(_BUMP_GC_EPOCH, ())]
            try:
                collector.run_in_session([*statements, (_DELETE_OBJECT, (digest,)), (_DELETE_CHUNKS, (digest,))])
            except DBAPIError as exc:
                # Most likely the database ended that session: nothing more may be deleted under it.
                raise Postponed(f"deleting on the session holding the collection's lock failed ({exc.orig}); "
                                f"{digest} and the rest were not deleted") from exc
        else:
            with self.db.engine.begin() as connection:
                if not self._epoch_bumped:
                    connection.execute(update(_state).where(_state.c.id == 1)
                                       .values(gc_epoch=_state.c.gc_epoch + 1))
                connection.execute(delete(_objects).where(_objects.c.digest == digest))
                connection.execute(delete(_chunks).where(_chunks.c.digest == digest))
        self._epoch_bumped = True

    def stored_size(self, digest: str) -> int | None:
        """Bytes a committed object takes in the store (its chunks, compressed); None if it is not stored."""
        return self.stored_sizes([digest]).get(digest)

    def stored_sizes(self, digests: Iterable[str]) -> dict[str, int]:
        """``stored_size`` of each of ``digests`` that is stored, asked for 500 at a time."""
        wanted = list(digests)
        sizes: dict[str, int] = {}
        with self.db.engine.connect() as connection:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start:start + 500]
                query = (select(_chunks.c.digest, func.sum(func.length(_chunks.c.data)))
                         .join(_objects, _objects.c.digest == _chunks.c.digest)
                         .where(_chunks.c.digest.in_(chunk)).group_by(_chunks.c.digest))
                sizes.update((digest, int(size)) for digest, size in connection.execute(query))
        return sizes

    def close(self) -> None:
        """Lets go of the replica fence (the store is unusable afterwards)."""
        with self._fence:
            self._closed = True
            if self._fence_held_since is not None and not self._fence_users:
                self._let_go_of_replica_fence()
            self._fence.notify_all()

    def damage(self) -> list[tuple[str, str]]:
        """What is wrong with the store's bookkeeping, as (subject, detail): an object whose
        row counts more or fewer chunks than the database holds."""
        counted = (select(_chunks.c.digest, func.count().label("chunks")).group_by(_chunks.c.digest).subquery())
        query = (select(_objects.c.digest, _objects.c.chunk_count, func.coalesce(counted.c.chunks, 0))
                 .join(counted, counted.c.digest == _objects.c.digest, isouter=True)
                 .where(func.coalesce(counted.c.chunks, 0) != _objects.c.chunk_count))
        with self.db.engine.connect() as connection:
            return [(digest, f"has {held} of its {expected} chunks")
                    for digest, expected, held in connection.execute(query)]

    def iter_digests(self) -> Iterator[str]:
        with self.db.engine.connect() as connection:
            result = connection.execution_options(yield_per=1000).execute(select(_objects.c.digest))
            for (digest,) in result:
                yield digest

    # -- writing (used by Batch) --------------------------------------------------------

    def _insert(self, connection: Connection, pending: dict[str, _Staged]) -> None:
        """Inserts the objects no other batch (maybe another replica's) has, then their chunks.

        Digests go in sorted order, so two replicas storing overlapping objects wait for
        each other instead of deadlocking.
        """
        dialect = postgresql if self.db.is_postgresql else sqlite
        rows = [{"digest": digest, "size": staged.size, "encoding": staged.encoding,
                 "chunk_count": _chunk_count(staged), "create_time": utcnow()}
                for digest, staged in sorted(pending.items())]
        statement = (dialect.insert(_objects).on_conflict_do_nothing(index_elements=["digest"])
                     .returning(_objects.c.digest))
        inserted = set(connection.execute(statement, rows).scalars())
        chunks: list[dict[str, object]] = []
        buffered = 0
        for digest in sorted(inserted):
            for seq, chunk in enumerate(pending[digest].chunks()):
                chunks.append({"digest": digest, "seq": seq, "data": chunk})
                buffered += len(chunk)
                if buffered >= _INSERT_BUFFER:
                    connection.execute(insert(_chunks), chunks)
                    chunks, buffered = [], 0
        if chunks:
            connection.execute(insert(_chunks), chunks)


def _chunk_count(staged: _Staged) -> int:
    if staged.body is not None:
        return 1
    return max(1, -(-staged.size // _CHUNK))


def _staged_chunks(staged: _Staged, opened) -> Iterator[bytes]:
    if opened is None:
        yield staged.body
        return
    with opened:
        while chunk := opened.read(_CHUNK):
            yield chunk


def _decode(encoding: str, chunks: Iterator[bytes], digest: str) -> Iterator[bytes]:
    if encoding == _ZLIB:
        try:
            yield zlib_decompress(b"".join(chunks))  # held to 1 MiB: a damaged row is no zlib bomb
        except zlib.error as exc:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is unreadable: {exc}", digest=digest) from None
    elif encoding == _RAW:
        yield from chunks
    else:
        raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} has unknown encoding {encoding!r}", digest=digest)


class Batch:
    """Objects written together and committed together, in one transaction (see module docstring).

    Several threads of one capture may write into the same batch.
    """

    #: The token of the operation the batch is written for (see ``kernel.cancellation``; a capture
    #: sets it): a large file's read stops between its chunks once the caller gave up.
    cancel: Cancellation = NEVER

    def __init__(self, store: DatabaseStore) -> None:
        self.store = store
        self._pending: dict[str, _Staged] = {}
        self._finished: list[Callable[[bool], None]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def when_finished(self, callback: Callable[[bool], None]) -> None:
        """Calls ``callback(committed)`` once the batch is committed (True) or aborted (False)."""
        self._finished.append(callback)

    def reuse(self, digest: str) -> bool:
        """Whether ``digest`` is already stored (committed, or written by this batch), so a
        caller that knows the content's digest may reference it without writing it again."""
        return digest in self._pending or self.store.has(digest)

    def _publish(self, digest: str, staged: _Staged) -> None:
        """Records a written object, unless another thread of this batch was first."""
        with self._lock:
            first = digest not in self._pending
            if first:
                self._pending[digest] = staged
        if not first:
            if staged.path is not None:
                staged.path.unlink(missing_ok=True)
            return
        self.store._staged.add_all([(digest, staged)])

    def put_bytes(self, data: bytes, similar: str = "") -> str:
        """Stores ``data``. ``similar`` (a previous version) is accepted for the
        disk store's deltas and ignored: the database keeps whole objects.

        Small objects are not looked up in the database (only in what this process knows):
        inserting one that exists costs less than the round trip, and the insert skips it."""
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._pending or self.store._seen(digest) or (len(data) > _CHUNK and self.store.has(digest)):
            return digest
        packed = zlib.compress(data, 1) if len(data) <= _CHUNK else data
        if len(packed) < len(data):
            self._publish(digest, _Staged(_ZLIB, len(data), body=packed))
        elif len(data) <= _CHUNK:
            self._publish(digest, _Staged(_RAW, len(data), body=bytes(data)))
        else:
            self._publish(digest, self._spill(data))
        return digest

    def put_whole(self, data: bytes) -> str:
        """As ``put_bytes``: the database keeps every object whole, and finds none by similarity."""
        return self.put_bytes(data)

    def put_fd(self, src_fd: int, expected_size: int, similar: str = "") -> tuple[str, int]:
        """Stores the content readable from ``src_fd``; returns (digest, size read). ``similar``
        is ignored, as in ``put_bytes``."""
        if expected_size <= _CHUNK:
            data = read_source(src_fd, expected_size)
            return self.put_bytes(data), len(data)
        hasher = hashlib.sha256()
        path = self.store.staging / uuid.uuid4().hex
        size = 0
        try:
            with open(path, "xb", opener=private_opener) as out:
                while chunk := read_source_chunk(src_fd, _CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    self.cancel.check()
        except BaseException as exc:  # a failed read or write, the caller gave up, or worse: nothing is kept
            path.unlink(missing_ok=True)
            if isinstance(exc, OSError) and not isinstance(exc, UnreadableSource):
                raise _storage_error(exc) from exc
            raise
        digest = hasher.hexdigest()
        if self.reuse(digest):
            path.unlink()
        else:
            self._publish(digest, _Staged(_RAW, size, path=path))
        return digest, size

    def _spill(self, data: bytes) -> _Staged:
        """A large in-memory object goes to a temporary file like a streamed one."""
        path = self.store.staging / uuid.uuid4().hex
        try:
            with open(path, "xb", opener=private_opener) as out:
                out.write(data)
        except OSError as exc:
            path.unlink(missing_ok=True)
            raise _storage_error(exc) from exc
        return _Staged(_RAW, len(data), path=path)

    def commit(self) -> None:
        if self._pending:
            generation = self.store._generation
            try:
                with self.store.db.engine.begin() as connection:
                    self.store._insert(connection, self._pending)
            except BaseException as exc:
                self.abort()
                if isinstance(exc, DBAPIError | OSError):
                    raise _storage_error(exc) from exc
                raise
            self.store._remember(list(self._pending), generation)
        self._forget()
        self._finish(True)

    def abort(self) -> None:
        self._forget()
        self._finish(False)

    def _forget(self) -> None:
        """Drops the staged objects (after a commit too: they are in the database then)."""
        for digest, staged in self._pending.items():
            self.store._staged.remove(digest, staged)
        for staged in self._pending.values():
            if staged.path is not None:
                staged.path.unlink(missing_ok=True)
        self._pending.clear()

    def _finish(self, committed: bool) -> None:
        callbacks, self._finished = self._finished, []
        run_finish_callbacks(callbacks, committed)


