"""An undo takes back only what still holds what the rollback wrote; a path whose content someone
deleted since is left deleted (that deletion, made after the rollback began, wins: the safety
checkpoint has the content). The exception is a path the undo journaled as its own to pass
through nothing (``JournalEntry.interim``, restoring.py ``interim_paths``: a kind flip that
removes the rollback's entry before the undo's goes in, or a directory it makes): a plain file
the undo rewrites in one rename is never such a path.

Here the rollback rewrites a.txt and b.txt, stops at z.txt (a tool rewrote it) and undoes
itself; the undo puts the user's a.txt back and dies before b.txt. The user then deletes a.txt,
their own file again. Whoever finishes the undo must leave a.txt deleted, and still put b.txt
back."""

from __future__ import annotations

import pytest

from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.restore.journal import Goal
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, before_workspace_call, write
from tests.helpers import at_fault_point


def test_a_file_the_user_deletes_after_a_killed_undo_put_it_back_stays_deleted(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "z"):
        write(plan.root / f"{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b", "z"):
        write(plan.root / f"{name}.txt", f"the user's {name}\n")
    plan.checkpoint()
    before_workspace_call(monkeypatch, "z.txt", lambda: write(plan.root / "z.txt", "a tool's newer z\n"))

    journal = type(plan.engine.journal)
    real_put, undoing = journal.put, []

    def put(self, entry, *args, **kwargs):
        if entry.goal is Goal.UNDO:
            undoing.append(entry)
        return real_put(self, entry, *args, **kwargs)

    def die_once_the_undo_put_a_back() -> None:
        if undoing and (plan.root / "a.txt").read_text() == "the user's a\n":
            raise _Killed

    monkeypatch.setattr(journal, "put", put)

    at_fault_point(monkeypatch, restorer_module, Point.RESTORE_CHANGE,
                   {n: die_once_the_undo_put_a_back for n in range(1, 10)})
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    assert (plan.root / "b.txt").read_text() == "target b\n", "the kill was not between the undo's two changes"
    (plan.root / "a.txt").unlink()

    plan.checkpoint()  # takes the plan over: finishes the undo first

    assert plan.engine.journal.get(plan.plan_id) is None
    assert not (plan.root / "a.txt").exists(), "finishing the undo brought back a file the user deleted since"
    assert (plan.root / "b.txt").read_text() == "the user's b\n"
    assert (plan.root / "z.txt").read_text() == "a tool's newer z\n"
