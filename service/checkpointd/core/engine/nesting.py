"""Plans whose workspaces nest: a rollback must not silently rewrite another plan's files.

A rollback of plan P "reaches into" plan Q when one of its changes lies in files Q tracks:
- Q's root is strictly inside P's root and a change lies at or under it (so P captured Q's files;
  the outer plan excluding the inner directory, e.g. with core.snapshot.ignore_patterns, means
  no change can lie there);
- P's root is strictly inside Q's root and Q's newest checkpoint holds P's directory (so every
  change of P rewrites files Q has captured; Q excluding that directory means it tracks none).

Two plans with the same root are one workspace used by two plans in turn and are not checked.
The other plans are found by equality lookups on the plans' indexed workspace roots (the root's
ancestors, and each changed path's directories), only when a rollback changes something: the cost
follows the size of the rollback, not the number of plans.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlmodel import Session, col, select

from checkpointd.core.kernel.errors import FailedPrecondition, Reason
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.store.tree import Change, Trees
from checkpointd.core.workspace.workspace import is_under


@dataclass(frozen=True)
class NestedWorkspace:
    plan_id: str
    workspace_root: str
    change_count: int
    first_path: str


#: Candidate roots looked up per query.
_LOOKUP_BATCH = 500


def _directories_of(changes: list[Change]) -> set[str]:
    """Every workspace-relative path a nested plan's root could be, for ``changes`` to reach into
    it: each changed path and each directory above it."""
    found: set[str] = set()
    for change in changes:
        path = change.path
        while path and path not in found:
            found.add(path)
            path = path.rpartition("/")[0]
    return found


def _is_text(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _ancestors(root: str) -> list[str]:
    found = []
    while root != "/":
        root = os.path.dirname(root)
        found.append(root)
    return found


def nested_workspaces(session: Session, trees: Trees, plan_id: str, root: str,
                      changes: list[Change]) -> list[NestedWorkspace]:
    """The other plans whose tracked files ``changes`` (of plan ``plan_id``, rooted at ``root``) touch."""
    if not changes:
        return []
    prefix = root.rstrip("/") + "/"
    # A root is text (a request's UTF-8): a name that is not UTF-8 cannot be one.
    candidates = sorted({*_ancestors(root), *(prefix + d for d in _directories_of(changes) if _is_text(d))})
    others = []
    for start in range(0, len(candidates), _LOOKUP_BATCH):
        others += session.exec(
            select(PlanRow.plan_id, PlanRow.workspace_root)
            .where(col(PlanRow.workspace_root).in_(candidates[start:start + _LOOKUP_BATCH]),
                   PlanRow.plan_id != plan_id)).all()
    others.sort()
    found = []
    for other_id, other_root in others:
        if other_root.startswith(prefix):
            inner = os.path.relpath(other_root, root)
            touched = [c.path for c in changes if is_under(c.path, (inner,))]
        elif _tracks(session, trees, other_id, os.path.relpath(root, other_root)):
            touched = [c.path for c in changes]
        else:
            touched = []
        if touched:
            found.append(NestedWorkspace(other_id, other_root, len(touched), touched[0]))
    return found


def _tracks(session: Session, trees: Trees, plan_id: str, path: str) -> bool:
    """Whether the plan's newest checkpoint with files holds ``path``."""
    newest = session.exec(select(CheckpointRow.tree_digest)
                          .where(CheckpointRow.plan_id == plan_id, col(CheckpointRow.tree_digest).is_not(None))
                          .order_by(col(CheckpointRow.sequence).desc()).limit(1)).first()
    return newest is not None and trees.lookup(newest, path) is not None


def refusal(plan_id: str, nested: list[NestedWorkspace]) -> FailedPrecondition:
    first = nested[0]
    others = f" (and {len(nested) - 1} more plan(s))" if len(nested) > 1 else ""
    return FailedPrecondition(
        Reason.NESTED_WORKSPACE,
        f"rolling back plan {plan_id} would change {first.change_count} path(s) in the workspace of plan "
        f"{first.plan_id} ({first.workspace_root}), e.g. {first.first_path!r}{others}; nothing was changed. Exclude "
        "that directory from one of the plans (core.snapshot.ignore_patterns), roll back only other --path values, "
        "or allow it (allow_nested_workspaces, CLI --allow-nested)",
        plan_id=first.plan_id, workspace_root=first.workspace_root, path=first.first_path)
