"""Rollbacks left unfinished (a process died, or one gave up part-way): finished or undone
before anything else is done with their plan, and at start-up before the server serves."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from checkpointd.core.engine.idempotency import forget_rollback
from checkpointd.core.engine.parts import EngineParts
from checkpointd.core.engine.records import NewCheckpoint, new_row
from checkpointd.core.engine.restoring import (
    OpenedWindows,
    interim_paths,
    plan_restore,
    safety_state,
    seen_by_capture,
)
from checkpointd.core.kernel.errors import CheckpointdError, Reason, RollbackUnfinished
from checkpointd.core.kernel.faults import Point, crash_point
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.metadata.models import CheckpointRow, PlanRow, RollbackJournalRow
from checkpointd.core.metadata.rows import CoreRows
from checkpointd.core.restore.journal import (
    LEGACY_DIRECTORY,
    Goal,
    JournalEntry,
    legacy_entries,
    remove_legacy_directory,
)
from checkpointd.core.restore.restorer import ApplyInterrupted
from checkpointd.core.workspace.mounts import MountTableUnavailable
from checkpointd.core.workspace.workspace import Workspace

log = logging.getLogger("checkpointd.engine")

JOURNAL = RollbackJournalRow.__table__


class Recovery:
    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts

    def take_over(self, plan_id: str) -> JournalEntry | None:
        """Finishes (or undoes) the plan's unfinished rollback before anything else is done with the
        plan: one this process gave up on, or one a process (another replica's) left when it died.
        Called with the plan's lock and the store's fence held. Returns the entry if it is still
        unfinished (it could not be finished now: the next taker tries again)."""
        journal = self.parts.journal
        if not journal.may_have(plan_id):
            return None
        entry = journal.get(plan_id)
        if entry is None:
            return None
        log.warning("finishing the unfinished rollback of plan %s (goal: %s checkpoint %s)", plan_id,
                    entry.goal.value, entry.goal_checkpoint_id)
        try:
            self.resume(entry)
        except (CheckpointdError, ApplyInterrupted, OSError, SQLAlchemyError) as exc:
            log.error("could not finish the unfinished rollback of plan %s (%s); safety checkpoint %s holds the "
                      "workspace as it was before it; tried again when the plan is next used", plan_id, exc,
                      entry.safety_checkpoint_id)
            forget_rollback(self.parts.db, entry.request_id)
            return entry
        return None

    @contextlib.contextmanager
    def deleting(self, plan_id: str) -> Iterator[None]:
        """The plan's lock, for deleting some of its checkpoints: its unfinished rollback is
        finished first; one that cannot be finished now refuses every deletion in the plan
        (RollbackUnfinished), which would otherwise take its target or its safety checkpoint, the
        only record of the workspace before it."""
        with self.parts.registry.lock(plan_id), self.parts.store.referencing():
            entry = self.take_over(plan_id)
            if entry is not None:
                raise RollbackUnfinished(
                    Reason.ROLLBACK_CONFLICT,
                    f"plan {plan_id} has an interrupted rollback (to checkpoint {entry.target_checkpoint_id}) "
                    f"that could not be finished now; its checkpoints are kept until it is (safety checkpoint "
                    f"{entry.safety_checkpoint_id} holds the workspace from before it)",
                    plan_id=plan_id, checkpoint_id=entry.safety_checkpoint_id)
            yield

    def resume(self, entry: JournalEntry) -> None:
        """Brings the paths an unfinished rollback covers to its goal (the target; for an undo, the
        safety checkpoint, at the paths that still hold what the rollback wrote), then drops its
        entry, once the file systems it wrote to are synced (what a process killed before its flush
        left in the kernel's cache included). If the workspace is no longer what this rollback's
        newest safety checkpoint holds (the rollback got part-way, or someone wrote since), it is
        recorded as a new safety checkpoint first: once per change, however often an attempt
        fails. An entry whose plan moved on is dropped unapplied. Called with the plan's lock and
        the store's ``referencing`` fence held (taking the fence again could wait forever behind a
        collection)."""
        parts = self.parts
        windows = OpenedWindows(parts.journal, entry, partial(parts.registry.check_held, entry.plan_id))
        workspace = windows.workspace()
        for directory in entry.directories:
            workspace.remove_temp_files(directory, entry.temp_tag)
        with parts.db.session() as session:
            plan = session.get(PlanRow, entry.plan_id)
            goal = session.get(CheckpointRow, entry.goal_checkpoint_id)
            if plan is None or plan.workspace_root != entry.workspace_root:
                self.drop(entry, "its plan or the plan's workspace is gone")
                return
            if plan.last_sequence > entry.last_sequence:
                self.drop(entry, f"the plan moved on (checkpoint {plan.last_sequence} is newer than "
                                 f"{entry.last_sequence}, the last this rollback recorded)")
                return
            if goal is None or not goal.tree_digest:
                self.drop(entry, f"checkpoint {entry.goal_checkpoint_id} is gone")
                return
            for window in reversed(entry.opened):  # before the capture: it is not the user's mode
                if workspace.close_window(window):
                    log.warning("set directory %r of plan %s back to mode %o (a kill had left it writable)",
                                window.path, entry.plan_id, window.mode)
                windows.closed(window)
            with parts.store.batch() as batch:
                capture, patterns, excluded = parts.capture(plan, batch)
                changes = plan_restore(parts, plan.workspace_root, capture, goal, entry.paths, batch, entry.written,
                                       entry.interim)
                record = bool(changes) and capture.tree != entry.safety_tree
                state_digest, state_size = (safety_state(session, entry.plan_id, b"", batch) if record
                                            else (None, 0))
            seen = seen_by_capture(parts, plan.workspace_root, capture, changes)
            interim = entry.interim
            if entry.goal is Goal.UNDO:  # journaled before the undo's steps can leave them half-way
                interim = tuple(sorted(interim_paths(changes).union(entry.interim)))
            if record:
                verb = "finishing" if entry.goal is Goal.COMPLETE else "undoing"
                safety = new_row(plan, capture, patterns, excluded, state_digest, state_size,
                                 phase=Phase.ROLLBACK_SAFETY.value, trigger=Trigger.ROLLBACK.value,
                                 source_tool="checkpointd",
                                 description=f"before {verb} the interrupted rollback to "
                                             f"{entry.target_checkpoint_id}",
                                 labels={"rollback_target": goal.checkpoint_id},
                                 rollback_target_checkpoint_id=goal.checkpoint_id)
                parts.write_checkpoints(CoreRows(session.connection()), [NewCheckpoint(safety)])
                windows.entry = replace(windows.entry, last_sequence=safety.sequence, safety_tree=capture.tree,
                                        interim=interim)
                parts.journal.put(windows.entry, session)
                session.commit()
                parts.capturer.record(plan.workspace_root, capture.tree)
            elif interim != entry.interim:
                windows.entry = replace(windows.entry, interim=interim)
                parts.journal.put(windows.entry)
            if changes:
                parts.restorer.apply(workspace, changes, seen, batched=entry.goal is Goal.COMPLETE,
                                     keep_going=windows.still_ours)
        # Whoever left the entry may have died after renaming files into place, before its batch's
        # flush: planned again, those paths already hold the goal, so nothing above synced them.
        self._sync_what_it_wrote(workspace, entry)
        crash_point(Point.ROLLBACK_APPLIED)
        parts.journal.remove(entry.plan_id)

    def drop(self, entry: JournalEntry, why: str, session: Session | None = None) -> None:
        """Drops an entry without applying it (its temporary files are gone already). A rollback
        not finished must not be replayed as done: its request_id's record goes too. What its
        process wrote is synced first, as ``resume`` does (a workspace gone is skipped; a write
        error raises, and the entry stays)."""
        log.warning("dropping the unfinished rollback of plan %s to %s: %s", entry.plan_id,
                    entry.target_checkpoint_id, why)
        with contextlib.suppress(CheckpointdError):
            self._sync_what_it_wrote(Workspace(entry.workspace_root), entry)
        if session is not None:
            self.parts.journal.delete_unfinished(session, entry.plan_id, entry.request_id)
            return
        forget_rollback(self.parts.db, entry.request_id)
        self.parts.journal.remove(entry.plan_id)

    def _sync_what_it_wrote(self, workspace: Workspace, entry: JournalEntry) -> None:
        """Syncs the file systems ``entry``'s rollback may have written to before the entry goes:
        the root's, its directories', and those mounted below the root (a removal or a mode set
        below a mount point is on that file system alone). OSError on a write error."""
        try:
            mount_points = sorted(self.parts.capturer.mounts.under(workspace.root))
        except MountTableUnavailable:
            mount_points = []  # no table to read: no mount points to tell, as for a capture
        workspace.sync_file_systems(entry.directories, mount_points)

    def recover_interrupted_rollbacks(self) -> list[str]:
        """Finishes (or undoes) the rollbacks left unfinished (by this server's previous process, or,
        on PostgreSQL, by a replica that died), after importing the journal files a server before the
        database journal left. Runs before the server serves. Returns the plans it could not finish:
        they are tried again when next used."""
        parts = self.parts
        self._import_legacy_journal(Path(parts.settings.data_dir) / LEGACY_DIRECTORY)
        stuck = []
        for plan_id in parts.journal.plan_ids():
            with parts.registry.lock(plan_id), parts.store.referencing():
                if self.take_over(plan_id) is not None:
                    stuck.append(plan_id)
        return stuck

    def _import_legacy_journal(self, directory: Path) -> None:
        """Moves the journal files of a server before the database journal into the database."""
        parts = self.parts
        for path, entry in legacy_entries(directory):
            if isinstance(entry, Exception):
                log.error("the rollback journal file %s is unreadable (%s); dropping it", path, entry)
                path.unlink(missing_ok=True)
                continue
            with parts.registry.lock(entry.plan_id), parts.db.session() as session:
                safety = session.get(CheckpointRow, entry.safety_checkpoint_id)
                if safety is None:
                    # Its server wrote the file before the safety checkpoint: nothing had changed.
                    workspace = Workspace(entry.workspace_root)
                    for directory_path in entry.directories:
                        with contextlib.suppress(CheckpointdError, OSError):
                            workspace.remove_temp_files(directory_path, entry.temp_tag)
                    log.info("the rollback of plan %s to %s stopped before its safety checkpoint committed; "
                             "nothing had changed", entry.plan_id, entry.target_checkpoint_id)
                elif parts.journal.may_have(entry.plan_id) and parts.journal.get(entry.plan_id) is not None:
                    log.warning("dropping the old journal file of plan %s: the database has a newer entry",
                                entry.plan_id)
                else:
                    parts.journal.put(replace(entry, last_sequence=safety.sequence), session)
                    session.commit()
                    parts.journal.added(entry.plan_id)
            path.unlink(missing_ok=True)
        remove_legacy_directory(directory)
