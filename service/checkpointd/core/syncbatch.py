"""Batched durability: many files written and renamed without a sync each, then made durable
together before anyone is told they are.

One fsync per restored file (and one per directory) made a rollback of a few dozen files cost
hundreds of milliseconds: each is a journal commit of its own. A ``SyncBatch`` keeps a duplicate
descriptor of every file and directory written under it and, at ``flush``, fsyncs them all at
once from a small pool of threads: the file system's journal commits concurrent fsyncs together,
so a batch costs about one or two commits. ``syncfs(2)`` would be one call, but it also waits
for every other process's dirty data on the same file system (measured on these machines: no
faster than one fsync per file while other work was writing); concurrent fsyncs wait only for
what the batch wrote.

Until ``flush`` returns nothing written under the batch is known to be durable: a caller
acknowledges (or drops the journal entry that can finish or undo the writes) only after it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Executor, ThreadPoolExecutor

#: At most this many descriptors are held open by a batch; past it the batch is flushed early.
MAX_PENDING = 128
#: Threads that fsync concurrently (each waits on the disk with the interpreter lock released).
SYNC_THREADS = 8

_pool: Executor | None = None
_pool_guard = threading.Lock()


def _executor() -> Executor:
    global _pool
    with _pool_guard:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="checkpointd-fsync")
        return _pool


class SyncFailed(OSError):
    """A file or directory of the batch could not be made durable (``path``: which)."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.path = path
        self.cause = cause


class SyncBatch:
    """Files and directories written without their own fsync, made durable together by ``flush``."""

    def __init__(self) -> None:
        #: (path, duplicated fd) of every file and directory to sync, in the order added.
        self._pending: list[tuple[str, int]] = []
        #: Directories already pending, by (device, inode): each is synced once per flush.
        self._dirs: set[tuple[int, int]] = set()

    def add_file(self, path: str, fd: int) -> None:
        """``fd``'s file (written, not synced) must be durable at the next flush."""
        self._add(path, fd)

    def add_dir(self, path: str, fd: int) -> None:
        """An entry of directory ``fd`` was created, renamed or removed: it must be durable too."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key not in self._dirs:
            self._dirs.add(key)
            self._add(path, fd)

    def _add(self, path: str, fd: int) -> None:
        self._pending.append((path, os.dup(fd)))
        if len(self._pending) >= MAX_PENDING:
            self.flush()

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Makes everything added so far durable; raises ``SyncFailed`` (the first failure, by the
        order added) if any of it could not be synced. The batch is empty afterwards either way."""
        pending, self._pending = self._pending, []
        self._dirs.clear()
        if not pending:
            return
        try:
            if len(pending) == 1:
                errors = [_sync(pending[0][1])]
            else:
                errors = list(_executor().map(_sync, [fd for _path, fd in pending]))
        finally:
            for _path, fd in pending:
                os.close(fd)
        for (path, _fd), error in zip(pending, errors, strict=True):
            if error is not None:
                raise SyncFailed(path, error)

    def close(self) -> None:
        """Drops what is pending without syncing it (the caller failed before its sync point)."""
        pending, self._pending = self._pending, []
        self._dirs.clear()
        for _path, fd in pending:
            with contextlib.suppress(OSError):
                os.close(fd)


def _sync(fd: int) -> OSError | None:
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc
    return None
