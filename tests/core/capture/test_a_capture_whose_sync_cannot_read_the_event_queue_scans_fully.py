"""A capture reads the inotify queue itself before it takes the journal (``Watcher.sync``). If
that read fails (an I/O error, not the queue being empty), the journal may lack events of changes
already made: the capture must scan in full rather than build on it. Real watched and full-scan
capturers over one store (``tests/engine/conftest.open_engines``); the read error is injected."""

from __future__ import annotations

import errno
import os
import types

from checkpointd.core.capture import watcher as watcher_module
from tests.engine.conftest import write


def test_a_read_error_in_the_sync_falls_back_to_a_full_scan_that_misses_nothing(engines, monkeypatch):
    write(engines.root / "pkg" / "f.txt", "before\n")
    engines.check(expect="full")
    engines.check()
    engines.watcher.stop_reader()  # only the capture's own sync reads the queue from here
    write(engines.root / "pkg" / "f.txt", "edited: its event waits in the queue\n")
    write(engines.root / "new.txt", "made: its event waits in the queue\n")
    failures = []

    def read(fd: int, size: int) -> bytes:
        if not failures:  # the first read fails; any later one reads
            failures.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        return os.read(fd, size)

    patched_os = types.ModuleType("os")
    patched_os.__dict__.update(os.__dict__)
    patched_os.read = read
    monkeypatch.setattr(watcher_module, "os", patched_os)
    engines.check(expect="full")
    assert failures
    monkeypatch.undo()
    write(engines.root / "pkg" / "f.txt", "edited once the queue reads again\n")
    engines.check()


def test_a_sync_that_cannot_take_the_readers_lock_in_time_falls_back_to_a_full_scan(engines, monkeypatch):
    """The reader holds its lock while it handles what it read: a sync that cannot have it within
    its timeout cannot tell whether every event is handled."""
    write(engines.root / "pkg" / "f.txt", "before\n")
    engines.check(expect="full")
    engines.check()
    real_sync = engines.watcher.sync
    monkeypatch.setattr(engines.watcher, "sync", lambda timeout=0.05: real_sync(timeout))
    with engines.watcher.hold_events():  # as a reader stuck handling a batch would
        write(engines.root / "pkg" / "f.txt", "edited: its event is not handled yet\n")
        engines.check(expect="full")
    write(engines.root / "pkg" / "f.txt", "edited once the reader lets go\n")
    engines.check()
