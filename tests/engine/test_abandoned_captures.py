"""Captures whose caller gave up (see ``kernel.cancellation``): they stop at their next check and
leave nothing of theirs behind (the batch is dropped, a large file's staged copy removed, the
reads they started finished before the batch is), and the next capture takes exactly what a full
scan takes: the changes a watched capture had taken from its journal are handed back, and it
builds on the same base unless the stopped capture was a full scan (which drops the watches)."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.capture import capturer as capturer_module
from checkpointd.core.capture import look as look_module
from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.look import LookBatch
from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.kernel.cancellation import CHECK_EVERY, NEVER, Cancellation, Why
from checkpointd.core.kernel.errors import Cancelled, DeadlineExceeded, Kind, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.store import content_store as content_store_module
from checkpointd.core.store import db_store as db_store_module
from checkpointd.core.store.db_store import open_store
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


def _populate(root: Path, dirs: int = 6, files: int = 8) -> None:
    for d in range(dirs):
        for f in range(files):
            write(root / f"pkg{d}" / f"sub{d % 3}" / f"file{f}.txt", f"content {d} {f}\n")


def test_a_token_is_set_once_and_raises_what_its_caller_gave_up_for():
    cancel = Cancellation()
    cancel.check()
    assert not cancel.requested and cancel.seconds_since() == 0
    cancel.cancel(Why.DEADLINE_EXCEEDED)
    cancel.cancel(Why.CANCELLED)  # the first reason wins
    assert cancel.requested and cancel.why is Why.DEADLINE_EXCEEDED
    with pytest.raises(DeadlineExceeded) as raised:
        cancel.check()
    assert raised.value.kind is Kind.DEADLINE_EXCEEDED and raised.value.reason is Reason.CALL_ABANDONED
    other = Cancellation()
    other.cancel()
    with pytest.raises(Cancelled) as raised:
        other.check()
    assert raised.value.kind is Kind.CANCELLED and not isinstance(raised.value, DeadlineExceeded)
    with pytest.raises(TypeError):
        NEVER.cancel()
    NEVER.check()


def test_an_incremental_capture_given_up_on_hands_back_what_it_took_and_the_next_is_exact(engines, monkeypatch):
    _populate(engines.root)
    engines.check(expect="full")
    edited = [f"pkg{d}/sub{d % 3}/file0.txt" for d in range(6)]
    for path in edited:
        write(engines.root / path, "edited, longer than before\n")
    cancel = Cancellation()
    read: list[str] = []
    real = capturer_module.read_file

    def read_then_give_up(dir_fd, name, *rest):
        read.append(name)
        cancel.cancel(Why.DEADLINE_EXCEEDED)  # the caller gives up while the first edited file is read
        return real(dir_fd, name, *rest)

    monkeypatch.setattr(capturer_module, "read_file", read_then_give_up)
    with pytest.raises(DeadlineExceeded), engines.store.batch() as batch:
        batch.cancel = cancel
        engines.watched.capture(Workspace(str(engines.root)), [], [], engines.max_size, batch)
    monkeypatch.undo()
    assert read == ["file0.txt"], "the capture stopped at the next dirty path"
    [journal] = engines.watcher.journals()
    assert set(edited) <= set(journal.dirty), "the dirty paths the capture took are the journal's again"
    # The base it would have built on is kept: a rollback given up on does not make the next
    # checkpoint of a large workspace a full scan.
    result = engines.check(expect="incremental")
    assert result.file_count == 48


def test_a_full_scan_given_up_on_after_its_watches_were_dropped_leaves_no_base(engines):
    """A full scan drops the workspace's watches and adds them back as it walks: stopped before
    it walked everything, it leaves directories unwatched, so what changes in them meanwhile is
    seen by no event. The base is dropped with the watches: the next capture scans in full."""
    _populate(engines.root)
    engines.check(expect="full")
    write(engines.root / "pkg1" / "sub1" / "file1.txt", "edited: an incremental capture builds the base\n")
    engines.check(expect="incremental")
    cancel = Cancellation()
    cancel.cancel(Why.CANCELLED)
    with pytest.raises(Cancelled), engines.store.batch() as batch:
        batch.cancel = cancel
        # Other ignore patterns than the base's: a full scan, stopped at its first directory.
        engines.watched.capture(Workspace(str(engines.root)), ["*.tmp"], [], engines.max_size, batch)
    write(engines.root / "pkg4" / "sub1" / "unseen.txt", "written while pkg4 had no watch\n")
    result = engines.check(expect="full")  # the base's patterns again
    assert result.file_count == 48 + 1


def test_a_full_scan_given_up_on_stops_within_a_directory_and_the_next_is_exact(engines, monkeypatch):
    """A directory of many files is given up on while its entries are looked at: the scan stops
    within ``CHECK_EVERY`` of them (before any of their reads), and the next capture is exact."""
    for f in range(3 * CHECK_EVERY):
        write(engines.root / "many" / f"f{f:04}.txt", f"file {f}\n")
    _populate(engines.root, dirs=2, files=2)
    cancel = Cancellation()
    stats: list[str] = []
    real_scandir = os.scandir

    class Listing:
        """os.scandir, whose entries' stats are counted (see ``_Counted``)."""

        def __init__(self, fd: int) -> None:
            self.entries = real_scandir(fd)

        def __enter__(self) -> Listing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.entries.close()

        def __iter__(self) -> Iterator[_Counted]:
            for entry in self.entries:
                yield _Counted(entry, stats, cancel)

    patched_os = types.ModuleType("os")
    patched_os.__dict__.update(os.__dict__)
    patched_os.scandir = Listing
    monkeypatch.setattr(snapshot_module, "os", patched_os)
    with pytest.raises(Cancelled), engines.store.batch() as batch:
        batch.cancel = cancel
        engines.watched.capture(Workspace(str(engines.root)), [], [], engines.max_size, batch)
    monkeypatch.undo()
    many = [name for name in stats if name.startswith("f0")]
    assert 0 < len(many) <= CHECK_EVERY, len(many)
    engines.check(expect="full")


