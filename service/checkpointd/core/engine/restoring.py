"""The steps a rollback and the recovery of an unfinished one share: planning the changes that
bring a workspace to a checkpoint, noting what the planning capture saw, and the state a
safety checkpoint records."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import replace

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from checkpointd.core.capture.ignore import GITIGNORE, MAX_GITIGNORE_BYTES, IgnoreRules
from checkpointd.core.capture.snapshot import CaptureResult
from checkpointd.core.capture.stat_index import Indexed
from checkpointd.core.engine.parts import EngineParts
from checkpointd.core.kernel.errors import CheckpointdError, FailedPrecondition, Reason
from checkpointd.core.metadata.models import CheckpointRow
from checkpointd.core.restore.journal import JournalEntry, RollbackJournal
from checkpointd.core.restore.restorer import holds, removes_base
from checkpointd.core.store.content_store import Batch
from checkpointd.core.store.tree import Change, Entry, EntryKind
from checkpointd.core.workspace.windows import Window
from checkpointd.core.workspace.workspace import Inaccessible, UnsafePath, Workspace

log = logging.getLogger("checkpointd.engine")


def plan_restore(parts: EngineParts, root: str, capture: CaptureResult, goal: CheckpointRow,
                 subset: tuple[str, ...], batch: Batch,
                 written: tuple[tuple[str, Entry | None], ...] | None = None,
                 interim: tuple[str, ...] = ()) -> list[Change]:
    """The changes that bring ``subset`` of the workspace to ``goal`` (with ``written``: only
    at paths that still hold what a rollback wrote there, or what an earlier attempt at the undo
    left half-way at its ``interim`` paths); first adds to ``capture`` whatever they would
    replace that the capture left out (ignored or skipped now)."""
    workspace = Workspace(root)
    keep = None
    if written is not None:
        wrote = dict(written)
        halfway = frozenset(interim)

        def keep(change: Change) -> bool:
            # A directory is made again where nothing stands now (that overwrites nothing): an undo
            # killed between removing the file the rollback put where a directory was and making
            # the directory again leaves the path empty, and the directory's files go back into it.
            # A file where nothing stands is not, unless the undo journaled it may have emptied the
            # path itself: else someone deleted what the rollback wrote there, and that deletion,
            # made after the rollback began, wins (the safety checkpoint has it). A directory the
            # undo made and left before its mode step (owner-rwx until then) is still its own.
            path, base, target = change.path, change.base, change.target
            if path not in wrote:
                return False
            if holds(base, wrote[path]) or (base is None and target.kind is EntryKind.DIR):
                return True
            return path in halfway and (base is None or (  # as Workspace.make_dir leaves it
                base.kind is EntryKind.DIR and target is not None and target.kind is EntryKind.DIR
                and base.mode == target.mode | 0o700))

    try:
        uncaptured = parts.restorer.find_uncaptured(workspace, capture.tree, goal.tree_digest, subset)
        if uncaptured:
            extra = parts.snapshotter.capture_paths(workspace, uncaptured, batch)
            capture.tree = parts.trees.apply(batch, capture.tree, extra)
            capture.file_count += sum(e.kind is not EntryKind.DIR for e in extra.values())
            capture.total_size += sum(e.size for e in extra.values())
            capture.skipped = [s for s in capture.skipped if s.path not in extra]
            capture.unindexed.update(extra)
        changes = parts.restorer.plan(workspace, capture.tree, goal.tree_digest, _target_rules(parts, goal),
                                      {s[0] for s in goal.skipped}, subset, keep)
        return changes if written is None else _with_a_directory_to_go_in(parts, capture.tree, changes)
    except Inaccessible as exc:
        raise FailedPrecondition(Reason.ROLLBACK_CONFLICT,
                                 f"cannot roll back: {exc.path!r} cannot be read ({exc.cause.strerror}); "
                                 "nothing was changed", path=exc.path, errno=errno_name(exc.cause)) from exc
    except (UnsafePath, FileNotFoundError, NotADirectoryError) as exc:
        raise FailedPrecondition(Reason.ROLLBACK_CONFLICT,
                                 f"the workspace changed while the rollback was being planned ({exc}); "
                                 "nothing was changed", path=str(exc)[:512]) from exc


def interim_paths(changes: list[Change]) -> frozenset[str]:
    """Where an undo applying ``changes`` passes through a state that is neither what the
    rollback wrote nor what the undo puts back (see ``JournalEntry.interim``)."""
    return frozenset(c.path for c in changes if c.target is not None and (
        removes_base(c) or (c.target.kind is EntryKind.DIR and (c.base is None or c.base.kind is not EntryKind.DIR))))


class OpenedWindows:
    """The journal of a rollback's owner-write windows (``core/workspace/windows.py``): a window
    is recorded durably before it opens and dropped (without waiting for the disk) when it
    closes, so whoever finishes an entry a kill left with a window open sets the mode back, and
    only then. Such directories are rare (the user made them read-only): two commits for each
    per rollback, nothing otherwise. ``entry`` is the entry as it is journaled now."""

    def __init__(self, journal: RollbackJournal, entry: JournalEntry,
                 still_ours: Callable[[], None] = lambda: None) -> None:
        self.journal = journal
        self.entry = entry
        #: Raises once the plan's lock is lost: another replica may have taken the plan over and
        #: journaled an entry of its own, which nothing here may overwrite.
        self.still_ours = still_ours

    def workspace(self) -> Workspace:
        return Workspace(self.entry.workspace_root, self.entry.temp_tag, self)

    def opening(self, window: Window) -> None:
        if window in self.entry.opened:
            return
        entry = replace(self.entry, opened=(*self.entry.opened, window))
        try:  # (the plan's lock was checked right before this change: keep_going)
            self.journal.put(entry)
        except SQLAlchemyError as exc:
            raise FailedPrecondition(Reason.ROLLBACK_CONFLICT,
                                     f"could not journal that read-only directory {window.path!r} is made writable "
                                     f"for a moment ({type(exc).__name__}); it was left as it was",
                                     path=window.path) from exc
        self.entry = entry

    def closed(self, window: Window) -> None:
        if window not in self.entry.opened:
            return
        self.entry = replace(self.entry, opened=tuple(w for w in self.entry.opened if w != window))
        try:
            self.still_ours()
        except CheckpointdError as exc:  # the taker's entry is the plan's now; it checks the window
            log.warning("not journaling that the window on %r is closed: %s", window.path, exc.message)
            return
        try:
            self.journal.put_unsynced(self.entry)
        except SQLAlchemyError as exc:  # the entry still names it: a recovery checks it, and finds it closed
            log.warning("could not journal that the window on %r is closed: %s", window.path, exc)


def _with_a_directory_to_go_in(parts: EngineParts, tree: str, changes: list[Change]) -> list[Change]:
    """An undo's changes without those that would put something back in a directory that is no
    longer there (moved away, deleted, or made something else since the rollback began) and that
    the undo does not make itself: that directory's fate is a change made after the rollback
    began, which wins, and the undo could never finish otherwise. What was there is in the
    rollback's safety checkpoint."""
    made: set[str] = set()  # directories the undo makes (or keeps making)
    gone: set[str] = set()
    for change in sorted(changes, key=lambda c: c.path.count("/")):
        parent = change.path.rpartition("/")[0]
        if change.target is not None and parent and parent not in made:
            entry = parts.trees.lookup(tree, parent)
            if entry is None or entry.kind is not EntryKind.DIR:
                gone.add(change.path)
                continue
        if change.target is not None and change.target.kind is EntryKind.DIR:
            made.add(change.path)
    return [c for c in changes if c.path not in gone]


