"""A read-only directory the server owns gets its owner's write bit for a change among its entries
(a window) whatever group it belongs to: the group matters only for a setgid directory, whose
setgid bit a chmod by someone outside its group clears (that one is never chmod-ed: see
test_a_directory_the_server_does_not_own_is_never_chmod_ed). A directory of another group
without that bit is chmod-ed and set back exactly like one of the server's own group; refusing it
would leave a server that is not root unable to roll back into its own read-only directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import Workspace

_STRANGER_GROUP = 54321  # a gid the server is not in

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another group")


@pytest.fixture
def dir_chmods(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(inode, mode) of every fchmod made on a directory."""
    calls: list[tuple[int, int]] = []
    real_fchmod = os.fchmod

    def fchmod(fd: int, mode: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            calls.append((st.st_ino, mode))
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", fchmod)
    return calls


@pytest.mark.parametrize("mode", [0o555, 0o1555, 0o4555], ids=["plain", "sticky", "setuid"])
def test_a_read_only_directory_of_another_group_without_setgid_gets_its_window(
        tmp_path: Path, dir_chmods: list, mode: int) -> None:
    assert _STRANGER_GROUP not in os.getgroups() and os.getegid() != _STRANGER_GROUP
    theirs = tmp_path / "another-group"
    theirs.mkdir()
    os.chown(theirs, os.geteuid(), _STRANGER_GROUP)
    theirs.chmod(mode)
    try:
        workspace = Workspace(str(tmp_path))
        workspace.write_file("another-group/f", iter([b"new"]), 0o644)
        workspace.remove("another-group/f")

        ino = theirs.stat().st_ino
        assert [m for i, m in dir_chmods if i == ino] == [mode | stat.S_IWUSR, mode] * 2, \
            f"no window for each change: {dir_chmods}"
        assert stat.S_IMODE(theirs.stat().st_mode) == mode
        assert not (theirs / "f").exists()
    finally:
        theirs.chmod(0o755)
