"""Workspace trees as content-addressed (Merkle) nodes.

A directory node lists its children sorted by name; its digest is the digest of its
encoding, so an unchanged subtree has an unchanged digest and is reused and skipped by
diffs without being read.

A directory of more than ``SPLIT_ENTRIES`` children is stored split: its node is an index
(a JSON object, where a plain node is a JSON array) of parts, each part a plain node holding a
run of its children in name order. Parts end after a child whose name's checksum says so (or
at ``PART_MAX_ENTRIES``), so the split depends on the children alone (equal directories have
equal digests however they were built), and changing a few children rewrites the parts they
fall in and the index, not the whole directory. ``read`` returns a split directory's children
as one mapping; ``lookup`` and ``apply`` read only the parts they need.
"""

from __future__ import annotations

import bisect
import enum
import json
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
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


#: A directory with more children than this is stored split (see the module's docstring).
#: Tests lower it (``CHECKPOINTD_TREE_SPLIT_ENTRIES``) so a server splits the few-entry directories
#: of a model workspace; a store's digests depend on it, so one store keeps one value.
SPLIT_ENTRIES = int(os.environ.get("CHECKPOINTD_TREE_SPLIT_ENTRIES") or 2048)
if SPLIT_ENTRIES < 2:
    raise ValueError(f"CHECKPOINTD_TREE_SPLIT_ENTRIES must be at least 2, not {SPLIT_ENTRIES}")
