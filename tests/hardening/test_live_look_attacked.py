"""The look of a live diff (``LookBatch``: file contents hashed, never stored) attacked.

A diff against the live workspace captures the workspace into a ``LookBatch`` and drops it. What
it hashed must never be taken as stored by anything that outlives the look, and the look must
still be exact. Each test checks what a user is promised:

* every checkpoint taken after looks restores exactly (each file read back from the store), also
  after its content was deduplicated against another plan's checkpoint that was then deleted and
  collected, after compaction, and after a restart;
* a look lists exactly the changes (paths, kinds, modes, sizes and digests) that a checkpoint of
  the same workspace at the same moment would differ by;
* the stat index and the capturer's incremental base learn nothing from a look;
* no call fails, including looks running beside checkpoints and collections of other plans.

In process (real SQLite, both store kinds, watcher on and off) where an interleaving must be made
exact; through real servers (offline ``checkpointd gc --compact``, restarts, fsck) otherwise.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.capture.look import LookBatch
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.contents import Contents, TextDiffStatus
from checkpointd.core.engine.requests import CreateRequest, EngineSettings, RollbackRequest, Scope
from checkpointd.core.kernel.telemetry import CaptureMode
from checkpointd.core.maintenance.retention import GcAborted, Maintenance
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import open_store
from checkpointd.core.store.tree import Change, EntryKind
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT
from tests.conftest import CHECKPOINTD, SERVER_ARGS, PostgresDatabases, RunningServer, serving_server
from tests.hardening.support import assert_fsck_clean, exported, start_with_faults
from tests.helpers import checkpoint_files, checkpoint_id_of, tree_state

# -- in process ----------------------------------------------------------------------------------


class _Engine:
    """One engine over a SQLite database and a content store of ``store_kind``, reopenable."""

    def __init__(self, base: Path, store_kind: str, watcher: bool) -> None:
        self.base = base
        self.store_kind = store_kind
        self.watcher = watcher
        self.workspaces = base / "workspaces"
        self.workspaces.mkdir(exist_ok=True)
        self.outside = base / "outside"
        self.outside.mkdir(exist_ok=True)
        self._open()

    def _open(self) -> None:
        self.db = Database(f"sqlite:///{self.base / 'meta.db'}")
        self.db.migrate()
        self.store = open_store(self.store_kind, self.db, self.base)
        self.config = ConfigStore(self.db)
        self.engine = Checkpoints(self.db, self.store, self.config,
                                  EngineSettings(self.base / "data", (str(self.workspaces),), watcher=self.watcher))
        if self.watcher:
            assert self.engine.watcher is not None, "these variants need the inotify watcher"
        self.maintenance = Maintenance(self.db, self.store, self.engine.trees, self.config, self.engine.delete)
        self.contents = Contents(self.db, self.store, self.engine.trees, self.engine.page_tokens)

    def close(self) -> None:
        self.engine.close()
        if self.engine.watcher is not None:
            self.engine.watcher.close()
        self.store.close()
        self.db.dispose()

    def restart(self) -> None:
        self.close()
        self._open()

    def workspace(self) -> Path:
        path = self.workspaces / f"ws-{ULID()}"
        path.mkdir()
        return path

    def checkpoint(self, plan_id: str, root: Path):
        return self.engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(root))).row

    def look(self, row) -> list[Change]:
        return self.engine.diff(row.checkpoint_id)

    def files_of(self, row) -> dict[str, tuple]:
        """What a checkpoint holds, in ``tree_state``'s shape."""
        return checkpoint_files(self.engine.trees, self.store, row.tree_digest)

    def gc(self) -> None:
        """A collection, then (disk store) a compaction of every pack holding a dead record."""
        self.maintenance.collect_garbage()
        if hasattr(self.store, "compact_all"):
            with self.store.collecting():
                self.store.compact_all()

    def capture_state(self, root: Path) -> tuple:
        """What the capturer and the stat index know of ``root``: (base object, its tree, recorded,
        the stat index's entries)."""
        state = self.engine.capturer._roots.get(str(root))
        base = state.base if state is not None else None
        entries = dict(self.engine.snapshotter.index.for_root(str(root)).entries)
        return base, getattr(base, "tree", None), getattr(base, "recorded", None), entries


VARIANTS = [("disk", True), ("disk", False), ("db", True), ("db", False)]


