"""Capture and rollback attacked, in the engine (in process, real inotify watcher):
the quieted reader during a rollback's writes, the stat index, and the restorer's checks that
nothing is overwritten that changed since the safety capture.

Every checkpoint is compared with a full scan of the workspace made at that moment (digests are
content addresses, so a scan into a scratch store gives the same tree). Races are made
deterministic by hooks at the restorer's own fault points (``restore.change``), monkeypatched."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings, RollbackRequest, Scope
from checkpointd.core.kernel.errors import CheckpointdError
from checkpointd.core.kernel.faults import Point
from checkpointd.core.kernel.telemetry import CaptureMode
from checkpointd.core.metadata.db import Database
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write
from tests.engine.live import NamespacedServer, NamespacedSession, serve
from tests.helpers import at_fault_point, checkpoint_files, tree_state

# Known gaps, recorded as strict xfails (each fails today for the reason given; fixing one makes it pass).
_KNOWN_GAP_TEMPORARY_NAME = (
    'the watcher drops every event of a server-temporary name (watcher.py), so an incremental capture does not '
    'report a temp-named file that a full scan reports as skipped (SERVER_TEMPORARY_FILE); the tree is the same')
_KNOWN_GAP_SELF_BIND_MOUNT = (
    'one journal maps a watch descriptor to one path only (watcher.py): a directory bind-mounted elsewhere in its '
    'own workspace has its events attributed to the mount point, so writes under the original path are missed by '
    'incremental checkpoints')


class Engine:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.workspaces = base / "workspaces"
        self.workspaces.mkdir()
        self.db = Database(f"sqlite:///{base / 'meta.db'}")
        self.db.migrate()
        self.store = ContentStore(base / "store")
        self.engine = Checkpoints(self.db, self.store, ConfigStore(self.db),
                                  EngineSettings(base / "data", (str(self.workspaces),), watcher=True))
        assert self.engine.watcher is not None, "these tests need the inotify watcher"
        self.root = self.workspaces / "ws"
        self.root.mkdir()
        self.plan_id = str(ULID())
        self.scans = 0

    def close(self) -> None:
        self.engine.close()
        if self.engine.watcher is not None:
            self.engine.watcher.close()
        self.store.close()
        self.db.dispose()

    def full_scan(self) -> str:
        """The tree a full scan of the workspace captures now (into a scratch store)."""
        self.scans += 1
        store = ContentStore(self.base / f"scan{self.scans}")
        workspace = Workspace(str(self.root))
        try:
            with store.batch() as batch:
                return Snapshotter(store, Trees(store), StatIndex(), reader_processes=0).capture(
                    workspace, disk_rules(workspace, [], []), 1 << 30, batch).tree
        finally:
            store.close()

    def checkpoint(self, exact: bool = True, expect: CaptureMode | None = None):
        before = dict(self.engine.capturer.counts)
        row = self.engine.create(CreateRequest(plan_id=self.plan_id, workspace_root=str(self.root))).row
        if expect is not None:
            moved = [k for k in before if self.engine.capturer.counts[k] != before[k]]
            assert moved == [expect], f"expected an {expect} capture, got {moved}"
        if exact:
            scanned = self.full_scan()
            if row.tree_digest != scanned:
                held, disk = self.files_of(row), tree_state(self.root)
                differing = sorted(p for p in held.keys() | disk.keys() if held.get(p) != disk.get(p))
                pytest.fail("an acknowledged checkpoint differs from a full scan of the workspace at "
                            + "; ".join(f"{p}: checkpoint {held.get(p)} vs disk {disk.get(p)}" for p in differing[:8]))
        return row

    def rollback(self, row, **kwargs):
        return self.engine.rollback(RollbackRequest(plan_id=self.plan_id, checkpoint_id=row.checkpoint_id,
                                                    scope=Scope.FILES, request_id=str(ULID()), **kwargs))

    def files_of(self, row) -> dict[str, tuple]:
        """What a checkpoint holds, in ``tree_state``'s shape."""
        return checkpoint_files(self.engine.trees, self.store, row.tree_digest)


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[Engine]:
    if not watcher_module.available():
        pytest.fail("inotify_simple is not installed")
    opened = Engine(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def at_restore_change(monkeypatch, hooks: dict[int, Callable[[], None]]) -> list[int]:
    """Runs ``hooks[n]`` when the restorer is about to make its nth workspace change (1-based)."""
    return at_fault_point(monkeypatch, restorer_module, Point.RESTORE_CHANGE, hooks)


def fail_workspace_change(monkeypatch, n: int | set[int], error: BaseException) -> list[int]:
    """The nth workspace change (write, symlink, mkdir, removal; n: one or several, 1-based)
    raises ``error`` before changing anything."""
    failing_calls = {n} if isinstance(n, int) else n
    calls = [0]
    for name in ("write_file", "write_symlink", "make_dir", "remove", "remove_empty_dir"):
        real = getattr(Workspace, name)

        def failing(self, *args, _real=real, **kwargs):
            calls[0] += 1
            if calls[0] in failing_calls:
                raise error
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Workspace, name, failing)
    return calls


