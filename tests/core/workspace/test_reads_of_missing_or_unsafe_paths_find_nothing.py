"""The workspace's reads (``lstat``, ``listdir``, ``read_small``) answer "nothing there" for a path
that is missing, that is not what was asked for, or that is reached through a symlink: they never
follow a link out of the root, never block on a FIFO, never read past their limit."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from checkpointd.core.workspace import beneath
from checkpointd.core.workspace.workspace import Inaccessible, Workspace

#: How long the FIFO test lets a read run before it calls it stuck waiting for a writer.
FIFO_GUARD_S = 20


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_syscall", None)
    return request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside the root")
    (root / "out").symlink_to(outside)
    (root / "link-to-secret").symlink_to(outside / "secret")
    os.mkfifo(root / "fifo")
    return root


def test_listing_a_missing_or_unsafe_directory_finds_nothing(tree: Path, resolution: str) -> None:
    workspace = Workspace(str(tree))
    assert sorted(workspace.listdir("")) == ["d", "fifo", "link-to-secret", "out"]
    assert workspace.listdir("d") == ["f"]
    for path in ("missing", "missing/deeper", "d/f", "out", "fifo"):
        assert workspace.listdir(path) == [], path


def test_lstat_does_not_follow_a_link_and_finds_nothing_through_one(tree: Path, resolution: str) -> None:
    workspace = Workspace(str(tree))
    assert workspace.lstat("d/f").st_size == len("inside")
    assert workspace.lstat("out").st_ino == os.lstat(tree / "out").st_ino
    for path in ("missing", "missing/f", "out/secret", "d/f/x"):
        assert workspace.lstat(path) is None, path


def test_a_small_read_returns_a_regular_files_content_up_to_its_limit(tree: Path, resolution: str) -> None:
    workspace = Workspace(str(tree))
    (tree / "d" / "ten").write_bytes(b"0123456789")
    assert workspace.read_small("d/f") == b"inside"
    assert workspace.read_small("d/ten", 10) == b"0123456789"
    assert workspace.read_small("d/ten", 9) is None, "larger than the limit"
    assert workspace.read_small("d/ten", 11) == b"0123456789"


def test_a_small_read_of_anything_else_finds_nothing(tree: Path, resolution: str) -> None:
    workspace = Workspace(str(tree))
    for path in ("missing", "d", "link-to-secret", "out/secret", "d/f/x"):
        assert workspace.read_small(path) is None, path


def test_a_small_read_of_a_fifo_finds_nothing_and_does_not_wait_for_a_writer(tree: Path, resolution: str) -> None:
    read: list[bytes | None] = []
    reader = threading.Thread(target=lambda: read.append(Workspace(str(tree)).read_small("fifo")), daemon=True)
    reader.start()
    reader.join(FIFO_GUARD_S)  # only a read that waits for a writer gets anywhere near this
    if reader.is_alive():
        os.close(os.open(tree / "fifo", os.O_WRONLY | os.O_NONBLOCK))  # lets it go
        reader.join()
        pytest.fail("read_small waited for a writer to open the FIFO")
    assert read == [None]


def test_a_file_that_grows_while_it_is_read_is_read_no_further_than_the_limit(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tree / "d" / "growing").write_bytes(b"12345")
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if st.st_ino == (tree / "d" / "growing").stat().st_ino:
            with open(tree / "d" / "growing", "ab") as f:
                f.write(b"6789")
        return st

    monkeypatch.setattr(os, "fstat", fstat)
    assert Workspace(str(tree)).read_small("d/growing", 6) == b"123456"


def test_a_path_the_server_may_not_read_is_named_with_why() -> None:
    denied = Inaccessible("d/f", PermissionError(errno.EACCES, "Permission denied"))
    assert str(denied) == "'d/f': Permission denied" and denied.path == "d/f" and denied.cause.errno == errno.EACCES
    assert str(Inaccessible("d/f", PermissionError("no errno"))) == "'d/f': no errno"
