"""Rounds of the recheck (``capture/recheck.py``), in process and fast: what one round marks when
several changes, several workspaces, a failing part or a stop meet in it, how long a round over
a bigger workspace takes, and what its thread does round after round.

Real watched and full-scan capturers over one store (``tests/engine/conftest.open_engines``).
Each change a recheck is for is hidden from the watcher (its events read, then dropped, as a
blind spot drops them), and the capture after a recheck is compared with a full scan. Other
faults (a failing round, a slow file system) are injected where a test says so. The real-server
tests are tests/hardening/test_recheck_attacked.py and test_recheck_catches_unseen_writes.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from checkpointd.core.capture import recheck as recheck_module
from checkpointd.core.capture.recheck import BATCH, Recheck
from checkpointd.core.capture.watcher import ENTRY, SUBTREE, Journal
from checkpointd.core.kernel import telemetry
from tests.engine.conftest import Engines

OLD_NS = time.time_ns() - 3600 * 10**9
MISSED = "without a file-watcher event"


def _indexed(engines: Engines, files: dict[str, bytes]) -> None:
    """``files`` written in ``engines.root``, an hour old, and captured twice: the stat index
    vouches for each (out of its racy window)."""
    for name, data in files.items():
        (engines.root / name).parent.mkdir(parents=True, exist_ok=True)
        (engines.root / name).write_bytes(data)
    for directory, _dirs, names in os.walk(engines.root):
        for name in names:
            os.utime(os.path.join(directory, name), ns=(OLD_NS, OLD_NS), follow_symlinks=False)
    engines.check(expect="full")
    engines.check()


def _another_workspace(engines: Engines, root: Path, files: dict[str, bytes]) -> Engines:
    """A second workspace at ``root``, watched by the same capturer, with ``files`` indexed."""
    root.mkdir(parents=True)
    other = dataclasses.replace(engines, root=root)
    _indexed(other, files)
    return other


def _rewrite_unseen(path: Path, data: bytes) -> None:
    """``path`` rewritten where it is (same inode), its mtime put back, as a write through a hard
    link outside the workspace leaves it (with ``_hide_from_watcher``): only ctime and size tell."""
    before = path.stat()
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _hide_from_watcher(engines: Engines) -> None:
    """The fault: every event up to now is read, then dropped, as if the watcher never saw it."""
    assert engines.watcher.sync()
    journals = engines.watcher.journals()
    with engines.watcher._lock:
        for journal in journals:
            journal.dirty.clear()


def _journal(engines: Engines) -> Journal:
    [journal] = [j for j in engines.watcher.journals() if j.root == str(engines.root)]
    return journal


# -- what one round marks --------------------------------------------------------------------


def test_a_file_gone_does_not_end_the_round_before_the_files_after_it(engines):
    """a/gone.txt removed and b/x.txt (checked after it) rewritten, both unseen: a marked whole,
    b/x.txt itself, and the capture after holds both changes."""
    _indexed(engines, {"a/gone.txt": b"removed unseen\n", "a/kept.txt": b"kept\n", "b/x.txt": b"first version\n"})
    (engines.root / "a" / "gone.txt").unlink()
    _rewrite_unseen(engines.root / "b" / "x.txt", b"SECOND VERSION, unseen\n")
    _hide_from_watcher(engines)
    assert Recheck(engines.watched, 3600).run_once() == 2
    assert _journal(engines).dirty == {"a": SUBTREE, "b/x.txt": ENTRY}
    engines.check(expect="any")


def test_a_file_replaced_by_another_has_its_directory_looked_at_whole(engines):
    """d/f.txt saved as editors save (a new file renamed over it) and d/new.txt made beside it,
    both unseen (as under a directory bind-mounted in its own workspace): f.txt's new inode says
    d's entries changed, so d is marked whole and the next capture finds new.txt too."""
    _indexed(engines, {"d/f.txt": b"the first version\n", "d/other.txt": b"untouched\n"})
    d = engines.root / "d"
    (d / ".f.txt.swp").write_bytes(b"the first version, saved again\n")
    os.replace(d / ".f.txt.swp", d / "f.txt")
    (d / "new.txt").write_bytes(b"a new file beside it\n")
    _hide_from_watcher(engines)
    assert Recheck(engines.watched, 3600).run_once() == 1
    assert _journal(engines).dirty == {"d": SUBTREE}
    engines.check(expect="any")


