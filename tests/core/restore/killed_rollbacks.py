"""Set-ups the recovery tests share: a target with three files changed since, and a rollback whose
process dies part-way (``_Killed`` at a fault point: nothing in the engine handles it)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, at_restore_change, write


def die() -> None:
    raise _Killed


def three_files_changed_since_a_target(plan: Plan, directory: str = "",
                                       checkpoint: Callable[[Plan], object] = Plan.checkpoint):
    """a.txt, b.txt and c.txt (in ``directory``) checkpointed, then each changed and checkpointed
    again (by ``checkpoint``); returns the first checkpoint, the target to roll back to."""
    prefix = f"{directory}/" if directory else ""
    for name in ("a", "b", "c"):
        write(plan.root / f"{prefix}{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b", "c"):
        write(plan.root / f"{prefix}{name}.txt", f"changed {name}\n")
    checkpoint(plan)
    return target


def killed_part_way(monkeypatch: pytest.MonkeyPatch, roll_back: Callable[[], object], change: int = 2) -> None:
    """Runs ``roll_back``, whose process dies at its ``change``-th change (fault point restore.change)."""
    at_restore_change(monkeypatch, {change: die})
    with pytest.raises(_Killed):
        roll_back()
    monkeypatch.undo()
