"""A plan's workspace root is recorded on first mention and never changes, only inside the
server's allowed roots; a create that fails takes back exactly what it recorded. Driven on the
``PlanRegistry`` itself over a real SQLite database, two registries standing for two replicas."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlmodel import Session
from ulid import ULID

from checkpointd.core.engine.plan_registry import Mention, PlanRegistry
from checkpointd.core.kernel.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PlanRow


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    database.migrate()
    try:
        yield database
    finally:
        database.dispose()


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def plan_row(db: Database, plan_id: str) -> PlanRow | None:
    with Session(db.engine) as session:
        return session.get(PlanRow, plan_id)


def add_checkpoint(db: Database, plan_id: str, tree_digest: str | None, sequence: int = 1) -> None:
    """A checkpoint row of the plan, of a workspace (a tree) or of a state only."""
    with Session(db.engine) as session:
        session.add(CheckpointRow(checkpoint_id=str(ULID()), plan_id=plan_id, sequence=sequence, phase="pre",
                                  trigger="manual", tree_digest=tree_digest))
        session.commit()


def test_a_root_outside_the_allowed_roots_or_beside_one_with_its_name_as_prefix_is_refused(tmp_path, allowed, db):
    registry = PlanRegistry(db, (str(allowed) + "/",))
    (tmp_path / "ws-other").mkdir()
    (allowed / "sub").mkdir()
    assert registry.resolve_root(str(allowed)) == str(allowed)
    assert registry.resolve_root(str(allowed / "sub")) == str(allowed / "sub")
    for outside in (tmp_path / "ws-other", tmp_path):
        with pytest.raises(PermissionDenied) as refused:
            registry.resolve_root(str(outside))
        assert refused.value.reason is Reason.WORKSPACE_ROOT_NOT_ALLOWED
        assert refused.value.metadata["allowed_workspace_roots"] == str(allowed)


def test_a_symlink_into_an_allowed_root_is_its_target_and_one_out_of_it_is_refused(tmp_path, allowed, db):
    registry = PlanRegistry(db, (str(allowed),))
    (allowed / "real").mkdir()
    (allowed / "link").symlink_to(allowed / "real")
    (tmp_path / "elsewhere").mkdir()
    (allowed / "escape").symlink_to(tmp_path / "elsewhere")
    assert registry.resolve_root(str(allowed / "link")) == str(allowed / "real")
    with pytest.raises(PermissionDenied):
        registry.resolve_root(str(allowed / "escape"))


@pytest.mark.parametrize("raw", ["relative/ws", "ws\0x", ""])
def test_a_relative_or_nul_root_is_invalid(allowed, db, raw):
    registry = PlanRegistry(db, (str(allowed),))
    with pytest.raises(InvalidArgument) as refused:
        registry.resolve_root(raw if raw else "relative")
    assert refused.value.reason is Reason.INVALID_WORKSPACE_ROOT
    with pytest.raises(InvalidArgument):
        registry.resolve_root(str(allowed) + "/\0")


def test_a_file_or_a_missing_directory_inside_an_allowed_root_is_invalid(allowed, db):
    registry = PlanRegistry(db, (str(allowed),))
    (allowed / "file").write_text("x")
    for raw in (allowed / "file", allowed / "missing"):
        with pytest.raises(InvalidArgument) as refused:
            registry.resolve_root(str(raw))
        assert refused.value.reason is Reason.INVALID_WORKSPACE_ROOT


def test_the_first_mention_records_the_root_and_another_root_is_refused_on_every_replica(allowed, db):
    first, second = PlanRegistry(db, (str(allowed),)), PlanRegistry(db, (str(allowed),))
    (allowed / "a").mkdir()
    (allowed / "b").mkdir()
    plan_id = str(ULID())
    known, mention = first.known(plan_id, str(allowed / "a"))
    assert (known.workspace_root, mention) == (str(allowed / "a"), Mention.CREATED)
    assert plan_row(db, plan_id).workspace_root == str(allowed / "a")
    assert first.known(plan_id, str(allowed / "a")) == (known, Mention.NOTHING)
    assert first.known(plan_id, "") == (known, Mention.NOTHING)
    for registry in (first, second):  # remembered, and read from the database
        with pytest.raises(FailedPrecondition) as refused:
            registry.known(plan_id, str(allowed / "b"))
        assert refused.value.reason is Reason.WORKSPACE_ROOT_MISMATCH
        assert refused.value.metadata["plan_workspace_root"] == str(allowed / "a")
    assert plan_row(db, plan_id).workspace_root == str(allowed / "a")
    assert second.known(plan_id, "") == (known, Mention.NOTHING)


def test_a_plan_first_seen_without_a_root_binds_the_first_root_it_is_given(allowed, db):
    registry, other = PlanRegistry(db, (str(allowed),)), PlanRegistry(db, (str(allowed),))
    plan_id = str(ULID())
    assert registry.known(plan_id, "")[1] is Mention.CREATED
    assert other.known(plan_id, "")[1] is Mention.NOTHING, "the row exists: this call recorded nothing"
    known, mention = registry.known(plan_id, str(allowed))
    assert (known.workspace_root, mention) == (str(allowed), Mention.ROOT_BOUND)
    assert plan_row(db, plan_id).workspace_root == str(allowed)
    assert other.known(plan_id, str(allowed))[1] is Mention.NOTHING


def test_a_failed_first_create_takes_back_its_plan_unless_a_checkpoint_of_it_was_committed(allowed, db):
    registry = PlanRegistry(db, (str(allowed),))
    gone, kept = str(ULID()), str(ULID())
    for plan_id in (gone, kept):
        assert registry.known(plan_id, str(allowed))[1] is Mention.CREATED
    add_checkpoint(db, kept, tree_digest=None)
    registry.take_back(gone, Mention.CREATED)
    registry.take_back(kept, Mention.CREATED)
    assert plan_row(db, gone) is None and registry.remembered(gone) is None
    assert plan_row(db, kept).workspace_root == str(allowed)
    registry.take_back(kept, Mention.NOTHING)
    assert plan_row(db, kept) is not None


def test_a_failed_create_unbinds_the_root_it_bound_unless_a_workspace_checkpoint_was_committed(allowed, db):
    registry = PlanRegistry(db, (str(allowed),))
    state_only, captured = str(ULID()), str(ULID())
    for plan_id in (state_only, captured):
        registry.known(plan_id, "")
        add_checkpoint(db, plan_id, tree_digest=None)
        assert registry.known(plan_id, str(allowed))[1] is Mention.ROOT_BOUND
    add_checkpoint(db, captured, tree_digest="ab" * 32, sequence=2)
    registry.take_back(state_only, Mention.ROOT_BOUND)
    registry.take_back(captured, Mention.ROOT_BOUND)
    assert plan_row(db, state_only).workspace_root is None, "a state-only checkpoint binds no root"
    assert registry.remembered(state_only) is None, "forgotten: its root is read again"
    assert plan_row(db, captured).workspace_root == str(allowed)


def test_an_allowed_root_that_is_a_symlink_allows_its_target(tmp_path, db):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "alias").symlink_to(target)
    registry = PlanRegistry(db, (str(tmp_path / "alias"),))
    assert registry.resolve_root(str(target)) == os.path.realpath(target)


def test_a_remembered_plan_is_answered_without_reading_the_database(allowed, db):
    registry = PlanRegistry(db, (str(allowed),))
    with_root, without = str(ULID()), str(ULID())
    (allowed / "sub").mkdir()
    registry.known(with_root, str(allowed))
    registry.known(without, "")
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    assert registry.known(with_root, str(allowed))[1] is Mention.NOTHING
    assert registry.known(with_root, "")[1] is Mention.NOTHING
    assert registry.known(without, "")[1] is Mention.NOTHING
    assert statements == []
    with pytest.raises(FailedPrecondition):
        registry.known(with_root, str(allowed / "sub"))  # refused before any read too
    assert statements == []


def test_an_allowed_root_that_is_not_a_directory_is_said_at_start(tmp_path, allowed, db, caplog):
    with caplog.at_level(logging.WARNING, logger="checkpointd.plans"):
        PlanRegistry(db, (str(allowed), str(tmp_path / "not-mounted-yet")))
    warned = [record.getMessage() for record in caplog.records]
    assert warned == [f"workspace root {tmp_path / 'not-mounted-yet'} is not a directory (yet): workspaces under it "
                      "are refused until it is"]


def test_a_refused_root_is_named_by_its_first_512_characters(tmp_path, allowed, db):
    registry = PlanRegistry(db, (str(allowed),))
    outside = "/" + "o" * 600
    inside_missing = str(allowed / ("m" * 200) / ("m" * 200) / ("m" * 200))
    for raw, error in ((outside, PermissionDenied), (inside_missing, InvalidArgument), ("r" * 600, InvalidArgument)):
        with pytest.raises(error) as refused:
            registry.resolve_root(raw)
        assert refused.value.metadata["workspace_root"] == raw[:512]
    with pytest.raises(PermissionDenied, match=f"^workspace_root '{outside[:512]}' is outside"):
        registry.resolve_root(outside)
