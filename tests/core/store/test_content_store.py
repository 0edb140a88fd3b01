"""Content store: dedup, integrity, durability order."""

from __future__ import annotations

import os
import threading
import time

import pytest

from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.store.content_store import ContentStore, Postponed, SharedExclusiveLock


def test_identical_content_is_stored_once(tmp_path):
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        first = batch.put_bytes(b"same")
        second = batch.put_bytes(b"same")
    assert first == second
    assert list(store.iter_digests()) == [first]


def test_stored_sizes_are_what_each_object_takes_as_stored(tmp_path):
    store = ContentStore(tmp_path)
    random_bytes = os.urandom(5000)
    with store.batch() as batch:
        compressible = batch.put_bytes(b"z" * 100_000)
        raw = batch.put_bytes(random_bytes)
        loose = batch.put_bytes(os.urandom((1 << 20) + 5))
    with store.batch() as batch:
        delta = batch.put_bytes(random_bytes + b"!", similar=raw)  # against a committed base
    staged = store.batch()
    pending = staged.put_bytes(b"not committed")
    sizes = store.stored_sizes([compressible, raw, loose, delta, pending, "0" * 64])
    assert sizes.keys() == {compressible, raw, loose, delta}
    assert 37 < sizes[compressible] < 1000  # a pack record: 37-byte header, zstd body
    assert sizes[raw] == 37 + 5000
    assert sizes[loose] == store.path_of(loose).stat().st_size == 1 + (1 << 20) + 5
    assert 37 < sizes[delta] < 1000  # a delta against raw
    staged.abort()


def test_nothing_is_visible_under_its_final_name_before_commit_and_abort_leaves_nothing(tmp_path):
    store = ContentStore(tmp_path)
    batch = store.batch()
    digest = batch.put_bytes(b"pending")
    assert not store.has(digest)
    assert store.read_bytes(digest) == b"pending"
    batch.abort()
    assert not store.has(digest) and list(store.staging.iterdir()) == []


def test_large_objects_stream_and_round_trip(tmp_path):
    store = ContentStore(tmp_path)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 20000)
    fd = os.open(big, os.O_RDONLY)
    with store.batch() as batch:
        digest, size = batch.put_fd(fd, big.stat().st_size)
    os.close(fd)
    assert size == big.stat().st_size
    assert store.read_bytes(digest) == big.read_bytes()


def test_corruption_of_a_packed_object_is_detected_on_read(tmp_path):
    store = ContentStore(tmp_path)
    payload = bytes(range(256)) * 4
    with store.batch() as batch:
        digest = batch.put_bytes(payload)
    store.close()
    [pack] = list((tmp_path / "packs").iterdir())
    raw = pack.read_bytes()
    offset = raw.index(payload[:64])
    pack.write_bytes(raw[:offset] + bytes([raw[offset] ^ 0xFF]) + raw[offset + 1:])
    with pytest.raises(DataLoss):
        ContentStore(tmp_path).read_bytes(digest)


def test_corruption_or_loss_of_a_large_object_is_detected_on_read(tmp_path):
    store = ContentStore(tmp_path)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 << 20))
    fd = os.open(big, os.O_RDONLY)
    with store.batch() as batch:
        digest, _ = batch.put_fd(fd, big.stat().st_size)
    os.close(fd)
    path = store.path_of(digest)
    path.write_bytes(b"R" + b"tampered")
    with pytest.raises(DataLoss):
        store.read_bytes(digest)
    path.unlink()
    with pytest.raises(DataLoss):
        store.read_bytes(digest)


def test_leftovers_of_an_interrupted_batch_are_cleared_on_open(tmp_path):
    store = ContentStore(tmp_path)
    (store.staging / "half-written").write_bytes(b"x")
    ContentStore(tmp_path)
    assert list(store.staging.iterdir()) == []


@pytest.mark.parametrize("fails", [False, True], ids=["committed", "aborted"])
def test_every_finish_callback_runs_even_after_one_raises(tmp_path, fails):
    store = ContentStore(tmp_path / "store")
    calls = []

    def first(committed):
        calls.append(("first", committed))
        raise RuntimeError("first callback failed")

    with pytest.raises(RuntimeError, match="first callback failed"), store.batch() as batch:
        batch.put_bytes(b"payload")
        batch.when_finished(first)
        batch.when_finished(lambda committed: calls.append(("second", committed)))
        if fails:
            raise ValueError("the capture failed")
    assert calls == [("first", not fails), ("second", not fails)]


def test_a_patient_exclusive_holds_no_one_back_behind_a_holder_that_was_there_all_along():
    """A shared holder that outlasts the whole patience may be stuck: the exclusive side gives
    up, and meanwhile new shared holders come and go as if it were not asking."""
    lock = SharedExclusiveLock()
    came_and_went = []
    with lock.shared():
        def exclusive() -> None:
            with pytest.raises(Postponed), lock.exclusive(patience=0.3):
                pass

        asking = threading.Thread(target=exclusive)
        asking.start()
        while asking.is_alive():
            release = lock.try_shared()
            assert release is not None, "a new holder was held back behind the stuck one"
            release()
            came_and_went.append(1)
            time.sleep(0.01)
    assert came_and_went
    with lock.exclusive(patience=0.3):
        pass


def test_a_patient_exclusive_waits_for_holders_that_came_while_it_was_waiting():
    """Holders younger than the patience are expected to finish: they are waited for, and new
    ones held back meanwhile, so that a busy store is still collected."""
    lock = SharedExclusiveLock()
    entered = threading.Event()
    holders = []

    def hold_briefly() -> None:
        with lock.shared():
            time.sleep(0.05)

    def exclusive() -> None:
        with lock.exclusive(patience=1):
            entered.set()

    asking = threading.Thread(target=exclusive)
    asking.start()
    while not entered.is_set():
        holder = threading.Thread(target=hold_briefly)  # overlapping holders: never a quiet moment
        holder.start()
        holders.append(holder)
        time.sleep(0.02)
    asking.join()
    for holder in holders:
        holder.join()
    assert entered.is_set()
