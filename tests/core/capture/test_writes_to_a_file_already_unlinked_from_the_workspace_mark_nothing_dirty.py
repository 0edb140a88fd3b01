"""A program's scratch file opened and then unlinked (the usual private temporary file) is no part
of the workspace: writes to it reach the watcher as no event (IN_EXCL_UNLINK), so they neither
mark its old name dirty capture after capture nor fill the shared event queue until it overflows
and every workspace scans in full. Real watched and full-scan capturers over one store
(``tests/engine/conftest.open_engines``)."""

from __future__ import annotations

import os

from tests.engine.conftest import write


def test_writes_through_a_descriptor_of_an_unlinked_file_are_not_reported(engines):
    write(engines.root / "d" / "kept.txt", "kept\n")
    engines.check(expect="full")
    fd = os.open(engines.root / "d" / "scratch", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.unlink(engines.root / "d" / "scratch")
        engines.check()  # takes the events of its creation and removal
        [journal] = engines.watcher.journals()
        for i in range(100):
            os.pwrite(fd, b"scratch data %d\n" % i, 0)
        assert engines.watcher.sync()
        assert journal.dirty == {}
        engines.check()
    finally:
        os.close(fd)
