"""Reader processes: the file reads of a large scan, on every core.

Threads cannot spread a scan over several cores: what a scan does per file besides the
system calls and the compression holds the GIL. A large scan (see ``Snapshotter``) hands
its reads, a directory at a time, to a few reader processes (``readworker``): each opens
the files through the directory's descriptor, passed over a socket, hashes and compresses
them, and sends back the pack records, which the server appends to its own store in the
scan's batch. So the store has a single writer and ``Batch.commit`` semantics are those of
any other write: nothing is counted as stored, or referenced, before the batch is durable.

Readers are fresh interpreters (never a fork of the threaded server), started on the first
large scan and stopped after a while without one. If one dies, the tasks it had are read
by the server itself, and the scan goes on.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import marshal
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple

import zstandard

from checkpointd.core.store.content_store import Batch
from checkpointd.core.store.tree import Entry, EntryKind
from checkpointd.core.workspace import readworker

log = logging.getLogger("checkpointd.readers")

#: Tasks sent to one reader and not answered yet, at most (bounds memory and open descriptors).
MAX_IN_FLIGHT = 8
#: A task takes at most this many files, and files of at most this many bytes in all.
TASK_FILES = 64
TASK_BYTES = 2 << 20
#: Where a reader (isolated from site-packages) imports zstandard from: where the server does.
_ZSTANDARD_HOME = os.path.dirname(os.path.dirname(zstandard.__file__))
#: glibc malloc gives freed memory back to the system eagerly; a reader allocates and frees
#: buffers for every file, and would take page faults for each one.
_READER_ENV = {"MALLOC_TRIM_THRESHOLD_": str(16 << 20), "MALLOC_TOP_PAD_": str(1 << 20)}
#: Readers with nothing to do for this long are stopped.
IDLE_SECONDS = 60.0

#: Reads files in the server itself: (dir fd, [(name, similar digest)], batch, max size) -> results.
Fallback = Callable[[int, list[tuple[str, str]], Batch, int], list]


class Opened(NamedTuple):
    """The parts of a file's stat (taken once opened) a scan keeps."""

    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int
    st_ino: int
    st_nlink: int
    st_dev: int


class TooLarge(NamedTuple):
    """A file found larger than the scan's size cap once opened."""

    size: int
    st_nlink: int
    st_dev: int
    st_ino: int


