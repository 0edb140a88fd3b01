"""CreateCheckpoint: captures a plan's workspace (if it has one) and stores its state, then
records the checkpoint through the group commit; a state-only create on an event loop takes
a fast path that never waits (``create_async``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from checkpointd.core.engine.idempotency import fingerprint, operation, replayed
from checkpointd.core.engine.parts import EngineParts
from checkpointd.core.engine.records import CheckpointRecord, NewCheckpoint, PlanRootRecorded, new_row
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.engine.requests import Checkpoint, CreateRequest
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import InvalidArgument, Reason
from checkpointd.core.kernel.faults import Point, crash_point, may_stall
from checkpointd.core.kernel.vocabulary import SERVER_ONLY_TRIGGERS, Phase, Trigger, resolve_phase

#: Largest state a create stores on an event loop (hashing and compressing it takes microseconds);
#: a larger one is stored by a thread. Below the store's limit for packed objects.
LOOP_STATE_LIMIT = 64 * 1024
#: How a caller on an event loop runs a blocking function: in a thread, awaiting its result.
RunBlocking = Callable[..., Awaitable[Any]]

log = logging.getLogger("checkpointd")


@dataclass(frozen=True, slots=True)
class _CreateArguments:
    """A validated CreateCheckpoint, as both attempts of ``Create.create`` record it."""

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


class Create:
    def __init__(self, parts: EngineParts, recovery: Recovery) -> None:
        self.parts = parts
        self.recovery = recovery

    @staticmethod
    def _arguments(req: CreateRequest) -> _CreateArguments:
        """A CreateCheckpoint, validated."""
        plan_id = validation.plan_id(req.plan_id)
        trigger = req.trigger or Trigger.MANUAL
        if trigger in SERVER_ONLY_TRIGGERS:
            raise InvalidArgument(Reason.INVALID_PHASE, f"trigger {trigger.value!r} is recorded by the server only",
                                  trigger=trigger.value, phase=req.phase.value if req.phase else "")
        phase = resolve_phase(trigger, req.phase)
        validation.text(req.source_tool, validation.MAX_SOURCE_TOOL, "source_tool")
        validation.text(req.description, validation.MAX_DESCRIPTION, "description")
        validation.max_length(req.state, validation.MAX_STATE_BYTES, "state")
        labels = validation.labels(req.labels)
        request_id = validation.request_id(req.request_id)
        # Only a request_id is ever compared with what it was first used for (AIP-155).
        request_fingerprint = fingerprint(plan=plan_id, trigger=trigger, phase=phase, tool=req.source_tool,
                                          labels=labels, description=req.description,
                                          state=hashlib.sha256(req.state).hexdigest(),
                                          root=req.workspace_root) if request_id else ""
        return _CreateArguments(plan_id, req, trigger, phase, labels, request_id, request_fingerprint)

    def create(self, req: CreateRequest) -> Checkpoint:
        parts = self.parts
        new = self._arguments(req)
        with parts.registry.lock(new.plan_id), parts.store.referencing():
            self.recovery.take_over(new.plan_id)
            if new.request_id:
                with parts.db.session() as session:
                    op = replayed(session, new.request_id, "CreateCheckpoint", new.fingerprint)
                    if op is not None:
                        return Checkpoint(parts.load(session, op.result["checkpoint_id"]))
            try:
                return self._capture_and_record(new)
            except PlanRootRecorded:
                return self._record_again(new)

    def _record_again(self, new: _CreateArguments) -> Checkpoint:
        """Another replica recorded the plan's root since this one remembered the plan. Read
        again under this plan's lock, the root cannot change before the second attempt."""
        self.parts.registry.forget(new.plan_id)
        return self._capture_and_record(new)

    def _capture_and_record(self, new: _CreateArguments) -> Checkpoint:
        """Captures the plan's workspace (if it has one) and records the checkpoint, under the plan's lock."""
        parts = self.parts
        req = new.request
        plan, mention = parts.registry.known(new.plan_id, req.workspace_root)
        try:
            with parts.store.batch() as batch:
                capture, patterns, excluded = parts.capture(plan, batch) if plan.workspace_root else (None, [], [])
                state_digest = batch.put_bytes(req.state) if req.state else None
            crash_point(Point.CREATE_CAPTURED)
            row = new_row(plan, capture, patterns, excluded, state_digest, len(req.state),
                          phase=new.phase.value, trigger=new.trigger.value, source_tool=req.source_tool,
                          description=req.description, labels=new.labels)
            try:
                parts.new_checkpoints.submit(NewCheckpoint(row, self._create_operation(new, row)))
            except IntegrityError:
                winner = self._replayed_create(new)
                if winner is None:
                    raise
                return winner
        except Exception:
            # Nothing was recorded: neither is the plan (or its root) this call first mentioned.
            try:
                parts.registry.take_back(new.plan_id, mention)
            except Exception:  # the caller is told why the create failed, not why this did
                log.exception("could not take back plan %s after its create failed", new.plan_id)
            raise
        if capture is not None:
            parts.capturer.record(plan.workspace_root, capture.tree)
        crash_point(Point.CREATE_COMMITTED)
        return Checkpoint(row)

    @staticmethod
    def _create_operation(new: _CreateArguments, row: CheckpointRecord) -> dict[str, object] | None:
        if not new.request_id:
            return None
        return operation(new.request_id, "CreateCheckpoint", new.fingerprint, {"checkpoint_id": row.checkpoint_id})

    def _replayed_create(self, new: _CreateArguments) -> Checkpoint | None:
        """After a create's row failed to insert: the checkpoint recorded first under its request_id
        (by another replica, or by the first attempt of a retried call), if that is why."""
        if not new.request_id:
            return None
        with self.parts.db.session() as session:
            winner = replayed(session, new.request_id, "CreateCheckpoint", new.fingerprint)
            return Checkpoint(self.parts.load(session, winner.result["checkpoint_id"])) if winner is not None else None

    async def create_async(self, req: CreateRequest, run_blocking: RunBlocking) -> Checkpoint:
        """``create`` for an asyncio server, whose event loop must never wait on a lock, a read or a sync.

        A state-only create whose every step can be taken at once runs on the loop up to its
        commit, which the group commit's thread writes while the loop serves other calls (see
        ``_start_on_loop``). Any other create runs ``create`` in a thread through ``run_blocking``."""
        started = self._start_on_loop(req)
        if started is None:
            # A busy plan is waited for on the loop, not in a thread (see PlanLocks.run).
            return await self.parts.registry.locks.run(run_blocking, self.create, req, plan_id=req.plan_id)
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
        parts = self.parts
        if req.workspace_root or len(req.state) > LOOP_STATE_LIMIT or not parts.db.is_sqlite \
                or may_stall(Point.CREATE_CAPTURED, Point.CREATE_COMMITTED):
            return None
        new = self._arguments(req)
        plan = parts.registry.remembered(new.plan_id)
        if plan is None or plan.workspace_root is not None or parts.journal.may_have(new.plan_id):
            return None
        release_plan = parts.registry.try_lock(new.plan_id)
        if release_plan is None:
            return None
        release_store = parts.store.try_referencing()
        if release_store is None:
            release_plan()
            return None

        def release() -> None:
            release_store()
            release_plan()

        batch = parts.store.batch()
        try:
            state_digest = batch.put_bytes(req.state) if req.state else None
            row = new_row(plan, None, [], [], state_digest, len(req.state), phase=new.phase.value,
                          trigger=new.trigger.value, source_tool=req.source_tool,
                          description=req.description, labels=new.labels)

            def make_durable() -> None:
                batch.commit()
                crash_point(Point.CREATE_CAPTURED)

            committed = parts.new_checkpoints.submit_nowait(NewCheckpoint(row, self._create_operation(new, row)),
                                                            prepare=make_durable)
        except BaseException:
            batch.abort()
            release()
            raise
        return _StartedCreate(new, row, committed, release)

    def _after_failed_commit(self, started: _StartedCreate, error: Exception) -> Checkpoint:
        """What ``create`` would have answered where a create started on the loop failed to commit."""
        if isinstance(error, PlanRootRecorded):
            return self._record_again(started.new)
        if isinstance(error, IntegrityError):
            winner = self._replayed_create(started.new)
            if winner is not None:
                return winner
        raise error
