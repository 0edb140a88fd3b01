"""A rollback never deletes what its target did not account for. What the target's ``.gitignore``
files left out is judged by those files as the target holds them (restoring.py
``_target_rules``: read from the target's tree), not by the ones in the workspace now: a file
ignored then and captured now (its pattern edited since) is kept, at the root and deeper; a
file the target's patterns did not cover is deleted as usual. A ``.gitignore`` of exactly the
size limit (``MAX_GITIGNORE_BYTES``) is applied by the capture, so it is by the rollback too; one
over the limit is applied by neither (the target captured what it would have left out)."""

from __future__ import annotations

from checkpointd.core.capture.ignore import MAX_GITIGNORE_BYTES
from tests.core.restore.test_rollback_write_path_attacked import Plan, write


def test_a_file_the_targets_gitignore_left_out_is_kept_though_the_pattern_changed_since(plan: Plan) -> None:
    write(plan.root / ".gitignore", "*.log\n")
    write(plan.root / "sub/.gitignore", "*.o\n")
    write(plan.root / "kept.txt", "kept\n")
    write(plan.root / "app.log", "the user's log, never checkpointed\n")
    write(plan.root / "sub/x.o", "the user's object file, never checkpointed\n")
    target = plan.checkpoint()
    assert "app.log" not in plan.files_of(target) and "sub/x.o" not in plan.files_of(target)
    write(plan.root / ".gitignore", "*.tmp\n")  # both files are captured from now on
    write(plan.root / "sub/.gitignore", "*.tmp\n")
    write(plan.root / "new.txt", "made after the target\n")
    newer = plan.checkpoint()
    assert "app.log" in plan.files_of(newer) and "sub/x.o" in plan.files_of(newer)

    plan.rollback(target)

    assert (plan.root / ".gitignore").read_text() == "*.log\n"
    assert (plan.root / "sub/.gitignore").read_text() == "*.o\n"
    assert (plan.root / "app.log").read_text() == "the user's log, never checkpointed\n"
    assert (plan.root / "sub/x.o").read_text() == "the user's object file, never checkpointed\n"
    assert not (plan.root / "new.txt").exists()


def test_a_gitignore_of_exactly_the_size_limit_is_the_targets_as_much_as_the_captures(plan: Plan) -> None:
    patterns = "*.log\n"
    write(plan.root / ".gitignore", patterns + "#" * (MAX_GITIGNORE_BYTES - len(patterns) - 1) + "\n")
    assert (plan.root / ".gitignore").stat().st_size == MAX_GITIGNORE_BYTES
    write(plan.root / "app.log", "the user's log, never checkpointed\n")
    target = plan.checkpoint()
    assert "app.log" not in plan.files_of(target), "the capture did not apply the .gitignore"
    write(plan.root / ".gitignore", "*.tmp\n")
    write(plan.root / "new.txt", "made after the target\n")
    assert "app.log" in plan.files_of(plan.checkpoint())

    plan.rollback(target)

    assert (plan.root / ".gitignore").stat().st_size == MAX_GITIGNORE_BYTES
    assert (plan.root / "app.log").read_text() == "the user's log, never checkpointed\n"
    assert not (plan.root / "new.txt").exists()


def test_a_gitignore_over_the_size_limit_is_applied_by_neither_the_capture_nor_the_rollback(plan: Plan) -> None:
    oversize = "*.log\n" + "#" * MAX_GITIGNORE_BYTES + "\n"
    write(plan.root / ".gitignore", oversize)
    write(plan.root / "app.log", "captured: the .gitignore was not applied\n")
    target = plan.checkpoint()
    assert "app.log" in plan.files_of(target)
    write(plan.root / "new.log", "made after the target, which accounted for every *.log\n")

    plan.rollback(target)

    assert not (plan.root / "new.log").exists(), "the rollback applied a .gitignore the capture did not"
    assert (plan.root / "app.log").read_text() == "captured: the .gitignore was not applied\n"
