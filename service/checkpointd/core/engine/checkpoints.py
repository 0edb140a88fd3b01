"""The checkpoint application service: create, read, list, diff, delete and roll back.

A thin facade over the use cases (``create``, ``history``, ``diff``, ``rollback``,
``recovery``), which share the engine's parts (``parts``). Operations on one plan are
serialized, capture to commit (an in-process lock plus, on PostgreSQL, an advisory lock that
every replica on the database takes); different plans run in parallel. Blobs are made durable
before the metadata row that references them is committed. A rollback or live diff given a
``Cancellation`` stops its capture once it is set, if it has not reached its commit point (see
``kernel.cancellation``); a create always runs to its end (its capture is the base of the next).
"""

from __future__ import annotations

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine import pending_writes
from checkpointd.core.engine.bulk_delete import delete_in_plan, delete_matching, plans_matching
from checkpointd.core.engine.create import Create, RunBlocking
from checkpointd.core.engine.diff import DiffPage, Diffs
from checkpointd.core.engine.filtering import Filter
from checkpointd.core.engine.history import History
from checkpointd.core.engine.parts import EngineParts
from checkpointd.core.engine.pending_writes import PendingWrite
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.engine.requests import Checkpoint, CreateRequest, EngineSettings, RollbackRequest, RollbackResult
from checkpointd.core.engine.rollback import Rollbacks
from checkpointd.core.engine.warm_up import warm_up
from checkpointd.core.kernel.cancellation import NEVER, Cancellation
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Change


class Checkpoints:
    def __init__(self, db: Database, store: ContentStore, config: ConfigStore, settings: EngineSettings) -> None:
        self.parts = parts = EngineParts(db, store, config, settings)
        self.db = db
        self.store = store
        self.config = config
        self.settings = settings
        self.trees = parts.trees
        self.snapshotter = parts.snapshotter
        self.watcher = parts.watcher
        self.capturer = parts.capturer
        self.restorer = parts.restorer
        self.journal = parts.journal
        self.registry = parts.registry
        #: In-process plan locks; a call from the event loop never waits for one in a thread.
        self.plan_locks = parts.registry.locks
        self.recovery = Recovery(parts)
        self._create = Create(parts, self.recovery)
        self._history = History(parts, self.recovery)
        self.page_tokens = self._history.page_tokens
        self._diffs = Diffs(parts, self.recovery, self.page_tokens)
        self._rollbacks = Rollbacks(parts, self.recovery)
        self.recover_interrupted_rollbacks()
        warm_up(parts)

    def close(self) -> None:
        """Writes what waits in the group commit, then stops the snapshot engine's reader
        processes; a capture still running reads its files itself."""
        self.parts.close()

    def create(self, req: CreateRequest) -> Checkpoint:
        return self._create.create(req)

    async def create_async(self, req: CreateRequest, run_blocking: RunBlocking) -> Checkpoint:
        return await self._create.create_async(req, run_blocking)

    def get(self, checkpoint_id: str, with_state: bool = False) -> Checkpoint:
        return self._history.get(checkpoint_id, with_state)

    def list(self, plan_id: str, page_size: int = 0, page_token: str = "",
             filter_text: str = "") -> tuple[list[Checkpoint], str]:
        return self._history.list(plan_id, page_size, page_token, filter_text)

    def page_token_after(self, plan_id: str, filter_text: str, last: Checkpoint) -> str:
        return self._history.page_token_after(plan_id, filter_text, last)

    def count(self, plan_id: str) -> int:
        return self._history.count(plan_id)

    def delete(self, checkpoint_id: str) -> None:
        self._history.delete(checkpoint_id)

    def put_pending_writes(self, checkpoint_id: str, writes: list[PendingWrite]) -> None:
        """Records writes that follow a checkpoint (see ``pending_writes``)."""
        pending_writes.put(self.db, checkpoint_id, writes)

    def pending_writes(self, checkpoint_id: str) -> list[PendingWrite]:
        return pending_writes.list_for(self.db, checkpoint_id)

    def delete_matching(self, plan_id: str, filter_text: str) -> list[Checkpoint]:
        """Deletes every checkpoint a filter selects, in one plan or all (see ``bulk_delete``)."""
        return delete_matching(self.parts, self.recovery, plan_id, filter_text)

    def plans_matching(self, plan_id: str, filter_text: str) -> tuple[Filter, list[str]]:
        """``delete_matching`` in steps, for a caller that waits for each plan's lock itself."""
        return plans_matching(self.parts, plan_id, filter_text)

    def delete_in_plan(self, plan_id: str, wanted: Filter) -> list[Checkpoint]:
        return delete_in_plan(self.parts, self.recovery, plan_id, wanted)

    def diff(self, base_id: str, target_id: str = "", paths: tuple[str, ...] = ()) -> list[Change]:
        return self._diffs.diff(base_id, target_id, paths)

    def diff_page(self, base_id: str, target_id: str, paths: tuple[str, ...], text_diffs: bool,
                  page_size: int = 0, page_token: str = "", cancel: Cancellation = NEVER) -> DiffPage:
        return self._diffs.page(base_id, target_id, paths, text_diffs, page_size, page_token, cancel)

    def diff_token_after(self, base_id: str, target_id: str, paths: tuple[str, ...], text_diffs: bool,
                         last: Change, remaining: int) -> str:
        return self._diffs.token_after(base_id, target_id, paths, text_diffs, last, remaining)

    def rollback(self, req: RollbackRequest, cancel: Cancellation = NEVER) -> RollbackResult:
        return self._rollbacks.rollback(req, cancel)

    def recover_interrupted_rollbacks(self) -> list[str]:
        return self.recovery.recover_interrupted_rollbacks()