@pytest.mark.parametrize("change", ["removed", "replaced-by-a-file"])
def test_a_directory_gone_above_a_file_is_marked_where_it_went(engines, change):
    """top's only indexed file is two levels down (top/mid/leaf.txt). top removed, or replaced by
    a file, unseen: the first directory that can no longer be entered (top) is marked whole, not
    the deeper one the file was in, and the capture after matches a full scan."""
    _indexed(engines, {"keep.txt": b"kept\n", "top/mid/leaf.txt": b"a leaf\n"})
    shutil.rmtree(engines.root / "top")
    if change == "replaced-by-a-file":
        (engines.root / "top").write_bytes(b"a file where directory top was\n")
    _hide_from_watcher(engines)
    assert Recheck(engines.watched, 3600).run_once() == 1
    assert _journal(engines).dirty == {"top": SUBTREE}
    engines.check(expect="any")


def test_a_directory_swapped_for_another_above_a_file_is_marked_whole(engines):
    """As above, with top replaced by another directory holding new.txt (unseen: under a bind
    mount). The events of that swap would have marked top whole (the module says a recheck marks
    "as the events of that would have marked it"); the recheck marks top/mid, which is gone, so the
    next capture looks at top/mid only and the checkpoint lacks top/new.txt; later rechecks never
    find it either (it was never indexed). With a file directly in top (as in the attacked
    suite's dir-swapped case) the file's own directory is marked and nothing is lost."""
    _indexed(engines, {"keep.txt": b"kept\n", "top/mid/leaf.txt": b"a leaf\n"})
    shutil.rmtree(engines.root / "top")
    (engines.root / "top").mkdir()
    (engines.root / "top" / "new.txt").write_bytes(b"a file of the directory that took top's place\n")
    _hide_from_watcher(engines)
    Recheck(engines.watched, 3600).run_once()
    engines.check(expect="any")


def test_a_closed_recheck_marks_nothing_and_says_so(engines):
    _indexed(engines, {"f.txt": b"the first version\n"})
    _rewrite_unseen(engines.root / "f.txt", b"THE SECOND VERSION, unseen\n")
    _hide_from_watcher(engines)
    recheck = Recheck(engines.watched, 3600)
    recheck.close()  # never started: closing it is fine too
    assert recheck.run_once() == 0
    assert not _journal(engines).dirty


def test_only_what_a_round_marked_is_counted_and_logged_as_missed(engines, caplog):
    """The count of files changed without an event (telemetry and the log line) holds what a
    round marked: nothing for a write the watcher reported, one for an unseen one beside it."""
    counted: list[int] = []

    class Recorder(telemetry.Sink):
        def watcher_missed(self, count: int) -> None:
            counted.append(count)

    _indexed(engines, {"f.txt": b"the first version\n", "g.txt": b"another file\n"})
    recheck = Recheck(engines.watched, 3600)
    recorder = Recorder()
    telemetry.bind(recorder)
    try:
        with caplog.at_level(logging.INFO, "checkpointd.recheck"):
            (engines.root / "g.txt").write_bytes(b"an ordinary write, which the watcher reports\n")
            assert recheck.run_once() == 0
            assert (counted, [r.getMessage() for r in caplog.records if MISSED in r.getMessage()]) == ([], [])
            _rewrite_unseen(engines.root / "f.txt", b"THE SECOND VERSION, unseen\n")
            assert engines.watcher.sync()
            journal = _journal(engines)
            with engines.watcher._lock:
                journal.dirty.pop("f.txt", None)  # f.txt's event dropped; g.txt's kept
            assert recheck.run_once() == 1
    finally:
        telemetry.unbind(recorder)
    assert counted == [1]
    [line] = [r.getMessage() for r in caplog.records if MISSED in r.getMessage()]
    assert line.startswith(f"recheck of {engines.root}: 1 path(s) changed without a file-watcher event"), line
    engines.check(expect="any")


# -- several workspaces in one round ----------------------------------------------------------


def _fail_reading_index(engines: Engines, root: str, monkeypatch) -> None:
    index = engines.watched.snapshotter.index
    real = index.for_root

    def for_root(asked: str):
        if asked == root:
            raise RuntimeError("injected: this workspace's index cannot be read")
        return real(asked)

    monkeypatch.setattr(index, "for_root", for_root)