#: A part ends after a child whose name's CRC-32 has these bits clear: parts of about a quarter
#: of ``SPLIT_ENTRIES`` children (511: ~512).
PART_MASK = (1 << max(1, (SPLIT_ENTRIES // 4).bit_length() - 1)) - 1
#: ... or once it holds this many children (names chosen to never end a part).
PART_MAX_ENTRIES = 2 * SPLIT_ENTRIES
_INDEX_KEY = "parts"


class Index:
    """A split directory's node: its parts' first names, sizes and digests, in name order."""

    __slots__ = ("firsts", "counts", "digests")

    def __init__(self, firsts: list[str], counts: list[int], digests: list[str]) -> None:
        self.firsts = firsts
        self.counts = counts
        self.digests = digests

    def locate(self, name: str) -> int:
        """The part ``name`` is in, or would go into."""
        return max(bisect.bisect_right(self.firsts, name) - 1, 0)

    def total(self) -> int:
        return sum(self.counts)


def is_index(data: bytes) -> bool:
    """Whether an encoded node is a split directory's index (a plain node is a JSON array)."""
    return data[:1] == b"{"


def encode_index(index: Index) -> bytes:
    return _ENCODE({_INDEX_KEY: [[first, count, digest] for first, count, digest in
                                 zip(index.firsts, index.counts, index.digests, strict=True)]}).encode()


def decode_index(data: bytes) -> Index:
    parts = json.loads(data)[_INDEX_KEY]
    if not parts:
        raise ValueError("an index without parts")
    firsts, counts, digests = [], [], []
    for first, count, digest in parts:
        if not isinstance(first, str) or not isinstance(count, int) or not isinstance(digest, str):
            raise ValueError("a malformed index part")
        firsts.append(first)
        counts.append(count)
        digests.append(digest)
    if firsts != sorted(firsts) or len(set(firsts)) != len(firsts):
        raise ValueError("index parts out of order")
    return Index(firsts, counts, digests)


def _ends_part(name: str) -> bool:
    return not zlib.crc32(os.fsencode(name)) & PART_MASK


def split_parts(items: list[tuple[str, Entry]]) -> tuple[list[list[tuple[str, Entry]]], list[tuple[str, Entry]]]:
    """Children sorted by name, cut into parts: the complete parts, and the children after the
    last part's end (they end the directory's last part, or begin one with what follows)."""
    parts = []
    start = 0
    for i, (name, _entry) in enumerate(items):
        if i + 1 - start >= PART_MAX_ENTRIES or _ends_part(name):
            parts.append(items[start:i + 1])
            start = i + 1
    return parts, items[start:]


def _with_changes(children: Mapping[str, Entry], changed: Mapping[str, Entry | None]) -> dict[str, Entry]:
    """A copy of ``children`` with ``changed`` set (None: removed)."""
    result = dict(children)
    for name, entry in changed.items():
        if entry is None:
            result.pop(name, None)
        else:
            result[name] = entry
    return result


EMPTY_TREE = digest_bytes(encode_node({}))

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

    def _read_uncached(self, digest: str) -> dict[str, Entry] | Index:
        if digest == EMPTY_TREE:
            return {}
        data = self.store.read_bytes(digest)
        return decode_index(data) if is_index(data) else decode_node(data)

    def _node(self, digest: str) -> dict[str, Entry] | Index:
        """A node as stored: the children of a plain one, or a split directory's index."""
        with self._cache_lock:
            node = self._cache.get(digest)
            if node is not None:
                self._cache.move_to_end(digest)
                return node
        node = self._read_uncached(digest)
        self._remember(digest, node)
        return node

    def read(self, digest: str) -> dict[str, Entry]:
        """A directory's children by name, in name order (a split one's from all its parts)."""
        node = self._node(digest)
        if not isinstance(node, Index):
            return node
        children: dict[str, Entry] = {}
        for part in node.digests:
            children.update(self._part(part))
        return children

    def _part(self, digest: str) -> dict[str, Entry]:
        node = self._node(digest)
        if isinstance(node, Index):
            raise ValueError(f"part {digest} of a split directory is itself split")
        return node

    def parts(self, digest: str) -> list[str]:
        """The objects a directory's node is stored in besides its own: a split one's parts."""
        node = self._node(digest)
        return list(node.digests) if isinstance(node, Index) else []

    def child(self, digest: str, name: str) -> Entry | None:
        """One child of a directory, reading only the part of a split one it is in."""
        node = self._node(digest)
        if isinstance(node, Index):
            node = self._part(node.digests[node.locate(name)])
        return node.get(name)

    def _remember(self, digest: str, node: dict[str, Entry] | Index) -> None:
        with self._cache_lock:
            self._cache[digest] = node
            self._cache.move_to_end(digest)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def write(self, batch: Batch, children: Mapping[str, Entry], previous_digest: str = "") -> str:
        """Stores a node; ``previous_digest`` (the node it replaces) lets the store keep just
        the difference."""
        if len(children) > SPLIT_ENTRIES:
            parts, tail = split_parts(sorted(children.items()))
            if tail:
                parts.append(tail)
            return self._write_index(batch, [self._write_part(batch, part) for part in parts])
        # Remembered in name order, as a node read from the store is: readers (an export's
        # tar, a flatten) must not depend on whether the node came from the cache.
        ordered = dict(sorted(children.items()))
        data = encode_node(ordered)
        digest = self._put(batch, data, previous_digest)
        self._remember(digest, ordered)
        return digest

    @staticmethod
    def _put(batch: Batch, data: bytes, previous_digest: str) -> str:
        """Stores encoded bytes, as a delta of ``previous_digest`` (a node of the same kind) if
        given. The store reads that base from disk, as for a file's previous version, rather
        than taking the bytes this process wrote: a base record damaged since must cost only
        its own version, which the store then sees and stores this one whole."""
        if not previous_digest or not isinstance(batch, Batch):
            return batch.put_bytes(data)
        return batch.put_bytes(data, previous_digest)

    def _write_part(self, batch: Batch, items: list[tuple[str, Entry]],
                    previous_digest: str = "") -> tuple[str, int, str]:
        """Stores one part of a split directory: (first name, children, digest)."""
        children = dict(items)
        data = encode_node(children)
        digest = self._put(batch, data, previous_digest)
        self._remember(digest, children)
        return items[0][0], len(items), digest

    def _write_index(self, batch: Batch, parts: list[tuple[str, int, str]], previous_digest: str = "") -> str:
        index = Index([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts])
        data = encode_index(index)
        digest = self._put(batch, data, previous_digest)
        self._remember(digest, index)
        return digest

    def flatten(self, digest: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
        for name, entry in self.read(digest).items():
            path = f"{prefix}{name}"
            yield path, entry
            if entry.kind is EntryKind.DIR:
                yield from self.flatten(entry.digest, path + "/")

    def lookup(self, root: str, path: str) -> Entry | None:
        digest = root
        parts = path.split("/")
        for part in parts[:-1]:
            entry = self.child(digest, part)
            if entry is None or entry.kind is not EntryKind.DIR:
                return None
            digest = entry.digest
        return self.child(digest, parts[-1])

    def _children_from(self, node: Index, from_name: str, shared: set[str]) -> Iterator[tuple[str, Entry]]:
        """A split directory's children in name order, read a part at a time as they are taken:
        less those of ``shared`` parts, and from the part ``from_name`` would be in."""
        for part in node.digests[node.locate(from_name) if from_name else 0:]:
            if part not in shared:
                yield from sorted(self._part(part).items())

    def diff(self, base: str | None, target: str | None, prefix: str = "",
             after: Sequence[str] = ()) -> Iterator[Change]:
        """Paths that differ, parents before children, skipping equal subtrees: the order of the
        paths' component lists (``a/b`` before ``a.txt``).

        A directory present on both sides is reported only when its mode differs. ``after``, a
        path's component list (below ``prefix``), resumes a listing: only the changes whose paths
        sort after it are listed, and the subtrees that sort wholly before it are not read.
        """
        if base == target:
            return
        base_node = self._node(base) if base else {}
        target_node = self._node(target) if target else {}
        first = after[0] if after else ""
        if isinstance(base_node, Index) or isinstance(target_node, Index):
            # Parts both sides are split into the same hold the same children: not read. The
            # rest are read as the walk reaches them, so a page that ends early reads no more.
            shared = (set(base_node.digests) & set(target_node.digests)
                      if isinstance(base_node, Index) and isinstance(target_node, Index) else set())
            pairs = _merged(self._children_from(base_node, first, shared) if isinstance(base_node, Index)
                            else iter(sorted(base_node.items())),
                            self._children_from(target_node, first, shared) if isinstance(target_node, Index)
                            else iter(sorted(target_node.items())))
        else:
            names = sorted(base_node.keys() | target_node.keys())
            if first:
                names = names[bisect.bisect_left(names, first):]
            pairs = ((name, base_node.get(name), target_node.get(name)) for name in names)
        for name, b, t in pairs:
            if name < first:  # in the part the resume name is in, before it
                continue
            if b is not None and t is not None and b.same_content(t) and b.target == t.target:
                continue
            path = f"{prefix}{name}"
            # On the resume path: this path is ``after`` or comes before it, and its children
            # are bounded by the rest of ``after`` (none: all of them come after it).
            on_resume_path = bool(after) and name == after[0]
            both_dirs = b is not None and t is not None and b.kind is t.kind is EntryKind.DIR
            if not (both_dirs and b.mode == t.mode) and not on_resume_path:
                yield Change(path, b, t)
            b_dir = b.digest if b is not None and b.kind is EntryKind.DIR else None
            t_dir = t.digest if t is not None and t.kind is EntryKind.DIR else None
            if b_dir or t_dir:
                yield from self.diff(b_dir, t_dir, path + "/", after[1:] if on_resume_path else ())

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
        changed: dict[str, Entry | None] = {}
        for name, sub in grouped.items():
            old = self.child(root, name)
            own = sub.pop("", old)
            if own is None or own.kind is not EntryKind.DIR:
                if sub:
                    raise ValueError(f"{name!r} gets children but is not a directory")
                changed[name] = own
                continue
            kept = old.digest if old is not None and old.kind is EntryKind.DIR else EMPTY_TREE
            subtree = own.digest or kept
            if sub:
                subtree = self.apply(batch, subtree, sub)
            changed[name] = Entry(EntryKind.DIR, own.mode, 0, subtree)
        return self._change(batch, root, changed)

    def _change(self, batch: Batch, root: str, changed: dict[str, Entry | None]) -> str:
        """Stores directory ``root`` with ``changed`` children set (None: removed)."""
        node = self._node(root)
        if isinstance(node, Index):
            total = node.total() + sum((entry is not None) - (name in self._part(node.digests[node.locate(name)]))
                                       for name, entry in changed.items())
            if total > SPLIT_ENTRIES:
                return self._change_split(batch, root, node, changed)
            previous: dict[str, Entry] = self.read(root)
            previous_digest = ""
        else:
            previous = node
            previous_digest = root if root != EMPTY_TREE else ""
        children = _with_changes(previous, changed)
        if len(children) > SPLIT_ENTRIES:
            return self.write(batch, children)
        return self.write(batch, children, previous_digest)

    def _change_split(self, batch: Batch, root: str, index: Index, changed: dict[str, Entry | None]) -> str:
        """A split directory that stays split: the parts holding changed children are cut
        again, going on into the next parts until a new part ends where an old one did; the
        parts after that are kept as they are (cutting depends only on the children from a
        part's start, and every part starts right after one that ended)."""
        by_part: dict[int, dict[str, Entry | None]] = {}
        for name, entry in changed.items():
            by_part.setdefault(index.locate(name), {})[name] = entry
        parts: list[tuple[str, int, str]] = []
        carried: list[tuple[str, Entry]] = []
        for i, digest in enumerate(index.digests):
            changes = by_part.get(i)
            if changes is None and not carried:
                parts.append((index.firsts[i], index.counts[i], digest))
                continue
            children = self._part(digest)
            # Sorted even unchanged: the node remembered under a part's digest may be another
            # directory with the same children, written in another order (an incremental capture
            # puts the children it adds last).
            items = sorted(_with_changes(children, changes).items() if changes else children.items())
            complete, carried = split_parts(carried + items)
            parts.extend(self._write_part(batch, part, digest) for part in complete)
        if carried:
            parts.append(self._write_part(batch, carried, index.digests[-1]))
        return self._write_index(batch, parts, root)


def _merged(base: Iterator[tuple[str, Entry]],
            target: Iterator[tuple[str, Entry]]) -> Iterator[tuple[str, Entry | None, Entry | None]]:
    """Two name-ordered streams of children as (name, base entry, target entry), in name order."""
    b, t = next(base, None), next(target, None)
    while b is not None or t is not None:
        if t is None or (b is not None and b[0] < t[0]):
            yield b[0], b[1], None
            b = next(base, None)
        elif b is None or t[0] < b[0]:
            yield t[0], None, t[1]
            t = next(target, None)
        else:
            yield b[0], b[1], t[1]
            b, t = next(base, None), next(target, None)
