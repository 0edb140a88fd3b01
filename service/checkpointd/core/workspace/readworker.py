"""The reader process of large scans (see ``readers``), and the record-body encoding it
shares with the content store.

Standard library only, but for zstandard (imported on first use): a reader starts as a
fresh interpreter (never a fork of the server), isolated (``-I -S``), so it must import little
to start quickly; it is told where the server's zstandard lives (the third argument).

A reader gets tasks on a SOCK_SEQPACKET socket: one message
``marshal((task, max_size, names))`` with the directory's file descriptor attached
(SCM_RIGHTS); it opens each name relative to that descriptor, never following a link,
and answers on a pipe with a frame ``length (4, big-endian) | marshal((task, results))``.
A result is None (not a regular file, or unreadable), ``(TOO_LARGE, size, nlink, dev, ino)``
(larger than ``max_size``; then its link count, device and inode), ``(ELSEWHERE,)`` (larger than
what a reader handles, or not opened for want of descriptors or memory: the server reads it), or
``(mode, st_size, mtime_ns, ctime_ns, ino, nlink, dev, size, record)``: the opened file's stat,
then how many bytes were read and the pack record storing them (``RECORD`` header, body). A reader
writes nothing anywhere else: the server appends the records to its store.
It exits when the task socket closes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import marshal
import os
import socket
import stat
import struct
import sys
import threading

RAW = b"R"
#: Written by stores before zstd; still read.
ZLIB = b"Z"
ZSTD = b"S"
#: zstd level 2: as small as zlib level 1 on source text, in about a quarter of its time
#: (and three times faster to read back).
ZSTD_LEVEL = 2
#: Objects up to this size are compressed in memory when that makes them smaller, and packed.
COMPRESS_LIMIT = 1 << 20
TOO_LARGE = "L"
ELSEWHERE = "E"
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: errno values that say nothing of a path, only that the process ran short: never taken for a
#: file or directory that cannot be read (a checkpoint would leave it out, and a rollback to it
#: leave it as it then is).
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)
FRAME = struct.Struct(">I")
#: A pack record's header: digest (SHA-256) | kind | body length (see ``store.packs``).
RECORD = struct.Struct(">32scI")
#: Largest task message (names and framing): well below an AF_UNIX socket's buffer.
MAX_TASK_BYTES = 64 << 10
#: A task's answer carries files of at most about this many bytes; the server reads the rest.
ANSWER_BYTES = 4 << 20
_CHUNK = 1 << 20

#: Bytes that make up text; a sample with many others is taken for incompressible binary.
_TEXT_BYTES = bytes(range(32, 127)) + b"\t\n\r\f\b"


def looks_incompressible(data: bytes) -> bool:
    sample = data[:512]
    return len(sample.translate(None, _TEXT_BYTES)) * 3 > len(sample) and len(set(sample)) > 200


_codecs = threading.local()


def zstd_compressor(level: int = ZSTD_LEVEL):
    """This thread's zstd compressor at ``level`` (one is not to be shared between threads)."""
    compressors = getattr(_codecs, "compressors", None)
    if compressors is None:
        compressors = _codecs.compressors = {}
    compressor = compressors.get(level)
    if compressor is None:
        import zstandard

        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor


def pack_body(data: bytes, level: int = ZSTD_LEVEL) -> tuple[bytes, bytes]:
    """(kind, body): zstd at ``level``, kept when it makes the data smaller; content that looks
    random is not even tried."""
    if len(data) < 64 or looks_incompressible(data):
        return RAW, data
    packed = zstd_compressor(level).compress(data)
    return (ZSTD, packed) if len(packed) < len(data) else (RAW, data)


def _read_bounded(fd: int, expected_size: int) -> bytes | None:
    """Everything readable from ``fd`` (one read when the file has the size it was expected
    to), or None past ``COMPRESS_LIMIT`` (a file growing meanwhile)."""
    first = os.read(fd, expected_size + 1)
    if len(first) == expected_size:
        return first
    parts, total = [first], len(first)
    while total <= COMPRESS_LIMIT and (chunk := os.read(fd, _CHUNK)):
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts) if total <= COMPRESS_LIMIT else None


