"""One inotify queue serves every watched workspace: when it overflows, the events it dropped
may have been any workspace's, so each one's next capture scans in full, not only the one whose
churn filled the queue. Real watched and full-scan capturers over one store and one watcher
(``tests/engine/conftest.open_engines``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tests.engine.conftest import write


def _flood(root: Path) -> None:
    """More MODIFY events than the queue holds: writes alternating between two files, so that
    no event merges with the one before it."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    fds = [os.open(root / name, os.O_WRONLY | os.O_CREAT, 0o644) for name in ("churn0", "churn1")]
    try:
        for i in range(limit + 100):
            os.pwrite(fds[i % 2], b"x", 0)
    finally:
        for fd in fds:
            os.close(fd)


def test_an_overflow_caused_in_one_workspace_makes_the_other_scan_fully(engines, tmp_path):
    write(engines.root / "busy" / "f.txt", "the busy workspace\n")
    quiet_root = tmp_path / "quiet"
    write(quiet_root / "d" / "f.txt", "the quiet workspace\n")
    quiet = dataclasses.replace(engines, root=quiet_root)
    engines.check(expect="full")
    quiet.check(expect="full")
    overflows = engines.watcher.overflows
    with engines.watcher.hold_events():
        write(quiet_root / "d" / "f.txt", "edited in the quiet workspace before the queue filled\n")
        _flood(engines.root / "busy")
        write(quiet_root / "d" / "late.txt", "made in the quiet workspace after the queue filled\n")
    # The kernel queues one overflow event however much it dropped after it.
    quiet.check(expect="full")
    assert engines.watcher.overflows == overflows + 1
    engines.check(expect="full")
    write(quiet_root / "d" / "late.txt", "edited once the queue was drained\n")
    quiet.check()
    engines.check()
