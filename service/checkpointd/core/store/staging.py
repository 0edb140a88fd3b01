"""What open batches have written and not committed, readable meanwhile (both stores)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

Copy = TypeVar("Copy")


class StagedObjects(Generic[Copy]):
    """Each object's staged copies, one per open batch that wrote it: two batches may write one
    object at once and either may end first (a diff's batch is always aborted), so the copy of
    the one still open must stay readable. Copies are told apart by identity."""

    def __init__(self) -> None:
        self._copies: dict[str, list[Copy]] = {}
        self._lock = threading.Lock()

    def add_all(self, written: Iterable[tuple[str, Copy]]) -> None:
        with self._lock:
            for digest, copy in written:
                self._copies.setdefault(digest, []).append(copy)

    def first(self, digest: str) -> Copy | None:
        """A staged copy of ``digest`` (the earliest still staged), or None."""
        with self._lock:
            copies = self._copies.get(digest)
            return copies[0] if copies else None

    def remove(self, digest: str, copy: Copy) -> None:
        """``copy`` of ``digest`` is no longer staged (its batch ended); others still are."""
        with self._lock:
            copies = self._copies.get(digest, [])
            for index, other in enumerate(copies):
                if other is copy:
                    del copies[index]
                    break
            if not copies:
                self._copies.pop(digest, None)

    def __contains__(self, digest: object) -> bool:
        return digest in self._copies

    def __len__(self) -> int:
        return len(self._copies)
