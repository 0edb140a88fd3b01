"""Mount points inside workspaces, which the file watcher cannot vouch for.

inotify reports what happens to the inodes it watches. A mount or an unmount inside a workspace
changes what a path shows without any event; a file bind-mounted from elsewhere changes when it
is written through its other path, which reports only to that path's directory; a network or
FUSE file system changes without the kernel knowing. So every capture re-examines the mount
points under its workspace, and those that appeared or went since the last capture.

The table is ``/proc/self/mountinfo`` (the server's own mount namespace). The kernel marks that
file readable-with-priority (``POLLPRI``) when the table changes, so it is read again only then:
with nothing mounted or unmounted, a capture costs one ``poll`` here.
"""

from __future__ import annotations

import logging
import os
import re
import select
import threading

log = logging.getLogger("checkpointd.mounts")

MOUNTINFO = "/proc/self/mountinfo"
#: Octal escapes the kernel writes for space, tab, newline and backslash in a mount point.
_ESCAPE = re.compile(rb"\\([0-7]{3})")


class MountTableUnavailable(OSError):
    """The mount table cannot be read: no capture may then trust the watcher."""


def parse_mount_points(data: bytes) -> tuple[str, ...]:
    """The mount points (field 5) of a mountinfo text."""
    points = []
    for line in data.splitlines():
        fields = line.split(b" ", 5)
        if len(fields) >= 5:
            points.append(os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), fields[4])))
    return tuple(points)


class MountTable:
    """The server's mount points, re-read only when the kernel says the table changed."""

    def __init__(self, path: str = MOUNTINFO) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._poller = select.poll()
        self._points: tuple[str, ...] = ()
        self._under: dict[str, frozenset[str]] = {}

    def _read(self) -> None:
        fd = self._fd
        os.lseek(fd, 0, os.SEEK_SET)
        parts = []
        while chunk := os.read(fd, 1 << 16):
            parts.append(chunk)
        self._points = parse_mount_points(b"".join(parts))
        self._under.clear()

    def _refresh(self) -> None:
        """Called with the lock held. Polling clears the kernel's "changed" mark, so the table is
        polled before it is read: a change made during the read marks it again."""
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
                self._poller.register(self._fd, select.POLLPRI | select.POLLERR)
                self._poller.poll(0)
                self._read()
            elif self._poller.poll(0):
                self._read()
        except OSError as exc:
            if self._fd is not None:
                os.close(self._fd)
                self._poller = select.poll()
                self._fd = None
            raise MountTableUnavailable(exc.errno, f"cannot read {self._path}: {exc.strerror or exc}") from exc

    def under(self, root: str) -> frozenset[str]:
        """Mount points strictly under ``root`` (an absolute path without symlinks), relative to it."""
        with self._lock:
            self._refresh()
            found = self._under.get(root)
            if found is None:
                inner = root.rstrip("/") + "/"
                found = frozenset(point[len(inner):] for point in self._points if point.startswith(inner))
                if len(self._under) > 1024:
                    self._under.clear()
                self._under[root] = found
            return found

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
