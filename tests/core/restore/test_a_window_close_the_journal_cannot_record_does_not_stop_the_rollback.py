"""A rollback that writes into a read-only directory journals the directory's owner-write window
durably before it opens, and journals its close without waiting for the disk (restoring.py
``OpenedWindows``). If the database refuses that second write, nothing is at risk: the entry
still names the window, and whoever finishes the entry checks the directory and finds it closed.
So the rollback goes on and finishes (it is logged), and the directory has its mode back."""

from __future__ import annotations

import os
import stat

import pytest
from sqlalchemy.exc import OperationalError

from checkpointd.core.restore.journal import RollbackJournal
from tests.core.restore.test_rollback_changes_attacked import _read_only_dir_workspace
from tests.core.restore.test_rollback_write_path_attacked import Plan

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (as the other rollback attack files)")


def test_a_rollback_whose_window_close_cannot_be_journaled_finishes_with_the_mode_back(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _read_only_dir_workspace(plan)
    refused = []

    def put_unsynced(self, entry) -> None:
        refused.append(entry.opened)
        raise OperationalError("UPDATE rollback_journal", {}, Exception("database is locked"))

    monkeypatch.setattr(RollbackJournal, "put_unsynced", put_unsynced)

    plan.rollback(target)

    assert refused, "no window's close was journaled"
    assert (plan.root / "ro/f.txt").read_text() == "target f\n"
    assert stat.S_IMODE(os.lstat(plan.root / "ro").st_mode) == 0o555
    assert plan.engine.journal.get(plan.plan_id) is None
