"""Snapshot engine: turns a workspace on disk (or a part of it) into a stored tree.

A per-workspace stat index (see ``stat_index``) means an unchanged file is never read again.
A scan walks directories through file descriptors, never following links; files that
must be read are hashed and stored by a small thread pool (reading, hashing and
compressing release the GIL). Once a scan has found many files to read (a first capture),
new files go to reader processes instead (see ``readers``): what a scan does per file
besides system calls and compression holds the GIL, so only processes use every core.

A capture whose caller gave up stops at its next check of the batch's token (per directory,
every ``CHECK_EVERY`` entries, per file read, between the chunks of a large file), raising
``Cancelled`` once the reads it handed out have ended (see ``cancellation_of``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from checkpointd.core.capture.ignore import GITIGNORE, MAX_GITIGNORE_BYTES, IgnoreRules, Oversized
from checkpointd.core.capture.readers import Readers, TooLarge, chunks
from checkpointd.core.capture.stat_index import Indexed, RootIndex, StatIndex
from checkpointd.core.kernel import heap
from checkpointd.core.kernel.cancellation import CHECK_EVERY, NEVER, Cancellation
from checkpointd.core.store.content_store import Batch, ContentStore, UnreadableSource, digest_bytes
from checkpointd.core.store.tree import Entry, EntryKind, Trees
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT, OUT_OF_RESOURCES
from checkpointd.core.workspace.workspace import Inaccessible, UnsafePath, Workspace, is_temp_name

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A directory this many levels below the root is captured; one deeper is not entered (it is
#: reported as skipped): trees, diffs and restores recurse once per level, and a walk holds
#: a descriptor per level.
MAX_DIR_DEPTH = 256
#: How many times an entry that changes type while it is captured (a directory that becomes
#: a symlink...) is looked at again before it is reported as skipped.
ENTRY_ATTEMPTS = 3
#: errno values of an entry that is no longer the type it was a moment ago.
FLIPPED = (errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EINVAL, errno.EISDIR)
#: A directory with at least this many files to read hands them to the thread pool.
_PARALLEL_MIN_FILES = 8
#: A scan that has found this many files to read hands the next ones to reader processes.
READERS_MIN_FILES = 2000

SKIP_TOO_LARGE = "FILE_TOO_LARGE"
SKIP_UNSUPPORTED = "UNSUPPORTED_FILE_TYPE"
SKIP_UNREADABLE = "UNREADABLE"
#: A name the server gives its own temporary files (see ``workspace.is_temp_name``).
SKIP_SERVER_TEMPORARY = "SERVER_TEMPORARY_FILE"
#: A directory deeper than ``MAX_DIR_DEPTH``: neither it nor anything under it is captured.
SKIP_TOO_DEEP = "TOO_DEEP"
#: An entry that kept changing type while it was captured (``ENTRY_ATTEMPTS`` looks).
SKIP_CHANGING = "CHANGED_DURING_CAPTURE"
#: A .gitignore over ``ignore.MAX_GITIGNORE_BYTES``: captured, but its patterns were not applied.
SKIP_GITIGNORE_TOO_LARGE = "GITIGNORE_TOO_LARGE"

#: Called with (relative directory path, its open fd) before a directory is listed.
DirectoryHook = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    size: int
    reason: str


#: A file's identity: (st_dev, st_ino).
Inode = tuple[int, int]


@dataclass(slots=True)
class CaptureResult:
    tree: str
    file_count: int = 0
    total_size: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    #: Captured (or too large) regular files with more than one name, and their inodes: a write
    #: through another name, maybe outside the workspace, is reported to no watch of ours.
    linked: dict[str, Inode] = field(default_factory=dict)
    #: Paths added by ``Snapshotter.capture_paths`` (ignored or skipped by the capture): the stat
    #: index says nothing of what was read there.
    unindexed: set[str] = field(default_factory=set)


@dataclass(slots=True)
class ScanTally:
    """What one scan found, besides its tree: counts, skips, and what the index learned."""

    file_count: int = 0
    total_size: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    fresh: dict[str, Indexed] = field(default_factory=dict)
    #: Every regular file seen (captured or not): index entries of other paths are stale.
    seen: set[str] = field(default_factory=set)
    #: See ``CaptureResult.linked``.
    linked: dict[str, Inode] = field(default_factory=dict)
    #: Files handed to be read so far, and whether reader processes take them (None: not asked yet).
    reading: int = 0
    readers: bool | None = None
    #: Reads started in the background (see ``Snapshotter.scan``).
    handed: list = field(default_factory=list)
    #: Walked directories whose nodes are not written yet, children first (see ``_build_ready``).
    unbuilt: deque = field(default_factory=deque)


def stored(batch: Batch, store: ContentStore, digest: str) -> bool:
    """Whether ``digest`` may be referenced without writing it again (see ``Batch.reuse``;
    other stores' batches may lack it)."""
    reuse = getattr(batch, "reuse", None)
    return reuse(digest) if reuse is not None else store.has(digest)


def cancellation_of(batch: Batch) -> Cancellation:
    """The token of the operation ``batch`` is written for (see ``Batch.cancel``): a capture into
    it checks the token per directory, every ``CHECK_EVERY`` entries, per file read and between
    the chunks of a large file, and stops (raising ``Cancelled``) once the caller gave up."""
    return getattr(batch, "cancel", NEVER)


def when_finished(batch: Batch, callback: Callable[[bool], None]) -> bool:
    """Registers ``callback(committed)`` with the batch; False when the batch cannot tell."""
    register = getattr(batch, "when_finished", None)
    if register is None:
        return False
    register(callback)
    return True


def _by_path(skipped: Skipped) -> str:
    return skipped.path


def disk_rules(workspace: Workspace, patterns: list[str], excluded: list[str]) -> IgnoreRules:
    def load(directory: str) -> bytes | Oversized | None:
        path = f"{directory}/{GITIGNORE}" if directory else GITIGNORE
        content = workspace.read_small(path, MAX_GITIGNORE_BYTES)
        if content is None:
            st = workspace.lstat(path)
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > MAX_GITIGNORE_BYTES:
                return Oversized(st.st_size)
        return content

    return IgnoreRules(patterns, load, excluded)


def reporting_unapplied(skipped: Iterable[Skipped], rules: IgnoreRules) -> list[Skipped]:
    """``skipped`` and the .gitignore files whose patterns ``rules`` could not apply, by path
    (such a file is captured, and also listed, so that what it meant to leave out is explained)."""
    by_path = {s.path: s for s in skipped}
    for path, size in rules.unapplied.items():
        by_path[path] = Skipped(path, size, SKIP_GITIGNORE_TOO_LARGE)
    return sorted(by_path.values(), key=_by_path)


def file_mode(st: os.stat_result) -> int:
    """Permission bits with setuid, setgid and sticky (restore sets them all back)."""
    return stat.S_IMODE(st.st_mode)


def too_deep(path: str) -> bool:
    """Whether directory ``path`` is below ``MAX_DIR_DEPTH`` (it is not entered)."""
    return path.count("/") >= MAX_DIR_DEPTH


def symlink_entry(target: str) -> Entry:
    raw = os.fsencode(target)
    return Entry(EntryKind.SYMLINK, 0o777, len(raw), digest_bytes(raw), target)


class Snapshotter:
    def __init__(self, store: ContentStore, trees: Trees, index: StatIndex, workers: int = 0,
                 reader_processes: int | None = None, readers_min_files: int = READERS_MIN_FILES) -> None:
        """``reader_processes``: how many reader processes large scans use (None: one per
        core when there are several; 0: none)."""
        self.store = store
        self.trees = trees
        self.index = index
        self._workers = workers or min(4, (os.cpu_count() or 1) + 1)
        self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="snapshot")
        if reader_processes is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            reader_processes = min(4, cores) if cores > 1 else 0
        self.readers = Readers(reader_processes, _read_unstated) if reader_processes > 0 else None
        self._readers_min_files = readers_min_files

    def close(self) -> None:
        """Stops the reader processes and threads (captures must be over), and writes out the
        stat index's queued updates."""
        if self.readers is not None:
            self.readers.close()
        self._pool.shutdown(wait=False)
        self.index.close()

    def capture(self, workspace: Workspace, rules: IgnoreRules, max_file_size: int, batch: Batch,
                on_dir: DirectoryHook | None = None) -> CaptureResult:
        """Stores every captured file of the workspace in ``batch``; returns the tree.

        The stat index learns the files read once the batch is committed. A workspace's first
        capture (its stat index is empty) makes a long-lived object or three per file, so garbage
        collection is paused from here until its batch is finished (see ``heap``). Later full
        scans mostly replace objects: they leave the collector alone, so that scans following
        each other (the watcher off) never keep it paused.
        """
        indexed = self.index.for_root(workspace.root)
        first = not indexed.entries
        if first:
            heap.pause()
        try:
            tally = ScanTally()
            with workspace.root_fd() as root_fd:
                tree = self.scan(os.dup(root_fd), "", rules, max_file_size, batch, indexed, tally, on_dir)
            stale = [path for path in indexed.paths() if path not in tally.seen]
            self.remember(batch, indexed, tally.fresh, stale)
        except BaseException:
            if first:
                heap.resume()
            raise
        if first and not when_finished(batch, lambda _committed: heap.resume()):
            heap.resume()
        return CaptureResult(tree, tally.file_count, tally.total_size, reporting_unapplied(tally.skipped, rules),
                             tally.linked)

    @staticmethod
    def remember(batch: Batch, indexed: RootIndex, fresh: dict[str, Indexed], stale: list[str]) -> None:
        """Updates the stat index when ``batch`` commits (its digests are stored only then)."""
        if (fresh or stale) and not when_finished(
                batch, lambda committed: indexed.update(fresh, stale) if committed else None):
            indexed.update(fresh, stale)

    def scan(self, dir_fd: int, prefix: str, rules: IgnoreRules, max_size: int, batch: Batch,
             indexed: RootIndex, tally: ScanTally, on_dir: DirectoryHook | None = None) -> str:
        """Captures the directory open as ``dir_fd`` (closed here) at ``prefix`` ('' or 'a/b/')
        and everything under it; returns its tree digest.

        The walk hands files to read to the thread pool and goes on walking; tree nodes are
        written afterwards, bottom-up, as the reads complete."""
        with self.readers.using() if self.readers is not None else contextlib.nullcontext():
            try:
                walked = self._walk(dir_fd, prefix, rules, max_size, batch, indexed, tally, on_dir)
                return self._build(walked, batch, tally)
            except BaseException:
                # Nothing may write into the batch once the caller has aborted it.
                for part in tally.handed:
                    with contextlib.suppress(BaseException):
                        self._results(part)
                raise

    def _walk(self, dir_fd: int, prefix: str, rules: IgnoreRules, max_size: int, batch: Batch,
              indexed: RootIndex, tally: ScanTally, on_dir: DirectoryHook | None) -> _Walked:
        walked = _Walked()
        children = walked.children
        to_read = walked.to_read
        handed_over = False
        cancel = cancellation_of(batch)
        try:
            cancel.check()
            if on_dir is not None:
                on_dir(prefix.rstrip("/"), dir_fd)
            with os.scandir(dir_fd) as it:
                listing = sorted(it, key=_name)
            if not any(de.name == GITIGNORE for de in listing):
                rules.note_absent(prefix[:-1])
            # Reader processes stat the files they open: a file with nothing indexed need not be.
            unstated = tally.readers is True
            for count, de in enumerate(listing, 1):
                if not count % CHECK_EVERY:
                    cancel.check()
                name = de.name
                path = prefix + name
                if is_temp_name(name):
                    if not rules.ignores_entry(path, is_dir=de.is_dir(follow_symlinks=False)):
                        _skip_temporary(de, path, tally)
                    continue
                if unstated and de.is_file(follow_symlinks=False) and path not in indexed.entries:
                    tally.seen.add(path)
                    if not rules.ignores_entry(path, is_dir=False):
                        to_read.append((name, path, None, ""))
                    continue
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except PermissionError:
                    # A directory the server may list but not enter (mode r without x).
                    tally.skipped.append(Skipped(path, 0, SKIP_UNREADABLE))
                    continue
                # An entry can change type between its stat and what is done with it: it is looked
                # at again, a few times, then reported as skipped.
                for _attempt in range(ENTRY_ATTEMPTS):
                    mode = st.st_mode
                    if stat.S_ISDIR(mode):
                        if rules.ignores_entry(path, is_dir=True):
                            break
                        if too_deep(path):
                            tally.skipped.append(Skipped(path, 0, SKIP_TOO_DEEP))
                            break
                        try:
                            sub_fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
                        except OSError as exc:
                            if exc.errno in FLIPPED:
                                st = _restat(dir_fd, name)
                                if st is None:
                                    break
                                continue
                            if exc.errno in OUT_OF_RESOURCES:
                                raise  # the server ran short, not the directory: never left out for it
                            tally.skipped.append(Skipped(path, 0, SKIP_UNREADABLE))
                            break
                        sub = self._walk(sub_fd, path + "/", rules, max_size, batch, indexed, tally, on_dir)
                        walked.subdirs.append((name, file_mode(st), sub))
                        break
                    if stat.S_ISREG(mode):
                        tally.seen.add(path)
                    if rules.ignores_entry(path, is_dir=False):
                        break
                    if stat.S_ISREG(mode):
                        if st.st_nlink > 1:
                            tally.linked[path] = (st.st_dev, st.st_ino)
                        if st.st_size > max_size:
                            tally.skipped.append(Skipped(path, st.st_size, SKIP_TOO_LARGE))
                            break
                        known = indexed.get(path)
                        if known is not None and known.matches(st) and stored(batch, self.store, known.digest):
                            children[name] = Entry(EntryKind.FILE, file_mode(st), known.size, known.digest)
                            tally.file_count += 1
                            tally.total_size += known.size
                        else:
                            to_read.append((name, path, st, known.digest if known is not None else ""))
                        break
                    if stat.S_ISLNK(mode):
                        try:
                            entry = symlink_entry(os.readlink(name, dir_fd=dir_fd))
                        except OSError as exc:
                            if exc.errno not in FLIPPED:
                                tally.skipped.append(Skipped(path, 0, SKIP_UNREADABLE))
                                break
                            st = _restat(dir_fd, name)
                            if st is None:
                                break
                            continue
                        children[name] = entry
                        tally.file_count += 1
                        tally.total_size += entry.size
                        break
                    tally.skipped.append(Skipped(path, st.st_size, SKIP_UNSUPPORTED))
                    break
                else:
                    tally.skipped.append(Skipped(path, 0, SKIP_CHANGING))
            walked.read_at = time.time_ns()
            if to_read:
                tally.reading += len(to_read)
                handed_over = self._hand_over(dir_fd, walked, max_size, batch, tally)
        finally:
            if not handed_over:
                os.close(dir_fd)
        tally.unbuilt.append(walked)
        self._build_ready(batch, tally)
        return walked

    def _build_ready(self, batch: Batch, tally: ScanTally) -> None:
        """Writes the nodes of walked directories whose reads are all done, in the order they
        were walked (children first): the end of a scan has less left to do."""
        unbuilt = tally.unbuilt
        while unbuilt and all(_done(part) for part in unbuilt[0].parts):
            self._build(unbuilt.popleft(), batch, tally)
        if len(tally.handed) > 1024:
            tally.handed = [part for part in tally.handed if not _done(part)]

    def _use_readers(self, batch: Batch, tally: ScanTally) -> bool:
        if tally.readers is None:
            if self.readers is None or not isinstance(batch, Batch) or tally.reading < self._readers_min_files:
                return False
            tally.readers = self.readers.start()
        return tally.readers

    def _hand_over(self, dir_fd: int, walked: _Walked, max_size: int, batch: Batch, tally: ScanTally) -> bool:
        """Starts reading ``walked.to_read`` (reordered: reader processes' share first);
        whether ``dir_fd`` was handed over (closed once the reads are done)."""
        to_read = walked.to_read
        pooled: list[tuple[str, str, os.stat_result | None, str]] = []
        rest = to_read
        if self._use_readers(batch, tally):
            # A file with a previous version is stored here, as a delta against it.
            pooled = [item for item in to_read
                      if not item[3] and (item[2] is None or item[2].st_size <= COMPRESS_LIMIT)]
            if len(pooled) < len(to_read):
                rest = [item for item in to_read
                        if item[3] or (item[2] is not None and item[2].st_size > COMPRESS_LIMIT)]
                walked.to_read = pooled + rest
            else:
                rest = []
        pooled_chunks = chunks([name for name, _, _, _ in pooled],
                               [st.st_size if st is not None else -1 for _, _, st, _ in pooled])
        names = [(name, similar) for name, _, _, similar in rest]
        threaded: list[list[tuple[str, str]]] = []
        inline = None
        if len(names) >= _PARALLEL_MIN_FILES:
            step = -(-len(names) // self._workers)
            threaded = [names[i:i + step] for i in range(0, len(names), step)]
        elif names:
            inline = _read_files(dir_fd, names, batch)
        parts: list[Future | list | _FromReaders] = []
        if pooled_chunks or threaded:
            closer = _CloseWhenDone(dir_fd, len(pooled_chunks) + len(threaded))
            for chunk in pooled_chunks:
                future = self.readers.submit(dir_fd, chunk, max_size, batch, closer.done)
                parts.append(_FromReaders(future) if future is not None else self._pool.submit(
                    _read_files, dir_fd, [(name, "") for name in chunk], batch, closer, max_size))
            parts.extend(self._pool.submit(_read_files, dir_fd, chunk, batch, closer) for chunk in threaded)
        tally.handed.extend(parts)
        if inline is not None:
            parts.append(inline)
        walked.parts = parts
        return bool(pooled_chunks or threaded)

    def _build(self, walked: _Walked, batch: Batch, tally: ScanTally) -> str:
        if walked.digest:
            return walked.digest
        children = walked.children
        for name, mode, sub in walked.subdirs:
            children[name] = Entry(EntryKind.DIR, mode, 0, self._build(sub, batch, tally))
        results = [result for part in walked.parts for result in self._results(part)]
        for (name, path, st, _), result in zip(walked.to_read, results, strict=True):
            if result is None:
                tally.skipped.append(Skipped(path, st.st_size if st is not None else 0, SKIP_UNREADABLE))
                continue
            if isinstance(result, TooLarge):
                if result.st_nlink > 1:
                    tally.linked[path] = (result.st_dev, result.st_ino)
                tally.skipped.append(Skipped(path, result.size, SKIP_TOO_LARGE))
                continue
            entry, opened = result
            if opened.st_nlink > 1:
                tally.linked[path] = (opened.st_dev, opened.st_ino)
            if entry.size == opened.st_size:
                tally.fresh[path] = Indexed(entry.size, opened.st_mtime_ns, opened.st_ctime_ns, opened.st_ino,
                                            entry.digest, walked.read_at)
            children[name] = entry
            tally.file_count += 1
            tally.total_size += entry.size
        walked.digest = self.trees.write(batch, children)
        # Only the digest is needed from now on.
        walked.children, walked.to_read, walked.subdirs, walked.parts = {}, [], [], []
        return walked.digest

    def _results(self, part: list | Future | _FromReaders) -> list:
        if isinstance(part, _FromReaders):
            return self.readers.result(part.future)
        if isinstance(part, Future):
            return part.result()
        return part

    def capture_paths(self, workspace: Workspace, paths: list[str], batch: Batch) -> dict[str, Entry]:
        """Entries for specific paths, whatever the ignore rules and size cap say.

        Used for a rollback's safety checkpoint: anything the rollback will replace must
        be recoverable, even a file the current rules leave out. Missing paths are absent.
        A path that keeps changing type while it is read raises ``UnsafePath`` (the rollback
        stops before changing anything).
        """
        out: dict[str, Entry] = {}
        cancel = cancellation_of(batch)
        for path in paths:
            cancel.check()
            parent, _, name = path.rpartition("/")
            try:
                with workspace.dir_fd(parent) as dfd:
                    for _attempt in range(ENTRY_ATTEMPTS):
                        st = _restat(dfd, name)
                        if st is None:
                            break
                        try:
                            entry = _entry_at(dfd, name, st, batch)
                        except UnreadableSource as exc:
                            raise Inaccessible(path, exc) from exc  # opened, but its read fails
                        except OSError as exc:
                            if exc.errno in FLIPPED or exc.errno == errno.ENXIO:
                                continue  # changed kind since its lstat (ENXIO: a socket or device now)
                            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                                raise Inaccessible(path, exc) from exc  # a lease another process holds
                            raise
                        if entry is not None:
                            out[path] = entry
                        break
                    else:
                        raise UnsafePath(path)
            except PermissionError as exc:
                raise Inaccessible(path, exc) from exc
        return out


def _entry_at(dir_fd: int, name: str, st: os.stat_result, batch: Batch) -> Entry | None:
    """The entry ``name`` is, as ``st`` says, with its content stored (None: not a kind captured)."""
    mode = file_mode(st)
    if stat.S_ISDIR(st.st_mode):
        return Entry(EntryKind.DIR, mode)
    if stat.S_ISLNK(st.st_mode):
        return symlink_entry(os.readlink(name, dir_fd=dir_fd))
    if not stat.S_ISREG(st.st_mode):
        return None
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise OSError(errno.EISDIR, "no longer a regular file")
        digest, size = batch.put_fd(fd, opened.st_size)
    finally:
        os.close(fd)
    return Entry(EntryKind.FILE, file_mode(opened), size, digest)


def _name(entry: os.DirEntry) -> str:
    return entry.name


def _restat(dir_fd: int, name: str) -> os.stat_result | None:
    """What ``name`` is now (None: gone)."""
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def _skip_temporary(de: os.DirEntry, path: str, tally: ScanTally) -> None:
    """A server's temporary file (a rollback's, in flight or left by a crash) is not captured,
    but reported: nothing of a workspace is left out silently."""
    try:
        size = de.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return
    tally.skipped.append(Skipped(path, size, SKIP_SERVER_TEMPORARY))


def _done(part: list | Future | _FromReaders) -> bool:
    if isinstance(part, _FromReaders):
        return part.future.done()
    return part.done() if isinstance(part, Future) else True


class _FromReaders(NamedTuple):
    """Results that reader processes are working out (see ``Readers.result``)."""

    future: Future


class _Walked:
    """One directory as walked: entries known at once, files being read, subdirectories."""

    __slots__ = ("children", "to_read", "subdirs", "parts", "read_at", "digest")

    def __init__(self) -> None:
        self.children: dict[str, Entry] = {}
        #: (name, path, stat (None: not taken, see ``_walk``), digest of its previous version or "")
        self.to_read: list[tuple[str, str, os.stat_result | None, str]] = []
        self.subdirs: list[tuple[str, int, _Walked]] = []
        #: The results of ``to_read``, in order: lists of them, or futures of such lists.
        self.parts: list[Future | list | _FromReaders] = []
        self.read_at = 0
        #: Its node's digest, once written.
        self.digest = ""


class _CloseWhenDone:
    """Closes a directory fd once every chunk of reads from it has finished."""

    def __init__(self, fd: int, chunks: int) -> None:
        self._fd = fd
        self._left = chunks
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            os.close(self._fd)


def _read_files(dir_fd: int, names: list[tuple[str, str]], batch: Batch, closer: _CloseWhenDone | None = None,
                max_size: int | None = None) -> list[tuple[Entry, os.stat_result] | TooLarge | None]:
    cancel = cancellation_of(batch)
    try:
        out: list[tuple[Entry, os.stat_result] | TooLarge | None] = []
        for name, similar in names:
            cancel.check()
            out.append(read_file(dir_fd, name, batch, similar, max_size))
        return out
    finally:
        if closer is not None:
            closer.done()


def _read_unstated(dir_fd: int, names: list[tuple[str, str]], batch: Batch,
                   max_size: int) -> list[tuple[Entry, os.stat_result] | TooLarge | None]:
    """Reads, in the server, files a reader process was to read (see ``Readers``)."""
    return _read_files(dir_fd, names, batch, None, max_size)


def read_file(dir_fd: int, name: str, batch: Batch, similar: str = "",
              max_size: int | None = None) -> tuple[Entry, os.stat_result] | TooLarge | None:
    """Stores one regular file's content (``similar``: its previous version's digest, if
    known); None when it cannot be read as a regular file. With ``max_size`` (for a file not
    checked against it yet), a larger file is not read: ``TooLarge``."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in OUT_OF_RESOURCES:
            raise  # the server ran short, not the file: a checkpoint must not leave it out for that
        return None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            return None
        if max_size is not None and opened.st_size > max_size:
            return TooLarge(opened.st_size, opened.st_nlink, opened.st_dev, opened.st_ino)
        if similar and isinstance(batch, Batch):
            digest, size = batch.put_fd(fd, opened.st_size, similar)
        else:
            digest, size = batch.put_fd(fd, opened.st_size)
    except UnreadableSource:
        return None  # opened but its read fails (EIO, a special file system): skipped as unreadable
    finally:
        os.close(fd)
    return Entry(EntryKind.FILE, file_mode(opened), size, digest), opened
