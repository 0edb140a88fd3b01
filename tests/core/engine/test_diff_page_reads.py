"""A DiffCheckpoints page between two checkpoints reads only its own changes: its token says where
to resume (the subtrees before it are not read) and how many changes the later pages hold (they
are not counted again), so following every page costs what the whole diff costs once. Against
the live workspace a page counts what is left again, since the later pages may differ."""

from __future__ import annotations

import pytest

from tests.core.restore.test_rollback_write_path_attacked import write
from tests.helpers import nodes_read

DIRECTORIES, FILES = 20, 5


@pytest.fixture
def changed_everywhere(plan):
    """Two checkpoints 100 changed files apart, 5 in each of 20 directories (each its own content)."""
    for i in range(DIRECTORIES):
        for j in range(FILES):
            write(plan.root / f"d{i:02}/f{j}.txt", f"old {i} {j}\n")
    base = plan.checkpoint()
    for i in range(DIRECTORIES):
        for j in range(FILES):
            write(plan.root / f"d{i:02}/f{j}.txt", f"new {i} {j}\n")
    return base, plan.checkpoint()


def _directories_read(plan, base, target, call) -> set[int]:
    """The directories (by number) whose nodes ``call`` read, on either side."""
    trees = plan.engine.trees
    number = {trees.lookup(row.tree_digest, f"d{i:02}").digest: i for row in (base, target) for i in range(DIRECTORIES)}
    return {number[digest] for digest in nodes_read(trees, call) if digest in number}


def _page(plan, base, target, token, size=FILES):
    return plan.engine.diff_page(base.checkpoint_id, target.checkpoint_id, (), False, size, token)


def _token(plan, base, target, page, remaining):
    return plan.engine.diff_token_after(base.checkpoint_id, target.checkpoint_id, (), False, page.changes[-1],
                                        remaining)


def test_a_later_page_between_two_checkpoints_reads_its_own_directory_alone(plan, changed_everywhere):
    base, target = changed_everywhere
    first = _page(plan, base, target, "")
    assert [c.path for c in first.changes] == [f"d00/f{j}.txt" for j in range(FILES)]
    assert first.after == (DIRECTORIES - 1) * FILES
    token, listed = _token(plan, base, target, first, first.after), [first]
    for i in range(1, DIRECTORIES):
        read = _directories_read(plan, base, target, lambda t=token: listed.append(_page(plan, base, target, t)))
        page = listed[-1]
        assert [c.path for c in page.changes] == [f"d{i:02}/f{j}.txt" for j in range(FILES)]
        assert page.after == (DIRECTORIES - 1 - i) * FILES
        # The page's own directory, and the one the token names (where the walk resumes).
        assert read <= {i - 1, i}, (i, read)
        token = _token(plan, base, target, page, page.after)
    assert listed[-1].after == 0


def test_a_token_without_a_count_still_pages_right_by_counting_what_is_left(plan, changed_everywhere):
    """A token of the release before counts were carried (a path alone)."""
    base, target = changed_everywhere
    first = _page(plan, base, target, "", size=FILES * 10)
    binding = (f"DiffCheckpoints\0{base.checkpoint_id}\0{target.checkpoint_id}\0{0}", "")
    token = plan.engine.page_tokens.issue_after_path(*binding, first.changes[-1].path)
    pages = []
    read = _directories_read(plan, base, target, lambda: pages.append(_page(plan, base, target, token)))
    assert [c.path for c in pages[0].changes] == [f"d10/f{j}.txt" for j in range(FILES)]
    assert pages[0].after == (DIRECTORIES - 11) * FILES
    assert read == set(range(9, DIRECTORIES))  # from the token's on: all of them counted


def test_a_live_page_counts_what_is_left_again(plan, changed_everywhere):
    base, _ = changed_everywhere
    first = plan.engine.diff_page(base.checkpoint_id, "", (), False, FILES, "")
    token = plan.engine.diff_token_after(base.checkpoint_id, "", (), False, first.changes[-1], first.after)
    write(plan.root / "d19/f9.txt", "added between the pages\n")
    second = plan.engine.diff_page(base.checkpoint_id, "", (), False, FILES, token)
    assert [c.path for c in second.changes] == [f"d01/f{j}.txt" for j in range(FILES)]
    assert second.after == first.after - FILES + 1
