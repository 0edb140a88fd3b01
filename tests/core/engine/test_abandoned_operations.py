"""Rollbacks and live diffs whose caller gave up (``kernel.cancellation``), in process: given up
on up to their last check, they record nothing, change no file and leave nothing staged, with one
log line and one count; given up on past their commit point, they run to their end. (Through real
servers: tests/hardening/test_abandoned_calls.py; creates always run to their end.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ulid import ULID

from checkpointd.core.engine import rollback as rollback_module
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, RollbackRequest
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.cancellation import Cancellation, Why
from checkpointd.core.kernel.errors import Cancelled, DeadlineExceeded
from checkpointd.core.kernel.faults import Point
from tests.helpers import at_fault_point, tree_state


class _Counted(telemetry.Sink):
    def __init__(self) -> None:
        self.abandoned: list[tuple[str, str]] = []

    def capture_abandoned(self, operation: str, why: str) -> None:
        self.abandoned.append((operation, why))


@pytest.fixture
def counted():
    sink = _Counted()
    telemetry.bind(sink)
    try:
        yield sink.abandoned
    finally:
        telemetry.unbind(sink)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspaces" / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "a.txt").write_text("a\n")
    (workspace / "sub" / "b.txt").write_text("b\n")
    (workspace / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: a staged loose object
    return workspace


def _given_up_after_its_capture(engine: Checkpoints, monkeypatch, why: Why = Why.CANCELLED) -> Cancellation:
    """A token its caller gives up on just as the capture of the workspace has ended: only the
    checks after the capture can stop the call."""
    cancel = Cancellation()
    real = engine.capturer.capture

    def capture(*args, **kwargs):
        result = real(*args, **kwargs)
        cancel.cancel(why)
        return result

    monkeypatch.setattr(engine.capturer, "capture", capture)
    return cancel


def _staged(engine: Checkpoints) -> list[str]:
    return sorted(p.name for p in engine.store.staging.iterdir())


def test_a_rollback_given_up_on_after_its_safety_capture_changes_nothing(engine, root, counted, monkeypatch, caplog):
    plan_id = str(ULID())
    target = engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(root)))
    (root / "a.txt").write_text("edited\n")
    (root / "new.txt").write_text("new\n")
    (root / "big.bin").write_bytes(bytes(range(255)) * 8192)  # a large object staged by the safety capture
    before = tree_state(root)
    request = RollbackRequest(plan_id=plan_id, checkpoint_id=target.row.checkpoint_id, request_id=str(ULID()))
    cancel = _given_up_after_its_capture(engine, monkeypatch, Why.DEADLINE_EXCEEDED)
    with caplog.at_level(logging.INFO, "checkpointd.engine"), pytest.raises(DeadlineExceeded):
        engine.rollback(request, cancel)
    monkeypatch.undo()
    assert counted == [("rollback", "deadline_exceeded")]
    [line] = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert line.startswith(f"rollback of plan {plan_id} abandoned ") and line.endswith(
        "s after its caller gave up (deadline_exceeded): it stopped before recording anything"), line
    assert tree_state(root) == before
    assert [c.row.checkpoint_id for c in engine.list(plan_id)[0]] == [target.row.checkpoint_id]
    assert engine.journal.get(plan_id) is None
    assert _staged(engine) == []
    done = engine.rollback(request)
    assert (root / "a.txt").read_text() == "a\n" and not (root / "new.txt").exists()
    assert done.safety is not None and len(engine.list(plan_id)[0]) == 2


def test_a_live_diff_given_up_on_stops(engine, root, counted):
    plan_id = str(ULID())
    base = engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(root)))
    (root / "a.txt").write_text("edited\n")
    cancel = Cancellation()
    cancel.cancel()
    with pytest.raises(Cancelled):
        engine.diff_page(base.row.checkpoint_id, "", (), False, cancel=cancel)
    assert counted == [("diff", "cancelled")]
    assert [c.path for c in engine.diff_page(base.row.checkpoint_id, "", (), False).changes] == ["a.txt"]


def test_a_rollback_given_up_on_once_its_safety_checkpoint_is_committed_runs_to_its_end(engine, root, counted,
                                                                                      monkeypatch):
    plan_id = str(ULID())
    target = engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(root)))
    wanted = tree_state(root)
    (root / "a.txt").write_text("edited\n")
    (root / "sub" / "new.txt").write_text("new\n")
    cancel = Cancellation()
    at_fault_point(monkeypatch, rollback_module, Point.ROLLBACK_SAFETY_COMMITTED, {1: cancel.cancel})
    done = engine.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.row.checkpoint_id), cancel)
    assert cancel.requested and counted == []
    assert tree_state(root) == wanted
    assert done.safety is not None and engine.journal.get(plan_id) is None
