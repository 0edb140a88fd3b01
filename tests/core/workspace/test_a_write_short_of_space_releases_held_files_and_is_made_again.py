"""Within a batch, a write that runs out of space or descriptors while the batch holds replaced
files (``SyncBatch.release_later``) releases them and is made once more, with the content its
``again`` yields: what the batch held may be what the disk or the process was short of. Any other
failure, or one the release cannot help (nothing held, no ``again``, not batched, or a failed
sync, which says nothing of what is held), is raised as it is, and the file left as it was."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace.syncbatch import SyncFailed
from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace
from tests.helpers import descriptors_under


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("held", "target"):
        (tmp_path / name).write_text(f"old {name}")
    syncbatch.wait_for_releases()
    return tmp_path


def _failing_once(monkeypatch: pytest.MonkeyPatch, error: OSError) -> list[OSError]:
    """The next write of b"first" raises ``error``."""
    raised: list[OSError] = []
    real_write = os.write

    def write(fd: int, data) -> int:
        if not raised and bytes(data) == b"first":
            raised.append(error)
            raise error
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return raised


def _deleted_files_held(root: Path) -> list[str]:
    return [Path(target.removesuffix(" (deleted)")).name for target in descriptors_under(root)
            if target.endswith(" (deleted)")]


def _temp_files(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(TEMP_PREFIX)]


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE])
def test_a_write_short_of_a_resource_releases_what_the_batch_holds_and_lands(
        root: Path, monkeypatch: pytest.MonkeyPatch, error: int) -> None:
    workspace = Workspace(str(root))
    raised = _failing_once(monkeypatch, OSError(error, os.strerror(error)))
    with workspace.batched_sync() as pending:
        workspace.write_file("held", iter([b"new held"]), 0o644)
        assert _deleted_files_held(root) == ["held"]
        workspace.write_file("target", iter([b"first"]), 0o644, again=lambda: iter([b"again"]))
        assert "held" not in _deleted_files_held(root), "the held file was not released"
        pending.flush()
    assert raised, "the write never failed"
    assert (root / "target").read_bytes() == b"again"
    assert _temp_files(root) == []


def _refused(root: Path, workspace: Workspace, error: OSError, monkeypatch: pytest.MonkeyPatch, *, batched: bool = True,
             hold: bool = True, again: bool = True) -> None:
    _failing_once(monkeypatch, error)
    again_content = (lambda: iter([b"again"])) if again else None
    if not batched:
        with pytest.raises(OSError) as raised:
            workspace.write_file("target", iter([b"first"]), 0o644, again=again_content)
    else:
        with workspace.batched_sync():
            if hold:
                workspace.write_file("held", iter([b"new held"]), 0o644)
            with pytest.raises(OSError) as raised:
                workspace.write_file("target", iter([b"first"]), 0o644, again=again_content)
    assert raised.value is error
    assert (root / "target").read_bytes() == b"old target"
    assert _temp_files(root) == []


def test_another_error_is_raised_not_retried(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(root, Workspace(str(root)), OSError(errno.EIO, "Input/output error"), monkeypatch)


def test_a_failed_sync_is_raised_not_retried(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = SyncFailed("elsewhere", OSError(errno.ENOSPC, "No space left on device"))
    _refused(root, Workspace(str(root)), failed, monkeypatch)


def test_without_content_to_write_again_it_is_raised(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(root, Workspace(str(root)), OSError(errno.ENOSPC, "No space"), monkeypatch, again=False)


def test_with_nothing_held_it_is_raised(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(root, Workspace(str(root)), OSError(errno.ENOSPC, "No space"), monkeypatch, hold=False)


def test_outside_a_batch_it_is_raised(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(root, Workspace(str(root)), OSError(errno.ENOSPC, "No space"), monkeypatch, batched=False)
