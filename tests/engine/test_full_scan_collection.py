"""A workspace's first full scan runs with garbage collection paused (core.heap) until its batch
is finished, and collection is back on afterwards, whether the scan succeeded or failed. Later
full scans leave the collector alone."""

from __future__ import annotations

import gc

import pytest

from tests.engine.conftest import write


def _populate(root, files: int = 40) -> None:
    for index in range(files):
        write(root / f"dir{index % 4}" / f"file{index}.txt", f"content {index}\n")


def _watch_collection(snapshotter, monkeypatch) -> list[tuple[str, bool]]:
    """Records whether collection is on when the scan starts and when the index is updated."""
    seen: list[tuple[str, bool]] = []
    scan, remember = snapshotter.scan, snapshotter.remember

    def watched_scan(*args, **kwargs):
        seen.append(("scan", gc.isenabled()))
        return scan(*args, **kwargs)

    def watched_remember(batch, indexed, fresh, stale):
        def update(fresh_entries, stale_paths):
            seen.append(("index update", gc.isenabled()))
            update_index(fresh_entries, stale_paths)

        update_index = indexed.update
        monkeypatch.setattr(indexed, "update", update)
        return remember(batch, indexed, fresh, stale)

    monkeypatch.setattr(snapshotter, "scan", watched_scan)
    monkeypatch.setattr(snapshotter, "remember", watched_remember)
    return seen


def test_a_first_scan_and_its_index_update_at_commit_run_with_collection_paused(engines, monkeypatch):
    _populate(engines.root)
    seen = _watch_collection(engines.full.snapshotter, monkeypatch)
    assert gc.isenabled()
    result = engines.capture(engines.full)
    assert result.file_count == 40
    assert seen == [("scan", False), ("index update", False)]
    assert gc.isenabled()


def test_later_full_scans_leave_collection_on(engines, monkeypatch):
    _populate(engines.root)
    engines.capture(engines.full)
    write(engines.root / "dir0" / "new.txt", "new\n")
    seen = _watch_collection(engines.full.snapshotter, monkeypatch)
    result = engines.capture(engines.full)
    assert result.file_count == 41
    assert seen == [("scan", True), ("index update", True)]


def test_collection_is_back_on_after_a_failed_scan(engines, monkeypatch):
    _populate(engines.root)

    def failing_scan(*_args, **_kwargs):
        raise OSError("the disk went away")

    monkeypatch.setattr(engines.full.snapshotter, "scan", failing_scan)
    with pytest.raises(OSError):
        engines.capture(engines.full)
    assert gc.isenabled()
