"""The checkpoint application service: create, read, list, diff, delete and roll back.

Operations on one plan are serialized, capture to commit (an in-process lock plus, on
PostgreSQL, an advisory lock that every replica on the database takes); different plans
run in parallel. Blobs are made durable
before the metadata row that references them is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import hashlib
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, col, select
from ulid import ULID

from checkpointd.core.capture.capturer import Capturer
from checkpointd.core.capture.ignore import GITIGNORE, IgnoreRules
from checkpointd.core.capture.snapshot import CaptureResult, Snapshotter
from checkpointd.core.capture.stat_index import Indexed, StatIndex
from checkpointd.core.capture.watcher import Watcher
from checkpointd.core.capture.watcher import available as watcher_available
from checkpointd.core.config.registry import IGNORE_PATTERNS, MAX_FILE_SIZE_BYTES, ConfigStore
from checkpointd.core.engine import filtering
from checkpointd.core.engine.plan_locks import PlanLocks
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import (
    CheckpointdError,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Reason,
    ResourceExhausted,
)
from checkpointd.core.kernel.faults import Point, crash_point, may_stall
from checkpointd.core.kernel.vocabulary import SERVER_ONLY_TRIGGERS, Phase, Trigger, resolve_phase
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, OperationRow, PlanRow, RollbackJournalRow, utcnow
from checkpointd.core.metadata.rows import CoreRows, RowWriter
from checkpointd.core.metadata.server_secrets import PAGE_TOKEN_KEY, shared_secret
from checkpointd.core.restore.journal import (
    LEGACY_DIRECTORY,
    Goal,
    JournalEntry,
    RollbackJournal,
    legacy_entries,
    new_temp_tag,
    remove_legacy_directory,
)
from checkpointd.core.restore.restorer import ApplyInterrupted, Restorer, holds
from checkpointd.core.store.content_store import Batch, ContentStore
from checkpointd.core.store.tree import Change, Entry, EntryKind, Trees
from checkpointd.core.workspace.workspace import Inaccessible, UnsafePath, Workspace, is_under, validate_relpath

log = logging.getLogger("checkpointd.engine")


class Scope(enum.Enum):
    FILES = "files"
    STATE = "state"
    FILES_AND_STATE = "files_and_state"

    @property
    def files(self) -> bool:
        return self is not Scope.STATE

    @property
    def state(self) -> bool:
        return self is not Scope.FILES


@dataclass(frozen=True)
class CreateRequest:
    plan_id: str
    trigger: Trigger | None = None
    phase: Phase | None = None
    source_tool: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    description: str = ""
    state: bytes = b""
    workspace_root: str = ""
    request_id: str = ""


@dataclass(frozen=True)
class RollbackRequest:
    plan_id: str
    checkpoint_id: str
    scope: Scope = Scope.FILES_AND_STATE
    paths: tuple[str, ...] = ()
    dry_run: bool = False
    request_id: str = ""
    current_state: bytes = b""


@dataclass(frozen=True, slots=True)
class KnownPlan:
    """What a checkpoint needs of its plan; a plan's root never changes once recorded."""

    plan_id: str
    workspace_root: str | None


#: Largest state a create stores on an event loop (hashing and compressing it takes microseconds);
#: a larger one is stored by a thread. Below the store's limit for packed objects.
LOOP_STATE_LIMIT = 64 * 1024
#: How a caller on an event loop runs a blocking function: in a thread, awaiting its result.
RunBlocking = Callable[..., Awaitable[Any]]

#: Plans a server remembers (their workspace roots) at most; about 200 bytes each.
MAX_REMEMBERED_PLANS = 100_000

#: The warm-up's plan and request id: ids no client can send (not a ULID; not printable).
_WARM_UP_PLAN = "checkpointd-warm-up"
_WARM_UP_REQUEST_ID = "\x01checkpointd-warm-up"
_PLANS = PlanRow.__table__
_CHECKPOINTS = CheckpointRow.__table__
_OPERATIONS = OperationRow.__table__
_JOURNAL = RollbackJournalRow.__table__


#: A checkpoint as the create and rollback paths write it: the ``checkpoints`` table's columns,
#: derived from the table, without the ORM's per-attribute bookkeeping.
CheckpointRecord = make_dataclass("CheckpointRecord", [column.name for column in _CHECKPOINTS.columns], slots=True)


def _record_values(record: CheckpointRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__slots__}


def _operation(request_id: str, method: str, fingerprint: str, result: dict[str, object]) -> dict[str, object]:
    """The row that records a request_id (AIP-155) and what a replay of it returns."""
    return {"request_id": request_id, "method": method, "fingerprint": fingerprint, "result": result,
            "create_time": utcnow()}


@dataclass(frozen=True, slots=True)
class _CreateArguments:
    """A validated CreateCheckpoint, as both attempts of ``Checkpoints.create`` record it."""

    plan_id: str
    request: CreateRequest
    trigger: Trigger
    phase: Phase
    labels: dict[str, str]
    request_id: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class _StartedCreate:
    """A create started on an event loop: its row waits in the group commit."""

    new: _CreateArguments
    row: CheckpointRecord
    committed: Future[None]
    #: Releases the plan's lock and the store's fence, once the commit has ended.
    release: Callable[[], None]


