"""Finding a stored object like a new one, for a delta base when the caller names none that
pays: a file new at its path (renamed, moved or copied), a new directory, a version too far
from its previous one.

An object's anchors are the hashes of its first pieces (lines; for an object of one line, such
as a directory node, the ``],[`` between its children), the short ones left out. The index
remembers, for each anchor, the last object written that had it, in two generations of at most
half its capacity each (when the newer one is full, the older one is forgotten); the candidates
for a new object are the objects that most of its anchors point to. It lives in memory only and
holds nothing the store needs (Python's ``hash`` of bytes, seeded per process, is as good as any
there): a restarted server starts it empty, and a candidate deleted since is skipped by the
caller (which takes only committed objects as bases). Objects written by reader processes (a
first capture of thousands of files) are not indexed."""

from __future__ import annotations

import threading
from collections import Counter

#: Shorter pieces (blank lines, closing brackets) say little about where an object came from.
MIN_PIECE = 12
#: Anchors taken of one object, the first distinct ones (bounds the work per object).
MAX_ANCHORS = 256
#: Pieces looked at, from the start of an object.
_MAX_PIECES = 2 * MAX_ANCHORS
#: Anchors remembered in all (about 100 bytes each): those of the last 128 objects at least.
CAPACITY = 1 << 16
#: A candidate must hold at least this share of the new object's anchors.
MIN_SHARE = 0.05
#: Candidates tried, most shared anchors first.
CANDIDATES = 4


def anchors(data: bytes) -> list[int]:
    """The object's anchors (see the module docstring): of its first pieces, at most ``MAX_ANCHORS``."""
    pieces = data.split(b"\n", _MAX_PIECES)
    if len(pieces) == 1:
        pieces = data.split(b"],[", _MAX_PIECES)
    return list(dict.fromkeys([hash(piece) for piece in pieces[:_MAX_PIECES] if len(piece) >= MIN_PIECE]))[:MAX_ANCHORS]


class SimilarIndex:
    """Anchor -> the last object written with it, bounded to ``capacity`` anchors."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._half = max(1, capacity // 2)
        self._newer: dict[int, str] = {}
        self._older: dict[int, str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._newer.keys() | self._older.keys())

    def add(self, digest: str, object_anchors: list[int]) -> None:
        with self._lock:
            if len(self._newer) + len(object_anchors) > self._half:
                self._older, self._newer = self._newer, {}
            self._newer.update(dict.fromkeys(object_anchors[:self._half], digest))

    def candidates(self, object_anchors: list[int], exclude: str = "") -> list[str]:
        """Objects sharing the most anchors with these (at least ``MIN_SHARE`` of them), best first."""
        if not object_anchors:
            return []
        with self._lock:
            # An anchor in both generations votes for both owners (each had it, in its turn).
            votes = Counter(map(self._newer.get, object_anchors))
            votes.update(map(self._older.get, object_anchors))
        votes.pop(None, None)
        votes.pop(exclude, None)
        least = MIN_SHARE * len(object_anchors)
        return [digest for digest, count in votes.most_common(CANDIDATES) if count >= least]
