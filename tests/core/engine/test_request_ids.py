"""request_id (AIP-155): a retry of a request answers its first result, a different request
under the same id is refused with REQUEST_ID_REUSED, also when the first was served by another
replica or by an earlier release.

When two servers race on one id, the lookup before the work misses a record another replica
commits meanwhile, and the record's insert is what finds it: a retry must still answer the
first result (one rollback applied, one checkpoint), a different request must still be refused,
leaving nothing behind. The race is made deterministic by hiding the record from the first
lookup only (a fault injected into the engine's module: what a lookup that ran just before the
other replica's commit sees); everything after it runs on the real database.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import update
from ulid import ULID

from checkpointd.core.engine import create as create_module
from checkpointd.core.engine import records as records_module
from checkpointd.core.engine import rollback as rollback_module
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.records import PLANS
from checkpointd.core.engine.requests import CreateRequest, RollbackRequest
from checkpointd.core.kernel.errors import InvalidArgument, Reason
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.metadata.models import OperationRow, utcnow


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspaces" / str(ULID())
    path.mkdir()
    return path


def hide_the_first_lookup(monkeypatch: pytest.MonkeyPatch, module) -> None:
    """The module's first request_id lookup sees no record, as one made just before another
    replica committed it; later lookups (the insert's fall-back) see the database."""
    real = module.replayed
    calls = []

    def replayed(*arguments):
        calls.append(arguments)
        return None if len(calls) == 1 else real(*arguments)

    monkeypatch.setattr(module, "replayed", replayed)


def test_a_rollback_retried_on_another_replica_meanwhile_is_applied_once(engine, workspace, monkeypatch):
    plan_id = str(ULID())
    (workspace / "f.txt").write_text("one")
    target = engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(workspace))).row.checkpoint_id
    (workspace / "f.txt").write_text("two")
    request = RollbackRequest(plan_id=plan_id, checkpoint_id=target, request_id="rollback-once")
    first = engine.rollback(request)
    assert (workspace / "f.txt").read_text() == "one"
    (workspace / "f.txt").write_text("three")  # written after the rollback: a replay must keep it
    checkpoints = engine.count(plan_id)

    hide_the_first_lookup(monkeypatch, rollback_module)
    again = engine.rollback(request)

    assert (workspace / "f.txt").read_text() == "three"
    assert again.safety.row.checkpoint_id == first.safety.row.checkpoint_id
    assert [c.path for c in again.changes] == [c.path for c in first.changes] and not again.dry_run
    assert engine.count(plan_id) == checkpoints, "the retry's safety checkpoint was kept"


def test_a_different_rollback_racing_for_the_same_request_id_is_refused_and_changes_nothing(
        engine, workspace, monkeypatch):
    plan_id = str(ULID())
    (workspace / "f.txt").write_text("one")
    target = engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(workspace))).row.checkpoint_id
    (workspace / "f.txt").write_text("two")
    engine.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target, request_id="taken"))
    (workspace / "f.txt").write_text("two")
    checkpoints = engine.count(plan_id)

    hide_the_first_lookup(monkeypatch, rollback_module)
    with pytest.raises(InvalidArgument) as refused:
        engine.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target, request_id="taken",
                                        current_state=b"another request"))

    assert refused.value.reason is Reason.REQUEST_ID_REUSED and refused.value.metadata["request_id"] == "taken"
    assert (workspace / "f.txt").read_text() == "two"
    assert engine.count(plan_id) == checkpoints, "the refused rollback left its safety checkpoint"


def test_a_create_retried_on_another_replica_meanwhile_records_one_checkpoint(engine, workspace, monkeypatch):
    plan_id = str(ULID())
    (workspace / "f.txt").write_text("one")
    request = CreateRequest(plan_id=plan_id, workspace_root=str(workspace), state=b"s", request_id="create-once")
    first = engine.create(request).row.checkpoint_id

    hide_the_first_lookup(monkeypatch, create_module)
    assert engine.create(request).row.checkpoint_id == first
    assert engine.count(plan_id) == 1

    hide_the_first_lookup(monkeypatch, create_module)
    with pytest.raises(InvalidArgument) as refused:
        engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(workspace), state=b"other",
                                    request_id="create-once"))
    assert refused.value.reason is Reason.REQUEST_ID_REUSED
    assert engine.count(plan_id) == 1


