"""Merkle trees: equal content, equal digest; diff skips equal subtrees; apply is local."""

from __future__ import annotations

import pytest

from checkpointd.core.store import ContentStore
from checkpointd.core.tree import EMPTY_TREE, Entry, EntryKind, Trees


@pytest.fixture
def trees(tmp_path):
    return Trees(ContentStore(tmp_path / "store"))


def file(digest: str, mode: int = 0o644) -> Entry:
    return Entry(EntryKind.FILE, mode, 1, digest)


def build(trees, entries: dict[str, Entry]) -> str:
    with trees.store.batch() as batch:
        dirs = {"/".join(p.split("/")[:i]) for p in entries for i in range(1, p.count("/") + 1)}
        updates = {d: Entry(EntryKind.DIR, 0o755) for d in dirs} | entries
        return trees.apply(batch, EMPTY_TREE, updates)


def test_same_content_gives_the_same_digest_whatever_the_insertion_order(trees):
    a = build(trees, {"x/1": file("a" * 64), "y/2": file("b" * 64)})
    b = build(trees, {"y/2": file("b" * 64), "x/1": file("a" * 64)})
    assert a == b


def test_diff_reports_changes_and_skips_unchanged_subtrees(trees):
    base = build(trees, {"same/deep/f": file("a" * 64), "changed/f": file("b" * 64), "gone": file("c" * 64)})
    target = build(trees, {"same/deep/f": file("a" * 64), "changed/f": file("d" * 64), "new": file("e" * 64)})
    reads = []
    original = trees.read
    trees.read = lambda digest: reads.append(digest) or original(digest)
    changes = {c.path: (c.base is not None, c.target is not None) for c in trees.diff(base, target)}
    assert changes == {"changed/f": (True, True), "gone": (True, False), "new": (False, True)}
    same_subtree = trees.lookup(base, "same").digest
    assert same_subtree not in reads


def test_mode_change_of_a_directory_is_reported(trees):
    with trees.store.batch() as batch:
        base = trees.apply(batch, EMPTY_TREE, {"d": Entry(EntryKind.DIR, 0o755)})
        target = trees.apply(batch, base, {"d": Entry(EntryKind.DIR, 0o700)})
    assert [c.path for c in trees.diff(base, target)] == ["d"]


def test_apply_removes_and_replaces_entries(trees):
    base = build(trees, {"a/b/c": file("a" * 64), "a/keep": file("b" * 64)})
    with trees.store.batch() as batch:
        removed = trees.apply(batch, base, {"a/b": None})
        replaced = trees.apply(batch, base, {"a/b": file("c" * 64)})
    assert trees.lookup(removed, "a/b") is None and trees.lookup(removed, "a/keep") is not None
    assert trees.lookup(replaced, "a/b").kind is EntryKind.FILE


def test_apply_refuses_children_under_a_file(trees):
    base = build(trees, {"f": file("a" * 64)})
    with trees.store.batch() as batch, pytest.raises(ValueError):
        trees.apply(batch, base, {"f/child": file("b" * 64)})
