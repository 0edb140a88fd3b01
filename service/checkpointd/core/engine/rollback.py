"""Rollback: restores a plan's files and/or state to a checkpoint, after recording the workspace
as it is in a safety checkpoint; a rollback that fails part-way takes back what it changed."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import replace
from functools import partial

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from checkpointd.core.capture.look import LookBatch
from checkpointd.core.capture.stat_index import Indexed
from checkpointd.core.engine.idempotency import fingerprint, forget_rollback, record_operation, replayed
from checkpointd.core.engine.nesting import nested_workspaces, refusal
from checkpointd.core.engine.parts import EngineParts, abandoned_if_cancelled, path_subset
from checkpointd.core.engine.records import NewCheckpoint, new_row
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.engine.requests import Checkpoint, RollbackRequest, RollbackResult, Scope
from checkpointd.core.engine.restoring import OpenedWindows, errno_name, plan_restore, safety_state, seen_by_capture
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.cancellation import NEVER, Cancellation
from checkpointd.core.kernel.errors import (
    CheckpointdError,
    DataLoss,
    FailedPrecondition,
    Reason,
    ResourceExhausted,
)
from checkpointd.core.kernel.faults import Point, crash_point
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.metadata.models import CheckpointRow, OperationRow, PlanRow
from checkpointd.core.metadata.rows import CoreRows
from checkpointd.core.restore.journal import Goal, JournalEntry, new_temp_tag
from checkpointd.core.restore.restorer import ApplyInterrupted
from checkpointd.core.store.tree import Change, Entry, EntryKind

log = logging.getLogger("checkpointd.engine")


class Rollbacks:
    def __init__(self, parts: EngineParts, recovery: Recovery) -> None:
        self.parts = parts
        self.recovery = recovery

    def rollback(self, req: RollbackRequest, cancel: Cancellation = NEVER) -> RollbackResult:
        """Restores files and/or state to a checkpoint.

        Order of durability: the safety checkpoint, the request_id's record and the journal entry
        (one transaction), then the workspace changes, then the entry goes. A rollback left
        unfinished (its process died) is finished by whoever takes the plan next (``take_over``),
        before anything else is done with the plan, this request included; one that fails part-way
        (a full disk, a write racing it) takes back what it had changed before its error is
        returned.

        Once ``cancel`` is set (the caller gave up), a rollback still capturing or planning stops,
        raising ``Cancelled``: nothing is recorded and the workspace is untouched. One whose safety
        checkpoint is being made durable goes on to its end, and so does the restore after it.
        """
        plan_id = validation.plan_id(req.plan_id)
        checkpoint_id = validation.checkpoint_id(req.checkpoint_id)
        subset = path_subset(req.paths)
        validation.max_length(req.current_state, validation.MAX_STATE_BYTES, "current_state")
        request_id = validation.request_id(req.request_id)
        request_fingerprint = fingerprint(plan=plan_id, checkpoint=checkpoint_id, scope=req.scope.value,
                                          paths=subset, dry_run=req.dry_run,
                                          state=hashlib.sha256(req.current_state).hexdigest())
        if req.allow_nested_workspaces:  # folded in only when set: request_ids recorded before it keep matching
            request_fingerprint = fingerprint(rollback=request_fingerprint, allow_nested_workspaces=True)
        with self.parts.registry.lock(plan_id), self.parts.store.referencing():
            leftover = self.recovery.take_over(plan_id)
            with self.parts.db.session() as session, abandoned_if_cancelled("rollback", plan_id, cancel):
                return self._rollback_locked(session, req, plan_id, checkpoint_id, subset, request_id,
                                             request_fingerprint, leftover, cancel)

    def _rollback_locked(self, session: Session, req: RollbackRequest, plan_id: str, checkpoint_id: str,
                         subset: tuple[str, ...], request_id: str, request_fingerprint: str,
                         leftover: JournalEntry | None, cancel: Cancellation) -> RollbackResult:
        parts = self.parts
        op = replayed(session, request_id, "Rollback", request_fingerprint)
        target = parts.load(session, checkpoint_id)
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
        # A dry run is a look: it hashes the files it captures and stores none of them (LookBatch).
        with (LookBatch(parts.store.batch()) if req.dry_run else parts.store.batch()) as batch:
            capture, patterns, excluded = (parts.capture(plan, batch, cancel) if plan.workspace_root
                                           else (None, [], []))
            if capture is not None and restore_files:
                changes = plan_restore(parts, plan.workspace_root, capture, target, subset, batch)
            nested = nested_workspaces(session, parts.trees, plan_id, plan.workspace_root, changes)
            if nested and not req.allow_nested_workspaces:
                raise refusal(plan_id, nested)  # the batch is dropped on the way out
            if req.dry_run:  # the look is dropped on the way out
                return RollbackResult(changes, parts.state(target) if req.scope.state else b"", None, True, nested)
            state_digest, state_size = safety_state(session, plan_id, req.current_state, batch)
            # The last moment the rollback may stop (nothing recorded, no file changed): from here
            # on its safety checkpoint is made durable and committed, and the workspace restored.
            cancel.check()
        seen = seen_by_capture(parts, plan.workspace_root, capture, changes)
        crash_point(Point.ROLLBACK_PLANNED)
        safety = new_row(plan, capture, patterns, excluded, state_digest, state_size,
                         phase=Phase.ROLLBACK_SAFETY.value, trigger=Trigger.ROLLBACK.value,
                         source_tool="checkpointd", description=f"before rollback to {checkpoint_id}",
                         labels={"rollback_target": checkpoint_id},
                         rollback_target_checkpoint_id=checkpoint_id)
        parts.write_checkpoints(CoreRows(session.connection()), [NewCheckpoint(safety)])
        winner = record_operation(session, request_id, "Rollback", request_fingerprint,
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
            parts.journal.put(entry, session)
        elif leftover is not None:
            # This rollback's safety checkpoint records the workspace as it is: it supersedes the entry.
            self.recovery.drop(leftover, "a new rollback supersedes it", session)
        session.commit()
        if entry is not None:
            parts.journal.added(plan_id)
        elif leftover is not None:
            parts.journal.forget(plan_id)
        if capture is not None:
            parts.capturer.record(plan.workspace_root, capture.tree)
        crash_point(Point.ROLLBACK_SAFETY_COMMITTED)
        if entry is not None:
            self._apply_journaled(entry, changes, seen)
        return RollbackResult(changes, parts.state(target) if req.scope.state else b"", Checkpoint(safety), False,
                              nested)

    def _apply_journaled(self, entry: JournalEntry, changes: list[Change], seen: dict[str, Indexed]) -> None:
        """Applies ``changes`` (their journal entry is committed); on failure undoes them and raises."""
        watcher = self.parts.watcher
        windows = OpenedWindows(self.parts.journal, entry, partial(self.parts.registry.check_held, entry.plan_id))
        try:
            with watcher.quieted() if watcher is not None else contextlib.nullcontext():
                self.parts.restorer.apply(windows.workspace(), changes, seen, keep_going=windows.still_ours)
        except ApplyInterrupted as interrupted:
            raise self._undo_interrupted(windows.entry, interrupted) from interrupted
        crash_point(Point.ROLLBACK_APPLIED)
        self.parts.journal.remove(entry.plan_id)

    def _undo_interrupted(self, entry: JournalEntry, interrupted: ApplyInterrupted) -> CheckpointdError:
        """Takes back what a rollback that stopped part-way had written; returns the error to report."""
        log.warning("rollback of plan %s to %s stopped at %r (%s); undoing it", entry.plan_id,
                    entry.target_checkpoint_id, interrupted.path, interrupted.why)
        forget_rollback(self.parts.db, entry.request_id)
        undo = replace(entry, goal=Goal.UNDO, written=tuple(interrupted.written))
        where = f"rollback to {entry.target_checkpoint_id} stopped at {interrupted.path!r} ({interrupted.why})"
        try:
            self.parts.journal.put(undo)
            self.recovery.resume(undo)
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
        metadata = {"errno": errno_name(cause)} if isinstance(cause, OSError) else {}
        return FailedPrecondition(Reason.ROLLBACK_CONFLICT, f"{where}; the rollback was undone, nothing was changed",
                                  path=interrupted.path, **metadata)

    def _replay_rollback(self, session: Session, op: OperationRow, target: CheckpointRow,
                         scope: Scope) -> RollbackResult:
        safety = session.get(CheckpointRow, op.result["safety_checkpoint_id"])
        changes = [_change_from_json(c) for c in op.result["changes"]]
        return RollbackResult(changes, self.parts.state(target) if scope.state else b"",
                              Checkpoint(safety) if safety else None, False)


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
