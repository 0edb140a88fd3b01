"""Workspace trees as content-addressed (Merkle) nodes.

A directory node lists its children sorted by name; its digest is the digest of its
encoding, so an unchanged subtree has an unchanged digest and is reused and skipped by
diffs without being read.
"""

from __future__ import annotations

import enum
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from checkpointd.core.store.content_store import Batch, ContentStore, digest_bytes


class EntryKind(enum.StrEnum):
    FILE = "f"
    SYMLINK = "l"
    DIR = "d"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: EntryKind
    mode: int
    size: int = 0
    #: FILE: content digest; SYMLINK: digest of the link text; DIR: subtree digest.
    digest: str = ""
    #: SYMLINK only: the link text, never followed.
    target: str = ""

    def same_content(self, other: Entry) -> bool:
        return self.kind == other.kind and self.mode == other.mode and self.digest == other.digest


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    base: Entry | None
    target: Entry | None


#: Kinds encode as their one-letter values (a StrEnum member is that str: ``json`` writes it as
#: such, without the cost of looking up ``.value`` for every child of every node).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def encode_node(children: Mapping[str, Entry]) -> bytes:
    return _ENCODE([[name, e.kind, e.mode, e.size, e.digest, e.target]
                    for name, e in sorted(children.items())]).encode()


def decode_node(data: bytes) -> dict[str, Entry]:
    return {
        name: Entry(EntryKind(kind), mode, size, digest, target)
        for name, kind, mode, size, digest, target in json.loads(data)
    }


EMPTY_TREE = digest_bytes(encode_node({}))
#: Encoded nodes kept for delta bases: a few captures' worth of changed directories.
WRITTEN_ENCODINGS_KEPT = 1024


class Trees:
    """Reads and writes tree nodes of one content store."""

    def __init__(self, store: ContentStore, cache_size: int = 65536) -> None:
        self.store = store
        #: Decoded nodes by digest, least recently used first. A node is content-addressed, so
        #: what is cached stays true; nodes just written are cached too, as the next capture
        #: of the same workspace starts from them.
        self._cache: OrderedDict[str, dict[str, Entry]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        #: The encodings of the nodes written last: the next capture that changes the same
        #: directories stores its nodes as deltas against exactly these bytes.
        self._written: OrderedDict[str, bytes] = OrderedDict()

    def _read_uncached(self, digest: str) -> dict[str, Entry]:
        if digest == EMPTY_TREE:
            return {}
        return decode_node(self.store.read_bytes(digest))

    def read(self, digest: str) -> dict[str, Entry]:
        with self._cache_lock:
            node = self._cache.get(digest)
            if node is not None:
                self._cache.move_to_end(digest)
                return node
        node = self._read_uncached(digest)
        self._remember(digest, node)
        return node

    def _remember(self, digest: str, node: dict[str, Entry], encoded: bytes | None = None) -> None:
        with self._cache_lock:
            self._cache[digest] = node
            self._cache.move_to_end(digest)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            if encoded is not None:
                self._written[digest] = encoded
                self._written.move_to_end(digest)
                if len(self._written) > WRITTEN_ENCODINGS_KEPT:
                    self._written.popitem(last=False)

    def write(self, batch: Batch, children: Mapping[str, Entry], previous: Mapping[str, Entry] | None = None,
              previous_digest: str = "") -> str:
        """Stores a node; ``previous`` (the node it replaces, stored as ``previous_digest``)
        lets the store keep just the difference."""
        data = encode_node(children)
        if previous_digest and isinstance(batch, Batch):
            with self._cache_lock:
                base = self._written.get(previous_digest)
            digest = batch.put_bytes(data, previous_digest, base if base is not None else encode_node(previous))
        else:
            digest = batch.put_bytes(data)
        self._remember(digest, dict(children), data)
        return digest

    def flatten(self, digest: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
        for name, entry in self.read(digest).items():
            path = f"{prefix}{name}"
            yield path, entry
            if entry.kind is EntryKind.DIR:
                yield from self.flatten(entry.digest, path + "/")

    def lookup(self, root: str, path: str) -> Entry | None:
        node = self.read(root)
        parts = path.split("/")
        for part in parts[:-1]:
            entry = node.get(part)
            if entry is None or entry.kind is not EntryKind.DIR:
                return None
            node = self.read(entry.digest)
        return node.get(parts[-1])

    def diff(self, base: str | None, target: str | None, prefix: str = "") -> Iterator[Change]:
        """Paths that differ, parents before children, skipping equal subtrees.

        A directory present on both sides is reported only when its mode differs.
        """
        if base == target:
            return
        base_node = self.read(base) if base else {}
        target_node = self.read(target) if target else {}
        for name in sorted(base_node.keys() | target_node.keys()):
            b, t = base_node.get(name), target_node.get(name)
            if b is not None and t is not None and b.same_content(t) and b.target == t.target:
                continue
            path = f"{prefix}{name}"
            both_dirs = b is not None and t is not None and b.kind is t.kind is EntryKind.DIR
            if not (both_dirs and b.mode == t.mode):
                yield Change(path, b, t)
            b_dir = b.digest if b is not None and b.kind is EntryKind.DIR else None
            t_dir = t.digest if t is not None and t.kind is EntryKind.DIR else None
            if b_dir or t_dir:
                yield from self.diff(b_dir, t_dir, path + "/")

    def apply(self, batch: Batch, root: str, updates: Mapping[str, Entry | None]) -> str:
        """A new root with ``updates`` applied: path -> entry, or None to remove.

        A directory entry with an empty digest keeps its old children (none if it is
        new); with a digest it takes that subtree. Parents of updated paths must exist in
        the tree or be named in ``updates``.
        """
        grouped: dict[str, dict[str, Entry | None]] = {}
        for path, entry in updates.items():
            head, _, rest = path.partition("/")
            grouped.setdefault(head, {})[rest] = entry
        previous = self.read(root)
        children = dict(previous)
        for name, sub in grouped.items():
            old = children.get(name)
            own = sub.pop("", old)
            if own is None or own.kind is not EntryKind.DIR:
                if sub:
                    raise ValueError(f"{name!r} gets children but is not a directory")
                if own is None:
                    children.pop(name, None)
                else:
                    children[name] = own
                continue
            kept = old.digest if old is not None and old.kind is EntryKind.DIR else EMPTY_TREE
            subtree = own.digest or kept
            if sub:
                subtree = self.apply(batch, subtree, sub)
            children[name] = Entry(EntryKind.DIR, own.mode, 0, subtree)
        return self.write(batch, children, previous, root if root != EMPTY_TREE else "")
