"""Every descriptor the workspace layer opens is close-on-exec: a child the server starts (a
reader process, a hook, a test's server) never inherits a directory of a workspace, which would
keep it open (and a held replaced file's blocks allocated) for as long as the child lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.core.workspace import beneath, syncbatch
from checkpointd.core.workspace.workspace import Workspace


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_syscall", None)
    return request.param


def test_directory_descriptors_are_not_inherited(tmp_path: Path, resolution: str) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    workspace = Workspace(str(tmp_path))
    with workspace.root_fd() as fd:
        assert not os.get_inheritable(fd)
    for path in ("a", "a/b"):
        with workspace.dir_fd(path) as fd:
            assert not os.get_inheritable(fd), path
    with workspace.directories() as dirs:
        assert not os.get_inheritable(dirs.fd("a/b"))


def test_what_a_batch_holds_is_not_inherited(tmp_path: Path, resolution: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("old")
    workspace = Workspace(str(tmp_path))
    with workspace.batched_sync() as pending:
        workspace.write_file("a/f", iter([b"new"]), 0o644)
        workspace.make_dir("a/sub", 0o755)
        open_now = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith(f"{tmp_path}/"):
                    open_now.append(int(fd))
            except OSError:
                continue
        assert open_now, "the batch holds nothing under the workspace"
        assert [fd for fd in open_now if os.get_inheritable(fd)] == []
        pending.flush()
    syncbatch.wait_for_releases()
