"""The performance changes of 3 December 2026 attacked (docs/PERFORMANCE.md: large directories
stored split, delta bases found by content, delta chains decoded in one unhashed pass, the watcher's
quiet periods): split directories at and around their thresholds, with names that cut every part or
none, shrinking back to whole, moved across part boundaries, and old whole nodes next to split ones;
content-found bases across restarts, aborted batches, deletions and compactions, and two batches
writing the same object at once; damaged links of the deepest chains that still decode; a capture of
another workspace while a rollback keeps the reader quiet."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import zlib

import pytest

from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import MAX_DELTA_DEPTH, ContentStore
from checkpointd.core.store.packs import zstd_decompress
from checkpointd.core.store.tree import EMPTY_TREE, Entry, EntryKind, Index, Trees, is_index
from tests.core.store.test_store_attacked import _when_located
from tests.core.store.test_store_size_similar import _put, _source


def _entry(number: int) -> Entry:
    return Entry(EntryKind.FILE, 0o644, number % 997, hashlib.sha256(b"%d" % number).hexdigest())


def _names(count: int, ends_part: bool | None, prefix: str = "n") -> list[str]:
    """``count`` names in order, each ending a part (True), none doing so (False), or any (None)."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"{prefix}{i:07d}"
        i += 1
        if ends_part is None or tree_module._ends_part(name) is ends_part:
            found.append(name)
    return found


def _whole(trees: Trees, children: dict[str, Entry]) -> str:
    """The digest of ``children`` written from scratch (what a full scan stores)."""
    with trees.store.batch() as batch:
        return Trees(trees.store).write(batch, dict(children))


def _change(trees: Trees, root: str, updates: dict[str, Entry | None]) -> str:
    with trees.store.batch() as batch:
        return trees.apply(batch, root, {f"d/{name}": entry for name, entry in updates.items()})


def _apply(current: dict[str, Entry], updates: dict[str, Entry | None]) -> None:
    """The model of a directory's children after ``updates`` (None removes a child)."""
    for name, entry in updates.items():
        if entry is None:
            current.pop(name)
        else:
            current[name] = entry


def _check(trees: Trees, root: str, current: dict[str, Entry], previous_root: str | None = None,
           updates: dict[str, Entry | None] | None = None) -> str:
    """The directory ``d`` of ``root`` holds ``current``: its digest is the one written whole, a
    fresh reader reads, looks up and diffs it as such."""
    directory = trees.lookup(root, "d").digest
    assert directory == _whole(trees, current)
    fresh = Trees(ContentStore(trees.store.root))
    assert fresh.read(directory) == dict(sorted(current.items()))
    assert is_index(fresh.store.read_bytes(directory)) is (len(current) > tree_module.SPLIT_ENTRIES)
    if previous_root is not None and updates is not None:
        expected = {f"d/{name}" for name, entry in updates.items()
                    if fresh.lookup(previous_root, f"d/{name}") != entry}
        assert {c.path for c in fresh.diff(previous_root, root)} == expected
        for name, entry in updates.items():
            assert fresh.lookup(root, f"d/{name}") == entry
    fresh.store.close()
    return directory


@pytest.fixture
def trees(tmp_path):
    store = ContentStore(tmp_path / "store")
    yield Trees(store)
    store.close()


def _root_with(trees: Trees, children: dict[str, Entry]) -> str:
    with trees.store.batch() as batch:
        directory = trees.write(batch, children)
        return trees.apply(batch, EMPTY_TREE, {"d": Entry(EntryKind.DIR, 0o755, 0, directory)})


# -- split directories ----------------------------------------------------------------------------


def test_a_directory_crossing_the_split_threshold_both_ways_keeps_the_digest_written_whole(trees):
    """2,047 -> 2,050 children a child at a time (whole -> split), then back to 2,046 (split ->
    whole), then up again by two at once: every step has the digest of the same directory written
    whole, reads, looks up and diffs as it."""
    split = tree_module.SPLIT_ENTRIES
    names = _names(split + 8, None)
    current = {name: _entry(i) for i, name in enumerate(names[:split - 1])}
    root = _root_with(trees, current)
    _check(trees, root, current)
    steps: list[dict[str, Entry | None]] = [{names[split - 1]: _entry(1)}, {names[split]: _entry(2)},
                                            {names[split + 1]: _entry(3)}, {names[split + 2]: _entry(4)}]
    steps += [{names[0]: None}, {names[split]: None}, {names[5]: None}, {names[split - 1]: None},
              {names[7]: None, names[0]: _entry(9)}, {names[split + 3]: _entry(5), names[8]: None},
              {names[split + 4]: _entry(6), names[split + 5]: _entry(7)}]
    shapes = []
    for updates in steps:
        changed = _change(trees, root, updates)
        _apply(current, updates)
        _check(trees, changed, current, root, updates)
        shapes.append(len(current))
        root = changed
    assert min(shapes) <= split < max(shapes)


