"""Confined access to one workspace directory.

Every operation reaches its directory from ``/`` without following a symlink at any component
(the root's stored path is already resolved, so it has none): with one openat2(2) with
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it (``beneath``), else by walking
one component at a time with O_NOFOLLOW. So no read or write can be redirected outside the
root by a symlink, by ``..`` or by a directory swapped in mid-operation, whether inside the
workspace or above it; and right before a change, the directory it is made in is resolved again
and must still be the one opened (``_still_at``), so a directory moved out of the root while a
file was being written into it is never changed. Files
are replaced atomically (temporary name in the same directory, fsync, rename); the rename
replaces a symlink itself, never what it points to, and never writes into a hard-linked
inode. Outside a batch every change is on the disk when its call returns: a file's content
before its rename, and the directory whose entry was renamed, removed or made, or whose mode was
set, right after the change (``_changing``; an undo relies on it, see ``restore``). Within
``batched_sync`` the fsyncs are deferred instead: each file and directory written joins a
``SyncBatch`` that the caller flushes before it acknowledges anything (a rollback's journal entry
covers the writes until then; see ``restore``).

Every call that replaces or removes a path takes a ``check``: called with the parent
directory's fd and the name just before the rename, unlink, rmdir or mkdir, it raises if the
path is no longer what the caller expects (see ``restore.restorer``). A temporary file is written and
synced (or, batched, fully written) before its check, so the check-to-rename window is one
``lstat``, the directory's resolution and one ``rename``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
import stat
from collections.abc import Callable, Iterable, Iterator

from checkpointd.core.kernel.errors import FailedPrecondition, InvalidArgument, Reason
from checkpointd.core.kernel.faults import Point, crash_point
from checkpointd.core.workspace import beneath
from checkpointd.core.workspace.readworker import OUT_OF_RESOURCES
from checkpointd.core.workspace.syncbatch import SyncBatch, SyncFailed, sync_file_systems
from checkpointd.core.workspace.windows import Window, WindowJournal, born_ns

log = logging.getLogger("checkpointd.workspace")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The one name prefix the server creates in workspaces (see ``Workspace._temp_name``).
TEMP_PREFIX = ".checkpointd-tmp-"
#: The whole of such a name: the prefix, an optional 32-hex tag and '-', a 32-hex uuid.
_TEMP_NAME = re.compile(r"\.checkpointd-tmp-(?:[0-9a-f]{32}-)?[0-9a-f]{32}\Z")
#: errno values meaning "a path component is not the directory it was": a symlink or file
#: where a directory was expected, or a directory where a file was.
_SWAPPED = (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)


#: Called with (parent directory fd, name) just before a path is replaced or removed; raises to stop.
Check = Callable[[int, str], None]


#: errno values of a resource the files a batch holds (``SyncBatch.release_later``) may be using up.
_EXHAUSTED = (errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE)
#: Linux's O_PATH (a descriptor that only references an inode); elsewhere nothing is held.
_O_PATH = getattr(os, "O_PATH", None)


class UnsafePath(Exception):
    """A path component is a symlink or not a directory where one was needed."""


class Inaccessible(Exception):
    """The server may not read or enter a workspace path (EACCES or EPERM: its permission bits,
    an immutable file, a read-only or root-squashed mount)."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(f"{path!r}: {cause.strerror or cause}")
        self.path = path
        self.cause = cause


def _no_check(_dir_fd: int, _name: str) -> None:
    return None


