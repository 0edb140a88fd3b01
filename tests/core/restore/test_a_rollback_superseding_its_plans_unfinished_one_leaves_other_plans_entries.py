"""A rollback whose plan has an unfinished rollback it cannot finish now (here the workspace's
disk refuses a directory sync), and that itself has nothing to change, supersedes that entry:
its safety checkpoint records the workspace as it is, and the old entry is dropped in the same
transaction (engine/recovery.py ``Recovery.drop`` with the rollback's session). That drops this
plan's entry only: another plan's unfinished rollback is still journaled, and finished on that
plan's next use; and the record of another rollback that did finish still answers its retry
(AIP-155: replayed, not run again over what was written since)."""

from __future__ import annotations

import os

import pytest
from ulid import ULID

from checkpointd.core.engine.requests import CreateRequest, RollbackRequest, Scope
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, at_restore_change, write
from tests.helpers import checkpoint_files, tree_state


def _kill_part_way(plan: Plan, monkeypatch: pytest.MonkeyPatch, plan_id: str, target) -> None:
    def die() -> None:
        raise _Killed

    at_restore_change(monkeypatch, {2: die})
    with pytest.raises(_Killed):
        plan.engine.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id,
                                             scope=Scope.FILES, request_id=str(ULID())))
    monkeypatch.undo()


def test_superseding_one_plans_unfinished_rollback_keeps_another_plans(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = plan.engine
    theirs, their_root = str(ULID()), plan.base / "workspaces" / "theirs"
    for root in (plan.root, their_root):
        for name in ("a", "b", "c"):
            write(root / f"{name}.txt", f"target {name}\n")
    ours_target = plan.checkpoint()
    their_target = engine.create(CreateRequest(plan_id=theirs, workspace_root=str(their_root))).row
    for root in (plan.root, their_root):
        for name in ("a", "b", "c"):
            write(root / f"{name}.txt", f"changed {name}\n")
    plan.checkpoint()
    engine.create(CreateRequest(plan_id=theirs))
    done_plan, done_root = str(ULID()), plan.base / "workspaces" / "done"
    write(done_root / "d.txt", "target d\n")
    done_target = engine.create(CreateRequest(plan_id=done_plan, workspace_root=str(done_root))).row
    write(done_root / "d.txt", "changed d\n")
    done = RollbackRequest(plan_id=done_plan, checkpoint_id=done_target.checkpoint_id, scope=Scope.FILES,
                           request_id=str(ULID()))
    done_safety = engine.rollback(done).safety.row.checkpoint_id
    write(done_root / "d.txt", "written after that rollback\n")
    _kill_part_way(plan, monkeypatch, theirs, their_target)
    _kill_part_way(plan, monkeypatch, plan.plan_id, ours_target)
    assert (plan.root / "a.txt").read_text() == "target a\n", "the kill was not after a.txt"
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the disk under our workspace refuses its directory syncs for now
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(plan.root)):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    result = plan.rollback(ours_target, paths=("a.txt",))  # a.txt is the target's already: no change

    monkeypatch.undo()
    assert result.changes == []
    assert engine.journal.plan_ids() == [theirs], "the superseded entry stayed, or another plan's went"
    engine.create(CreateRequest(plan_id=theirs))  # takes their plan over: finishes its rollback first
    assert engine.journal.plan_ids() == []
    assert tree_state(their_root) == checkpoint_files(engine.trees, plan.store, their_target.tree_digest)
    assert engine.rollback(done).safety.row.checkpoint_id == done_safety, "a finished rollback ran again"
    assert (done_root / "d.txt").read_text() == "written after that rollback\n"
