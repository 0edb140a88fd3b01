"""A file-event journal holds at most ``MAX_DIRTY_PATHS`` paths: a build or an install churning
through a folder that is not ignored marks it full instead (the next capture scans the workspace
whole and misses nothing), so its memory stays bounded however long the churn lasts. And the
reader thread that drains the queue between captures outlives a read that fails: without it,
every busy spell would overflow the queue and make every capture a full scan until a restart.
Real watched and full-scan capturers over one store and one watcher (``tests/engine/conftest``)."""

from __future__ import annotations

import errno
import threading

from checkpointd.core.capture import watcher as watcher_module
from tests.engine.conftest import write


def test_a_journal_past_its_path_limit_is_marked_full_and_the_next_capture_misses_nothing(engines, monkeypatch):
    monkeypatch.setattr(watcher_module, "MAX_DIRTY_PATHS", 5)
    write(engines.root / "src" / "main.py", "print('hi')\n")
    write(engines.root / "build" / "keep", "")
    engines.check(expect="full")
    write(engines.root / "src" / "main.py", "print('edited')\n")
    engines.check()  # one path: incremental

    with engines.watcher.hold_events():
        for n in range(12):
            write(engines.root / "build" / f"out{n}.o", f"object {n}\n")
    assert engines.watcher.sync()
    [journal] = engines.watcher.journals()
    assert journal.dirty == {} and "more than 5 paths changed" in journal.full, journal.dirty
    engines.check(expect="full")

    write(engines.root / "build" / "out3.o", "rebuilt\n")
    engines.check()  # back to incremental once the full scan is recorded


def test_the_reader_reads_the_queue_again_after_a_read_fails(engines, monkeypatch):
    monkeypatch.setattr(watcher_module, "READ_RETRY_SECONDS", 0.01)
    watcher = engines.watcher
    real = watcher._read_queue
    calls: list[str] = []
    read_again = threading.Event()

    def failing_once() -> None:
        if threading.current_thread() is watcher._thread:
            calls.append("reader")
            if len(calls) == 1:
                raise OSError(errno.EIO, "Input/output error")
            read_again.set()
        real()

    monkeypatch.setattr(watcher, "_read_queue", failing_once)
    write(engines.root / "a.txt", "wakes the reader\n")
    engines.check(expect="full")
    write(engines.root / "b.txt", "wakes it again, after its failed read\n")
    assert read_again.wait(timeout=30), f"the reader did not read the queue again: {calls}"
    assert watcher._thread.is_alive()
    engines.check()
