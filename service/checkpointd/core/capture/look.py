"""A capture that is only looked at, then dropped: a diff against the live workspace, or a dry
run of a rollback.

Such a capture needs each file's digest (to compare it with a checkpoint's) but never its
content: a text diff of a live file reads the file again and checks it against the digest. So
``LookBatch`` hashes file contents and stores none of them, and a look at a workspace with
gigabytes not yet checkpointed writes nothing of them to the store (each look used to append them
all to the pack, as records dead once the look was dropped, reclaimed only by a compaction). The
directory nodes still go to the store's own batch, since the diff reads them from there; it is
aborted with the look.

A dry run of a rollback plans from its look the same way; what it may add to the look's tree
(files the capture left out that the rollback would replace) is hashed the same way too.

A look batch can never be committed: a checkpoint must not reference contents that were never
stored. What it hashed is reusable only within the look (``reuse``), never by another batch, and a
capture indexes files only when its batch commits, so nothing it hashed reaches the stat index.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

from checkpointd.core.kernel.cancellation import NEVER, Cancellation
from checkpointd.core.store.content_store import Batch, digest_bytes, read_source, read_source_chunk
from checkpointd.core.store.db_store import Batch as DbBatch
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT


class LookBatch:
    """Wraps a store's batch for one look (see the module docstring)."""

    #: See ``Batch.cancel``: a large file's hashing stops between its chunks once the caller gave up.
    cancel: Cancellation = NEVER

    def __init__(self, nodes: Batch | DbBatch) -> None:
        #: The store's batch the look's directory nodes are written to.
        self._nodes = nodes
        #: Digests of the file contents this look hashed (several capture threads add to it).
        self._hashed: set[str] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> LookBatch:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.abort()  # dropped, never committed, whatever happened

    def put_fd(self, src_fd: int, expected_size: int, similar: str = "") -> tuple[str, int]:
        """The digest and size of what is readable from ``src_fd``, which is not stored.
        ``similar`` (a delta base for a stored version) has no use here."""
        if expected_size <= COMPRESS_LIMIT:
            data = read_source(src_fd, expected_size)
            digest, size = digest_bytes(data), len(data)
        else:
            hasher = hashlib.sha256()
            size = 0
            while chunk := read_source_chunk(src_fd):
                hasher.update(chunk)
                size += len(chunk)
                self.cancel.check()
            digest = hasher.hexdigest()
        with self._lock:
            self._hashed.add(digest)
        return digest, size

    def put_bytes(self, data: bytes, similar: str = "") -> str:
        """A directory node: stored in the look's own batch, which the diff reads nodes from,
        whole and quickly (it is dropped with the look), and never offered as a delta base."""
        return self._nodes.put_whole(data)

    def reuse(self, digest: str) -> bool:
        """Whether ``digest`` may be referenced without reading its content again: hashed by this
        look, or already stored."""
        with self._lock:
            if digest in self._hashed:
                return True
        return self._nodes.reuse(digest)

    def when_finished(self, callback: Callable[[bool], None]) -> None:
        self._nodes.when_finished(callback)

    def commit(self) -> None:
        raise RuntimeError("a look at the live workspace is never committed: it stored no file contents")

    def abort(self) -> None:
        self._nodes.abort()
