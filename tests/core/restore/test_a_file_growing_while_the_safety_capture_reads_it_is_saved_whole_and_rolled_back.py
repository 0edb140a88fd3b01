"""A tool appends to a log while the rollback's safety capture reads it: the capture stores what
it read (to the end of the file, past the size it stat'ed first) and, since that stat no longer
describes the content, leaves the file out of the stat index. The rollback's check of that file
then has no stat identity to go by (restoring.py ``seen_by_capture`` gives only the index's
entry of the very content the capture stored) and hashes it; the rollback finishes, and the
safety checkpoint holds the whole log."""

from __future__ import annotations

import os

import pytest

from checkpointd.core.store import content_store
from tests.core.restore.test_rollback_write_path_attacked import Plan, write

APPENDED = "line 2, appended while the capture read the file\n"


def test_a_log_a_tool_appends_to_during_the_safety_capture_is_saved_whole_and_the_rollback_finishes(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    write(plan.root / "a.txt", "target a\n")
    target = plan.checkpoint()
    write(plan.root / "a.txt", "changed a, and longer\n")
    write(plan.root / "tool.log", "line 1\n")  # never checkpointed: the stat index has no entry for it
    real, appended = content_store.read_source, []

    def read_source(fd: int, expected_size: int) -> bytes:  # the capture stat'ed the file, and reads it now
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/tool.log") and not appended:
            with open(plan.root / "tool.log", "a") as log:
                log.write(APPENDED)
            appended.append(expected_size)
        return real(fd, expected_size)

    monkeypatch.setattr(content_store, "read_source", read_source)

    result = plan.rollback(target)

    assert appended, "the capture never read tool.log"
    assert plan.files_of(result.safety.row)["tool.log"] == ("file", b"line 1\n" + APPENDED.encode(), 0o644)
    assert plan.state() == plan.files_of(target)