def three_files(eng: Engine) -> tuple[object, dict]:
    """A target checkpoint of a.txt, b.txt, c.txt, then each changed: a rollback rewrites all three."""
    for name in ("a", "b", "c"):
        write(eng.root / f"{name}.txt", f"target {name}\n")
    target = eng.checkpoint()
    target_state = tree_state(eng.root)
    for name in ("a", "b", "c"):
        write(eng.root / f"{name}.txt", f"changed {name} since the target\n")
    eng.checkpoint()
    return target, target_state


# -- (a) changes made during or right after a rollback's quiet period ------------------------------


def test_a_write_during_the_quiet_period_is_in_the_next_checkpoint(eng, monkeypatch):
    target, _ = three_files(eng)
    write(eng.root / "other.txt", "untouched by the rollback\n")
    eng.checkpoint()
    at_restore_change(monkeypatch, {2: lambda: write(eng.root / "other.txt", "written while the rollback ran\n")})
    eng.rollback(target)
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)


def test_a_directory_created_and_filled_during_the_quiet_period_is_in_the_next_checkpoint(eng, monkeypatch):
    target, _ = three_files(eng)

    def fill() -> None:
        write(eng.root / "new/deep/er/file.txt", "created while the rollback ran\n")
        write(eng.root / "new/second.txt", "also\n")

    at_restore_change(monkeypatch, {2: fill})
    eng.rollback(target)
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)
    write(eng.root / "new/deep/er/file.txt", "and edited after it\n")
    eng.checkpoint()


def test_a_directory_renamed_into_the_workspace_during_the_quiet_period_is_captured(eng, monkeypatch, tmp_path):
    target, _ = three_files(eng)
    outside = tmp_path / "outside"
    write(outside / "tree/sub/x.txt", "from outside\n")

    at_restore_change(monkeypatch, {2: lambda: os.rename(outside / "tree", eng.root / "moved-in")})
    eng.rollback(target)
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)
    write(eng.root / "moved-in/sub/x.txt", "edited in its new place\n")
    eng.checkpoint()



def test_a_checkpoint_taken_during_the_quiet_period_sees_what_was_written_in_it(eng, monkeypatch):
    """Another plan on the same workspace checkpoints while the rollback writes: the reader is
    quieted (for an hour here), so only the capture's own sync can see the write."""
    monkeypatch.setattr(watcher_module, "QUIET_SECONDS", 3600.0)
    target, _ = three_files(eng)
    write(eng.root / "other.txt", "before\n")
    eng.checkpoint()
    other_plan = str(ULID())
    eng.engine.create(CreateRequest(plan_id=other_plan, workspace_root=str(eng.root)))
    seen = []

    def write_then_checkpoint() -> None:
        write(eng.root / "other.txt", "written during the quiet period\n")
        write(eng.root / "newdir/inner.txt", "and a new directory\n")
        before = dict(eng.engine.capturer.counts)
        row = eng.engine.create(CreateRequest(plan_id=other_plan, workspace_root=str(eng.root))).row
        seen.append((row.tree_digest, eng.full_scan(),
                     [k for k in before if eng.engine.capturer.counts[k] != before[k]]))

    at_restore_change(monkeypatch, {2: write_then_checkpoint})
    eng.rollback(target)
    [(checkpointed, scanned, modes)] = seen
    assert modes == [CaptureMode.INCREMENTAL]
    assert checkpointed == scanned
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)

