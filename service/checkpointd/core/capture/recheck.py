"""Now and then, every file the stat index vouches for in a watched workspace is stat-ed again,
so that a write the file watcher cannot see is captured by the first checkpoint after the
recheck instead of by none.

inotify reports a change only to watches on the directory of the name it was made through
(``watcher``'s blind spots: a write through a hard link outside the workspace, through a shared
mmap, through an O_TMPFILE's first descriptor, under a directory bind-mounted inside its own
workspace). Such a write still moves the file's stat. A recheck compares each indexed file's
stat with the index and marks the paths that moved dirty in the workspace's journal, as an event
would have, unless an event did (the file was written the usual way since the last checkpoint)
or a capture recorded it meanwhile (``Capturer.mark_unreported``). Captures are unchanged: they
look at a dirty path again and read it if its stat moved. So a recheck only ever adds work to the
next capture, and only for files whose stat moved. It runs on a thread of its own, paced, off
every call's path: 60,000 indexed files take 0.4 s of CPU a round here.

A file written where it is (the same inode) is marked itself. One that is gone, or replaced by
another file or by something else, is marked as the events of that would have marked it: its
directory whole, or the first of its directories under which no indexed file is still where it
was (a directory removed, or swapped for a file or for another directory, unseen under a bind
mount: a directory put in another's place is entered like it, and only the inodes of the files
it no longer holds tell them apart); a root-level one makes the next capture scan the workspace
whole.

A round stats every workspace first; if anything moved it waits ``SETTLE_SECONDS`` before
asking the watcher what it reported, so that a file caught mid-write (its event is queued when
the write returns) or mid-unlink is not counted as missed.

A file is marked when its identity (kind, inode, size, mtime, ctime) differs from the index's,
not when the index merely holds it within its racy window (``Indexed.matches``): after a
workspace's first checkpoint that is every file, and marking them would make the next capture
read them all again for a write that, if any, the watcher reported or that left no trace in the
stat (which no recheck can see either).
"""

from __future__ import annotations

import logging
import os
import stat
import threading

from checkpointd.core.capture.capturer import Capturer, Unreported
from checkpointd.core.capture.stat_index import Indexed
from checkpointd.core.capture.watcher import ENTRY, SUBTREE, Journal
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.errors import CheckpointdError
from checkpointd.core.workspace.workspace import UnsafePath, Workspace

log = logging.getLogger("checkpointd.recheck")

#: Files stat-ed between two short pauses: a recheck of a million files yields ~2,000 times.
BATCH = 512
PAUSE_SECONDS = 0.002
#: How long a round that found something waits before asking the watcher what it reported. The
#: kernel queues a write's event when the write returns, after its effect shows in the stat (an
#: unlink's after the name is gone): a file caught mid-write must not be counted as missed.
SETTLE_SECONDS = 0.25


class Recheck:
    def __init__(self, capturer: Capturer, interval_seconds: float) -> None:
        assert capturer.watcher is not None, "a recheck is for watched workspaces"
        self.capturer = capturer
        self.watcher = capturer.watcher
        self.index = capturer.snapshotter.index
        self.interval_seconds = interval_seconds
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="recheck", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_seconds):
            try:
                self.run_once()
            except Exception:  # the next round tries again; nothing depends on this one
                log.exception("recheck of the watched workspaces failed")

    def run_once(self) -> int:
        """Rechecks every watched workspace; returns how many paths it marked. Every workspace is
        stat-ed first, then, if anything moved, the round settles once before the marks."""
        found: list[tuple[Journal, dict[str, Unreported]]] = []
        for journal in self.watcher.journals():
            if self._stopping.is_set():
                return 0
            try:
                moved = self._moved(journal)
            except Exception:  # one workspace's failure leaves the others rechecked
                log.exception("recheck of %s failed", journal.root)
                continue
            if moved:
                found.append((journal, moved))
        if not found or self._stopping.wait(SETTLE_SECONDS):
            return 0
        missed = 0
        for journal, moved in found:
            try:
                missed += self._mark_missed(journal, moved)
            except Exception:
                log.exception("recheck of %s failed", journal.root)
        return missed

    def _moved(self, journal: Journal) -> dict[str, Unreported]:
        """The paths to mark in ``journal``'s workspace, each with the indexed files that showed it."""
        moved: dict[str, Unreported] = {}
        if journal.full:
            return moved  # the next capture scans everything anyway
        entries = sorted(self.index.for_root(journal.root).snapshot())
        if not entries:
            return moved
        #: Directories under which an indexed file is still where it was (the same inode): the
        #: same directories as when it was indexed, not others put in their place.
        kept: set[str] = set()
        #: Indexed files gone from their name, or replaced there by another file or something else.
        lost: list[tuple[str, Indexed]] = []
        try:
            with Workspace(journal.root).directories() as dirs:
                root = os.fstat(dirs.fd(""))
                if (root.st_dev, root.st_ino) != journal.identity:
                    return {}  # another directory at the root's path: the watcher says so itself
                for done, (path, known) in enumerate(entries, 1):
                    if done % BATCH == 0 and self._stopping.wait(PAUSE_SECONDS):
                        return {}
                    parent, _, name = path.rpartition("/")
                    try:
                        st = os.lstat(name, dir_fd=dirs.fd(parent))
                    except (OSError, UnsafePath):
                        lost.append((path, known))
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_ino == known.ino:
                        _keep_with_ancestors(kept, parent)
                        if (known.size, known.mtime_ns, known.ctime_ns) != (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
                            _mark(moved, path, ENTRY, path, known)  # written where it is
                        continue
                    lost.append((path, known))
        except (OSError, UnsafePath, CheckpointdError) as exc:  # the root is gone or unreachable now
            log.debug("recheck of %s skipped: %s", journal.root, exc)
            return {}
        for path, known in lost:
            _mark(moved, _changed_directory(kept, path), SUBTREE, path, known)
        return moved

    def _mark_missed(self, journal: Journal, moved: dict[str, Unreported]) -> int:
        marked = self.capturer.mark_unreported(journal, moved)
        if marked:
            log.info("recheck of %s: %d path(s) changed without a file-watcher event (a hard link outside the "
                     "workspace, a shared mmap...); the next checkpoint captures them", journal.root, len(marked))
            telemetry.watcher_missed(len(marked))
        return len(marked)


def _keep_with_ancestors(kept: set[str], directory: str) -> None:
    while directory not in kept:
        kept.add(directory)
        if not directory:
            return
        directory = directory.rpartition("/")[0]


def _changed_directory(kept: set[str], path: str) -> str:
    """The directory to look at again whole for an indexed file at ``path`` that is gone or
    replaced: the first of its directories, from the root down, under which no indexed file is
    still where it was (gone, no longer a directory, or another directory put in its place, whose
    entries no index holds), else its own directory. '' (the root) scans the workspace whole."""
    parts = path.split("/")[:-1]
    for depth in range(len(parts) + 1):
        directory = "/".join(parts[:depth])
        if directory not in kept:
            return directory
    return "/".join(parts)


def _mark(moved: dict[str, Unreported], path: str, kind: int, witness: str, known: Indexed) -> None:
    """``path`` is to be marked ``kind`` because ``witness`` moved: every witness is kept, since
    an event may have reported one of them and not the others."""
    seen = moved.setdefault(path, Unreported(kind))
    seen.kind |= kind
    seen.witnesses.append((witness, known))
