"""A directory just past the split threshold whose names never end a part is stored as an index
of a single part (parts are cut at ``PART_MAX_ENTRIES``, twice the threshold). Each change to it
re-cuts that one part: children added, removed and edited give the digest of the same directory
written whole, and read, look up and diff as it."""

from __future__ import annotations

from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Entry, EntryKind, Index, Trees
from tests.core.store.test_perf_paths_attacked import _apply, _change, _check, _entry, _names, _root_with


def test_a_split_directory_held_in_one_part_takes_every_change(tmp_path):
    trees = Trees(ContentStore(tmp_path / "store"))
    names = _names(tree_module.SPLIT_ENTRIES + 20, False)
    current = {name: _entry(i) for i, name in enumerate(names[1:-5])}
    root = _root_with(trees, current)
    directory = _check(trees, root, current)
    node = trees._node(directory)
    assert isinstance(node, Index) and node.counts == [len(current)]
    steps: list[dict[str, Entry | None]] = [
        {names[0]: _entry(1)},  # before the first child
        {names[-1]: _entry(2), names[-2]: _entry(3)},  # after the last
        {names[100]: Entry(EntryKind.FILE, 0o600, 5, "ab" * 32)},
        {names[1]: None, names[-1]: None},
    ]
    for updates in steps:
        changed = _change(trees, root, updates)
        _apply(current, updates)
        _check(trees, changed, current, root, updates)
        root = changed
    trees.store.close()
