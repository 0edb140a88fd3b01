"""A reader process that cannot open a file because it ran short of descriptors or memory
(EMFILE, ENFILE, ENOMEM) says nothing of the file: it hands it back for the server to read
(``ELSEWHERE``), which fails the scan if it is short too. Only an error of the file itself (a
permission refused) makes it unreadable. Before, any open error answered "unreadable", and the
checkpoint left a file out that the user could read, so a rollback to it kept that file as it
then was. ``read_task`` is what a reader process runs for each task; the open error is injected."""

from __future__ import annotations

import errno
import os

import pytest

from checkpointd.core.workspace import readworker


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_a_file_a_short_reader_cannot_open_is_handed_back_to_the_server(tmp_path, monkeypatch, code):
    for name in ("before.txt", "victim.txt", "after.txt"):
        (tmp_path / name).write_text(f"the content of {name}\n")
    real_open = os.open

    def open_short(path, flags, mode=0o777, *, dir_fd=None):
        if path == b"victim.txt":
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(readworker.os, "open", open_short)
    dir_fd = real_open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before, victim, after = readworker.read_task(dir_fd, [b"before.txt", b"victim.txt", b"after.txt"], 1 << 20)
    finally:
        os.close(dir_fd)
    assert victim == (readworker.ELSEWHERE,)
    assert before is not None and before[0] not in (readworker.ELSEWHERE, readworker.TOO_LARGE)
    assert after is not None and after[0] not in (readworker.ELSEWHERE, readworker.TOO_LARGE)


def test_a_file_the_reader_may_not_open_is_unreadable(tmp_path, monkeypatch):
    (tmp_path / "secret.txt").write_text("no\n")
    real_open = os.open

    def refused(path, flags, mode=0o777, *, dir_fd=None):
        if path == b"secret.txt":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(readworker.os, "open", refused)
    dir_fd = real_open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert readworker.read_task(dir_fd, [b"secret.txt"], 1 << 20) == [None]
    finally:
        os.close(dir_fd)
