"""An incremental capture that scans a directory again drops that directory's watches first and
adds them back as it walks (``Watcher.reset``). Given up on in between, it leaves directories
unwatched, and the reason it scanned may be gone by the next capture (here: a mode changed and
changed back): that capture must not build on the base, or an edit in an unwatched directory is
missed. Real watched and full-scan capturers over one store (``tests/engine/conftest.open_engines``)."""

from __future__ import annotations

import os

import pytest

from checkpointd.core.kernel.cancellation import Cancellation, Why
from checkpointd.core.kernel.errors import Cancelled
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


def test_a_rescan_given_up_on_before_a_watch_was_added_back_leaves_the_next_capture_exact(engines, monkeypatch):
    for d in ("pkg0", "pkg1"):
        write(engines.root / d / "sub" / "f.txt", f"{d}\n")
    os.chmod(engines.root / "pkg0", 0o755)
    engines.check(expect="full")
    engines.check()
    os.chmod(engines.root / "pkg0", 0o750)  # its read bits moved: the capture scans it again
    cancel = Cancellation()
    real_watch = engines.watcher.watch

    def give_up_at_sub(journal, directory, dir_fd):
        if directory == "pkg0/sub":
            cancel.cancel(Why.CANCELLED)  # the caller gives up as the rescan reaches pkg0/sub
            cancel.check()
        return real_watch(journal, directory, dir_fd)

    monkeypatch.setattr(engines.watcher, "watch", give_up_at_sub)
    with pytest.raises(Cancelled), engines.store.batch() as batch:
        batch.cancel = cancel
        engines.watched.capture(Workspace(str(engines.root)), [], [], engines.max_size, batch)
    monkeypatch.undo()
    [journal] = engines.watcher.journals()
    assert "pkg0/sub" not in journal.watches
    os.chmod(engines.root / "pkg0", 0o755)  # back as the base has it: nothing calls for a rescan now
    write(engines.root / "pkg0" / "sub" / "f.txt", "edited while pkg0/sub had no watch\n")
    engines.check(expect="full")
    write(engines.root / "pkg0" / "sub" / "f.txt", "edited once watched again\n")
    engines.check()