def test_a_write_racing_the_end_of_the_quiet_period_is_in_the_next_checkpoint(eng, monkeypatch):
    """The write lands while the reader waits in its quiet batch and the quiet block ends."""
    monkeypatch.setattr(watcher_module, "QUIET_SECONDS", 3600.0)
    target, _ = three_files(eng)
    write(eng.root / "late.txt", "before\n")
    eng.checkpoint()
    watcher = eng.engine.watcher
    real_quieted = watcher.quieted

    @contextlib.contextmanager
    def quieted_then_write():
        with real_quieted():
            yield
            write(eng.root / "late.txt", "written as the quiet period ends\n")
        write(eng.root / "late2.txt", "written right after it\n")

    monkeypatch.setattr(watcher, "quieted", quieted_then_write)
    eng.rollback(target)
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)


def test_an_event_queue_overflow_during_the_quiet_period_makes_the_next_checkpoint_scan(eng, monkeypatch):
    monkeypatch.setattr(watcher_module, "QUIET_SECONDS", 3600.0)
    write(eng.root / "x0", "x")
    write(eng.root / "x1", "x")
    target, _ = three_files(eng)
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    watcher = eng.engine.watcher

    def flood() -> None:
        # Held: nothing reads the queue; alternating names defeat the kernel's merging of events.
        with watcher.hold_events():
            for i in range(limit + 10):
                os.utime(eng.root / f"x{i % 2}")
            write(eng.root / "lost-in-the-flood.txt", "its event was dropped\n")

    at_restore_change(monkeypatch, {2: flood})
    before = watcher.overflows
    eng.rollback(target)
    eng.checkpoint(expect=CaptureMode.FULL)
    assert watcher.overflows > before



def rich_target(eng: Engine):
    """A target with every kind of entry and odd modes, then a workspace changed in every way."""
    write(eng.root / "keep.txt", "kept\n")
    write(eng.root / "mode.sh", "#!/bin/sh\n", 0o4755)
    write(eng.root / "empty", b"", 0o600)
    write(eng.root / "none.txt", "no permissions\n", 0o000)
    write(eng.root / "d/inner.txt", "inner\n")
    os.chmod(eng.root / "d", 0o751)
    write(eng.root / "sticky/x", "x")
    os.chmod(eng.root / "sticky", 0o1777)
    write(eng.root / "becomes-dir", "a file in the target\n")
    write(eng.root / "gone-dir/sub/f.txt", "a directory in the target\n")
    os.symlink("keep.txt", eng.root / "link")
    os.symlink("/nonexistent/target", eng.root / "dangling")
    os.symlink("d", eng.root / "dirlink")
    target = eng.checkpoint()
    # Changed in every way.
    write(eng.root / "mode.sh", "#!/bin/sh\necho changed\n", 0o755)
    write(eng.root / "empty", b"not empty now")
    os.chmod(eng.root / "none.txt", 0o644)
    os.chmod(eng.root / "d", 0o700)
    write(eng.root / "d/inner.txt", "inner changed\n")
    write(eng.root / "d/new.txt", "new in d\n")
    os.chmod(eng.root / "sticky", 0o755)
    os.unlink(eng.root / "becomes-dir")
    write(eng.root / "becomes-dir/child.txt", "now a directory\n")
    shutil.rmtree(eng.root / "gone-dir")
    write(eng.root / "gone-dir", "now a file\n")
    os.unlink(eng.root / "link")
    os.symlink("d/inner.txt", eng.root / "link")
    os.unlink(eng.root / "dangling")
    write(eng.root / "dangling", "a file now\n")
    os.unlink(eng.root / "dirlink")
    os.mkdir(eng.root / "dirlink")
    write(eng.root / "added/deep/file.txt", "added since\n")
    return target


