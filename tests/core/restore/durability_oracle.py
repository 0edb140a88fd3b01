"""A durability oracle for rollbacks: it watches (never changes) every system call the server makes
that modifies a workspace, and every sync, and checks POSIX durability at the moments a rollback
stops being recoverable.

A power cut cannot be caused by a test; what can be checked is whether, by POSIX's rules, each
change was made durable before the server let go of what could repeat or undo it. A rollback's
journal entry can; it is removed without a sync (``RollbackJournal.remove``), which the next synced
commit of any checkpoint makes durable, or in a synced transaction (``Recovery.drop`` with a
session). So at each of those moments, and when a rollback returns (it is acknowledged), every
workspace change recorded so far must be covered by a sync that *began after it ended*:

- a file's content or mode (``write``, ``fchmod``, the inode a ``open(O_CREAT)`` made,
  ``ftruncate``): an ``fsync`` of that inode, a ``syncfs`` of its file system or ``sync``;
- a name created, renamed or removed in a directory (``open(O_CREAT)``, ``rename``, ``unlink``,
  ``rmdir``, ``mkdir``, ``symlink``, ``link``), or a directory's mode (``fchmod``/``chmod``): an
  ``fsync`` of that directory, a ``syncfs`` of its file system or ``sync``.

A change to an inode that is gone from the workspace when it is checked (a temporary file renamed
over and replaced, a directory removed since) is moot: its removal is the change that counts. So
is a server's temporary name made or removed in a directory (a rename's other name counts): one
a power cut brings back is removed, by its tag, by whoever finishes the entry.
A symlink cannot be fsynced: its creation is a change of its directory only.

Changes are recorded only under ``root`` (resolved through ``/proc/self/fd``); the store and the
metadata database are not the oracle's concern. What the test itself does to the workspace (the
user's writes, an attacker's) is left out with ``with oracle.user():``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from checkpointd.core.engine.restoring import OpenedWindows
from checkpointd.core.restore.restorer import Restorer
from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace.workspace import is_temp_name

Key = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class Change:
    seq: int
    what: str  # "content" (a file's data or metadata) or "entries" (a directory's names or mode)
    key: Key
    call: str  # the system call and its path, for the report
    where: str  # the server's frame that made it
    name: str = ""  # the name made, renamed or removed ("entries" of a directory)


@dataclass(frozen=True)
class Sync:
    seq: int  # when it *began*: it covers only what ended before
    inode: Key | None = None
    device: int | None = None  # syncfs
    everything: bool = False  # sync(2)


@dataclass
class Finding:
    moment: str
    change: Change

    def __str__(self) -> str:
        return f"at {self.moment}: {self.change.call} ({self.change.what} of inode {self.change.key}) " \
               f"made in {self.change.where} was never synced"


@dataclass
class DurabilityOracle:
    root: str
    changes: list[Change] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: Each moment checked (``entry removed``, ``entry dropped``, ``rollback acknowledged``).
    moments: list[str] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _paused: threading.local = field(default_factory=threading.local)
    _reported: set[Change] = field(default_factory=set)

    # -- the test's side ------------------------------------------------------------------------

    @contextlib.contextmanager
    def user(self) -> Iterator[None]:
        """What runs within is the user's (or an attacker's), not the server's: not recorded."""
        self._paused.on = True
        try:
            yield
        finally:
            self._paused.on = False

    def assert_durable(self) -> None:
        assert not self.findings, "changes left unsynced when their rollback let go of them:\n" + "\n".join(
            map(str, self.findings))

    def check(self, moment: str, only: Key | None = None) -> list[Finding]:
        """Every change so far (``only``: of that inode) must be covered by a later sync (or be moot)."""
        self.moments.append(moment)
        live = self._live_inodes()
        syncs = list(self.syncs)
        found = []
        for change in list(self.changes):
            if (change in self._reported or change.key not in live or (only is not None and change.key != only)
                    or is_temp_name(change.name)):
                continue
            if not any(s.seq > change.seq and (s.everything or s.device == change.key[0] or s.inode == change.key)
                       for s in syncs):
                self._reported.add(change)
                found.append(Finding(moment, change))
        self.findings.extend(found)
        return found

    # -- installing -----------------------------------------------------------------------------

    def install(self, monkeypatch: pytest.MonkeyPatch, engine: object) -> DurabilityOracle:
        """Wraps the os functions, syncfs, and the engine's journal removal and drop."""
        self._wrap_changes(monkeypatch)
        self._wrap_syncs(monkeypatch)
        journal, recovery, rollbacks = engine.journal, engine.recovery, engine._rollbacks
        real_remove, real_drop, real_rollback = journal.remove, recovery.drop, rollbacks.rollback

        def remove(plan_id: str) -> None:
            self.check("journal entry removed")
            real_remove(plan_id)

        def drop(entry, why, session=None) -> None:
            # Without a session it removes the entry (checked there); with one, the entry's row is
            # deleted in the caller's transaction, committed (synced) after this returns.
            real_drop(entry, why, session)
            if session is not None:
                self.check(f"journal entry dropped ({why})")

        def rollback(*args, **kwargs):
            result = real_rollback(*args, **kwargs)
            self.check("rollback acknowledged")
            return result

        real_closed = OpenedWindows.closed

        def closed(windows, window) -> None:
            # The entry stops naming the window (put_unsynced: durable at the next synced commit):
            # the directory's mode set back, and what was changed in it, must be on the disk first.
            if window in windows.entry.opened:
                self.check(f"window on {window.path!r} journaled closed", only=(window.dev, window.ino))
            real_closed(windows, window)

        monkeypatch.setattr(OpenedWindows, "closed", closed)
        real_apply = Restorer.apply

        def apply(restorer, workspace, changes, seen=None, batched=True, keep_going=lambda: None):
            if batched:
                return real_apply(restorer, workspace, changes, seen, batched, keep_going)

            def step() -> None:
                # An undo counts each change done once it is on the disk: the next begins only then.
                self.check("an undo's next change begins")
                keep_going()

            real_apply(restorer, workspace, changes, seen, batched, step)
            self.check("an undo applied")

        monkeypatch.setattr(Restorer, "apply", apply)
        monkeypatch.setattr(journal, "remove", remove)
        monkeypatch.setattr(recovery, "drop", drop)
        monkeypatch.setattr(rollbacks, "rollback", rollback)
        return self

    def _recording(self) -> bool:
        return not getattr(self._paused, "on", False)

    def _path_of_fd(self, fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None

    def _inside(self, path: str | None) -> bool:
        return path is not None and (path == self.root or path.startswith(self.root + "/"))

    def _parent(self, path, dir_fd: int | None) -> tuple[str | None, Key | None]:
        """The directory ``path`` (relative to ``dir_fd``) names an entry of: its path and key."""
        path = os.fsdecode(path)
        head = os.path.dirname(path)
        if os.path.isabs(path):
            where = head or "/"
        else:
            base = self._path_of_fd(dir_fd) if dir_fd is not None else os.getcwd()
            if base is None:
                return None, None
            where = os.path.normpath(os.path.join(base, head)) if head else base
        try:
            if dir_fd is not None and not os.path.isabs(path):
                st = os.stat(head or ".", dir_fd=dir_fd) if head else os.fstat(dir_fd)
            else:
                st = os.stat(where)
        except OSError:
            return where, None
        return where, (st.st_dev, st.st_ino)

    def _record(self, what: str, key: Key | None, call: str, name: str = "") -> None:
        if key is None:
            return
        frame = next((f for f in reversed(traceback.extract_stack(limit=12)[:-3])
                      if "checkpointd" in f.filename), None)
        where = f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.name}" if frame else "?"
        self.changes.append(Change(next(self._seq), what, key, call, where, name))

    def _entries_changed(self, call: str, path, dir_fd: int | None) -> None:
        where, key = self._parent(path, dir_fd)
        if self._inside(where):
            name = os.path.basename(os.fsdecode(path))
            self._record("entries", key, f"{call}({os.path.join(where, name)})", name)

    def _fd_changed(self, call: str, fd: int) -> None:
        path = self._path_of_fd(fd)
        if not self._inside(path.removesuffix(" (deleted)") if path else None):
            return
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self._record("entries", (st.st_dev, st.st_ino), f"{call}({path})")
        elif stat.S_ISREG(st.st_mode):
            self._record("content", (st.st_dev, st.st_ino), f"{call}({path})")

    def _wrap_changes(self, mp: pytest.MonkeyPatch) -> None:
        real = {name: getattr(os, name) for name in (
            "open", "write", "fchmod", "chmod", "ftruncate", "rename", "replace", "unlink", "remove", "rmdir",
            "mkdir", "symlink", "link")}

        def opened(path, flags, mode=0o777, *, dir_fd=None):
            fd = real["open"](path, flags, mode, dir_fd=dir_fd)
            if flags & os.O_CREAT and self._recording():
                # (with O_EXCL it surely made the name; without, it may have: counted either way)
                self._entries_changed("open(O_CREAT)", path, dir_fd)
                self._fd_changed("open(O_CREAT)", fd)
            return fd

        def on_fd(name: str) -> Callable:
            def wrapped(fd, *args, **kwargs):
                result = real[name](fd, *args, **kwargs)
                if self._recording() and isinstance(fd, int):
                    self._fd_changed(name, fd)
                return result
            return wrapped

        def chmod(path, mode, *, dir_fd=None, follow_symlinks=True):
            result = real["chmod"](path, mode, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
            if self._recording():
                with contextlib.suppress(OSError):
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
                    try:
                        self._fd_changed("chmod", fd)
                    finally:
                        os.close(fd)
            return result

        def two_names(name: str) -> Callable:
            def wrapped(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
                result = real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                if self._recording():
                    self._entries_changed(name, src, src_dir_fd)
                    self._entries_changed(name, dst, dst_dir_fd)
                return result
            return wrapped

        def one_name(name: str) -> Callable:
            def wrapped(path, *args, dir_fd=None, **kwargs):
                result = real[name](path, *args, dir_fd=dir_fd, **kwargs)
                if self._recording():
                    self._entries_changed(name, path, dir_fd)
                return result
            return wrapped

        def symlink(src, dst, target_is_directory=False, *, dir_fd=None):
            result = real["symlink"](src, dst, target_is_directory, dir_fd=dir_fd)
            if self._recording():
                self._entries_changed("symlink", dst, dir_fd)
            return result

        def link(src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
            result = real["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd,
                                  follow_symlinks=follow_symlinks)
            if self._recording():
                self._entries_changed("link", dst, dst_dir_fd)
            return result

        mp.setattr(os, "open", opened)
        for name in ("write", "fchmod", "ftruncate"):
            mp.setattr(os, name, on_fd(name))
        mp.setattr(os, "chmod", chmod)
        for name in ("rename", "replace"):
            mp.setattr(os, name, two_names(name))
        for name in ("unlink", "remove", "rmdir", "mkdir"):
            mp.setattr(os, name, one_name(name))
        mp.setattr(os, "symlink", symlink)
        mp.setattr(os, "link", link)

    def _wrap_syncs(self, mp: pytest.MonkeyPatch) -> None:
        real_fsync, real_sync, real_syncfs = os.fsync, os.sync, syncbatch._syncfs

        def fsync(fd) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            st = os.fstat(fd)
            seq = next(self._seq)
            real_fsync(fd)
            self.syncs.append(Sync(seq, inode=(st.st_dev, st.st_ino)))

        def syncfs(fd: int) -> None:
            device = os.fstat(fd).st_dev
            seq = next(self._seq)
            real_syncfs(fd)  # raises when missing or failing: then it covers nothing
            self.syncs.append(Sync(seq, device=device))

        def sync() -> None:
            seq = next(self._seq)
            real_sync()
            self.syncs.append(Sync(seq, everything=True))

        mp.setattr(os, "fsync", fsync)
        mp.setattr(os, "sync", sync)
        mp.setattr(syncbatch, "_syncfs", syncfs)

    def _live_inodes(self) -> set[Key]:
        """Every inode in the workspace now (the root included)."""
        live: set[Key] = set()
        for directory, dirs, files in os.walk(self.root):
            for name in (".", *dirs, *files):
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(directory, name))
                    live.add((st.st_dev, st.st_ino))
        return live


# -- workspaces described as data -----------------------------------------------------------------

#: path -> ("file", content, mode) | ("link", target) | ("dir", mode)
Layout = dict[str, tuple]


def lay_out(root: str, layout: Layout) -> None:
    """Makes ``root`` hold exactly ``layout`` (what it held goes first). Directory modes are set
    last, deepest first, so that a read-only directory can be filled."""
    for directory, dirs, _files in os.walk(root):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(directory, name), 0o755)
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    for path, spec in sorted(layout.items()):
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if spec[0] == "dir":
            os.makedirs(full, exist_ok=True)
        elif spec[0] == "link":
            os.symlink(spec[1], full)
        else:
            with open(full, "wb") as f:
                f.write(spec[1])
            os.chmod(full, spec[2])
    for path, spec in sorted(layout.items(), key=lambda item: -item[0].count("/")):
        if spec[0] == "dir":
            os.chmod(os.path.join(root, path), spec[1])


def make_writable(root: str) -> None:
    """Owner-write on every directory (for a test's cleanup)."""
    for directory, dirs, _files in os.walk(root):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(directory, name), 0o755)
