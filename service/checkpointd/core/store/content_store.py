"""Content-addressed, deduplicated object store shared by all plans.

Objects are named by the SHA-256 of their content. Small objects (up to 1 MiB: nearly
every file and every tree node) are appended to pack files, ``packs/pack-NNNNNN.pack``;
creating one file per object costs far more than writing it on most file systems, and a
pack is made durable by a single ``fdatasync``. Larger objects are streamed to their own
file, ``objects/ab/cdef…`` ("loose"), which is also where stores written before packs
keep everything; both kinds are read the same way.

Writes go through a ``Batch``. Its objects are readable at once but counted as stored
(``has``) only once ``Batch.commit`` has made them durable: the pack is synced (one
``fdatasync`` shared by every batch committing at that moment), large objects are synced
and renamed from the staging directory to their final names. A caller commits metadata
that references objects only after ``Batch.commit`` returns.

A pack record is ``digest (32 bytes) | kind (1) | length (4, big-endian) | body``; kind
``R`` is raw content, ``S`` zstd, ``Z`` zlib (written before zstd, still read), ``Y`` a delta
(zstd), ``X`` a zlib delta (written before zstd deltas, still read), ``D`` a deletion (no body).
A delta's base is the object's previous version when the caller names one (a file's, a directory
node's) and that pays, else a committed object found like it by content (``similar``: a renamed
or copied file, a new directory). Each pack's header carries the length known to be durable; on
open, records past it are verified and a torn tail is cut off.

Packs are replayed in order on open, the last record of a digest winning and a deletion
(tombstone) ending every record of it before. A compaction that removes a pack therefore
carries its tombstones forward while an older pack may still hold a record they end, and
once every pack is read, a delta whose chain of bases does not end in a stored whole object
is dropped (an earlier record of the same object that resolves is used instead): an object
is never counted as stored when it cannot be read.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import itertools
import logging
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zstandard

from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.cancellation import NEVER, Cancellation
from checkpointd.core.kernel.errors import DataLoss, Reason
from checkpointd.core.kernel.private_files import PRIVATE_DIR, private_dir
from checkpointd.core.store.compaction import Compaction
from checkpointd.core.store.pack_replay import PackReplay
from checkpointd.core.store.packs import (
    BODY_ERRORS,
    DELTA,
    DELTA_HEADER,
    DELTAS,
    MAX_CHAIN_LINKS,
    MAX_DELTA_DEPTH,
    PACK_HEADER,
    PACK_MAGIC,
    ZSTD_DELTA,
    Location,
    Pack,
    Recovery,
    dead_key,
    fsync_dir,
    storage_error,
    zlib_decompress,
    zstd_decompress,
    zstd_decompress_chain,
)
from checkpointd.core.store.retired_packs import RetiredPacks
from checkpointd.core.store.similar import SimilarIndex, anchors
from checkpointd.core.store.staging import StagedObjects
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT, RAW, RECORD, ZLIB, ZSTD, pack_body

if TYPE_CHECKING:
    from checkpointd.core.metadata.rows import RowWriter

log = logging.getLogger("checkpointd.store")

#: How many bases deep the reads of this thread are (``_base``).
_chain_reads = threading.local()
#: zstd's level for deltas: 9 makes them ~10% smaller than 3. Where the content and its base
#: together are small, 9 switches zstd to a binary-tree match finder, 3x slower to load the base
#: into, for deltas no smaller than 8's (measured on 263 edits of this repository's files).
_ZSTD_DELTA_LEVEL = 9
_ZSTD_SMALL_DELTA_LEVEL = 8
_SMALL_DELTA_BYTES = 16 << 10
#: A delta that is not under a quarter of its content is kept only when it is under this share
#: of the content compressed on its own.
_DELTA_GAIN = 0.9
#: zstd's level for whole objects written here (a file new or changed since the last checkpoint,
#: a directory node): on this repository's sources 5% smaller than level 2 at level 5 and 1.2% more
#: at 7, for 110 µs an object instead of 67 (5 KiB on average; a first capture of 123 files takes
#: ~5 ms longer). Reader processes (a first capture of thousands of files, whose speed matters
#: most) keep level 2.
_ZSTD_WHOLE_LEVEL = 7
#: zstd's level for objects ``put_whole`` writes (dropped with their batch: speed over size).
_ZSTD_FAST_LEVEL = 1
#: Smaller objects are not looked up in the similarity index (nothing to gain).
_SEARCH_MIN_BYTES = 64
_CHUNK = 1 << 20

#: A pack stops taking new records past this size; a new one is started. Tests shrink it
#: (``CHECKPOINTD_PACK_ROTATE_BYTES``) to make a server rotate and compact packs within a test.
PACK_ROTATE_BYTES = int(os.environ.get("CHECKPOINTD_PACK_ROTATE_BYTES") or 256 << 20)
#: How many large objects a commit syncs one by one before a whole-file-system sync is cheaper.
_SYNCFS_THRESHOLD = 16

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _syncfs(fd: int) -> None:
    """Flush one file system (Linux syncfs); falls back to a global sync elsewhere."""
    syncfs = getattr(_libc, "syncfs", None)
    if syncfs is None or syncfs(fd) != 0:
        os.sync()


def delta_level(size: int, base_size: int) -> int:
    """zstd's level for a delta of ``size`` bytes against a base of ``base_size``."""
    return _ZSTD_SMALL_DELTA_LEVEL if size + base_size <= _SMALL_DELTA_BYTES else _ZSTD_DELTA_LEVEL


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SharedExclusiveLock:
    """Many holders of the shared side, or one of the exclusive side (writers first, or, with a
    patience, as long as no shared holder looks stuck)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: Shared holders: token -> when it entered (monotonic seconds).
        self._holders: dict[int, float] = {}
        self._tokens = itertools.count()
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            token = self._enter()
        try:
            yield
        finally:
            self._release_shared(token)

    def try_shared(self) -> Callable[[], None] | None:
        """The shared side if it can be had without waiting: its release, else None."""
        with self._cond:
            if self._exclusive:
                return None
            token = self._enter()
        return functools.partial(self._release_shared, token)

    def _enter(self) -> int:
        token = next(self._tokens)
        self._holders[token] = time.monotonic()
        return token

    def _release_shared(self, token: int) -> None:
        with self._cond:
            del self._holders[token]
            self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, patience: float | None = None) -> Iterator[None]:
        """Without ``patience``, waits as long as the shared holders take, holding back new ones.
        With it, raises ``Postponed`` rather than wait on a holder that looks stuck (see ``_take``)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            if patience is None:
                self._exclusive = True
                self._cond.wait_for(lambda: not self._holders)
            elif not self._take(patience):
                raise Postponed(f"a holder of the shared side has held it for over {patience:g}s")
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def _take(self, patience: float) -> bool:
        """Called with ``_cond`` held. First waits up to ``patience`` for a moment with no shared
        holder, holding back no one; then holds back new holders while the present ones finish,
        unless one of them has held the lock for ``patience`` already (it entered before the wait
        began and may never leave), and gives up once one has. New holders are so held back for
        less than ``patience``, and never behind a holder that was stuck when this began."""
        if self._cond.wait_for(lambda: not self._holders, timeout=patience):
            self._exclusive = True
            return True
        self._exclusive = True
        while self._holders:
            stuck_at = min(self._holders.values()) + patience
            remaining = stuck_at - time.monotonic()
            if remaining <= 0:
                self._exclusive = False
                self._cond.notify_all()
                return False
            self._cond.wait(remaining)
        return True


