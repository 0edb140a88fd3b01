"""Rollback of workspace files: plan the delta between the live workspace and a target
tree, then apply it.

What a rollback may touch follows one rule: it deletes only what the target checkpoint
accounts for — paths the target's own ignore rules would have captured and did not skip.
Anything else (ignored then, too large then, ignored now and absent then) stays. Every
path it will overwrite or delete is captured into the safety checkpoint first, even if
the current ignore rules leave it out.

Planning changes nothing, so a conflict found then leaves the workspace as it was. Applying
can still fail part-way (a directory swapped for a symlink meanwhile, a full disk, corrupt
content): that raises ``ApplyInterrupted``, which says what had been changed, and the caller
undoes exactly that (or finishes the rollback) through its journal entry.

**Writes racing a rollback.** The workspace is not locked: a tool may write while a rollback
is applied. Before it replaces or removes a path, the restorer checks that the path is still
what the safety capture saw, and stops (``Changed``) if not: a path the target creates must
still be absent; kind, permission bits and size must match; a file must have the stat identity
(inode, size, mtime, ctime) the stat index recorded for the capture. A file without such an
identity (none recorded, or modified within the index's racy window of the capture, where a
rewrite in the same clock tick would keep its mtime) is hashed instead, and its lstat taken
again after the hash. The check runs after the new content is written and synced to its
temporary name, right before the rename (or unlink, rmdir, mkdir): the window left is one
``lstat`` and one ``rename``, plus the hash for the few files that need one. What the check
cannot see: a writer that already holds the file open (or mapped) and writes after the check,
or between the check and the rename, writes to the replaced inode, and that content is lost;
so does a same-size rewrite within one timestamp tick of a hashed file's second ``lstat``.

**Durability, batched.** A rollback writes every file to its temporary name and renames it
into place without a sync each; all of them, and the directories whose entries changed, are
made durable together at the end (``SyncBatch``: concurrent fsyncs), before ``apply`` returns
and so before the journal entry goes and the rollback is acknowledged. A power cut before that
leaves the journal entry, whose recovery records whatever the workspace then holds (a renamed
file whose content did not reach the disk included) and brings every covered path to the
target. An undo is applied one change at a time, each durable before the next begins
(``batched=False``): a file's content is synced before its rename, and the directory a change
renamed, removed (unlink, rmdir) or made (mkdir) an entry in, or set the mode of, is synced right
after it (``Workspace._changing``). It takes back only paths that still hold what the rollback
wrote, so what it writes must never be seen half-durable; and its journal entry is removed right
after it without a sync, which the next synced commit of any checkpoint makes durable while
nothing syncs the workspace again: a removal or a new directory still unsynced then could be
lost in a power cut with no entry left to finish the undo (a new directory holding the user's
files included: their fsyncs do not make its entry in its parent durable).
When applying stops part-way, what was written is made durable before ``ApplyInterrupted`` is
raised, so the undo it leads to is recorded against writes that are on the disk.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from collections.abc import Callable, Collection, Iterator, Mapping

from checkpointd.core.capture.ignore import IgnoreRules
from checkpointd.core.capture.snapshot import file_mode
from checkpointd.core.capture.stat_index import Indexed
from checkpointd.core.kernel.errors import CheckpointdError, FailedPrecondition, Reason
from checkpointd.core.kernel.faults import Point, crash_point
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Change, Entry, EntryKind, Trees
from checkpointd.core.workspace.syncbatch import SyncBatch, SyncFailed
from checkpointd.core.workspace.workspace import Inaccessible, UnsafePath, Workspace, is_under

log = logging.getLogger("checkpointd.restore")

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HASH_CHUNK = 1 << 20

#: What a path holds after a change, as far as undoing it needs to know (None: absent).
Written = tuple[str, Entry | None]


def _in_scope(path: str, subset: Collection[str]) -> bool:
    return not subset or is_under(path, subset)


def _within(path: str, paths: Collection[str]) -> bool:
    """``path`` or one of its ancestors is in ``paths`` (a set: one look-up per level)."""
    while path:
        if path in paths:
            return True
        path = path.rpartition("/")[0]
    return False


def _ancestor_of_scope(path: str, subset: Collection[str]) -> bool:
    return any(s.startswith(path + "/") for s in subset)


def _conflict(path: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(Reason.ROLLBACK_CONFLICT, f"cannot roll back {path!r}: {why}; nothing was changed",
                              path=path)


class Changed(Exception):
    """A path is no longer what the safety capture saw: something wrote it during the rollback."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path!r} {why}")
        self.path = path
        self.why = why


