"""Two rollbacks of one plan to different checkpoints, sent to two replicas at once: the plan's
lock across replicas makes the second wait for the first's last change, so each safety checkpoint
holds the whole workspace its rollback found (the user's unsaved edit in the first, the first
rollback's result in the second) and nothing is lost. The overlap is forced (a fault point of
the first rollback starts the second and waits until PostgreSQL shows it queued for the plan)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from ulid import ULID

from checkpointd.core.engine.requests import RollbackRequest
from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from tests.helpers import tree_state
from tests.postgres.replica_pair import _key_parts, workspace_in

pytestmark = pytest.mark.postgres


def queued_for(admin, name: str) -> int:
    """Sessions waiting (not granted) for the advisory lock ``name``."""
    classid, objid = _key_parts(name)
    with admin.connect() as connection:
        return connection.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = :c "
            "AND objid = :o AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
            {"c": classid, "o": objid}).scalar()


def test_two_rollbacks_of_one_plan_on_two_replicas_run_one_after_the_other_and_lose_nothing(
        pair, admin, monkeypatch):
    first, second, workspaces = pair
    workspace = workspace_in(workspaces)
    plan_id = str(ULID())
    (workspace / "a.txt").write_text("one")
    (workspace / "b.txt").write_text("b of one")
    one = first.create(plan_id, workspace)
    at_one = tree_state(workspace)
    (workspace / "a.txt").write_text("two")
    (workspace / "c.txt").write_text("c of two")
    two = first.create(plan_id, workspace)
    at_two = tree_state(workspace)
    (workspace / "a.txt").write_text("unsaved edit")
    (workspace / "d.txt").write_text("a file the user never checkpointed")
    edited = tree_state(workspace)

    first_thread = threading.get_ident()
    outcome: dict[str, object] = {}
    queued = {"seen": False}

    def roll_back_to_two() -> None:
        try:
            outcome["second"] = second.checkpoints.rollback(
                RollbackRequest(plan_id=plan_id, checkpoint_id=two.checkpoint_id))
        except BaseException as exc:  # reported below
            outcome["second"] = exc

    other = threading.Thread(target=roll_back_to_two)

    def at(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and threading.get_ident() == first_thread and not other.is_alive() \
                and "second" not in outcome:
            other.start()
            deadline = time.monotonic() + 30
            while not queued["seen"] and time.monotonic() < deadline and other.is_alive():
                queued["seen"] = queued_for(admin, f"plan:{plan_id}") == 1
            assert "second" not in outcome, "the second rollback ran while the first was applying"

    monkeypatch.setattr(restorer_module, "crash_point", at)
    try:
        done = first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=one.checkpoint_id))
    finally:
        if other.is_alive() or other.ident is not None:
            other.join(60)
    monkeypatch.undo()
    later = outcome["second"]
    assert not isinstance(later, BaseException), later
    assert queued["seen"], "the second rollback never waited for the plan's lock across replicas"
    assert tree_state(workspace) == at_two

    # Each safety checkpoint holds what its rollback found: the first, the user's edit; the
    # second, the first rollback's result. Both can be gone back to, through either replica.
    second.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=later.safety.row.checkpoint_id))
    assert tree_state(workspace) == at_one
    first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=done.safety.row.checkpoint_id))
    assert tree_state(workspace) == edited
    assert first.checkpoints.journal.get(plan_id) is None
