"""A rollback to a checkpoint that captured a file ignored now first reads that file into its
safety checkpoint (restoring.py ``plan_restore``: ``find_uncaptured`` then ``capture_paths``). The
safety checkpoint's file count and total size, which ListCheckpoints reports, must count it like
any other file: they agree with the tree the checkpoint holds."""

from __future__ import annotations

from checkpointd.core.config.registry import IGNORE_PATTERNS
from checkpointd.core.store.tree import EntryKind
from tests.core.restore.test_rollback_write_path_attacked import Plan, write


def _counts(plan: Plan, row) -> tuple[int, int]:
    entries = [entry for _path, entry in plan.engine.trees.flatten(row.tree_digest) if entry.kind is not EntryKind.DIR]
    return len(entries), sum(entry.size for entry in entries)


def test_a_file_ignored_now_that_the_safety_checkpoint_reads_is_counted_in_it(plan: Plan) -> None:
    write(plan.root / "d/x.bin", "the target's x\n")
    write(plan.root / "d/y.txt", "the target's y\n")
    target = plan.checkpoint()
    plan.config.set(IGNORE_PATTERNS, ["*.bin"], plan_id=plan.plan_id)
    write(plan.root / "d/x.bin", "changed since, ignored now: precious, and longer\n")
    write(plan.root / "d/y.txt", "changed y\n")
    plan.checkpoint()

    safety = plan.rollback(target).safety.row

    assert "d/x.bin" in plan.files_of(safety), "the safety checkpoint did not read the ignored file"
    assert (safety.file_count, safety.total_size_bytes) == _counts(plan, safety) == (2, 59)
