"""The garbage-collector pause around full scans (core.heap): collection is off while any pause
is open, back as it was after the last one, and a pause that allocated much ends with one full
collection (so no cyclic garbage is kept) and the survivors frozen."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest

from checkpointd.core.kernel import heap


class Node:
    def __init__(self) -> None:
        self.partner: Node | None = None


@contextlib.contextmanager
def paused_collection() -> Iterator[None]:
    heap.pause()
    try:
        yield
    finally:
        heap.resume()


@pytest.fixture(autouse=True)
def _collector_restored():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_collection_is_off_until_the_last_of_nested_pauses_ends():
    gc.enable()
    with paused_collection():
        assert not gc.isenabled()
        heap.pause()
        heap.resume()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with paused_collection():
        pass
    assert not gc.isenabled()


def test_resume_without_pause_is_refused():
    with pytest.raises(RuntimeError):
        heap.resume()


def _cycle() -> weakref.ref:
    first, second = Node(), Node()
    first.partner, second.partner = second, first
    return weakref.ref(first)


def test_a_pause_that_allocated_much_collects_its_cycles_and_freezes_the_survivors():
    frozen_before = gc.get_freeze_count()
    with paused_collection():
        garbage = _cycle()
        survivors = [Node() for _ in range(heap.FREEZE_AFTER_ALLOCATIONS + 1000)]
        assert garbage() is not None  # unreachable, but nothing collected it yet
    assert garbage() is None
    assert gc.get_freeze_count() >= frozen_before + len(survivors)


def test_a_small_pause_leaves_its_objects_to_ordinary_collections():
    gc.collect()
    frozen_before = gc.get_freeze_count()
    with paused_collection():
        survivors = [Node() for _ in range(100)]
    assert gc.get_freeze_count() == frozen_before
    assert len(survivors) == 100


def test_freezing_the_startup_heap_collects_first():
    garbage = _cycle()
    heap.freeze_startup_heap()
    assert garbage() is None
    assert gc.get_freeze_count() > 0
