"""A read-only directory gets its owner's write bit for a change among its entries only when the
server owns it and the chmod changes nothing else (``Workspace._open_window``): another user's
directory, or a setgid directory of a group the server is not in (whose setgid bit a chmod by a
non-member clears), is never chmod-ed, not even for a moment. (The tests run as root, which
writes into such a directory anyway; a server that is not root fails there, as before windows.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import Workspace

_STRANGER = 54321  # a uid and gid nobody here has

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")


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


def _changes_in(workspace: Workspace, directory: str) -> None:
    workspace.write_file(f"{directory}/f", iter([b"new"]), 0o644)
    workspace.write_symlink(f"{directory}/link", "f")
    workspace.remove(f"{directory}/link")


def test_another_users_read_only_directory_is_never_chmod_ed(tmp_path: Path, dir_chmods: list) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, _STRANGER, _STRANGER)
    theirs.chmod(0o555)

    _changes_in(Workspace(str(tmp_path)), "theirs")

    assert dir_chmods == []
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o555 and (theirs / "f").read_bytes() == b"new"


def test_a_setgid_directory_of_a_group_the_server_is_not_in_is_never_chmod_ed(
        tmp_path: Path, dir_chmods: list) -> None:
    assert _STRANGER not in os.getgroups() and os.getegid() != _STRANGER
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, os.geteuid(), _STRANGER)
    shared.chmod(0o2555)

    _changes_in(Workspace(str(tmp_path)), "shared")

    assert dir_chmods == []
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2555


def test_a_setgid_directory_of_the_servers_own_group_gets_its_window(tmp_path: Path, dir_chmods: list) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    os.chown(ours, os.geteuid(), os.getegid())
    ours.chmod(0o2555)

    _changes_in(Workspace(str(tmp_path)), "ours")

    ino = ours.stat().st_ino
    assert dir_chmods and {mode for i, mode in dir_chmods if i == ino} == {0o2755, 0o2555}
    assert stat.S_IMODE(ours.stat().st_mode) == 0o2555
    ours.chmod(0o755)
