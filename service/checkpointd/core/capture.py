"""Captures in time proportional to what changed.

Each workspace root keeps the result of its last capture (its "base": tree, counts,
skipped files, and the capture settings it was taken with). With the watcher on, the
next capture re-examines only the paths the file-watch journal reports as dirty, and
applies them to the base tree (``Trees.apply`` rewrites only the nodes on their paths).
It falls back to a full scan whenever the journal cannot vouch for completeness, the
capture settings changed, a ``.gitignore`` at the root changed, or anything looks
inconsistent. A ``.gitignore`` deeper down rescans just its directory.

Captures of one workspace are serialized until their batch is committed or aborted, so a
base always refers to committed objects; an aborted batch restores the previous base and
hands its dirty paths back to the journal.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field

from checkpointd.core import telemetry
from checkpointd.core.ignore import GITIGNORE, IgnoreRules
from checkpointd.core.index import Indexed, RootIndex
from checkpointd.core.snapshot import (
    DIR_FLAGS,
    SKIP_TOO_LARGE,
    SKIP_UNREADABLE,
    SKIP_UNSUPPORTED,
    CaptureResult,
    ScanTally,
    Skipped,
    Snapshotter,
    disk_rules,
    file_mode,
    read_file,
    stored,
    symlink_entry,
    when_finished,
)
from checkpointd.core.store import Batch
from checkpointd.core.telemetry import CaptureMode
from checkpointd.core.tree import Entry, EntryKind, Trees
from checkpointd.core.watcher import SUBTREE, Changes, Journal, Watcher
from checkpointd.core.workspace import UnsafePath, Workspace

log = logging.getLogger("checkpointd.capture")


class _NeedFullScan(Exception):
    """The dirty paths cannot be applied to the base safely."""


@dataclass
class _Base:
    settings: tuple
    tree: str
    file_count: int
    total_size: int
    skipped: dict[str, Skipped]
    #: The store's deletion count when taken (None: the store keeps none): after a deletion
    #: the base is used only if its tree is still stored.
    deletions: int | None


@dataclass
class _Root:
    lock: threading.RLock = field(default_factory=threading.RLock)
    base: _Base | None = None
    #: The ignore rules of the base, kept while no .gitignore and no directory changed.
    rules: IgnoreRules | None = None


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _under(path: str, prefixes: set[str]) -> bool:
    """Whether a proper ancestor of ``path`` is in ``prefixes``."""
    while path:
        path = _parent(path)
        if path in prefixes:
            return True
    return False


class Capturer:
    """Full or incremental captures of workspaces, with or without a watcher."""

    def __init__(self, snapshotter: Snapshotter, trees: Trees, watcher: Watcher | None) -> None:
        self.snapshotter = snapshotter
        self.trees = trees
        self.store = snapshotter.store
        self.watcher = watcher
        self._roots: dict[str, _Root] = {}
        self._roots_lock = threading.Lock()
        #: How the captures went, for tests and logs.
        self.counts = dict.fromkeys(CaptureMode, 0)

    def _captured(self, mode: CaptureMode, started: float) -> None:
        self.counts[mode] += 1
        telemetry.captured(mode, time.perf_counter() - started)

    def capture(self, workspace: Workspace, patterns: list[str], excluded: list[str], max_size: int,
                batch: Batch) -> CaptureResult:
        started = time.perf_counter()
        if self.watcher is None:
            result = self.snapshotter.capture(workspace, disk_rules(workspace, patterns, excluded), max_size, batch)
            self._captured(CaptureMode.UNWATCHED, started)
            return result
        with self._roots_lock:
            state = self._roots.setdefault(workspace.root, _Root())
        state.lock.acquire()
        settings = (tuple(patterns), tuple(excluded), max_size)
        previous = state.base
        journal: Journal | None = None
        changes = Changes({})
        try:
            with workspace.root_fd() as root_fd:
                journal = self.watcher.journal(workspace.root, root_fd)
            if journal is None:
                state.base = None
                mode = CaptureMode.UNWATCHED
                result = self.snapshotter.capture(workspace, disk_rules(workspace, patterns, excluded), max_size,
                                                  batch)
            else:
                result, changes, mode = self._capture_watched(state, journal, workspace, settings, max_size, batch)
            self._captured(mode, started)
        except BaseException:
            state.base = None
            if journal is not None:
                self.watcher.give_back(journal, changes)
            state.lock.release()
            raise

        def finished(committed: bool) -> None:
            if not committed:
                state.base = previous
                if journal is not None:
                    self.watcher.give_back(journal, changes)
            state.lock.release()

        if not when_finished(batch, finished):
            # A batch that cannot say whether it committed: the next capture must not build on this one.
            state.base = None
            state.lock.release()
        return result

    def _capture_watched(self, state: _Root, journal: Journal, workspace: Workspace, settings: tuple,
                         max_size: int, batch: Batch) -> tuple[CaptureResult, Changes, CaptureMode]:
        patterns, excluded = list(settings[0]), list(settings[1])
        synced = self.watcher.sync()
        changes = self.watcher.take(journal)
        base = state.base
        reason = changes.full
        if not synced:
            reason = "the file watcher could not be synced"
        elif base is None:
            reason = reason or "no previous capture"
        elif base.settings != settings:
            reason = "the capture settings changed"
        elif not self._still_stored(base):
            reason = "the last capture's tree was deleted from the store"
        if not reason:
            rules = state.rules
            if rules is None or any(kind & SUBTREE or path.rpartition("/")[2] == GITIGNORE
                                    for path, kind in changes.dirty.items()):
                rules = disk_rules(workspace, patterns, excluded)
            state.rules = rules
            try:
                result = self._incremental(base, changes.dirty, workspace, rules, max_size, batch, journal)
            except _NeedFullScan as why:
                reason = str(why)
            else:
                state.base = _Base(settings, result.tree, result.file_count, result.total_size,
                                   {s.path: s for s in result.skipped}, getattr(self.store, "deletions", None))
                return result, changes, CaptureMode.INCREMENTAL
        log.debug("full scan of %s: %s", workspace.root, reason)
        self.watcher.reset(journal)
        state.rules = disk_rules(workspace, patterns, excluded)
        result = self.snapshotter.capture(workspace, state.rules, max_size, batch, self._hook(journal))
        state.base = _Base(settings, result.tree, result.file_count, result.total_size,
                           {s.path: s for s in result.skipped}, getattr(self.store, "deletions", None))
        # Watches were dropped and added again during the scan: if its batch is not committed,
        # what happened meanwhile is known only to that scan, so the next capture scans fully.
        return result, Changes(changes.dirty, reason or "a full scan was not committed"), CaptureMode.FULL

    def _still_stored(self, base: _Base) -> bool:
        """Garbage collection deletes only what no checkpoint reaches: if the base's root node
        is still there, so is everything under it."""
        deletions = getattr(self.store, "deletions", None)
        return (deletions is not None and base.deletions == deletions) or self.store.has(base.tree)

    def _hook(self, journal: Journal):
        watcher = self.watcher
        active = [True]

        def on_dir(directory: str, dir_fd: int) -> None:
            if active[0] and not watcher.watch(journal, directory, dir_fd):
                active[0] = False

        return on_dir

    def _incremental(self, base: _Base, dirty: dict[str, int], workspace: Workspace, rules: IgnoreRules,
                     max_size: int, batch: Batch, journal: Journal) -> CaptureResult:
        dirty = {path: kind for path, kind in dirty.items() if path}
        for path in list(dirty):
            if path.rpartition("/")[2] == GITIGNORE:
                directory = _parent(path)
                if not directory:
                    raise _NeedFullScan("the root .gitignore changed")
                dirty[directory] = dirty.get(directory, 0) | SUBTREE
        indexed = self.snapshotter.index.for_root(workspace.root)
        apply = _Delta(base, self.trees, indexed)
        for path in sorted(dirty):
            if _under(path, apply.replaced):
                continue
            self._examine(path, dirty[path], apply, workspace, rules, max_size, batch, journal, indexed)
        tree = self.trees.apply(batch, base.tree, apply.updates) if apply.updates else base.tree
        self.snapshotter.remember(batch, indexed, apply.fresh, apply.stale)
        skipped = sorted(apply.skipped.values(), key=lambda s: s.path)
        return CaptureResult(tree, apply.file_count, apply.total_size, skipped)

    def _examine(self, path: str, kind: int, delta: _Delta, workspace: Workspace, rules: IgnoreRules,
                 max_size: int, batch: Batch, journal: Journal, indexed: RootIndex) -> None:
        """Works out the entry at one dirty path and records it in ``delta``."""
        old = self.trees.lookup(delta.base.tree, path)
        parent, _, name = path.rpartition("/")
        try:
            with workspace.dir_fd(parent) as parent_fd:
                self._examine_in(parent_fd, path, name, kind, old, delta, rules, max_size, batch, journal, indexed)
        except (FileNotFoundError, NotADirectoryError, UnsafePath):
            delta.set(path, old, None)

    def _examine_in(self, parent_fd: int, path: str, name: str, kind: int, old: Entry | None, delta: _Delta,
                    rules: IgnoreRules, max_size: int, batch: Batch, journal: Journal, indexed: RootIndex) -> None:
        try:
            st = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            st = None
        is_dir = st is not None and stat.S_ISDIR(st.st_mode)
        if st is None or rules.ignores_path(path, is_dir):
            delta.set(path, old, None)
            return
        parent = _parent(path)
        if parent:
            parent_entry = delta.updates[parent] if parent in delta.updates else self.trees.lookup(
                delta.base.tree, parent)
            if parent_entry is None or parent_entry.kind is not EntryKind.DIR:
                raise _NeedFullScan(f"{path!r} changed in a directory the last capture did not have")
        mode = file_mode(st)
        if is_dir:
            if kind & SUBTREE or old is None or old.kind is not EntryKind.DIR:
                self.watcher.reset(journal, path)
                tally = ScanTally()
                try:
                    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
                except OSError as exc:
                    raise _NeedFullScan(f"{path!r} changed while it was scanned") from exc
                subtree = self.snapshotter.scan(fd, path + "/", rules, max_size, batch, indexed, tally,
                                                self._hook(journal))
                delta.set(path, old, Entry(EntryKind.DIR, mode, 0, subtree), tally)
            elif old.mode != mode:
                delta.set(path, old, Entry(EntryKind.DIR, mode))
            return
        if stat.S_ISLNK(st.st_mode):
            delta.set(path, old, symlink_entry(os.readlink(name, dir_fd=parent_fd)))
            return
        if not stat.S_ISREG(st.st_mode):
            delta.set(path, old, None, skip=Skipped(path, st.st_size, SKIP_UNSUPPORTED))
            return
        if st.st_size > max_size:
            delta.set(path, old, None, skip=Skipped(path, st.st_size, SKIP_TOO_LARGE))
            return
        known = indexed.get(path)
        if known is not None and known.matches(st) and stored(batch, self.store, known.digest):
            delta.set(path, old, Entry(EntryKind.FILE, mode, known.size, known.digest))
            return
        now_ns = time.time_ns()
        previous = old.digest if old is not None and old.kind is EntryKind.FILE else ""
        result = read_file(parent_fd, name, batch, previous)
        if result is None:
            delta.set(path, old, None, skip=Skipped(path, st.st_size, SKIP_UNREADABLE))
            return
        entry, opened = result
        if entry.size == opened.st_size:
            delta.fresh[path] = Indexed(entry.size, opened.st_mtime_ns, opened.st_ctime_ns, opened.st_ino,
                                        entry.digest, now_ns)
        delta.set(path, old, entry)


class _Delta:
    """The updates of one incremental capture and their effect on the base's totals."""

    def __init__(self, base: _Base, trees: Trees, indexed: RootIndex) -> None:
        self.base = base
        self.trees = trees
        self.indexed = indexed
        self.updates: dict[str, Entry | None] = {}
        #: Paths whose whole subtree was decided here: dirty paths under them are moot.
        self.replaced: set[str] = set()
        self.file_count = base.file_count
        self.total_size = base.total_size
        self.skipped = dict(base.skipped)
        self.fresh: dict[str, Indexed] = {}
        self.stale: list[str] = []

    def set(self, path: str, old: Entry | None, new: Entry | None, tally: ScanTally | None = None,
            skip: Skipped | None = None) -> None:
        """Records that ``path`` goes from ``old`` (in the base) to ``new`` (None: absent)."""
        self.skipped.pop(path, None)
        gone_files: list[str] = []
        keeps_children = new is not None and new.kind is EntryKind.DIR and not new.digest
        if old is not None and old.kind is EntryKind.DIR:
            if not keeps_children:
                self._drop_skipped_under(path)
                for sub_path, entry in self.trees.flatten(old.digest, path + "/"):
                    if entry.kind is not EntryKind.DIR:
                        self.file_count -= 1
                        self.total_size -= entry.size
                        gone_files.append(sub_path)
        elif old is not None:
            self.file_count -= 1
            self.total_size -= old.size
        if old is None or old.kind is not EntryKind.DIR:
            self._drop_skipped_under(path)
        if new is not None and new.kind is not EntryKind.DIR:
            self.file_count += 1
            self.total_size += new.size
        if new is not None or old is not None:
            self.updates[path] = new
        if not keeps_children:
            self.replaced.add(path)
        seen: set[str] = set()
        if tally is not None:
            self.file_count += tally.file_count
            self.total_size += tally.total_size
            for skipped in tally.skipped:
                self.skipped[skipped.path] = skipped
            self.fresh.update(tally.fresh)
            seen = tally.seen
        if skip is not None:
            self.skipped[path] = skip
        if new is None or new.kind is not EntryKind.FILE:
            gone_files.append(path)
        self.stale.extend(p for p in gone_files if p not in seen and p in self.indexed.entries)

    def _drop_skipped_under(self, path: str) -> None:
        inner = path + "/"
        for skipped_path in [p for p in self.skipped if p.startswith(inner)]:
            del self.skipped[skipped_path]

