"""A part of a split directory is an ordinary node: another directory with exactly the children of
that part has the same digest. ``Trees.write`` remembered the node it wrote under its digest in the
order its caller gave the children (an incremental capture puts those it adds last), so the part
could be remembered in another order than its own (it now remembers name order; the test caches
the part in reverse itself). Re-cutting the split directory after a change must not take the part's
children in that order: parts would start at the wrong names, lookups would miss the children
they hold, and a later edit of such a child would be recorded beside its old entry (which a read
gives back) instead of replacing it; a removal would not remove it."""

from __future__ import annotations

from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EMPTY_TREE, Entry, EntryKind, Index, Trees
from tests.core.store.test_perf_paths_attacked import _check, _entry, _names


def test_a_split_directory_whose_part_is_also_another_directory_keeps_every_later_edit(tmp_path):
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    names = _names(tree_module.SPLIT_ENTRIES + 200, None)
    current = {name: _entry(i) for i, name in enumerate(names)}
    with store.batch() as batch:
        directory = trees.write(batch, current)
        root = trees.apply(batch, EMPTY_TREE, {"d": Entry(EntryKind.DIR, 0o755, 0, directory)})
    index = trees._node(directory)
    assert isinstance(index, Index) and len(index.digests) >= 3
    first_part, second_part = (list(trees._part(digest)) for digest in index.digests[:2])

    # Another directory holding exactly the second part's children, given in reverse order.
    with store.batch() as batch:
        other = trees.write(batch, {name: current[name] for name in reversed(second_part)})
        root = trees.apply(batch, root, {"other": Entry(EntryKind.DIR, 0o755, 0, other)})
    assert other == index.digests[1]
    # Trees.write now remembers a node in name order, as one read from the store is; whatever else
    # might cache one in another order (Trees.write once kept its caller's), a re-cut must not
    # take that order: the part is cached here in reverse.
    trees._remember(other, dict(reversed(list(trees._part(other).items()))))

    # The child that ends the first part goes: the rest of the first part runs into the second.
    steps: list[dict[str, Entry | None]] = [
        {first_part[-1]: None},
        {second_part[len(second_part) // 2]: Entry(EntryKind.FILE, 0o600, 5, "ab" * 32)},
        {second_part[1]: None, first_part[0]: _entry(10 ** 6)},
    ]
    checked = []
    for updates in steps:
        with store.batch() as batch:
            changed = trees.apply(batch, root, {f"d/{name}": entry for name, entry in updates.items()})
        for name, entry in updates.items():
            if entry is None:
                del current[name]
            else:
                current[name] = entry
        fresh = Trees(ContentStore(store.root))
        assert fresh.read(fresh.lookup(changed, "d").digest) == current, "a change was not recorded"
        fresh.store.close()
        checked.append((changed, dict(current), root, updates))
        root = changed
    for changed, children, previous, updates in checked:
        _check(trees, changed, children, previous, updates)
    store.close()