def chunks(names: list[str], sizes: list[int]) -> list[list[str]]:
    """Splits one directory's files into tasks (see ``TASK_FILES``, ``TASK_BYTES``); a
    negative size is unknown."""
    if all(size < 0 for size in sizes):
        return [names[i:i + TASK_FILES] for i in range(0, len(names), TASK_FILES)]
    out: list[list[str]] = []
    current: list[str] = []
    size = name_bytes = 0
    for name, item_size in zip(names, sizes, strict=True):
        item_size = max(item_size, 0)
        length = len(name) * 4 + 8
        if current and (len(current) >= TASK_FILES or size + item_size > TASK_BYTES
                        or name_bytes + length > readworker.MAX_TASK_BYTES // 2):
            out.append(current)
            current, size, name_bytes = [], 0, 0
        current.append(name)
        size += item_size
        name_bytes += length
    if current:
        out.append(current)
    return out


class _Task:
    __slots__ = ("task_id", "reader", "dir_fd", "names", "max_size", "batch", "done", "future", "claimed")

    def __init__(self, task_id: int, reader: _Reader, dir_fd: int, names: list[str], max_size: int, batch: Batch,
                 done: Callable[[], None]) -> None:
        self.task_id = task_id
        self.reader = reader
        self.dir_fd = dir_fd
        self.names = names
        self.max_size = max_size
        self.batch = batch
        #: Called once the directory's descriptor is no longer needed for this task.
        self.done = done
        self.future: Future = Future()
        #: Its answer (or the news that it will get none) is queued, or it was taken back.
        self.claimed = False


class _Reader:
    """One reader process, its task socket, and the thread that takes its answers."""

    def __init__(self, owner: Readers) -> None:
        self._owner = owner
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        answers, answers_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", readworker.__file__, str(theirs.fileno()), str(answers_w),
                 _ZSTANDARD_HOME],
                pass_fds=(theirs.fileno(), answers_w), stdin=subprocess.DEVNULL, close_fds=True,
                env={**os.environ, **_READER_ENV})
        except BaseException:
            ours.close()
            os.close(answers)
            raise
        finally:
            theirs.close()
            os.close(answers_w)
        self.tasks = ours
        self._send_lock = threading.Lock()
        #: Tasks handed over and not yet completed (their answer may be waiting in the queue).
        self.in_flight: dict[int, _Task] = {}
        self.alive = True
        self._answers = os.fdopen(answers, "rb", buffering=1 << 20)
        self._thread = threading.Thread(target=self._receive, name=f"reader-{self.process.pid}", daemon=True)
        self._thread.start()

    def send(self, task: _Task) -> bool:
        """Hands a task over (registered in ``in_flight`` by the caller); False if the reader
        is gone and the task was taken back (the caller reads it itself)."""
        message = marshal.dumps((task.task_id, task.max_size, [os.fsencode(name) for name in task.names]))
        try:
            with self._send_lock:
                socket.send_fds(self.tasks, [message], [task.dir_fd])
            return True
        except OSError as exc:
            log.warning("reader %d does not take tasks (%s)", self.process.pid, exc)
            self.stop()
            with self._owner.changed:
                if task.claimed:
                    return True
                task.claimed = True
                del self.in_flight[task.task_id]
                return False

    def _receive(self) -> None:
        """Queues each answer for a scanning thread to complete (the GIL-heavy part stays
        with the threads that scan, not competing with them)."""
        header = readworker.FRAME
        owner = self._owner
        try:
            while True:
                head = self._answers.read(header.size)
                if len(head) < header.size:
                    break
                (length,) = header.unpack(head)
                payload = self._answers.read(length)
                if len(payload) < length:
                    break
                task_id, results = marshal.loads(payload)
                with owner.changed:
                    task = self.in_flight.get(task_id)
                    if task is not None and not task.claimed:
                        task.claimed = True
                        owner.answered.append((task, results))
                        owner.changed.notify_all()
        except Exception:
            log.exception("reader %d answered something unreadable", self.process.pid)
        self._died()

    def _died(self) -> None:
        """The reader is gone (or spoke nonsense): the scans read what it had themselves."""
        owner = self._owner
        with owner.changed:
            self.alive = False
            orphans = [task for task in self.in_flight.values() if not task.claimed]
            for task in orphans:
                task.claimed = True
                owner.answered.append((task, None))
            owner.changed.notify_all()
        if orphans:
            log.warning("reader %d stopped with %d task(s) in hand; the server reads them",
                        self.process.pid, len(orphans))
        self.stop()
        with contextlib.suppress(OSError):
            self._answers.close()
        with self._send_lock:
            self.tasks.close()

    def stop(self) -> None:
        """Closes the task socket (the reader exits when it sees that) and reaps the process."""
        with contextlib.suppress(OSError):
            self.tasks.shutdown(socket.SHUT_RDWR)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Readers:
    """A few reader processes, started on demand (see module docstring).

    Answers are completed (records appended to the batch, futures resolved) by the scanning
    threads themselves, in ``submit`` and ``result``."""

    def __init__(self, processes: int, fallback: Fallback, idle_seconds: float = IDLE_SECONDS) -> None:
        self.processes = processes
        self.fallback = fallback
        self.idle_seconds = idle_seconds
        self.changed = threading.Condition()
        #: (task, results) received and not yet completed; results None: read it in the server.
        self.answered: collections.deque[tuple[_Task, list | None]] = collections.deque()
        self._readers: list[_Reader] = []
        self._ids = itertools.count(1)
        self._users = 0
        self._last_used = time.monotonic()
        self._reaper: threading.Timer | None = None
        self._closed = False

    @contextlib.contextmanager
    def using(self):
        """Held by a scan while it may hand tasks over: readers are not stopped for idleness."""
        with self.changed:
            self._users += 1
        try:
            yield
        finally:
            with self.changed:
                self._users -= 1
                self._last_used = time.monotonic()
                if self._users == 0 and self._readers and self._reaper is None and not self._closed:
                    self._reaper = threading.Timer(self.idle_seconds, self._reap)
                    self._reaper.daemon = True
                    self._reaper.start()

    def start(self) -> bool:
        """Starts the readers not running; whether any runs."""
        with self.changed:
            if self._closed:
                return False
            self._readers = [reader for reader in self._readers if reader.alive]
            while len(self._readers) < self.processes:
                try:
                    if not sys.executable:
                        raise OSError("no Python executable to start")
                    self._readers.append(_Reader(self))
                except Exception as exc:  # noqa: BLE001 - reading in the server is always possible
                    log.warning("cannot start a reader process (%s); reading in the server", exc)
                    break
            return bool(self._readers)

    def submit(self, dir_fd: int, names: list[str], max_size: int, batch: Batch,
               done: Callable[[], None]) -> Future | None:
        """Reads ``names`` (files of the directory open as ``dir_fd``) in a reader process:
        a future of their results, in order (None, ``TooLarge``, or (entry, ``Opened``)); get
        it with ``result``. None when no reader runs (``done`` is not called then)."""
        while True:
            while self._complete_one():
                pass
            with self.changed:
                alive = [reader for reader in self._readers if reader.alive]
                if not alive:
                    return None
                reader = min(alive, key=lambda r: len(r.in_flight))
                if len(reader.in_flight) < MAX_IN_FLIGHT:
                    task = _Task(next(self._ids), reader, dir_fd, names, max_size, batch, done)
                    reader.in_flight[task.task_id] = task
                    break
                if not self.answered:
                    self.changed.wait(1.0)
        if not reader.send(task):
            return None
        return task.future

    def result(self, future: Future) -> list:
        """The results of a task, completing answers (any scan's) while waiting for it."""
        while not future.done():
            if not self._complete_one():
                with self.changed:
                    if not self.answered and not future.done():
                        self.changed.wait(1.0)
        return future.result()

    def _complete_one(self) -> bool:
        with self.changed:
            if not self.answered:
                return False
            task, results = self.answered.popleft()
        try:
            self._complete(task, results)
        finally:
            with self.changed:
                task.reader.in_flight.pop(task.task_id, None)
                self.changed.notify_all()
        return True

    def _complete(self, task: _Task, results: list | None) -> None:
        try:
            if results is None:
                out = self.fallback(task.dir_fd, [(name, "") for name in task.names], task.batch, task.max_size)
            else:
                out = []
                records = []
                for name, result in zip(task.names, results, strict=True):
                    if result is None:
                        out.append(None)
                    elif len(result) == 9:
                        mode, st_size, mtime_ns, ctime_ns, ino, nlink, dev, size, record = result
                        digest = record[:32].hex()
                        records.append((digest, record))
                        out.append((Entry(EntryKind.FILE, stat.S_IMODE(mode), size, digest),
                                    Opened(st_size, mtime_ns, ctime_ns, ino, nlink, dev)))
                    elif result[0] == readworker.TOO_LARGE:
                        out.append(TooLarge(*result[1:]))
                    else:
                        out.append(self.fallback(task.dir_fd, [(name, "")], task.batch, task.max_size)[0])
                task.batch.put_records(records)
        except BaseException as exc:
            task.done()
            task.future.set_exception(exc)
            return
        task.done()
        task.future.set_result(out)

    def _reap(self) -> None:
        with self.changed:
            self._reaper = None
            if self._users or time.monotonic() - self._last_used < self.idle_seconds * 0.9:
                return
            readers, self._readers = self._readers, []
        for reader in readers:
            reader.stop()

    def pids(self) -> list[int]:
        with self.changed:
            return [reader.process.pid for reader in self._readers if reader.alive]

    def close(self) -> None:
        with self.changed:
            self._closed = True
            readers, self._readers = self._readers, []
            if self._reaper is not None:
                self._reaper.cancel()
        for reader in readers:
            reader.stop()
