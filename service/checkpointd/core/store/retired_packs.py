"""Packs a compaction removed, kept open until no read that may still use them is on.

Reads of the store take no lock against garbage collection: a read looks a record up, then
reads it, and a compaction may move the record and remove its pack in between. The removed
pack's file is unlinked, but its descriptor still reads the record's bytes, so the read stays
right as long as the descriptor stays open. Closing it while such a read is on fails the read,
and the number is soon given to another file (a newer pack), which the read would then read at the
old offset: another object's bytes, caught only by the digest check (DATA_LOSS for an object that is
intact).

So a pack is closed only once every read that began before it was removed has ended (epochs, as in
read-copy-update): a read registers in the current epoch; removing a pack closes the epoch; the pack
goes when no read of its epoch or an earlier one is on. A read that begins after the removal cannot
find the pack (the records were re-indexed at their new place before it was removed), and nothing
waits: a steady stream of reads only delays the closing of packs removed before it began.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator

from checkpointd.core.store.packs import Pack


class RetiredPacks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        #: epoch -> reads begun in it that are still on
        self._reads: Counter[int] = Counter()
        #: (the epoch it was removed in, pack), oldest first
        self._retired: list[tuple[int, Pack]] = []

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around a lookup of a record and its read: no pack it may find is closed meanwhile."""
        with self._lock:
            epoch = self._epoch
            self._reads[epoch] += 1
        try:
            yield
        finally:
            with self._lock:
                self._reads[epoch] -= 1
                if not self._reads[epoch]:
                    del self._reads[epoch]
                self._close_unread()

    def retire(self, pack: Pack) -> None:
        """``pack`` was removed from the store's packs, its records indexed elsewhere."""
        with self._lock:
            self._retired.append((self._epoch, pack))
            self._epoch += 1
            self._close_unread()

    def open_count(self) -> int:
        """How many removed packs are still open (for tests)."""
        with self._lock:
            return len(self._retired)

    def close_all(self) -> None:
        with self._lock:
            for _epoch, pack in self._retired:
                with contextlib.suppress(OSError):
                    os.close(pack.fd)
            self._retired = []

    def _close_unread(self) -> None:
        if not self._retired:
            return  # every read ends here: most find nothing to close
        oldest = min(self._reads, default=self._epoch)
        while self._retired and self._retired[0][0] < oldest:
            _epoch, pack = self._retired.pop(0)
            with contextlib.suppress(OSError):
                os.close(pack.fd)
