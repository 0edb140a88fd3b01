"""checkpointd's own files are readable by its own user only, whatever the umask.

They hold what a workspace held (a ``.env``, a private key: anything the ignore rules let
through) and plan state, and they outlive the workspace's own permissions: a file the user kept
``0600`` must not sit ``0644`` in the store. So directories checkpointd makes for itself are
``0700`` and its files ``0600``; one found open to others (made by a release before this rule, or
by hand) is tightened when it is opened, with a warning, since nothing of checkpointd's needs
another user to read it. The data directory itself is left as it is: a unix socket may live in
it for its group to reach (``--socket-mode``), and what lies in it is private either way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("checkpointd.files")

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
#: Permission bits of a group or of others.
_SHARED = 0o077


def private_dir(path: Path, parents: bool = False) -> None:
    """Makes directory ``path`` (``0700``; missing parents as ``mkdir -p`` would) or tightens the
    one there."""
    path.mkdir(mode=PRIVATE_DIR, parents=parents, exist_ok=True)
    tighten(path)


def private_file(path: Path | str) -> None:
    """Creates an empty file at ``path`` (``0600``) unless one is there, whose mode is tightened:
    for a file another library creates at the first open (SQLite, whose write-ahead log and shared
    memory then take the database file's mode)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        tighten(Path(path))
    else:
        os.close(fd)


def private_opener(path: str, flags: int) -> int:
    """``open(..., opener=private_opener)``: a file it creates is ``0600``."""
    return os.open(path, flags | os.O_CLOEXEC, PRIVATE_FILE)


def tighten(path: Path) -> bool:
    """Takes a group's and others' bits off ``path`` if it is checkpointd's (owned by this user; a
    symlink is left alone, and so is a path that is gone). Whether it changed anything; a failure is
    logged, not raised: the server works as before, only no more privately."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or not mode & _SHARED or st.st_uid != os.geteuid():
        return False
    try:
        # Not through a symlink swapped in since the lstat (glibc without fchmodat's
        # AT_SYMLINK_NOFOLLOW says ENOTSUP: then it stays as it is, with the warning).
        os.chmod(path, mode & ~_SHARED, follow_symlinks=False)
    except (OSError, NotImplementedError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not supported here"
        log.warning("%s is readable by other users and could not be made private: %s", path, why)
        return False
    log.warning("%s was open to other users (mode %04o): made private (%04o)", path, mode, mode & ~_SHARED)
    return True


def tighten_sqlite(database: Path | str) -> None:
    """``private_file`` for a SQLite database, and its write-ahead log and shared memory if there."""
    private_file(database)
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            tighten(Path(f"{database}{suffix}"))