def test_a_create_served_on_the_loop_captures_the_workspace_another_replica_recorded(engine, workspace):
    """A plan remembered without a workspace gets one from another replica: the create started
    on the event loop (state only) fails to commit, and is made again as `create` would, with
    the plan's workspace captured."""
    plan_id = str(ULID())
    engine.create(CreateRequest(plan_id=plan_id, state=b"first"))
    (workspace / "f.txt").write_text("captured")
    with engine.db.session() as session:  # the other replica's write
        session.connection().execute(update(PLANS).where(PLANS.c.plan_id == plan_id)
                                     .values(workspace_root=str(workspace)))
        session.commit()

    ran = []

    async def in_a_thread(function, *arguments):
        ran.append(function.__name__)
        return await asyncio.get_running_loop().run_in_executor(None, function, *arguments)

    made = asyncio.run(engine.create_async(CreateRequest(plan_id=plan_id, state=b"second"), in_a_thread))

    assert ran == ["_after_failed_commit"], "the create was not started on the loop"
    assert made.row.workspace_root == str(workspace) and made.row.tree_digest
    assert [c.path for c in engine.diff(made.row.checkpoint_id, "")] == []
    assert engine.count(plan_id) == 2


# -- records written by a released server -------------------------------------------------------
# A request_id's record holds its request's fingerprint. A retry that reaches a server of a newer
# release (an upgrade between the two tries, or replicas of two releases behind one address) must
# still match the record, so the fingerprint of a request may never change. These digests are the
# ones this release records for the requests below.

RELEASED_PLAN = "01M8X8FY7GXHDEE1ASHKVMYEVJ"
RELEASED_TARGET = "01M8X8FY7GXHDEE1ASHKVMYEVK"
RELEASED_SAFETY = "01M8X8FY7GXHDEE1ASHKVMYEVM"
RELEASED_CREATE = CreateRequest(plan_id=RELEASED_PLAN, source_tool="release-tool", labels={"run": "r-1"},
                                description="from a release", state=b"target state")
RELEASED_FINGERPRINTS = {
    "CreateCheckpoint": "e888cfba9f066bec8878b41682b83585cbcfecdf1346317508f507f8195a07f2",
    "Rollback": "1a6db075d7701c980be88625a9eb77a2643ce77651e9a0e0287a25d89a6ef2eb",
    "Rollback-allowing-nested-workspaces": "43982c572981c5a2d2b4f6083211cbe160a45c5e9e7f5c1b9c86808911215619",
}


def record_from_a_release(engine: Checkpoints, request_id: str, method: str, fingerprint: str, result: dict) -> None:
    with engine.db.session() as session:
        session.add(OperationRow(request_id=request_id, method=method, fingerprint=fingerprint, result=result,
                                 create_time=utcnow()))
        session.commit()


def test_requests_recorded_by_a_released_server_are_replayed_not_refused(engine, monkeypatch):
    with monkeypatch.context() as fixed_id:  # the target the released server's records name
        fixed_id.setattr(records_module, "ULID", lambda: RELEASED_TARGET)
        engine.create(RELEASED_CREATE)
    rollbacks = {"Rollback": False, "Rollback-allowing-nested-workspaces": True}
    for name, fingerprint in RELEASED_FINGERPRINTS.items():
        method = "CreateCheckpoint" if name == "CreateCheckpoint" else "Rollback"
        result = {"checkpoint_id": RELEASED_TARGET} if method == "CreateCheckpoint" else \
            {"safety_checkpoint_id": RELEASED_SAFETY, "changes": []}
        record_from_a_release(engine, name, method, fingerprint, result)

    created = engine.create(CreateRequest(**{**RELEASED_CREATE.__dict__, "request_id": "CreateCheckpoint"}))
    rolled_back = {name: engine.rollback(RollbackRequest(plan_id=RELEASED_PLAN, checkpoint_id=RELEASED_TARGET,
                                                         request_id=name, allow_nested_workspaces=nested))
                   for name, nested in rollbacks.items()}

    assert created.row.checkpoint_id == RELEASED_TARGET
    assert [(r.state, r.changes, r.dry_run) for r in rolled_back.values()] == [(b"target state", [], False)] * 2
    assert engine.count(RELEASED_PLAN) == 1, "a replayed request was carried out again"
    with pytest.raises(InvalidArgument) as refused:  # what a changed fingerprint would have done
        engine.rollback(RollbackRequest(plan_id=RELEASED_PLAN, checkpoint_id=RELEASED_TARGET, request_id="Rollback",
                                        dry_run=True))
    assert refused.value.reason is Reason.REQUEST_ID_REUSED


@pytest.mark.parametrize("phase", [None, Phase.EXECUTE, Phase.ROLLBACK_SAFETY])
def test_the_rollback_trigger_is_refused_to_clients_whatever_the_phase(engine, phase):
    """Only the server records rollback safety checkpoints (checkpoint_service.proto): the refusal
    names the trigger and the phase asked for (empty when none was), and records nothing."""
    plan_id = str(ULID())
    with pytest.raises(InvalidArgument) as refused:
        engine.create(CreateRequest(plan_id=plan_id, trigger=Trigger.ROLLBACK, phase=phase, request_id="r"))
    assert refused.value.reason is Reason.INVALID_PHASE
    assert refused.value.metadata == {"trigger": "rollback", "phase": phase.value if phase else ""}
    assert engine.count(plan_id) == 0