async def _committed(commit: Future[None]) -> None:
    """Waits on the event loop for a commit made by another thread. Cancelling the waiter
    leaves the commit alone (it cannot be called back)."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def settle() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def wake(_commit: Future[None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    commit.add_done_callback(wake)
    await waiter
    commit.result()


class _PlanRootRecorded(Exception):
    """A checkpoint was captured for its plan as remembered, but the plan's row names another
    workspace root: another replica recorded one meanwhile. Its transaction writes nothing."""


@dataclass(slots=True)
class _NewCheckpoint:
    record: CheckpointRecord
    #: The request_id's row (AIP-155), when the request carried one.
    operation: dict[str, object] | None = None


@dataclass(frozen=True)
class Checkpoint:
    row: CheckpointRow | CheckpointRecord
    state: bytes | None = None


@dataclass(frozen=True)
class RollbackResult:
    changes: list[Change]
    state: bytes
    safety: Checkpoint | None
    dry_run: bool


@dataclass(frozen=True)
class EngineSettings:
    data_dir: Path
    allowed_roots: tuple[str, ...]
    #: Watch workspaces (inotify) so that a capture re-examines only what changed.
    watcher: bool = True


def _fingerprint(**fields: object) -> str:
    canonical = json.dumps(fields, sort_keys=True, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _skipped_json(capture: CaptureResult) -> list[list[object]]:
    return [[s.path, s.size, s.reason] for s in capture.skipped]


class Checkpoints:
    def __init__(self, db: Database, store: ContentStore, config: ConfigStore, settings: EngineSettings) -> None:
        self.db = db
        self.store = store
        self.config = config
        self.settings = settings
        self.trees = Trees(store)
        engine_dir = Path(settings.data_dir) / "engine"
        self.snapshotter = Snapshotter(store, self.trees, StatIndex(engine_dir / "stat-index.sqlite"))
        self.watcher: Watcher | None = None
        if settings.watcher and watcher_available():
            self.watcher = Watcher()
        elif settings.watcher:
            log.warning("file watching is unavailable here (needs Linux inotify and inotify_simple); "
                        "every capture scans its whole workspace")
        self.capturer = Capturer(self.snapshotter, self.trees, self.watcher)
        self.restorer = Restorer(store, self.trees)
        self._plans: dict[str, KnownPlan] = {}
        self._plans_guard = threading.Lock()
        self._new_checkpoints = db.group_commit(self._write_checkpoints)
        #: In-process plan locks; a call from the event loop never waits for one in a thread.
        self.plan_locks = PlanLocks()
        self.page_tokens = filtering.PageTokens(lambda: shared_secret(db, PAGE_TOKEN_KEY))
        self._allowed = tuple(os.path.realpath(r) for r in settings.allowed_roots)
        self._data_dir = os.path.realpath(settings.data_dir)
        self.journal = RollbackJournal(db)
        self.recover_interrupted_rollbacks()
        self._warm_up()

    def _warm_up(self) -> None:
        """Runs the queries of a rollback once, in a transaction that is rolled back, on a key no
        client can use: SQLAlchemy compiles a statement the first time it runs it, which cost a
        process's first rollback about 8 ms. For a sidecar, the first rollback may be its only one."""
        plan_id, request_id = _WARM_UP_PLAN, _WARM_UP_REQUEST_ID
        try:
            self.journal.get(plan_id)
            self.db.commit_unsynced(delete(_JOURNAL).where(_JOURNAL.c.plan_id == plan_id))
        except SQLAlchemyError as exc:
            log.warning("warming up the journal's statements failed (%s)", exc)
        with self.db.session() as session:
            try:
                self._replayed(session, request_id, "Rollback", "")
                session.get(CheckpointRow, plan_id)
                session.add(PlanRow(plan_id=plan_id))
                session.flush()
                self._newest_state(session, plan_id)
                record = self._new_row(KnownPlan(plan_id, None), None, [], [], None, 0,
                                       phase=Phase.ROLLBACK_SAFETY.value, trigger=Trigger.ROLLBACK.value,
                                       source_tool="", description="", labels={})
                rows = CoreRows(session.connection())
                self._write_checkpoints(rows, [_NewCheckpoint(record)])
                rows.insert(_OPERATIONS, [_operation(request_id, "Rollback", "", {})])
                self.journal.put(JournalEntry(plan_id, "", "", "", "", (), "", ()), session)
            except SQLAlchemyError as exc:
                log.warning("warming up the database statements failed (%s); the first rollback will be slower", exc)
            finally:
                session.rollback()

    def close(self) -> None:
        """Writes what waits in the group commit, then stops the snapshot engine's reader
        processes; a capture still running reads its files itself."""
        self._new_checkpoints.close()
        self.capturer.close()
        self.snapshotter.close()

    # -- plumbing -----------------------------------------------------------------------

    def _try_plan_lock(self, plan_id: str) -> Callable[[], None] | None:
        """The plan's lock if no other operation holds or awaits it (for an event loop, on
        SQLite: no advisory lock): its release, else None."""
        return self.plan_locks.try_acquire(plan_id)

    @contextmanager
    def _plan_lock(self, plan_id: str) -> Iterator[None]:
        """Serializes one plan's operations, capture to commit: this process's callers queue on an
        in-process lock (holding no database connection; see ``PlanLocks`` for callers on the event
        loop), then replicas on a database advisory lock."""
        with self.plan_locks.hold(plan_id), self.db.advisory_lock(f"plan:{plan_id}"):
            yield

    def _resolve_root(self, raw: str) -> str:
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
            raise InvalidArgument(Reason.INVALID_WORKSPACE_ROOT, f"workspace_root {raw!r} is not a directory",
                                  workspace_root=raw[:512])
        return real

    def _excluded_paths(self, root: str) -> list[str]:
        """The server's own data directory is never captured, even inside a workspace."""
        data = self._data_dir
        if data == root or data.startswith(root + "/"):
            return [os.path.relpath(data, root)] if data != root else []
        return []

    def _capture_settings(self, plan_id: str) -> tuple[list[str], int]:
        values = self.config.resolve_many([IGNORE_PATTERNS, MAX_FILE_SIZE_BYTES], plan_id)
        return values[IGNORE_PATTERNS].value, values[MAX_FILE_SIZE_BYTES].value

    def _replayed(self, session: Session, request_id: str, method: str, fingerprint: str) -> OperationRow | None:
        if not request_id:
            return None
        op = session.get(OperationRow, request_id)
        if op is None:
            return None
        if op.method != method or op.fingerprint != fingerprint:
            raise InvalidArgument(Reason.REQUEST_ID_REUSED,
                                  f"request_id {request_id!r} was already used for a different request",
                                  request_id=request_id)
        return op

    def _load(self, session: Session, checkpoint_id: str) -> CheckpointRow:
        row = session.get(CheckpointRow, checkpoint_id)
        if row is None:
            raise NotFound(Reason.CHECKPOINT_NOT_FOUND, f"checkpoint {checkpoint_id} not found",
                           checkpoint_id=checkpoint_id)
        return row

    def _record_operation(self, session: Session, request_id: str, method: str, fingerprint: str,
                          result: dict[str, object]) -> OperationRow | None:
        """Adds the request_id's record to the transaction; None when it is ours.

        If a concurrent request (another replica's) recorded the same request_id first, this
        transaction is rolled back and the winner's record returned, to be replayed; a winner
        that was a different request is REQUEST_ID_REUSED.
        """
        if not request_id:
            return None
        try:
            CoreRows(session.connection()).insert(_OPERATIONS, [_operation(request_id, method, fingerprint, result)])
        except IntegrityError:
            session.rollback()
            winner = self._replayed(session, request_id, method, fingerprint)
            if winner is None:
                raise
            return winner
        return None

    @staticmethod
    def _write_checkpoints(rows: RowWriter, new: list[_NewCheckpoint]) -> None:
        """Numbers and inserts new checkpoints of distinct plans (callers hold their plans' locks).

        Incrementing the plans' counters locks their rows (PostgreSQL) or the database (SQLite)
        until the transaction ends, so a number is never handed out twice. The same statement reads
        each plan's workspace root, which the checkpoint must have been captured under (none for a
        state-only one): a remembered plan is thereby checked without a read of its own."""
        numbered = rows.increment(_PLANS.c.last_sequence, _PLANS.c.plan_id, [n.record.plan_id for n in new],
                                  also=_PLANS.c.workspace_root)
        for item in new:
            sequence, root = numbered[item.record.plan_id]
            if root != item.record.workspace_root:
                raise _PlanRootRecorded(f"plan {item.record.plan_id} has a workspace root recorded by another replica")
            item.record.sequence = sequence
        rows.insert(_CHECKPOINTS, [_record_values(n.record) for n in new])
        operations = [n.operation for n in new if n.operation is not None]
        if operations:
            rows.insert(_OPERATIONS, operations)

    def _known_plan(self, plan_id: str, raw_root: str) -> KnownPlan:
        """The plan (created on first use, its workspace root recorded on first mention).

        Plans are remembered. A recorded root never changes, but another replica may record one
        for a plan remembered without; the checkpoint's write detects that (``_PlanRootRecorded``),
        and ``create`` forgets the plan and captures again.
        """
        root = self._resolve_root(raw_root) if raw_root else None
        known = self._plans.get(plan_id)
        if known is not None and root is None:
            return known
        if known is not None and known.workspace_root is not None:
            if root != known.workspace_root:
                raise self._root_mismatch(plan_id, root, known.workspace_root)
            return known
        with self.db.session() as session:
            plan = self._plan_row(session, plan_id, root)
            known = KnownPlan(plan.plan_id, plan.workspace_root)
        with self._plans_guard:
            self._plans[plan_id] = known
            # The oldest remembered plan goes first: forgetting one costs a read when it is next used.
            while len(self._plans) > MAX_REMEMBERED_PLANS:
                del self._plans[next(iter(self._plans))]
        return known

    @staticmethod
    def _root_mismatch(plan_id: str, root: str | None, recorded: str | None) -> FailedPrecondition:
        return FailedPrecondition(Reason.WORKSPACE_ROOT_MISMATCH,
                                  f"plan {plan_id} already has workspace_root {recorded!r}",
                                  workspace_root=root, plan_workspace_root=recorded)

    def _plan_row(self, session: Session, plan_id: str, root: str | None) -> PlanRow:
        plan = session.get(PlanRow, plan_id)
        if plan is None:
            plan = PlanRow(plan_id=plan_id, workspace_root=root)
            session.add(plan)
            try:
                session.commit()
            except IntegrityError:
                session.rollback()
                plan = session.get(PlanRow, plan_id)
        if root is not None:
            if plan.workspace_root is None:
                plan.workspace_root = root
                session.add(plan)
                session.commit()
            elif plan.workspace_root != root:
                raise self._root_mismatch(plan_id, root, plan.workspace_root)
        return plan

    def _capture(self, plan: PlanRow | KnownPlan, batch: Batch) -> tuple[CaptureResult, list[str], list[str]]:
        workspace = Workspace(plan.workspace_root)
        patterns, max_size = self._capture_settings(plan.plan_id)
        excluded = self._excluded_paths(plan.workspace_root)
        return self.capturer.capture(workspace, patterns, excluded, max_size, batch), patterns, excluded

    def _new_row(self, plan: PlanRow | KnownPlan, capture: CaptureResult | None, patterns: list[str],
                 excluded: list[str], state_digest: str | None, state_size: int, *, phase: str, trigger: str,
                 source_tool: str, description: str, labels: dict[str, str],
                 rollback_target_checkpoint_id: str | None = None) -> CheckpointRecord:
        """A new checkpoint, numbered when inserted."""
        return CheckpointRecord(
            checkpoint_id=str(ULID()),
            plan_id=plan.plan_id,
            sequence=0,
            phase=phase,
            trigger=trigger,
            source_tool=source_tool,
            description=description,
            labels=labels,
            create_time=utcnow(),
            workspace_root=plan.workspace_root if capture else None,
            tree_digest=capture.tree if capture else None,
            file_count=capture.file_count if capture else 0,
            total_size_bytes=capture.total_size if capture else 0,
            state_digest=state_digest,
            state_size_bytes=state_size,
            skipped=_skipped_json(capture) if capture else [],
            ignore_patterns=patterns,
            excluded_paths=excluded,
            rollback_target_checkpoint_id=rollback_target_checkpoint_id,
        )

    # -- operations ---------------------------------------------------------------------

    def _arguments(self, req: CreateRequest) -> _CreateArguments:
        """A CreateCheckpoint, validated."""
        plan_id = validation.plan_id(req.plan_id)
        trigger = req.trigger or Trigger.MANUAL
        if trigger in SERVER_ONLY_TRIGGERS:
            raise InvalidArgument(Reason.INVALID_PHASE, f"trigger {trigger.value!r} is recorded by the server only",
                                  trigger=trigger.value, phase=req.phase.value if req.phase else "")
        phase = resolve_phase(trigger, req.phase)
        validation.max_length(req.source_tool, validation.MAX_SOURCE_TOOL, "source_tool")
        validation.max_length(req.description, validation.MAX_DESCRIPTION, "description")
        validation.max_length(req.state, validation.MAX_STATE_BYTES, "state")
        labels = validation.labels(req.labels)
        request_id = validation.request_id(req.request_id)
        # Only a request_id is ever compared with what it was first used for (AIP-155).
        fingerprint = _fingerprint(plan=plan_id, trigger=trigger, phase=phase, tool=req.source_tool, labels=labels,
                                   description=req.description, state=hashlib.sha256(req.state).hexdigest(),
                                   root=req.workspace_root) if request_id else ""
        return _CreateArguments(plan_id, req, trigger, phase, labels, request_id, fingerprint)

    def create(self, req: CreateRequest) -> Checkpoint:
        new = self._arguments(req)
        with self._plan_lock(new.plan_id), self.store.referencing():
            self._take_over(new.plan_id)
            if new.request_id:
                with self.db.session() as session:
                    op = self._replayed(session, new.request_id, "CreateCheckpoint", new.fingerprint)
                    if op is not None:
                        return Checkpoint(self._load(session, op.result["checkpoint_id"]))
            try:
                return self._capture_and_record(new)
            except _PlanRootRecorded:
                return self._record_again(new)

    def _record_again(self, new: _CreateArguments) -> Checkpoint:
        """Another replica recorded the plan's root since this one remembered the plan. Read
        again under this plan's lock, the root cannot change before the second attempt."""
        with self._plans_guard:
            self._plans.pop(new.plan_id, None)
        return self._capture_and_record(new)

    def _capture_and_record(self, new: _CreateArguments) -> Checkpoint:
        """Captures the plan's workspace (if it has one) and records the checkpoint, under the plan's lock."""
        req = new.request
        plan = self._known_plan(new.plan_id, req.workspace_root)
        with self.store.batch() as batch:
            capture, patterns, excluded = self._capture(plan, batch) if plan.workspace_root else (None, [], [])
            state_digest = batch.put_bytes(req.state) if req.state else None
        crash_point(Point.CREATE_CAPTURED)
        row = self._new_row(plan, capture, patterns, excluded, state_digest, len(req.state),
                            phase=new.phase.value, trigger=new.trigger.value, source_tool=req.source_tool,
                            description=req.description, labels=new.labels)
        try:
            self._new_checkpoints.submit(_NewCheckpoint(row, self._create_operation(new, row)))
        except IntegrityError:
            winner = self._replayed_create(new)
            if winner is None:
                raise
            return winner
        if capture is not None:
            self.capturer.record(plan.workspace_root, capture.tree)
        crash_point(Point.CREATE_COMMITTED)
        return Checkpoint(row)

    @staticmethod
    def _create_operation(new: _CreateArguments, row: CheckpointRecord) -> dict[str, object] | None:
        if not new.request_id:
            return None
        return _operation(new.request_id, "CreateCheckpoint", new.fingerprint, {"checkpoint_id": row.checkpoint_id})

    def _replayed_create(self, new: _CreateArguments) -> Checkpoint | None:
        """After a create's row failed to insert: the checkpoint recorded first under its request_id
        (by another replica, or by the first attempt of a retried call), if that is why."""
        if not new.request_id:
            return None
        with self.db.session() as session:
            winner = self._replayed(session, new.request_id, "CreateCheckpoint", new.fingerprint)
            return Checkpoint(self._load(session, winner.result["checkpoint_id"])) if winner is not None else None

    async def create_async(self, req: CreateRequest, run_blocking: RunBlocking) -> Checkpoint:
        """``create`` for an asyncio server, whose event loop must never wait on a lock, a read or a sync.

        A state-only create whose every step can be taken at once runs on the loop up to its
        commit, which the group commit's thread writes while the loop serves other calls (see
        ``_start_on_loop``). Any other create runs ``create`` in a thread through ``run_blocking``."""
        started = self._start_on_loop(req)
        if started is None:
            # A busy plan is waited for on the loop, not in a thread (see PlanLocks.run).
            return await self.plan_locks.run(run_blocking, self.create, req, plan_id=req.plan_id)
        try:
            await _committed(started.committed)
        except asyncio.CancelledError:
            # The commit goes on without its caller; the plan stays locked until it ends.
            started.committed.add_done_callback(lambda _: started.release())
            raise
        except Exception as error:
            try:
                return await run_blocking(self._after_failed_commit, started, error)
            finally:
                started.release()
        try:
            crash_point(Point.CREATE_COMMITTED)
        finally:
            started.release()
        return Checkpoint(started.row)

    def _start_on_loop(self, req: CreateRequest) -> _StartedCreate | None:
        """Starts a state-only create without waiting for anything, or returns None when it
        cannot: it has a workspace or a state over ``LOOP_STATE_LIMIT``; its plan is not
        remembered or has a workspace; the plan is busy or garbage collection holds the store;
        the database or the store can block (PostgreSQL, the database store); a fault that
        stalls is configured. Holds the plan's lock and the store's fence until ``release``.

        A request_id is not looked up first (a read): a retried call's row fails to insert, and
        ``_after_failed_commit`` replays the first checkpoint as ``create`` would have."""
        if req.workspace_root or len(req.state) > LOOP_STATE_LIMIT or not self.db.is_sqlite \
                or may_stall(Point.CREATE_CAPTURED, Point.CREATE_COMMITTED):
            return None
        new = self._arguments(req)
        plan = self._plans.get(new.plan_id)
        if plan is None or plan.workspace_root is not None or self.journal.may_have(new.plan_id):
            return None
        release_plan = self._try_plan_lock(new.plan_id)
        if release_plan is None:
            return None
        release_store = self.store.try_referencing()
        if release_store is None:
            release_plan()
            return None

        def release() -> None:
            release_store()
            release_plan()

        batch = self.store.batch()
        try:
            state_digest = batch.put_bytes(req.state) if req.state else None
            row = self._new_row(plan, None, [], [], state_digest, len(req.state), phase=new.phase.value,
                                trigger=new.trigger.value, source_tool=req.source_tool,
                                description=req.description, labels=new.labels)

            def make_durable() -> None:
                batch.commit()
                crash_point(Point.CREATE_CAPTURED)

            committed = self._new_checkpoints.submit_nowait(_NewCheckpoint(row, self._create_operation(new, row)),
                                                            prepare=make_durable)
        except BaseException:
            batch.abort()
            release()
            raise
        return _StartedCreate(new, row, committed, release)

    def _after_failed_commit(self, started: _StartedCreate, error: Exception) -> Checkpoint:
        """What ``create`` would have answered where a create started on the loop failed to commit."""
        if isinstance(error, _PlanRootRecorded):
            return self._record_again(started.new)
        if isinstance(error, IntegrityError):
            winner = self._replayed_create(started.new)
            if winner is not None:
                return winner
        raise error

    def get(self, checkpoint_id: str, with_state: bool = False) -> Checkpoint:
        checkpoint_id = validation.checkpoint_id(checkpoint_id)
        with self.db.session() as session:
            row = self._load(session, checkpoint_id)
        return Checkpoint(row, self._state(row) if with_state else None)

    def _state(self, row: CheckpointRow) -> bytes:
        return self.store.read_bytes(row.state_digest) if row.state_digest else b""

    def list(self, plan_id: str, page_size: int = 0, page_token: str = "",
             filter_text: str = "") -> tuple[list[Checkpoint], str]:
        plan_id = validation.plan_id(plan_id)
        size = filtering.page_size(page_size)
        wanted = filtering.parse_filter(filter_text)
        before = self.page_tokens.check(page_token, plan_id, filter_text)
        query = select(CheckpointRow).where(CheckpointRow.plan_id == plan_id)
        if before is not None:
            query = query.where(CheckpointRow.sequence < before)
        if wanted.phase:
            query = query.where(CheckpointRow.phase == wanted.phase)
        if wanted.trigger:
            query = query.where(CheckpointRow.trigger == wanted.trigger)
        if wanted.source_tool is not None:
            query = query.where(CheckpointRow.source_tool == wanted.source_tool)
        for key, value in wanted.labels.items():
            query = query.where(col(CheckpointRow.labels)[key].as_string() == value)
        query = query.order_by(col(CheckpointRow.sequence).desc()).limit(size + 1)
        with self.db.session() as session:
            rows = list(session.exec(query).all())
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            token = self.page_tokens.issue(plan_id, filter_text, rows[-1].sequence)
        return [Checkpoint(r) for r in rows], token

    def count(self, plan_id: str) -> int:
        with self.db.session() as session:
            return session.exec(select(func.count()).where(CheckpointRow.plan_id == plan_id)).one()

    def delete(self, checkpoint_id: str) -> None:
        checkpoint_id = validation.checkpoint_id(checkpoint_id)
        with self.db.session() as session:
            row = self._load(session, checkpoint_id)
        with self._plan_lock(row.plan_id), self.db.session() as session:
            row = self._load(session, checkpoint_id)
            session.delete(row)
            session.commit()

    def diff(self, base_id: str, target_id: str = "", paths: tuple[str, ...] = ()) -> list[Change]:
        base_id = validation.checkpoint_id(base_id, "base_checkpoint_id")
        target_id = validation.checkpoint_id(target_id, "target_checkpoint_id", required=False)
        subset = self._subset(paths)
        with self.db.session() as session:
            base = self._load(session, base_id)
            if not base.tree_digest:
                raise FailedPrecondition(Reason.NO_WORKSPACE, f"checkpoint {base_id} has no files",
                                         checkpoint_id=base_id)
            if target_id:
                target = self._load(session, target_id)
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
        changes = self.trees.diff(base.tree_digest, target_tree) if target_id else self._diff_live(base, plan)
        return [c for c in changes if not subset or is_under(c.path, subset)]

    def _diff_live(self, base: CheckpointRow, plan: PlanRow) -> list[Change]:
        """Diff against a capture that no checkpoint references: the GC fence is held until
        the diff has read every node of it, then its batch is dropped, so that nothing builds
        on a capture garbage collection would not keep (the previous capture stays the base,
        and what changed since is captured again by the next checkpoint). An unfinished rollback
        of the plan is finished first."""
        with self._plan_lock(base.plan_id), self.store.referencing():
            self._take_over(base.plan_id)
            batch = self.store.batch()
            try:
                live_tree = self._capture(plan, batch)[0].tree
                return list(self.trees.diff(base.tree_digest, live_tree))
            finally:
                batch.abort()

    @staticmethod
    def _subset(paths: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        if len(paths) > validation.MAX_PATHS:
            raise InvalidArgument(Reason.FIELD_TOO_LONG, f"at most {validation.MAX_PATHS} paths", field="paths",
                                  limit=validation.MAX_PATHS)
        return tuple(validate_relpath(p.rstrip("/") if p != "/" else p) for p in paths)

    def _target_rules(self, row: CheckpointRow) -> IgnoreRules:
        def load(directory: str) -> bytes | None:
            entry = self.trees.lookup(row.tree_digest, f"{directory}/{GITIGNORE}" if directory else GITIGNORE)
            if entry is None or entry.kind is not EntryKind.FILE or entry.size > 1 << 20:
                return None
            return self.store.read_bytes(entry.digest)

        return IgnoreRules(row.ignore_patterns, load, row.excluded_paths)

    def rollback(self, req: RollbackRequest) -> RollbackResult:
        """Restores files and/or state to a checkpoint.

        Order of durability: the safety checkpoint, the request_id's record and the journal entry
        (one transaction), then the workspace changes, then the entry goes. A rollback left
        unfinished (its process died) is finished by whoever takes the plan next (``_take_over``),
        before anything else is done with the plan, this request included; one that fails part-way
        (a full disk, a write racing it) takes back what it had changed before its error is
        returned.
        """
        plan_id = validation.plan_id(req.plan_id)
        checkpoint_id = validation.checkpoint_id(req.checkpoint_id)
        subset = self._subset(req.paths)
        validation.max_length(req.current_state, validation.MAX_STATE_BYTES, "current_state")
        request_id = validation.request_id(req.request_id)
        fingerprint = _fingerprint(plan=plan_id, checkpoint=checkpoint_id, scope=req.scope.value, paths=subset,
                                   dry_run=req.dry_run, state=hashlib.sha256(req.current_state).hexdigest())
        with self._plan_lock(plan_id), self.store.referencing():
            leftover = self._take_over(plan_id)
            with self.db.session() as session:
                return self._rollback_locked(session, req, plan_id, checkpoint_id, subset, request_id, fingerprint,
                                             leftover)

    def _rollback_locked(self, session: Session, req: RollbackRequest, plan_id: str, checkpoint_id: str,
                         subset: tuple[str, ...], request_id: str, fingerprint: str,
                         leftover: JournalEntry | None) -> RollbackResult:
        op = self._replayed(session, request_id, "Rollback", fingerprint)
        target = self._load(session, checkpoint_id)
        if target.plan_id != plan_id:
            raise FailedPrecondition(Reason.CHECKPOINT_PLAN_MISMATCH,
                                     f"checkpoint {checkpoint_id} belongs to another plan",
                                     checkpoint_id=checkpoint_id, plan_id=plan_id)
        if op is not None:
            return self._replay_rollback(session, op, target, req.scope)
        plan = session.get(PlanRow, plan_id)
        if req.scope.files and not target.tree_digest and (req.scope is Scope.FILES or plan.workspace_root):
            raise FailedPrecondition(Reason.NO_WORKSPACE, f"checkpoint {checkpoint_id} has no files to restore",
                                     checkpoint_id=checkpoint_id)
        restore_files = req.scope.files and target.tree_digest is not None
        if restore_files and plan.workspace_root != target.workspace_root:
            raise FailedPrecondition(Reason.WORKSPACE_ROOT_MISMATCH,
                                     "the plan's workspace root changed since this checkpoint",
                                     workspace_root=target.workspace_root or "",
                                     plan_workspace_root=plan.workspace_root or "")
        changes: list[Change] = []
        with self.store.batch() as batch:
            capture, patterns, excluded = self._capture(plan, batch) if plan.workspace_root else (None, [], [])
            if capture is not None and restore_files:
                changes = self._plan_restore(plan.workspace_root, capture, target, subset, batch)
            if req.dry_run:
                batch.abort()
                return RollbackResult(changes, self._state(target) if req.scope.state else b"", None, True)
            state_digest, state_size = self._safety_state(session, plan_id, req.current_state, batch)
        seen = self._seen(plan.workspace_root, changes)
        crash_point(Point.ROLLBACK_PLANNED)
        safety = self._new_row(plan, capture, patterns, excluded, state_digest, state_size,
                               phase=Phase.ROLLBACK_SAFETY.value, trigger=Trigger.ROLLBACK.value,
                               source_tool="checkpointd", description=f"before rollback to {checkpoint_id}",
                               labels={"rollback_target": checkpoint_id},
                               rollback_target_checkpoint_id=checkpoint_id)
        self._write_checkpoints(CoreRows(session.connection()), [_NewCheckpoint(safety)])
        winner = self._record_operation(session, request_id, "Rollback", fingerprint,
                                        {"safety_checkpoint_id": safety.checkpoint_id,
                                         "changes": [_change_json(c) for c in changes]})
        if winner is not None:
            return self._replay_rollback(session, winner, target, req.scope)
        entry = None
        if changes:
            entry = JournalEntry(
                plan_id=plan_id, workspace_root=plan.workspace_root, target_checkpoint_id=checkpoint_id,
                safety_checkpoint_id=safety.checkpoint_id, safety_tree=safety.tree_digest, paths=subset,
                temp_tag=new_temp_tag(), directories=_written_directories(changes), request_id=request_id,
                last_sequence=safety.sequence)
            self.journal.put(entry, session)
        elif leftover is not None:
            # This rollback's safety checkpoint records the workspace as it is: it supersedes the entry.
            self._drop(leftover, "a new rollback supersedes it", session)
        session.commit()
        if entry is not None:
            self.journal.added(plan_id)
        elif leftover is not None:
            self.journal.forget(plan_id)
        if capture is not None:
            self.capturer.record(plan.workspace_root, capture.tree)
        crash_point(Point.ROLLBACK_SAFETY_COMMITTED)
        if entry is not None:
            self._apply_journaled(entry, changes, seen)
        return RollbackResult(changes, self._state(target) if req.scope.state else b"", Checkpoint(safety), False)

    def _plan_restore(self, root: str, capture: CaptureResult, goal: CheckpointRow, subset: tuple[str, ...],
                      batch: Batch, written: tuple[tuple[str, Entry | None], ...] | None = None) -> list[Change]:
        """The changes that bring ``subset`` of the workspace to ``goal`` (with ``written``: only
        at paths that still hold what a rollback wrote there); first adds to ``capture`` whatever
        they would replace that the capture left out (ignored or skipped now)."""
        workspace = Workspace(root)
        keep = None
        if written is not None:
            wrote = dict(written)

            def keep(change: Change) -> bool:
                return change.path in wrote and holds(change.base, wrote[change.path])

        try:
            uncaptured = self.restorer.find_uncaptured(workspace, capture.tree, goal.tree_digest, subset)
            if uncaptured:
                extra = self.snapshotter.capture_paths(workspace, uncaptured, batch)
                capture.tree = self.trees.apply(batch, capture.tree, extra)
                capture.file_count += sum(e.kind is not EntryKind.DIR for e in extra.values())
                capture.total_size += sum(e.size for e in extra.values())
                capture.skipped = [s for s in capture.skipped if s.path not in extra]
            return self.restorer.plan(workspace, capture.tree, goal.tree_digest, self._target_rules(goal),
                                      {s[0] for s in goal.skipped}, subset, keep)
        except Inaccessible as exc:
            raise FailedPrecondition(Reason.ROLLBACK_CONFLICT,
                                     f"cannot roll back: {exc.path!r} cannot be read ({exc.cause.strerror}); "
                                     "nothing was changed", path=exc.path, errno=_errno_name(exc.cause)) from exc
        except (UnsafePath, FileNotFoundError, NotADirectoryError) as exc:
            raise FailedPrecondition(Reason.ROLLBACK_CONFLICT,
                                     f"the workspace changed while the rollback was being planned ({exc}); "
                                     "nothing was changed", path=str(exc)[:512]) from exc

    def _seen(self, root: str | None, changes: list[Change]) -> dict[str, Indexed]:
        """What the capture that planned ``changes`` saw of each file they replace or remove: the
        stat index's entry, when it is the one the capture used (same digest)."""
        if not root or not changes:
            return {}
        index = self.snapshotter.index.for_root(root)
        seen = {}
        for change in changes:
            base = change.base
            if base is not None and base.kind is EntryKind.FILE:
                known = index.get(change.path)
                if known is not None and known.digest == base.digest and known.size == base.size:
                    seen[change.path] = known
        return seen

    def _apply_journaled(self, entry: JournalEntry, changes: list[Change], seen: dict[str, Indexed]) -> None:
        """Applies ``changes`` (their journal entry is committed); on failure undoes them and raises."""
        try:
            self.restorer.apply(Workspace(entry.workspace_root, entry.temp_tag), changes, seen)
        except ApplyInterrupted as interrupted:
            raise self._undo_interrupted(entry, interrupted) from interrupted
        crash_point(Point.ROLLBACK_APPLIED)
        self.journal.remove(entry.plan_id)

    def _undo_interrupted(self, entry: JournalEntry, interrupted: ApplyInterrupted) -> CheckpointdError:
        """Takes back what a rollback that stopped part-way had written; returns the error to report."""
        log.warning("rollback of plan %s to %s stopped at %r (%s); undoing it", entry.plan_id,
                    entry.target_checkpoint_id, interrupted.path, interrupted.why)
        self._forget_operation(entry.request_id)
        undo = replace(entry, goal=Goal.UNDO, written=tuple(interrupted.written))
        where = f"rollback to {entry.target_checkpoint_id} stopped at {interrupted.path!r} ({interrupted.why})"
        try:
            self.journal.put(undo)
            self._resume(undo)
        except (CheckpointdError, ApplyInterrupted, OSError, SQLAlchemyError) as undo_failure:
            log.error("undoing the interrupted rollback of plan %s failed (%s); safety checkpoint %s holds the "
                      "workspace as it was; the undo is tried again before the plan is next used", entry.plan_id,
                      undo_failure, entry.safety_checkpoint_id)
            return FailedPrecondition(
                Reason.ROLLBACK_CONFLICT,
                f"{where} and undoing it failed too ({undo_failure}): the workspace is partly restored; safety "
                f"checkpoint {entry.safety_checkpoint_id} holds it as it was before, and the undo is tried again "
                "before the plan is next used", path=interrupted.path,
                safety_checkpoint_id=entry.safety_checkpoint_id)
        cause = interrupted.cause
        if interrupted.raced:
            return FailedPrecondition(
                Reason.ROLLBACK_CONFLICT,
                f"{where}: it changed after the rollback's safety checkpoint was taken, so the rollback stopped "
                "there and took back what it had changed; the new content was left in place",
                path=interrupted.path)
        if interrupted.disk_full:
            return ResourceExhausted(Reason.STORAGE_EXHAUSTED,
                                     f"{where}: the workspace's disk is full; the rollback was undone",
                                     path=interrupted.path)
        if isinstance(cause, DataLoss):
            return DataLoss(cause.reason, f"{where}; the rollback was undone", **cause.metadata)
        metadata = {"errno": _errno_name(cause)} if isinstance(cause, OSError) else {}
        return FailedPrecondition(Reason.ROLLBACK_CONFLICT, f"{where}; the rollback was undone, nothing was changed",
                                  path=interrupted.path, **metadata)

    def _take_over(self, plan_id: str) -> JournalEntry | None:
        """Finishes (or undoes) the plan's unfinished rollback before anything else is done with the
        plan: one this process gave up on, or one a process (another replica's) left when it died.
        Called with the plan's lock and the store's fence held. Returns the entry if it is still
        unfinished (it could not be finished now: the next taker tries again)."""
        if not self.journal.may_have(plan_id):
            return None
        entry = self.journal.get(plan_id)
        if entry is None:
            return None
        log.warning("finishing the unfinished rollback of plan %s (goal: %s checkpoint %s)", plan_id,
                    entry.goal.value, entry.goal_checkpoint_id)
        try:
            self._resume(entry)
        except (CheckpointdError, ApplyInterrupted, OSError, SQLAlchemyError) as exc:
            log.error("could not finish the unfinished rollback of plan %s (%s); safety checkpoint %s holds the "
                      "workspace as it was before it; tried again when the plan is next used", plan_id, exc,
                      entry.safety_checkpoint_id)
            self._forget_operation(entry.request_id)
            return entry
        return None

    def _resume(self, entry: JournalEntry) -> None:
        """Brings the paths an unfinished rollback covers to its goal (the target; for an undo, the
        safety checkpoint, at the paths that still hold what the rollback wrote), then drops its
        entry. If the workspace is no longer what the safety checkpoint holds (the rollback got
        part-way, or someone wrote since), it is recorded as a new safety checkpoint first. An
        entry whose plan moved on is dropped unapplied. Called with the plan's lock and the store's
        ``referencing`` fence held (taking the fence again could wait forever behind a collection)."""
        workspace = Workspace(entry.workspace_root, entry.temp_tag)
        for directory in entry.directories:
            workspace.remove_temp_files(directory, entry.temp_tag)
        with self.db.session() as session:
            plan = session.get(PlanRow, entry.plan_id)
            goal = session.get(CheckpointRow, entry.goal_checkpoint_id)
            if plan is None or plan.workspace_root != entry.workspace_root:
                self._drop(entry, "its plan or the plan's workspace is gone")
                return
            if plan.last_sequence > entry.last_sequence:
                self._drop(entry, f"the plan moved on (checkpoint {plan.last_sequence} is newer than "
                                  f"{entry.last_sequence}, the last this rollback recorded)")
                return
            if goal is None or not goal.tree_digest:
                self._drop(entry, f"checkpoint {entry.goal_checkpoint_id} is gone")
                return
            with self.store.batch() as batch:
                capture, patterns, excluded = self._capture(plan, batch)
                changes = self._plan_restore(plan.workspace_root, capture, goal, entry.paths, batch, entry.written)
                record = bool(changes) and capture.tree != entry.safety_tree
                state_digest, state_size = (self._safety_state(session, entry.plan_id, b"", batch) if record
                                            else (None, 0))
            seen = self._seen(plan.workspace_root, changes)
            if record:
                verb = "finishing" if entry.goal is Goal.COMPLETE else "undoing"
                safety = self._new_row(plan, capture, patterns, excluded, state_digest, state_size,
                                       phase=Phase.ROLLBACK_SAFETY.value, trigger=Trigger.ROLLBACK.value,
                                       source_tool="checkpointd",
                                       description=f"before {verb} the interrupted rollback to "
                                                   f"{entry.target_checkpoint_id}",
                                       labels={"rollback_target": goal.checkpoint_id},
                                       rollback_target_checkpoint_id=goal.checkpoint_id)
                self._write_checkpoints(CoreRows(session.connection()), [_NewCheckpoint(safety)])
                self.journal.put(replace(entry, last_sequence=safety.sequence), session)
                session.commit()
                self.capturer.record(plan.workspace_root, capture.tree)
            if changes:
                self.restorer.apply(workspace, changes, seen)
        crash_point(Point.ROLLBACK_APPLIED)
        self.journal.remove(entry.plan_id)

    def _drop(self, entry: JournalEntry, why: str, session: Session | None = None) -> None:
        """Drops an entry without applying it (its temporary files are gone already). A rollback
        not finished must not be replayed as done: its request_id's record goes too."""
        log.warning("dropping the unfinished rollback of plan %s to %s: %s", entry.plan_id,
                    entry.target_checkpoint_id, why)
        if session is not None:
            session.connection().execute(delete(_JOURNAL).where(_JOURNAL.c.plan_id == entry.plan_id))
            if entry.request_id:
                session.connection().execute(delete(_OPERATIONS).where(
                    _OPERATIONS.c.request_id == entry.request_id, _OPERATIONS.c.method == "Rollback"))
            return
        self._forget_operation(entry.request_id)
        self.journal.remove(entry.plan_id)

    def _forget_operation(self, request_id: str) -> None:
        """A rollback that did not happen must not be replayed as done."""
        if not request_id:
            return
        with self.db.session() as session:
            op = session.get(OperationRow, request_id)
            if op is not None and op.method == "Rollback":
                session.delete(op)
                session.commit()

    def recover_interrupted_rollbacks(self) -> list[str]:
        """Finishes (or undoes) the rollbacks left unfinished (by this server's previous process, or,
        on PostgreSQL, by a replica that died), after importing the journal files a server before the
        database journal left. Runs before the server serves. Returns the plans it could not finish:
        they are tried again when next used."""
        self._import_legacy_journal(Path(self.settings.data_dir) / LEGACY_DIRECTORY)
        stuck = []
        for plan_id in self.journal.plan_ids():
            with self._plan_lock(plan_id), self.store.referencing():
                if self._take_over(plan_id) is not None:
                    stuck.append(plan_id)
        return stuck

    def _import_legacy_journal(self, directory: Path) -> None:
        """Moves the journal files of a server before the database journal into the database."""
        for path, entry in legacy_entries(directory):
            if isinstance(entry, Exception):
                log.error("the rollback journal file %s is unreadable (%s); dropping it", path, entry)
                path.unlink(missing_ok=True)
                continue
            with self._plan_lock(entry.plan_id), self.db.session() as session:
                safety = session.get(CheckpointRow, entry.safety_checkpoint_id)
                if safety is None:
                    # Its server wrote the file before the safety checkpoint: nothing had changed.
                    workspace = Workspace(entry.workspace_root)
                    for directory_path in entry.directories:
                        with contextlib.suppress(CheckpointdError, OSError):
                            workspace.remove_temp_files(directory_path, entry.temp_tag)
                    log.info("the rollback of plan %s to %s stopped before its safety checkpoint committed; "
                             "nothing had changed", entry.plan_id, entry.target_checkpoint_id)
                elif self.journal.may_have(entry.plan_id) and self.journal.get(entry.plan_id) is not None:
                    log.warning("dropping the old journal file of plan %s: the database has a newer entry",
                                entry.plan_id)
                else:
                    self.journal.put(replace(entry, last_sequence=safety.sequence), session)
                    session.commit()
                    self.journal.added(entry.plan_id)
            path.unlink(missing_ok=True)
        remove_legacy_directory(directory)

    def _safety_state(self, session: Session, plan_id: str, current: bytes, batch: Batch) -> tuple[str | None, int]:
        if current:
            return batch.put_bytes(current), len(current)
        return self._newest_state(session, plan_id)

    @staticmethod
    def _newest_state(session: Session, plan_id: str) -> tuple[str | None, int]:
        # Two columns, not the row: loading a whole checkpoint costs twice the query.
        newest = session.exec(select(CheckpointRow.state_digest, CheckpointRow.state_size_bytes)
                              .where(CheckpointRow.plan_id == plan_id)
                              .order_by(col(CheckpointRow.sequence).desc()).limit(1)).first()
        return (newest[0], newest[1]) if newest else (None, 0)

    def _replay_rollback(self, session: Session, op: OperationRow, target: CheckpointRow,
                         scope: Scope) -> RollbackResult:
        safety = session.get(CheckpointRow, op.result["safety_checkpoint_id"])
        changes = [_change_from_json(c) for c in op.result["changes"]]
        return RollbackResult(changes, self._state(target) if scope.state else b"",
                              Checkpoint(safety) if safety else None, False)


def _errno_name(error: BaseException) -> str:
    number = getattr(error, "errno", None)
    return errno.errorcode.get(number, str(number)) if number is not None else ""


def _written_directories(changes: list[Change]) -> tuple[str, ...]:
    """Where applying ``changes`` creates temporary files: the parents of what it writes."""
    return tuple(sorted({c.path.rpartition("/")[0] for c in changes if c.target is not None}))


def _change_json(change: Change) -> list[object]:
    def side(entry):
        return None if entry is None else [entry.kind.value, entry.mode, entry.size, entry.digest, entry.target]

    return [change.path, side(change.base), side(change.target)]


def _change_from_json(data: list) -> Change:
    def side(raw):
        return None if raw is None else Entry(EntryKind(raw[0]), raw[1], raw[2], raw[3], raw[4])

    return Change(data[0], side(data[1]), side(data[2]))
