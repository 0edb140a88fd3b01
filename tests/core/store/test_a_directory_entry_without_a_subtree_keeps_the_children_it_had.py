"""``Trees.apply`` given a directory entry without a digest (what a capture records when only a
directory's mode changed, or a rollback when it makes one) keeps the children the directory had,
and gives a path that was a file or a symlink, or nothing, an empty directory: never the old
entry's digest (a file's content) read as a subtree, never an existing directory emptied."""

from __future__ import annotations

from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EMPTY_TREE, Entry, EntryKind, Trees
from tests.core.store.test_tree import build, file


def test_a_directory_entry_without_a_subtree_keeps_the_children_it_had(tmp_path):
    trees = Trees(ContentStore(tmp_path / "store"))
    root = build(trees, {"d/a": file("a" * 64), "d/sub/b": file("b" * 64), "f": file("c" * 64),
                         "l": Entry(EntryKind.SYMLINK, 0o777, 1, "e" * 64, "d")})
    with trees.store.batch() as batch:
        changed = trees.apply(batch, root, {"d": Entry(EntryKind.DIR, 0o700), "f": Entry(EntryKind.DIR, 0o755),
                                            "l": Entry(EntryKind.DIR, 0o750), "new": Entry(EntryKind.DIR, 0o711)})
    fresh = Trees(ContentStore(tmp_path / "store"))
    assert fresh.lookup(changed, "d") == Entry(EntryKind.DIR, 0o700, 0, fresh.lookup(root, "d").digest)
    assert dict(fresh.flatten(fresh.lookup(changed, "d").digest)) == dict(fresh.flatten(fresh.lookup(root, "d").digest))
    for name, mode in (("f", 0o755), ("l", 0o750), ("new", 0o711)):
        assert fresh.lookup(changed, name) == Entry(EntryKind.DIR, mode, 0, EMPTY_TREE), name
        assert fresh.read(EMPTY_TREE) == {}
    assert [c.path for c in fresh.diff(root, changed)] == ["d", "f", "l", "new"]
    assert sorted(path for path, _ in fresh.flatten(changed)) == ["d", "d/a", "d/sub", "d/sub/b", "f", "l", "new"]
