"""The plan registry: the plans a server remembers (their workspace roots, recorded on first
mention and never changed) and the per-plan lock that serializes a plan's operations."""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from sqlalchemy import delete, exists, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from checkpointd.core.engine.plan_locks import PlanLocks
from checkpointd.core.engine.records import KnownPlan
from checkpointd.core.kernel.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Reason, Unavailable
from checkpointd.core.metadata.db import AdvisoryLock, Database, LockHolder
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.metadata.rows import ADVISORY_LOCKS_HELD, RowWriter

log = logging.getLogger("checkpointd.plans")

#: Plans a server remembers (their workspace roots) at most; about 200 bytes each.
MAX_REMEMBERED_PLANS = 100_000


class PlanRegistry:
    def __init__(self, db: Database, allowed_roots: tuple[str, ...]) -> None:
        self.db = db
        self._plans: dict[str, KnownPlan] = {}
        self._plans_guard = threading.Lock()
        #: In-process plan locks; a call from the event loop never waits for one in a thread.
        self.locks = PlanLocks()
        #: Plans whose lock across replicas this process holds now (PostgreSQL).
        self._held: dict[str, AdvisoryLock] = {}
        self._allowed = tuple(os.path.realpath(r) for r in allowed_roots)
        for root in self._allowed:
            if not os.path.isdir(root):  # a typo, or a volume not mounted yet: said at start, not at the first call
                log.warning("workspace root %s is not a directory (yet): workspaces under it are refused until it is",
                            root)

    def try_lock(self, plan_id: str) -> Callable[[], None] | None:
        """The plan's lock if no other operation holds or awaits it (for an event loop, on
        SQLite: no advisory lock): its release, else None."""
        return self.locks.try_acquire(plan_id)

    @contextmanager
    def lock(self, plan_id: str) -> Iterator[None]:
        """Serializes one plan's operations, capture to commit: this process's callers queue on an
        in-process lock (holding no database connection; see ``PlanLocks`` for callers on the event
        loop), then replicas on a database advisory lock."""
        with self.locks.hold(plan_id), self.db.advisory_lock(f"plan:{plan_id}") as replicas:
            if replicas.holder is not None:  # PostgreSQL
                self._held[plan_id] = replicas
            try:
                yield
            finally:
                self._held.pop(plan_id, None)

    def confirm_locks(self, rows: RowWriter, plan_ids: list[str]) -> None:
        """Called in the transaction that commits checkpoints of ``plan_ids``: checks, once it has
        locked their plans' rows (numbering them, ``RowWriter.check``), that their locks are held.
        A plan's lock across replicas is a session-level lock that the database may end (a
        failover, a pooler's restart, an administrator, a timeout), and another replica may then
        act on the plan (roll it back while this one captures it): a lock no longer held by the
        session that took it refuses the commit (``LOCK_LOST``, retryable). One still held was held
        throughout, and the plan's row, locked until the commit, keeps any other replica's
        checkpoint, and so its rollback, behind it."""
        holders = {plan_id: self._held[plan_id].holder for plan_id in plan_ids if plan_id in self._held}
        if holders:
            pids = sorted({holder.pid for holder in holders.values()})
            rows.check([(ADVISORY_LOCKS_HELD, {"pids": pids})], partial(_judge_locks, holders))

    def check_held(self, plan_id: str) -> None:
        """Between the changes of a rollback: refuses to go on (``LOCK_LOST``) once the session
        holding the plan's lock across replicas is seen ended (another replica may take the plan
        and finish this rollback from its journal entry; two must not write at once). Seen
        without a round trip, from the database's farewell on the session's socket."""
        lock = self._held.get(plan_id)
        if lock is not None and lock.session_ended():
            raise Unavailable(Reason.LOCK_LOST,
                              f"the database ended the session holding plan {plan_id}'s lock part-way through a "
                              "rollback; it stopped there, and is finished before the plan is next used (a retry "
                              "with the same request_id does so, then answers)",
                              plan_id=plan_id, lock=f"plan:{plan_id}")

    def remembered(self, plan_id: str) -> KnownPlan | None:
        return self._plans.get(plan_id)

    def forget(self, plan_id: str) -> None:
        with self._plans_guard:
            self._plans.pop(plan_id, None)

    def resolve_root(self, raw: str) -> str:
        if not os.path.isabs(raw) or "\0" in raw:
            raise InvalidArgument(Reason.INVALID_WORKSPACE_ROOT, "workspace_root must be an absolute path",
                                  workspace_root=raw[:512])
        real = os.path.realpath(raw)
        if not any(real == a or real.startswith(a.rstrip("/") + "/") for a in self._allowed):
            allowed = os.pathsep.join(self._allowed)
            raise PermissionDenied(Reason.WORKSPACE_ROOT_NOT_ALLOWED,
                                   f"workspace_root {raw[:512]!r} is outside the server's allowed workspace roots "
                                   f"(allowed: {allowed}); to allow another, restart the server with one more "
                                   f"--workspace-root DIR (or add it to CHECKPOINTD_WORKSPACE_ROOT, "
                                   f"'{os.pathsep}'-separated)",
                                   workspace_root=raw[:512], allowed_workspace_roots=allowed)
        if not os.path.isdir(real):
            raise InvalidArgument(Reason.INVALID_WORKSPACE_ROOT, f"workspace_root {raw[:512]!r} is not a directory",
                                  workspace_root=raw[:512])
        return real

    def known(self, plan_id: str, raw_root: str) -> tuple[KnownPlan, Mention]:
        """The plan (created on first use, its workspace root recorded on first mention), and
        what this call recorded of it: a create that then fails takes that back (``take_back``).

        Plans are remembered. A recorded root never changes, but another replica may record one
        for a plan remembered without; the checkpoint's write detects that (``PlanRootRecorded``),
        and ``create`` forgets the plan and captures again.
        """
        root = self.resolve_root(raw_root) if raw_root else None
        known = self._plans.get(plan_id)
        if known is not None and root is None:
            return known, Mention.NOTHING
        if known is not None and known.workspace_root is not None:
            if root != known.workspace_root:
                raise self._root_mismatch(plan_id, root, known.workspace_root)
            return known, Mention.NOTHING
        with self.db.session() as session:
            plan, mention = self._plan_row(session, plan_id, root)
            known = KnownPlan(plan.plan_id, plan.workspace_root)
        with self._plans_guard:
            self._plans[plan_id] = known
            # The oldest remembered plan goes first: forgetting one costs a read when it is next used.
            while len(self._plans) > MAX_REMEMBERED_PLANS:
                del self._plans[next(iter(self._plans))]
        return known, mention

    def take_back(self, plan_id: str, mention: Mention) -> None:
        """Undoes what ``known`` recorded for a create that failed before its checkpoint was
        committed (a refused request_id, a capture that failed): a plan row it created, or the
        workspace root it bound, so that the failed call leaves no plan behind and binds no root.
        Only while the plan still has no checkpoint (of a workspace, for a bound root); the
        caller holds the plan's lock."""
        if mention is Mention.NOTHING:
            return
        has_checkpoint = exists().where(col(CheckpointRow.plan_id) == plan_id)
        if mention is Mention.ROOT_BOUND:
            has_checkpoint = has_checkpoint.where(col(CheckpointRow.tree_digest).is_not(None))
        self.forget(plan_id)
        with self.db.session() as session:
            where = (col(PlanRow.plan_id) == plan_id, ~has_checkpoint)
            match mention:
                case Mention.CREATED:
                    session.execute(delete(PlanRow).where(*where))
                case Mention.ROOT_BOUND:
                    session.execute(update(PlanRow).where(*where).values(workspace_root=None))
            session.commit()

    @staticmethod
    def _root_mismatch(plan_id: str, root: str | None, recorded: str | None) -> FailedPrecondition:
        return FailedPrecondition(Reason.WORKSPACE_ROOT_MISMATCH,
                                  f"plan {plan_id} already has workspace_root {recorded!r}: use that directory, "
                                  f"leave workspace_root out to use the plan's, or start a new plan with a new "
                                  f"plan id (e.g. from `checkpointd new-plan-id`) for {root!r}",
                                  workspace_root=root, plan_workspace_root=recorded)

    def _plan_row(self, session: Session, plan_id: str, root: str | None) -> tuple[PlanRow, Mention]:
        plan = session.get(PlanRow, plan_id)
        if plan is None:
            plan = PlanRow(plan_id=plan_id, workspace_root=root)
            session.add(plan)
            try:
                session.commit()
                return plan, Mention.CREATED
            except IntegrityError:
                session.rollback()
                plan = session.get(PlanRow, plan_id)
        if root is not None:
            if plan.workspace_root is None:
                plan.workspace_root = root
                session.add(plan)
                session.commit()
                return plan, Mention.ROOT_BOUND
            if plan.workspace_root != root:
                raise self._root_mismatch(plan_id, root, plan.workspace_root)
        return plan, Mention.NOTHING


class Mention(enum.Enum):
    """What ``PlanRegistry.known`` recorded of a plan for one call."""

    NOTHING = "nothing"
    CREATED = "created"
    ROOT_BOUND = "root bound"


def _judge_locks(holders: dict[str, LockHolder], results: list[list[tuple]]) -> None:
    held = set(results[0])
    for plan_id, holder in holders.items():
        if (holder.key, holder.pid, holder.backend_start) not in held:
            raise Unavailable(Reason.LOCK_LOST,
                              f"the database ended the session holding plan {plan_id}'s lock, and another "
                              "replica may have acted on the plan meanwhile; nothing was recorded, retry",
                              plan_id=plan_id, lock=f"plan:{plan_id}")
