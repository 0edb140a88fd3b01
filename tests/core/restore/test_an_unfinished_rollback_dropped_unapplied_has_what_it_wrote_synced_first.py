"""A journal entry can go without being applied (``Recovery.drop``): when the plan moved on (a
checkpoint was recorded after it: one made while finishing it failed), or when a new rollback with
nothing to change supersedes it. The rollback that left it may have died after renaming its files
into place, before its batch's sync (fault point ``restore.unsynced``): its writes are in the
kernel's cache only. Finishing it would sync them (``Recovery.resume`` syncs the file systems it
wrote to); dropping it must too, or a power cut after the drop is durable takes back part of the
rollback with no entry left to finish or undo it, while the newer checkpoint (or the superseding
rollback, acknowledged) says the workspace holds the target. Checked by the durability oracle
(``durability_oracle``)."""

from __future__ import annotations

import errno

import pytest

from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.workspace import syncbatch
from tests.core.restore.durability_oracle import DurabilityOracle
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, write
from tests.helpers import at_fault_point


def _die() -> None:
    raise _Killed




def _killed_after_renaming(plan: Plan, monkeypatch: pytest.MonkeyPatch):
    """A rollback killed at ``restore.unsynced``; returns the oracle (installed before the
    rollback) and the target."""
    write(plan.root / "d/a.txt", "target a\n")
    target = plan.checkpoint()
    write(plan.root / "d/a.txt", "changed a, and longer\n")
    plan.checkpoint()
    oracle = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)
    with pytest.MonkeyPatch.context() as mp:
        at_fault_point(mp, restorer_module, Point.RESTORE_UNSYNCED, {1: _die})
        with pytest.raises(_Killed):
            plan.rollback(target)
    return oracle, target


def _finishing_fails_once(call) -> object:
    """``call`` with the file system reporting a write error to the first sync made, the one
    finishing the entry makes (any failure before that sync would do: the attempt is given up, the entry kept)."""
    real, calls = syncbatch._syncfs, []

    def failing_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(syncbatch, "_syncfs", failing_once)
        return call()


def test_an_entry_whose_plan_moved_on_is_dropped_only_once_what_its_rollback_wrote_is_synced(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    oracle, _target = _killed_after_renaming(plan, monkeypatch)
    _finishing_fails_once(plan.checkpoint)  # recorded all the same: the plan moves on
    assert plan.engine.journal.get(plan.plan_id) is not None, "the attempt to finish it did not fail"

    plan.checkpoint()  # the plan moved on: the entry is dropped unapplied

    assert plan.engine.journal.get(plan.plan_id) is None
    assert "journal entry removed" in oracle.moments, oracle.moments
    oracle.assert_durable()


def test_an_entry_a_rollback_with_nothing_to_change_supersedes_goes_only_once_what_it_wrote_is_synced(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The superseding rollback's own attempt to finish the entry fails; with the workspace
    already at the target it changes nothing, drops the entry in its transaction, and is
    acknowledged."""
    oracle, target = _killed_after_renaming(plan, monkeypatch)

    _finishing_fails_once(lambda: plan.rollback(target))

    assert plan.engine.journal.get(plan.plan_id) is None
    assert any(m.startswith("journal entry dropped") for m in oracle.moments), oracle.moments
    oracle.assert_durable()
