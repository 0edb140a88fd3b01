"""A rollback never deletes what its target did not account for: a file the target skipped for
its size (listed in the target's ``skipped``, restoring.py ``plan_restore`` hands their paths to
the planner) is kept, also once the size limit was raised and the file is captured: the target
never recorded what it held, so its absence there says nothing."""

from __future__ import annotations

from checkpointd.core.config.registry import MAX_FILE_SIZE_BYTES
from tests.core.restore.test_rollback_write_path_attacked import Plan, write


def test_a_file_the_target_skipped_for_size_is_kept_though_the_limit_was_raised_since(plan: Plan) -> None:
    plan.config.set(MAX_FILE_SIZE_BYTES, 100, plan_id=plan.plan_id)
    write(plan.root / "kept.txt", "kept\n")
    write(plan.root / "data/big.bin", "x" * 500)
    target = plan.checkpoint()
    assert [s[0] for s in target.skipped] == ["data/big.bin"] and "data/big.bin" not in plan.files_of(target)
    plan.config.set(MAX_FILE_SIZE_BYTES, 10_000, plan_id=plan.plan_id)
    write(plan.root / "data/big.bin", "y" * 600)
    write(plan.root / "new.txt", "made after the target\n")
    assert "data/big.bin" in plan.files_of(plan.checkpoint())

    plan.rollback(target)

    assert (plan.root / "data/big.bin").read_text() == "y" * 600
    assert not (plan.root / "new.txt").exists()
    assert (plan.root / "kept.txt").read_text() == "kept\n"
