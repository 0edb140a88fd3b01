"""An entry can change type between the scan's lstat of it and what the scan then does (a
symlink's readlink, a directory's open): the scan looks at it again and captures what it has
become; one that keeps changing is reported (``CHANGED_DURING_CAPTURE``), one that is gone is
absent. Dropped silently, a file there would be neither in the checkpoint nor reported skipped,
and a rollback to that checkpoint would delete it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import ENTRY_ATTEMPTS, SKIP_CHANGING, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.core.capture.full_scan import full_scan
from tests.engine.conftest import write


def _capture(tmp_path: Path, root: Path):
    store, trees, result = full_scan(tmp_path / "store", root)
    entries = {path: (entry.kind, store.read_bytes(entry.digest) if entry.kind is EntryKind.FILE else entry.target)
               for path, entry in trees.flatten(result.tree)}
    return result, entries


def _swapping(monkeypatch: pytest.MonkeyPatch, call: str, victim: str, swap: Callable[[], None],
              times: int = 1) -> list[str]:
    """``os.<call>`` of ``victim`` (relative to its directory) first runs ``swap``, ``times`` times."""
    real = getattr(os, call)
    calls: list[str] = []

    def wrapper(path, *args, dir_fd=None, **kwargs):
        if dir_fd is not None and path == victim and len(calls) < times:
            calls.append(path)
            swap()
        return real(path, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(snapshot_module.os, call, wrapper)
    return calls


def _to_file(path: Path, content: str) -> Callable[[], None]:
    def swap() -> None:
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path)
        path.write_text(content)
    return swap


def _to_dir(path: Path) -> Callable[[], None]:
    def swap() -> None:
        path.unlink()
        write(path / "inside.txt", "inside\n")
    return swap


def _to_symlink(path: Path) -> Callable[[], None]:
    def swap() -> None:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        os.symlink("elsewhere", path)
    return swap


def _removed(path: Path) -> Callable[[], None]:
    def swap() -> None:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return swap


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root / "before.txt", "before\n")
    write(root / "zafter.txt", "after\n")
    os.symlink("before.txt", root / "link")
    write(root / "sub" / "old.txt", "old\n")
    return root


def test_a_symlink_that_becomes_a_file_before_it_is_read_is_captured_as_the_file(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _swapping(monkeypatch, "readlink", "link", _to_file(root / "link", "now a file\n"))
    result, entries = _capture(tmp_path, root)
    assert calls == ["link"]
    assert entries["link"] == (EntryKind.FILE, b"now a file\n") and result.skipped == []


def test_a_symlink_that_becomes_a_directory_before_it_is_read_is_captured_with_its_files(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _swapping(monkeypatch, "readlink", "link", _to_dir(root / "link"))
    result, entries = _capture(tmp_path, root)
    assert entries["link/inside.txt"] == (EntryKind.FILE, b"inside\n") and result.skipped == []


def test_a_directory_that_becomes_a_file_before_it_is_opened_is_captured_as_the_file(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _swapping(monkeypatch, "open", "sub", _to_file(root / "sub", "now a file\n"))
    result, entries = _capture(tmp_path, root)
    assert entries["sub"] == (EntryKind.FILE, b"now a file\n") and result.skipped == []
    assert "sub/old.txt" not in entries


def test_a_directory_that_becomes_a_symlink_before_it_is_opened_is_captured_as_the_link(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _swapping(monkeypatch, "open", "sub", _to_symlink(root / "sub"))
    result, entries = _capture(tmp_path, root)
    assert entries["sub"] == (EntryKind.SYMLINK, "elsewhere") and result.skipped == []


@pytest.mark.parametrize(("call", "victim"), [("readlink", "link"), ("open", "sub")])
def test_an_entry_gone_before_it_is_read_is_absent_and_the_rest_is_captured(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch, call: str, victim: str) -> None:
    _swapping(monkeypatch, call, victim, _removed(root / victim))
    result, entries = _capture(tmp_path, root)
    assert victim not in entries and result.skipped == []
    assert entries["before.txt"] == (EntryKind.FILE, b"before\n") and entries["zafter.txt"] == (
        EntryKind.FILE, b"after\n")


def test_a_symlink_that_keeps_changing_type_is_reported_not_dropped(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lstat finds a symlink, every readlink a file."""
    link = root / "link"
    calls = _swapping(monkeypatch, "readlink", "link", _to_file(link, "a file at readlink time\n"), times=99)
    real_lstat = os.lstat

    def lstat(path, *args, dir_fd=None, **kwargs):
        if dir_fd is not None and path == "link" and not link.is_symlink():
            link.unlink()
            os.symlink("x", link)
        return real_lstat(path, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(snapshot_module.os, "lstat", lstat)
    result, entries = _capture(tmp_path, root)
    assert len(calls) == ENTRY_ATTEMPTS
    assert [(s.path, s.size, s.reason) for s in result.skipped] == [("link", 0, SKIP_CHANGING)]
    assert "link" not in entries and "zafter.txt" in entries


def test_an_entry_gone_between_the_listing_and_its_lstat_is_absent_and_the_rest_is_captured(
        tmp_path: Path, root: Path) -> None:
    """zafter.txt is removed while sub/ (listed before it) is walked."""
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=0)
    workspace = Workspace(str(root))

    def on_dir(path: str, _fd: int) -> None:
        if path == "sub":
            (root / "zafter.txt").unlink()

    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch, on_dir)
    finally:
        snapshotter.close()
    assert result.skipped == []
    assert sorted(path for path, _ in trees.flatten(result.tree)) == ["before.txt", "link", "sub", "sub/old.txt"]
