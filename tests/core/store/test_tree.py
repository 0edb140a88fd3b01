"""Merkle trees: equal content, equal digest; diff skips equal subtrees; apply is local."""

from __future__ import annotations

import pytest

from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import ContentStore, digest_bytes
from checkpointd.core.store.tree import EMPTY_TREE, Entry, EntryKind, Trees, decode_node, encode_node

_encode_node = encode_node


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


def test_node_encoding_and_digest_are_those_every_existing_store_holds():
    """A different encoding would give every directory a new digest: nothing stored before it
    would deduplicate against what is captured after it."""
    node = {"b.txt": Entry(EntryKind.FILE, 0o100644, 12, "ab" * 32), "a": Entry(EntryKind.DIR, 0o40755, 0, "cd" * 32),
            "link": Entry(EntryKind.SYMLINK, 0o120777, 5, "ef" * 32, "../é")}
    assert encode_node(node) == (
        b'[["a","d",16877,0,"' + b"cd" * 32 + b'",""],["b.txt","f",33188,12,"' + b"ab" * 32 + b'",""],'
        b'["link","l",41471,5,"' + b"ef" * 32 + b'","../\\u00e9"]]')
    assert digest_bytes(encode_node(node)) == "de103780aaa28a63adc0b22f45b3c06ed93a6f1969937e52aff6c76569d527d4"
    assert decode_node(encode_node(node)) == node


def test_a_changed_directory_is_stored_against_its_previous_node_without_encoding_that_again(tmp_path, monkeypatch):
    store_path = tmp_path / "store"
    trees = Trees(ContentStore(store_path))
    entries = {f"src/pkg/f{i}.py": file(f"{i:064x}") for i in range(40)} | {"README": file("e" * 64)}
    base = build(trees, entries)
    encoded = []
    monkeypatch.setattr(tree_module, "encode_node", lambda children: encoded.append(len(children))
                        or _encode_node(children))
    with trees.store.batch() as batch:
        changed = trees.apply(batch, base, {"src/pkg/f7.py": file("7" * 64)})
    # Three nodes written (pkg, src, the root), each encoded once: their previous versions'
    # bytes come from the nodes the first capture wrote.
    assert encoded == [40, 1, 2]
    pkg = trees.lookup(changed, "src/pkg")
    assert trees.store._committed[pkg.digest].base == trees.lookup(base, "src/pkg").digest, \
        "the changed directory is not stored as a delta of its previous node"
    fresh = Trees(ContentStore(store_path))
    assert dict(fresh.flatten(changed)) == dict(trees.flatten(changed))
    assert fresh.lookup(changed, "src/pkg/f7.py") == file("7" * 64)
    assert fresh.lookup(changed, "src/pkg/f8.py") == file(f"{8:064x}")


def _damage_record(store: ContentStore, digest: str) -> None:
    """Overwrites the last bytes of an object's pack record, as a bad sector would."""
    location = store._committed[digest]
    with open(location.pack.path, "r+b") as f:
        f.seek(location.offset + location.length - 4)
        f.write(b"XXXX")


def test_a_directory_whose_previous_node_was_damaged_on_disk_is_still_stored_readably(tmp_path):
    """A node's next version is a delta of the previous node's bytes as the store holds them,
    not as this process remembers writing them: a record damaged since then costs that one
    version, never the versions captured after it (as for files)."""
    store_path = tmp_path / "store"
    trees = Trees(ContentStore(store_path))
    entries = {f"src/pkg/f{i}.py": file(f"{i:064x}") for i in range(40)}
    base = build(trees, entries)
    _damage_record(trees.store, trees.lookup(base, "src/pkg").digest)
    with trees.store.batch() as batch:
        changed = trees.apply(batch, base, {"src/pkg/f7.py": file("7" * 64)})
    fresh = Trees(ContentStore(store_path))
    assert fresh.lookup(changed, "src/pkg/f7.py") == file("7" * 64)
    assert fresh.lookup(changed, "src/pkg/f8.py") == file(f"{8:064x}")