def test_a_rollback_restores_exact_bytes_modes_and_symlinks(eng):
    target = rich_target(eng)
    eng.checkpoint()
    expected = eng.files_of(target)
    eng.rollback(target)
    assert tree_state(eng.root) == expected
    eng.checkpoint()


@pytest.mark.parametrize("fail_at", range(1, 22))  # every change of rich_target's rollback
def test_a_rollback_failing_part_way_leaves_the_workspace_as_the_safety_checkpoint(eng, monkeypatch, fail_at):
    target = rich_target(eng)
    eng.checkpoint()
    before = tree_state(eng.root)

    fail_workspace_change(monkeypatch, fail_at, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(CheckpointdError) as failed:
        eng.rollback(target)
    assert "disk is full" in str(failed.value) or "undone" in str(failed.value), failed.value
    assert tree_state(eng.root) == before
    eng.checkpoint()



def test_a_rollback_whose_final_sync_fails_is_undone(eng, monkeypatch):
    """Every change is renamed into place, then the batch's one sync fails (EIO): the rollback
    must not be reported done, and what it wrote is taken back."""
    from checkpointd.core.workspace import syncbatch as syncbatch_module
    target = rich_target(eng)
    eng.checkpoint()
    before = tree_state(eng.root)
    real_flush = syncbatch_module.SyncBatch.flush
    failed_once = []

    def flush(self):
        if not failed_once:
            failed_once.append(True)
            raise syncbatch_module.SyncFailed("d/inner.txt", OSError(errno.EIO, "Input/output error"))
        return real_flush(self)

    monkeypatch.setattr(syncbatch_module.SyncBatch, "flush", flush)
    with pytest.raises(CheckpointdError):
        eng.rollback(target)
    assert failed_once
    assert tree_state(eng.root) == before
    eng.checkpoint()

@pytest.mark.parametrize("fail_at", [2, 5, 9, 14, 20])
def test_a_rollback_whose_undo_fails_too_is_undone_before_the_plan_is_next_used(eng, monkeypatch, fail_at):
    target = rich_target(eng)
    eng.checkpoint()
    before = tree_state(eng.root)
    # The rollback fails at its fail_at-th change, then its undo at its own second change.
    fail_workspace_change(monkeypatch, {fail_at, fail_at + 2}, OSError(errno.EIO, "Input/output error"))
    with pytest.raises(CheckpointdError) as failed:
        eng.rollback(target)
    monkeypatch.undo()
    assert "undoing it failed" in str(failed.value) or tree_state(eng.root) == before, failed.value
    eng.checkpoint()  # takes the plan over: finishes the undo first
    assert tree_state(eng.root) == before
    assert eng.engine.journal.get(eng.plan_id) is None




def test_a_same_size_rewrite_with_its_mtime_put_back_right_after_a_checkpoint_is_seen(eng, monkeypatch):
    """Only the ctime tells (the mtime is old, outside the racy window): the stat index must
    compare it, in the capture and in the rollback's check."""
    write(eng.root / "f.txt", "AAAA\n")
    os.utime(eng.root / "f.txt", ns=(10**18, 10**18))
    eng.checkpoint()
    target = eng.checkpoint()
    write(eng.root / "f.txt", "BBBB\n")
    os.utime(eng.root / "f.txt", ns=(10**18, 10**18))
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)
    write(eng.root / "g.txt", "for the rollback to have something to do\n")
    eng.checkpoint()

    def rewrite() -> None:
        write(eng.root / "f.txt", "CCCC\n")
        os.utime(eng.root / "f.txt", ns=(10**18, 10**18))

    at_restore_change(monkeypatch, {1: rewrite})
    with pytest.raises(CheckpointdError):
        eng.rollback(target)
    assert (eng.root / "f.txt").read_bytes() == b"CCCC\n"
    eng.checkpoint()