def _fail_marking(engines: Engines, root: str, monkeypatch) -> None:
    real = engines.watched.mark_unreported

    def mark_unreported(journal, moved):
        if journal.root == root:
            raise RuntimeError("injected: this workspace's journal cannot be marked")
        return real(journal, moved)

    monkeypatch.setattr(engines.watched, "mark_unreported", mark_unreported)


@pytest.mark.parametrize("fault", [_fail_reading_index, _fail_marking], ids=["reading-its-index", "marking-it"])
def test_a_workspace_whose_recheck_fails_leaves_the_others_rechecked(engines, tmp_path, monkeypatch, caplog, fault):
    """Two workspaces with an unseen write each; the recheck of the one rechecked first fails (an
    injected error, at the stat pass or at the marks): the other is still marked, and the failure
    is logged with the workspace's name."""
    _indexed(engines, {"f.txt": b"the first version\n"})
    other = _another_workspace(engines, tmp_path / "second" / "ws", {"f.txt": b"the first version\n"})
    assert [j.root for j in engines.watcher.journals()] == [str(engines.root), str(other.root)]
    for root in (engines.root, other.root):
        _rewrite_unseen(root / "f.txt", b"THE SECOND VERSION, unseen\n")
    _hide_from_watcher(engines)
    fault(engines, str(engines.root), monkeypatch)
    with caplog.at_level(logging.ERROR, "checkpointd.recheck"):
        assert Recheck(engines.watched, 3600).run_once() == 1
    assert _journal(other).dirty == {"f.txt": ENTRY}
    assert [r.getMessage() for r in caplog.records] == [f"recheck of {engines.root} failed"]
    monkeypatch.undo()
    other.check(expect="any")


def test_a_workspace_moved_away_is_skipped_quietly_and_the_others_rechecked(engines, tmp_path, caplog):
    """The second workspace's parent is renamed (no event reaches a watch on the workspace
    itself): its root is gone from its path, which the round skips without an error (the real
    servers' tests look for tracebacks in the log), marking the first's unseen write."""
    _indexed(engines, {"f.txt": b"the first version\n"})
    other = _another_workspace(engines, tmp_path / "parent" / "ws", {"f.txt": b"the first version\n"})
    (tmp_path / "parent").rename(tmp_path / "parent-moved")
    _rewrite_unseen(engines.root / "f.txt", b"THE SECOND VERSION, unseen\n")
    _hide_from_watcher(engines)
    assert not _journal(other).full, "the watcher noticed the move: this test no longer reaches the recheck's part"
    with caplog.at_level(logging.DEBUG, "checkpointd.recheck"):
        assert Recheck(engines.watched, 3600).run_once() == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any(f"recheck of {other.root} skipped" in r.getMessage() for r in caplog.records)
    assert _journal(engines).dirty == {"f.txt": ENTRY}
    engines.check(expect="any")


# -- a bigger workspace: how long a round takes, and a stop in the middle of one ----------------

MANY = 1500


def _many(engines: Engines) -> None:
    _indexed(engines, {f"d{n % 3}/f{n:04d}.txt": b"" for n in range(MANY - 1)} | {"zz-last.txt": b"checked last\n"})


def test_a_round_over_a_bigger_workspace_marks_an_unseen_write_in_its_last_file(engines):
    """A round over 1,500 files (three batches, with pauses between them) reaches the last one
    and marks the unseen write there. How long a round takes is the bench's to say, not a test's."""
    _many(engines)
    _rewrite_unseen(engines.root / "zz-last.txt", b"CHECKED LAST, unseen\n")
    _hide_from_watcher(engines)
    assert Recheck(engines.watched, 3600).run_once() == 1
    assert _journal(engines).dirty == {"zz-last.txt": ENTRY}
    engines.check(expect="any")


