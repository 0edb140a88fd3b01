"""A server finishes the rollbacks a killed process left before it serves (engine/recovery.py
``recover_interrupted_rollbacks``, which returns the plans it left). One it cannot finish now,
because the workspace's disk reports a write error (EIO from a sync), is left for later: the
server starts, the entry and its safety checkpoint stay, and the next attempt finishes it once
the disk answers again."""

from __future__ import annotations

import errno
import os

import pytest

from tests.core.restore.killed_rollbacks import killed_part_way, three_files_changed_since_a_target
from tests.core.restore.test_rollback_changes_attacked import _reopen
from tests.core.restore.test_rollback_write_path_attacked import Plan


def test_a_rollback_the_disk_refuses_to_finish_at_start_is_left_for_the_next_attempt(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    target = three_files_changed_since_a_target(plan, "d")
    killed_part_way(monkeypatch, lambda: plan.rollback(target))

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
