"""DiffCheckpoints: what changed between two checkpoints of a plan, or between one and the
plan's live workspace."""

from __future__ import annotations

from checkpointd.core.engine.parts import EngineParts, not_found_if_deleted, path_subset
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import DataLoss, FailedPrecondition, Reason
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.store.tree import Change
from checkpointd.core.workspace.workspace import is_under


class Diffs:
    def __init__(self, parts: EngineParts, recovery: Recovery) -> None:
        self.parts = parts
        self.recovery = recovery

    def diff(self, base_id: str, target_id: str = "", paths: tuple[str, ...] = ()) -> list[Change]:
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
            changes = (list(self.parts.trees.diff(base.tree_digest, target_tree)) if target_id
                       else self._diff_live(base, plan))
        except DataLoss:
            not_found_if_deleted(self.parts.db, *filter(None, (base_id, target_id)))
            raise
        return [c for c in changes if not subset or is_under(c.path, subset)]

    def _diff_live(self, base: CheckpointRow, plan: PlanRow) -> list[Change]:
        """Diff against a capture that no checkpoint references: the GC fence is held until
        the diff has read every node of it, then its batch is dropped, so that nothing builds
        on a capture garbage collection would not keep (the previous capture stays the base,
        and what changed since is captured again by the next checkpoint). An unfinished rollback
        of the plan is finished first."""
        parts = self.parts
        with parts.registry.lock(base.plan_id), parts.store.referencing():
            self.recovery.take_over(base.plan_id)
            batch = parts.store.batch()
            try:
                live_tree = parts.capture(plan, batch)[0].tree
                return list(parts.trees.diff(base.tree_digest, live_tree))
            finally:
                batch.abort()
