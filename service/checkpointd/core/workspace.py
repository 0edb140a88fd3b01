"""Confined access to one workspace directory.

Every operation walks from the root's file descriptor one component at a time with
O_NOFOLLOW, so no read or write can be redirected outside the root by a symlink, by
``..`` or by a directory swapped in mid-operation. Files are replaced atomically
(temporary name in the same directory, fsync, rename).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterable, Iterator

from checkpointd.core.errors import FailedPrecondition, InvalidArgument, Reason

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".checkpointd-tmp-"


class UnsafePath(Exception):
    """A path component is a symlink or not a directory where one was needed."""


def validate_relpath(path: str, field: str = "paths") -> str:
    """A workspace-relative, '/'-separated path with no '.', '..' or empty components."""
    if not path or path.startswith("/") or "\0" in path:
        raise InvalidArgument(Reason.INVALID_PATH, f"path {path!r} must be relative and non-empty",
                              field=field, path=path)
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidArgument(Reason.INVALID_PATH, f"path {path!r} has an empty, '.' or '..' component",
                              field=field, path=path)
    return path


def is_under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


class Workspace:
    def __init__(self, root: str) -> None:
        self.root = root

    @contextlib.contextmanager
    def root_fd(self) -> Iterator[int]:
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise FailedPrecondition(
                Reason.WORKSPACE_UNAVAILABLE,
                f"workspace root {self.root} is not an accessible directory: {exc.strerror}",
                workspace_root=self.root,
            ) from exc
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def dir_fd(self, path: str) -> Iterator[int]:
        """An fd of directory ``path`` ('' is the root), reached without following links."""
        with self.root_fd() as root:
            fd = os.dup(root)
            try:
                for part in filter(None, path.split("/")):
                    try:
                        nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except OSError as exc:
                        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                            raise UnsafePath(path) from exc
                        raise
                    os.close(fd)
                    fd = nxt
                yield fd
            finally:
                os.close(fd)

    def lstat(self, path: str) -> os.stat_result | None:
        parent, _, name = path.rpartition("/")
        try:
            with self.dir_fd(parent) as fd:
                return os.lstat(name, dir_fd=fd)
        except (FileNotFoundError, UnsafePath, NotADirectoryError):
            return None

    def read_small(self, path: str, limit: int = 1 << 20) -> bytes | None:
        """A regular file's content (None when absent, not regular, or larger than limit)."""
        parent, _, name = path.rpartition("/")
        try:
            with self.dir_fd(parent) as dfd:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except (OSError, UnsafePath):
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
                return None
            return f.read(limit + 1)[:limit]

    def listdir(self, path: str) -> list[str]:
        try:
            with self.dir_fd(path) as fd:
                return os.listdir(fd)
        except (FileNotFoundError, NotADirectoryError, UnsafePath):
            return []

    def make_dir(self, path: str, mode: int) -> None:
        parent, _, name = path.rpartition("/")
        with self.dir_fd(parent) as fd:
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                st = os.lstat(name, dir_fd=fd)
                if not stat.S_ISDIR(st.st_mode):
                    raise UnsafePath(path) from None
            os.chmod(name, mode | 0o700, dir_fd=fd, follow_symlinks=False)

    def set_dir_mode(self, path: str, mode: int) -> None:
        with self.dir_fd(path) as fd:
            os.fchmod(fd, mode)

    def write_file(self, path: str, chunks: Iterable[bytes], mode: int) -> None:
        parent, _, name = path.rpartition("/")
        with self.dir_fd(parent) as dfd:
            temp = f"{_TEMP_PREFIX}{uuid.uuid4().hex}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in chunks:
                        out.write(chunk)
                    out.flush()
                    os.fchmod(out.fileno(), mode)
                    os.fsync(out.fileno())
                self._replace(temp, name, dfd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=dfd)
                raise

    def write_symlink(self, path: str, target: str) -> None:
        parent, _, name = path.rpartition("/")
        with self.dir_fd(parent) as dfd:
            temp = f"{_TEMP_PREFIX}{uuid.uuid4().hex}"
            os.symlink(target, temp, dir_fd=dfd)
            try:
                self._replace(temp, name, dfd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=dfd)
                raise

    @staticmethod
    def _replace(temp: str, name: str, dfd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(name, dir_fd=dfd)
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePath(name)
        os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)

    def remove(self, path: str) -> None:
        """Removes a file or symlink (never a directory)."""
        parent, _, name = path.rpartition("/")
        with self.dir_fd(parent) as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)

    def remove_empty_dir(self, path: str) -> bool:
        """Removes a directory only if it is empty; True when it is gone."""
        parent, _, name = path.rpartition("/")
        try:
            with self.dir_fd(parent) as fd:
                os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        return True
