"""A recheck (``capture/recheck.py``) marks and counts as missed the changes the watcher saw no event
of. Where the journal already calls for a full scan (the event queue overflowed, a watch could not
be added), the next capture takes everything anyway and the watcher knew it lost events: nothing
is marked, and nothing is counted as missed. Real watched and full-scan capturers over one store
(``tests/engine/conftest.open_engines``)."""

from __future__ import annotations

import os
import time

from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.capture.recheck import Recheck
from tests.engine.conftest import Engines

OLD_NS = time.time_ns() - 3600 * 10**9


def _unseen_change(engines: Engines) -> watcher_module.Journal:
    """d/f.txt indexed, then rewritten with its event lost; returns the workspace's journal."""
    path = engines.root / "d" / "f.txt"
    path.parent.mkdir()
    path.write_bytes(b"first version\n")
    os.utime(path, ns=(OLD_NS, OLD_NS))
    engines.check(expect="full")
    engines.check()  # the stat index vouches for f.txt now
    with open(path, "r+b") as handle:
        handle.write(b"SECOND VERSION\n")
    assert engines.watcher.sync()
    [journal] = engines.watcher.journals()
    with engines.watcher._lock:
        journal.dirty.clear()
    return journal


def test_a_change_unseen_by_a_journal_that_overflowed_is_not_counted_as_missed(engines):
    journal = _unseen_change(engines)
    engines.watcher.mark_full(journal, "the event queue overflowed")  # the loss is known
    assert Recheck(engines.watched, 3600).run_once() == 0
    assert (journal.dirty, journal.full) == ({}, "the event queue overflowed")
    engines.check(expect="full")
    engines.check()


def test_a_journal_that_overflows_while_the_round_settles_has_nothing_marked_or_counted(engines):
    journal = _unseen_change(engines)
    recheck = Recheck(engines.watched, 3600)
    real_wait = recheck._stopping.wait

    def overflow_meanwhile(timeout: float | None = None) -> bool:
        engines.watcher.mark_full(journal, "the event queue overflowed")
        return real_wait(0)

    recheck._stopping.wait = overflow_meanwhile  # type: ignore[method-assign]
    assert recheck.run_once() == 0
    assert (journal.dirty, journal.full) == ({}, "the event queue overflowed")
    engines.check(expect="full")
    engines.check()


def test_a_change_under_a_directory_an_event_marked_whole_is_not_counted_as_missed(engines, tmp_path):
    """d moved out of the workspace and back: its events mark d whole, so the next capture scans
    all of d, the unseen change of d/f.txt with it; the recheck neither marks nor counts it."""
    journal = _unseen_change(engines)
    os.rename(engines.root / "d", tmp_path / "d-away")
    os.rename(tmp_path / "d-away", engines.root / "d")
    assert Recheck(engines.watched, 3600).run_once() == 0
    assert journal.dirty == {"d": watcher_module.SUBTREE}
    engines.check()
