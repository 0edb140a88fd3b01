"""Content-addressed, deduplicated object store shared by all plans.

Objects are named by the SHA-256 of their content and live at ``objects/ab/cdef…``.
Writes go through a ``Batch``: content is written to temporary files first, the file
system is synced once, and only then are the files renamed to their final names (and
synced again). An object under its final name is therefore always complete, and a
caller commits metadata that references objects only after ``Batch.commit`` returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import os
import threading
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

from checkpointd.core.errors import DataLoss, Reason, ResourceExhausted

_RAW = b"R"
_ZLIB = b"Z"
#: Objects up to this size are compressed in memory when that makes them smaller.
_COMPRESS_LIMIT = 1 << 20
_CHUNK = 1 << 20

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _syncfs(fd: int) -> None:
    """Flush one file system (Linux syncfs); falls back to a global sync elsewhere."""
    syncfs = getattr(_libc, "syncfs", None)
    if syncfs is None or syncfs(fd) != 0:
        os.sync()


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _storage_error(exc: OSError) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(Reason.STORAGE_EXHAUSTED, f"content store is full: {exc.strerror}")
    return exc


class _SharedExclusiveLock:
    """Many holders of the shared side, or one of the exclusive side (writers first)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._cond.wait_for(lambda: self._shared == 0)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class ContentStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.staging = root / "staging"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._clear_staging()
        #: Objects written by open batches, readable before they are committed.
        self._staged: dict[str, Path] = {}
        self._staged_lock = threading.Lock()
        self._gc_fence = _SharedExclusiveLock()

    def referencing(self) -> contextlib.AbstractContextManager[None]:
        """Hold while writing objects and committing the metadata that references them:
        an object found to exist (and so not rewritten) cannot be collected meanwhile."""
        return self._gc_fence.shared()

    def collecting(self) -> contextlib.AbstractContextManager[None]:
        """Held by garbage collection: no checkpoint is between its objects and its row."""
        return self._gc_fence.exclusive()

    def _clear_staging(self) -> None:
        """Leftovers of an interrupted batch were never referenced; drop them."""
        for leftover in self.staging.iterdir():
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    def path_of(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        return self.path_of(digest).exists()

    def batch(self) -> Batch:
        return Batch(self)

    def read_bytes(self, digest: str) -> bytes:
        return b"".join(self.iter_chunks(digest))

    def _open(self, digest: str):
        """Opens a committed object, or one still staged by an open batch."""
        with self._staged_lock:
            staged = self._staged.get(digest)
        for candidate in (self.path_of(digest), staged, self.path_of(digest)):
            if candidate is None:
                continue
            try:
                return open(candidate, "rb")  # noqa: SIM115 - the caller closes it
            except FileNotFoundError:
                continue
        raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is missing", digest=digest)

    def iter_chunks(self, digest: str) -> Iterator[bytes]:
        """Yields an object's content, verifying its digest as it goes."""
        f = self._open(digest)
        hasher = hashlib.sha256()
        with f:
            kind = f.read(1)
            if kind == _ZLIB:
                data = zlib.decompress(f.read())
                hasher.update(data)
                chunks: Iterator[bytes] = iter((data,))
            elif kind == _RAW:
                chunks = iter(lambda: f.read(_CHUNK), b"")
            else:
                raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} has no header", digest=digest)
            for chunk in chunks:
                if kind == _RAW:
                    hasher.update(chunk)
                yield chunk
        if hasher.hexdigest() != digest:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {digest} is corrupt", digest=digest)

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path_of(digest).unlink()

    def iter_digests(self) -> Iterator[str]:
        for fanout in self.objects.iterdir():
            for obj in fanout.iterdir():
                yield fanout.name + obj.name


class Batch:
    """Objects written together and made durable together (see module docstring)."""

    _lock = threading.Lock()

    def __init__(self, store: ContentStore) -> None:
        self.store = store
        self._pending: dict[str, Path] = {}

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _stage(self) -> tuple[int, Path]:
        path = self.store.staging / uuid.uuid4().hex
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), path
        except OSError as exc:
            raise _storage_error(exc) from exc

    def _keep(self, digest: str, staged: Path) -> None:
        if digest in self._pending or self.store.has(digest):
            staged.unlink()
        else:
            self._pending[digest] = staged
            with self.store._staged_lock:
                self.store._staged.setdefault(digest, staged)

    def _forget(self) -> None:
        with self.store._staged_lock:
            for digest, staged in self._pending.items():
                if self.store._staged.get(digest) == staged:
                    del self.store._staged[digest]
        self._pending.clear()

    def put_bytes(self, data: bytes) -> str:
        digest = digest_bytes(data)
        if digest in self._pending or self.store.has(digest):
            return digest
        packed = zlib.compress(data, 1) if len(data) <= _COMPRESS_LIMIT else data
        body = _ZLIB + packed if len(packed) < len(data) else _RAW + data
        fd, staged = self._stage()
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise _storage_error(exc) from exc
        self._keep(digest, staged)
        return digest

    def put_fd(self, src_fd: int, expected_size: int) -> tuple[str, int]:
        """Stores the content readable from ``src_fd``; returns (digest, size read)."""
        if expected_size <= _COMPRESS_LIMIT:
            data = _read_all(src_fd)
            return self.put_bytes(data), len(data)
        hasher = hashlib.sha256()
        size = 0
        fd, staged = self._stage()
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_RAW)
                while chunk := os.read(src_fd, _CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise _storage_error(exc) from exc
        digest = hasher.hexdigest()
        self._keep(digest, staged)
        return digest, size

    def commit(self) -> None:
        if not self._pending:
            return
        staging_fd = os.open(self.store.staging, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _syncfs(staging_fd)
            with self._lock:
                for digest, staged in self._pending.items():
                    final = self.store.path_of(digest)
                    final.parent.mkdir(exist_ok=True)
                    os.replace(staged, final)
            _syncfs(staging_fd)
        except OSError as exc:
            self.abort()
            raise _storage_error(exc) from exc
        finally:
            os.close(staging_fd)
        self._forget()

    def abort(self) -> None:
        for staged in self._pending.values():
            staged.unlink(missing_ok=True)
        self._forget()


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, _CHUNK):
        parts.append(chunk)
    return b"".join(parts)
