"""A reader can die while a task is being handed to it: its receiving thread takes back every
task it held (the server reads them in its place) and the hand-over then fails. The task must
be read once, by whoever took it back: read twice, the directory's descriptor is released
twice, closed while another read still uses it (that read fails, or opens a name in whatever
directory reused the number), and a stale task is completed against a later scan."""

from __future__ import annotations

import errno
import os
import signal
import socket
from collections import Counter
from pathlib import Path

from checkpointd.core.capture import readers as readers_module
from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


def test_a_task_taken_back_from_a_reader_that_died_during_its_hand_over_is_read_once(
        tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "ws"
    for directory in ("a", "b", "c"):
        for i in range(4):
            write(root / directory / f"f{i}.txt", f"{directory} {i}\n" * (i + 1))
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=1, readers_min_files=1)
    readers = snapshotter.readers
    assert readers is not None
    real_send_fds = socket.send_fds
    died: list[int] = []

    def send_fds(sock, buffers, fds, *args, **kwargs):
        if died:
            return real_send_fds(sock, buffers, fds, *args, **kwargs)
        (reader,) = [r for r in readers._readers if r.tasks is sock]
        died.append(reader.process.pid)
        os.kill(reader.process.pid, signal.SIGKILL)
        with readers.changed:  # its receiving thread takes back the task being handed over
            readers.changed.wait_for(lambda: not reader.alive)
        raise OSError(errno.EPIPE, os.strerror(errno.EPIPE))

    read: Counter[str] = Counter()
    real_read_files = snapshot_module._read_files

    def read_files(dir_fd, names, *args, **kwargs):
        read.update(name for name, _ in names)
        return real_read_files(dir_fd, names, *args, **kwargs)

    monkeypatch.setattr(readers_module.socket, "send_fds", send_fds)
    monkeypatch.setattr(snapshot_module, "_read_files", read_files)
    workspace = Workspace(str(root))
    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
    finally:
        snapshotter.close()
    assert died, "no task was handed to a reader"
    # The reader died with a's files (the first directory it was given); the server read them, once.
    assert read == Counter({f"f{i}.txt": 3 for i in range(4)}), read
    files = {p: store.read_bytes(e.digest) for p, e in trees.flatten(result.tree) if e.kind is EntryKind.FILE}
    assert files == {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [target for target in held if target.startswith(str(root))]
