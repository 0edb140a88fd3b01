"""Nothing of a workspace is left out silently, and nothing a workspace does makes a capture
fail with INTERNAL: special permission bits, names that look like the server's temporary
files, paths nested near PATH_MAX, and entries that change type while they are captured.
Through real servers, watcher on and off (see ``live``)."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.core.capture.ignore import MAX_GITIGNORE_BYTES
from checkpointd.core.capture.snapshot import (
    MAX_DIR_DEPTH,
    SKIP_GITIGNORE_TOO_LARGE,
    SKIP_SERVER_TEMPORARY,
    SKIP_TOO_DEEP,
)
from tests.engine.conftest import write
from tests.engine.live import Session
from tests.helpers import tree_state


def test_setuid_setgid_and_sticky_bits_are_captured_and_restored(live: Session) -> None:
    root = live.root
    write(root / "bin/tool", "#!/bin/sh\n", mode=0o4755)
    write(root / "bin/group-tool", "#!/bin/sh\n", mode=0o2750)
    write(root / "plain.txt", "plain\n", mode=0o644)
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o2775)
    (root / "scratch").mkdir()
    os.chmod(root / "scratch", 0o1777)
    write(root / "scratch/note.txt", "note\n")
    first = live.checkpoint()
    first_state = tree_state(root)
    assert first_state["bin/tool"][2] == 0o4755 and first_state["scratch"][1] == 0o1777

    for path, mode in (("bin/tool", 0o755), ("bin/group-tool", 0o750), ("shared", 0o775), ("scratch", 0o777)):
        os.chmod(root / path, mode)
    write(root / "plain.txt", "plain\n", mode=0o6755)
    second = live.checkpoint()
    changes = {c.path: (c.base_mode, c.target_mode) for c in live.diff_live(first)}
    assert changes == {"bin/tool": (0o4755, 0o755), "bin/group-tool": (0o2750, 0o750), "shared": (0o2775, 0o775),
                       "scratch": (0o1777, 0o777), "plain.txt": (0o644, 0o6755)}

    live.rollback(first)
    assert tree_state(root) == first_state
    live.checkpoint()
    live.rollback(second)
    assert tree_state(root)["plain.txt"][2] == 0o6755


def test_only_the_servers_exact_temporary_names_are_left_out_and_they_are_reported(live: Session) -> None:
    root = live.root
    user_names = [".checkpointd-tmp-", ".checkpointd-tmp-notes.txt", ".checkpointd-tmp-" + "x" * 32,
                  ".checkpointd-tmp-" + uuid.uuid4().hex.upper(), ".checkpointd-tmp-" + uuid.uuid4().hex + ".bak"]
    for name in user_names:
        write(root / "d" / name, f"a user's file named {name}\n")
    server_names = [".checkpointd-tmp-" + uuid.uuid4().hex,
                    f".checkpointd-tmp-{uuid.uuid4().hex}-{uuid.uuid4().hex}"]
    for name in server_names:
        write(root / "d" / name, "what a crashed rollback could leave\n")
    first = live.checkpoint()
    assert first.file_count == len(user_names)
    assert {(s.path, s.reason) for s in first.skipped_files} == {
        (f"d/{name}", SKIP_SERVER_TEMPORARY) for name in server_names}
    for name in server_names:
        (root / "d" / name).unlink()
    expected = tree_state(root)
    # Changed after the checkpoint, through names the watcher must not take for the server's own.
    for name in user_names:
        write(root / "d" / name, f"edited {name}\n")
    second = live.checkpoint()
    assert {c.path for c in live.diff_live(first)} >= {f"d/{name}" for name in user_names}
    live.rollback(first)
    assert tree_state(root) == expected
    live.rollback(second)
    assert all((root / "d" / name).read_text() == f"edited {name}\n" for name in user_names)


def test_a_gitignore_too_large_to_read_is_captured_and_reported_with_what_it_meant_to_leave_out(
        live: Session) -> None:
    """Its patterns are not applied (a bound on the work a workspace can cause): the files it
    would leave out are captured, and every checkpoint says why, until it is small again."""
    root = live.root
    huge = b"*.log\n" + b"#" * MAX_GITIGNORE_BYTES + b"\n"
    (root / "sub").mkdir()
    (root / "sub" / ".gitignore").write_bytes(huge)
    write(root / "sub" / "build.log", "left out by the .gitignore, were it read\n")
    write(root / "notes.txt", "notes\n")
    reported = {("sub/.gitignore", len(huge), SKIP_GITIGNORE_TOO_LARGE)}
    first = live.checkpoint()
    assert {(s.path, s.size_bytes, s.reason) for s in first.skipped_files} == reported
    assert first.file_count == 3
    write(root / "notes.txt", "edited\n")  # an incremental capture with the watcher on
    second = live.checkpoint()
    assert {(s.path, s.size_bytes, s.reason) for s in second.skipped_files} == reported
    (root / "sub" / ".gitignore").write_text("*.log\n")
    third = live.checkpoint()
    assert list(third.skipped_files) == []
    assert third.file_count == 2, "the .gitignore applies again"
    live.rollback(first)
    assert (root / "sub" / ".gitignore").read_bytes() == huge
    assert (root / "sub" / "build.log").read_text() == "left out by the .gitignore, were it read\n"


# -- paths nested near PATH_MAX -----------------------------------------------------------------


def _make_chain(top: Path, depth: int, leaf: bytes) -> None:
    """``top``/a/a/.../a/leaf, ``depth`` directories deep, made through directory descriptors
    (the whole path may be longer than a path the kernel takes at once)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            inner = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        out = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, leaf)
        os.close(out)
    finally:
        os.close(fd)