def _target_rules(parts: EngineParts, row: CheckpointRow) -> IgnoreRules:
    def load(directory: str) -> bytes | None:
        entry = parts.trees.lookup(row.tree_digest, f"{directory}/{GITIGNORE}" if directory else GITIGNORE)
        if entry is None or entry.kind is not EntryKind.FILE or entry.size > MAX_GITIGNORE_BYTES:
            return None
        return parts.store.read_bytes(entry.digest)

    return IgnoreRules(row.ignore_patterns, load, row.excluded_paths)


def seen_by_capture(parts: EngineParts, root: str | None, capture: CaptureResult,
                    changes: list[Change]) -> dict[str, Indexed]:
    """What the capture that planned ``changes`` saw of each file they replace or remove: the
    stat index's entry, when it is the one the capture used (same digest). A path the capture
    added by reading it alone (``capture.unindexed``) has none: the index's entry there is of an
    earlier capture, maybe of another inode with the same content, so the check hashes it."""
    if not root or not changes:
        return {}
    index = parts.snapshotter.index.for_root(root)
    seen = {}
    for change in changes:
        base = change.base
        if base is not None and base.kind is EntryKind.FILE and change.path not in capture.unindexed:
            known = index.get(change.path)
            if known is not None and known.digest == base.digest and known.size == base.size:
                seen[change.path] = known
    return seen


def safety_state(session: Session, plan_id: str, current: bytes, batch: Batch) -> tuple[str | None, int]:
    if current:
        return batch.put_bytes(current), len(current)
    return newest_state(session, plan_id)


def newest_state(session: Session, plan_id: str) -> tuple[str | None, int]:
    # Two columns, not the row: loading a whole checkpoint costs twice the query.
    newest = session.exec(select(CheckpointRow.state_digest, CheckpointRow.state_size_bytes)
                          .where(CheckpointRow.plan_id == plan_id)
                          .order_by(col(CheckpointRow.sequence).desc()).limit(1)).first()
    return (newest[0], newest[1]) if newest else (None, 0)


def errno_name(error: BaseException) -> str:
    number = getattr(error, "errno", None)
    return errno.errorcode.get(number, str(number)) if number is not None else ""