def test_changes_seen_by_a_dry_run_rollback_or_a_live_diff_are_still_in_the_next_checkpoint(eng):
    """A dry run aborts its capture's batch and a live diff's capture is never recorded: what they
    took from the watch journal must come back (or force a scan), or the next checkpoint misses it."""
    target, _ = three_files(eng)
    write(eng.root / "a.txt", "seen by a dry run only\n")
    write(eng.root / "newdir/x.txt", "a new directory, seen by a dry run only\n")
    assert eng.rollback(target, dry_run=True).dry_run
    eng.checkpoint()
    write(eng.root / "b.txt", "seen by a live diff only\n")
    os.remove(eng.root / "newdir/x.txt")
    assert eng.engine.diff(target.checkpoint_id)
    eng.checkpoint()

# -- (b) nothing the safety checkpoint lacks is overwritten or deleted ------------------------------


def _swap_for_symlink(path: Path, outside: Path) -> None:
    path.unlink()
    os.symlink(outside / "decoy.txt", path)


def _swap_for_directory(path: Path, outside: Path) -> None:
    path.unlink()
    write(path / "precious.txt", "in a directory put where the file was\n")


def _swap_parent_for_symlink(path: Path, outside: Path) -> None:
    # d/ becomes a symlink to a directory outside holding a file of the same name.
    directory = path.parent
    shutil.rmtree(directory)
    write(outside / "elsewhere" / path.name, "outside, same name\n")
    os.symlink(outside / "elsewhere", directory)


def _write_through_outside_link(path: Path, outside: Path) -> None:
    with open(outside / "alias", "r+b") as f:  # same inode as d/c.txt: written in place
        f.write(b"WRITTEN THROUGH THE OUTSIDE NAME")


def _write_through_inside_link(path: Path, outside: Path) -> None:
    with open(path.parent / "c-link.txt", "r+b") as f:  # same inode, another name in the workspace
        f.write(b"WRITTEN THROUGH THE OTHER NAME IN THE WORKSPACE")


def _chmod(path: Path, outside: Path) -> None:
    os.chmod(path, 0o600)


def _fill_a_directory_the_rollback_removes(path: Path, outside: Path) -> None:
    write(path.parent.parent / "gone" / "late.txt", "created in a directory the rollback removes\n")


RACES = {
    "file-to-symlink": _swap_for_symlink,
    "file-to-directory": _swap_for_directory,
    "parent-to-symlink-outside": _swap_parent_for_symlink,
    "written-through-a-link-outside": _write_through_outside_link,
    "written-through-a-link-inside": _write_through_inside_link,
    "mode-changed": _chmod,
    "directory-filled": _fill_a_directory_the_rollback_removes,
}


@pytest.mark.parametrize("race", sorted(RACES))
def test_a_path_changed_during_the_rollback_is_kept_and_the_rollback_undone(eng, monkeypatch, tmp_path, race):
    outside = tmp_path / "outside"
    outside.mkdir()
    write(outside / "decoy.txt", "outside the workspace\n")
    for name in ("a", "b", "c"):
        write(eng.root / f"d/{name}.txt", f"target {name}\n")
    target = eng.checkpoint()
    for name in ("a", "b", "c"):
        write(eng.root / f"d/{name}.txt", f"changed {name} since\n")
    os.link(eng.root / "d/c.txt", outside / "alias")
    os.link(eng.root / "d/c.txt", eng.root / "d/c-link.txt")
    write(eng.root / "gone/sub/f.txt", "the target lacks this directory\n")
    eng.checkpoint()
    before = tree_state(eng.root)
    outside_before = tree_state(outside)
    delta: dict[str, object] = {}

    def racing() -> None:
        pre = tree_state(eng.root)
        pre_outside = tree_state(outside)
        RACES[race](eng.root / "d/c.txt", outside)
        post = tree_state(eng.root)
        delta.update({k: post.get(k) for k in pre.keys() | post.keys() if pre.get(k) != post.get(k)})
        outside_before.update({k: v for k, v in tree_state(outside).items() if pre_outside.get(k) != v})

    # Removals come first (gone/sub/f.txt, gone/sub, d/c-link.txt...): the race lands after the first.
    at_restore_change(monkeypatch, {2: racing})
    if race == "directory-filled":
        # Nothing it replaces changed: it goes on, and leaves the directory that is no longer empty.
        eng.rollback(target)
        expected = {**eng.files_of(target), "gone": before["gone"], "gone/late.txt": delta["gone/late.txt"]}
    else:
        with pytest.raises(CheckpointdError):
            eng.rollback(target)
        expected = {k: v for k, v in before.items() if k not in delta}
        expected.update({k: v for k, v in delta.items() if v is not None})
    assert tree_state(eng.root) == expected
    assert tree_state(outside) == outside_before, "the rollback changed something outside the workspace"
    eng.checkpoint()