class Postponed(RuntimeError):
    """The exclusive side was not taken within its patience: a shared holder may be stuck."""


def _inflated(f, digest: str) -> Iterator[bytes]:
    """A loose zlib object's content (stores from before packs), a chunk at a time: such objects
    may be large, and a damaged one must not be inflated whole before its digest is checked."""
    decompressor = zlib.decompressobj()
    try:
        while compressed := f.read(_CHUNK):
            while compressed:
                chunk = decompressor.decompress(compressed, _CHUNK)
                compressed = decompressor.unconsumed_tail  # left over only when the chunk is full
                if chunk:
                    yield chunk
        if not decompressor.eof:
            raise zlib.error("the object ends before its zlib stream does")
    except zlib.error as exc:
        raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is unreadable: {exc}", digest=digest) from exc


class ContentStore(PackReplay, Compaction):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.staging = root / "staging"
        self.packs_dir = root / "packs"
        private_dir(root, parents=True)
        for directory in (self.objects, self.staging, self.packs_dir):
            private_dir(directory)
        self._clear_staging()
        #: Committed objects: durable, counted by ``has``.
        self._committed: dict[str, Location] = {}
        #: Objects written by open batches, readable before they are committed.
        self._staged: StagedObjects[Location] = StagedObjects()
        #: Held while a batch's objects join ``_committed`` (see ``Batch._keep_records_committed_meanwhile``).
        self._commit_lock = threading.Lock()
        self._gc_fence = SharedExclusiveLock()
        self._packs: list[Pack] = []
        self._active: Pack | None = None
        self._pack_lock = threading.Lock()
        #: Bytes of records in each pack that nothing indexes any more (deleted or superseded).
        self._dead: dict[Pack, int] = {}
        #: Which objects have such a dead record in each pack (the first 64 bits of their digest):
        #: whether a compacted pack's tombstone still ends a record somewhere older.
        self._dead_keys: dict[Pack, set[int]] = {}
        #: Compacted packs, already unlinked; open while reads that may use them are on.
        self._retired = RetiredPacks()
        #: Bumped by every ``delete``: whoever caches "this object exists" can tell it may be stale.
        self.deletions = 0
        #: base digest -> digests stored as deltas against it (rewritten in full before it is deleted)
        self._dependents: dict[str, set[str]] = {}
        #: Objects written since the store was opened, by content: delta bases for new objects.
        self._similar = SimilarIndex()
        self._index_loose()
        self._open_packs()

    def referencing(self) -> contextlib.AbstractContextManager[None]:
        """Hold while writing objects and committing the metadata that references them:
        an object found to exist (and so not rewritten) cannot be collected meanwhile."""
        return self._gc_fence.shared()

    def try_referencing(self) -> Callable[[], None] | None:
        """``referencing`` without waiting (for an event loop): its release, or None while
        garbage collection holds the store."""
        return self._gc_fence.try_shared()

    def confirm_fence(self, rows: RowWriter) -> None:
        """Called in the transaction that commits rows referencing objects (see the database
        store's): this store's fence is this process's own lock, which nothing takes away."""
        return None

    def collecting(self, patience: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Held by garbage collection: no checkpoint is between its objects and its row. With a
        ``patience``, ``Postponed`` rather than wait on (and hold every other capture back behind)
        a capture that has held ``referencing`` that long (see ``SharedExclusiveLock._take``)."""
        return self._gc_fence.exclusive(patience)

    def _clear_staging(self) -> None:
        """Leftovers of an interrupted batch were never referenced; drop them."""
        for leftover in self.staging.iterdir():
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    def _index_loose(self) -> None:
        loose = Location(None)
        for fanout in self.objects.iterdir():
            for obj in fanout.iterdir():
                self._committed[fanout.name + obj.name] = loose

    # -- packs --------------------------------------------------------------------------

    def _open_packs(self) -> None:
        recovery = Recovery()
        # In the order they were written: by number, which outgrows its six digits (every
        # compaction starts a pack), not by name.
        for number, path in sorted((int(path.stem.removeprefix("pack-")), path)
                                   for path in self.packs_dir.glob("pack-*.pack")):
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            pack = Pack(path, number, fd, 0, 0)
            self._recover(pack, recovery)
            self._packs.append(pack)
        if self._packs and self._packs[-1].appendable and self._packs[-1].size < PACK_ROTATE_BYTES:
            self._active = self._packs[-1]
        self._settle_deltas(recovery)

    def _mark_dead(self, digest: str, location: Location) -> None:
        """Counts a record nothing indexes any more (deleted, superseded, or never committed)."""
        pack = location.pack
        if pack is not None:
            self._dead[pack] = self._dead.get(pack, 0) + RECORD.size + location.length
            self._dead_keys.setdefault(pack, set()).add(dead_key(digest))

    def _verifies(self, digest: str, location: Location) -> bool:
        try:
            return hashlib.sha256(self._unpack(location, location.pack.read(location))).hexdigest() == digest
        except (OSError, *BODY_ERRORS, DataLoss):
            return False

    def _unpack(self, location: Location, body: bytes, verify_bases: bool = True) -> bytes:
        """A record's content; a delta's base is read verified, or, without ``verify_bases``, as
        ``_unverified`` reads it (the caller then verifies what it gets)."""
        if location.kind == ZSTD:
            return zstd_decompress(body)
        if location.kind == ZLIB:
            return zlib_decompress(body)
        if location.kind in DELTAS:
            base = self._base(location, verify_bases)
            if location.kind == DELTA:
                return zlib_decompress(body[DELTA_HEADER.size:], base[-32768:])
            return zstd_decompress(body[DELTA_HEADER.size:], base)
        return body

    def _base(self, location: Location, verify_bases: bool) -> bytes:
        """A delta's base, read as ``_unpack`` says. The store writes no chain deeper than
        MAX_DELTA_DEPTH: one that goes on past MAX_CHAIN_LINKS is damaged or forged, and reading
        it ends in DataLoss, not in a RecursionError after a thousand links."""
        links = getattr(_chain_reads, "links", 0)
        if links >= MAX_CHAIN_LINKS:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {location.base} is a base more than {MAX_CHAIN_LINKS} "
                           "deltas deep", digest=location.base)
        _chain_reads.links = links + 1
        try:
            return self.read_bytes(location.base) if verify_bases else self._unverified(location.base)
        finally:
            _chain_reads.links = links

    def _unverified(self, digest: str) -> bytes:
        """A delta's base as its chain decodes, each link's digest unchecked: only the object read
        is hashed (see ``iter_chunks``). A loose base is verified as it is read."""
        location = self._locate(digest)
        if location is None or location.pack is None:
            return b"".join(self._iter_loose(digest))
        return self._unpack(location, location.pack.read(location), verify_bases=False)

    def _writable_pack(self) -> Pack:
        active = self._active
        if active is not None and active.size < PACK_ROTATE_BYTES:
            return active
        with self._pack_lock:
            if self._active is None or self._active.size >= PACK_ROTATE_BYTES:
                self._active = self._new_pack()
                self._packs.append(self._active)
            return self._active

    def _new_pack(self) -> Pack:
        """A new, empty pack: written and synced under a staging name, then renamed into place."""
        number = (self._packs[-1].number + 1) if self._packs else 1
        final = self.packs_dir / f"pack-{number:06d}.pack"
        staged = self.staging / uuid.uuid4().hex
        try:
            fd = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise storage_error(exc) from exc
        try:
            os.write(fd, PACK_HEADER.pack(PACK_MAGIC, PACK_HEADER.size))
            os.fsync(fd)
            os.rename(staged, final)
            fsync_dir(self.packs_dir)
        except OSError as exc:
            os.close(fd)
            staged.unlink(missing_ok=True)
            raise storage_error(exc) from exc
        return Pack(final, number, fd, PACK_HEADER.size, PACK_HEADER.size)

    # -- reading ------------------------------------------------------------------------

    def path_of(self, digest: str) -> Path:
        """Where the object lives when it is loose (a large object, or a store written before packs)."""
        return self.objects / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        """Whether the object is committed (durable) in the store."""
        return digest in self._committed

    def batch(self) -> Batch:
        return Batch(self)

    def read_bytes(self, digest: str) -> bytes:
        return b"".join(self.iter_chunks(digest))

    def _locate(self, digest: str) -> Location | None:
        location = self._committed.get(digest)
        if location is None:
            location = self._staged.first(digest)
        return location

    def _open_loose(self, digest: str):
        """Opens a committed loose object, or one still staged by an open batch (looked up
        twice: its batch may rename it to its final name in between)."""
        for _ in range(2):
            location = self._locate(digest)
            candidates = [self.path_of(digest)]
            if location is not None and isinstance(location, _StagedFile):
                candidates.insert(0, location.path)
            for candidate in candidates:
                try:
                    return open(candidate, "rb")  # noqa: SIM115 - the caller closes it
                except FileNotFoundError:
                    continue
        raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is missing", digest=digest)

    def iter_chunks(self, digest: str) -> Iterator[bytes]:
        """Yields an object's content, verifying its digest as it goes.

        A delta's chain of bases is decoded without hashing each link (half the cost of reading a
        version 10 deltas deep): any damaged link makes the object's own digest fail. Only then is
        the chain read again link by link, so that the error names the object that is damaged."""
        data = None
        # A pack compacted away meanwhile stays readable until this read is done (RetiredPacks).
        with self._retired.reading():
            location = self._locate(digest)
            if location is not None and location.pack is not None:
                try:
                    data = self._read_packed(digest, location)
                except DataLoss:
                    # A collection may have rewritten the record whole and deleted its base since
                    # it was looked up: read it where it is now.
                    moved = self._locate(digest)
                    if moved is None or moved == location:
                        raise
                    if moved.pack is not None:
                        data = self._read_packed(digest, moved)
        if data is None:
            yield from self._iter_loose(digest)
        else:
            yield data

    def _read_packed(self, digest: str, location: Location) -> bytes:
        data = self._read_chain(digest, location) if location.kind in DELTAS else None
        if data is not None:
            return data
        try:
            data = self._unpack(location, location.pack.read(location))
        except (OSError, *BODY_ERRORS) as exc:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is unreadable: {exc}",
                           digest=digest) from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is corrupt", digest=digest)
        return data

    def _read_chain(self, digest: str, location: Location) -> bytes | None:
        """A delta's content, its chain decoded unverified and the result verified; None if that
        fails in any way (the caller reads the chain again verifying each link)."""
        try:
            frames = self._zstd_chain(location)
            data = (zstd_decompress_chain(frames) if frames is not None
                    else self._unpack(location, location.pack.read(location), verify_bases=False))
        except (OSError, *BODY_ERRORS, DataLoss):
            return None
        return data if hashlib.sha256(data).hexdigest() == digest else None

    def _zstd_chain(self, location: Location) -> list[bytes] | None:
        """The zstd frames of a chain that is zstd deltas down to a zstd whole object, base first
        (decoded in one go by ``zstd_decompress_chain``); None for any other chain (a raw or
        loose base, an old zlib delta), which is decoded link by link."""
        frames = []
        link: Location | None = location
        while link is not None and link.pack is not None and len(frames) <= MAX_DELTA_DEPTH:
            if link.kind == ZSTD:
                frames.append(link.pack.read(link))
                frames.reverse()
                return frames
            if link.kind != ZSTD_DELTA:
                return None
            frames.append(link.pack.read(link)[DELTA_HEADER.size:])
            link = self._locate(link.base)
        return None

    def _iter_loose(self, digest: str) -> Iterator[bytes]:
        f = self._open_loose(digest)
        hasher = hashlib.sha256()
        with f:
            kind = f.read(1)
            if kind == ZLIB:
                chunks: Iterator[bytes] = _inflated(f, digest)
            elif kind == RAW:
                chunks = iter(lambda: f.read(_CHUNK), b"")
            else:
                raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} has no header", digest=digest)
            for chunk in chunks:
                hasher.update(chunk)
                yield chunk
        if hasher.hexdigest() != digest:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is corrupt", digest=digest)

    def close(self) -> None:
        """Closes the pack files (the store is unusable afterwards)."""
        with self._pack_lock:
            for pack in self._packs:
                with contextlib.suppress(OSError):
                    os.close(pack.fd)
            self._packs, self._active = [], None
        self._retired.close_all()

    def stored_size(self, digest: str) -> int | None:
        """Bytes a committed object takes in the store (compressed); None if it is not stored."""
        location = self._committed.get(digest)
        if location is None:
            return None
        if location.pack is not None:
            return RECORD.size + location.length
        try:
            return self.path_of(digest).stat().st_size
        except FileNotFoundError:
            return None

    def stored_sizes(self, digests: Iterable[str]) -> dict[str, int]:
        """``stored_size`` of each of ``digests`` that is stored (a pack record: its header and
        body, compressed or a delta against its base; a loose object: its file)."""
        sizes = {}
        for digest in digests:
            size = self.stored_size(digest)
            if size is not None:
                sizes[digest] = size
        return sizes

    def iter_digests(self) -> Iterator[str]:
        yield from list(self._committed)

    def damage(self) -> list[tuple[str, str]]:
        """What is wrong with the store's bookkeeping, as (subject, detail): a pack file
        shorter than the records indexed in it, or missing; a delta whose base is not stored.
        Opening a store cuts torn tails off and drops deltas that do not resolve, so this finds
        only what changed underneath a store since (or a defect of its own)."""
        found = []
        with self._pack_lock:
            packs = list(self._packs)
        for pack in packs:
            indexed = pack.size  # read before the file's size: appends only move both forward
            try:
                on_disk = os.stat(pack.path).st_size
            except OSError as exc:
                found.append((pack.path.name, f"cannot be read: {exc.strerror}"))
                continue
            if on_disk < indexed:
                found.append((pack.path.name, f"holds {on_disk} bytes but records are indexed up to {indexed}"))
            elif pack.damaged_at is not None:
                found.append((pack.path.name, f"cannot be read from offset {pack.damaged_at}, within its durable "
                                              f"part: {on_disk - pack.damaged_at} bytes left in place, not indexed"))
        for digest, location in list(self._committed.items()):
            if location.kind in DELTAS and location.base not in self._committed:
                found.append((digest, f"is stored as a delta of {location.base}, which is not stored"))
        return found


@dataclass(frozen=True, slots=True)
class _StagedFile(Location):
    """A large object written to the staging directory by an open batch."""

    path: Path = Path()


class Batch:
    """Objects written together and made durable together (see module docstring)."""

    _rename_lock = threading.Lock()
    #: The token of the operation the batch is written for (see ``kernel.cancellation``; a capture
    #: sets it): a large file's read stops between its chunks once the caller gave up.
    cancel: Cancellation = NEVER

    def __init__(self, store: ContentStore) -> None:
        self.store = store
        self._pending: dict[str, Location] = {}
        self._pack_ends: dict[Pack, int] = {}
        self._finished: list[Callable[[bool], None]] = []
        #: Several threads of one capture may write into the same batch.
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

    def _known(self, digest: str) -> bool:
        return digest in self._pending or digest in self.store._committed

    def _publish(self, digest: str, location: Location) -> bool:
        """Records a written object; False when another thread of this batch was first."""
        return bool(self._publish_all([(digest, location)]))

    def _publish_all(self, written: list[tuple[str, Location]]) -> list[tuple[str, Location]]:
        """Records written objects; returns those no other thread of this batch was first with."""
        published = []
        with self._lock:
            for digest, location in written:
                if digest in self._pending:
                    continue
                self._pending[digest] = location
                published.append((digest, location))
                if location.pack is not None:
                    end = location.offset + location.length
                    if self._pack_ends.get(location.pack, 0) < end:
                        self._pack_ends[location.pack] = end
        self.store._staged.add_all(published)
        return published

    def put_bytes(self, data: bytes, similar: str = "") -> str:
        """Stores ``data``; ``similar`` names a stored object like it (its previous version),
        which it may be stored as a delta against (read back from the store, verified: a base
        damaged since it was written is not built on). Without one that pays, a stored object
        found like it by content may serve as base."""
        digest = digest_bytes(data)
        if not self._to_pack(digest, data):
            return digest
        found = anchors(data) if len(data) >= _SEARCH_MIN_BYTES else []
        self._publish(digest, self._append_packed(digest, data, similar, found))
        if found:
            self.store._similar.add(digest, found)
        return digest

    def _to_pack(self, digest: str, data: bytes) -> bool:
        """Whether ``data`` is still to be packed: not if it is stored or written by this batch
        already, nor if it is too large to pack (then it is written loose, here)."""
        if self._known(digest):
            return False
        if len(data) > COMPRESS_LIMIT:
            self._put_loose(digest, (data,))
            return False
        return True

    def put_whole(self, data: bytes) -> str:
        """Stores ``data`` whole, compressed at a fast level, neither as a delta nor offered as a
        delta base to objects written later (kept out of the similarity index): for an object
        dropped with its batch, such as the directory node of a look (``LookBatch``)."""
        digest = digest_bytes(data)
        if not self._to_pack(digest, data):
            return digest
        kind, body = pack_body(data, _ZSTD_FAST_LEVEL)
        self._publish(digest, self.store._writable_pack().append(digest, kind, body))
        return digest

    def put_records(self, records: list[tuple[str, bytes]]) -> None:
        """Stores objects already encoded as whole pack records, ``(digest, record)`` with
        kind raw or zstd (made by a reader process, see ``readworker``); those already stored
        or written by this batch are skipped. One write for all of them."""
        fresh: dict[str, bytes] = {}
        for digest, record in records:
            if digest not in fresh and not self._known(digest):
                fresh[digest] = record
        if not fresh:
            return
        locations = self.store._writable_pack().append_records(list(fresh.values()))
        self._publish_all(list(zip(fresh, locations, strict=True)))

    def _append_packed(self, digest: str, data: bytes, similar: str, found: list[int]) -> Location:
        """Appends ``data`` to the pack as a delta where one pays, else whole (see ``put_bytes``)."""
        previous = self._delta(digest, data, similar) if similar else None
        # Under a quarter of the content: kept without looking further (most edits of a file).
        if previous is not None and len(previous[2]) * 4 <= len(data):
            return self._append_delta(digest, *previous)
        kind, body = pack_body(data, _ZSTD_WHOLE_LEVEL)
        best = previous
        # The search reads its candidates: an object whose previous version gives a delta under
        # half its compressed size (as a small directory node changed by one child does, seldom
        # under a quarter) does not look further.
        searching = previous is None or len(previous[2]) * 2 >= len(body)
        candidates = self.store._similar.candidates(found, exclude=similar) if searching else []
        for candidate in candidates:
            delta = self._delta(digest, data, candidate)
            if delta is not None and (best is None or len(delta[2]) < len(best[2])):
                best = delta
                if len(delta[2]) * 4 <= len(data):
                    break  # as good as an edit's: the next candidates share fewer anchors
        # Worth a longer read only when clearly smaller than the object compressed on its own.
        if best is not None and len(best[2]) < len(body) * _DELTA_GAIN:
            return self._append_delta(digest, *best)
        return self.store._writable_pack().append(digest, kind, body)

    def _delta(self, digest: str, data: bytes, base: str) -> tuple[str, int, bytes] | None:
        """(base, depth, zstd stream) of ``data`` against ``base``; None when ``base`` is not a
        committed packed object, is already ``MAX_DELTA_DEPTH`` deltas deep, or is the object
        itself (committed by another batch since this one found it missing: a delta of itself
        could never be read)."""
        if base == digest:
            return None
        location = self.store._committed.get(base)
        if location is None or location.pack is None or location.depth >= MAX_DELTA_DEPTH:
            return None
        try:
            base_data = self.store.read_bytes(base)
        except DataLoss:
            return None
        dictionary = zstandard.ZstdCompressionDict(base_data, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        delta = zstandard.ZstdCompressor(level=delta_level(len(data), len(base_data)), dict_data=dictionary,
                                         write_content_size=True).compress(data)
        return base, location.depth + 1, delta

    def _append_delta(self, digest: str, base: str, depth: int, delta: bytes) -> Location:
        body = DELTA_HEADER.pack(bytes.fromhex(base), depth) + delta
        return self.store._writable_pack().append(digest, ZSTD_DELTA, body, base, depth)

    def _stage(self) -> tuple[int, Path]:
        path = self.store.staging / uuid.uuid4().hex
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path
        except OSError as exc:
            raise storage_error(exc) from exc

    def _put_loose(self, digest: str, chunks) -> None:
        fd, staged = self._stage()
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(RAW)
                for chunk in chunks:
                    out.write(chunk)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise storage_error(exc) from exc
        if not self._publish(digest, _StagedFile(None, path=staged)):
            staged.unlink()

    def put_fd(self, src_fd: int, expected_size: int, similar: str = "") -> tuple[str, int]:
        """Stores the content readable from ``src_fd``; returns (digest, size read). See
        ``put_bytes`` for ``similar``. A read of ``src_fd`` that fails raises ``UnreadableSource``
        (the file's fault, not the store's)."""
        if expected_size <= COMPRESS_LIMIT:
            data = read_source(src_fd, expected_size)
            return self.put_bytes(data, similar), len(data)
        hasher = hashlib.sha256()
        size = 0
        fd, staged = self._stage()
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(RAW)
                while chunk := read_source_chunk(src_fd):
                    hasher.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    self.cancel.check()
        except BaseException as exc:  # a failed read or write, the caller gave up, or worse: nothing is kept
            staged.unlink(missing_ok=True)
            if isinstance(exc, OSError) and not isinstance(exc, UnreadableSource):
                raise storage_error(exc) from exc
            raise
        digest = hasher.hexdigest()
        if self._known(digest) or not self._publish(digest, _StagedFile(None, path=staged)):
            staged.unlink()
        return digest, size

    def reuse(self, digest: str) -> bool:
        """Whether ``digest`` is already stored (committed, or written by this batch), so a
        caller that knows the content's digest may reference it without writing it again."""
        return self._known(digest)

    def commit(self) -> None:
        try:
            self._make_durable()
        except BaseException:
            self.abort()
            raise
        committed = self.store._committed
        loose = Location(None)
        with self.store._commit_lock:
            try:
                self._keep_records_committed_meanwhile()
            except BaseException:
                self.abort()
                raise
            for digest, location in self._pending.items():
                previous = committed.get(digest)
                if previous is not None:
                    self._count_dead(digest, previous)
                if location.pack is None:
                    committed[digest] = loose
                else:
                    committed[digest] = location
                    if location.kind in DELTAS:
                        self.store._dependents.setdefault(location.base, set()).add(digest)
        self._forget()
        self._finish(True)

    def _keep_records_committed_meanwhile(self) -> None:
        """An object another batch committed after this one found it missing, where this batch
        wrote it as a delta, keeps the record it was committed with: objects written since may
        be deltas of it, at its depth, and this batch's delta may even have one of them as base
        (two objects each other's base). The packs' last record of a digest is the one a
        reopened store indexes, so the committed record is appended again after this batch's
        (as a compaction moves it) and made durable with it; this batch's own record is dead.
        A whole record may replace it (a chain ending there is no longer than recorded). Rare:
        it takes two captures of one new content at the same moment."""
        committed = self.store._committed
        copied: dict[str, Location] = {}
        for digest, location in self._pending.items():
            previous = committed.get(digest)
            if previous is None or previous.pack is None or location.kind not in DELTAS:
                continue
            copy = self.store._writable_pack().append(digest, previous.kind, previous.pack.read(previous),
                                                      previous.base, previous.depth)
            copy.pack.sync_to(copy.offset + copy.length)
            copied[digest] = copy
        for digest, copy in copied.items():
            self.store._staged.remove(digest, self._pending[digest])
            self._count_dead(digest, self._pending[digest])
            self._pending[digest] = copy

    def _make_durable(self) -> None:
        started = time.perf_counter()
        for pack, end in self._pack_ends.items():
            pack.sync_to(end)
        loose = {digest: loc.path for digest, loc in self._pending.items() if isinstance(loc, _StagedFile)}
        if loose:
            self._make_loose_durable(loose)
        if self._pack_ends or loose:
            telemetry.made_durable(telemetry.Durable.OBJECTS, time.perf_counter() - started)

    def _make_loose_durable(self, loose: dict[str, Path]) -> None:
        try:
            if len(loose) > _SYNCFS_THRESHOLD:
                staging_fd = os.open(self.store.staging, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    _syncfs(staging_fd)
                finally:
                    os.close(staging_fd)
            else:
                for staged in loose.values():
                    fd = os.open(staged, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            fanouts = set()
            with self._rename_lock:
                for digest, staged in loose.items():
                    final = self.store.path_of(digest)
                    if not final.parent.is_dir():
                        final.parent.mkdir(mode=PRIVATE_DIR, exist_ok=True)
                        fanouts.add(self.store.objects)
                    os.replace(staged, final)
                    fanouts.add(final.parent)
            for directory in fanouts:
                fsync_dir(directory)
        except OSError as exc:
            raise storage_error(exc) from exc

    def _forget(self) -> None:
        for digest, location in self._pending.items():
            self.store._staged.remove(digest, location)
        self._pending.clear()
        self._pack_ends.clear()

    def abort(self) -> None:
        """Drops the batch: its large objects are deleted, its packed records are left
        unreferenced (never counted as stored) until the pack is collected."""
        for digest, location in self._pending.items():
            if isinstance(location, _StagedFile):
                location.path.unlink(missing_ok=True)
            else:
                self._count_dead(digest, location)
        self._forget()
        self._finish(False)

    def _count_dead(self, digest: str, location: Location | None) -> None:
        if location is not None:
            self.store._mark_dead(digest, location)

    def _finish(self, committed: bool) -> None:
        callbacks, self._finished = self._finished, []
        run_finish_callbacks(callbacks, committed)


def run_finish_callbacks(callbacks: list[Callable[[bool], None]], committed: bool) -> None:
    """Calls every callback of a finished batch, even after one has raised (each releases
    something of its own: a lock, a paused collector), then raises the first error."""
    error: BaseException | None = None
    for callback in callbacks:
        try:
            callback(committed)
        except BaseException as exc:
            if error is None:
                error = exc
    if error is not None:
        raise error


class UnreadableSource(OSError):
    """A file being stored could not be read (EIO, EINVAL from a special file system, a lease):
    the file is unreadable, the store is fine."""


def read_source(fd: int, expected_size: int) -> bytes:
    try:
        return _read_all(fd, expected_size)
    except OSError as exc:
        raise UnreadableSource(exc.errno, exc.strerror) from exc


def read_source_chunk(fd: int, size: int = _CHUNK) -> bytes:
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise UnreadableSource(exc.errno, exc.strerror) from exc


def _read_all(fd: int, expected_size: int = _CHUNK) -> bytes:
    """Everything readable from ``fd``; one read when the file has the size it was expected to."""
    first = os.read(fd, expected_size + 1)
    if len(first) == expected_size:
        return first
    parts = [first]
    while chunk := os.read(fd, _CHUNK):
        parts.append(chunk)
    return b"".join(parts)
