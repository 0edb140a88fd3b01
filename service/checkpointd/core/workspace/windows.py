"""Owner-write windows: a read-only directory the server owns gets its owner's write bit for each
change a rollback makes among its entries (root ignores the bit; a server that is not root would
fail there for good), and its mode back right after. A window is journaled before it first opens
in a run and journaled closed when the run ends (``WindowJournal``), so whoever finishes a
rollback killed with a window open sets the mode back (``Workspace.close_window``), and only on a
directory with that identity (``Window.dev``, ``Window.ino`` and, where the file system records
it, ``Window.born_ns``: a directory made after the kill may get the freed inode number)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
from typing import NamedTuple, Protocol


class Window(NamedTuple):
    """A directory made owner-writable: the mode to put back and the directory's identity."""

    path: str
    mode: int
    dev: int
    ino: int
    #: The directory's birth time (statx ``btime``) in ns; 0 where the file system keeps none.
    born_ns: int = 0

    @property
    def writable(self) -> int:
        return self.mode | stat.S_IWUSR

    def same_directory(self, st: os.stat_result, born_ns: int) -> bool:
        """Whether ``st`` (born at ``born_ns``) is this window's directory: the same inode, and
        the same birth where both are known (an inode number is reused once freed)."""
        return ((st.st_dev, st.st_ino) == (self.dev, self.ino)
                and not (self.born_ns and born_ns and born_ns != self.born_ns))


class WindowJournal(Protocol):
    def opening(self, window: Window) -> None:
        """Records ``window`` durably before it opens; what it raises stops the change."""

    def closed(self, window: Window) -> None:
        """``window`` is closed (its mode set back, or taken over by a mode step). Never raises."""


class _StatxTimestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_reserved", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    """``struct statx`` (linux/stat.h) up to the timestamps, padded to its full 256 bytes."""

    _fields_ = [
        ("stx_mask", ctypes.c_uint32), ("stx_blksize", ctypes.c_uint32), ("stx_attributes", ctypes.c_uint64),
        ("stx_nlink", ctypes.c_uint32), ("stx_uid", ctypes.c_uint32), ("stx_gid", ctypes.c_uint32),
        ("stx_mode", ctypes.c_uint16), ("_spare0", ctypes.c_uint16), ("stx_ino", ctypes.c_uint64),
        ("stx_size", ctypes.c_uint64), ("stx_blocks", ctypes.c_uint64), ("stx_attributes_mask", ctypes.c_uint64),
        ("stx_atime", _StatxTimestamp), ("stx_btime", _StatxTimestamp), ("stx_ctime", _StatxTimestamp),
        ("stx_mtime", _StatxTimestamp), ("_rest", ctypes.c_uint8 * 128),
    ]


_AT_EMPTY_PATH = 0x1000
_STATX_BTIME = 0x800
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_statx = getattr(_libc, "statx", None)


def born_ns(fd: int) -> int:
    """The birth time in ns of the file open at ``fd``; 0 where the kernel, the C library or the
    file system does not report one."""
    if _statx is None:
        return 0
    buf = _Statx()
    if _statx(fd, b"", _AT_EMPTY_PATH, _STATX_BTIME, ctypes.byref(buf)) != 0 or not buf.stx_mask & _STATX_BTIME:
        return 0
    return buf.stx_btime.tv_sec * 1_000_000_000 + buf.stx_btime.tv_nsec
