"""Garbage collection and fsck walk split directories (see ``tree``): a split directory's parts
are objects of their own, referenced through its index; a missing part, or a part that does
not hold what the index says, is damage."""

from __future__ import annotations

from checkpointd.core.maintenance.fsck import FindingKind, FsckReport, _Verifier
from checkpointd.core.maintenance.retention import _Marker
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import (
    EMPTY_TREE,
    SPLIT_ENTRIES,
    Entry,
    EntryKind,
    Index,
    Trees,
    encode_index,
    encode_node,
)


def _big_tree(trees: Trees) -> str:
    entries = {f"f{i:06d}": Entry(EntryKind.FILE, 0o644, 1, f"{i:064x}") for i in range(SPLIT_ENTRIES * 2)}
    with trees.store.batch() as batch:
        big = trees.write(batch, entries)
        return trees.apply(batch, EMPTY_TREE, {"big": Entry(EntryKind.DIR, 0o755, 0, big)})


def test_collection_marks_every_part_of_a_split_directory(tmp_path):
    trees = Trees(ContentStore(tmp_path / "store"))
    root = _big_tree(trees)
    big = trees.lookup(root, "big").digest
    marker = _Marker(Trees(trees.store))
    marker.add_row(root, None)
    assert len(trees.parts(big)) > 1
    assert {root, big, *trees.parts(big)} <= marker.referenced
    assert f"{5:064x}" in marker.referenced and not marker.missing


class _Without:
    """A store that lacks one object."""

    def __init__(self, store: ContentStore, gone: str) -> None:
        self._store = store
        self._gone = gone

    def has(self, digest: str) -> bool:
        return digest != self._gone and self._store.has(digest)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def test_fsck_reports_a_missing_part(tmp_path):
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    root = _big_tree(trees)
    part = trees.parts(trees.lookup(root, "big").digest)[1]
    report = FsckReport()
    verifier = _Verifier(_Without(store, part), report)
    assert not verifier.tree(root)
    assert [(p.kind, p.subject) for p in report.problems] == [(FindingKind.MISSING_OBJECT, part)]
    # The whole store is intact: the files' objects are not stored here, so verify nodes only.
    report = FsckReport()
    verifier = _Verifier(store, report)
    verifier.verify = lambda digest: True
    assert verifier.tree(root), report.to_json()


def test_fsck_reports_an_index_whose_parts_do_not_match_it(tmp_path):
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    root = _big_tree(trees)
    index = trees._node(trees.lookup(root, "big").digest)
    with store.batch() as batch:
        unordered = batch.put_bytes(encode_index(Index(index.firsts[:2], index.counts[:2], index.digests[1::-1])))
        miscounted = batch.put_bytes(encode_index(Index(index.firsts[:1], [index.counts[0] + 1], index.digests[:1])))
        nested = batch.put_bytes(encode_index(Index(["a"], [1], [unordered])))
        plain = batch.put_bytes(encode_node({"f": Entry(EntryKind.FILE, 0o644, 1, "00" * 32)}))
    for bad in (unordered, miscounted, nested):
        report = FsckReport()
        verifier = _Verifier(store, report)
        verifier.verify = lambda digest: True
        assert not verifier.tree(bad)
        assert [(p.kind, p.subject) for p in report.problems] == [(FindingKind.BAD_TREE_NODE, bad)]
    report = FsckReport()
    verifier = _Verifier(store, report)
    verifier.verify = lambda digest: True
    assert verifier.tree(plain)
