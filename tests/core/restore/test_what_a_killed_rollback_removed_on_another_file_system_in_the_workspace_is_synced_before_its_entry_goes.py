"""A workspace may hold a mount point (a bind mount, a container volume): another file system. A
rollback killed after its changes, before its batch's sync, leaves them in the kernel's cache;
whoever finishes it finds nothing left to apply and syncs the file systems the journal entry
names (``Recovery.resume``: ``Workspace.sync_file_systems(entry.directories)``) before the entry
goes. ``entry.directories`` are the parents of the paths the rollback *writes*: a rollback that
only removes (or only sets a mode) below the mount point names no directory there, and its
removal stays unsynced while the entry goes: a power cut then brings the removed file back
(and with it, the paths a removal of a directory had emptied) with no entry left to finish.
Checked by the durability oracle (``durability_oracle``). Needs root (to mount a tmpfs; its
syncfs does nothing, but which file systems are synced is what is checked)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from tests.core.restore.durability_oracle import DurabilityOracle
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, write
from tests.helpers import at_fault_point


@pytest.fixture
def mounted(plan: Plan) -> Iterator[Path]:
    """``m`` in the workspace: a tmpfs of its own."""
    point = plan.root / "m"
    point.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "checkpointd-test", str(point)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        assert point.stat().st_dev != plan.root.stat().st_dev
        yield point
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["umount", "-l", str(point)], check=True, capture_output=True, timeout=30)


def _die() -> None:
    raise _Killed


@pytest.mark.parametrize("removed", ["a file", "a directory"])
def test_a_removal_below_a_mount_point_a_killed_rollback_left_unsynced_is_synced_before_its_entry_goes(
        plan: Plan, mounted: Path, monkeypatch: pytest.MonkeyPatch, removed: str) -> None:
    write(mounted / "kept.txt", "the user's file on the other file system\n")
    target = plan.checkpoint()
    if removed == "a file":
        write(mounted / "since.txt", "made after the target\n")
    else:
        write(mounted / "since/inside.txt", "made after the target\n")
    plan.checkpoint()
    oracle = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)

    with pytest.MonkeyPatch.context() as mp:
        at_fault_point(mp, restorer_module, Point.RESTORE_UNSYNCED, {1: _die})
        with pytest.raises(_Killed):
            plan.rollback(target)
    assert not (mounted / "since.txt").exists() and not (mounted / "since").exists(), "the rollback was not killed"
    assert any(c.key[0] == mounted.stat().st_dev for c in oracle.changes), "nothing was removed below m"

    plan.checkpoint()  # takes the plan over: nothing is left to apply; the entry goes

    assert plan.engine.journal.get(plan.plan_id) is None
    oracle.assert_durable()
