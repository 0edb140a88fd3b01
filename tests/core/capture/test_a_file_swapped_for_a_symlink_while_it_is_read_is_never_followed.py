"""A file can become a symlink (to anything outside the workspace: a key, another user's file)
between the lstat that found it regular and the open that reads it. The open never follows it:
a checkpoint holding the link target's content under the file's name would both leak that
content and, on rollback, write it into the workspace. A full scan reports such a file skipped
(unreadable; the next capture sees the symlink); a safety capture (``capture_paths``) looks
again and stores the symlink itself. A file that cannot be opened because another process
holds a lease on it is ``Inaccessible`` to a safety capture, never a raw OSError (INTERNAL)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import SKIP_UNREADABLE, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Inaccessible, Workspace
from tests.engine.conftest import write

SECRET = b"outside the workspace: never captured\n"


def _before_open(monkeypatch: pytest.MonkeyPatch, victim: str, action) -> list[str]:
    """The scan's first ``os.open`` of ``victim`` (relative to its directory) runs ``action`` first."""
    real = os.open
    calls: list[str] = []

    def fake(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None and path == victim and not calls:
            calls.append(path)
            action()
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(snapshot_module.os, "open", fake)
    return calls


def _to_outside_link(path: Path, outside: Path):
    def swap() -> None:
        path.unlink()
        os.symlink(outside, path)
    return swap


@pytest.fixture
def setting(tmp_path: Path):
    root, outside = tmp_path / "ws", tmp_path / "secret.txt"
    outside.write_bytes(SECRET)
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=0)
    yield root, outside, store, trees, snapshotter
    snapshotter.close()


@pytest.mark.parametrize("files", [3, 12], ids=["read-inline", "read-by-threads"])
def test_a_full_scan_never_reads_through_a_symlink_swapped_in_for_a_file(
        setting, monkeypatch: pytest.MonkeyPatch, files: int) -> None:
    root, outside, store, trees, snapshotter = setting
    for i in range(files):
        write(root / f"f{i:02}.txt", f"file {i}\n")
    calls = _before_open(monkeypatch, "f01.txt", _to_outside_link(root / "f01.txt", outside))
    workspace = Workspace(str(root))
    with store.batch() as batch:
        result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
    assert calls == ["f01.txt"]
    entries = dict(trees.flatten(result.tree))
    assert "f01.txt" not in entries
    assert [(s.path, s.reason) for s in result.skipped] == [("f01.txt", SKIP_UNREADABLE)]
    assert all(store.read_bytes(e.digest) != SECRET for e in entries.values() if e.kind is EntryKind.FILE)
    assert len(entries) == files - 1


def test_a_safety_capture_stores_the_symlink_swapped_in_for_a_file_not_its_target(
        setting, monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside, store, _trees, snapshotter = setting
    write(root / "d" / "f.txt", "the user's file\n")
    calls = _before_open(monkeypatch, "f.txt", _to_outside_link(root / "d" / "f.txt", outside))
    with store.batch() as batch:
        out = snapshotter.capture_paths(Workspace(str(root)), ["d/f.txt", "d", "missing.txt"], batch)
    assert calls == ["f.txt"]
    assert out["d/f.txt"].kind is EntryKind.SYMLINK and out["d/f.txt"].target == str(outside)
    assert out["d"].kind is EntryKind.DIR and "missing.txt" not in out


@pytest.mark.parametrize("code", [errno.EAGAIN, errno.EACCES], ids=errno.errorcode.get)
def test_a_safety_capture_of_a_file_it_may_not_open_now_is_inaccessible(
        setting, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    root, _outside, store, _trees, snapshotter = setting
    write(root / "f.txt", "held by another process\n")

    def refused() -> None:
        raise OSError(code, os.strerror(code))

    _before_open(monkeypatch, "f.txt", refused)
    with pytest.raises(Inaccessible), store.batch() as batch:
        snapshotter.capture_paths(Workspace(str(root)), ["f.txt"], batch)
