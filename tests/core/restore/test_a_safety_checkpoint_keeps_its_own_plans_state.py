"""A rollback asked for no current state, and the recovery of an interrupted one, record their
safety checkpoint with the plan's newest state (restoring.py ``safety_state``/``newest_state``):
rolling back to that safety checkpoint must give the agent its own plan's state back, never the
state of another plan that checkpointed more recently."""

from __future__ import annotations

import pytest
from sqlmodel import col, select
from ulid import ULID

from checkpointd.core.engine.requests import CreateRequest
from checkpointd.core.kernel.vocabulary import Phase
from checkpointd.core.metadata.models import CheckpointRow
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, at_restore_change, write

OURS = b'{"plan": "ours", "step": 2}'
THEIRS = b'{"plan": "theirs", "the longer state": "of another plan"}'


def _another_plan_checkpoints_last(plan: Plan) -> None:
    other = plan.base / "workspaces" / "other"
    write(other / "o.txt", "another plan's file\n")
    plan.engine.create(CreateRequest(plan_id=str(ULID()), workspace_root=str(other), state=THEIRS))


def _checkpoint_with_state(plan: Plan, state: bytes):
    return plan.engine.create(CreateRequest(plan_id=plan.plan_id, workspace_root=str(plan.root), state=state)).row


def _safety_checkpoints(plan: Plan) -> list[CheckpointRow]:
    with plan.db.session() as session:
        return list(session.exec(select(CheckpointRow).where(CheckpointRow.plan_id == plan.plan_id,
                                                             CheckpointRow.phase == Phase.ROLLBACK_SAFETY.value)
                                 .order_by(col(CheckpointRow.sequence))))


def test_a_rollbacks_safety_checkpoint_holds_its_plans_newest_state(plan: Plan) -> None:
    write(plan.root / "a.txt", "target a\n")
    target = _checkpoint_with_state(plan, b'{"plan": "ours", "step": 1}')
    write(plan.root / "a.txt", "changed a\n")
    _checkpoint_with_state(plan, OURS)
    _another_plan_checkpoints_last(plan)

    safety = plan.rollback(target).safety.row

    assert plan.engine.parts.state(safety) == OURS
    assert safety.state_size_bytes == len(OURS)


def test_the_safety_checkpoint_of_a_recovery_holds_its_plans_newest_state(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback dies part-way; a tool writes meanwhile; the taker records what the workspace
    holds as a new safety checkpoint before it finishes the rollback."""
    for name in ("a", "b", "c"):
        write(plan.root / f"{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b", "c"):
        write(plan.root / f"{name}.txt", f"changed {name}\n")
    _checkpoint_with_state(plan, OURS)

    def die() -> None:
        raise _Killed

    at_restore_change(monkeypatch, {2: die})
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    write(plan.root / "new.txt", "a tool's write after the kill\n")
    _another_plan_checkpoints_last(plan)

    plan.checkpoint()  # takes the plan over: finishes the rollback first

    assert plan.engine.journal.get(plan.plan_id) is None
    first, recovery = _safety_checkpoints(plan)
    assert plan.files_of(recovery)["new.txt"] == ("file", b"a tool's write after the kill\n", 0o644)
    assert recovery.description == f"before finishing the interrupted rollback to {target.checkpoint_id}"
    assert plan.engine.parts.state(recovery) == OURS
    assert recovery.state_size_bytes == len(OURS)
