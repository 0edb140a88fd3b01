"""A server finishes the rollbacks a killed process left before it serves (engine/recovery.py
``recover_interrupted_rollbacks``, which returns the plans it left). One it cannot finish now,
because the workspace's disk reports a write error (EIO from a sync), is left for later: the
server starts, the entry and its safety checkpoint stay, and the next attempt finishes it once
the disk answers again."""

from __future__ import annotations

import errno
import os

import pytest

from tests.core.restore.test_rollback_changes_attacked import _reopen
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, at_restore_change, write


def test_a_rollback_the_disk_refuses_to_finish_at_start_is_left_for_the_next_attempt(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c"):
        write(plan.root / f"d/{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b", "c"):
        write(plan.root / f"d/{name}.txt", f"changed {name}\n")
    plan.checkpoint()

    def die() -> None:
        raise _Killed

    at_restore_change(monkeypatch, {2: die})
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    restarted = _reopen(plan)  # a restarted server: finishing the rollback fails, and is left for later
    try:
        assert restarted.engine.journal.get(plan.plan_id) is not None
        assert restarted.engine.recover_interrupted_rollbacks() == [plan.plan_id], "not reported as left"
        monkeypatch.undo()

        assert restarted.engine.recover_interrupted_rollbacks() == [], "a finished rollback reported as left"
        assert restarted.engine.journal.get(plan.plan_id) is None
        assert restarted.state() == restarted.files_of(target)
        restarted.checkpoint()
    finally:
        restarted.close()
