"""syncfs(2) reports a writeback error only from Linux 5.8 on (before, it returns 0 after an I/O
error, and a batch synced with it would be acknowledged though not durable): a batch is synced
with it from 5.8 on, with an fsync per file and directory before."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from checkpointd.core.workspace import syncbatch


def _on_kernel(monkeypatch: pytest.MonkeyPatch, release: str, sysname: str = "Linux") -> None:
    real = os.uname()
    monkeypatch.setattr(os, "uname", lambda: os.uname_result((sysname, real.nodename, release, real.version,
                                                               real.machine)))


@pytest.mark.parametrize("release", ["5.8.0", "5.10.0-28-amd64", "6.1.0", "6.18.44-fc-v1098"])
def test_from_linux_5_8_syncfs_is_used(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    _on_kernel(monkeypatch, release)
    assert syncbatch._find_syncfs() is not None


@pytest.mark.parametrize("release", ["5.7.19-arch1", "4.19.0-27-amd64", "3.10.0", "garbage"])
def test_before_linux_5_8_it_is_not(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    _on_kernel(monkeypatch, release)
    assert syncbatch._find_syncfs() is None


def test_nor_on_another_system(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_kernel(monkeypatch, "6.1.0", "Darwin")
    assert syncbatch._find_syncfs() is None


def test_a_failing_syncfs_raises_with_its_errno(monkeypatch: pytest.MonkeyPatch) -> None:
    """So that the batch falls back to fsyncs, which name the file that cannot be synced."""
    monkeypatch.setattr(syncbatch, "_libc_syncfs", lambda fd: -1)
    monkeypatch.setattr(syncbatch.ctypes, "get_errno", lambda: 5)
    with pytest.raises(OSError) as raised:
        syncbatch._syncfs(0)
    assert raised.value.errno == 5
    monkeypatch.setattr(syncbatch, "_libc_syncfs", None)
    with pytest.raises(OSError) as raised:
        syncbatch._syncfs(0)
    assert not raised.value.errno, "a missing syncfs is no I/O error: nothing to warn about"


@pytest.mark.skipif(syncbatch._libc_syncfs is None, reason="no syncfs that reports errors on this machine")
def test_the_error_syncfs_reports_is_the_one_raised() -> None:
    with pytest.raises(OSError) as raised:
        syncbatch._syncfs(-1)
    assert raised.value.errno == errno.EBADF


def test_a_syncfs_that_fails_is_logged_one_that_is_missing_is_not(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Either way the batch falls back to an fsync per file (see test_workspace_write_order.py)."""
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(syncbatch, "_syncfs", failing)
    with caplog.at_level(logging.WARNING, logger="checkpointd.syncbatch"):
        assert not syncbatch._synced_whole_file_systems([0])
    assert [r.getMessage() for r in caplog.records] == ["syncfs failed (Input/output error); syncing file by file"]
    caplog.clear()
    monkeypatch.undo()  # the real _syncfs, over a C library without syncfs
    monkeypatch.setattr(syncbatch, "_libc_syncfs", None)
    with caplog.at_level(logging.WARNING, logger="checkpointd.syncbatch"):
        assert not syncbatch._synced_whole_file_systems([0])
    assert caplog.records == []
