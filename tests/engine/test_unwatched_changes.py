"""Changes the file watcher is not told about must be captured exactly all the same.

inotify reports a change to the directory of the name it was made through. A file with
several names (hard links, in the workspace or outside it) changes when written through any
of them; a mount inside the workspace changes what a path shows without any event; and no
watcher runs while the server is down. Through a real server, with the watcher on and off, each
checkpoint's tree must equal a full scan of the workspace made at that moment (digests are
content addresses: a scan into a scratch store gives the same tree), and must restore exactly.
"""

from __future__ import annotations

import os
from pathlib import Path

from ulid import ULID

from tests.engine.conftest import write
from tests.engine.live import NamespacedServer, NamespacedSession, Session
from tests.helpers import tree_state


def _overwrite(path: Path, data: bytes) -> None:
    """Writes in place (same inode), as an editor that does not rename would."""
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()


def test_writes_through_hard_links_from_outside_and_inside(live: Session) -> None:
    outside = live.server.base / f"outside-{ULID()}"
    outside.mkdir()
    root = live.root
    write(root / "linked-out.txt", "version 1\n")
    os.link(root / "linked-out.txt", outside / "other-name.txt")
    write(root / "a/one.txt", "inside, version 1\n")
    (root / "b").mkdir()
    os.link(root / "a/one.txt", root / "b/two.txt")
    write(root / "plain.txt", "plain\n")
    first = live.checkpoint()
    first_state = tree_state(root)

    _overwrite(outside / "other-name.txt", b"version 2\n")  # same size: only content and times change
    _overwrite(root / "b/two.txt", b"inside, version 2\n")
    second = live.checkpoint()
    second_state = tree_state(root)
    assert second_state["linked-out.txt"][1] == b"version 2\n" and second_state["a/one.txt"][1].endswith(b"2\n")

    os.chmod(outside / "other-name.txt", 0o600)  # a mode change through the other name
    live.checkpoint()
    os.chmod(outside / "other-name.txt", 0o644)

    live.rollback(first)
    assert tree_state(root) == first_state
    assert (outside / "other-name.txt").read_bytes() == b"version 2\n", \
        "a rollback replaces the workspace's name, never writes into the shared inode"
    live.checkpoint()
    live.rollback(second)
    assert tree_state(root) == second_state


def test_a_file_that_gains_a_second_name_inside_the_workspace(live: Session) -> None:
    root = live.root
    write(root / "a/original.txt", "one name\n")
    write(root / "c/unrelated.txt", "unrelated\n")
    live.checkpoint()
    (root / "b").mkdir()
    os.link(root / "a/original.txt", root / "b/second-name.txt")
    live.checkpoint()
    _overwrite(root / "b/second-name.txt", b"written through the second name\n")
    live.checkpoint()
    _overwrite(root / "b/second-name.txt", b"and again\n")
    live.checkpoint()
    # Back to one name: the remaining name is still captured exactly.
    (root / "b/second-name.txt").unlink()
    _overwrite(root / "a/original.txt", b"one name again\n")
    live.checkpoint()


def test_writes_while_the_server_is_down(live: Session) -> None:
    root = live.root
    write(root / "same-size.txt", "AAAA\n")
    write(root / "dir/gone.txt", "will be deleted while the server is down\n")
    first = live.checkpoint()
    stat_before = os.stat(root / "same-size.txt")
    live.server.stop()
    _overwrite(root / "same-size.txt", b"BBBB\n")
    # The same size and the same modification time: only the inode's change time tells.
    os.utime(root / "same-size.txt", ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
    (root / "dir/gone.txt").unlink()
    write(root / "dir/new.txt", "created while the server was down\n")
    live.server.start()
    second = live.checkpoint()
    second_state = tree_state(root)
    assert second_state["same-size.txt"][1] == b"BBBB\n"
    live.rollback(first)
    live.rollback(second)
    assert tree_state(root) == second_state


# -- mounts ------------------------------------------------------------------------------------


def test_mounts_inside_the_workspace(namespaced_server: NamespacedServer, tmp_path: Path) -> None:
    server = namespaced_server
    session = NamespacedSession(server, server.new_workspace(), tmp_path)
    root = session.root
    elsewhere = server.base / f"elsewhere-{ULID()}"
    write(elsewhere / "mounted-dir/inner.txt", "only under the mount\n")
    write(elsewhere / "mounted-file.txt", "the mounted file\n")
    write(elsewhere / "nested-dir/inner.txt", "only under the nested mount\n")
    write(root / "deeper/down/underneath.txt", "hidden while something is mounted on deeper/down\n")
    write(root / ".gitignore", "ignored/\n")
    (root / "ignored/mnt").mkdir(parents=True)  # a mount point where the capture never looks
    write(root / "sub/underneath.txt", "hidden while something is mounted on sub\n")
    write(root / "file.txt", "the file a bind mount will cover\n")
    write(root / "plain.txt", "plain\n")
    try:
        session.checkpoint()
        server.in_namespace("mount", "--bind", str(elsewhere / "mounted-dir"), str(root / "sub"))
        server.in_namespace("mount", "--bind", str(elsewhere / "mounted-file.txt"), str(root / "file.txt"))
        server.in_namespace("mount", "--bind", str(elsewhere / "nested-dir"), str(root / "deeper/down"))
        server.in_namespace("mount", "--bind", str(elsewhere / "mounted-dir"), str(root / "ignored/mnt"))
        session.checkpoint()
        # Written through the other path: reported to that directory's watch, not the workspace's.
        _overwrite(elsewhere / "mounted-file.txt", b"written where it came from\n")
        write(elsewhere / "mounted-dir/added.txt", "added where it came from\n")
        write(elsewhere / "nested-dir/added.txt", "added where it came from, under a mount point deeper down\n")
        session.checkpoint()
        session.checkpoint()
        server.in_namespace("umount", str(root / "file.txt"))
        server.in_namespace("umount", str(root / "ignored/mnt"))
        session.checkpoint()
        server.in_namespace("umount", str(root / "sub"))
        session.checkpoint()
        server.in_namespace("umount", str(root / "deeper/down"))
        session.checkpoint()
    finally:
        session.close()
