"""What the server's permissions keep it from looking at is reported skipped (unreadable) with
the size it knows, never left out silently: an entry of a directory it may list but not search
(no stat: size 0), a directory it may not open (size 0), a file it may not read (its size from
the walk's stat), a symlink whose target it cannot read (size 0). A rollback to such a
checkpoint keeps these paths as they are then."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import SKIP_UNREADABLE, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.core.capture.full_scan import full_scan
from tests.core.restore.test_rollback_write_path_attacked import as_plain_owner
from tests.engine.conftest import write


def test_entries_the_server_may_not_stat_open_or_read_are_reported_with_what_it_knows(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root / "listable" / "a.txt", "a\n")
    write(root / "listable" / "b.txt", "bb\n")
    write(root / "closed" / "c.txt", "c\n")
    write(root / "private.txt", "private\n" * 3)
    write(root / "open.txt", "open\n")
    os.chmod(root / "listable", 0o444)
    os.chmod(root / "closed", 0)
    os.chmod(root / "private.txt", 0)
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), workers=1, reader_processes=0)
    workspace = Workspace(str(root))
    try:
        with as_plain_owner(), store.batch() as batch:
            # Few files per directory: read by this thread, which lacks the override capabilities.
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
    finally:
        snapshotter.close()
        for path in ("listable", "closed", "private.txt"):
            os.chmod(root / path, 0o755)
    assert sorted((s.path, s.size, s.reason) for s in result.skipped) == [
        ("closed", 0, SKIP_UNREADABLE), ("listable/a.txt", 0, SKIP_UNREADABLE),
        ("listable/b.txt", 0, SKIP_UNREADABLE), ("private.txt", len("private\n" * 3), SKIP_UNREADABLE)]
    entries = dict(trees.flatten(result.tree))
    assert entries["open.txt"].kind is EntryKind.FILE and entries["listable"].kind is EntryKind.DIR
    assert "private.txt" not in entries and "closed/c.txt" not in entries


def test_a_symlink_whose_target_cannot_be_read_is_reported_unreadable(tmp_path: Path, monkeypatch) -> None:
    """readlink failing with the entry still a symlink (EIO from a failing disk, say)."""
    root = tmp_path / "ws"
    write(root / "a.txt", "a\n")
    os.symlink("a.txt", root / "link")
    real = os.readlink

    def failing(path, *args, dir_fd=None, **kwargs):
        if dir_fd is not None and path == "link":
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real(path, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(snapshot_module.os, "readlink", failing)
    store, trees, result = full_scan(tmp_path / "store", root)
    assert [(s.path, s.size, s.reason) for s in result.skipped] == [("link", 0, SKIP_UNREADABLE)]
    assert sorted(path for path, _ in trees.flatten(result.tree)) == ["a.txt"]