class _Counted:
    """A directory entry whose stat is counted; the caller gives up at the first file of "many"."""

    def __init__(self, entry: os.DirEntry, stats: list[str], cancel: Cancellation) -> None:
        self._entry = entry
        self._stats = stats
        self._cancel = cancel
        self.name = entry.name
        self.path = entry.path

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_dir(follow_symlinks=follow_symlinks)

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_file(follow_symlinks=follow_symlinks)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        self._stats.append(self.name)
        if self.name.startswith("f0"):
            self._cancel.cancel()
        return self._entry.stat(follow_symlinks=follow_symlinks)


@pytest.fixture(params=["disk", "db", "look"])
def batches(request, tmp_path: Path) -> Iterator:
    """A store, and how a capture's batch is made in it (a look wraps the store's batch)."""
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    store = open_store("db" if request.param == "db" else "disk", db, tmp_path)
    try:
        yield store, (lambda: LookBatch(store.batch())) if request.param == "look" else store.batch
    finally:
        store.close()
        db.dispose()


def test_a_large_file_stops_being_read_between_its_chunks_and_leaves_nothing_staged(batches, tmp_path: Path,
                                                                                      monkeypatch):
    store, new_batch = batches
    root = tmp_path / "ws"
    write(root / "small.txt", "small\n")
    write(root / "big.bin", os.urandom(8 << 20))
    snapshotter = Snapshotter(store, Trees(store), StatIndex(), reader_processes=0)
    cancel = Cancellation()
    chunks: list[int] = []
    real = content_store_module.read_source_chunk

    def read_chunk(fd: int, *size: int) -> bytes:
        chunks.append(fd)
        cancel.cancel()  # the caller gives up while the first chunk is read
        return real(fd, *size)

    for module in (content_store_module, db_store_module, look_module):
        monkeypatch.setattr(module, "read_source_chunk", read_chunk)
    staged_before = sorted(p.name for p in tmp_path.rglob("*"))
    workspace = Workspace(str(root))
    try:
        with pytest.raises(Cancelled), new_batch() as batch:
            batch.cancel = cancel
            snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 30, batch)
        assert len(chunks) == 1, "the read stopped after the chunk it was reading"
        assert sorted(p.name for p in tmp_path.rglob("*")) == staged_before, "a staged file was left behind"
        monkeypatch.undo()
        with new_batch() as batch:  # a look is dropped whatever happens; a store's batch is committed
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 30, batch)
            assert result.file_count == 2 and result.total_size == (8 << 20) + 6
    finally:
        snapshotter.close()


def test_a_directory_scan_given_up_on_after_its_watches_were_dropped_leaves_no_base(engines, monkeypatch):
    """A directory whose read bits changed is scanned again, its watches dropped and added back
    as the scan walks it. Given up on right after the drop, then changed back (the event says
    only that its mode changed) while a file is written below it (no watch, no event): building
    on the old base would look at the directory's mode alone and miss the file."""
    _populate(engines.root)
    engines.check(expect="full")
    write(engines.root / "pkg1" / "sub1" / "file1.txt", "edited: an incremental capture builds the base\n")
    engines.check(expect="incremental")
    directory = engines.root / "pkg2"
    os.chmod(directory, 0o700)
    cancel = Cancellation()
    real_reset = engines.watcher.reset

    def reset_then_give_up(journal, prefix=""):
        real_reset(journal, prefix)
        cancel.cancel(Why.DEADLINE_EXCEEDED)

    monkeypatch.setattr(engines.watcher, "reset", reset_then_give_up)
    with pytest.raises(DeadlineExceeded), engines.store.batch() as batch:
        batch.cancel = cancel
        engines.watched.capture(Workspace(str(engines.root)), [], [], engines.max_size, batch)
    monkeypatch.undo()
    os.chmod(directory, 0o755)
    write(directory / "sub2" / "unseen.txt", "written while pkg2 had no watch\n")
    result = engines.check(expect="full")
    assert result.file_count == 48 + 1
