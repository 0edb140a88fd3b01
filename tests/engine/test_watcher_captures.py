"""The watcher path must capture exactly what a full scan captures, whatever happened to the
workspace between (or during) checkpoints, and must fall back to a full scan when it cannot
vouch for completeness. Every check compares the tree digest, counts and skipped files of a
watched capture with a full scan of the same workspace (see conftest.Engines.check)."""

from __future__ import annotations

import errno
import os
import random
import shutil
import threading
import time
import types
from pathlib import Path

from checkpointd.core.capture import capturer as capturer_module
from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture import stat_index as stat_index_module
from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.capture.snapshot import SKIP_TOO_LARGE, SKIP_UNREADABLE
from checkpointd.core.kernel.telemetry import CaptureMode
from tests.engine.conftest import write
from tests.ops.conftest import wait_until


def _populate(root: Path, dirs: int = 6, files: int = 8) -> None:
    for d in range(dirs):
        for f in range(files):
            write(root / f"pkg{d}" / f"sub{d % 3}" / f"file{f}.txt", f"content {d} {f}\n")
    write(root / "README.md", "readme\n")


def test_edits_between_checkpoints_are_all_seen(engines):
    _populate(engines.root)
    engines.check(expect="full")
    engines.check()
    write(engines.root / "pkg0/sub0/file0.txt", "changed\n")
    engines.check()
    write(engines.root / "pkg1/new.txt", "new file\n")
    (engines.root / "pkg2/sub2/file3.txt").unlink()
    engines.check()
    os.chmod(engines.root / "pkg3/sub0/file1.txt", 0o755)
    os.chmod(engines.root / "pkg4", 0o750)
    engines.check()
    os.symlink("README.md", engines.root / "link")
    (engines.root / "pkg5/sub2/file2.txt").unlink()
    os.symlink("../../README.md", engines.root / "pkg5/sub2/file2.txt")
    engines.check()
    with open(engines.root / "pkg0/sub0/file1.txt", "r+b") as f:
        f.truncate(0)
    engines.check()
    # The same size and the same second: only the content differs.
    write(engines.root / "pkg0/sub0/file2.txt", "CONTENT 0 2\n")
    result = engines.check()
    assert result.file_count == 50  # 48 + README + new.txt - file3.txt + link


def test_files_that_become_too_large_or_unsupported_are_skipped_alike(engines):
    _populate(engines.root, dirs=2, files=2)
    engines.max_size = 100
    engines.check(expect="full")
    write(engines.root / "pkg0/big.bin", b"x" * 500)
    os.mkfifo(engines.root / "pkg1/fifo")
    result = engines.check()
    assert {(s.path, s.reason) for s in result.skipped} >= {("pkg0/big.bin", SKIP_TOO_LARGE)}
    write(engines.root / "pkg0/big.bin", b"small")
    (engines.root / "pkg1/fifo").unlink()
    result = engines.check()
    assert result.skipped == []


def test_new_directories_deep_trees_and_files_added_to_them_later(engines):
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    deep = engines.root / "new/a/b/c/d"
    deep.mkdir(parents=True)
    write(deep / "leaf.txt", "leaf\n")
    write(engines.root / "new/a/top.txt", "top\n")
    engines.check()
    write(deep / "second.txt", "added after the directory was first captured\n")
    (engines.root / "new/a/b/c/e").mkdir()
    engines.check()
    write(engines.root / "new/a/b/c/e/inner.txt", "inner\n")
    engines.check()


def test_deleting_whole_subtrees(engines):
    _populate(engines.root)
    engines.check(expect="full")
    shutil.rmtree(engines.root / "pkg1")
    shutil.rmtree(engines.root / "pkg2/sub2")
    engines.check()
    (engines.root / "pkg1").mkdir()
    write(engines.root / "pkg1/sub1/back.txt", "recreated\n")
    engines.check()


