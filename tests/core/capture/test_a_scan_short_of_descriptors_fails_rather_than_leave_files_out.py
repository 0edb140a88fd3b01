"""A scan that cannot open a file or a directory because the server ran short (EMFILE, ENFILE,
ENOMEM) must fail, not record the entry as skipped (unreadable): the error says nothing of the
file, the user can read it, and a checkpoint acknowledged without it would roll back to the
wrong content (a rollback keeps whatever a skipped path holds then). A file the server may not
read (EACCES) stays skipped as unreadable: that is the file's own state."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import SKIP_UNREADABLE
from checkpointd.core.store.tree import EntryKind
from tests.core.capture.full_scan import full_scan
from tests.engine.conftest import write

SHORT = [errno.EMFILE, errno.ENFILE, errno.ENOMEM]


def _workspace(root: Path, files: int) -> None:
    for i in range(files):
        write(root / "d" / f"f{i}.txt", f"file {i}\n")
    write(root / "d" / "sub" / "inner.txt", "inner\n")
    write(root / "top.txt", "top\n")


def _failing_open(monkeypatch: pytest.MonkeyPatch, victim: str, code: int) -> None:
    """``os.open`` of ``victim`` (opened relative to its directory) fails with ``code``."""
    real = os.open

    def fake(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None and path == victim:
            raise OSError(code, os.strerror(code), path)
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(snapshot_module.os, "open", fake)


def _capture(tmp_path: Path, root: Path):
    _store, trees, result = full_scan(tmp_path / "store", root)
    return result, dict(trees.flatten(result.tree))


@pytest.mark.parametrize("code", SHORT, ids=errno.errorcode.get)
@pytest.mark.parametrize(("files", "victim"), [(3, "f1.txt"), (12, "f5.txt"), (3, "sub")],
                         ids=["file-read-inline", "file-read-by-threads", "directory"])
def test_a_scan_short_of_descriptors_fails_and_the_next_one_has_everything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, files: int, victim: str) -> None:
    root = tmp_path / "ws"
    _workspace(root, files)
    with monkeypatch.context() as patched:
        _failing_open(patched, victim, code)
        with pytest.raises(OSError) as raised:
            _capture(tmp_path, root)
    assert raised.value.errno == code
    result, entries = _capture(tmp_path, root)
    assert result.skipped == []
    expected = {f"d/f{i}.txt" for i in range(files)} | {"d/sub/inner.txt", "top.txt"}
    assert {p for p, e in entries.items() if e.kind is EntryKind.FILE} == expected


@pytest.mark.parametrize(("files", "victim"), [(3, "f1.txt"), (12, "f5.txt"), (3, "sub")],
                         ids=["file-read-inline", "file-read-by-threads", "directory"])
def test_an_entry_the_server_may_not_open_is_skipped_as_unreadable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, victim: str) -> None:
    root = tmp_path / "ws"
    _workspace(root, files)
    _failing_open(monkeypatch, victim, errno.EACCES)
    result, entries = _capture(tmp_path, root)
    path = f"d/{victim}"
    assert [(s.path, s.reason) for s in result.skipped] == [(path, SKIP_UNREADABLE)]
    assert path not in entries and "top.txt" in entries
