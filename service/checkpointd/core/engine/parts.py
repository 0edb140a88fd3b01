"""The parts every use case works with, built once per engine: the database and content store,
the snapshot engine (stat index, watcher, capturer), the restorer, the plan registry, the
rollback journal and the group commit of new checkpoints; and the steps they share."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from sqlmodel import Session

from checkpointd.core.capture.capturer import Capturer
from checkpointd.core.capture.recheck import Recheck
from checkpointd.core.capture.snapshot import CaptureResult, Snapshotter
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.capture.watcher import Watcher
from checkpointd.core.capture.watcher import available as watcher_available
from checkpointd.core.config.registry import IGNORE_PATTERNS, MAX_FILE_SIZE_BYTES, ConfigStore
from checkpointd.core.engine.plan_registry import PlanRegistry
from checkpointd.core.engine.records import KnownPlan, NewCheckpoint, write_checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.kernel import telemetry, validation
from checkpointd.core.kernel.cancellation import NEVER, Cancellation, Why
from checkpointd.core.kernel.errors import Cancelled, InvalidArgument, NotFound, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.metadata.rows import RowWriter
from checkpointd.core.restore.journal import RollbackJournal
from checkpointd.core.restore.restorer import Restorer
from checkpointd.core.store.content_store import Batch, ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace, validate_relpath

log = logging.getLogger("checkpointd.engine")


class EngineParts:
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
        self.registry = PlanRegistry(db, settings.allowed_roots)
        self.new_checkpoints = db.group_commit(self.write_checkpoints)
        self._data_dir = os.path.realpath(settings.data_dir)
        self.journal = RollbackJournal(db)
        # Last: a part that failed to build above leaves no thread behind.
        self.recheck: Recheck | None = None
        if self.watcher is not None and settings.recheck_interval_seconds > 0:
            self.recheck = Recheck(self.capturer, settings.recheck_interval_seconds)
            self.recheck.start()

    def write_checkpoints(self, rows: RowWriter, new: list[NewCheckpoint]) -> None:
        """Numbers and inserts new checkpoints (``records.write_checkpoints``) in a transaction that
        confirms the store's GC fence held since their objects were written and their plans'
        locks since they were captured."""
        self.store.confirm_fence(rows)
        self.registry.confirm_locks(rows, [item.record.plan_id for item in new])
        write_checkpoints(rows, new)

    def close(self) -> None:
        """Writes what waits in the group commit, then stops the snapshot engine's reader
        processes; a capture still running reads its files itself."""
        self.new_checkpoints.close()
        if self.recheck is not None:
            self.recheck.close()
        self.capturer.close()
        self.snapshotter.close()

    def _excluded_paths(self, root: str) -> list[str]:
        """The server's own data directory is never captured, even inside a workspace."""
        data = self._data_dir
        if data == root or data.startswith(root + "/"):
            return [os.path.relpath(data, root)] if data != root else []
        return []

    def _capture_settings(self, plan_id: str) -> tuple[list[str], int]:
        values = self.config.resolve_many([IGNORE_PATTERNS, MAX_FILE_SIZE_BYTES], plan_id)
        return values[IGNORE_PATTERNS].value, values[MAX_FILE_SIZE_BYTES].value

    def capture(self, plan: PlanRow | KnownPlan, batch: Batch,
                cancel: Cancellation = NEVER) -> tuple[CaptureResult, list[str], list[str]]:
        """Captures the plan's workspace into ``batch``. Once ``cancel`` is set, every read into
        the batch stops at its next check (see ``snapshot.cancellation_of``), raising ``Cancelled``:
        the caller aborts the batch, and the capturer hands the watcher's changes back."""
        batch.cancel = cancel
        workspace = Workspace(plan.workspace_root)
        patterns, max_size = self._capture_settings(plan.plan_id)
        excluded = self._excluded_paths(plan.workspace_root)
        return self.capturer.capture(workspace, patterns, excluded, max_size, batch), patterns, excluded

    @staticmethod
    def load(session: Session, checkpoint_id: str) -> CheckpointRow:
        row = session.get(CheckpointRow, checkpoint_id)
        if row is None:
            raise checkpoint_not_found(session, checkpoint_id)
        return row

    def state(self, row: CheckpointRow) -> bytes:
        return self.store.read_bytes(row.state_digest) if row.state_digest else b""


@contextlib.contextmanager
def abandoned_if_cancelled(operation: str, plan_id: str, cancel: Cancellation) -> Iterator[None]:
    """Around the part of ``operation`` ("rollback", "diff") that stops when its caller
    gives up (its capture, up to its commit point): a stop is logged, in one line, and counted."""
    try:
        yield
    except Cancelled:
        why = cancel.why or Why.CANCELLED  # the token that raised says why
        log.warning("%s of plan %s abandoned %.3f s after its caller gave up (%s): it stopped before recording "
                    "anything", operation, plan_id, cancel.seconds_since(), why.value)
        telemetry.capture_abandoned(operation, why.value)
        raise


def checkpoint_not_found(session: Session, checkpoint_id: str) -> NotFound:
    """CHECKPOINT_NOT_FOUND, saying so when the id given is a plan's (both are ULIDs, and a
    plan id is the one a newcomer has at hand)."""
    hint = ""
    if session.get(PlanRow, checkpoint_id) is not None:
        hint = (f": {checkpoint_id} is a plan id; ListCheckpoints (`checkpointd ls {checkpoint_id}`) "
                "lists its checkpoints")
    return NotFound(Reason.CHECKPOINT_NOT_FOUND, f"checkpoint {checkpoint_id} not found{hint}",
                    checkpoint_id=checkpoint_id)


def not_found_if_deleted(db: Database, *checkpoint_ids: str) -> None:
    """NOT_FOUND for the first of ``checkpoint_ids`` deleted since it was loaded: content that
    went missing midway because its checkpoint was deleted (and collected) while it was read is
    that, not the store's DATA_LOSS. Returns when all still exist (the loss is real)."""
    with db.session() as session:
        for checkpoint_id in checkpoint_ids:
            if session.get(CheckpointRow, checkpoint_id) is None:
                raise NotFound(Reason.CHECKPOINT_NOT_FOUND, f"checkpoint {checkpoint_id} was deleted while it "
                               "was read", checkpoint_id=checkpoint_id) from None


def path_subset(paths: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The paths a diff or rollback is limited to, validated."""
    if len(paths) > validation.MAX_PATHS:
        raise InvalidArgument(Reason.FIELD_TOO_LONG, f"at most {validation.MAX_PATHS} paths", field="paths",
                              limit=validation.MAX_PATHS)
    return tuple(validate_relpath(p.rstrip("/") if p != "/" else p) for p in paths)
