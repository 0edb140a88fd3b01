"""A split directory's index read from the store is refused (``ValueError``, which the store's
readers report as damage) when any one thing about it is wrong: no parts, a part's first name,
count or digest of the wrong type, parts out of order or named twice. Each forged index here
names real parts, so only the check on that one field stands between it and a read."""

from __future__ import annotations

import json

import pytest

from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from tests.core.store.test_perf_paths_attacked import _entry, _names


@pytest.fixture
def parts(tmp_path):
    """A store holding a split directory; its index's parts as [first, count, digest]."""
    store = ContentStore(tmp_path / "store")
    names = _names(tree_module.SPLIT_ENTRIES + 300, None)
    with store.batch() as batch:
        directory = Trees(store).write(batch, {name: _entry(i) for i, name in enumerate(names)})
    parts = json.loads(store.read_bytes(directory))["parts"]
    assert len(parts) >= 3
    yield store, parts
    store.close()


def _read(store: ContentStore, index: object) -> dict:
    with store.batch() as batch:
        digest = batch.put_bytes(json.dumps({"parts": index}).encode())
    return Trees(store).read(digest)


def test_the_index_as_written_reads(parts):
    store, good = parts
    assert len(_read(store, good)) == tree_module.SPLIT_ENTRIES + 300


@pytest.mark.parametrize("field, value", [(0, 7), (0, None), (1, "12"), (1, 1.5), (2, 7), (2, None)])
def test_a_part_with_a_field_of_the_wrong_type_is_refused(parts, field, value):
    store, good = parts
    forged = [list(part) for part in good]
    forged[1][field] = value
    with pytest.raises(ValueError, match="malformed"):
        _read(store, forged)


def test_an_index_without_parts_is_refused(parts):
    store, _ = parts
    with pytest.raises(ValueError, match="without parts"):
        _read(store, [])


@pytest.mark.parametrize("forge", ["swapped", "repeated"])
def test_parts_out_of_order_or_named_twice_are_refused(parts, forge):
    store, good = parts
    forged = [good[1], good[0], *good[2:]] if forge == "swapped" else [good[0], good[0], *good[1:]]
    with pytest.raises(ValueError, match="out of order"):
        _read(store, forged)
