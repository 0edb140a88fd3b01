"""How a rollback's writes reach their directories (issue 21: a rollback of a hundred files spent
about a seventh of its time walking from ``/`` again for every file):

- a directory is reached from ``/`` with one openat2(2) (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
  where the kernel has it, else by the old walk; both refuse a symlink at any component, and
  every path is resolved anew, so a directory swapped mid-batch is never followed (what a
  directory moved during one change must not receive is tested in
  ``tests/core/restore/test_rollback_write_path_attacked.py``);
- a replaced or removed small file is held open until the batch ends and released on a thread
  of its own, so the kernel frees it off the rollback's path; nothing stays held after.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from checkpointd.core.kernel.errors import FailedPrecondition
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.restore.restorer import Restorer
from checkpointd.core.store.tree import Entry, EntryKind
from checkpointd.core.workspace import beneath, syncbatch
from checkpointd.core.workspace.workspace import UnsafePath, Workspace
from tests.helpers import descriptors_under


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with openat2 and with the walk a kernel without it gets."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_syscall", None)
    return request.param


def _open_fds() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"))


def _deleted_files_held(root: Path) -> list[str]:
    """Names of files under ``root`` that this process holds open though their last link is gone."""
    return [Path(target.removesuffix(" (deleted)")).name for target in descriptors_under(root)
            if target.startswith(f"{root}/") and target.endswith(" (deleted)")]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for directory in ("a/b/c", "d"):
        (root / directory).mkdir(parents=True)
    (root / "a/file").write_text("not a directory\n")
    (root / "link").symlink_to("a")
    (root / "a/b/up").symlink_to(tmp_path)
    return root


def test_openat2_is_what_this_machine_uses(tree: Path) -> None:
    """The machines this runs on have Linux 5.6 or newer: the fast path must be the one taken."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = beneath.open_dir(fd, str(tree / "a/b").lstrip("/"))
        assert found is not None, "openat2 is not used on this machine"
        assert os.fstat(found).st_ino == (tree / "a/b").stat().st_ino
        os.close(found)
    finally:
        os.close(fd)


def test_a_directory_below_the_root_is_reached_without_following_a_link(tree: Path, resolution: str) -> None:
    workspace = Workspace(str(tree))
    for path in ("", "a", "a/b", "a/b/c", "d"):
        with workspace.dir_fd(path) as fd:
            assert os.fstat(fd).st_ino == (tree / path).stat().st_ino, path
    for unsafe in ("link", "link/b", "a/file", "a/file/x", "a/b/up", "a/b/up/ws"):
        with pytest.raises(UnsafePath), workspace.dir_fd(unsafe):
            pass
    with pytest.raises(FileNotFoundError), workspace.dir_fd("a/missing/x"):
        pass


def test_a_root_under_a_symlink_is_refused(tmp_path: Path, resolution: str) -> None:
    (tmp_path / "real" / "ws").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    with pytest.raises(FailedPrecondition), Workspace(str(tmp_path / "alias" / "ws")).dir_fd(""):
        pass
    with pytest.raises(FailedPrecondition), Workspace(str(tmp_path / "alias")).dir_fd(""):
        pass


def _failing_syscall(error: int, calls: list[int]):
    def call(*_args) -> int:
        calls.append(error)
        ctypes.set_errno(error)
        return -1
    return call


def test_a_kernel_without_openat2_walks_from_then_on(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(beneath, "_syscall", _failing_syscall(errno.ENOSYS, calls))
    workspace = Workspace(str(tree))
    for _ in range(3):
        with workspace.dir_fd("a/b/c") as fd:
            assert os.fstat(fd).st_ino == (tree / "a/b/c").stat().st_ino
        with pytest.raises(UnsafePath), workspace.dir_fd("link/b"):
            pass
    assert calls == [errno.ENOSYS], "openat2 was asked again after the kernel said it has none"


def test_a_sandbox_that_refuses_openat2_walks_that_path_and_asks_again(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(beneath, "_syscall", _failing_syscall(errno.EPERM, calls))
    workspace = Workspace(str(tree))
    with workspace.dir_fd("a/b") as fd:
        assert os.fstat(fd).st_ino == (tree / "a/b").stat().st_ino
    with pytest.raises(UnsafePath), workspace.dir_fd("link/b"):
        pass
    assert len(calls) >= 2


def test_a_directory_swapped_for_a_symlink_during_a_batch_is_never_written_through(
        tmp_path: Path, resolution: str) -> None:
    root = tmp_path / "ws"
    (root / "a").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = Workspace(str(root))
    with workspace.batched_sync() as pending:
        workspace.write_file("a/x", iter([b"first"]), 0o644)
        (root / "a").rename(tmp_path / "moved-away")
        (root / "a").symlink_to(outside)
        with pytest.raises(UnsafePath):
            workspace.write_file("a/y", iter([b"second"]), 0o644)
        with pytest.raises(UnsafePath):
            workspace.remove("a/x")
        pending.flush()
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "moved-away").iterdir()) == ["x"]


