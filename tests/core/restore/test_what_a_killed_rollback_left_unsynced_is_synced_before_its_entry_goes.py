"""A rollback killed after renaming its files into place but before its batch's sync (fault point
``restore.unsynced``) leaves its writes in the kernel's cache, not on the disk. Whoever takes the
plan over plans again from a new capture: every path already holds the target, so nothing is
applied and nothing would be synced, and the journal entry is removed without a sync (the next
synced commit of any checkpoint makes that durable). A power cut then could take back renames and
content the entry no longer covers: a rollback half-applied, with no entry left to finish it (the
same for an undo killed between a removal and its directory's sync). So the recovery syncs the
file systems the entry wrote to before the entry goes (``Recovery.resume``: one ``syncfs`` each,
or ``sync`` where syncfs does not report write errors)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.workspace import syncbatch
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, write
from tests.helpers import at_fault_point

ENTRY_REMOVED = "entry removed"


def test_files_a_killed_rollback_renamed_unsynced_are_synced_before_its_entry_goes(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    _killed_after_renaming(plan, monkeypatch)
    assert (plan.root / "d/a.txt").read_text() == "target a\n", "the rollback was not killed after its rename"

    events: list[tuple] = []
    real_fsync, real_remove = os.fsync, plan.engine.journal.remove

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync", st.st_ino, st.st_size if stat.S_ISREG(st.st_mode) else None))
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        events.append(("syncfs", os.fstat(fd).st_dev))

    def sync() -> None:
        events.append(("sync",))

    def remove(plan_id: str) -> None:
        events.append((ENTRY_REMOVED, plan_id))
        real_remove(plan_id)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "sync", sync)
    monkeypatch.setattr(syncbatch, "_syncfs", syncfs)
    monkeypatch.setattr(plan.engine.journal, "remove", remove)
    plan.checkpoint()  # takes the plan over: its unfinished rollback is finished first

    assert plan.engine.journal.get(plan.plan_id) is None
    before = events[:events.index((ENTRY_REMOVED, plan.plan_id))]
    file, directory = (plan.root / "d/a.txt").stat(), (plan.root / "d").stat()
    whole = ("sync",) in before or ("syncfs", directory.st_dev) in before
    assert whole or {("fsync", file.st_ino, file.st_size), ("fsync", directory.st_ino, None)} <= set(before), \
        f"what the killed rollback renamed into place was never synced before its entry went: {before}"


def _killed_after_renaming(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    write(plan.root / "d/a.txt", "target a\n")
    target = plan.checkpoint()
    write(plan.root / "d/a.txt", "changed a, and longer\n")
    plan.checkpoint()

    def die() -> None:
        raise _Killed

    at_fault_point(monkeypatch, restorer_module, Point.RESTORE_UNSYNCED, {1: die})
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()


def test_an_entry_stays_while_its_file_system_reports_a_write_error(plan: Plan,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """syncfs failing (EIO: the kernel may have dropped what it could not write) leaves the entry,
    to be finished again when the plan is next used (the checkpoint made meanwhile records the
    workspace as it reads, and supersedes it)."""
    _killed_after_renaming(plan, monkeypatch)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(syncbatch, "_syncfs", failing)
    plan.checkpoint()
    assert plan.engine.journal.get(plan.plan_id) is not None, "the entry went though its writes may not be on disk"

    monkeypatch.undo()
    plan.checkpoint()
    assert plan.engine.journal.get(plan.plan_id) is None
    assert (plan.root / "d/a.txt").read_text() == "target a\n"


def test_without_a_syncfs_that_reports_errors_the_recovery_syncs_everything(plan: Plan,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _killed_after_renaming(plan, monkeypatch)
    events: list[str] = []
    real_remove = plan.engine.journal.remove

    def missing(fd: int) -> None:
        raise OSError(0, "syncfs is not available")

    def remove(plan_id: str) -> None:
        events.append(ENTRY_REMOVED)
        real_remove(plan_id)

    monkeypatch.setattr(syncbatch, "_syncfs", missing)
    monkeypatch.setattr(os, "sync", lambda: events.append("sync"))
    monkeypatch.setattr(plan.engine.journal, "remove", remove)
    plan.checkpoint()
    assert events == ["sync", ENTRY_REMOVED]
