"""Rollback of workspace files: plan the delta between the live workspace and a target
tree, then apply it.

What a rollback may touch follows one rule: it deletes only what the target checkpoint
accounts for — paths the target's own ignore rules would have captured and did not skip.
Anything else (ignored then, too large then, ignored now and absent then) stays. Every
path it will overwrite or delete is captured into the safety checkpoint first, even if
the current ignore rules leave it out.
"""

from __future__ import annotations

from collections.abc import Collection

from checkpointd.core.errors import FailedPrecondition, Reason
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
        for change in sorted(filter(_removes_base, changes), key=_depth, reverse=True):
            try:
                if change.base.kind is EntryKind.DIR:
                    if not workspace.remove_empty_dir(change.path) and change.target is not None:
                        raise _conflict(change.path, "the directory is not empty")
                else:
                    workspace.remove(change.path)
            except UnsafePath as exc:
                raise _conflict(change.path, "a parent changed into a symlink or file during rollback") from exc
        writes = [c for c in changes if c.target is not None]
        dirs = [c for c in writes if c.target.kind is EntryKind.DIR]
        for change in sorted(dirs, key=_depth):
            workspace.make_dir(change.path, change.target.mode)
        for change in writes:
            target = change.target
            try:
                if target.kind is EntryKind.FILE:
                    workspace.write_file(change.path, self.store.iter_chunks(target.digest), target.mode)
                elif target.kind is EntryKind.SYMLINK:
                    workspace.write_symlink(change.path, target.target)
            except UnsafePath as exc:
                raise _conflict(change.path, "a parent changed into a symlink or file during rollback") from exc
        for change in sorted(dirs, key=_depth, reverse=True):
            workspace.set_dir_mode(change.path, change.target.mode)
