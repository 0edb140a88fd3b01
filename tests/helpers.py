"""Small helpers for tests: exact workspace snapshots and error details."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sqlalchemy import Engine, text

from checkpoint.v1 import checkpoint_service_pb2 as pb


def tree_state(root: Path, skip: tuple[str, ...] = (".git",)) -> dict[str, tuple]:
    """Everything under root, exactly: kind, content or link text, permission bits."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            st = full.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode)
            else:
                out[rel] = ("file", full.read_bytes(), mode)
    return out


def refused(call: Callable[[], object], code: grpc.StatusCode, reason: str) -> grpc.RpcError:
    """The error ``call`` fails with, which must be ``code`` with ErrorInfo reason ``reason``."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() is code, caught.value.details()
    assert error_info(caught.value).reason == reason, caught.value.details()
    return caught.value


def checkpoint_id_of(stub, plan_id: str, root: Path | None = None) -> str:
    """A new checkpoint of ``plan_id`` (of its workspace ``root``, the first time) by ``stub``."""
    request = pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root) if root else "")
    return stub.CreateCheckpoint(request).checkpoint.checkpoint_id


def checkpoint_files(trees, store, tree_digest: str) -> dict[str, tuple]:
    """What a checkpoint's tree holds, every file read back from the store, in ``tree_state``'s
    shape (in-process tests: ``trees`` and ``store`` are the engine's)."""
    from checkpointd.core.store.tree import EntryKind

    out: dict[str, tuple] = {}
    for path, entry in trees.flatten(tree_digest):
        if entry.kind is EntryKind.DIR:
            out[path] = ("dir", entry.mode)
        elif entry.kind is EntryKind.SYMLINK:
            out[path] = ("symlink", entry.target)
        else:
            data = store.read_bytes(entry.digest)
            assert len(data) == entry.size, path
            out[path] = ("file", data, entry.mode)
    return out


def descriptors_under(root: Path) -> list[str]:
    """What this process's open descriptors name under ``root`` (root itself included; a file
    whose last link is gone ends in " (deleted)")."""
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile, or the listing's own descriptor
        if target == str(root) or target.startswith(f"{root}/"):
            held.append(target)
    return held


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The one ErrorInfo every checkpointd error carries."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status on {error.code()}: {error.details()}"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert len(infos) == 1, f"expected exactly one ErrorInfo, got {infos}"
    return infos[0]


def end_other_sessions(admin: Engine) -> int:
    """Ends every other session on the admin engine's PostgreSQL database, as a restart or an
    administrator would, and waits until they are gone; returns how many were ended."""
    with admin.connect() as connection:
        ended = connection.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one()
        deadline = time.monotonic() + 10
        while connection.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")).scalar_one() and time.monotonic() < deadline:
            time.sleep(0.05)
    return ended


def interruptible(command: list[str]) -> list[str]:
    """``command`` run with SIGINT at its default action (a test run from a shell in the background
    ignores it, and its children inherit that). Not with ``preexec_fn``: that makes subprocess fork
    the test process, whose gRPC threads' fork handlers then race ``close_fds`` in the child, which
    dies of SIGABRT ("epoll_wait error: Bad file descriptor") before it execs (seen under load)."""
    return ["env", "--default-signal=INT", *command]


def dump_stacks_then_kill(process: subprocess.Popen) -> None:
    """For a server process that did not stop: asks it for its threads' stacks (``serve`` dumps
    them to its log on SIGUSR1), then kills it, so the failure says where it was stuck."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGUSR1)
        time.sleep(1)
    process.kill()
    process.wait()


def skip_unless_ci(reason: str, *, allow_module_level: bool = False) -> NoReturn:
    """Skips a test that cannot run here (a missing tool, a busy port, a variant it does not apply
    to), except under CI=true, where that is a failure: CI never passes by not running a test."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: every test must run)", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def at_fault_point(monkeypatch: pytest.MonkeyPatch, module: object, which: object,
                   hooks: dict[int, Callable[[], None]]) -> list[int]:
    """Runs ``hooks[n]`` the nth time ``module`` reaches fault point ``which`` (1-based), before the
    point itself (which may still pause or crash, as configured); returns the running count."""
    reached = [0]
    real = module.crash_point

    def point(at, *args, **kwargs):
        if at is which:
            reached[0] += 1
            hook = hooks.get(reached[0])
            if hook is not None:
                hook()
        return real(at, *args, **kwargs)

    monkeypatch.setattr(module, "crash_point", point)
    return reached


def nodes_read(trees, call: Callable[[], object]) -> list[str]:
    """The tree nodes (digests, in order, repeats kept) that ``call`` reads through ``trees``,
    cached or not: what a walk visits."""
    read: list[str] = []
    node = trees._node
    trees._node = lambda digest: read.append(digest) or node(digest)
    try:
        call()
    finally:
        del trees._node
    return read
