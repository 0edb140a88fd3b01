"""File-watch journal: which workspace paths may have changed since the last capture.

One inotify instance serves every watched workspace; a reader thread drains it into a
per-workspace set of dirty paths. A capture first makes sure every event up to "now" has
been handled, then takes the dirty set and re-examines only those paths. Linux queues an
inotify event inside the system call that causes it, so every change completed before the
capture began already has its event in the queue: the capture drains the queue itself,
under the reader's lock (see ``sync``). This is what Watchman's sync cookie establishes (a
file created to wait for its event), without the file.

The journal is a hint that must never be trusted for completeness: a queue overflow, a
watch that cannot be added, the workspace root itself moving, a sync that cannot overtake
the reader, all mark the journal "full", and the next capture scans the whole workspace.
inotify reports a change only to the watch of the directory holding the name it was made
through: captures look again by themselves at files with several names and at mount points
(see ``capturer``), for as long as the path holds the same file even when the other names are
gone (a writer may hold one open). Blind spots left: a file with one name that gains another
outside the workspace (the link reports nowhere here) and is written through it; a file that
gains a second name and loses its first between two captures, written through the first by a
writer holding it open; a directory bind-mounted elsewhere in its own workspace (one watch,
reported under one path); writes through a shared mmap before the file is closed; a file made
with O_TMPFILE, given its name with linkat and then written through its first fd (the writes
are reported to that fd's nameless dentry, which IN_EXCL_UNLINK drops); a change of a
directory's owner or ACL that leaves its mode alone (its mode changing makes the capture scan it
again); changes made on another machine to a network file system (the same as git's fsmonitor);
a workspace that is the upper directory of an overlayfs, written through the overlay's mount (the
overlay opens its real files unwatched, so watches on the upper directory may see no event; watch
the merged directory instead).
A write through an outside name (the first case) is missing from later checkpoints but never
lost to a rollback: the restorer checks each file against its stat identity (the write moved
its ctime) before replacing or removing it, and refuses (see
``tests/hardening/test_outside_hard_link_rollback.py``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from checkpointd.core.workspace.workspace import is_temp_name

try:
    from inotify_simple import INotify, parse_events
    from inotify_simple import flags as in_flags
except ImportError:  # pragma: no cover - exercised only where the library is missing
    INotify = None

log = logging.getLogger("checkpointd.watcher")

#: Dirty-path kinds: the entry itself changed; or a directory appeared, vanished or moved,
#: so everything under it must be scanned again.
ENTRY = 1
SUBTREE = 2

SYNC_TIMEOUT_SECONDS = 5.0
#: Workspaces watched at once; the least recently captured one is dropped beyond this.
MAX_WATCHED_ROOTS = 64
#: A workspace whose watch could not be added is scanned fully for this long before retrying.
RETRY_WATCH_AFTER_SECONDS = 60.0
#: While ``quieted``, how long the reader lets events gather before it reads them.
QUIET_SECONDS = 0.05
#: Dirty paths one workspace's journal holds at most: past them (a build or an install churning
#: through a folder that is not ignored) it is marked full instead, and the next capture scans
#: the workspace whole, which costs less than examining that many paths (and the journal's
#: memory, ~200 bytes a path, stays bounded).
MAX_DIRTY_PATHS = 200_000
#: How long the reader waits before reading the queue again after a read failed unexpectedly.
READ_RETRY_SECONDS = 1.0

if INotify is not None:
    _DIR_MASK = (in_flags.CREATE | in_flags.DELETE | in_flags.MODIFY | in_flags.ATTRIB | in_flags.CLOSE_WRITE
                 | in_flags.MOVED_FROM | in_flags.MOVED_TO | in_flags.DELETE_SELF | in_flags.MOVE_SELF
                 | in_flags.ONLYDIR | in_flags.EXCL_UNLINK)
    _SELF_GONE = in_flags.DELETE_SELF | in_flags.MOVE_SELF
    _DIR_GONE = in_flags.DELETE | in_flags.MOVED_FROM
    _DIR_NEW = in_flags.CREATE | in_flags.MOVED_TO


def available() -> bool:
    return INotify is not None and hasattr(os, "pread")


def _default_watch_budget() -> int:
    """Half the per-user inotify watch limit (other programs of the same user need watches too)."""
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    except (OSError, ValueError):
        limit = 8192
    return max(1024, limit // 2)


@dataclass(eq=False)
class Journal:
    """The watch state of one workspace root."""

    root: str
    identity: tuple[int, int]
    #: directory path ('' is the root) -> watch descriptor
    watches: dict[str, int] = field(default_factory=dict)
    dirty: dict[str, int] = field(default_factory=dict)
    #: The next capture must scan everything (why, for the log).
    full: str = "never scanned"
    last_used: float = field(default_factory=time.monotonic)
    #: How many times watches under it were dropped for a scan that adds them again (``reset``):
    #: until that scan completes, what changes where it has not been yet is seen by no event.
    resets: int = 0


@dataclass(frozen=True)
class Changes:
    """What a capture takes from a journal: dirty paths, or a reason to scan everything."""

    dirty: dict[str, int]
    full: str = ""


def _covered(dirty: dict[str, int], path: str, kind: int) -> bool:
    """Whether a capture taking ``dirty`` looks at ``path`` again as ``kind`` asks (ENTRY: the
    path itself; SUBTREE: all under it too): it is there so, or a directory above it is there whole."""
    if dirty.get(path, 0) & (kind | SUBTREE):
        return True
    while path:
        path = path.rpartition("/")[0]
        if dirty.get(path, 0) & SUBTREE:
            return True
    return False


class Watcher:
    def __init__(self, watch_budget: int | None = None, max_roots: int = MAX_WATCHED_ROOTS) -> None:
        if not available():
            raise OSError(errno.ENOSYS, "inotify is not available")
        self._budget = watch_budget or _default_watch_budget()
        self._max_roots = max_roots
        self._inotify = INotify(nonblocking=True)
        self._lock = threading.Lock()
        #: Held by the reader while it reads and handles a batch of events (see hold_events).
        self._reading = threading.Lock()
        self._journals: dict[str, Journal] = {}
        self._by_wd: dict[int, dict[Journal, str]] = {}
        self._disabled_until: dict[str, float] = {}
        self.overflows = 0
        #: How many ``quieted`` blocks are open; the reader waits on ``_quiet_changed`` meanwhile.
        self._quiet = 0
        self._stopping = False
        self._quiet_changed = threading.Condition()
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)
        self._thread.start()

    # -- the reader -----------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._stop_read, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_read in ready or not self._quiet_wait():
                return
            try:
                with self._reading:
                    self._read_queue()
            except OSError as exc:
                # Kept alive: with no reader, every busy spell between captures would overflow the
                # queue and make the next capture of every workspace a full scan, until a restart.
                # (Captures still read the queue themselves; see ``sync``.)
                log.warning("reading the file-event queue failed (%s); trying again in %.0f s", exc,
                            READ_RETRY_SECONDS)
                with self._quiet_changed:
                    if self._quiet_changed.wait_for(lambda: self._stopping, timeout=READ_RETRY_SECONDS):
                        return

    def _quiet_wait(self) -> bool:
        """While quieted, lets events gather for up to ``QUIET_SECONDS`` (less if the last quiet
        block ends); False if the watcher is stopping."""
        with self._quiet_changed:
            if self._quiet:
                self._quiet_changed.wait_for(lambda: not self._quiet or self._stopping, timeout=QUIET_SECONDS)
            return not self._stopping

    @contextlib.contextmanager
    def quieted(self) -> Iterator[None]:
        """Held while the server writes many files into a workspace itself (a rollback): each write
        queues several events, and a reader woken for each would take the interpreter from the
        writes, file after file (a rollback of ~100 files took a fifth longer). Instead the reader
        reads them in batches, every ``QUIET_SECONDS``. Nothing waits on it: a capture (of any
        workspace) still reads the queue itself when it syncs."""
        with self._quiet_changed:
            self._quiet += 1
        try:
            yield
        finally:
            with self._quiet_changed:
                self._quiet -= 1
                self._quiet_changed.notify_all()

    def _signal_stop(self) -> None:
        with self._quiet_changed:
            self._stopping = True
            self._quiet_changed.notify_all()
        os.write(self._stop_write, b"x")

    def _read_queue(self) -> None:
        """Reads and handles every event queued so far (the caller holds ``_reading``)."""
        data = self._drain()
        if data:
            with self._lock:
                self._handle(parse_events(data))

    def _drain(self) -> bytes:
        parts = []
        while True:
            try:
                chunk = os.read(self._inotify.fileno(), 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                if exc.errno == errno.EBADF:
                    break
                raise
            if not chunk:
                break
            parts.append(chunk)
        return b"".join(parts)

    def _handle(self, events) -> None:
        for event in events:
            mask, wd, name = event.mask, event.wd, event.name
            if mask & in_flags.Q_OVERFLOW:
                self.overflows += 1
                for journal in self._journals.values():
                    journal.full = "the event queue overflowed"
                continue
            owners = self._by_wd.get(wd)
            if not owners:
                continue
            if mask & in_flags.IGNORED:
                for journal, directory in list(owners.items()):
                    if journal.watches.get(directory) == wd:
                        del journal.watches[directory]
                    if directory == "":
                        journal.full = "the workspace root was removed"
                del self._by_wd[wd]
                continue
            for journal, directory in list(owners.items()):
                self._note(journal, directory, mask, name)

    def _note(self, journal: Journal, directory: str, mask: int, name: str) -> None:
        if mask & _SELF_GONE:
            if directory == "":
                journal.full = "the workspace root was moved or removed"
            return
        if is_temp_name(name):
            return
        path = f"{directory}/{name}" if directory and name else (name or directory)
        if not path:
            if mask & in_flags.ATTRIB:
                # The root's own mode or owner changed: what the server may list and enter below
                # it may have changed with it, and no event says what.
                journal.full = "the workspace root's permissions or owner changed"
            return
        kind = ENTRY
        if mask & in_flags.ISDIR and mask & (_DIR_GONE | _DIR_NEW):
            kind = SUBTREE
            if mask & _DIR_GONE:
                self._unwatch_under(journal, path)
        if journal.full:
            return  # the next capture scans the workspace whole: no path needs remembering
        journal.dirty[path] = journal.dirty.get(path, 0) | kind
        if len(journal.dirty) > MAX_DIRTY_PATHS:
            journal.dirty = {}
            journal.full = f"more than {MAX_DIRTY_PATHS:,} paths changed since the last capture"

    # -- watches --------------------------------------------------------------------------

    def journal(self, root: str, root_fd: int) -> Journal | None:
        """The journal of ``root`` (open as ``root_fd``), registered if new; None when the
        workspace cannot be watched now."""
        st = os.fstat(root_fd)
        identity = (st.st_dev, st.st_ino)
        with self._lock:
            if self._disabled_until.get(root, 0.0) > time.monotonic():
                return None
            journal = self._journals.get(root)
            if journal is not None and journal.identity != identity:
                self._drop(journal)
                journal = None
            if journal is None:
                journal = Journal(root, identity)
                self._journals[root] = journal
                self._evict(keep=journal)
            journal.last_used = time.monotonic()
            return journal

    def watch(self, journal: Journal, directory: str, dir_fd: int) -> bool:
        """Watches one directory (open as ``dir_fd``) before it is listed; False when the
        journal had to be given up (watch limit reached)."""
        with self._lock:
            if self._journals.get(journal.root) is not journal:
                return False
            if len(self._by_wd) >= self._budget:
                self._evict(keep=journal, need=1)
            failure = None
            if len(self._by_wd) >= self._budget:
                failure = "the watch budget is used up"
            else:
                try:
                    # Through the fd the scan opened (no symlink followed), not by name: no race.
                    wd = self._inotify.add_watch(f"/proc/self/fd/{dir_fd}", _DIR_MASK)
                except OSError as exc:
                    failure = exc.strerror or str(exc)
            if failure is not None:
                log.warning("not watching %s (%s): its captures scan the whole workspace for %.0f s",
                            journal.root, failure, RETRY_WATCH_AFTER_SECONDS)
                self._disabled_until[journal.root] = time.monotonic() + RETRY_WATCH_AFTER_SECONDS
                self._drop(journal)
                return False
            previous = journal.watches.get(directory)
            if previous is not None and previous != wd:
                self._forget_watch(journal, directory, previous)
            journal.watches[directory] = wd
            self._by_wd.setdefault(wd, {})[journal] = directory
            return True

    def _forget_watch(self, journal: Journal, directory: str, wd: int) -> None:
        owners = self._by_wd.get(wd)
        if owners is not None and owners.get(journal) == directory:
            del owners[journal]
            if not owners:
                del self._by_wd[wd]
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(wd)

    def _unwatch_under(self, journal: Journal, prefix: str) -> None:
        """Stops watching ``prefix`` and everything under it (it moved away or is rescanned)."""
        if prefix == "":
            doomed = list(journal.watches.items())
        else:
            inner = prefix + "/"
            doomed = [(d, wd) for d, wd in journal.watches.items() if d == prefix or d.startswith(inner)]
        for directory, wd in doomed:
            del journal.watches[directory]
            self._forget_watch(journal, directory, wd)

    def reset(self, journal: Journal, prefix: str = "") -> None:
        """Drops the watches under ``prefix`` ahead of a scan that adds them again."""
        with self._lock:
            journal.resets += 1
            self._unwatch_under(journal, prefix)

    def _drop(self, journal: Journal) -> None:
        self._unwatch_under(journal, "")
        if self._journals.get(journal.root) is journal:
            del self._journals[journal.root]
        journal.full = "the workspace is no longer watched"

    def _evict(self, keep: Journal, need: int = 0) -> None:
        """Drops least recently used journals beyond the root count or the watch budget."""
        others = sorted((j for j in self._journals.values() if j is not keep), key=lambda j: j.last_used)
        for journal in others:
            if len(self._journals) <= self._max_roots and len(self._by_wd) + need <= self._budget:
                return
            self._drop(journal)

    def watch_count(self) -> int:
        with self._lock:
            return len(self._by_wd)

    # -- capturing ------------------------------------------------------------------------

    def sync(self, timeout: float = SYNC_TIMEOUT_SECONDS) -> bool:
        """Returns once every event of a change completed before the call has been handled (or
        the queue overflowed, which marks every journal full); False when the reader's lock could
        not be had within ``timeout``, or the queue could not be read.

        The events are in the queue already (inotify queues them within the system call that
        causes them): reading it here, holding the reader's lock so that nothing it read is
        still unhandled, is all it takes."""
        if not self._reading.acquire(timeout=timeout):
            return False
        try:
            self._read_queue()
            return True
        except OSError as exc:
            log.warning("watch sync failed: %s", exc)
            return False
        finally:
            self._reading.release()

    def take(self, journal: Journal) -> Changes:
        """Takes the journal's dirty paths (call after ``sync``); they are the capture's to
        process, or to hand back with ``give_back`` if it fails."""
        with self._lock:
            if self._journals.get(journal.root) is not journal:
                return Changes({}, journal.full or "the workspace is no longer watched")
            changes = Changes(journal.dirty, journal.full)
            journal.dirty = {}
            journal.full = ""
            return changes

    def give_back(self, journal: Journal, changes: Changes) -> None:
        """Returns what a failed capture took, so that the next capture processes it."""
        with self._lock:
            for path, kind in changes.dirty.items():
                journal.dirty[path] = journal.dirty.get(path, 0) | kind
            if changes.full and not journal.full:
                journal.full = changes.full

    def add_unreported(self, journal: Journal, paths: Mapping[str, tuple[int, list[str]]]) -> list[str]:
        """Marks ``paths`` dirty as an event would have (call after ``sync``): each as its kind
        (ENTRY or SUBTREE; '' as SUBTREE: the whole workspace), unless the journal holds it so
        already, or holds every file that showed it (``paths``' second item: events reported
        those; none left, nothing to mark); returns those marked."""
        with self._lock:
            if self._journals.get(journal.root) is not journal or journal.full:
                return []
            added = [path for path, (kind, witnesses) in paths.items()
                     if not _covered(journal.dirty, path, kind)
                     and not all(_covered(journal.dirty, witness, ENTRY) for witness in witnesses)]
            for path in added:
                if path:
                    journal.dirty[path] = journal.dirty.get(path, 0) | paths[path][0]
                else:
                    journal.full = "a recheck found the workspace root's entries changed without an event"
            return added

    def journals(self) -> list[Journal]:
        """The workspaces watched now."""
        with self._lock:
            return list(self._journals.values())

    def mark_full(self, journal: Journal, reason: str) -> None:
        with self._lock:
            journal.full = reason

    def stop_reader(self) -> None:
        """Fault injection for tests: the reader thread ends; captures still see every event."""
        self._signal_stop()
        self._thread.join(timeout=5)

    @contextlib.contextmanager
    def hold_events(self) -> Iterator[None]:
        """Fault injection for tests: events pile up in the kernel queue (until it overflows)
        while this is held; a capture's sync waits for it (up to its timeout)."""
        with self._reading:
            yield

    def close(self) -> None:
        self._signal_stop()
        self._thread.join(timeout=5)
        with self._lock:
            for journal in list(self._journals.values()):
                self._drop(journal)
        self._inotify.close()
        os.close(self._stop_read)
        os.close(self._stop_write)
