"""DiffCheckpoints: what changed between two checkpoints of a plan, or between one and the
plan's live workspace, a page at a time (AIP-158).

A page token names the last path a page listed, and is bound to the request's two sides, paths
and text_diffs. The next page lists the changes after that path in the diff's order (parents
before children, names sorted: the order of the paths' component lists), so a diff against the
live workspace, taken anew for each page, never lists a path twice, and lists a change made
between two pages only if its path comes after the last one listed.

The walk of the two trees starts at the token's path (subtrees before it are not read). Between
two checkpoints, which never change, the token also carries how many changes the later pages
hold, so a page reads only its own changes: paging costs what the whole diff costs once, not
once per page. Against the live workspace each page counts what is left again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from checkpointd.core.capture.look import LookBatch
from checkpointd.core.engine.filtering import PageTokens
from checkpointd.core.engine.parts import EngineParts, abandoned_if_cancelled, not_found_if_deleted, path_subset
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.cancellation import NEVER, Cancellation
from checkpointd.core.kernel.errors import DataLoss, FailedPrecondition, InvalidArgument, Reason
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.store.tree import Change
from checkpointd.core.workspace.workspace import is_under

#: The scope of DiffCheckpoints' page tokens (with the two sides and text_diffs).
_TOKEN_SCOPE = "DiffCheckpoints"


@dataclass(frozen=True)
class DiffPage:
    #: The two sides as validated (a ULID in capitals).
    base_id: str
    target_id: str
    #: The changes after the page token's path, at most the page size of them.
    changes: list[Change]
    #: How many more differ after those.
    after: int


class Diffs:
    def __init__(self, parts: EngineParts, recovery: Recovery, page_tokens: PageTokens) -> None:
        self.parts = parts
        self.recovery = recovery
        self.page_tokens = page_tokens

    def page(self, base_id: str, target_id: str, paths: tuple[str, ...], text_diffs: bool, page_size: int = 0,
             page_token: str = "", cancel: Cancellation = NEVER) -> DiffPage:
        """The changes after ``page_token``'s path, at most ``page_size`` (0: all) of them. A capture
        of the live workspace stops once ``cancel`` is set (see ``diff``)."""
        if page_size < 0:
            raise InvalidArgument(Reason.INVALID_PAGE_SIZE, "page_size must not be negative", page_size=page_size)
        base_id = validation.checkpoint_id(base_id, "base_checkpoint_id")
        target_id = validation.checkpoint_id(target_id, "target_checkpoint_id", required=False)
        scope, filter_text = _token_binding(base_id, target_id, paths, text_diffs)
        resume = self.page_tokens.check_after_path(page_token, scope, filter_text)
        after = () if resume is None else tuple(resume.path.split("/"))
        if target_id and resume is not None and resume.remaining is not None:
            changes = self.diff(base_id, target_id, paths, after, limit=page_size or None, cancel=cancel)
            return DiffPage(base_id, target_id, changes, max(0, resume.remaining - len(changes)))
        changes = self.diff(base_id, target_id, paths, after, cancel=cancel)
        size = page_size or len(changes)
        return DiffPage(base_id, target_id, changes[:size], max(0, len(changes) - size))

    def token_after(self, base_id: str, target_id: str, paths: tuple[str, ...], text_diffs: bool,
                    last: Change, remaining: int) -> str:
        """The token of the page that follows ``last``, ``remaining`` changes after it (counted
        again by each page of a live diff, whose later pages may differ)."""
        return self.page_tokens.issue_after_path(*_token_binding(base_id, target_id, paths, text_diffs), last.path,
                                                 remaining if target_id else None)

    def diff(self, base_id: str, target_id: str = "", paths: tuple[str, ...] = (), after: tuple[str, ...] = (),
             limit: int | None = None, cancel: Cancellation = NEVER) -> list[Change]:
        """The changes from ``base_id`` to ``target_id`` (or the live workspace) under ``paths``
        (all when empty): those after path components ``after``, at most ``limit`` of them. The
        capture of the live workspace stops once ``cancel`` is set, raising ``Cancelled``."""
        base_id = validation.checkpoint_id(base_id, "base_checkpoint_id")
        target_id = validation.checkpoint_id(target_id, "target_checkpoint_id", required=False)
        subset = path_subset(paths)
        with self.parts.db.session() as session:
            base = self.parts.load(session, base_id)
            if not base.tree_digest:
                raise FailedPrecondition(Reason.NO_WORKSPACE, f"checkpoint {base_id} has no files",
                                         checkpoint_id=base_id)
            if target_id:
                target = self.parts.load(session, target_id)
                if target.plan_id != base.plan_id:
                    raise FailedPrecondition(Reason.CHECKPOINT_PLAN_MISMATCH,
                                             "both checkpoints must belong to the same plan",
                                             checkpoint_id=target_id, plan_id=base.plan_id)
                if not target.tree_digest:
                    raise FailedPrecondition(Reason.NO_WORKSPACE, f"checkpoint {target_id} has no files",
                                             checkpoint_id=target_id)
                target_tree = target.tree_digest
            else:
                plan = session.get(PlanRow, base.plan_id)
        try:
            if target_id:
                return _first(self.parts.trees.diff(base.tree_digest, target_tree, after=after), subset, limit)
            return self._diff_live(base, plan, after, subset, limit, cancel)
        except DataLoss:
            not_found_if_deleted(self.parts.db, *filter(None, (base_id, target_id)))
            raise

    def _diff_live(self, base: CheckpointRow, plan: PlanRow, after: tuple[str, ...], subset: tuple[str, ...],
                   limit: int | None, cancel: Cancellation = NEVER) -> list[Change]:
        """Diff against a capture that no checkpoint references: the GC fence is held until
        the diff has read every node of it, then its batch is dropped, so that nothing builds
        on a capture garbage collection would not keep (the previous capture stays the base,
        and what changed since is captured again by the next checkpoint). The capture is a look
        (``LookBatch``): file contents are hashed, not stored. An unfinished rollback of the plan
        is finished first."""
        parts = self.parts
        with parts.registry.lock(base.plan_id), parts.store.referencing():
            self.recovery.take_over(base.plan_id)
            batch = LookBatch(parts.store.batch())
            try:
                with abandoned_if_cancelled("diff", base.plan_id, cancel):
                    live_tree = parts.capture(plan, batch, cancel)[0].tree
                return _first(parts.trees.diff(base.tree_digest, live_tree, after=after), subset, limit)
            finally:
                batch.abort()


def _first(changes: Iterator[Change], subset: tuple[str, ...], limit: int | None) -> list[Change]:
    """The first ``limit`` (None: all) of ``changes`` under ``subset`` (empty: anywhere)."""
    return list(itertools.islice((c for c in changes if not subset or is_under(c.path, subset)), limit))


def _token_binding(base_id: str, target_id: str, paths: tuple[str, ...], text_diffs: bool) -> tuple[str, str]:
    """What a page token is bound to: the scope (the sides and text_diffs) and the paths."""
    return f"{_TOKEN_SCOPE}\0{base_id}\0{target_id}\0{int(text_diffs)}", "\0".join(paths)