#: Files opened, and their reads started, ahead of the one being read (a few fds at a time).
READ_AHEAD = 32


class _Opened:
    """A regular file this reader will read: open, its read from disk already started."""

    __slots__ = ("fd", "stat")

    def __init__(self, fd: int, opened: os.stat_result) -> None:
        self.fd = fd
        self.stat = opened


def _open(dir_fd: int, name: bytes, max_size: int, read_more: bool):
    """The file opened (never through a link) with its pages asked for, when this reader is to
    read it; otherwise what to answer for it."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        # A reader short of descriptors or memory says nothing of the file: the server reads it
        # (and fails the scan if it is short too).
        return (ELSEWHERE,) if exc.errno in OUT_OF_RESOURCES else None
    keep = False
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            return None
        if opened.st_size > max_size:
            return TOO_LARGE, opened.st_size, opened.st_nlink, opened.st_dev, opened.st_ino
        if opened.st_size > COMPRESS_LIMIT or not read_more:
            return (ELSEWHERE,)
        # The disk starts on it now, while the files before it are read and packed.
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        keep = True
        return _Opened(fd, opened)
    except OSError:
        return (ELSEWHERE,)
    finally:
        if not keep:
            os.close(fd)


def _read_opened(found: _Opened):
    opened = found.stat
    try:
        data = _read_bounded(found.fd, opened.st_size)
    except OSError:
        return (ELSEWHERE,)
    finally:
        os.close(found.fd)
    if data is None:
        return (ELSEWHERE,)
    kind, body = pack_body(data)
    return (opened.st_mode, opened.st_size, opened.st_mtime_ns, opened.st_ctime_ns, opened.st_ino,
            opened.st_nlink, opened.st_dev, len(data),
            RECORD.pack(hashlib.sha256(data).digest(), kind, len(body)) + body)


def read_task(dir_fd: int, names: list[bytes], max_size: int) -> list:
    """One task's answers. Files are opened, and their reads started, ``READ_AHEAD`` at a time
    before the first of them is read, so that the disk serves them together rather than one
    after another. Once the task's files add up to ``ANSWER_BYTES``, the rest are left to the
    server."""
    budget = ANSWER_BYTES
    results = []
    for start in range(0, len(names), READ_AHEAD):
        ahead = []
        try:
            for name in names[start:start + READ_AHEAD]:
                entry = _open(dir_fd, name, max_size, budget >= 0)
                if isinstance(entry, _Opened):
                    budget -= entry.stat.st_size
                ahead.append(entry)
            for index, entry in enumerate(ahead):
                if isinstance(entry, _Opened):
                    ahead[index] = None
                    entry = _read_opened(entry)
                results.append(entry)
        finally:
            for entry in ahead:
                if isinstance(entry, _Opened):
                    os.close(entry.fd)
    return results


def serve(tasks: socket.socket, answers: int) -> None:
    while True:
        message, fds, _, _ = socket.recv_fds(tasks, MAX_TASK_BYTES, 1)
        if not message:
            return
        try:
            task, max_size, names = marshal.loads(message)
            results = read_task(fds[0], names, max_size) if fds else [(ELSEWHERE,)] * len(names)
        finally:
            for fd in fds:
                os.close(fd)
        payload = marshal.dumps((task, results))
        view = memoryview(FRAME.pack(len(payload)) + payload)
        while view:
            view = view[os.write(answers, view):]


def main() -> None:
    tasks = socket.socket(fileno=int(sys.argv[1]))
    answers = int(sys.argv[2])
    sys.path.append(sys.argv[3])
    with contextlib.suppress(BrokenPipeError, ConnectionError, KeyboardInterrupt):
        serve(tasks, answers)


if __name__ == "__main__":
    main()
