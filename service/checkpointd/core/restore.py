"""Rollback of workspace files: plan the delta between the live workspace and a target
tree, then apply it.

What a rollback may touch follows one rule: it deletes only what the target checkpoint
accounts for — paths the target's own ignore rules would have captured and did not skip.
Anything else (ignored then, too large then, ignored now and absent then) stays. Every
path it will overwrite or delete is captured into the safety checkpoint first, even if
the current ignore rules leave it out.

Planning changes nothing, so a conflict found then leaves the workspace as it was. Applying
can still fail part-way (a directory swapped for a symlink meanwhile, a full disk, corrupt
content): that raises ``ApplyInterrupted`` and the caller finishes or undoes the rollback
through its journal.
"""

from __future__ import annotations

import errno
from collections.abc import Collection

from checkpointd.core.errors import CheckpointdError, FailedPrecondition, Reason
from checkpointd.core.faults import Point, crash_point
from checkpointd.core.ignore import IgnoreRules
from checkpointd.core.store import ContentStore
from checkpointd.core.tree import Change, EntryKind, Trees
from checkpointd.core.workspace import UnsafePath, Workspace, is_under


def _in_scope(path: str, subset: Collection[str]) -> bool:
    return not subset or is_under(path, subset)


def _ancestor_of_scope(path: str, subset: Collection[str]) -> bool:
    return any(s.startswith(path + "/") for s in subset)


def _conflict(path: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(Reason.ROLLBACK_CONFLICT, f"cannot roll back {path!r}: {why}; nothing was changed",
                              path=path)


class ApplyInterrupted(Exception):
    """Applying stopped at ``path``: the changes before it are made, the rest are not."""

    def __init__(self, path: str, why: str, cause: BaseException) -> None:
        super().__init__(f"{path!r}: {why}")
        self.path = path
        self.why = why
        self.cause = cause

    @property
    def disk_full(self) -> bool:
        return isinstance(self.cause, OSError) and self.cause.errno in (errno.ENOSPC, errno.EDQUOT)


def _removes_base(change: Change) -> bool:
    return change.base is not None and (change.target is None or change.base.kind is not change.target.kind)


def _depth(change: Change) -> int:
    return change.path.count("/")


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
             target_skipped: Collection[str], subset: Collection[str]) -> list[Change]:
        """The changes that turn the live workspace into the target.

        ``current_tree`` must already hold every uncaptured path the rollback touches
        (see find_uncaptured), so it describes everything that will be replaced.
        """
        changes = [c for c in self.trees.diff(current_tree, target_tree) if self._wanted(c, subset)]
        removed: set[str] = set()
        kept: set[str] = set()
        for change in sorted(filter(_removes_base, changes), key=_depth, reverse=True):
            path, base, target = change.path, change.base, change.target
            emptied = base.kind is not EntryKind.DIR or all(
                f"{path}/{name}" in removed for name in workspace.listdir(path))
            if target is not None:
                if not emptied:
                    raise _conflict(path, "a directory holding files the checkpoint does not account for "
                                          f"would have to become a {target.kind.name.lower()}")
                removed.add(path)
            elif emptied and path not in target_skipped and not target_rules.ignores_path(
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

    def apply(self, workspace: Workspace, changes: list[Change]) -> None:
        """Removes what goes (deepest first), creates directories, writes files and links, then
        sets directory modes. Idempotent: applying the same changes again finishes a partial run."""
        for step, change in self._steps(changes):
            crash_point(Point.RESTORE_CHANGE)
            try:
                step(workspace, change)
            except UnsafePath as exc:
                raise ApplyInterrupted(change.path, "a parent or the path itself was swapped for a symlink, "
                                                    "file or directory during the rollback", exc) from exc
            except _NotEmpty as exc:
                raise ApplyInterrupted(change.path, "the directory is no longer empty", exc) from exc
            except OSError as exc:
                raise ApplyInterrupted(change.path, exc.strerror or str(exc), exc) from exc
            except CheckpointdError as exc:
                raise ApplyInterrupted(change.path, exc.message, exc) from exc

    def _steps(self, changes: list[Change]):
        for change in sorted(filter(_removes_base, changes), key=_depth, reverse=True):
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

    @staticmethod
    def _remove(workspace: Workspace, change: Change) -> None:
        if change.base.kind is EntryKind.DIR:
            if not workspace.remove_empty_dir(change.path) and change.target is not None:
                raise _NotEmpty(change.path)
        else:
            workspace.remove(change.path)

    @staticmethod
    def _make_dir(workspace: Workspace, change: Change) -> None:
        workspace.make_dir(change.path, change.target.mode)

    def _write(self, workspace: Workspace, change: Change) -> None:
        target = change.target
        if target.kind is EntryKind.FILE:
            workspace.write_file(change.path, self.store.iter_chunks(target.digest), target.mode)
        else:
            workspace.write_symlink(change.path, target.target)

    @staticmethod
    def _set_dir_mode(workspace: Workspace, change: Change) -> None:
        workspace.set_dir_mode(change.path, change.target.mode)


class _NotEmpty(Exception):
    """A directory that must be replaced still holds something."""