@pytest.fixture(params=VARIANTS, ids=[f"{kind}-watcher-{'on' if on else 'off'}" for kind, on in VARIANTS])
def engine(request, tmp_path: Path) -> Iterator[_Engine]:
    kind, watched = request.param
    if watched and not watcher_module.available():
        pytest.fail("inotify_simple is not installed: the watcher cannot run")
    opened = _Engine(tmp_path, kind, watched)
    try:
        yield opened
    finally:
        opened.close()


def write(path: Path, content: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mode is not None:
        os.chmod(path, mode)
    return path


def _shared_content(seed: int) -> dict[str, bytes]:
    """Files of every size class a store treats apart: empty, packed, at and over the loose limit."""
    rnd = random.Random(seed)
    return {
        "empty": b"",
        "small.txt": b"shared line %d\n" % seed,
        "at-limit.bin": rnd.randbytes(COMPRESS_LIMIT),
        "loose.bin": rnd.randbytes(COMPRESS_LIMIT + 1),
        "big.bin": rnd.randbytes(2 * COMPRESS_LIMIT + 7),
        "zeros.bin": bytes(COMPRESS_LIMIT + 4096),
    }


def _fill(root: Path, files: dict[str, bytes], under: str = "") -> None:
    for name, data in files.items():
        write(root / under / name, data)


def test_a_look_leaves_the_stat_index_and_the_incremental_base_as_they_were(engine: _Engine) -> None:
    """Before and after a look the capturer's base (the very object, its tree, whether recorded)
    and the stat index are equal; the checkpoint after the look differs from the one before
    by exactly what the look listed (digests included), and restores exactly."""
    plan, root = str(ULID()), engine.workspace()
    write(root / "a.txt", "a\n")
    write(root / "gone.txt", "gone\n")
    write(root / "d/keep.txt", "keep\n")
    os.symlink("a.txt", root / "link")
    first = engine.checkpoint(plan, root)
    write(root / "a.txt", "A\n")  # same size
    (root / "gone.txt").unlink()
    _fill(root, _shared_content(1), "new")
    os.chmod(root / "d", 0o700)
    os.remove(root / "link")
    os.symlink("d/keep.txt", root / "link")
    before = engine.capture_state(root)

    looked = engine.look(first)
    again = engine.look(first)

    after = engine.capture_state(root)
    assert after[0] is before[0] and after[1:] == before[1:], "a look changed what the next capture builds on"
    assert looked == again
    counts = dict(engine.engine.capturer.counts)
    second = engine.checkpoint(plan, root)
    if engine.watcher:
        # The look handed its journal back: the checkpoint after it is still incremental.
        moved = [mode for mode in counts if engine.engine.capturer.counts[mode] != counts[mode]]
        assert moved == [CaptureMode.INCREMENTAL] or before[0] is None, moved
    assert looked == engine.engine.diff(first.checkpoint_id, second.checkpoint_id)
    assert engine.files_of(second) == tree_state(root)
    assert engine.look(second) == []


def test_a_look_lists_kind_flips_mode_changes_and_empty_things_as_a_checkpoint_would(engine: _Engine) -> None:
    """Kinds flipped (file, directory, symlink, each way), a mode changed alone, an empty file
    emptied or filled, an empty directory: the look's changes (entries, digests) are those between
    the base and a checkpoint taken right after it."""
    plan, root = str(ULID()), engine.workspace()
    write(root / "file-to-dir", "f\n")
    write(root / "dir-to-link/x.txt", "x\n")
    os.symlink("nowhere", root / "link-to-file")
    write(root / "mode.sh", "#!/bin/sh\n", 0o644)
    write(root / "empty", "")
    write(root / "filled", "")
    write(root / "emptied", "data\n")
    a0 = engine.checkpoint(plan, root)
    os.remove(root / "file-to-dir")
    write(root / "file-to-dir/inner.txt", "f\n")  # the same content, now one level down
    shutil.rmtree(root / "dir-to-link")
    os.symlink("file-to-dir", root / "dir-to-link")
    os.remove(root / "link-to-file")
    write(root / "link-to-file", "nowhere")
    os.chmod(root / "mode.sh", 0o755)
    write(root / "filled", "now\n")
    write(root / "emptied", "")
    (root / "empty-dir").mkdir()
    looked = engine.look(a0)
    assert {c.path for c in looked} == {"file-to-dir", "file-to-dir/inner.txt", "dir-to-link", "dir-to-link/x.txt",
                                        "link-to-file", "mode.sh", "filled", "emptied", "empty-dir"}
    a1 = engine.checkpoint(plan, root)
    assert looked == engine.engine.diff(a0.checkpoint_id, a1.checkpoint_id)
    assert engine.files_of(a1) == tree_state(root)


def test_content_a_look_hashed_is_stored_by_the_checkpoint_after_gc_took_the_copy_it_shared(
        engine: _Engine) -> None:
    """Plan B checkpoints the same contents plan A has not checkpointed yet; plan A looks (before
    and after B's checkpoint); B's checkpoint is deleted and collected (and packs compacted)
    between A's looks and A's checkpoint, which must store every content itself: read back now,
    after another collection, and after a restart."""
    plan_a, root_a = str(ULID()), engine.workspace()
    plan_b, root_b = str(ULID()), engine.workspace()
    write(root_a / "base.txt", "a's base\n")
    a0 = engine.checkpoint(plan_a, root_a)
    shared = _shared_content(2)
    _fill(root_a, shared, "x")
    os.link(root_a / "x/small.txt", root_a / "x/small-link.txt")
    first_look = engine.look(a0)
    _fill(root_b, shared, "x")
    b0 = engine.checkpoint(plan_b, root_b)
    # Every digest the look hashed is now stored, by B.
    held_by_b = {e.digest for _p, e in engine.engine.trees.flatten(b0.tree_digest) if e.kind is EntryKind.FILE}
    assert {c.target.digest for c in first_look if c.target.kind is EntryKind.FILE} <= held_by_b
    assert engine.look(a0) == first_look
    engine.engine.delete(b0.checkpoint_id)
    engine.gc()
    assert engine.look(a0) == first_look
    a1 = engine.checkpoint(plan_a, root_a)
    expected = tree_state(root_a)
    assert engine.files_of(a1) == expected
    engine.gc()
    assert engine.files_of(a1) == expected
    engine.restart()
    assert engine.files_of(a1) == expected
    assert engine.look(a1) == []
    engine.gc()
    assert engine.files_of(a1) == expected


def test_a_look_after_gc_of_a_deleted_checkpoint_and_then_a_checkpoint_lose_nothing(engine: _Engine) -> None:
    """The stat index knows contents of a checkpoint since deleted and collected: a look between
    the collection and the next checkpoint re-reads them (they are not stored), and the next
    checkpoint stores them again."""
    plan, root = str(ULID()), engine.workspace()
    write(root / "base.txt", "base\n")
    a0 = engine.checkpoint(plan, root)
    _fill(root, _shared_content(3), "x")
    a1 = engine.checkpoint(plan, root)  # indexes x/*
    engine.engine.delete(a1.checkpoint_id)
    engine.gc()  # x/* is gone from the store, the index still vouches for the files' stat
    looked = engine.look(a0)
    assert sorted(c.path for c in looked) == ["x", *sorted(f"x/{n}" for n in _shared_content(3))]
    a2 = engine.checkpoint(plan, root)
    assert engine.files_of(a2) == tree_state(root)
    assert looked == engine.engine.diff(a0.checkpoint_id, a2.checkpoint_id)
    engine.restart()
    engine.gc()
    assert engine.files_of(a2) == tree_state(root)


@pytest.mark.parametrize("kind", ["disk", "db"])
def test_looks_beside_checkpoints_and_collections_of_another_plan_sharing_contents(tmp_path: Path,
                                                                                   kind: str) -> None:
    """Plan A's workspace holds contents plan B checkpoints, deletes and has collected, round after
    round, while A is looked at over and over in another thread and a third collects. No call
    fails, every look of A (whose workspace does not change) is the same, and A's checkpoint
    afterwards and B's last one restore exactly."""
    engine = _Engine(tmp_path, kind, watcher=watcher_module.available())
    try:
        plan_a, root_a = str(ULID()), engine.workspace()
        plan_b, root_b = str(ULID()), engine.workspace()
        write(root_a / "base.txt", "a\n")
        a0 = engine.checkpoint(plan_a, root_a)
        rounds = [_shared_content(10 + i) for i in range(4)]
        for i, files in enumerate(rounds):
            _fill(root_a, {name: data for name, data in files.items() if name != "big.bin"}, f"r{i}")
        expected_look = engine.look(a0)
        errors: list[BaseException] = []
        looks: list[list[Change]] = []
        done = threading.Event()

        def guarded(work: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    work()
                except BaseException as exc:  # re-raised in the test's thread
                    errors.append(exc)
            return run

        def look_at_a() -> None:
            while not done.is_set() or len(looks) < 4:
                looks.append(engine.look(a0))

        def churn_b() -> None:
            try:
                previous = None
                for i, files in enumerate(rounds * 2):
                    shutil.rmtree(root_b / "x", ignore_errors=True)
                    _fill(root_b, {name: data for name, data in files.items() if name != "big.bin"}, "x")
                    row = engine.checkpoint(plan_b, root_b)
                    assert engine.files_of(row) == tree_state(root_b), f"round {i}"
                    if previous is not None:
                        engine.engine.delete(previous.checkpoint_id)
                    previous = row
            finally:
                done.set()

        def collect() -> None:
            while not done.is_set():
                with contextlib.suppress(GcAborted):  # postponed behind a capture: the next round tries
                    engine.gc()

        threads = [threading.Thread(target=guarded(work)) for work in (look_at_a, churn_b, collect)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "a look, checkpoint or collection hung"
        if errors:
            raise errors[0]
        assert looks and all(look == expected_look for look in looks)
        a1 = engine.checkpoint(plan_a, root_a)
        assert engine.files_of(a1) == tree_state(root_a)
        engine.gc()
        assert engine.files_of(a1) == tree_state(root_a)
        [last_b] = engine.engine.list(plan_b)[0]
        assert engine.files_of(last_b.row) == tree_state(root_b)
    finally:
        engine.close()


def test_a_file_growing_past_the_loose_limit_while_a_look_reads_it(engine: _Engine, monkeypatch) -> None:
    """A file stat'ed under ``COMPRESS_LIMIT`` grows past it between its open and its read by the
    look: the look lists what it read (size and digest), which is what the next checkpoint stores."""
    plan, root = str(ULID()), engine.workspace()
    write(root / "grows.bin", b"x" * 100)
    a0 = engine.checkpoint(plan, root)
    write(root / "grows.bin", b"y" * 100)
    real = LookBatch.put_fd
    grown = [False]

    def growing(self, src_fd: int, expected_size: int, similar: str = ""):
        if not grown[0]:
            grown[0] = True
            with open(root / "grows.bin", "ab") as f:
                f.write(os.urandom(COMPRESS_LIMIT + 10))
        return real(self, src_fd, expected_size, similar)

    monkeypatch.setattr(LookBatch, "put_fd", growing)
    [change] = engine.look(a0)
    monkeypatch.undo()
    assert grown[0]
    size = (root / "grows.bin").stat().st_size
    assert (change.path, change.target.size) == ("grows.bin", size)
    a1 = engine.checkpoint(plan, root)
    assert engine.engine.diff(a0.checkpoint_id, a1.checkpoint_id) == [change]
    assert engine.files_of(a1) == tree_state(root)


def test_text_diffs_of_files_changed_after_the_look_are_unreadable_never_wrong(tmp_path: Path) -> None:
    """The text of a live change is read after the look: a file rewritten (same size) since, or
    replaced by a symlink, is UNREADABLE; written back, its diff is exact again."""
    engine = _Engine(tmp_path, "disk", watcher=watcher_module.available())
    try:
        plan, root = str(ULID()), engine.workspace()
        write(root / "t.txt", "one\n")
        write(root / "s.txt", "sym\n")
        a0 = engine.checkpoint(plan, root)
        write(root / "t.txt", "two\n")
        write(root / "s.txt", "SYM\n")
        write(root / "new.txt", "new\n")
        page = engine.engine.diff_page(a0.checkpoint_id, "", (), True)
        assert [c.path for c in page.changes] == ["new.txt", "s.txt", "t.txt"]
        write(root / "t.txt", "TWO\n")
        os.remove(root / "s.txt")
        os.symlink("t.txt", root / "s.txt")
        texts = engine.contents.text_diffs(a0.checkpoint_id, "", page.changes)
        assert texts["t.txt"].status == TextDiffStatus.UNREADABLE
        assert texts["s.txt"].status == TextDiffStatus.UNREADABLE
        assert (texts["new.txt"].status, texts["new.txt"].text) == (
            TextDiffStatus.TEXT, "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n")
        write(root / "t.txt", "two\n")
        texts = engine.contents.text_diffs(a0.checkpoint_id, "", page.changes)
        assert (texts["t.txt"].status, texts["t.txt"].text) == (
            TextDiffStatus.TEXT, "--- a/t.txt\n+++ b/t.txt\n@@ -1 +1 @@\n-one\n+two\n")
    finally:
        engine.close()


def test_a_paged_look_with_the_workspace_changing_between_pages(engine: _Engine) -> None:
    """Each page is a look of its own: a path never comes twice, a change after the last listed
    path shows up, one before it does not; what a page lists is what was there at its look."""
    plan, root = str(ULID()), engine.workspace()
    for name in "bdf":
        write(root / f"{name}.txt", f"{name}\n")
    a0 = engine.checkpoint(plan, root)
    for name in "bdf":
        write(root / f"{name}.txt", f"{name} changed\n")
    listed: list[Change] = []
    page = engine.engine.diff_page(a0.checkpoint_id, "", (), False, page_size=1)
    listed += page.changes
    token = engine.engine.diff_token_after(a0.checkpoint_id, "", (), False, page.changes[-1], page.after)
    write(root / "a.txt", "before the token\n")  # sorts before b.txt: not listed
    write(root / "b.txt", "b changed again!\n")  # listed already: not again
    write(root / "e.txt", "after the token\n")
    while token:
        page = engine.engine.diff_page(a0.checkpoint_id, "", (), False, page_size=1, page_token=token)
        listed += page.changes
        token = (engine.engine.diff_token_after(a0.checkpoint_id, "", (), False, page.changes[-1], page.after)
                 if page.after else "")
        write(root / "f.txt", "f changed at every page\n" + "!" * len(listed))
    paths = [c.path for c in listed]
    assert paths == ["b.txt", "d.txt", "e.txt", "f.txt"]
    assert listed[0].target.size == len("b changed\n")
    a1 = engine.checkpoint(plan, root)
    assert engine.files_of(a1) == tree_state(root)
    whole = engine.look(a0)
    assert whole == engine.engine.diff(a0.checkpoint_id, a1.checkpoint_id)


@pytest.mark.parametrize("other_name", ["outside", "inside"])
def test_writes_through_another_name_after_looks_are_captured(engine: _Engine, other_name: str) -> None:
    """A file with a second name (outside the workspace, known to the base; or inside, made after
    the base: a look meets it first) written in place, same size, through that name after looks:
    the next look and checkpoint see every write. (A name made outside after the base is a
    documented blind spot of the watcher, see watcher.py, so it is not tested here.)"""
    plan, root = str(ULID()), engine.workspace()
    write(root / "f.txt", "first\n")
    write(root / "d/other.txt", "other\n")
    other = engine.outside / "g.txt" if other_name == "outside" else root / "d/h.txt"
    if other_name == "outside":
        os.link(root / "f.txt", other)
    a0 = engine.checkpoint(plan, root)
    if other_name == "inside":
        os.link(root / "f.txt", other)
    first = engine.look(a0)
    assert [c.path for c in first] == ([] if other_name == "outside" else ["d/h.txt"])
    with open(other, "r+b") as f:
        f.write(b"again")
    looked = engine.look(a0)
    assert [c.path for c in looked] == [c.path for c in first] + ["f.txt"]
    a1 = engine.checkpoint(plan, root)
    assert engine.files_of(a1) == tree_state(root)
    assert engine.look(a1) == []
    with open(other, "r+b") as f:
        f.write(b"third")
    assert [c.path for c in engine.look(a1)] == (["f.txt"] if other_name == "outside" else ["d/h.txt", "f.txt"])
    a2 = engine.checkpoint(plan, root)
    assert engine.files_of(a2)["f.txt"][1] == b"third\n"
    assert engine.files_of(a2) == tree_state(root)


def test_same_size_rewrites_with_the_mtime_put_back_around_looks(engine: _Engine) -> None:
    """Rewrites of the same size whose mtime is put back (only ctime and the content differ), made
    before and after looks, in and out of the racy window: each look and checkpoint is exact."""
    plan, root = str(ULID()), engine.workspace()
    old, fresh = write(root / "old.txt", "aaaa\n"), write(root / "fresh.txt", "bbbb\n")
    os.utime(old, ns=(10**18, 10**18))  # long before any capture: the index trusts its stat
    a0 = engine.checkpoint(plan, root)
    for content, expected in ((b"AAAA\n", ["fresh.txt", "old.txt"]), (b"aaaa\n", ["fresh.txt"])):
        old.write_bytes(content)
        os.utime(old, ns=(10**18, 10**18))
        fresh.write_bytes(b"BBBB\n")
        assert [c.path for c in engine.look(a0)] == expected
        assert [c.path for c in engine.look(a0)] == expected
        a1 = engine.checkpoint(plan, root)
        assert engine.files_of(a1) == tree_state(root)
        assert [c.path for c in engine.engine.diff(a0.checkpoint_id, a1.checkpoint_id)] == expected
        fresh.write_bytes(b"bbbb\n")


def test_a_look_that_fails_midway_leaves_the_next_captures_whole(engine: _Engine, monkeypatch) -> None:
    """A look whose hashing fails (an error the capture does not expect) fails the call; the
    workspace's lock is free again, and the next look and checkpoint are exact."""
    plan, root = str(ULID()), engine.workspace()
    write(root / "a.txt", "a\n")
    a0 = engine.checkpoint(plan, root)
    _fill(root, {f"f{i}.txt": b"%d\n" % i for i in range(12)}, "new")
    write(root / "a.txt", "b\n")

    def failing(self, src_fd: int, expected_size: int, similar: str = ""):
        raise RuntimeError("injected")

    monkeypatch.setattr(LookBatch, "put_fd", failing)
    with pytest.raises(RuntimeError, match="injected"):
        engine.look(a0)
    monkeypatch.undo()
    looked = engine.look(a0)
    assert [c.path for c in looked] == ["a.txt", "new", *sorted(f"new/f{i}.txt" for i in range(12))]
    done = threading.Event()
    result: list = []
    thread = threading.Thread(target=lambda: (result.append(engine.checkpoint(plan, root)), done.set()))
    thread.start()
    assert done.wait(30), "the checkpoint after a failed look waits forever for the workspace"
    [a1] = result
    assert looked == engine.engine.diff(a0.checkpoint_id, a1.checkpoint_id)
    assert engine.files_of(a1) == tree_state(root)


def test_a_dry_run_rollback_then_the_rollback_keeps_every_file_it_replaces(engine: _Engine) -> None:
    """A dry run of a rollback is a look too, and it hashes what the capture left out (an ignored
    file the rollback would replace) through ``capture_paths``. The real rollback after dry runs
    plans the same changes, and its safety checkpoint holds every file it replaced, the ignored
    one included: read back now, after a collection and after a restart."""
    plan, root = str(ULID()), engine.workspace()
    write(root / "x.log", "target log\n")
    write(root / "keep.txt", "target\n")
    target = engine.checkpoint(plan, root)
    write(root / ".gitignore", "*.log\n")
    write(root / "x.log", "the user's log, never checkpointed\n")
    write(root / "keep.txt", "the user's edit\n")
    _fill(root, {"loose.bin": os.urandom(COMPRESS_LIMIT + 5), "empty": b""}, "new")
    before = tree_state(root)
    request = RollbackRequest(plan_id=plan, checkpoint_id=target.checkpoint_id, scope=Scope.FILES, dry_run=True)
    dry = engine.engine.rollback(request)
    assert engine.engine.rollback(request).changes == dry.changes
    assert {c.path for c in dry.changes} >= {"x.log", "keep.txt", "new", "new/loose.bin", "new/empty"}
    assert tree_state(root) == before
    done = engine.engine.rollback(RollbackRequest(plan_id=plan, checkpoint_id=target.checkpoint_id,
                                                  scope=Scope.FILES, request_id=str(ULID())))
    assert done.changes == dry.changes
    safety = done.safety.row
    assert engine.files_of(safety) == before
    engine.gc()
    engine.restart()
    assert engine.files_of(safety) == before


def test_a_look_at_more_files_than_reader_processes_take(tmp_path: Path) -> None:
    """A look never hands files to reader processes (they store what they read); the checkpoint
    after it does, and stores every file."""
    engine = _Engine(tmp_path, "disk", watcher=False)
    try:
        engine.engine.snapshotter._readers_min_files = 8
        plan, root = str(ULID()), engine.workspace()
        write(root / "base.txt", "base\n")
        a0 = engine.checkpoint(plan, root)
        for i in range(120):
            write(root / f"many/{i % 6}/f{i:03}.txt", b"file %d\n" % i * (i % 7))
        looked = engine.look(a0)
        assert len([c for c in looked if c.target.kind is EntryKind.FILE]) == 120
        a1 = engine.checkpoint(plan, root)
        assert looked == engine.engine.diff(a0.checkpoint_id, a1.checkpoint_id)
        assert engine.files_of(a1) == tree_state(root)
    finally:
        engine.close()


# -- through real servers ------------------------------------------------------------------------


#: Each store once, each watcher mode once (the in-process tests above run all four pairs).
SERVER_VARIANTS = [("disk", "on"), ("db", "off")]


@pytest.fixture(params=SERVER_VARIANTS, ids=[f"{k}-watcher-{w}" for k, w in SERVER_VARIANTS])
def server(request, short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    kind, watcher = request.param
    yield from serving_server(Path(tempfile.mkdtemp(prefix="l-", dir=short_tmp)), suite_databases,
                              extra_args=(*SERVER_ARGS, "--store", kind, "--watcher", watcher))


def _gc_compact(server: RunningServer, knobs: dict[str, str] | None = None) -> None:
    """`checkpointd gc --compact` on the stopped server's data directory (with the server's knobs)."""
    command = [CHECKPOINTD, "gc", "--data-dir", str(server.data_dir), "--store", server.store_kind, "--compact",
               "--json"]
    if server.db_url:
        command += ["--db-url", server.db_url]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")} | (knobs or {})
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _look(stub, base: str, **fields) -> list[tuple]:
    changes, token = [], ""
    while True:
        reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, page_token=token, **fields))
        changes += [(c.path, c.kind, c.target_size_bytes) for c in reply.changes]
        token = reply.next_page_token
        if not token:
            return changes


def _between(stub, base: str, target: str) -> list[tuple]:
    reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, target_checkpoint_id=target))
    return [(c.path, c.kind, c.target_size_bytes) for c in reply.changes]