def test_names_that_never_end_a_part_are_cut_at_the_part_limit_and_re_cut_exactly(trees):
    """No name ends a part: parts are cut at ``PART_MAX_ENTRIES``; a child added before the first
    (every later cut moves) or removed from the middle re-cuts to the digest written whole."""
    limit = tree_module.PART_MAX_ENTRIES
    names = _names(2 * limit + 300, False)
    current = {name: _entry(i) for i, name in enumerate(names[1:])}
    root = _root_with(trees, current)
    directory = _check(trees, root, current)
    node = trees._node(directory)
    assert isinstance(node, Index) and node.counts == [limit, limit, len(current) - 2 * limit]
    for updates in ({names[0]: _entry(1)}, {names[limit]: None}, {names[limit + 5]: None, names[1]: None},
                    {names[1]: _entry(2), names[limit + 5]: _entry(3), names[limit]: _entry(4)}):
        changed = _change(trees, root, updates)
        _apply(current, updates)
        _check(trees, changed, current, root, updates)
        root = changed


def test_names_that_each_end_a_part_give_parts_of_one_child_and_change_one_part_at_a_time(trees, monkeypatch):
    split = tree_module.SPLIT_ENTRIES
    names = _names(split + 3, True)
    current = {name: _entry(i) for i, name in enumerate(names[:-1])}
    root = _root_with(trees, current)
    directory = _check(trees, root, current)
    assert trees._node(directory).counts == [1] * len(current)
    written: list[bytes] = []
    put = store_module.Batch.put_bytes
    monkeypatch.setattr(store_module.Batch, "put_bytes",
                        lambda self, data, *a: written.append(data) or put(self, data, *a))
    updates = {names[10]: _entry(77)}
    changed = _change(trees, root, updates)
    assert len(written) == 3, "one part, the index, the root"
    monkeypatch.undo()
    current.update(updates)
    _check(trees, changed, current, root, updates)
    updates = {names[-1]: _entry(5), names[3]: None}  # appended after the last part, one emptied
    again = _change(trees, changed, updates)
    current[names[-1]] = _entry(5)
    del current[names[3]]
    _check(trees, again, current, changed, updates)


def test_a_child_renamed_across_part_boundaries_keeps_the_digest_written_whole(trees):
    """A rename is a removal and an addition in one apply: the name that ended a part goes, a
    name in the next part (or past the last) comes, with real thresholds and ~512-child parts."""
    rng = random.Random(5)
    names = _names(3 * tree_module.SPLIT_ENTRIES, None)
    present = names[:2 * tree_module.SPLIT_ENTRIES + 500]
    current = {name: _entry(i) for i, name in enumerate(present)}
    root = _root_with(trees, current)
    _check(trees, root, current)
    cut_names = [name for name in present if tree_module._ends_part(name)]
    spare = [name for name in names if name not in current]
    for step in range(6):
        gone = cut_names[rng.randrange(len(cut_names))] if step % 2 == 0 else rng.choice(list(current))
        if gone not in current:
            continue
        new = spare.pop(rng.randrange(len(spare)))
        updates = {gone: None, new: current[gone]}
        changed = _change(trees, root, updates)
        current[new] = current.pop(gone)
        _check(trees, changed, current, root, updates)
        root = changed


