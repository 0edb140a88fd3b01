"""Captures in time proportional to what changed.

Each workspace root keeps the result of its last capture (its "base": tree, counts,
skipped files, and the capture settings it was taken with). With the watcher on, the
next capture re-examines only the paths the file-watch journal reports as dirty, and
applies them to the base tree (``Trees.apply`` rewrites only the nodes on their paths).
It falls back to a full scan whenever the journal cannot vouch for completeness, the
capture settings changed, a ``.gitignore`` at the root changed, or anything looks
inconsistent. A ``.gitignore`` deeper down rescans just its directory.

What the journal cannot see is re-examined by every capture: files with more than one name
(a write through a name in another directory, or outside the workspace, reports only there),
kept in the base with their inodes, and mount points inside the workspace (see ``mounts``).
A linked file stays re-examined after its other names are gone, for as long as its path holds
the same inode: a writer that opened it by a name since removed writes on, and that name's
watch (if it had one) no longer reports it.
A file that gains a name inside the workspace may have others the base does not know as
linked, so a capture that meets a new linked inode scans fully. The stat index spares the
reads of what did not change.

A base is built on only while it is safe to: captures of one workspace are serialized until
their batch is committed or aborted (an aborted batch restores the previous base and hands
its dirty paths back to the journal; a capture that fails, or whose caller gives up, see
``snapshot.cancellation_of``, hands them back and leaves no base: the next capture scans
fully); a committed capture becomes a base only once a
checkpoint row references it (``record``), since garbage collection keeps only what rows
reach; and after any deletion from the store (``deletions``) the next capture scans fully,
re-checking every object it reuses.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from checkpointd.core.capture.ignore import GITIGNORE, IgnoreRules
from checkpointd.core.capture.snapshot import (
    DIR_FLAGS,
    ENTRY_ATTEMPTS,
    FLIPPED,
    MAX_DIR_DEPTH,
    SKIP_TOO_DEEP,
    SKIP_TOO_LARGE,
    SKIP_UNREADABLE,
    SKIP_UNSUPPORTED,
    CaptureResult,
    Inode,
    ScanTally,
    Skipped,
    Snapshotter,
    cancellation_of,
    disk_rules,
    file_mode,
    read_file,
    reporting_unapplied,
    stored,
    symlink_entry,
    too_deep,
    when_finished,
)
from checkpointd.core.capture.stat_index import Indexed, RootIndex
from checkpointd.core.capture.watcher import ENTRY, SUBTREE, Changes, Journal, Watcher
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.errors import Cancelled
from checkpointd.core.kernel.telemetry import CaptureMode
from checkpointd.core.store.content_store import Batch
from checkpointd.core.store.tree import Entry, EntryKind, Trees
from checkpointd.core.workspace.mounts import MountTable, MountTableUnavailable
from checkpointd.core.workspace.workspace import Directories, Inaccessible, UnsafePath, Workspace

log = logging.getLogger("checkpointd.capture")


class _NeedFullScan(Exception):
    """The dirty paths cannot be applied to the base safely."""


class _Flipped(Exception):
    """An entry changed type between two looks at it."""


@dataclass
class _Base:
    settings: tuple
    tree: str
    file_count: int
    total_size: int
    skipped: dict[str, Skipped]
    #: The store's deletion count when the capture began (None: the store keeps none). Any
    #: deletion since may have taken objects the base reaches: the next capture scans fully.
    deletions: int | None
    #: Files with several names (see ``CaptureResult.linked``): re-examined by every capture.
    linked: dict[str, Inode]
    #: Mount points under the root when it was taken: re-examined by every capture, and so
    #: are those that appear or go.
    mounts: frozenset[str]
    #: Whether a checkpoint row references the tree (see ``Capturer.record``). Until one does,
    #: garbage collection may take what only this tree reaches: it is not built on.
    recorded: bool = False


@dataclass
class Unreported:
    """A path a recheck marks (see ``Capturer.mark_unreported``) as ``kind`` (ENTRY or SUBTREE),
    because the indexed files ``witnesses`` no longer matched their entries (path, entry): any
    one of them not reported by an event nor recorded since is reason enough."""

    kind: int
    witnesses: list[tuple[str, Indexed]] = field(default_factory=list)


@dataclass
class _Root:
    lock: threading.RLock = field(default_factory=threading.RLock)
    base: _Base | None = None
    #: The ignore rules of the base, kept while no .gitignore and no directory changed.
    rules: IgnoreRules | None = None


def _restat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


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
        self.mounts = MountTable()
        #: How the captures went, for tests and logs.
        self.counts = dict.fromkeys(CaptureMode, 0)

    def close(self) -> None:
        self.mounts.close()

    def mark_unreported(self, journal: Journal, moved: Mapping[str, Unreported]) -> list[str]:
        """Marks dirty what a recheck found moved (``moved``: path to mark -> the indexed files that
        showed it, with the index entries they were compared with), unless an event reported it, or
        an event reported or a capture recorded each of those files since; returns the paths
        marked. Nothing while a capture of the workspace is on (it may have taken the events and not
        yet recorded the files): the next recheck looks again."""
        with self._roots_lock:
            state = self._roots.get(journal.root)
        if self.watcher is None or state is None or not state.lock.acquire(blocking=False):
            return []
        try:
            if not self.watcher.sync():
                return []
            index = self.snapshotter.index.for_root(journal.root)
            # A path none of whose witnesses is still as the recheck saw it is not marked (add_unreported).
            return self.watcher.add_unreported(journal, {
                path: (seen.kind, [w for w, known in seen.witnesses if index.get(w) == known])
                for path, seen in moved.items()})
        finally:
            state.lock.release()

    def _captured(self, mode: CaptureMode, started: float) -> None:
        self.counts[mode] += 1
        telemetry.captured(mode, time.perf_counter() - started)

    def capture(self, workspace: Workspace, patterns: list[str], excluded: list[str], max_size: int,
                batch: Batch) -> CaptureResult:
        started = time.perf_counter()
        # Read before anything is looked up in the store: a deletion during the capture counts.
        deletions = getattr(self.store, "deletions", None)
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
        resets = 0
        try:
            with workspace.root_fd() as root_fd:
                journal = self.watcher.journal(workspace.root, root_fd)
            resets = journal.resets if journal is not None else 0
            if journal is None:
                state.base = None
                mode = CaptureMode.UNWATCHED
                result = self.snapshotter.capture(workspace, disk_rules(workspace, patterns, excluded), max_size,
                                                  batch)
            else:
                synced = self.watcher.sync()
                # Taken here: a capture that fails (or whose caller gives up) hands them back below.
                changes = self.watcher.take(journal)
                result, changes, mode = self._capture_watched(state, journal, synced, changes, workspace, settings,
                                                              max_size, batch, deletions)
            self._captured(mode, started)
        except BaseException as failure:
            # A capture stopped because its caller gave up keeps the base, unless it had dropped
            # watches to scan a directory again (what changes there until a scan adds them back
            # is seen by no event): what it took goes back to the journal, and the next capture
            # builds on that base again (a rollback given up on must not make the next checkpoint
            # of a large workspace a full scan). Any other failure drops the base: the next
            # capture scans in full, which also gets past a base that no longer reads.
            if (not isinstance(failure, Cancelled) or journal is None or journal.resets != resets
                    or state.base is not previous):
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

    def record(self, workspace_root: str, tree: str) -> None:
        """Says that a committed checkpoint row references ``tree``, the last capture of
        ``workspace_root``: the next capture may build on it. A capture no row references (a
        diff against the live workspace, a create or rollback whose row failed) is never built
        on, as garbage collection may delete what only it reaches."""
        with self._roots_lock:
            state = self._roots.get(workspace_root)
        if state is None:
            return
        with state.lock:
            if state.base is not None and state.base.tree == tree:
                state.base.recorded = True

    def _capture_watched(self, state: _Root, journal: Journal, synced: bool, changes: Changes, workspace: Workspace,
                         settings: tuple, max_size: int, batch: Batch,
                         deletions: int | None) -> tuple[CaptureResult, Changes, CaptureMode]:
        """Captures ``workspace`` from ``changes`` (taken from its journal, after a sync that
        succeeded if ``synced``) applied to the base, else by a full scan."""
        patterns, excluded = list(settings[0]), list(settings[1])
        base = state.base
        try:
            mounts = self.mounts.under(workspace.root)
            reason = changes.full
        except MountTableUnavailable as exc:
            mounts = frozenset()
            reason = changes.full or str(exc)
        if not synced:
            reason = "the file watcher could not be synced"
        elif base is None:
            reason = reason or "no previous capture"
        elif base.settings != settings:
            reason = "the capture settings changed"
        elif not base.recorded:
            reason = "no checkpoint references the last capture"
        elif deletions is None or base.deletions != deletions:
            reason = "objects were deleted from the store since the last capture"
        if not reason:
            indexed = self.snapshotter.index.for_root(workspace.root)
            try:
                with workspace.directories() as dirs:
                    dirty, unchanged_linked = self._unvouched(base, changes.dirty, mounts, dirs, indexed)
                    rules = state.rules
                    if rules is None or any(kind & SUBTREE or path.rpartition("/")[2] == GITIGNORE
                                            for path, kind in dirty.items()):
                        rules = disk_rules(workspace, patterns, excluded)
                    state.rules = rules
                    result = self._incremental(base, dirty, unchanged_linked, dirs, rules, max_size, batch,
                                               journal, indexed)
            except _NeedFullScan as why:
                reason = str(why)
            else:
                state.base = _Base(settings, result.tree, result.file_count, result.total_size,
                                   {s.path: s for s in result.skipped}, deletions, result.linked, mounts)
                return result, changes, CaptureMode.INCREMENTAL
        log.debug("full scan of %s: %s", workspace.root, reason)
        self.watcher.reset(journal)
        state.rules = disk_rules(workspace, patterns, excluded)
        result = self.snapshotter.capture(workspace, state.rules, max_size, batch, self._hook(journal))
        self._still_linked(base, result, workspace)
        state.base = _Base(settings, result.tree, result.file_count, result.total_size,
                           {s.path: s for s in result.skipped}, deletions, result.linked, mounts)
        # Watches were dropped and added again during the scan: if its batch is not committed,
        # what happened meanwhile is known only to that scan, so the next capture scans fully.
        return result, Changes(changes.dirty, reason or "a full scan was not committed"), CaptureMode.FULL

    def _unvouched(self, base: _Base, dirty: dict[str, int], mounts: frozenset[str], dirs: Directories,
                   indexed: RootIndex) -> tuple[dict[str, int], dict[str, Inode]]:
        """The journal's dirty paths plus what it cannot vouch for: the base's linked files whose
        stat no longer matches the index, and every mount point (those there now, and those that
        came or went since). Also returns the linked files found unchanged."""
        if not base.linked and not mounts and not base.mounts:
            return dirty, {}
        extended = dict(dirty)
        unchanged = self._unchanged_linked(base, dirs, indexed)
        for path in base.linked:
            if path not in unchanged:
                extended[path] = extended.get(path, 0) | ENTRY
        for path in mounts | base.mounts:
            parent = _parent(path)
            # A mount point in a directory the base did not capture (ignored, unreadable) is moot.
            if parent:
                entry = self.trees.lookup(base.tree, parent)
                if entry is None or entry.kind is not EntryKind.DIR:
                    continue
            extended[path] = extended.get(path, 0) | SUBTREE
        return extended, unchanged

    @staticmethod
    def _unchanged_linked(base: _Base, dirs: Directories, indexed: RootIndex) -> dict[str, Inode]:
        """The base's linked files that are still what the base recorded: the same inode and a
        stat that matches the index (a write through any name changes it)."""
        unchanged: dict[str, Inode] = {}
        for path in sorted(base.linked):
            parent, _, name = path.rpartition("/")
            try:
                st = os.lstat(name, dir_fd=dirs.fd(parent))
            except (OSError, UnsafePath):
                continue
            known = indexed.get(path)
            if (stat.S_ISREG(st.st_mode) and known is not None
                    and (st.st_dev, st.st_ino) == base.linked[path] and known.matches(st)):
                unchanged[path] = base.linked[path]
        return unchanged

    @staticmethod
    def _still_linked(base: _Base | None, result: CaptureResult, workspace: Workspace) -> None:
        """Adds to a full scan's linked files those of ``base`` whose path still holds the same
        inode, though it has one name now (see the module docstring)."""
        if base is None:
            return
        for path, inode in base.linked.items():
            if path not in result.linked:
                try:
                    st = workspace.lstat(path)
                except Inaccessible:
                    continue
                if st is not None and stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == inode:
                    result.linked[path] = inode

    def _hook(self, journal: Journal):
        watcher = self.watcher
        active = [True]

        def on_dir(directory: str, dir_fd: int) -> None:
            if active[0] and not watcher.watch(journal, directory, dir_fd):
                active[0] = False

        return on_dir

    def _incremental(self, base: _Base, dirty: dict[str, int], unchanged_linked: dict[str, Inode],
                     dirs: Directories, rules: IgnoreRules, max_size: int, batch: Batch, journal: Journal,
                     indexed: RootIndex) -> CaptureResult:
        # Deeper paths are under a directory too deep to be entered (see ``MAX_DIR_DEPTH``).
        dirty = {path: kind for path, kind in dirty.items() if path and path.count("/") <= MAX_DIR_DEPTH}
        for path in list(dirty):
            if path.rpartition("/")[2] == GITIGNORE:
                directory = _parent(path)
                if not directory:
                    raise _NeedFullScan("the root .gitignore changed")
                dirty[directory] = dirty.get(directory, 0) | SUBTREE
        apply = _Delta(base, self.trees, indexed)
        cancel = cancellation_of(batch)
        for path in sorted(dirty):
            cancel.check()
            if _under(path, apply.replaced):
                continue
            self._examine(path, dirty[path], apply, dirs, rules, max_size, batch, journal, indexed)
        known_inodes = set(base.linked.values())
        if not known_inodes.issuperset(apply.linked.values()):
            # Its other names in the workspace may be files the base took for single ones.
            raise _NeedFullScan("a file gained another name (a hard link)")
        linked = apply.linked
        for path, inode in unchanged_linked.items():
            if path not in apply.updates and not _under(path, apply.replaced):
                linked[path] = inode
        tree = self.trees.apply(batch, base.tree, apply.updates) if apply.updates else base.tree
        self.snapshotter.remember(batch, indexed, apply.fresh, apply.stale)
        skipped = reporting_unapplied(apply.skipped.values(), rules)
        return CaptureResult(tree, apply.file_count, apply.total_size, skipped, linked)

    def _examine(self, path: str, kind: int, delta: _Delta, dirs: Directories, rules: IgnoreRules,
                 max_size: int, batch: Batch, journal: Journal, indexed: RootIndex) -> None:
        """Works out the entry at one dirty path and records it in ``delta``. An entry that
        changes type meanwhile is looked at again, a few times; one that keeps changing, or a
        path that cannot be reached, is left to a full scan."""
        old = self.trees.lookup(delta.base.tree, path)
        parent, _, name = path.rpartition("/")
        for _attempt in range(ENTRY_ATTEMPTS):
            try:
                self._examine_in(dirs.fd(parent), path, name, kind, old, delta, rules, max_size, batch, journal,
                                 indexed)
                return
            except (FileNotFoundError, NotADirectoryError, UnsafePath):
                delta.set(path, old, None)
                return
            except _Flipped:
                delta.linked.pop(path, None)
                continue
            except OSError as exc:
                raise _NeedFullScan(f"{path!r} could not be examined ({exc.strerror or exc})") from exc
        raise _NeedFullScan(f"{path!r} kept changing type while it was examined")

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
            if too_deep(path):
                delta.set(path, old, None, skip=Skipped(path, 0, SKIP_TOO_DEEP))
            elif (kind & SUBTREE or old is None or old.kind is not EntryKind.DIR
                  or _may_read_differently(old.mode, mode) or _skipped_under(delta.base, path)):
                # A directory whose read or search bits changed, or under which the base skipped
                # something, is scanned again: what the server may
                # list, enter and read in it may have changed, and inotify reports that change of
                # the directory alone, none of its entries.
                try:
                    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
                except OSError as exc:
                    if exc.errno in FLIPPED:
                        raise _Flipped(path) from exc
                    raise _NeedFullScan(f"{path!r} changed while it was scanned") from exc
                self.watcher.reset(journal, path)
                tally = ScanTally()
                subtree = self.snapshotter.scan(fd, path + "/", rules, max_size, batch, indexed, tally,
                                                self._hook(journal))
                delta.set(path, old, Entry(EntryKind.DIR, mode, 0, subtree), tally)
            elif old.mode != mode:
                delta.set(path, old, Entry(EntryKind.DIR, mode))
            return
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=parent_fd)
            except OSError as exc:
                if exc.errno in FLIPPED:
                    raise _Flipped(path) from exc
                raise
            delta.set(path, old, symlink_entry(target))
            return
        if not stat.S_ISREG(st.st_mode):
            delta.set(path, old, None, skip=Skipped(path, st.st_size, SKIP_UNSUPPORTED))
            return
        if _stays_linked(delta.base, path, st):
            delta.linked[path] = (st.st_dev, st.st_ino)
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
            now = _restat(parent_fd, name)
            if now is None or not stat.S_ISREG(now.st_mode) or now.st_ino != st.st_ino:
                raise _Flipped(path)
            delta.set(path, old, None, skip=Skipped(path, st.st_size, SKIP_UNREADABLE))
            return
        entry, opened = result
        if _stays_linked(delta.base, path, opened):
            delta.linked[path] = (opened.st_dev, opened.st_ino)
        if entry.size == opened.st_size:
            delta.fresh[path] = Indexed(entry.size, opened.st_mtime_ns, opened.st_ctime_ns, opened.st_ino,
                                        entry.digest, now_ns)
        delta.set(path, old, entry)


def _may_read_differently(old_mode: int, mode: int) -> bool:
    """Whether a directory's mode changed in a way that may change what the server can read in
    it: its read or search bits moved. Even a root server heeds them for a directory whose owner
    its user namespace does not map (a rootless container), so capabilities are not consulted."""
    return bool((old_mode ^ mode) & 0o555)


def _skipped_under(base: _Base, path: str) -> bool:
    prefix = path + "/"
    return any(skipped.startswith(prefix) for skipped in base.skipped)


def _stays_linked(base: _Base, path: str, st: os.stat_result) -> bool:
    """Whether the file at ``path`` is re-examined by every capture: it has several names, or
    had when the base was taken and is still that file (see the module docstring)."""
    return st.st_nlink > 1 or base.linked.get(path) == (st.st_dev, st.st_ino)


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
        #: Linked files met by this capture (see ``CaptureResult.linked``).
        self.linked: dict[str, Inode] = {}

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
            self.linked.update(tally.linked)
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