def test_directory_renames_and_moves_in_and_out_of_the_workspace(engines, tmp_path):
    _populate(engines.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    engines.check(expect="full")
    os.rename(engines.root / "pkg0", engines.root / "renamed")
    engines.check()
    write(engines.root / "renamed/sub0/file0.txt", "edited after the rename\n")
    engines.check()
    os.rename(engines.root / "pkg1", engines.root / "pkg2/nested")
    engines.check()
    write(engines.root / "pkg2/nested/sub1/file1.txt", "edited inside the moved directory\n")
    engines.check()
    os.rename(engines.root / "pkg3", outside / "pkg3")
    engines.check()
    write(outside / "pkg3/sub0/file0.txt", "edited outside: not part of the workspace\n")
    engines.check()
    os.rename(outside / "pkg3", engines.root / "back")
    engines.check()
    write(engines.root / "back/sub0/file1.txt", "edited after moving back in\n")
    engines.check()
    # A directory and a file swap names.
    os.rename(engines.root / "pkg4", engines.root / "tmp")
    os.rename(engines.root / "README.md", engines.root / "pkg4")
    os.rename(engines.root / "tmp", engines.root / "README.md")
    engines.check()


def test_a_directory_replaced_by_another_of_the_same_name(engines):
    _populate(engines.root, dirs=3, files=3)
    engines.check(expect="full")
    write(engines.root / "staging/sub9/other.txt", "the replacement's content\n")
    engines.check()
    shutil.rmtree(engines.root / "pkg0")
    os.rename(engines.root / "staging", engines.root / "pkg0")
    engines.check()
    os.rename(engines.root / "pkg1", engines.root / "swap")
    os.rename(engines.root / "pkg2", engines.root / "pkg1")
    os.rename(engines.root / "swap", engines.root / "pkg2")
    engines.check()


def test_rename_storm(engines):
    _populate(engines.root, dirs=8, files=10)
    engines.check(expect="full")
    rng = random.Random(7)
    for round_ in range(6):
        for step in range(150):
            entries = [p for p in engines.root.rglob("*")]
            source = rng.choice(entries)
            if not source.exists():
                continue
            parents = [p for p in entries if p.is_dir() and p.exists() and source not in (p, *p.parents)]
            target_dir = rng.choice(parents + [engines.root])
            target = target_dir / f"r{round_}-{step}{source.suffix}"
            os.rename(source, target)
            if rng.random() < 0.2 and target.is_file():
                write(target, f"rewritten in round {round_} step {step}\n")
        engines.check()


def test_gitignore_edits_at_the_root_and_deeper(engines):
    _populate(engines.root)
    write(engines.root / "pkg0/build/out.o", "object\n")
    write(engines.root / ".gitignore", "build/\n")
    engines.check(expect="full")
    write(engines.root / ".gitignore", "build/\n*.md\n")
    engines.check(expect="full")
    write(engines.root / "pkg1/.gitignore", "sub1/\n")
    write(engines.root / "pkg1/sub1/ignored.txt", "under an ignored directory\n")
    engines.check()
    write(engines.root / "pkg1/.gitignore", "file*.txt\n!file1.txt\n")
    engines.check()
    (engines.root / "pkg1/.gitignore").unlink()
    engines.check()
    write(engines.root / "fresh/.gitignore", "*.tmp\n")
    write(engines.root / "fresh/a.tmp", "ignored\n")
    write(engines.root / "fresh/a.txt", "kept\n")
    engines.check()
    (engines.root / ".gitignore").unlink()
    engines.check(expect="full")


def test_ignored_directories_are_not_watched_and_changes_there_are_ignored(engines):
    write(engines.root / ".gitignore", "node_modules/\n")
    write(engines.root / "node_modules/dep/index.js", "dep\n")
    write(engines.root / "src/main.py", "main\n")
    engines.check(expect="full")
    watched_dirs = set(engines.watcher._journals[str(engines.root)].watches)
    assert "node_modules" not in watched_dirs and "src" in watched_dirs
    write(engines.root / "node_modules/dep/index.js", "changed\n")
    write(engines.root / "node_modules/new/x.js", "new\n")
    engines.check()


def test_capture_settings_change_scans_everything(engines):
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    engines.patterns = ["*.md"]
    engines.check(expect="full")
    engines.check()


def test_queue_overflow_is_detected_and_falls_back_to_a_full_scan(engines):
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    overflows = engines.watcher.overflows
    with engines.watcher.hold_events():
        # Each rewrite is a MODIFY and a CLOSE_WRITE; alternating files keeps them from merging.
        for i in range(limit // 2 + 100):
            write(engines.root / f"pkg{i % 2}/churn.txt", f"{i}\n")
        write(engines.root / "pkg0/last.txt", "written just before the queue was drained\n")
    engines.check(expect="full")
    assert engines.watcher.overflows > overflows
    engines.check()


def test_files_changed_during_checkpoints_are_seen_by_the_next_one(engines):
    _populate(engines.root, dirs=4, files=4)
    engines.check(expect="full")
    stop = threading.Event()

    def churn() -> None:
        rng = random.Random(3)
        n = 0
        while not stop.is_set():
            n += 1
            directory = engines.root / f"pkg{rng.randrange(4)}"
            action = rng.random()
            if action < 0.5:
                write(directory / f"sub{rng.randrange(3)}/w{rng.randrange(20)}.txt", f"{n}\n")
            elif action < 0.7:
                victims = list(directory.rglob("w*.txt"))
                if victims:
                    rng.choice(victims).unlink(missing_ok=True)
            elif action < 0.85:
                (directory / f"d{n}").mkdir()
                write(directory / f"d{n}/x.txt", f"{n}\n")
            else:
                dirs = [p for p in directory.glob("d*") if p.is_dir()]
                if dirs:
                    shutil.rmtree(rng.choice(dirs), ignore_errors=True)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(15):
            engines.capture(engines.watched)
    finally:
        stop.set()
        writer.join()
    engines.check(expect="any")
    engines.check()


def test_an_aborted_batch_hands_its_changes_back(engines):
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    write(engines.root / "pkg0/sub0/file0.txt", "changed, then the batch is aborted\n")
    batch = engines.store.batch()
    engines.watched.capture(_workspace(engines), [], [], engines.max_size, batch)
    batch.abort()
    engines.check()


def test_a_replaced_workspace_root_is_scanned_again(engines, tmp_path):
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    os.rename(engines.root, tmp_path / "old-root")
    engines.root.mkdir()
    write(engines.root / "other.txt", "a different directory at the same path\n")
    engines.check(expect="full")
    engines.check()


def test_a_workspace_whose_parent_is_replaced_is_scanned_again(engines, tmp_path):
    engines.root = tmp_path / "parent" / "ws"
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    os.rename(tmp_path / "parent", tmp_path / "parent-old")
    write(engines.root / "only-here.txt", "the new directory behind the same path\n")
    engines.check(expect="full")
    write(engines.root / "only-here.txt", "edited\n")
    engines.check()


def test_running_out_of_watches_falls_back_to_full_scans(engines, tmp_path):
    from checkpointd.core.capture.capturer import Capturer
    from checkpointd.core.capture.snapshot import Snapshotter
    from checkpointd.core.capture.stat_index import StatIndex
    from checkpointd.core.capture.watcher import Watcher

    _populate(engines.root)
    small = Watcher(watch_budget=3)
    try:
        engines.watched = Capturer(Snapshotter(engines.store, engines.trees, StatIndex()), engines.trees, small)
        engines.check(expect="full")
        write(engines.root / "pkg0/sub0/file0.txt", "changed\n")
        engines.check(expect="unwatched")
        assert small.watch_count() <= 3
    finally:
        small.close()


def _workspace(engines):
    from checkpointd.core.workspace.workspace import Workspace

    return Workspace(str(engines.root))


def test_a_capture_handles_every_queued_event_itself_when_the_reader_thread_never_runs(engines):
    """The sync reads the kernel queue in the capturing thread: a change made just before a
    capture is in it even if the reader thread is gone."""
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    engines.watcher.stop_reader()
    for round_number in range(3):
        write(engines.root / "pkg0/sub0/file0.txt", f"changed with no reader, round {round_number}\n")
        (engines.root / f"pkg1/new{round_number}.txt").write_text("created with no reader\n")
        engines.check(expect="incremental")


def _overwrite(path: Path, text: str) -> None:
    """Writes in place (same inode): every name of the file shows the new content."""
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()


def test_files_with_several_names_are_examined_by_every_capture(engines, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _populate(engines.root, dirs=2, files=2)
    os.link(engines.root / "pkg0/sub0/file0.txt", outside / "alias")
    os.link(engines.root / "pkg1/sub1/file1.txt", engines.root / "pkg0/alias")
    engines.check(expect="full")
    _overwrite(outside / "alias", "written through a name outside the workspace\n")
    engines.check()
    _overwrite(engines.root / "pkg0/alias", "written through the other name inside\n")
    engines.check()
    os.chmod(outside / "alias", 0o600)
    engines.check()
    # A linked file renamed keeps its inode: nothing new to look for.
    os.rename(engines.root / "pkg0/alias", engines.root / "pkg0/renamed")
    engines.check()
    # A file with one name gains a second inside: its first name is not known as linked yet.
    os.link(engines.root / "README.md", engines.root / "pkg1/readme-alias")
    engines.check(expect="full")
    _overwrite(engines.root / "pkg1/readme-alias", "written through the new name\n")
    engines.check()
    for name in ("pkg1/readme-alias", "pkg0/renamed"):
        (engines.root / name).unlink()
    (outside / "alias").unlink()
    engines.check()
    # Files that had other names stay examined while their paths hold the same files (a writer may
    # hold a removed name open); once replaced by new files, they are single files like any other.
    once_linked = {"README.md", "pkg0/sub0/file0.txt", "pkg1/sub1/file1.txt"}
    assert set(engines.watched._roots[str(engines.root)].base.linked) == once_linked
    for name in sorted(once_linked):
        (tmp_path / "new").write_text(f"a new file at {name}\n")
        os.replace(tmp_path / "new", engines.root / name)
    engines.check()
    assert engines.watched._roots[str(engines.root)].base.linked == {}


def test_a_file_that_lost_its_other_name_stays_examined_after_a_full_scan(engines, tmp_path):
    """A full scan meets the file with one name, but it had another, which a writer still holds
    open: the scan keeps it among the files every capture examines, so the writer's write is seen."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _populate(engines.root, dirs=1, files=1)
    os.link(engines.root / "pkg0/sub0/file0.txt", outside / "alias")
    engines.check(expect="full")
    with open(outside / "alias", "r+") as writer:
        (outside / "alias").unlink()
        write(engines.root / ".gitignore", "*.log\n")  # the root's rules changed: a full scan
        engines.check(expect="full")
        writer.write("written through a name removed since, by a writer that kept it open\n")
    engines.check()


def test_a_capture_no_checkpoint_records_is_never_built_on(engines):
    """A live diff's capture, or a create whose row failed: garbage collection keeps only what
    rows reach, so the next capture must not reuse what only such a capture had."""
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    write(engines.root / "pkg0/sub0/file0.txt", "captured, committed, in no checkpoint\n")
    with engines.store.batch() as batch:
        engines.watched.capture(_workspace(engines), [], [], engines.max_size, batch)
    engines.check(expect="full")
    engines.check()


def test_any_deletion_from_the_store_makes_the_next_capture_scan_fully(engines):
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    engines.check()
    with engines.store.batch() as batch:
        stray = batch.put_bytes(b"an object no capture references\n")
    with engines.store.collecting():
        engines.store.delete(stray)
    engines.check(expect="full")
    engines.check()


def test_a_file_of_exactly_the_size_limit_is_captured(engines):
    _populate(engines.root, dirs=1, files=1)
    engines.max_size = 100
    engines.check(expect="full")
    write(engines.root / "pkg0/limit.bin", b"x" * 100)
    write(engines.root / "pkg0/over.bin", b"x" * 101)
    result = engines.check()
    assert {s.path for s in result.skipped} == {"pkg0/over.bin"}


def test_a_linked_file_left_alone_by_one_capture_is_still_examined_by_the_next(engines, tmp_path):
    """A capture in which a file with several names did not change must keep it among the
    files every capture re-examines: a write through its name outside comes later."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _populate(engines.root, dirs=2, files=2)
    os.link(engines.root / "pkg0/sub0/file0.txt", outside / "alias")
    an_hour_ago = time.time() - 3600  # not just written: the stat index vouches for it
    for path in engines.root.rglob("*.txt"):
        os.utime(path, (an_hour_ago, an_hour_ago))
    engines.check(expect="full")
    write(engines.root / "pkg1/sub1/file1.txt", "an unrelated edit\n")
    engines.check()
    _overwrite(outside / "alias", "written through the name outside, after a capture that left it alone\n")
    engines.check()


def test_a_directory_whose_write_bits_changed_is_not_scanned_again(engines, monkeypatch):
    """Its read and search bits decide what a capture can see in it (see
    test_capture_storms_attacked.py); its write bits do not."""
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    scanned = []
    real_scan = engines.watched.snapshotter.scan

    def scan(dir_fd, prefix, *rest):
        scanned.append(prefix)
        return real_scan(dir_fd, prefix, *rest)

    monkeypatch.setattr(engines.watched.snapshotter, "scan", scan)
    os.chmod(engines.root / "pkg0", 0o775)
    engines.check()
    assert scanned == []


def test_unchanged_files_of_a_directory_scanned_again_are_not_read_again(engines, tmp_path, monkeypatch):
    """A directory moved out and back is scanned whole; the stat index spares the reads of its
    unchanged files, then and the next time it is scanned."""
    # Files just written are in the index's racy window (their ctime cannot be dated back): that
    # window is the index's tests' subject, not this one's.
    monkeypatch.setattr(stat_index_module, "RACY_WINDOW_NS", 0)
    _populate(engines.root, dirs=2, files=3)
    engines.check(expect="full")
    read: list[str] = []
    real = snapshot_module._read_files

    def spy(dir_fd, names, batch, *rest):
        read.extend(name for name, _similar in names)
        return real(dir_fd, names, batch, *rest)

    for _round in range(2):
        os.rename(engines.root / "pkg0", tmp_path / "away")
        os.rename(tmp_path / "away", engines.root / "pkg0")
        with monkeypatch.context() as patch:
            patch.setattr(snapshot_module, "_read_files", spy)
            engines.capture(engines.watched)
        assert read == []
        engines.check()


def test_a_file_that_cannot_be_read_is_skipped_as_unreadable_by_an_incremental_capture(engines, monkeypatch):
    """The tests run as root, which reads every file: an unreadable one is simulated."""
    _populate(engines.root, dirs=1, files=2)
    engines.check(expect="full")
    write(engines.root / "pkg0/sub0/file0.txt", "cannot be read any more\n")
    real = capturer_module.read_file
    monkeypatch.setattr(capturer_module, "read_file",
                        lambda dir_fd, name, *rest: None if name == "file0.txt" else real(dir_fd, name, *rest))
    before = dict(engines.watched.counts)
    result = engines.capture(engines.watched)
    assert engines.watched.counts[CaptureMode.INCREMENTAL] == before[CaptureMode.INCREMENTAL] + 1
    assert [(s.path, s.reason) for s in result.skipped] == [("pkg0/sub0/file0.txt", SKIP_UNREADABLE)]


def test_a_file_the_incremental_capture_cannot_examine_leaves_it_to_a_full_scan(engines, monkeypatch):
    """An error other than "gone" while a dirty path is examined (an I/O error, simulated) does
    not fail the checkpoint: the capture scans fully instead."""
    _populate(engines.root, dirs=1, files=2)
    engines.check(expect="full")
    write(engines.root / "pkg0/sub0/file0.txt", "the disk failed while this was read\n")
    real = capturer_module.read_file

    def failing(dir_fd, name, *rest):
        if name == "file0.txt":
            raise OSError(errno.EIO, "Input/output error")
        return real(dir_fd, name, *rest)

    monkeypatch.setattr(capturer_module, "read_file", failing)
    engines.check(expect="full")


def test_a_symlink_replaced_by_a_file_while_it_is_read_is_looked_at_again(engines, monkeypatch):
    """An entry that changes type between two looks at it (here: between lstat and readlink,
    the race made deterministic) is examined again, not left to a full scan."""
    _populate(engines.root, dirs=1, files=1)
    engines.check(expect="full")
    link = engines.root / "pkg0/link"
    os.symlink("../README.md", link)
    real_readlink = os.readlink

    def replaced_meanwhile(name, *, dir_fd=None):
        if name == "link" and link.is_symlink():
            link.unlink()
            link.write_text("a regular file now\n")
        return real_readlink(name, dir_fd=dir_fd)  # EINVAL for a regular file

    patched_os = types.ModuleType("os")
    patched_os.__dict__.update(os.__dict__)
    patched_os.readlink = replaced_meanwhile
    monkeypatch.setattr(capturer_module, "os", patched_os)
    engines.check()


def test_a_file_that_gains_a_name_while_it_is_read_is_known_as_linked(engines, tmp_path, monkeypatch):
    """A file linked elsewhere between its lstat and its read (the race made deterministic):
    the capture must learn it has several names, so that a write through the other one is seen."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _populate(engines.root, dirs=1, files=2)
    engines.check(expect="full")
    target = engines.root / "pkg0/sub0/file0.txt"
    write(target, "edited, then linked while it was read\n")
    real = capturer_module.read_file

    def linked_meanwhile(dir_fd, name, *rest):
        if name == "file0.txt" and not (outside / "alias").exists():
            os.link(target, outside / "alias")
        return real(dir_fd, name, *rest)

    with monkeypatch.context() as patch:
        patch.setattr(capturer_module, "read_file", linked_meanwhile)
        engines.check(expect="full")
    _overwrite(outside / "alias", "written through the name it gained\n")
    engines.check()


def test_files_skipped_inside_a_new_directory_are_reported(engines):
    _populate(engines.root, dirs=1, files=1)
    engines.max_size = 100
    engines.check(expect="full")
    write(engines.root / "added/inner/big.bin", b"x" * 500)
    write(engines.root / "added/small.txt", "small\n")
    result = engines.check()
    assert [(s.path, s.reason) for s in result.skipped] == [("added/inner/big.bin", SKIP_TOO_LARGE)]


def test_an_edit_at_the_deepest_level_a_capture_enters_is_seen(engines):
    """Directories are entered down to MAX_DIR_DEPTH slashes: a file in the deepest one entered
    is captured, and so is an edit to it."""
    _populate(engines.root, dirs=1, files=1)
    deepest = engines.root.joinpath(*["d"] * snapshot_module.MAX_DIR_DEPTH)
    write(deepest / "leaf.txt", "at the deepest level\n")
    engines.check(expect="full")
    write(deepest / "leaf.txt", "edited at the deepest level\n")
    result = engines.check()
    assert result.file_count == 3


def test_a_new_directory_replaced_by_a_symlink_while_it_is_opened_is_looked_at_again(engines, tmp_path,
                                                                                       monkeypatch):
    """The race of the readlink test above, for a directory: replaced by a symlink between its
    lstat and its open (made deterministic)."""
    _populate(engines.root, dirs=1, files=1)
    engines.check(expect="full")
    added = engines.root / "added"
    write(added / "inner.txt", "in a directory about to be replaced\n")
    real_open = os.open

    def replaced_meanwhile(name, flags, *rest, dir_fd=None, **kwargs):
        if name == "added" and not added.is_symlink():
            os.rename(added, tmp_path / "moved-away")
            os.symlink("pkg0", added)
        return real_open(name, flags, *rest, dir_fd=dir_fd, **kwargs)  # ELOOP: a symlink now

    patched_os = types.ModuleType("os")
    patched_os.__dict__.update(os.__dict__)
    patched_os.open = replaced_meanwhile
    monkeypatch.setattr(capturer_module, "os", patched_os)
    engines.check()


def test_a_file_read_by_an_incremental_capture_is_not_read_again_while_unchanged(engines, monkeypatch):
    _populate(engines.root, dirs=1, files=2)
    engines.check(expect="full")
    path = engines.root / "pkg0/sub0/file0.txt"
    write(path, "edited once\n")
    monkeypatch.setattr(stat_index_module, "RACY_WINDOW_NS", 0)  # the index's tests' subject, not this one's
    engines.check()
    read: list[str] = []
    real = capturer_module.read_file

    def spy(dir_fd, name, *rest):
        read.append(name)
        return real(dir_fd, name, *rest)

    monkeypatch.setattr(capturer_module, "read_file", spy)
    open(path, "ab").close()  # reported (a close after writing), nothing changed
    engines.check()
    assert read == []


def test_files_skipped_in_a_directory_whose_mode_changed_are_still_reported(engines):
    _populate(engines.root, dirs=1, files=1)
    engines.max_size = 100
    write(engines.root / "pkg0/big.bin", b"x" * 500)
    engines.check(expect="full")
    os.chmod(engines.root / "pkg0", 0o750)
    result = engines.check()
    assert [(s.path, s.reason) for s in result.skipped] == [("pkg0/big.bin", SKIP_TOO_LARGE)]


def test_a_file_with_several_names_that_is_too_large_stays_skipped(engines, tmp_path):
    """Never read, it has no stat index entry: every capture examines it again all the same."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _populate(engines.root, dirs=1, files=1)
    engines.max_size = 100
    write(engines.root / "pkg0/big.bin", b"x" * 500)
    os.link(engines.root / "pkg0/big.bin", outside / "alias")
    engines.check(expect="full")
    write(engines.root / "README.md", "an unrelated edit\n")
    result = engines.check()
    assert [(s.path, s.reason) for s in result.skipped] == [("pkg0/big.bin", SKIP_TOO_LARGE)]
    _overwrite(outside / "alias", "small now, through its other name\n")
    result = engines.check()
    assert result.skipped == []


def test_a_quieted_reader_lets_events_gather_and_captures_still_see_them(engines, monkeypatch):
    """While a rollback writes (``Watcher.quieted``), the reader thread leaves the events queued;
    a capture syncs them itself and misses nothing, and the reader reads again once it ends."""
    monkeypatch.setattr(watcher_module, "QUIET_SECONDS", 3600.0)
    _populate(engines.root, dirs=2, files=2)
    engines.check(expect="full")
    engines.check()
    handled_by: list[str] = []
    read_queue = engines.watcher._read_queue

    def recording() -> None:
        handled_by.append(threading.current_thread().name)
        read_queue()

    monkeypatch.setattr(engines.watcher, "_read_queue", recording)
    with engines.watcher.quieted():
        write(engines.root / "pkg0/quiet.txt", "written while a rollback writes\n")
        # Unquieted, the reader reads this event within milliseconds; quieted, it leaves it queued.
        deadline = time.monotonic() + 0.5
        while "watcher" not in handled_by and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "watcher" not in handled_by
        engines.check()
    write(engines.root / "pkg1/after.txt", "written after the rollback\n")
    wait_until(lambda: "watcher" in handled_by, "the reader to read again")
    engines.check()


def test_closing_a_watcher_whose_reader_waits_quieted_stops_the_reader(tmp_path, monkeypatch):
    monkeypatch.setattr(watcher_module, "QUIET_SECONDS", 3600.0)
    watcher = watcher_module.Watcher()
    root_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        journal = watcher.journal(str(tmp_path), root_fd)
        assert watcher.watch(journal, "", root_fd)
        with watcher.quieted():
            write(tmp_path / "file.txt", "an event for the reader\n")
            wait_until(lambda: watcher._quiet_changed._waiters, "the reader to wait")
            watcher.close()
            assert not watcher._thread.is_alive()
    finally:
        os.close(root_fd)
