"""openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: a directory below a directory fd, reached
in one system call with the guarantees of a walk of one O_NOFOLLOW component at a time (no symlink
followed anywhere on the path, nothing outside the starting directory), instead of an open and a
close per component. Linux 5.6 and newer; where the kernel (or a seccomp filter) refuses the call,
``open_dir`` says so once and the caller walks.

Resolution differs from such a walk in one way only: a directory passed through needs search
permission, not read permission too (the walk opened each one)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: openat2's number: system calls added since Linux 5.1 have one number on every architecture
#: but alpha's (which adds 110).
_SYS_OPENAT2 = 437


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load():
    if platform.system() != "Linux" or platform.machine() == "alpha":
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    return call


_syscall = _load()
_HOW = _OpenHow(_DIR_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS)
_HOW_SIZE = ctypes.c_size_t(ctypes.sizeof(_OpenHow))
#: Errors meaning "this kernel has no openat2 (or not this struct)": walk from now on.
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.E2BIG)
#: Errors after which this one path is walked instead: a lookup raced a rename (EAGAIN), or a
#: seccomp filter that answers EPERM for calls it does not know (the walk then says what is wrong).
_WALK_THIS_ONE = (errno.EAGAIN, errno.EPERM)


def open_dir(dir_fd: int, path: str) -> int | None:
    """An fd of directory ``path`` (relative, '/'-separated, no '.' or '..') below ``dir_fd``;
    None when openat2 cannot be used (walk instead). Raises OSError: ELOOP or ENOTDIR for a
    symlink or non-directory on the path, EXDEV for an escape, ENOENT, EACCES..."""
    global _syscall
    if _syscall is None:
        return None
    while True:
        fd = _syscall(_SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(_HOW), _HOW_SIZE)
        if fd >= 0:
            return fd
        error = ctypes.get_errno()
        if error == errno.EINTR:
            continue
        if error in _WALK_THIS_ONE:
            return None
        if error in _UNSUPPORTED:
            _syscall = None
            return None
        raise OSError(error, os.strerror(error), path)