def test_a_rollback_replacing_a_file_with_other_names_leaves_them_alone(eng, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write(eng.root / "a.txt", "target a\n")
    write(eng.root / "b.txt", "target b\n")
    target = eng.checkpoint()
    write(eng.root / "a.txt", "linked content\n")
    os.unlink(eng.root / "b.txt")
    os.link(eng.root / "a.txt", eng.root / "b.txt")
    os.link(eng.root / "a.txt", outside / "alias")
    eng.checkpoint()
    eng.rollback(target)
    assert tree_state(eng.root) == eng.files_of(target)
    assert (outside / "alias").read_bytes() == b"linked content\n"
    eng.checkpoint(expect=CaptureMode.INCREMENTAL)
    with open(outside / "alias", "r+b") as f:
        f.write(b"LINKED")
    assert tree_state(eng.root) == eng.files_of(target)
    eng.checkpoint()



def test_a_file_a_rollback_replaced_keeps_its_other_name_and_its_writer_is_still_seen(eng):
    """a.txt and b.txt are one file, which a writer holds open as a.txt; the rollback replaces
    a.txt (b.txt is the same in the target): the writer now writes b.txt, and nothing reports it."""
    write(eng.root / "a.txt", "target a\n")
    write(eng.root / "b.txt", "shared\n")
    target = eng.checkpoint()
    write(eng.root / "a.txt", "shared\n")
    os.unlink(eng.root / "b.txt")
    os.link(eng.root / "a.txt", eng.root / "b.txt")
    eng.checkpoint()
    with open(eng.root / "a.txt", "r+b") as writer:
        eng.rollback(target)
        assert tree_state(eng.root) == eng.files_of(target)
        eng.checkpoint()
        writer.write(b"SHARED")  # a writer that opened a.txt before the rollback
        writer.flush()
        assert (eng.root / "b.txt").read_bytes() == b"SHARED\n"
        eng.checkpoint()

# -- the watched capture against a full scan (tests/engine/conftest.Engines) ------------------------


def test_a_linked_file_written_through_an_fd_opened_by_a_name_since_removed_is_seen(engines, tmp_path):
    """a/f and b/g are one file; a writer opens it as a/f, then a/f is removed: the file has one
    name left, and the writer's writes report to no watch (the name it used is gone)."""
    write(engines.root / "a/f", "one\n")
    (engines.root / "b").mkdir()
    os.link(engines.root / "a/f", engines.root / "b/g")
    engines.check(expect="full")
    with open(engines.root / "a/f", "r+b") as writer:
        os.unlink(engines.root / "a/f")
        engines.check()  # b/g has one name now
        writer.write(b"TWO")
        writer.flush()
        engines.check()


def test_a_linked_file_written_through_an_fd_opened_outside_by_a_name_since_removed_is_seen(engines, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write(engines.root / "g", "one\n")
    os.link(engines.root / "g", outside / "h")
    engines.check(expect="full")
    with open(outside / "h", "r+b") as writer:
        os.unlink(outside / "h")
        engines.check()
        writer.write(b"TWO")
        writer.flush()
        engines.check()


@pytest.mark.xfail(strict=True, reason=_KNOWN_GAP_TEMPORARY_NAME)
def test_a_file_with_a_server_temporary_name_is_reported_as_a_full_scan_reports_it(engines):
    write(engines.root / "a.txt", "a\n")
    engines.check(expect="full")
    write(engines.root / f".checkpointd-tmp-{'0' * 32}", "left by a crashed rollback, or by a user\n")
    engines.check()


# -- (c) exactly the target's bytes, modes and symlinks ---------------------------------------------

_MODES = st.sampled_from([0o644, 0o600, 0o755, 0o4755, 0o2700, 0o1777, 0o000, 0o444])
_LEAF = st.one_of(
    st.none(),
    st.tuples(st.just("file"), st.binary(max_size=12), _MODES),
    st.tuples(st.just("symlink"), st.sampled_from(["a", "../x", "/abs/elsewhere", "d/x", "missing"])),
)
_NODE = st.one_of(_LEAF, st.tuples(st.just("dir"), st.sampled_from([0o755, 0o700, 0o1777, 0o2755]),
                                   st.fixed_dictionaries({"x": _LEAF, "y": _LEAF})))
_TREE = st.fixed_dictionaries({"a": _NODE, "b": _NODE, "d": _NODE})


def _build(root: Path, tree: dict) -> None:
    for child in list(root.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    _build_into(root, tree)


def _build_into(root: Path, tree: dict) -> None:
    for name, node in tree.items():
        path = root / name
        if node is None:
            continue
        if node[0] == "file":
            path.write_bytes(node[1])
            os.chmod(path, node[2])
        elif node[0] == "symlink":
            os.symlink(node[1], path)
        else:
            path.mkdir()
            _build_into(path, node[2])
            os.chmod(path, node[1])


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(target=_TREE, current=_TREE)
def test_a_rollback_brings_any_workspace_to_exactly_the_target(tmp_path_factory, target, current):
    eng = Engine(tmp_path_factory.mktemp("h"))
    try:
        _build(eng.root, target)
        row = eng.checkpoint()
        assert eng.files_of(row) == tree_state(eng.root)
        _build(eng.root, current)
        eng.checkpoint()
        eng.rollback(row)
        assert tree_state(eng.root) == eng.files_of(row)
        eng.checkpoint()
    finally:
        eng.close()

def test_names_that_are_not_utf8_or_hold_newlines_and_backslashes_are_captured_and_restored(eng):
    raw = os.fsdecode(b"caf\xe9 \n.txt")
    write(eng.root / raw, "latin-1 name with a newline\n")
    write(eng.root / "dir\\with\\backslash" / "x", "x")
    row = eng.checkpoint()
    assert set(eng.files_of(row)) == set(tree_state(eng.root)), (set(eng.files_of(row)) ^ set(tree_state(eng.root)))
    write(eng.root / raw, "changed\n")
    eng.checkpoint()
    eng.rollback(row)
    assert tree_state(eng.root) == eng.files_of(row)


@pytest.fixture
def watched_namespaced_server(short_tmp: Path, suite_databases):
    """A real server with the watcher on, in a mount namespace of its own (see ``live``)."""
    yield from serve(Path(tempfile.mkdtemp(prefix="a-", dir=short_tmp)), suite_databases, "on", NamespacedServer)


@pytest.mark.xfail(strict=True, reason=_KNOWN_GAP_SELF_BIND_MOUNT)
def test_a_directory_bind_mounted_inside_its_own_workspace_keeps_reporting_its_changes(watched_namespaced_server,
                                                                                      tmp_path):
    server = watched_namespaced_server
    session = NamespacedSession(server, server.new_workspace(), tmp_path)
    root = session.root
    write(root / "d/x.txt", "one\n")
    (root / "m").mkdir()
    try:
        session.checkpoint()
        server.in_namespace("mount", "--bind", str(root / "d"), str(root / "m"))
        session.checkpoint()
        before = session.checkpoint()
        write(root / "d/x.txt", "two, written through d\n")
        after = session.stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=session.plan_id, workspace_root=str(root)), timeout=60).checkpoint
        changed = [c.path for c in session.stub.DiffCheckpoints(pb.DiffCheckpointsRequest(
            base_checkpoint_id=before.checkpoint_id, target_checkpoint_id=after.checkpoint_id), timeout=60).changes]
        # m shows d's files too: both paths changed.
        assert changed == ["d/x.txt", "m/x.txt"], f"the checkpoint after the write records changes at {changed}"
        assert after.tree_digest == "sha256:" + session.full_scan()
    finally:
        session.close()
