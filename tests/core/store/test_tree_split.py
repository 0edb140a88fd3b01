"""Large directories are stored split into parts (see ``tree``): the split depends on the
children alone, so a directory changed a child at a time has the digest of the same directory
written whole; a change rewrites the parts it falls in and the index, not every child; reads,
lookups and diffs see the same children as if the node were whole."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import Batch, ContentStore
from checkpointd.core.store.tree import (
    EMPTY_TREE,
    SPLIT_ENTRIES,
    Entry,
    EntryKind,
    Index,
    Trees,
    decode_index,
    decode_node,
    is_index,
)


@pytest.fixture
def trees(tmp_path):
    return Trees(ContentStore(tmp_path / "store"))


def file(number: int, mode: int = 0o644) -> Entry:
    return Entry(EntryKind.FILE, mode, number % 1000, f"{number:064x}")


def children(count: int, start: int = 0) -> dict[str, Entry]:
    return {f"entry_{i:07d}.txt": file(i) for i in range(start, start + count)}


def with_big(trees: Trees, entries: dict[str, Entry]) -> str:
    with trees.store.batch() as batch:
        big = trees.write(batch, entries)
        return trees.apply(batch, EMPTY_TREE, {"big": Entry(EntryKind.DIR, 0o755, 0, big),
                                               "README": file(1)})


def test_a_large_directory_is_stored_as_an_index_of_parts_and_reads_back_whole(trees, tmp_path):
    entries = children(SPLIT_ENTRIES * 2)
    root = with_big(trees, entries)
    big = trees.lookup(root, "big").digest
    data = trees.store.read_bytes(big)
    assert is_index(data)
    index = decode_index(data)
    assert len(index.digests) > 1 and sum(index.counts) == len(entries)
    assert trees.parts(big) == index.digests
    for part in index.digests:
        assert not is_index(trees.store.read_bytes(part))
    # A server started afresh reads the same children from the store.
    fresh = Trees(ContentStore(tmp_path / "store"))
    assert list(fresh.read(big).items()) == sorted(entries.items())
    assert fresh.lookup(root, "big/entry_0000000.txt") == file(0)
    assert fresh.lookup(root, f"big/entry_{len(entries) - 1:07d}.txt") == file(len(entries) - 1)
    assert fresh.lookup(root, "big/absent") is None and fresh.lookup(root, "big/a") is None
    assert dict(fresh.flatten(root)) == dict(trees.flatten(root))


def test_a_directory_at_the_threshold_stays_whole(trees):
    with trees.store.batch() as batch:
        digest = trees.write(batch, children(SPLIT_ENTRIES))
    assert not is_index(trees.store.read_bytes(digest)) and trees.parts(digest) == []


def test_one_changed_child_rewrites_one_part_and_the_index(trees, monkeypatch):
    entries = children(SPLIT_ENTRIES * 4)
    root = with_big(trees, entries)
    written: list[bytes] = []
    put = Batch.put_bytes
    monkeypatch.setattr(Batch, "put_bytes", lambda self, data, *a: written.append(data) or put(self, data, *a))
    encoded: list[int] = []
    encode = tree_module.encode_node
    monkeypatch.setattr(tree_module, "encode_node", lambda node: encoded.append(len(node)) or encode(node))
    with trees.store.batch() as batch:
        changed = trees.apply(batch, root, {"big/entry_0003000.txt": file(7)})
    index = decode_index(written[-2])
    assert len(written) == 3, "one part, the directory's index, the root"
    assert max(encoded) <= tree_module.PART_MAX_ENTRIES and sum(encoded) < len(entries) // 2
    assert index.counts == decode_index(trees.store.read_bytes(trees.lookup(root, "big").digest)).counts
    assert trees.lookup(changed, "big/entry_0003000.txt") == file(7)
    # The same digest as the changed directory written whole.
    monkeypatch.undo()
    with trees.store.batch() as batch:
        whole = Trees(trees.store).write(batch, entries | {"entry_0003000.txt": file(7)})
    assert trees.lookup(changed, "big").digest == whole


def test_a_changed_part_is_stored_as_a_delta_of_the_part_it_replaces(trees):
    root = with_big(trees, children(SPLIT_ENTRIES * 2))
    before = trees.lookup(root, "big").digest
    with trees.store.batch() as batch:
        changed = trees.apply(batch, root, {"big/entry_0000100.txt": file(5)})
    after = trees.lookup(changed, "big").digest
    new_parts = set(trees.parts(after)) - set(trees.parts(before))
    assert len(new_parts) == 1
    assert trees.store._committed[new_parts.pop()].base in trees.parts(before)


def test_diff_of_split_directories_reads_only_the_parts_that_differ(trees, monkeypatch):
    root = with_big(trees, children(SPLIT_ENTRIES * 4))
    with trees.store.batch() as batch:
        changed = trees.apply(batch, root, {"big/entry_0000010.txt": None, "big/new.txt": file(3),
                                            "big/entry_0007000.txt": file(9, 0o600)})
    fresh = Trees(trees.store)
    reads: list[str] = []
    original = fresh._read_uncached
    monkeypatch.setattr(fresh, "_read_uncached", lambda digest: reads.append(digest) or original(digest))
    changes = {c.path: (c.base, c.target) for c in fresh.diff(root, changed)}
    assert changes == {"big/entry_0000010.txt": (file(10), None), "big/new.txt": (None, file(3)),
                       "big/entry_0007000.txt": (file(7000), file(9, 0o600))}
    assert len(reads) <= 2 + 2 + 2 * 3, "the roots, the indexes and the differing parts"


@pytest.mark.parametrize("seed", range(4))
def test_changes_a_few_at_a_time_give_the_directory_written_whole(tmp_path, monkeypatch, seed):
    """Small parts and a low threshold, so that every way the parts are cut again is met:
    children added before the first part and after the last, parts emptied, the child that
    ended a part removed, parts cut at their size limit, the directory going from whole to
    split and back."""
    monkeypatch.setattr(tree_module, "SPLIT_ENTRIES", 20)
    monkeypatch.setattr(tree_module, "PART_MASK", 3)
    monkeypatch.setattr(tree_module, "PART_MAX_ENTRIES", 6)
    rng = random.Random(seed)
    trees = Trees(ContentStore(tmp_path / "store"))
    current: dict[str, Entry] = {}
    with trees.store.batch() as batch:
        root = trees.apply(batch, EMPTY_TREE, {"d": Entry(EntryKind.DIR, 0o755)})
    shapes = set()
    for _step in range(400):
        updates: dict[str, Entry | None] = {}
        for _ in range(rng.choice([1, 1, 2, 5, 30])):
            name = f"n{rng.randrange(90):03d}"
            if name in current and rng.random() < 0.45:
                updates[name] = None
            elif rng.random() < 0.1:
                updates[name] = Entry(EntryKind.SYMLINK, 0o777, 3, f"{rng.randrange(10**6):064x}", "t/x")
            else:
                updates[name] = file(rng.randrange(10**6))
        for name, entry in updates.items():
            if entry is None:
                current.pop(name, None)
            else:
                current[name] = entry
        with trees.store.batch() as batch:
            changed = trees.apply(batch, root, {f"d/{name}": entry for name, entry in updates.items()})
            whole = Trees(trees.store).write(batch, dict(current))
        directory = trees.lookup(changed, "d").digest
        assert directory == whole
        node = trees._node(directory)
        shapes.add(len(node.digests) if isinstance(node, Index) else 0)
        assert trees.read(directory) == dict(sorted(current.items()))
        expected = {f"d/{name}" for name, entry in updates.items() if trees.lookup(root, f"d/{name}") != entry}
        assert {c.path for c in trees.diff(root, changed)} == expected
        for name in updates:
            assert trees.lookup(changed, f"d/{name}") == current.get(name)
        root = changed
    assert 0 in shapes and max(shapes) >= 8, "the directory was not both whole and split"


def test_a_part_holds_a_plain_node(trees):
    root = with_big(trees, children(SPLIT_ENTRIES + 1))
    for part in trees.parts(trees.lookup(root, "big").digest):
        assert decode_node(trees.store.read_bytes(part))


@pytest.mark.parametrize(("value", "want"), [("", "2048 511 4096"), ("2", "2 1 4"), ("16", "16 3 32"),
                                             ("1", "ValueError")])
def test_tests_lower_the_split_threshold_through_the_environment(value, want):
    """The model-based test starts servers that split directories of three entries
    (CHECKPOINTD_TREE_SPLIT_ENTRIES); parts stay about a quarter of the threshold."""
    code = ("from checkpointd.core.store import tree\n"
            "print(tree.SPLIT_ENTRIES, tree.PART_MASK, tree.PART_MAX_ENTRIES)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CHECKPOINTD_TREE_SPLIT_ENTRIES": value})
    assert want in (done.stdout + done.stderr), done.stderr
    assert (done.returncode == 0) == (want != "ValueError")
