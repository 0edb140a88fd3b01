"""A directory the workspace creates or removes that is something else at that path (a file, or a
symlink, which is never followed) is refused as an ``UnsafePath`` (the rollback then stops and
takes back what it changed), and what stands there, or what a symlink points at, is left alone.
A root that is no longer an accessible directory is WORKSPACE_UNAVAILABLE, saying why."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.kernel.errors import FailedPrecondition
from checkpointd.core.workspace import beneath
from checkpointd.core.workspace import workspace as workspace_module
from checkpointd.core.workspace.workspace import Inaccessible, UnsafePath, Workspace


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "file").write_text("a file")
    (tmp_path / "outside").mkdir(mode=0o700)
    (root / "link").symlink_to(tmp_path / "outside")
    return root


@pytest.mark.parametrize("path", ["file", "link"])
def test_a_directory_is_not_made_where_something_else_is(tree: Path, path: str) -> None:
    with pytest.raises(UnsafePath):
        Workspace(str(tree)).make_dir(path, 0o755)
    assert (tree / "file").read_text() == "a file" and (tree / "link").is_symlink()
    assert stat.S_IMODE((tree.parent / "outside").stat().st_mode) == 0o700, "the link was followed"


@pytest.mark.parametrize("path", ["file", "link"])
def test_a_directory_is_not_removed_where_something_else_is(tree: Path, path: str) -> None:
    with pytest.raises(UnsafePath):
        Workspace(str(tree)).remove_empty_dir(path)
    assert (tree / "file").read_text() == "a file" and (tree / "link").is_symlink()
    assert (tree.parent / "outside").is_dir()


def test_an_empty_directory_is_removed_and_a_full_or_missing_one_reported(tree: Path) -> None:
    (tree / "empty").mkdir()
    (tree / "full").mkdir()
    (tree / "full" / "f").write_text("kept")
    workspace = Workspace(str(tree))
    assert workspace.remove_empty_dir("empty") is True and not (tree / "empty").exists()
    assert workspace.remove_empty_dir("full") is False and (tree / "full" / "f").read_text() == "kept"
    assert workspace.remove_empty_dir("missing") is True


def test_a_root_that_became_a_symlink_or_went_is_unavailable_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real" / "ws").mkdir(parents=True)
    (tmp_path / "above").symlink_to(tmp_path / "real")
    with pytest.raises(FailedPrecondition, match="not an accessible directory"), \
            Workspace(str(tmp_path / "above" / "ws")).root_fd():
        pass
    with pytest.raises(FailedPrecondition, match="not an accessible directory: No such file or directory"), \
            Workspace(str(tmp_path / "gone")).root_fd():
        pass

    def walk_refused(path: str) -> int:  # what a walk meets where a kernel reports the link as ELOOP
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    monkeypatch.setattr(beneath, "_syscall", None)
    monkeypatch.setattr(workspace_module, "_open_no_symlinks", walk_refused)
    with pytest.raises(FailedPrecondition, match="not an accessible directory: a component is now a symlink"), \
            Workspace(str(tmp_path / "above" / "ws")).root_fd():
        pass


def test_a_directory_moved_away_just_before_the_change_is_refused_as_unsafe(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)

    def move_away(_dir_fd: int, _name: str) -> None:
        (root / "d").rename(tmp_path / "moved")

    with pytest.raises(UnsafePath):
        Workspace(str(root)).write_file("d/f", iter([b"new"]), 0o644, move_away)
    assert list((tmp_path / "moved").iterdir()) == [], "written into a directory that left the root"


def test_running_short_of_descriptors_just_before_the_change_is_passed_on_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """So that a batched write's retry (which releases the files the batch holds) sees it."""
    (tmp_path / "d").mkdir()
    workspace = Workspace(str(tmp_path))
    real_open_dir = workspace._open_dir
    calls: list[str] = []

    def short_the_second_time(path: str) -> int:
        calls.append(path)
        if len(calls) == 2:  # _still_at's, right before the rename
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open_dir(path)

    monkeypatch.setattr(workspace, "_open_dir", short_the_second_time)
    with pytest.raises(OSError) as raised:
        workspace.write_file("d/f", iter([b"new"]), 0o644)
    assert raised.value.errno == errno.EMFILE and not isinstance(raised.value, UnsafePath)
    assert calls == ["d", "d"] and list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("read", ["lstat", "listdir"])
def test_a_path_the_server_may_not_read_is_inaccessible_not_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str) -> None:
    (tmp_path / "d").mkdir()
    real = getattr(os, read)

    def denied(path, *args, **kwargs):
        if path in ("f", "d") or isinstance(path, int):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, read, denied)
    with pytest.raises(Inaccessible) as raised:
        getattr(Workspace(str(tmp_path)), read)("d/f" if read == "lstat" else "d")
    assert raised.value.cause.errno == errno.EACCES


def test_running_short_of_descriptors_at_the_root_is_passed_on_not_called_unavailable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def short(path: str) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), path)

    monkeypatch.setattr(beneath, "_syscall", None)
    monkeypatch.setattr(workspace_module, "_open_no_symlinks", short)
    with pytest.raises(OSError) as raised, Workspace(str(tmp_path)).root_fd():
        pass
    assert raised.value.errno == errno.EMFILE and not isinstance(raised.value, FailedPrecondition)
