"""Whoever takes over an interrupted rollback records the workspace as a new safety checkpoint
before it changes anything, but only when the workspace is no longer what the rollback's newest
safety checkpoint holds and there is something left to change (engine/recovery.py
``Recovery.resume``): a rollback killed before its first change, or after its last, is finished
without a second safety checkpoint (each would be a copy of a checkpoint the plan has, counted
by retention and listed to the user); one killed part-way gets exactly one, holding the half-way
workspace, and the finished rollback ends on its target."""

from __future__ import annotations

import pytest
from sqlmodel import col, select

from checkpointd.core.engine import rollback as rollback_module
from checkpointd.core.kernel.faults import Point
from checkpointd.core.kernel.vocabulary import Phase
from checkpointd.core.metadata.models import CheckpointRow
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, at_restore_change, write
from tests.helpers import at_fault_point


def _die() -> None:
    raise _Killed


def _safety_trees(plan: Plan) -> list[str]:
    with plan.db.session() as session:
        return list(session.exec(select(CheckpointRow.tree_digest).where(
            CheckpointRow.plan_id == plan.plan_id, CheckpointRow.phase == Phase.ROLLBACK_SAFETY.value)
            .order_by(col(CheckpointRow.sequence))))


KILLS = {
    "before-its-first-change":
        lambda mp: at_fault_point(mp, rollback_module, Point.ROLLBACK_SAFETY_COMMITTED, {1: _die}),
    "after-its-last-change": lambda mp: at_fault_point(mp, rollback_module, Point.ROLLBACK_APPLIED, {1: _die}),
    "part-way": lambda mp: at_restore_change(mp, {3: _die}),
}


@pytest.mark.parametrize("killed", list(KILLS))
def test_a_killed_rollback_is_finished_with_a_new_safety_checkpoint_only_if_it_got_part_way(
        plan: Plan, monkeypatch: pytest.MonkeyPatch, killed: str) -> None:
    for name in ("a", "b", "c", "d"):
        write(plan.root / f"{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b", "c", "d"):
        write(plan.root / f"{name}.txt", f"changed {name}\n")
    plan.checkpoint()
    KILLS[killed](monkeypatch)
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    halfway = plan.state()
    (first,) = _safety_trees(plan)

    plan.checkpoint()  # takes the plan over: finishes the rollback first

    assert plan.engine.journal.get(plan.plan_id) is None
    assert plan.state() == plan.files_of(target)
    if killed == "part-way":
        second = _safety_trees(plan)[1:]
        assert len(second) == 1 and plan.files_of(CheckpointRow(tree_digest=second[0])) == halfway
    else:
        assert _safety_trees(plan) == [first], "a safety checkpoint was recorded that copies one the plan has"
