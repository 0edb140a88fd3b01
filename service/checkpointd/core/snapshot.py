"""Snapshot engine: turns a workspace on disk into a stored tree.

A per-workspace stat index (path -> size, mtime, ctime, inode, digest), like git's
index, means an unchanged file is never read again. A file whose mtime is too close to
the moment it was indexed ("racily clean") is re-read, since a write in the same clock
tick would not change its stat.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass, field

from checkpointd.core.ignore import GITIGNORE, IgnoreRules
from checkpointd.core.store import Batch, ContentStore, digest_bytes
from checkpointd.core.tree import Entry, EntryKind, Trees
from checkpointd.core.workspace import Workspace

#: Files modified this close to their indexing are re-read on the next capture.
RACY_WINDOW_NS = 2_000_000_000
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

SKIP_TOO_LARGE = "FILE_TOO_LARGE"
SKIP_UNSUPPORTED = "UNSUPPORTED_FILE_TYPE"
SKIP_UNREADABLE = "UNREADABLE"


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    size: int
    reason: str


@dataclass(slots=True)
class CaptureResult:
    tree: str
    file_count: int = 0
    total_size: int = 0
    skipped: list[Skipped] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Indexed:
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    digest: str
    indexed_ns: int

    def matches(self, st: os.stat_result) -> bool:
        return (
            self.size == st.st_size
            and self.mtime_ns == st.st_mtime_ns
            and self.ctime_ns == st.st_ctime_ns
            and self.ino == st.st_ino
            and st.st_mtime_ns < self.indexed_ns - RACY_WINDOW_NS
        )


class StatIndex:
    """Remembers digests of files already stored, per workspace root."""

    def __init__(self) -> None:
        self._by_root: dict[str, dict[str, _Indexed]] = {}
        self._lock = threading.Lock()

    def for_root(self, root: str) -> dict[str, _Indexed]:
        with self._lock:
            return self._by_root.setdefault(root, {})

    def clear(self) -> None:
        with self._lock:
            self._by_root.clear()


def disk_rules(workspace: Workspace, patterns: list[str], excluded: list[str]) -> IgnoreRules:
    def load(directory: str) -> str | None:
        data = workspace.read_small(f"{directory}/{GITIGNORE}" if directory else GITIGNORE)
        return data.decode("utf-8", "replace") if data is not None else None

    return IgnoreRules(patterns, load, excluded)


class Snapshotter:
    def __init__(self, store: ContentStore, trees: Trees, index: StatIndex) -> None:
        self.store = store
        self.trees = trees
        self.index = index

    def capture(self, workspace: Workspace, rules: IgnoreRules, max_file_size: int, batch: Batch) -> CaptureResult:
        """Stores every captured file of the workspace in ``batch``; returns the tree."""
        indexed = self.index.for_root(workspace.root)
        result = CaptureResult(tree="")
        now_ns = time.time_ns()
        fresh: dict[str, _Indexed] = {}
        with workspace.root_fd() as root_fd:
            fd = os.dup(root_fd)
            result.tree = self._capture_dir(fd, "", rules, max_file_size, batch, indexed, fresh, now_ns, result)
        with self.index._lock:
            indexed.update(fresh)
        return result

    def _capture_dir(self, dir_fd: int, prefix: str, rules: IgnoreRules, max_size: int, batch: Batch,
                     indexed: dict[str, _Indexed], fresh: dict[str, _Indexed], now_ns: int,
                     result: CaptureResult) -> str:
        children: dict[str, Entry] = {}
        try:
            with os.scandir(dir_fd) as it:
                listing = sorted(it, key=lambda de: de.name)
            for de in listing:
                name = de.name
                if name.startswith(".checkpointd-tmp-"):
                    continue
                path = prefix + name
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                mode = stat.S_IMODE(st.st_mode) & 0o777
                if stat.S_ISDIR(st.st_mode):
                    if rules.ignores_entry(path, is_dir=True):
                        continue
                    try:
                        sub_fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                    except OSError:
                        result.skipped.append(Skipped(path, 0, SKIP_UNREADABLE))
                        continue
                    subtree = self._capture_dir(sub_fd, path + "/", rules, max_size, batch, indexed, fresh,
                                                now_ns, result)
                    children[name] = Entry(EntryKind.DIR, mode, 0, subtree)
                elif rules.ignores_entry(path, is_dir=False):
                    continue
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(name, dir_fd=dir_fd)
                    raw = os.fsencode(target)
                    children[name] = Entry(EntryKind.SYMLINK, 0o777, len(raw), digest_bytes(raw), target)
                    result.file_count += 1
                    result.total_size += len(raw)
                elif stat.S_ISREG(st.st_mode):
                    if st.st_size > max_size:
                        result.skipped.append(Skipped(path, st.st_size, SKIP_TOO_LARGE))
                        continue
                    entry = self._capture_file(dir_fd, name, path, st, mode, batch, indexed, fresh, now_ns)
                    if entry is None:
                        result.skipped.append(Skipped(path, st.st_size, SKIP_UNREADABLE))
                        continue
                    children[name] = entry
                    result.file_count += 1
                    result.total_size += entry.size
                else:
                    result.skipped.append(Skipped(path, st.st_size, SKIP_UNSUPPORTED))
        finally:
            os.close(dir_fd)
        return self.trees.write(batch, children)

    def _capture_file(self, dir_fd: int, name: str, path: str, st: os.stat_result, mode: int, batch: Batch,
                      indexed: dict[str, _Indexed], fresh: dict[str, _Indexed], now_ns: int) -> Entry | None:
        known = indexed.get(path)
        if known is not None and known.matches(st) and self.store.has(known.digest):
            return Entry(EntryKind.FILE, mode, known.size, known.digest)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                return None
            digest, size = batch.put_fd(fd, opened.st_size)
        finally:
            os.close(fd)
        if size == opened.st_size:
            fresh[path] = _Indexed(size, opened.st_mtime_ns, opened.st_ctime_ns, opened.st_ino, digest, now_ns)
        return Entry(EntryKind.FILE, stat.S_IMODE(opened.st_mode) & 0o777, size, digest)

    def capture_paths(self, workspace: Workspace, paths: list[str], batch: Batch) -> dict[str, Entry]:
        """Entries for specific paths, whatever the ignore rules and size cap say.

        Used for a rollback's safety checkpoint: anything the rollback will replace must
        be recoverable, even a file the current rules leave out. Missing paths are absent.
        """
        out: dict[str, Entry] = {}
        for path in paths:
            st = workspace.lstat(path)
            if st is None:
                continue
            mode = stat.S_IMODE(st.st_mode) & 0o777
            parent, _, name = path.rpartition("/")
            with workspace.dir_fd(parent) as dfd:
                if stat.S_ISDIR(st.st_mode):
                    out[path] = Entry(EntryKind.DIR, mode)
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(name, dir_fd=dfd)
                    raw = os.fsencode(target)
                    out[path] = Entry(EntryKind.SYMLINK, 0o777, len(raw), digest_bytes(raw), target)
                elif stat.S_ISREG(st.st_mode):
                    fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
                    try:
                        digest, size = batch.put_fd(fd, st.st_size)
                    finally:
                        os.close(fd)
                    out[path] = Entry(EntryKind.FILE, mode, size, digest)
        return out
