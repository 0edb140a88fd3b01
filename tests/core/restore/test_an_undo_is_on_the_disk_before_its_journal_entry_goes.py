"""A rollback raced by a write stops and is undone; the undo's journal entry is then removed
without a sync (the next synced commit of any checkpoint makes that durable), and nothing syncs
the workspace after it. So every change the undo made must be on the disk when the entry goes.

The case that lost the user's files: the rollback removed ``kept/`` and the user's file in it, a
tool wrote ``z.txt`` meanwhile, and the undo makes ``kept/`` again and puts the file back. The
file's syncs (its content, then ``kept/``) do not make ``kept``'s entry in the workspace root
durable: unless the root is synced after the mkdir, a power cut once the entry's removal is
durable takes ``kept/`` and the file with it, with no entry left to finish the undo.

This records each directory fsync with the names the directory held at that moment, and the
moment the journal entry is removed."""

from __future__ import annotations

import os
import stat

import pytest

from checkpointd.core.kernel.errors import FailedPrecondition, Reason
from tests.core.restore.test_rollback_write_path_attacked import Plan, before_workspace_call, write

ENTRY_REMOVED = "entry removed"


@pytest.fixture
def events(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """("sync", inode, names held) of each directory fsynced, and (ENTRY_REMOVED, plan id)."""
    recorded: list[tuple] = []
    real_fsync, real_remove = os.fsync, plan.engine.journal.remove

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            recorded.append(("sync", st.st_ino, frozenset(os.listdir(fd))))
        real_fsync(fd)

    def remove(plan_id: str) -> None:
        recorded.append((ENTRY_REMOVED, plan_id))
        real_remove(plan_id)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(plan.engine.journal, "remove", remove)
    return recorded


def test_a_directory_an_undo_makes_again_is_in_its_synced_parent_before_the_entry_goes(
        plan: Plan, events: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    write(plan.root / "z.txt", "target z\n")
    target = plan.checkpoint()
    write(plan.root / "kept/users-file.txt", "the user's work\n")
    write(plan.root / "z.txt", "changed z\n")
    plan.checkpoint()
    before_workspace_call(monkeypatch, "z.txt", lambda: write(plan.root / "z.txt", "a tool's write, racing\n"))
    events.clear()

    with pytest.raises(FailedPrecondition) as raised:
        plan.rollback(target)

    assert raised.value.reason is Reason.ROLLBACK_CONFLICT and "took back" in raised.value.message, raised.value
    assert (plan.root / "kept/users-file.txt").read_text() == "the user's work\n"
    assert (plan.root / "z.txt").read_text() == "a tool's write, racing\n"
    removed = events.index((ENTRY_REMOVED, plan.plan_id))
    root, kept = plan.root.stat().st_ino, (plan.root / "kept").stat().st_ino
    synced = [(ino, names) for _sync, ino, names in (e for e in events[:removed] if e[0] == "sync")]
    assert (kept, frozenset({"users-file.txt"})) in synced
    assert any(ino == root and "kept" in names for ino, names in synced), \
        f"kept/ was made again but its entry in the root was never synced before the journal entry went: {synced}"