def test_an_old_whole_node_of_a_large_directory_reads_and_diffs_as_its_split_successor(trees, monkeypatch):
    """A store written before directories were split holds a large directory as one whole node.
    It reads and looks up as before; a diff against the same children stored split finds nothing;
    its next change stores it split, with the digest written whole, and a diff finds that change."""
    names = _names(tree_module.SPLIT_ENTRIES + 700, None)
    current = {name: _entry(i) for i, name in enumerate(names)}
    with monkeypatch.context() as patched:
        patched.setattr(tree_module, "SPLIT_ENTRIES", 10 ** 9)
        old_root = _root_with(Trees(trees.store), current)
    old = trees.lookup(old_root, "d").digest
    assert not is_index(trees.store.read_bytes(old))
    split_root = _root_with(trees, current)
    assert trees.lookup(split_root, "d").digest != old
    fresh = Trees(trees.store)
    assert list(fresh.diff(old_root, split_root)) == [] and list(fresh.diff(split_root, old_root)) == []
    assert fresh.lookup(old_root, f"d/{names[1234]}") == current[names[1234]]
    updates = {names[100]: _entry(5), "zz-new": _entry(6)}
    changed = _change(trees, old_root, updates)
    current.update(updates)
    _check(trees, changed, current, old_root, updates)
    assert {c.path for c in Trees(trees.store).diff(split_root, changed)} == {f"d/{n}" for n in updates}


# -- delta bases found by content -----------------------------------------------------------------


def test_an_object_written_by_two_batches_never_becomes_a_delta_of_its_own_dependent(tmp_path):
    """Two plans capture the same file at once: both batches find it missing (``_known``). While
    the second one compresses it, the first commits it and a third batch stores a near copy as a
    delta of it (a renamed copy, found by content). The second then finds that copy as the best
    base and commits the object as a delta of it: the object and the copy are each other's base."""
    store = ContentStore(tmp_path)
    original = _source("module")
    copy = original + b"# the same module, copied elsewhere and edited\n"
    real_candidates = store._similar.candidates
    interleaved: list[str] = []

    def candidates(found, exclude=""):
        if store._similar.candidates is candidates:  # the other threads run while this batch compresses
            store._similar.candidates = real_candidates
            interleaved.append(_put(store, original))  # the first plan's capture commits
            interleaved.append(_put(store, copy))  # a near copy, stored as a delta of it
            assert store._committed[interleaved[1]].base == interleaved[0]
        return real_candidates(found, exclude)

    store._similar.candidates = candidates
    with store.batch() as batch:
        digest = batch.put_bytes(original)  # the second plan's capture, acknowledged
    assert digest == interleaved[0]
    results = {}
    for name, data in (("original", original), ("copy", copy)):
        try:
            results[name] = store.read_bytes(hashlib.sha256(data).hexdigest()) == data
        except DataLoss as lost:
            results[name] = f"DataLoss: {lost}"
    assert results == {"original": True, "copy": True}
    # The record committed first is kept (the copy is a delta of it at its depth), also on reopen.
    assert store._committed[digest].kind not in store_module.DELTAS
    assert store._committed[interleaved[1]].depth == 1
    store.close()
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(digest) == original and reopened.read_bytes(interleaved[1]) == copy
    assert reopened._committed[digest].kind not in store_module.DELTAS and reopened.damage() == []
    reopened.close()


def test_a_near_copy_after_a_restart_is_stored_whole_and_its_later_base_outlives_a_restart(tmp_path):
    """The similarity index starts empty after a restart: a near copy of an object written before
    is stored whole. A delta found by content afterwards keeps its dependency across the next
    restart: deleting its base there rewrites it whole first."""
    store = ContentStore(tmp_path)
    first = _put(store, _source("alpha"))
    store.close()
    store = ContentStore(tmp_path)
    copy = _source("alpha") + b"# copied after a restart\n"
    copied = _put(store, copy)
    assert store._committed[copied].kind == store_module.ZSTD
    again = copy + b"# and copied again\n"
    found = _put(store, again)
    assert store._committed[found].base == copied
    store.close()
    store = ContentStore(tmp_path)
    with store.collecting():
        store.delete(copied)
        store.delete(first)
        store.compact_all()
    assert store.read_bytes(found) == again and store.damage() == []
    store.close()
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(found) == again and not reopened.has(copied) and reopened.damage() == []
    reopened.close()