class ApplyInterrupted(Exception):
    """Applying stopped at ``path``: the changes before it are made (``written`` lists what each
    changed path holds now, in order), the rest are not."""

    def __init__(self, path: str, why: str, cause: BaseException, written: list[Written]) -> None:
        super().__init__(f"{path!r}: {why}")
        self.path = path
        self.why = why
        self.cause = cause
        self.written = written

    @property
    def disk_full(self) -> bool:
        return isinstance(self.cause, OSError) and self.cause.errno in (errno.ENOSPC, errno.EDQUOT)

    @property
    def raced(self) -> bool:
        """Stopped because the path changed after the safety capture."""
        return isinstance(self.cause, Changed)


def removes_base(change: Change) -> bool:
    """Whether what stands at the path must go first: it goes, or a directory is on either side of
    a kind change. A file and a symlink replace each other in one rename, with no moment where
    the path is empty (an undo killed at such a moment could not tell its own removal from a
    user's deletion)."""
    base, target = change.base, change.target
    return base is not None and (target is None or (base.kind is not target.kind
                                                    and EntryKind.DIR in (base.kind, target.kind)))


def _depth(change: Change) -> int:
    return change.path.count("/")


def _kind(st: os.stat_result) -> EntryKind | None:
    if stat.S_ISREG(st.st_mode):
        return EntryKind.FILE
    if stat.S_ISDIR(st.st_mode):
        return EntryKind.DIR
    if stat.S_ISLNK(st.st_mode):
        return EntryKind.SYMLINK
    return None


def holds(current: Entry | None, written: Entry | None) -> bool:
    """Whether a path captured as ``current`` still holds what a rollback wrote there."""
    if written is None or current is None:
        return written is None and current is None
    if current.kind is not written.kind:
        return False
    if written.kind is EntryKind.FILE:
        return current.digest == written.digest and current.mode == written.mode
    if written.kind is EntryKind.SYMLINK:
        return current.target == written.target
    return True


