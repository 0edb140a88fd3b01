"""A new object with no previous version that pays (a renamed or copied file, a new directory
node, a version far from its last) is stored as a delta of a stored object found like it by
content (issue 21: the store at rest against git's): readable after reopening, rewritten whole
before its base is collected, and never based on an object deleted since."""

from __future__ import annotations

import hashlib
import random

from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.similar import MAX_ANCHORS, SimilarIndex, anchors
from checkpointd.core.store.tree import Entry, EntryKind, encode_node
from checkpointd.core.workspace.readworker import pack_body


def _source(name: str, functions: int = 120) -> bytes:
    return b"".join(b"def %s_%d(argument, other=None):\n    return %s_compute(argument, %d, other) + offset\n"
                    % (name.encode(), i, name.encode(), i * 7919 % 1000) for i in range(functions))


def _put(store: ContentStore, data: bytes, similar: str = "") -> str:
    with store.batch() as batch:
        return batch.put_bytes(data, similar)


def test_a_renamed_and_edited_file_is_stored_as_a_delta_of_its_old_content(tmp_path):
    store = ContentStore(tmp_path)
    unrelated = _put(store, _source("unrelated"))
    old = _put(store, _source("module"))
    renamed = _source("module").replace(b"return module_compute", b"return module_recompute", 3) + b"# moved\n"
    new = _put(store, renamed)  # a path new to the capture: no previous version named

    location = store._committed[new]
    assert location.kind == store_module.ZSTD_DELTA and location.base == old != unrelated
    assert location.length * 4 < len(pack_body(renamed)[1]), "a delta of a near copy is a small fraction"
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(new) == renamed
    assert reopened.damage() == []


def test_a_new_directory_node_like_a_stored_one_is_a_delta_of_it(tmp_path):
    store = ContentStore(tmp_path)
    children = {f"file_{i:03d}.py": Entry(EntryKind.FILE, 0o644, 1000 + i, hashlib.sha256(b"%d" % i).hexdigest())
                for i in range(150)}
    old = _put(store, encode_node(children))
    children["file_007.py"] = Entry(EntryKind.FILE, 0o644, 5, hashlib.sha256(b"changed").hexdigest())
    copied = encode_node(children)
    new = _put(store, copied)
    assert store._committed[new].kind == store_module.ZSTD_DELTA and store._committed[new].base == old
    assert ContentStore(tmp_path).read_bytes(new) == copied


def test_a_version_far_from_its_previous_one_is_a_delta_when_that_is_clearly_smaller(tmp_path):
    """A delta over a quarter of the content (which used to mean: stored whole) is kept when it
    is well under the content compressed on its own: here, half of each line's token changed."""
    rng = random.Random(1)
    tokens = [rng.randbytes(16).hex() for _ in range(300)]
    first = b"".join(b"%d %s\n" % (i, token.encode()) for i, token in enumerate(tokens))
    rewritten = b"".join(b"%d %s%s\n" % (i, token[:16].encode(), rng.randbytes(8).hex().encode())
                         for i, token in enumerate(tokens))
    store = ContentStore(tmp_path)
    previous = _put(store, first)
    new = _put(store, rewritten, previous)
    location = store._committed[new]
    whole = len(pack_body(rewritten)[1])
    assert location.kind == store_module.ZSTD_DELTA and location.base == previous, (location.length, whole)
    assert len(rewritten) < location.length * 4 and location.length < whole * store_module._DELTA_GAIN
    assert ContentStore(tmp_path).read_bytes(new) == rewritten


def test_deleting_a_found_base_rewrites_its_dependents_whole_first(tmp_path):
    store = ContentStore(tmp_path)
    old = _put(store, _source("module"))
    copy = _source("module") + b"# a copy elsewhere\n"
    new = _put(store, copy)
    assert store._committed[new].base == old
    store.delete(old)
    assert store._committed[new].kind != store_module.ZSTD_DELTA
    assert store.read_bytes(new) == copy
    reopened = ContentStore(tmp_path)
    assert not reopened.has(old) and reopened.read_bytes(new) == copy
    assert reopened.damage() == []


def test_an_object_deleted_since_it_was_indexed_is_never_a_base(tmp_path):
    store = ContentStore(tmp_path)
    old = _put(store, _source("module"))
    store.delete(old)
    copy = _source("module") + b"# written again after its twin was collected\n"
    new = _put(store, copy)
    assert store._committed[new].kind == store_module.ZSTD
    assert ContentStore(tmp_path).read_bytes(new) == copy


def test_an_object_unlike_any_stored_one_is_stored_whole(tmp_path):
    store = ContentStore(tmp_path)
    _put(store, _source("module"))
    other = b"".join(b"%d: an entirely different text, line %d\n" % (i * 31337, i) for i in range(300))
    assert store._committed[_put(store, other)].kind == store_module.ZSTD


def test_the_index_forgets_its_oldest_anchors_past_its_capacity():
    """Two generations of half the capacity each: the third object's anchors push the first's out."""
    index = SimilarIndex(capacity=2 * MAX_ANCHORS)
    objects = {name * 64: _source(name, 200) for name in "abc"}
    assert all(len(anchors(data)) == MAX_ANCHORS for data in objects.values())
    for number, (digest, data) in enumerate(objects.items()):
        index.add(digest, anchors(data))
        assert index.candidates(anchors(data)) == [digest]
        assert len(index) == MAX_ANCHORS * min(number + 1, 2)
    assert index.candidates(anchors(objects["a" * 64])) == [], "the first object's anchors were the oldest"
    assert index.candidates(anchors(objects["b" * 64])) == ["b" * 64]


def test_an_object_committed_by_another_batch_meanwhile_is_not_stored_as_a_delta_of_itself(tmp_path):
    """Two batches may both find an object missing; once one has committed it, the index offers
    it as a base for the other's copy, which must not be a delta of itself (it could never be read)."""
    store = ContentStore(tmp_path)
    data = _source("module")
    with store.batch() as late:
        with store.batch() as first:
            digest = first.put_bytes(data)
        location = late._append_packed(digest, data, "", anchors(data))
        assert location.kind == store_module.ZSTD and location.base == ""