@pytest.mark.parametrize("how", ["aborted", "crashed"])
def test_an_object_whose_batch_never_committed_is_never_a_base_until_it_is_stored(tmp_path, how):
    """An object of an aborted batch (a diff's capture) or of a batch cut short before it committed
    is in the similarity index and in the pack, not in the store: it is no base for a near copy.
    After a restart its record may be indexed (a later commit's sync covered it): then it is stored
    whole and may be a base, and deleting it rewrites the copy whole first."""
    store = ContentStore(tmp_path)
    original = _source("beta")
    batch = store.batch()
    lost = batch.put_bytes(original)
    if how == "aborted":
        batch.abort()
    else:
        batch._forget()  # the process dies before the commit: nothing more of this batch runs
    copy = original + b"# a near copy\n"
    copied = _put(store, copy)
    assert store._committed[copied].kind == store_module.ZSTD and not store.has(lost)
    store.close()
    store = ContentStore(tmp_path)
    assert store.read_bytes(copied) == copy
    later = original + b"# another near copy\n"
    again = _put(store, later)
    assert store.read_bytes(again) == later
    if store.has(lost):
        assert store.read_bytes(lost) == original
        with store.collecting():
            store.delete(lost)
            store.compact_all()
    assert store.read_bytes(again) == later and store.read_bytes(copied) == copy
    store.close()
    reopened = ContentStore(tmp_path)
    assert reopened.read_bytes(again) == later and reopened.read_bytes(copied) == copy
    assert reopened.damage() == []
    reopened.close()


def test_a_found_base_deep_in_another_objects_chain_is_collected_under_live_dependents(tmp_path):
    """Plan A's file has a chain of versions; plan B's new file is found like the 5th and becomes a
    delta of it, then has versions of its own. Plan A's checkpoints go: its versions are deleted
    (in a random order) and the packs compacted; every version of B reads back, also reopened."""
    store = ContentStore(tmp_path)
    rng = random.Random(11)
    base = _source("gamma")
    a_versions = [base.replace(b"gamma_%d(" % i, b"gamma_edit_%d(" % i) for i in range(8)]
    a_digests: list[str] = []
    for data in a_versions:
        a_digests.append(_put(store, data, a_digests[-1] if a_digests else ""))
    b_first = a_versions[4] + b"# plan B's copy\n"
    b_digests = [_put(store, b_first)]
    assert store._committed[b_digests[0]].base in a_digests
    b_versions = [b_first]
    for i in range(6):
        b_versions.append(b_versions[-1] + b"# B edit %d\n" % i)
        b_digests.append(_put(store, b_versions[-1], b_digests[-1]))
    order = list(a_digests)
    rng.shuffle(order)
    with store.collecting():
        for digest in order:
            store.delete(digest)
        store.compact_all()
    assert [store.read_bytes(d) for d in b_digests] == b_versions and store.damage() == []
    store.close()
    reopened = ContentStore(tmp_path)
    assert [reopened.read_bytes(d) for d in b_digests] == b_versions and reopened.damage() == []
    reopened.close()


# -- the deepest chains, damaged ------------------------------------------------------------------


def _deep_chain(store: ContentStore) -> tuple[list[bytes], list[str]]:
    """``MAX_DELTA_DEPTH`` + 1 versions, each a delta of the one before, each adding a line of
    random hex (literals in every frame)."""
    rng = random.Random(2)
    versions = [b"".join(b"line %d %s\n" % (i, rng.randbytes(12).hex().encode()) for i in range(200))]
    for i in range(MAX_DELTA_DEPTH):
        lines = versions[-1].split(b"\n")
        lines[i * 11] = b"edited %d %s" % (i, rng.randbytes(16).hex().encode())
        versions.append(b"\n".join(lines))
    digests: list[str] = []
    for data in versions:
        digests.append(_put(store, data, digests[-1] if digests else ""))
    assert [store._committed[d].depth for d in digests] == list(range(MAX_DELTA_DEPTH + 1))
    return versions, digests


def _flip_where_it_still_decodes(store: ContentStore, digest: str, base: bytes | None) -> None:
    """Flips one byte of ``digest``'s stored frame such that it still decodes without an error,
    to other bytes (zstd frames here carry no checksum)."""
    location = store._committed[digest]
    body = location.pack.read(location)
    start = 33 if base is not None else 0
    frame = body[start:]
    original = zstd_decompress(frame, base)
    for offset in range(len(frame) - 1, 12, -1):
        damaged = bytearray(frame)
        damaged[offset] ^= 0x20
        try:
            if zstd_decompress(bytes(damaged), base) != original:
                break
        except Exception:  # noqa: BLE001 - any decoding error: try another byte
            continue
    else:
        pytest.fail("no byte of the frame decodes to other bytes when flipped")
    with open(location.pack.path, "r+b") as f:
        f.seek(location.offset + start + offset)
        f.write(bytes([damaged[offset]]))