def _stored(restorer: Restorer, content: bytes) -> Entry:
    with restorer.store.batch() as batch:
        digest = batch.put_bytes(content)
    return Entry(EntryKind.FILE, 0o644, len(content), digest)


def test_a_replaced_or_removed_file_is_held_until_the_batch_ends_then_released(
        tmp_path: Path, resolution: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for name in ("replaced", "removed", "linked", "big"):
        (root / name).write_bytes(b"old " + name.encode())
    os.link(root / "linked", tmp_path / "second-name")
    (root / "big").write_bytes(b"x" * (syncbatch.MAX_HELD_SIZE + 1))
    syncbatch.wait_for_releases()
    before = _open_fds()
    workspace = Workspace(str(root))
    with workspace.batched_sync() as pending:
        workspace.write_file("replaced", iter([b"new"]), 0o644)
        workspace.remove("removed")
        workspace.write_file("linked", iter([b"new"]), 0o644)
        workspace.write_file("big", iter([b"new"]), 0o644)
        held = _deleted_files_held(root)
        pending.flush()
    assert sorted(held) == ["removed", "replaced"], \
        "a small file whose last link went is held; one with another name or over the size is not"
    syncbatch.wait_for_releases()
    assert _open_fds() == before, "a held file was never released"
    assert (tmp_path / "second-name").read_bytes() == b"old linked"


def test_a_replacement_stopped_by_its_check_holds_nothing(tmp_path: Path, resolution: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f").write_bytes(b"old")
    syncbatch.wait_for_releases()
    before = _open_fds()

    def changed(_dir_fd: int, name: str) -> None:
        raise restorer_module.Changed(name, "was written meanwhile")

    workspace = Workspace(str(root))
    with workspace.batched_sync():
        with pytest.raises(restorer_module.Changed):
            workspace.write_file("f", iter([b"new"]), 0o644, changed)
        with pytest.raises(restorer_module.Changed):
            workspace.remove("f", changed)
    syncbatch.wait_for_releases()
    assert _open_fds() == before
    assert (root / "f").read_bytes() == b"old" and sorted(p.name for p in root.iterdir()) == ["f"]


def test_no_more_files_are_held_than_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syncbatch, "MAX_HELD", 3)
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(8):
        (root / f"f{i}").write_bytes(b"old")
    workspace = Workspace(str(root))
    with workspace.batched_sync():
        for i in range(8):
            workspace.write_file(f"f{i}", iter([b"new"]), 0o644)
        assert len(_deleted_files_held(root)) == 3
    syncbatch.wait_for_releases()
    assert _deleted_files_held(root) == []


def test_an_interrupted_openat2_is_asked_again(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = beneath._syscall
    calls: list[int] = []

    def interrupted_once(*args) -> int:
        if not calls:
            calls.append(errno.EINTR)
            ctypes.set_errno(errno.EINTR)
            return -1
        calls.append(0)
        return real(*args)

    monkeypatch.setattr(beneath, "_syscall", interrupted_once)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = beneath.open_dir(fd, str(tree / "a/b").lstrip("/"))
        assert found is not None, "an interrupted call was taken for a kernel without openat2"
        assert os.fstat(found).st_ino == (tree / "a/b").stat().st_ino
        os.close(found)
    finally:
        os.close(fd)
    assert calls == [errno.EINTR, 0] and beneath._syscall is interrupted_once


def test_a_path_openat2_refuses_is_reported_with_its_errno(tree: Path) -> None:
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for path, error in (("link/b", errno.ELOOP), ("a/file", errno.ENOTDIR), ("a/missing", errno.ENOENT)):
            with pytest.raises(OSError) as raised:
                beneath.open_dir(fd, str(tree / path).lstrip("/"))
            assert raised.value.errno == error, path
    finally:
        os.close(fd)


def test_where_openat2_cannot_be_called_the_walk_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoSyscall:
        def __init__(self, *_args, **_kwargs) -> None:
            pass

    monkeypatch.setattr(beneath.ctypes, "CDLL", NoSyscall)
    assert beneath._load() is None, "a C library without syscall()"
    monkeypatch.undo()
    monkeypatch.setattr(beneath.platform, "system", lambda: "FreeBSD")
    assert beneath._load() is None
    monkeypatch.setattr(beneath.platform, "system", lambda: "Linux")
    monkeypatch.setattr(beneath.platform, "machine", lambda: "alpha")
    assert beneath._load() is None, "alpha numbers its system calls apart"
    monkeypatch.setattr(beneath.platform, "machine", lambda: "x86_64")
    assert beneath._load() is not None


def test_a_workspace_reaches_its_directories_with_openat2_where_the_kernel_has_it(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the one taken, not a walk after a failed openat2 (issue 21): no component
    is opened on its own, and ``/`` is opened once for the process, not per call."""
    workspace = Workspace(str(tree))
    with workspace.dir_fd("a/b"):
        pass
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, mode=0o777, *, dir_fd=None):
        opened.append(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", counting_open)
    for path in ("", "a", "a/b/c", "d"):
        with workspace.dir_fd(path) as fd:
            assert os.fstat(fd).st_ino == (tree / path).stat().st_ino, path
    assert opened == []