def _remove_chain(top: Path) -> None:
    """Removes what ``_make_chain`` made, bottom up through descriptors (recursive removal
    costs a walk from the top per level)."""
    if not top.exists():
        return
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while True:
            try:
                fds.append(os.open("a", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        while fds:
            fd = fds.pop()
            for name in os.listdir(fd):
                if name != "a":
                    os.unlink(name, dir_fd=fd)
            if fds:
                os.rmdir("a", dir_fd=fds[-1])
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    top.rmdir()


def test_paths_nested_near_path_max_are_captured_or_reported_never_internal(live: Session) -> None:
    root = live.root
    allowed = MAX_DIR_DEPTH - 1  # "within" is one level below the root: its deepest dir is at the limit
    deepest = (4096 - len(str(root))) // 2
    _make_chain(root / "within", allowed, b"captured\n")
    _make_chain(root / "beyond", deepest, b"too deep\n")
    write(root / "top.txt", "top\n")
    try:
        first = live.checkpoint()
        too_deep = "beyond/" + "/".join(["a"] * MAX_DIR_DEPTH)
        assert [(s.path, s.reason) for s in first.skipped_files] == [(too_deep, SKIP_TOO_DEEP)]
        within_leaf = root.joinpath("within", *["a"] * allowed, "leaf")
        assert first.file_count == 2
        within_leaf.write_bytes(b"changed\n")
        write(root / "top.txt", "changed\n")
        assert {c.path for c in live.diff_live(first)} == {"top.txt", within_leaf.relative_to(root).as_posix()}
        live.checkpoint()
        _remove_chain(root / "within")
        live.rollback(first)
        assert within_leaf.read_bytes() == b"captured\n"
        live.checkpoint()
        # Under the directory too deep to capture, a change is reported by no one; the rollback
        # leaves it alone (the checkpoint does not account for it).
        fd = os.open(root.joinpath("beyond", *["a"] * 100), os.O_RDONLY)
        try:
            for _ in range(deepest - 100):
                inner = os.open("a", os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = inner
            os.unlink("leaf", dir_fd=fd)
        finally:
            os.close(fd)
        live.checkpoint()
        live.rollback(first)
        assert root.joinpath("beyond", *["a"] * 100).is_dir()
    finally:
        _remove_chain(root / "within")
        _remove_chain(root / "beyond")


# -- entries that change type while they are captured -------------------------------------------


#: Swaps each name with its two twins (a directory, a symlink, a file) as fast as it can, in a
#: process of its own: each swap is one renameat2(RENAME_EXCHANGE), so every name always exists
#: and only its type changes under a capture.
FLIPPER = """
import ctypes, itertools, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
names = [os.fsencode(name) for name in sys.argv[1:]]
for twin in itertools.cycle((b".dir", b".link", b".file")):
    for name in names:
        if libc.renameat2(-100, name, -100, name + twin, 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
    time.sleep(0.0002)  # a flood of events would make every call slow, not more likely to race
"""


@contextlib.contextmanager
def flipping(root: Path, count: int = 12) -> Iterator[None]:
    names = []
    for i in range(count):
        name = root / ("d/e" if i % 3 == 2 else "d" if i % 3 == 1 else "") / f"flip{i}"
        write(name / "inside.txt", f"inside {i}\n")
        Path(f"{name}.dir").mkdir()
        Path(f"{name}.link").symlink_to(random.choice(["inside.txt", "../d", "/etc/hostname"]))
        write(Path(f"{name}.file"), f"file {i}\n")
        names.append(str(name))
    process = subprocess.Popen([sys.executable, "-c", FLIPPER, *names], stderr=subprocess.PIPE)
    try:
        yield
        assert process.poll() is None, f"the flipper stopped: {process.stderr.read().decode()}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_entries_changing_type_during_captures_never_cause_internal(live: Session) -> None:
    root = live.root
    write(root / "d/e/steady.txt", "steady\n")
    first = live.checkpoint()
    failures: list[tuple[grpc.StatusCode, str]] = []
    with flipping(root):
        for call in range(120):
            try:
                if call % 3 == 2:
                    live.diff_live(first)
                else:
                    live.stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=live.plan_id), timeout=60)
            except grpc.RpcError as error:
                failures.append((error.code(), error.details()))
    # A workspace changing under a capture is normal: every call succeeds.
    assert failures == []
    # Once it stops changing, the next checkpoint is exact again (it is checked against a full scan).
    live.checkpoint()