@pytest.mark.parametrize("damaged", [0, 8, MAX_DELTA_DEPTH])
def test_a_link_of_a_16_deep_chain_damaged_without_a_decoding_error_is_the_object_named(tmp_path, damaged):
    store = ContentStore(tmp_path)
    versions, digests = _deep_chain(store)
    _flip_where_it_still_decodes(store, digests[damaged], versions[damaged - 1] if damaged else None)
    for reader in (store, ContentStore(tmp_path)):
        for index, digest in enumerate(digests):
            if index < damaged:
                assert reader.read_bytes(digest) == versions[index]
            else:
                with pytest.raises(DataLoss) as raised:
                    reader.read_bytes(digest)
                assert raised.value.metadata["digest"] == digests[damaged]
        # A new version of the damaged one is not built on it: it is stored readably.
        newer = versions[damaged] + b"a version written after the damage\n"
        assert reader.read_bytes(_put(reader, newer, digests[damaged])) == newer


def test_compaction_moving_every_link_while_a_reader_decodes_the_chain(tmp_path, monkeypatch):
    """``gc --compact`` moves the records of a 16-deep chain to a new pack (and the fds of the old
    packs close) just as a reader has found a link in the middle: it reads the right bytes."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 3000)
    store = ContentStore(tmp_path)
    versions, digests = _deep_chain(store)
    for _ in range(3):  # dead records in the chain's packs
        aborted = store.batch()
        aborted.put_bytes(os.urandom(1500))
        aborted.abort()
    packs = {store._committed[d].pack for d in digests}
    assert len(packs) > 1
    compacted: list[tuple[int, int]] = []

    def collect() -> None:
        with store.collecting():
            compacted.append(store.compact_all())

    _when_located(store, monkeypatch, digests[8], collect)
    assert store.read_bytes(digests[-1]) == versions[-1]
    assert compacted and compacted[0][0] >= 1
    monkeypatch.undo()
    reopened = ContentStore(tmp_path)
    assert [reopened.read_bytes(d) for d in digests] == versions and reopened.damage() == []
    reopened.close()


# -- the watcher's quiet period -------------------------------------------------------------------


def test_a_capture_of_another_workspace_during_a_quiet_period_sees_its_changes(tmp_path, monkeypatch):
    """A rollback quiets the one reader every workspace shares; another plan's capture of its own
    workspace syncs and takes every change made there, the reader never having read it."""
    monkeypatch.setattr(watcher_module, "QUIET_SECONDS", 3600.0)
    watcher = watcher_module.Watcher()
    fds = []
    try:
        journals = {}
        for name in ("rolled-back", "other-plan"):
            (tmp_path / name / "sub").mkdir(parents=True)
            root_fd = os.open(tmp_path / name, os.O_RDONLY | os.O_DIRECTORY)
            sub_fd = os.open(tmp_path / name / "sub", os.O_RDONLY | os.O_DIRECTORY)
            fds += [root_fd, sub_fd]
            journal = watcher.journal(str(tmp_path / name), root_fd)
            assert watcher.watch(journal, "", root_fd) and watcher.watch(journal, "sub", sub_fd)
            watcher.take(journal)
            journals[name] = journal
        with watcher.quieted():
            for i in range(50):  # the rollback's writes
                (tmp_path / "rolled-back" / f"f{i}.txt").write_text("restored\n")
            (tmp_path / "other-plan" / "sub" / "edited.txt").write_text("the other plan's edit\n")
            os.mkdir(tmp_path / "other-plan" / "newdir")
            assert watcher.sync()
            changes = watcher.take(journals["other-plan"])
            assert changes.full == ""
            assert {"sub/edited.txt", "newdir"} <= set(changes.dirty)
            assert changes.dirty["newdir"] & watcher_module.SUBTREE
        assert len(watcher.take(journals["rolled-back"]).dirty) == 50
    finally:
        watcher.close()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def test_crc_cut_points_depend_on_the_name_bytes_alone():
    """The cut is computed on the name's file-system bytes: a name that is not UTF-8 (held as
    surrogate escapes) cuts as its bytes say, and the same in every process."""
    name = os.fsdecode(b"caf\xe9-\xff.txt")
    assert tree_module._ends_part(name) is (not zlib.crc32(b"caf\xe9-\xff.txt") & tree_module.PART_MASK)
