"""A file or directory the server creates in a workspace is private to its owner until the server
gives it its mode: a file restored as 0o600 is never, not even while its content is being written
under its temporary name, open to another user (who could open it then and read it later through
that descriptor); a directory is made 0o700 and only then given its mode (a directory the
rollback must still write into keeps its owner's bits until ``set_dir_mode``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace

_OTHERS = stat.S_IRWXG | stat.S_IRWXO


@pytest.fixture(autouse=True)
def _no_umask() -> None:
    """A umask of 0: only the modes the server asks for count, not what the umask takes away."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.parametrize("batched", [False, True])
def test_a_file_is_written_under_a_temporary_name_only_its_owner_can_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: bool) -> None:
    modes: list[int] = []
    real_write = os.write

    def write(fd: int, data) -> int:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            modes.append(stat.S_IMODE(st.st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    workspace = Workspace(str(tmp_path))
    if batched:
        with workspace.batched_sync() as pending:
            workspace.write_file("secret", iter([b"a private ", b"key"]), 0o600)
            pending.flush()
    else:
        workspace.write_file("secret", iter([b"a private ", b"key"]), 0o600)

    assert modes and all(mode & _OTHERS == 0 for mode in modes), f"{[oct(m) for m in modes]}"
    assert (tmp_path / "secret").read_bytes() == b"a private key"
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)] == []


def test_a_directory_is_made_private_then_given_its_mode_with_its_owners_bits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[int] = []
    real_fchmod = os.fchmod

    def fchmod(fd: int, mode: int) -> None:
        created.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", fchmod)
    workspace = Workspace(str(tmp_path))

    workspace.make_dir("shared", 0o775)
    workspace.make_dir("read-only", 0o555)

    assert created == [0o700, 0o700], "a directory was open to others before its mode was set"
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o775
    assert stat.S_IMODE((tmp_path / "read-only").stat().st_mode) == 0o755, \
        "the rollback writes into it next: it keeps its owner's bits until set_dir_mode"
    monkeypatch.setattr(os, "fchmod", real_fchmod)
    workspace.set_dir_mode("read-only", 0o555)
    assert stat.S_IMODE((tmp_path / "read-only").stat().st_mode) == 0o555
    (tmp_path / "read-only").chmod(0o755)


def test_an_existing_directory_is_kept_and_given_the_mode(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "kept").write_text("inside")

    Workspace(str(tmp_path)).make_dir("d", 0o750)

    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o750
    assert (tmp_path / "d" / "kept").read_text() == "inside"