class _Expect:
    """The check (see ``workspace.Check``) that a path still holds what the safety capture saw."""

    __slots__ = ("path", "entry", "known", "absent_ok")

    def __init__(self, path: str, entry: Entry | None, known: Indexed | None, absent_ok: bool = False) -> None:
        self.path = path
        self.entry = entry
        self.known = known
        #: A path already gone is fine for a removal: nothing is lost by not removing it.
        self.absent_ok = absent_ok

    def __call__(self, dir_fd: int, name: str) -> None:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            st = None
        expected = self.entry
        if st is None or expected is None:
            if st is not None:
                raise Changed(self.path, "was created after the rollback's safety checkpoint")
            if expected is not None and not self.absent_ok:
                raise Changed(self.path, "was deleted after the rollback's safety checkpoint")
            return
        kind = _kind(st)
        if kind is not expected.kind:
            raise Changed(self.path, f"became a {kind.name.lower() if kind else 'special file'} after the "
                                     "rollback's safety checkpoint")
        if kind is EntryKind.SYMLINK:
            if os.readlink(name, dir_fd=dir_fd) != expected.target:
                raise Changed(self.path, "was pointed elsewhere after the rollback's safety checkpoint")
        elif file_mode(st) != expected.mode:
            raise Changed(self.path, "had its permissions changed after the rollback's safety checkpoint")
        elif kind is EntryKind.FILE:
            self._same_file(dir_fd, name, st, expected)

    def _same_file(self, dir_fd: int, name: str, st: os.stat_result, expected: Entry) -> None:
        known = self.known
        if st.st_size != expected.size:
            raise Changed(self.path, "was written after the rollback's safety checkpoint")
        if known is not None:
            if known.matches(st):
                return
            if (known.ino, known.size, known.mtime_ns) != (st.st_ino, st.st_size, st.st_mtime_ns):
                raise Changed(self.path, "was written after the rollback's safety checkpoint")
            # Only the ctime moved: a chmod and back, a rename, or the link count of a hard-linked
            # file changing (this very rollback replacing another name of the same inode does
            # that). The content decides.
        # No identity the stat index vouches for: the content itself must be the captured one.
        if _digest(dir_fd, name, st) != expected.digest:
            raise Changed(self.path, "was written after the rollback's safety checkpoint")
        again = os.lstat(name, dir_fd=dir_fd)
        if (again.st_ino, again.st_size, again.st_mtime_ns, again.st_ctime_ns) != (
                st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            raise Changed(self.path, "was written while the rollback checked it")


def _digest(dir_fd: int, name: str, st: os.stat_result) -> str:
    """The SHA-256 of a regular file's content (what the content store names it by)."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    try:
        opened = os.fstat(fd)
        if opened.st_ino != st.st_ino or not stat.S_ISREG(opened.st_mode):
            return ""
        hasher = hashlib.sha256()
        while chunk := os.read(fd, _HASH_CHUNK):
            hasher.update(chunk)
        return hasher.hexdigest()
    finally:
        os.close(fd)


def _go_on() -> None:
    return None


class Restorer:
    def __init__(self, store: ContentStore, trees: Trees) -> None:
        self.store = store
        self.trees = trees

    def find_uncaptured(self, workspace: Workspace, current_tree: str, target_tree: str,
                        subset: Collection[str]) -> list[str]:
        """Target paths missing from the live capture but present on disk (ignored or
        skipped now); the rollback must capture them before replacing them."""
        found = []
        for change in self.trees.diff(current_tree, target_tree):
            if change.base is None and change.target is not None and (
                _in_scope(change.path, subset) or _ancestor_of_scope(change.path, subset)
            ) and workspace.lstat(change.path) is not None:
                found.append(change.path)
        return found

    def plan(self, workspace: Workspace, current_tree: str, target_tree: str, target_rules: IgnoreRules,
             target_skipped: Collection[str], subset: Collection[str],
             keep: Callable[[Change], bool] | None = None) -> list[Change]:
        """The changes that turn the live workspace into the target (only those ``keep`` accepts,
        when given: an undo takes back only what its rollback wrote).

        ``current_tree`` must already hold every uncaptured path the rollback touches
        (see find_uncaptured), so it describes everything that will be replaced.
        """
        changes = [c for c in self.trees.diff(current_tree, target_tree)
                   if self._wanted(c, subset) and (keep is None or keep(c))]
        removed: set[str] = set()
        kept: set[str] = set()
        for change in sorted(filter(removes_base, changes), key=_depth, reverse=True):
            path, base, target = change.path, change.base, change.target
            emptied = base.kind is not EntryKind.DIR or all(
                f"{path}/{name}" in removed for name in workspace.listdir(path))
            if target is not None:
                if not emptied:
                    raise _conflict(path, "a directory holding files the checkpoint does not account for "
                                          f"would have to become a {target.kind.name.lower()}")
                removed.add(path)
            elif emptied and not _within(path, target_skipped) and not target_rules.ignores_path(
                    path, base.kind is EntryKind.DIR):
                removed.add(path)
            else:
                kept.add(path)
        return [c for c in changes if c.path not in kept]

    @staticmethod
    def _wanted(change: Change, subset: Collection[str]) -> bool:
        """In the path subset, or an ancestor that must be created for it."""
        if _in_scope(change.path, subset):
            return True
        target, base = change.target, change.base
        return (_ancestor_of_scope(change.path, subset) and target is not None
                and (base is None or base.kind is not target.kind))

    def apply(self, workspace: Workspace, changes: list[Change], seen: Mapping[str, Indexed] | None = None,
              batched: bool = True, keep_going: Callable[[], None] = _go_on) -> None:
        """Removes what goes (deepest first), creates directories, writes files and links, then
        sets directory modes. Each path is checked against what the capture saw (``changes``'
        bases; ``seen``: the stat identities of files, from the capture's stat index) just before
        it is replaced or removed. Idempotent: applying the same changes again, as planned on a
        new capture, finishes a partial run. Everything is durable when it returns or raises
        ``ApplyInterrupted`` (``batched``: synced together at the end; else each change before the next).
        ``keep_going`` is called before each change: what it raises stops the run where it is
        (nothing undone, what was written left for whoever finishes the rollback). A read-only
        directory's owner-write window is journaled once for the run (``Workspace.windows_open``)."""
        with workspace.windows_open():
            self._apply_windowed(workspace, changes, seen, batched, keep_going)

    def _apply_windowed(self, workspace: Workspace, changes: list[Change], seen: Mapping[str, Indexed] | None,
                        batched: bool, keep_going: Callable[[], None]) -> None:
        if not batched:
            self._apply(workspace, changes, seen or {}, keep_going)
            return
        with workspace.batched_sync() as pending:
            try:
                written = self._apply(workspace, changes, seen or {}, keep_going)
            except ApplyInterrupted:
                _flush_before_undo(pending)
                raise
            crash_point(Point.RESTORE_UNSYNCED)
            try:
                pending.flush()
            except SyncFailed as exc:
                raise ApplyInterrupted(exc.path, exc.strerror or str(exc), exc.cause, written) from exc

    def _apply(self, workspace: Workspace, changes: list[Change], seen: Mapping[str, Indexed],
               keep_going: Callable[[], None]) -> list[Written]:
        current: dict[str, Entry | None] = {c.path: c.base for c in changes}
        written: list[Written] = []
        for step, change in self._steps(changes):
            keep_going()
            crash_point(Point.RESTORE_CHANGE)
            path = change.path
            try:
                now = step(workspace, change, current[path], seen.get(path))
            except Changed as exc:
                raise ApplyInterrupted(path, exc.why, exc, written) from exc
            except UnsafePath as exc:
                raise ApplyInterrupted(path, "a parent or the path itself was swapped for a symlink, "
                                             "file or directory during the rollback", exc, written) from exc
            except Inaccessible as exc:
                raise ApplyInterrupted(path, exc.cause.strerror or str(exc.cause), exc.cause, written) from exc
            except _NotEmpty as exc:
                raise ApplyInterrupted(path, "the directory is no longer empty", exc, written) from exc
            except OSError as exc:
                raise ApplyInterrupted(path, exc.strerror or str(exc), exc, written) from exc
            except CheckpointdError as exc:
                raise ApplyInterrupted(path, exc.message, exc, written) from exc
            if now is not _UNCHANGED:
                current[path] = now
                written.append((path, now))
        return written

    def _steps(self, changes: list[Change]) -> Iterator[tuple[Callable, Change]]:
        for change in sorted(filter(removes_base, changes), key=_depth, reverse=True):
            yield self._remove, change
        writes = [c for c in changes if c.target is not None]
        dirs = [c for c in writes if c.target.kind is EntryKind.DIR]
        for change in sorted(dirs, key=_depth):
            yield self._make_dir, change
        for change in writes:
            if change.target.kind is not EntryKind.DIR:
                yield self._write, change
        for change in sorted(dirs, key=_depth, reverse=True):
            yield self._set_dir_mode, change

    # Each step returns what the path holds afterwards (or _UNCHANGED).

    @staticmethod
    def _remove(workspace: Workspace, change: Change, current: Entry | None, known: Indexed | None) -> object:
        check = _Expect(change.path, current, known, absent_ok=True)
        if change.base.kind is EntryKind.DIR:
            if not workspace.remove_empty_dir(change.path, check):
                if change.target is not None:
                    raise _NotEmpty(change.path)
                return _UNCHANGED
        else:
            workspace.remove(change.path, check)
        return None

    @staticmethod
    def _make_dir(workspace: Workspace, change: Change, current: Entry | None, known: Indexed | None) -> object:
        workspace.make_dir(change.path, change.target.mode, _Expect(change.path, current, known))
        return Entry(EntryKind.DIR, change.target.mode | 0o700)

    def _write(self, workspace: Workspace, change: Change, current: Entry | None, known: Indexed | None) -> object:
        target = change.target
        check = _Expect(change.path, current, known)
        if target.kind is EntryKind.FILE:
            workspace.write_file(change.path, self.store.iter_chunks(target.digest), target.mode, check,
                                 again=lambda: self.store.iter_chunks(target.digest))
        else:
            workspace.write_symlink(change.path, target.target, check)
        return target

    @staticmethod
    def _set_dir_mode(workspace: Workspace, change: Change, current: Entry | None, known: Indexed | None) -> object:
        workspace.set_dir_mode(change.path, change.target.mode)
        return change.target


def _flush_before_undo(pending: SyncBatch) -> None:
    """Applying stopped: what it wrote is made durable before the undo is recorded against it. If
    that fails too, the undo goes on (it syncs each path it writes) and the failure is logged."""
    try:
        pending.flush()
    except SyncFailed as exc:
        log.error("could not sync %r after an interrupted rollback: %s", exc.path, exc.strerror)


#: A step that left its path as it was (a directory kept because something is still in it).
_UNCHANGED = object()


class _NotEmpty(Exception):
    """A directory that must be replaced still holds something."""
