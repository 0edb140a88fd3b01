"""A diff lists a directory that one side lacks and every path under it, parents first: a rollback
takes its changes from that list, so a directory added since the base (or removed) must bring
its files along, a whole directory replaced by a file too."""

from __future__ import annotations

from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from tests.core.store.test_tree import build, file


def test_a_diff_lists_every_path_under_a_directory_added_or_removed(tmp_path):
    trees = Trees(ContentStore(tmp_path / "store"))
    base = build(trees, {"keep": file("a" * 64), "gone/x": file("b" * 64), "gone/sub/y": file("c" * 64),
                         "flip/z": file("d" * 64)})
    target = build(trees, {"keep": file("a" * 64), "new/p": file("e" * 64), "new/deep/q": file("f" * 64),
                           "flip": file("9" * 64)})
    forward = ["flip", "flip/z", "gone", "gone/sub", "gone/sub/y", "gone/x", "new", "new/deep", "new/deep/q", "new/p"]
    assert [c.path for c in trees.diff(base, target)] == forward
    assert [c.path for c in trees.diff(target, base)] == forward
    assert [c.path for c in trees.diff(None, target)] == ["flip", "keep", "new", "new/deep", "new/deep/q", "new/p"]
    trees.store.close()
