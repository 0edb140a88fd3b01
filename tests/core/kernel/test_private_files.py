"""checkpointd's own files: made private whatever the umask, tightened when found open, and
nothing else touched (a symlink, another user's file)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.kernel.private_files import private_dir, private_file, private_opener, tighten, tighten_sqlite


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    previous = os.umask(0o002)
    yield
    os.umask(previous)


def test_new_files_and_directories_are_private_whatever_the_umask(tmp_path, open_umask):
    private_dir(tmp_path / "a" / "b", parents=True)
    private_file(tmp_path / "a" / "b" / "db")
    with open(tmp_path / "a" / "staged", "xb", opener=private_opener) as out:
        out.write(b"workspace content")
    assert _mode(tmp_path / "a" / "b") == 0o700
    assert _mode(tmp_path / "a" / "b" / "db") == 0o600
    assert _mode(tmp_path / "a" / "staged") == 0o600
    assert (tmp_path / "a" / "staged").read_bytes() == b"workspace content"


def test_one_found_open_keeps_its_content_and_owner_bits_and_says_so(tmp_path, caplog):
    database = tmp_path / "checkpointd.db"
    database.write_bytes(b"rows")
    database.chmod(0o664)
    (tmp_path / "checkpointd.db-wal").write_bytes(b"wal")
    (tmp_path / "checkpointd.db-wal").chmod(0o644)
    (tmp_path / "store").mkdir(mode=0o775)
    (tmp_path / "store").chmod(0o775)
    with caplog.at_level(logging.WARNING, "checkpointd.files"):
        tighten_sqlite(database)
        private_dir(tmp_path / "store")
    assert (_mode(database), _mode(tmp_path / "checkpointd.db-wal"), _mode(tmp_path / "store")) == (0o600, 0o600, 0o700)
    assert database.read_bytes() == b"rows"
    assert not (tmp_path / "checkpointd.db-shm").exists()
    assert sum("made private" in r.getMessage() for r in caplog.records) == 3


def test_an_owner_read_only_file_stays_read_only(tmp_path):
    kept = tmp_path / "pack"
    kept.write_bytes(b"")
    kept.chmod(0o444)
    assert tighten(kept)
    assert _mode(kept) == 0o400


def test_a_symlink_and_what_it_points_at_are_left_alone(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not ours")
    target.chmod(0o644)
    (tmp_path / "link").symlink_to(target)
    assert not tighten(tmp_path / "link")
    with pytest.raises(FileExistsError):
        os.open(tmp_path / "link", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    private_file(tmp_path / "link")
    assert _mode(target) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_is_left_alone(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"")
    theirs.chmod(0o644)
    os.chown(theirs, 12345, 12345)
    assert not tighten(theirs)
    assert _mode(theirs) == 0o644


def test_a_path_that_is_gone_is_nothing_to_tighten(tmp_path):
    assert not tighten(tmp_path / "gone")


def test_one_that_cannot_be_tightened_is_reported_and_used_as_it_is(tmp_path, monkeypatch, caplog):
    open_file = tmp_path / "checkpointd.db"
    open_file.write_bytes(b"rows")
    open_file.chmod(0o644)

    def refused(*_args, **_kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refused)
    with caplog.at_level(logging.WARNING, "checkpointd.files"):
        assert not tighten(open_file)
        tighten_sqlite(open_file)
    assert _mode(open_file) == 0o644
    assert [r.getMessage() for r in caplog.records] == [
        f"{open_file} is readable by other users and could not be made private: Operation not permitted"] * 2


def test_what_is_made_private_or_found_private_is_left_alone_quietly(tmp_path, open_umask, caplog):
    """Under an open umask, what checkpointd makes is private from the start, and making or opening
    it again changes nothing: the "was open to other users" warning is for what an earlier release
    or a hand left open, never for checkpointd's own new files."""
    store, database = tmp_path / "data" / "store", tmp_path / "data" / "store" / "checkpointd.db"
    with caplog.at_level(logging.DEBUG, "checkpointd.files"):
        private_dir(store, parents=True)
        private_file(database)
        private_dir(store)
        private_file(database)
        tighten_sqlite(database)
        assert not tighten(store)
        assert not tighten(database)
    assert (_mode(store), _mode(database)) == (0o700, 0o600)
    assert [r.getMessage() for r in caplog.records] == []


def test_a_symlink_swapped_in_between_the_look_and_the_change_is_not_followed(tmp_path, monkeypatch):
    """tighten looks at the path (lstat), then changes its mode: a symlink put in its place between
    the two (injected right after the look) must not carry the change to what it points at."""
    outside = tmp_path / "not-checkpointds"
    outside.write_bytes(b"a file checkpointd must not change")
    outside.chmod(0o644)
    database = tmp_path / "checkpointd.db"
    database.write_bytes(b"rows")
    database.chmod(0o644)
    real_lstat = os.lstat
    swapped: list[str] = []

    def lstat_then_swap(path, *args, **kwargs):
        looked = real_lstat(path, *args, **kwargs)
        if not swapped and os.fspath(path) == str(database):
            swapped.append(os.fspath(path))
            os.unlink(database)
            os.symlink(outside, database)
        return looked

    monkeypatch.setattr(os, "lstat", lstat_then_swap)
    changed = tighten(database)
    monkeypatch.undo()
    assert swapped, "tighten did not look at the path"
    assert not changed
    assert _mode(outside) == 0o644
