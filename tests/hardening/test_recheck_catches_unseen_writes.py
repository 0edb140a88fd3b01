"""Writes no file-watcher event reports (the watcher's blind spots, see ``capture/watcher.py``)
are captured once a recheck has run (``capture/recheck.py``): a write through a hard link outside
the workspace, with its mtime put back, and a write through a shared mmap still open. Without
rechecks the same writes are missing from every later checkpoint, which is why they exist.

Real servers (``--watcher on``), one rechecking every 0.2 s and one never, over real channels."""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd_client import CheckpointClient, new_plan_id, open_channel
from tests.conftest import SERVER_ARGS, PostgresDatabases, RunningServer, serving_server
from tests.ops.conftest import wait_until

MISSED = "without a file-watcher event"
BEFORE = b"written in the workspace, seen\n"
AFTER = b"WRITTEN ELSEWHERE, never seen!\n"
assert len(BEFORE) == len(AFTER)


def _server(short_tmp: Path, databases: PostgresDatabases | None, interval: str) -> Iterator[RunningServer]:
    yield from serving_server(Path(tempfile.mkdtemp(prefix="rc-", dir=short_tmp)), databases,
                              extra_args=(*SERVER_ARGS, "--watcher", "on", "--recheck-interval", interval))


@pytest.fixture(scope="module")
def rechecking(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    yield from _server(short_tmp, suite_databases, "0.2")


@pytest.fixture(scope="module")
def never_rechecking(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    yield from _server(short_tmp, suite_databases, "0")


def _client(server: RunningServer) -> CheckpointClient:
    return CheckpointClient(open_channel(server.tcp_target), deadline_s=30)


def _checkpointed(server: RunningServer) -> tuple[CheckpointClient, str, Path]:
    """A plan whose workspace holds f.txt (BEFORE), checkpointed, with an mtime old enough that
    the stat index vouches for it (outside its racy window)."""
    client, plan, root = _client(server), new_plan_id(), server.new_workspace()
    (root / "f.txt").write_bytes(BEFORE)
    old = time.time_ns() - 3600 * 10**9
    os.utime(root / "f.txt", ns=(old, old))
    client.create_checkpoint(plan, workspace_root=root)
    return client, plan, root


def _write_through_an_outside_link(server: RunningServer, root: Path) -> None:
    before = (root / "f.txt").stat()
    outside = Path(tempfile.mkdtemp(prefix="outside-", dir=server.base)) / "alias.txt"
    os.link(root / "f.txt", outside)
    with open(outside, "r+b") as handle:
        handle.write(AFTER)
    os.utime(outside, ns=(before.st_atime_ns, before.st_mtime_ns))  # only the ctime tells


def _recorded(client: CheckpointClient, plan: str) -> bytes:
    return b"".join(client.read_file(client.create_checkpoint(plan).checkpoint_id, "f.txt"))


def _missed_lines(server: RunningServer, root: Path) -> int:
    return sum(MISSED in line and str(root) in line for line in server.log().splitlines())


def test_without_rechecks_a_write_through_an_outside_link_is_never_captured(never_rechecking):
    client, plan, root = _checkpointed(never_rechecking)
    _write_through_an_outside_link(never_rechecking, root)
    time.sleep(0.5)
    assert _recorded(client, plan) == BEFORE  # the blind spot the rechecks are for
    assert (root / "f.txt").read_bytes() == AFTER


def test_a_recheck_finds_a_write_through_an_outside_link(rechecking):
    client, plan, root = _checkpointed(rechecking)
    _write_through_an_outside_link(rechecking, root)
    wait_until(lambda: _missed_lines(rechecking, root), "a recheck to find the write", timeout=20)
    assert _recorded(client, plan) == AFTER


def test_a_recheck_finds_a_write_through_a_shared_mmap_still_open(rechecking):
    client, plan, root = _checkpointed(rechecking)
    with open(root / "f.txt", "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        mapped[:len(AFTER)] = AFTER
        mapped.flush()
        wait_until(lambda: _missed_lines(rechecking, root), "a recheck to find the write", timeout=20)
        assert _recorded(client, plan) == AFTER


def test_writes_the_watcher_reported_are_never_taken_for_missed_ones(rechecking):
    """g.txt written and checkpointed just now (racy in the index), f.txt rewritten the usual way
    and not checkpointed yet (its index entry is stale, but an event reported it): five rounds
    of rechecks report nothing, and the checkpoint after them records the rewrite (the event's)."""
    client, plan, root = _checkpointed(rechecking)
    (root / "g.txt").write_bytes(b"written the usual way: the watcher reports it\n")
    client.create_checkpoint(plan)
    (root / "f.txt").write_bytes(AFTER)
    time.sleep(1.0)
    assert _missed_lines(rechecking, root) == 0
    assert _recorded(client, plan) == AFTER
