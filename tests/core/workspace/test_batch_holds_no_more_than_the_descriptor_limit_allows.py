"""A batch holds the files a rollback replaced or removed (``SyncBatch.release_later``) within the
process's descriptor limit: with no limit it holds up to ``MAX_HELD`` of them; under a tight limit
only a small part of the descriptors still free, so that holding them never leaves the process
short of descriptors for its own work; where the limit cannot be read, none."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace.syncbatch import SyncBatch


def _held_until_refused(batch: SyncBatch, limit: int) -> int:
    """How many 1-byte files ``batch`` agrees to hold, asking up to ``limit`` times."""
    held = 0
    while held < limit and batch.may_hold(1):
        batch.release_later(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), 1)
        held += 1
    return held


def _with_limit(monkeypatch: pytest.MonkeyPatch, soft: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (soft, hard) if which == resource.RLIMIT_NOFILE else (0, 0))


def test_without_a_descriptor_limit_a_batch_holds_up_to_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_limit(monkeypatch, resource.RLIM_INFINITY)
    batch = SyncBatch()
    try:
        assert _held_until_refused(batch, syncbatch.MAX_HELD + 1) == syncbatch.MAX_HELD
    finally:
        batch.close()
        syncbatch.wait_for_releases()


def test_under_a_tight_descriptor_limit_a_batch_holds_a_quarter_of_what_is_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What the process has open, what a batch may itself keep pending, a margin, and 40 more.
    in_use = len(os.listdir("/proc/self/fd"))
    _with_limit(monkeypatch, in_use + syncbatch.MAX_PENDING + 64 + 40)
    batch = SyncBatch()
    try:
        held = _held_until_refused(batch, syncbatch.MAX_HELD + 1)
    finally:
        batch.close()
        syncbatch.wait_for_releases()
    # 40 free descriptors: about 10 held (another thread may open or close one meanwhile).
    assert 8 <= held <= 11, held


def test_where_the_descriptors_in_use_cannot_be_counted_a_batch_holds_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_listdir = os.listdir

    def listdir(path=".") -> list[str]:
        if path == "/proc/self/fd":
            raise FileNotFoundError(path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    batch = SyncBatch()
    try:
        assert not batch.may_hold(1)
    finally:
        batch.close()


def test_a_batch_holds_files_up_to_a_size_each_and_a_total(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syncbatch, "MAX_HELD_SIZE", 6)
    monkeypatch.setattr(syncbatch, "MAX_HELD_BYTES", 10)
    batch = SyncBatch()
    try:
        assert batch.may_hold(6) and not batch.may_hold(7), "each file up to MAX_HELD_SIZE"
        batch.release_later(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), 6)
        assert batch.may_hold(4) and not batch.may_hold(5), "up to MAX_HELD_BYTES in all"
        assert batch.release_held_now() and not batch.release_held_now(), "released, nothing is held any more"
        batch.release_later(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), 6)
        assert batch.may_hold(4) and not batch.may_hold(5), "released, it may hold as much again"
    finally:
        batch.close()