class _SlowFileSystem:
    """The recheck's ``os`` with a slow ``lstat`` (the injected fault: a slow file system), which
    counts its calls; at call ``hold_at`` it says so and waits until told to go on."""

    def __init__(self, hold_at: int) -> None:
        self.calls = 0
        self.hold_at = hold_at
        self.held = threading.Event()
        self.go_on = threading.Event()

    def __getattr__(self, name: str):
        return getattr(os, name)

    def lstat(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.hold_at:
            self.held.set()
            assert self.go_on.wait(10)
        if self.calls >= self.hold_at:
            time.sleep(0.001)
        return os.lstat(*args, **kwargs)


def test_a_stop_in_the_middle_of_a_round_is_seen_within_a_batch_of_files(engines, monkeypatch):
    """A server stops within its grace period, while its recheck may be in the middle of a round
    over a large workspace: the round looks for a stop between batches of files, not at its end.
    Stopped at the 600th of 1,500 files: it stats at most a batch more."""
    _many(engines)
    slow = _SlowFileSystem(hold_at=600)
    monkeypatch.setattr(recheck_module, "os", slow)
    recheck = Recheck(engines.watched, 0.01)
    recheck.start()
    try:
        assert slow.held.wait(10), "no round began"
    finally:
        slow.go_on.set()
        recheck.close()
    assert slow.calls < slow.hold_at + BATCH, f"{slow.calls} of {MANY} files stat-ed after a stop at the 600th"


# -- the thread ---------------------------------------------------------------------------------


def test_the_thread_rechecks_by_itself_and_outlives_a_round_that_failed(engines, monkeypatch, caplog):
    """Started, the recheck runs a round every interval; its first round fails (injected: the
    watcher's list of workspaces cannot be read), which is logged, and the next rounds go on to
    find the unseen write."""
    _indexed(engines, {"f.txt": b"the first version\n"})
    _rewrite_unseen(engines.root / "f.txt", b"THE SECOND VERSION, unseen\n")
    _hide_from_watcher(engines)
    journal = _journal(engines)
    failed: list[bool] = []
    journals = engines.watcher.journals

    def first_round_fails() -> list[Journal]:
        if not failed:
            failed.append(True)
            raise RuntimeError("injected: the first round fails")
        return journals()

    monkeypatch.setattr(engines.watcher, "journals", first_round_fails)
    recheck = Recheck(engines.watched, 0.02)
    with caplog.at_level(logging.ERROR, "checkpointd.recheck"):
        recheck.start()
        try:
            deadline = time.monotonic() + 5
            while "f.txt" not in journal.dirty and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            recheck.close()
    assert failed, "no round ran"
    assert "f.txt" in journal.dirty, "the thread did not find the unseen write"
    assert [r.getMessage() for r in caplog.records] == ["recheck of the watched workspaces failed"]
    monkeypatch.undo()
    engines.check(expect="any")


def test_close_returns_once_the_round_under_way_has_ended(engines, monkeypatch):
    """The engine closes the capturer and the stat index right after the recheck
    (``EngineParts.close``): a round still running then would use them closed. A round slowed
    down (injected: reading the index takes 0.3 s) is under way when close is called: close
    returns after it, with the thread ended."""
    _indexed(engines, {"f.txt": b"the first version\n"})
    index = engines.watched.snapshotter.index
    real = index.for_root
    entered, left = threading.Event(), threading.Event()

    def slow_for_root(root: str):
        entered.set()
        time.sleep(0.3)
        left.set()
        return real(root)

    monkeypatch.setattr(index, "for_root", slow_for_root)
    recheck = Recheck(engines.watched, 0.01)
    recheck.start()
    try:
        assert entered.wait(5), "no round began"
    finally:
        recheck.close()
    assert left.is_set(), "close returned while a round was still under way"
    assert [t for t in threading.enumerate() if t.name == "recheck"] == []


def test_a_process_that_never_closes_its_recheck_still_exits(tmp_path):
    """A server whose start fails after its engine started, or that exits without closing it,
    must not hang on the recheck's thread (it waits an hour between rounds here)."""
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from checkpointd.core.capture.capturer import Capturer
        from checkpointd.core.capture.recheck import Recheck
        from checkpointd.core.capture.snapshot import Snapshotter
        from checkpointd.core.capture.stat_index import StatIndex
        from checkpointd.core.capture.watcher import Watcher
        from checkpointd.core.store.content_store import ContentStore
        from checkpointd.core.store.tree import Trees

        base = Path(sys.argv[1])
        store = ContentStore(base / "store")
        trees = Trees(store)
        capturer = Capturer(Snapshotter(store, trees, StatIndex(base / "index.sqlite")), trees, Watcher())
        Recheck(capturer, 3600).start()
        print("started, leaving")
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                              timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit: the recheck's thread held it")
    assert (done.returncode, done.stdout) == (0, "started, leaving\n"), done.stderr