def _read(stub, checkpoint_id: str, path: str) -> bytes:
    return b"".join(c.data for c in stub.ReadCheckpointFile(
        pb.ReadCheckpointFileRequest(checkpoint_id=checkpoint_id, path=path)))


def test_looks_interleaved_with_shared_content_survive_gc_compaction_and_restarts(server: RunningServer) -> None:
    """Through a server of each store kind, watcher on and off: plan A is looked at while plan B
    checkpoints, then deletes, the same contents; offline GC with compaction between; a look is
    the first capture after a restart; A's checkpoint restores exactly throughout, fsck is clean."""
    root_a, root_b = server.new_workspace(), server.new_workspace()
    plan_a, plan_b = str(ULID()), str(ULID())
    write(root_a / "base.txt", "a\n")
    shared = _shared_content(20)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        a0 = checkpoint_id_of(stub, plan_a, root_a)
        _fill(root_a, shared, "x")
        os.symlink("x/small.txt", root_a / "link")
        os.link(root_a / "x/loose.bin", root_a / "x/loose-link.bin")
        first = _look(stub, a0, text_diffs=True)
        assert _look(stub, a0, page_size=2) == first
        _fill(root_b, shared, "x")
        b0 = checkpoint_id_of(stub, plan_b, root_b)
        assert _look(stub, a0) == first
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=b0))
    server.stop()
    _gc_compact(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert _look(stub, a0) == first  # the first capture of A since the restart
        a1 = checkpoint_id_of(stub, plan_a)
        assert _between(stub, a0, a1) == first
        expected = tree_state(root_a)
        assert exported(stub, a1) == expected
        assert _read(stub, a1, "x/big.bin") == shared["big.bin"]
    server.stop()
    _gc_compact(server)
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert exported(stub, a1) == expected
        assert _look(stub, a1) == []


def test_a_look_stores_nothing_in_the_database_store(short_tmp: Path,
                                                   suite_databases: PostgresDatabases | None) -> None:
    """--store db: looks at a workspace with uncheckpointed files leave the object count as it
    was (their nodes are dropped with them); the checkpoint after them stores every file."""
    generator = _server(short_tmp, suite_databases, ("--store", "db"))
    running = next(generator)
    try:
        root, plan = running.new_workspace(), str(ULID())
        write(root / "base.txt", "base\n")
        with grpc.insecure_channel(running.tcp_target) as channel:
            stub = pb_grpc.CheckpointServiceStub(channel)
            a0 = checkpoint_id_of(stub, plan, root)
            _fill(root, _shared_content(30), "x")
            before = running.object_count()
            looked = _look(stub, a0)
            assert _look(stub, a0, page_size=1, text_diffs=True) == looked
            assert running.object_count() == before, "a look stored objects"
            a1 = checkpoint_id_of(stub, plan)
            assert running.object_count() > before
            assert exported(stub, a1) == tree_state(root)
    finally:
        generator.close()


def _server(short_tmp: Path, databases: PostgresDatabases | None, args: tuple[str, ...]) -> Iterator[RunningServer]:
    yield from serving_server(Path(tempfile.mkdtemp(prefix="l-", dir=short_tmp)), databases,
                              extra_args=(*SERVER_ARGS, *args))


def test_concurrent_looks_and_checkpoints_over_grpc_never_fail(server: RunningServer) -> None:
    """Looks of plan A (paged, with text diffs) from several threads at once, beside checkpoints
    of A and of plan B holding the same contents: no call fails, each look of A (whose workspace
    does not change) is the same, and every checkpoint restores exactly."""
    root_a, root_b = server.new_workspace(), server.new_workspace()
    plan_a, plan_b = str(ULID()), str(ULID())
    write(root_a / "base.txt", "a\n")
    files = {name: data for name, data in _shared_content(40).items() if name != "big.bin"}
    errors: list[BaseException] = []
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        a0 = checkpoint_id_of(stub, plan_a, root_a)
        _fill(root_a, files, "x")
        write(root_a / "x/t.txt", "text\n")
        expected = _look(stub, a0)
        looks: list[list[tuple]] = []
        made: list[str] = []

        def looker() -> None:
            try:
                for _ in range(4):
                    looks.append(_look(stub, a0, page_size=3, text_diffs=True))
            except BaseException as exc:
                errors.append(exc)

        def checkpointer() -> None:
            try:
                for i in range(3):
                    _fill(root_b, files, f"r{i}")
                    made.append(checkpoint_id_of(stub, plan_b, root_b))
                    made.append(checkpoint_id_of(stub, plan_a, root_a))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=looker) for _ in range(3)] + [threading.Thread(target=checkpointer)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "a call hung"
        if errors:
            raise errors[0]
        assert all(look == expected for look in looks)
        assert exported(stub, made[-1]) == tree_state(root_a)
        assert exported(stub, made[-2]) == tree_state(root_b)


KNOBS = {"CHECKPOINTD_TREE_SPLIT_ENTRIES": "8", "CHECKPOINTD_PACK_ROTATE_BYTES": "65536"}
KNOB_VARIANTS = ["disk-watcher-on", "postgres-db-watcher-on"]


@pytest.fixture(params=KNOB_VARIANTS)
def knob_server(request, short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    """A server not started yet, to be started with ``KNOBS`` (split directories of more than 8
    entries, small packs); on PostgreSQL for the last variant."""
    databases = request.getfixturevalue("postgres") if request.param.startswith("postgres") else suite_databases
    kind = "disk" if request.param.startswith("disk") else "db"
    db_url = databases.create() if databases is not None else ""
    running = RunningServer(Path(tempfile.mkdtemp(prefix="k-", dir=short_tmp)), db_url=db_url,
                            extra_args=(*SERVER_ARGS, "--store", kind, "--watcher", request.param.rsplit("-", 1)[1]))
    try:
        yield running
    finally:
        running.stop()
        if databases is not None:
            databases.drop(db_url)


def test_looks_at_split_directories_with_small_packs_survive_gc_and_restarts(knob_server: RunningServer) -> None:
    """A directory stored split (parts of a few entries) changed in several parts and looked at,
    paged, while another plan checkpoints and deletes the same contents; offline GC with
    compaction of many small packs; restarts: the checkpoint after the looks restores exactly."""
    server = knob_server
    start_with_faults(server, **KNOBS)
    root_a, root_b = server.new_workspace(), server.new_workspace()
    plan_a, plan_b = str(ULID()), str(ULID())
    for i in range(40):
        write(root_a / f"big/f{i:02}.txt", b"line %d\n" % i * 50)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        a0 = checkpoint_id_of(stub, plan_a, root_a)
        for i in (3, 17, 33):
            write(root_a / f"big/f{i:02}.txt", os.urandom(3000))
        for i in (8, 25):
            (root_a / f"big/f{i:02}.txt").unlink()
        fresh = {f"g{i}.bin": os.urandom(20000 + i) for i in range(5)}
        _fill(root_a, fresh, "big")
        first = _look(stub, a0, page_size=3, text_diffs=True)
        assert _look(stub, a0) == first
        assert len(first) == 10
        _fill(root_b, fresh, "big")
        b0 = checkpoint_id_of(stub, plan_b, root_b)
        assert _look(stub, a0, page_size=4) == first
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=b0))
    server.stop()
    _gc_compact(server, KNOBS)
    start_with_faults(server, **KNOBS)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert _look(stub, a0, page_size=2) == first
        a1 = checkpoint_id_of(stub, plan_a)
        assert _between(stub, a0, a1) == first
        expected = tree_state(root_a)
        assert exported(stub, a1) == expected
    server.stop()
    _gc_compact(server, KNOBS)
    assert_fsck_clean(server)
    start_with_faults(server, **KNOBS)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert exported(stub, a1) == expected
        assert _look(stub, a1) == []