def validate_relpath(path: str, field: str = "paths") -> str:
    """A workspace-relative, '/'-separated path with no '.', '..' or empty components."""
    if not path or path.startswith("/") or "\0" in path:
        raise InvalidArgument(Reason.INVALID_PATH, f"path {path!r} must be relative and non-empty",
                              field=field, path=path)
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidArgument(Reason.INVALID_PATH, f"path {path!r} has an empty, '.' or '..' component",
                              field=field, path=path)
    return path


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is exactly what the server names its temporary files: only such names
    are left out of captures (and reported as skipped); a user's file that merely starts with
    the prefix is captured like any other."""
    return name.startswith(TEMP_PREFIX) and _TEMP_NAME.match(name) is not None


def is_under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _close(held: tuple[int, int] | None) -> None:
    if held is not None:
        os.close(held[0])


_slash_fd: int | None = None


def _slash() -> int:
    """An fd of ``/``, kept: every openat2 starts there."""
    global _slash_fd
    if _slash_fd is None:
        _slash_fd = os.open("/", _DIR_FLAGS)
    return _slash_fd


def _open_dir_below(root: int, path: str) -> int:
    """An fd of directory ``path`` below ``root`` ('' is the root itself), walked one component at
    a time without following a link; UnsafePath when a component is a symlink or not a directory."""
    try:
        return _walk(os.dup(root), path)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(path) from exc
        raise


def _open_no_symlinks(path: str) -> int:
    """An fd of the directory at absolute ``path``, refusing a symlink at any component."""
    return _walk(os.open("/", _DIR_FLAGS), path)


def _walk(fd: int, path: str) -> int:
    """From directory ``fd`` (taken over: closed on the way) down ``path``, one O_NOFOLLOW
    component at a time."""
    try:
        for part in filter(None, path.split("/")):
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


class Workspace:
    def __init__(self, root: str, temp_tag: str = "", windows: WindowJournal | None = None) -> None:
        #: An absolute path without symlinks (as stored for a plan: resolved when it was set).
        self.root = root
        #: Names this workspace's temporary files, so that they can be found after a crash.
        self.temp_tag = temp_tag
        #: Where owner-write windows are journaled (see ``windows``); None: not journaled.
        self.windows = windows
        #: Within ``windows_open``: the windows journaled so far, journaled closed when it ends.
        self._journaled: list[Window] | None = None
        #: Within ``batched_sync``: where writes defer their fsyncs to.
        self._pending: SyncBatch | None = None

    @contextlib.contextmanager
    def batched_sync(self) -> Iterator[SyncBatch]:
        """Writes, renames and removals within skip their own fsyncs and join the batch yielded,
        which the caller must ``flush`` before it reports them done (what is left unflushed is
        dropped unsynced when the block ends)."""
        pending = self._pending = SyncBatch()
        try:
            yield pending
        finally:
            self._pending = None
            pending.close()

    def _synced_dir(self, path: str, fd: int) -> None:
        """Directory ``fd`` (at ``path``) is about to have an entry created, renamed or removed, or
        its mode set: durable at the batch's flush. Called before the change (and before its check,
        to keep the check-to-change window short): joining may flush a full batch, and if that
        fails nothing must have changed yet. Only batched: unbatched, the change syncs the
        directory itself once it is made (``_changing``, ``set_dir_mode``)."""
        if self._pending is not None:
            self._pending.add_dir(path, fd)

    @contextlib.contextmanager
    def root_fd(self) -> Iterator[int]:
        fd = self._open_dir("")
        try:
            yield fd
        finally:
            os.close(fd)

    def _unavailable(self, exc: OSError) -> FailedPrecondition:
        why = "a component is now a symlink" if exc.errno == errno.ELOOP else exc.strerror
        return FailedPrecondition(Reason.WORKSPACE_UNAVAILABLE,
                                  f"workspace root {self.root} is not an accessible directory: {why}",
                                  workspace_root=self.root)

    @contextlib.contextmanager
    def dir_fd(self, path: str) -> Iterator[int]:
        """An fd of directory ``path`` ('' is the root), reached without following links."""
        fd = self._open_dir(path)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, path: str) -> int:
        """Directory ``path`` resolved from ``/`` in one openat2 (see ``beneath``); on any failure,
        or without openat2, walked the old way, which also tells a root that is not reachable
        (FailedPrecondition) from a path below it that is unsafe (UnsafePath) or missing."""
        with contextlib.suppress(OSError):
            fd = beneath.open_dir(_slash(), f"{self.root}/{path}".strip("/"))
            if fd is not None:
                return fd
        try:
            root = _open_no_symlinks(self.root)
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                raise
            raise self._unavailable(exc) from exc
        try:
            return _open_dir_below(root, path)
        finally:
            os.close(root)

    def _still_at(self, path: str, fd: int) -> None:
        """Raises UnsafePath unless directory ``fd`` is still the one at ``path``: called right
        before a change made through it, so that a directory moved out of the root (or swapped
        for another) after it was opened is never written in."""
        try:
            again = self._open_dir(path)
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                raise
            raise UnsafePath(path) from exc
        except (UnsafePath, FailedPrecondition) as exc:
            raise UnsafePath(path) from exc
        try:
            now, held = os.fstat(again), os.fstat(fd)
        finally:
            os.close(again)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise UnsafePath(path)

    @contextlib.contextmanager
    def windows_open(self) -> Iterator[None]:
        """Within, each read-only directory's window is journaled once, however many changes open
        it, and journaled closed when the block ends: one commit per directory per run. A block
        that ends in an error may not have synced a window's directory (a change that failed is
        not synced, nor does its directory join a batch): each is synced first, or left
        journaled open for whoever finishes the rollback (``close_window``) if it cannot be."""
        self._journaled = []
        failed = True
        try:
            yield
            failed = False
        finally:
            journaled, self._journaled = self._journaled, None
            if self.windows is not None:
                for window in journaled:
                    if not failed or self._synced_window(window):
                        self.windows.closed(window)

    def _synced_window(self, window: Window) -> bool:
        """Syncs ``window``'s directory (its mode set back) if it is still at its path; whether
        its close may be journaled (False: the sync failed)."""
        try:
            with self.dir_fd(window.path) as fd:
                if window.same_directory(os.fstat(fd), born_ns(fd)):
                    os.fsync(fd)
        except (FileNotFoundError, NotADirectoryError, UnsafePath, FailedPrecondition):
            return True  # gone or replaced: nothing of the window's is left at its path
        except OSError as exc:
            log.warning("could not sync directory %r after its window closed: %s", window.path, exc.strerror)
            return False
        return True

    @contextlib.contextmanager
    def _changing(self, path: str, sync: bool = True) -> Iterator[int]:
        """``dir_fd`` for a change to the entries of directory ``path``. One without its owner's
        write bit (a read-only directory the user made, or a rollback restored and its undo must
        take back) gets the bit for the change when the server owns it, so a server that is not
        root does what root does (root ignores the bit) instead of failing there for good: a
        window (``windows``), journaled before it opens, closed through the same fd right after
        the change, and then only if nobody changed the mode meanwhile. The window spans one
        change, not the run: a capture meanwhile (another plan's, whose workspace holds this one)
        records the user's mode.

        Unbatched (outside ``batched_sync``), the change is on the disk before the caller goes on
        (an undo counts a change done only then; see ``restore.restorer``): a rename is synced by
        ``_replace`` right after it (``sync=False`` here), any other change (a new or removed
        entry) by this block when it has made it, after the window closes; and with a window, the
        directory is synced after its mode is set back in any case, so that the user's mode is on
        the disk too. Not when the block raises: its change is not counted done, and whoever
        finishes the rollback sees what the disk holds. Batched, the caller joins the directory to
        the batch instead (``_synced_dir``)."""
        with self.dir_fd(path) as fd:
            window = self._open_window(path, fd)
            if window is None:
                yield fd
            else:
                try:
                    yield fd
                finally:
                    self._close(window, fd)
            if self._pending is None and (sync or window is not None):
                os.fsync(fd)

    def _open_window(self, path: str, fd: int) -> Window | None:
        """Opens ``path``'s window if it needs one (None if not)."""
        st = os.fstat(fd)
        born = -1
        for _attempt in range(3):
            mode = stat.S_IMODE(st.st_mode)
            if (st.st_mode & stat.S_IWUSR or st.st_uid != os.geteuid()
                    or (mode & stat.S_ISGID and st.st_gid != os.getegid() and st.st_gid not in os.getgroups())):
                # Not ours, or a setgid bit that our fchmod would clear (the kernel does, for a
                # caller outside the directory's group): change nothing, fail as before.
                return None
            if born < 0:
                # Only a journaled window is ever compared with a directory found later (close_window).
                born = born_ns(fd) if self.windows is not None else 0
            window = Window(path, mode, st.st_dev, st.st_ino, born)
            if self.windows is None or (self._journaled is not None and window in self._journaled):
                break
            self.windows.opening(window)
            if self._journaled is not None:
                self._journaled.append(window)
            st = os.fstat(fd)
            if stat.S_IMODE(st.st_mode) == mode:
                break
            # chmod-ed while the window was journaled: that mode is the user's
            if self._journaled is not None:
                self._journaled.remove(window)
            self.windows.closed(window)
        else:
            return None  # the mode keeps changing: left to whoever changes it (the change may then fail)
        os.fchmod(fd, window.writable)
        return window

    def _close(self, window: Window, fd: int) -> None:
        """Sets ``window``'s mode back through ``fd`` unless someone chmod-ed the directory since
        (to another mode than the window's: changes made inside move its ctime anyway, so a chmod
        to that very mode cannot be told apart), or it was removed meanwhile. Outside
        ``windows_open`` its close is journaled here, once the directory is synced (unbatched): the
        entry stops naming the window at the next synced commit of anyone, and a mode set back
        that a power cut then loses would leave the directory writable with nothing to set it
        back (within ``windows_open`` the closes are journaled after the run's syncs). Never
        raises: the change it follows has been made (a failure is logged, the directory left
        writable, and a window not synced left journaled open for the finisher to check)."""
        try:
            st = os.fstat(fd)
            if st.st_nlink and stat.S_IMODE(st.st_mode) == window.writable:
                os.fchmod(fd, window.mode)
            if self.windows is not None and self._journaled is None and self._pending is None:
                os.fsync(fd)
        except OSError as exc:
            log.warning("could not set the mode of %r back to %o: %s", window.path, window.mode, exc.strerror)
            return
        if self.windows is not None and self._journaled is None:
            self.windows.closed(window)

    def close_window(self, window: Window) -> bool:
        """Sets ``window``'s directory back to its mode if it is exactly as ``_changing`` left it
        open: a process killed with the window open left it so. Another mode, or another directory
        at the path, means someone changed it since, which stays. Whether it set the mode back; the
        mode is synced before this returns (the finisher goes on to drop the window from its
        journal entry, and then the entry, without a sync), and so is the directory when the
        killed process had set its mode back itself: a batched rollback does that right after the
        change, and syncs it only at its flush, which a kill before it never made."""
        try:
            with self.dir_fd(window.path) as fd:
                st = os.fstat(fd)
                if not window.same_directory(st, born_ns(fd)):
                    return False
                open_still = not window.mode & stat.S_IWUSR and stat.S_IMODE(st.st_mode) == window.writable
                if open_still:
                    os.fchmod(fd, window.mode)
                os.fsync(fd)
                return open_still
        except (FileNotFoundError, NotADirectoryError, UnsafePath):
            return False

    @contextlib.contextmanager
    def directories(self) -> Iterator[Directories]:
        """Directory fds for many paths in one go (see ``Directories``)."""
        with self.root_fd() as root:
            opened = Directories(root)
        try:
            yield opened
        finally:
            opened.close()

    def lstat(self, path: str) -> os.stat_result | None:
        parent, _, name = path.rpartition("/")
        try:
            with self.dir_fd(parent) as fd:
                return os.lstat(name, dir_fd=fd)
        except (FileNotFoundError, UnsafePath, NotADirectoryError):
            return None
        except PermissionError as exc:
            raise Inaccessible(path, exc) from exc

    def read_small(self, path: str, limit: int = 1 << 20) -> bytes | None:
        """A regular file's content (None when absent, not regular, or larger than limit)."""
        crash_point(Point.WORKSPACE_READ)
        parent, _, name = path.rpartition("/")
        try:
            with self.dir_fd(parent) as dfd:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except (OSError, UnsafePath):
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            os.close(fd)  # a directory opens too, and fdopen would refuse it
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read(limit + 1)[:limit]

    def listdir(self, path: str) -> list[str]:
        try:
            with self.dir_fd(path) as fd:
                return os.listdir(fd)
        except (FileNotFoundError, NotADirectoryError, UnsafePath):
            return []
        except PermissionError as exc:
            raise Inaccessible(path, exc) from exc

    def make_dir(self, path: str, mode: int, check: Check = _no_check) -> None:
        """Creates the directory (or keeps an existing one), owner-writable until set_dir_mode.
        Unbatched, it and its parent are synced before this returns (``_changing``): the new
        directory's entry and its mode are durable before anything is written into it."""
        parent, _, name = path.rpartition("/")
        with self._changing(parent) as fd:
            self._synced_dir(parent, fd)
            check(fd, name)
            self._still_at(parent, fd)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            try:
                created = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in _SWAPPED:
                    raise UnsafePath(path) from exc
                raise
            try:
                os.fchmod(created, mode | 0o700)
                if self._pending is None:
                    # The new directory's own mode: its parent's sync (``_changing``) holds only its
                    # entry, and an undo's finisher knows the directory as its own by this mode.
                    os.fsync(created)
            finally:
                os.close(created)

    def set_dir_mode(self, path: str, mode: int) -> None:
        """Within a batch the directory joins it, so that its new mode is durable at the flush too
        (a directory none of whose entries changed, or a rollback that only changes a mode, would
        otherwise have nothing synced that holds it); unbatched, the directory is synced before
        this returns."""
        with self.dir_fd(path) as fd:
            self._synced_dir(path, fd)
            os.fchmod(fd, mode)
            if self._pending is None:
                os.fsync(fd)

    def write_file(self, path: str, chunks: Iterable[bytes], mode: int, check: Check = _no_check,
                   again: Callable[[], Iterable[bytes]] | None = None) -> None:
        """Replaces ``path`` with the content ``chunks`` yields. Within a batch, a write that runs out
        of space or descriptors while the batch holds replaced files (``SyncBatch.release_later``)
        releases them and is made once more, with the content ``again`` yields, if given."""
        try:
            self._write_file(path, chunks, mode, check)
        except OSError as exc:
            if (exc.errno not in _EXHAUSTED or isinstance(exc, SyncFailed) or again is None
                    or self._pending is None or not self._pending.release_held_now()):
                raise
            self._write_file(path, again(), mode, check)

    def _write_file(self, path: str, chunks: Iterable[bytes], mode: int, check: Check) -> None:
        parent, _, name = path.rpartition("/")
        with self._changing(parent, sync=False) as dfd:
            temp = self._temp_name()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
            try:
                try:
                    # Straight to the fd: a buffered file object would cost three more system
                    # calls per file (fstat, isatty, lseek) and a copy of each chunk.
                    for chunk in chunks:
                        _write_all(fd, chunk)
                    os.fchmod(fd, mode)
                    if self._pending is None:
                        os.fsync(fd)
                    else:
                        self._pending.add_file(path, fd)
                finally:
                    os.close(fd)
                crash_point(Point.WORKSPACE_WRITE)
                self._replace(temp, name, dfd, check, parent)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=dfd)
                raise

    def write_symlink(self, path: str, target: str, check: Check = _no_check) -> None:
        parent, _, name = path.rpartition("/")
        with self._changing(parent, sync=False) as dfd:
            temp = self._temp_name()
            os.symlink(target, temp, dir_fd=dfd)
            try:
                self._replace(temp, name, dfd, check, parent)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=dfd)
                raise

    def _temp_name(self) -> str:
        tag = f"{self.temp_tag}-" if self.temp_tag else ""
        # 128 bits from the process's generator (reseeded in a forked child): O_EXCL refuses the
        # unlikely clash, and a uuid4 would read the kernel's entropy for every file written.
        return f"{TEMP_PREFIX}{tag}{random.getrandbits(128):032x}"

    def _replace(self, temp: str, name: str, dfd: int, check: Check, parent: str) -> None:
        st = None
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(name, dir_fd=dfd)
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePath(name)
        self._synced_dir(parent, dfd)
        held = self._hold(name, dfd, st)
        try:
            check(dfd, name)
            self._still_at(parent, dfd)
            os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            _close(held)
            if exc.errno in _SWAPPED:
                raise UnsafePath(name) from exc
            raise
        except BaseException:
            _close(held)
            raise
        self._release_later(held)
        if self._pending is None:
            os.fsync(dfd)

    def _hold(self, name: str, dfd: int, st: os.stat_result | None) -> tuple[int, int] | None:
        """Within a batch: an fd of the regular file about to be replaced or removed, when that
        drops its last link, so that the kernel frees it when the batch releases it (off the
        rollback's path) instead of inside the rename or unlink (see ``SyncBatch.release_later``).
        None when not worth holding (see ``SyncBatch.may_hold``) or not openable."""
        if (self._pending is None or st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1
                or _O_PATH is None or not self._pending.may_hold(st.st_size)):
            return None
        try:
            # O_PATH: a reference to the inode and nothing else (a FIFO swapped in meanwhile is
            # not opened, no lease is broken, no permission is needed).
            return os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd), st.st_size
        except OSError:
            return None

    def _release_later(self, held: tuple[int, int] | None) -> None:
        if held is not None:
            self._pending.release_later(*held)

    def sync_file_systems(self, directories: Iterable[str], mount_points: Iterable[str] = ()) -> None:
        """Makes durable whatever anyone wrote to the file systems of the root, of ``directories``
        (those still there) and of ``mount_points`` (below the root; those the server cannot reach
        hold nothing it wrote): what a process killed before its batch's flush left in the kernel's
        cache included, which no later write of ours would sync. OSError if a file system reports
        a write error."""
        fds: list[int] = []
        try:
            for directory in ("", *directories):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError, UnsafePath):
                    fds.append(self._open_dir(directory))
            for point in mount_points:
                # one the server cannot reach (a symlink on the way, no permission) holds nothing it wrote
                with contextlib.suppress(OSError, UnsafePath, FailedPrecondition):
                    fds.append(self._open_dir(point))
            sync_file_systems(fds)
        finally:
            for fd in fds:
                os.close(fd)

    def remove_temp_files(self, directory: str, temp_tag: str) -> int:
        """Removes the temporary files a crashed write tagged ``temp_tag`` left in ``directory`` (unbatched:
        the directory is synced after, see ``_changing``)."""
        prefix = f"{TEMP_PREFIX}{temp_tag}-"
        removed = 0
        try:
            with self._changing(directory) as fd:
                for name in os.listdir(fd):
                    if name.startswith(prefix):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=fd)
                            removed += 1
        except (FileNotFoundError, UnsafePath):
            return removed
        return removed

    def remove(self, path: str, check: Check = _no_check) -> None:
        """Removes a file or symlink (never a directory)."""
        parent, _, name = path.rpartition("/")
        with self._changing(parent) as fd:
            self._synced_dir(parent, fd)
            held = None
            if self._pending is not None:
                with contextlib.suppress(OSError):
                    held = self._hold(name, fd, os.lstat(name, dir_fd=fd))
            try:
                check(fd, name)
                self._still_at(parent, fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
            except BaseException:
                _close(held)
                raise
            self._release_later(held)

    def remove_empty_dir(self, path: str, check: Check = _no_check) -> bool:
        """Removes a directory only if it is empty; True when it is gone."""
        parent, _, name = path.rpartition("/")
        try:
            with self._changing(parent) as fd:
                self._synced_dir(parent, fd)
                check(fd, name)
                self._still_at(parent, fd)
                os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            if exc.errno == errno.ENOTDIR:
                raise UnsafePath(path) from exc
            raise
        return True


class Directories:
    """Directory fds reached from the root one component at a time without following links, as
    ``Workspace.dir_fd`` does, but keeping those of the last directory asked for and of its
    ancestors: asked in sorted order, each directory is opened once, and no more descriptors
    are open at a time than the path is deep."""

    def __init__(self, root_fd: int) -> None:
        #: (name, fd) of the root, then of each component of the last directory asked for.
        self._open: list[tuple[str, int]] = [("", os.dup(root_fd))]

    def fd(self, path: str) -> int:
        """The fd of directory ``path`` ('' is the root); valid until another one is asked for.
        Raises UnsafePath (a component is a symlink or not a directory) or FileNotFoundError."""
        parts = path.split("/") if path else []
        kept = 1
        while kept < len(self._open) and kept <= len(parts) and self._open[kept][0] == parts[kept - 1]:
            kept += 1
        self._close_from(kept)
        for part in parts[kept - 1:]:
            try:
                fd = os.open(part, _DIR_FLAGS, dir_fd=self._open[-1][1])
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(path) from exc
                raise
            self._open.append((part, fd))
        return self._open[-1][1]

    def _close_from(self, index: int) -> None:
        while len(self._open) > index:
            os.close(self._open.pop()[1])

    def close(self) -> None:
        self._close_from(0)
