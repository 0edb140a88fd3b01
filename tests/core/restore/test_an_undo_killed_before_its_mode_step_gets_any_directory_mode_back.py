"""An undo makes a directory the rollback removed owner-rwx (``Workspace.make_dir``: the
directory's mode plus 0700), puts its files back, then sets its mode. Killed before that mode
step, the directory is still the undo's own (restoring.py ``plan_restore``'s ``keep``: journaled
as ``interim``, holding the mode make_dir leaves); whoever finishes the undo sets the mode. That
holds for every mode, also one that gives others nothing (0500, 0550: no ``o+x``), not only
the usual 0555."""

from __future__ import annotations

import os

import pytest

from checkpointd.core.workspace.workspace import Workspace
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, before_workspace_call, write


@pytest.mark.parametrize("mode", [0o500, 0o550, 0o555, 0o1500])
def test_an_undo_killed_before_its_mode_step_puts_the_directory_back_with_its_mode(
        plan: Plan, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    write(plan.root / "z.txt", "target z\n")
    target = plan.checkpoint()
    write(plan.root / "d/f.txt", "precious f\n")
    os.chmod(plan.root / "d", mode)
    write(plan.root / "z.txt", "changed z\n")
    plan.checkpoint()
    before = plan.state()
    before_workspace_call(monkeypatch, "z.txt", lambda: write(plan.root / "z.txt", "the user's newer z\n"))
    real = Workspace.set_dir_mode

    def set_dir_mode(self, path, mode):
        if path == "d":
            raise _Killed
        return real(self, path, mode)

    monkeypatch.setattr(Workspace, "set_dir_mode", set_dir_mode)
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    assert (plan.root / "d/f.txt").exists(), "the kill was not after the undo's write"

    plan.checkpoint()  # takes the plan over: finishes the undo first

    assert plan.engine.journal.get(plan.plan_id) is None
    now = plan.state()
    assert now.get("d/f.txt") == before["d/f.txt"]
    assert now.get("d") == ("dir", mode), f"d is {now.get('d')!r}, not {oct(mode)}"
