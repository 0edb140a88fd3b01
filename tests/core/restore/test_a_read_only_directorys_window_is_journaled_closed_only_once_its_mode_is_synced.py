"""A read-only directory gets its owner-write bit for one change (a window, journaled in the
rollback's entry before it opens) and its mode back right after. The entry stops naming the window
when it closes (``OpenedWindows.closed``: ``put_unsynced``, durable at the next synced commit of
any checkpoint): from then on a power cut that loses the mode set back leaves the directory
writable for good, with no entry left to set it back. So the mode (and the change made through
the window) must be on the disk before the window is journaled closed.

Within a rollback's ``windows_open`` the windows are journaled closed after the batch's flush (or,
for an undo, after each change's sync). Outside it, ``Workspace._close`` journaled the window
closed right after setting the mode back, and ``_changing`` synced the directory only after that:
whoever finishes an entry removes its temporary files that way (``remove_temp_files`` in each of
its directories), so every finish of a rollback that wrote into a read-only directory had the
order wrong. Checked by the durability oracle (``durability_oracle``)."""

from __future__ import annotations

import errno
import os

import pytest

from checkpointd.core.kernel.errors import ResourceExhausted
from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from tests.core.restore.durability_oracle import DurabilityOracle, make_writable
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, write
from tests.helpers import at_fault_point


def _die() -> None:
    raise _Killed


def _a_file_changed_in_a_read_only_directory(plan: Plan):
    """ro/ (0555) with f.txt, checkpointed, then f.txt changed (ro/ 0555 again) and checkpointed:
    returns the first checkpoint, the target."""
    write(plan.root / "ro/f.txt", "target f\n")
    os.chmod(plan.root / "ro", 0o555)
    target = plan.checkpoint()
    os.chmod(plan.root / "ro", 0o755)
    write(plan.root / "ro/f.txt", "changed f\n")
    os.chmod(plan.root / "ro", 0o555)
    plan.checkpoint()
    return target


def test_removing_a_killed_rollbacks_temporary_files_from_a_read_only_directory_syncs_its_mode_first(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _a_file_changed_in_a_read_only_directory(plan)
    oracle = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)
    try:
        with pytest.MonkeyPatch.context() as mp:
            at_fault_point(mp, restorer_module, Point.RESTORE_CHANGE, {1: _die})  # before any change
            with pytest.raises(_Killed):
                plan.rollback(target)

        plan.checkpoint()  # finishes it: first removes its temporary files from ro/, through a window

        assert (plan.root / "ro/f.txt").read_text() == "target f\n"
        assert oct(os.stat(plan.root / "ro").st_mode & 0o777) == oct(0o555)
        assert any(m.startswith("window on 'ro'") for m in oracle.moments), "no window on ro/ was journaled closed"
        oracle.assert_durable()
    finally:
        make_writable(str(plan.root))


def test_a_window_a_killed_rollback_had_closed_unsynced_is_synced_before_the_finisher_drops_it(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback removes ro/f.txt through a window (batched: nothing synced yet), sets ro/'s
    mode back, and is killed before its next change: its entry still names the window. The
    finisher's ``close_window`` finds the mode already back (not its to set) and the window is
    dropped from the entry, unsynced: the mode the killed process set back must be synced first
    (found by the generated workspaces of
    ``test_any_workspace_rolled_back_any_way_has_every_change_synced_before_its_entry_goes``)."""
    write(plan.root / "keep.txt", "kept\n")
    target = plan.checkpoint()
    write(plan.root / "ro/f.txt", "made after the target\n")
    os.chmod(plan.root / "ro", 0o555)
    plan.checkpoint()
    oracle = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)
    try:
        with pytest.MonkeyPatch.context() as mp:
            at_fault_point(mp, restorer_module, Point.RESTORE_CHANGE, {2: _die})  # ro/f.txt removed; not ro/
            # a real kill runs no finally: windows_open does not journal the window closed
            mp.setattr("checkpointd.core.engine.restoring.OpenedWindows.closed", lambda self, window: None)
            with pytest.raises(_Killed):
                plan.rollback(target)
        assert not (plan.root / "ro/f.txt").exists(), "the rollback was killed before its first change"

        plan.checkpoint()  # finishes it

        assert not (plan.root / "ro").exists()
        assert any(m.startswith("window on 'ro'") for m in oracle.moments), "no window on ro/ was journaled closed"
        oracle.assert_durable()
    finally:
        make_writable(str(plan.root))


def test_a_window_of_a_change_that_failed_is_synced_before_it_is_journaled_closed(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk is full: the rollback's write into ro/ fails after ro/ was made writable for it.
    The window is closed (the mode set back), and the run ends with no sync of ro/ (its directory
    never joined the batch: that comes right before the rename; and an undo syncs a change only
    once it is made): ``windows_open`` then journaled every window closed all the same."""
    target = _a_file_changed_in_a_read_only_directory(plan)
    oracle = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)
    root, real_write = str(plan.root), os.write

    def full(fd: int, data) -> int:
        try:
            inside = os.readlink(f"/proc/self/fd/{fd}").startswith(root + "/")
        except OSError:
            inside = False
        if inside:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "write", full)
            with pytest.raises(ResourceExhausted):
                plan.rollback(target)

        assert (plan.root / "ro/f.txt").read_text() == "changed f\n"
        assert oct(os.stat(plan.root / "ro").st_mode & 0o777) == oct(0o555)
        assert any(m.startswith("window on 'ro'") for m in oracle.moments), "no window on ro/ was journaled closed"
        oracle.assert_durable()
    finally:
        make_writable(str(plan.root))
