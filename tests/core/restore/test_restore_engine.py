"""Rollback on the engine itself (real SQLite, a real content store, real files; no server): the
README's promises on restore, checked in-process so that `make mutants` can run them per mutant of
`core/restore/restorer.py` in seconds.

- Restore is exact: content, symlinks, file and directory permission bits, empty directories,
  kinds changed both ways.
- A write made while a rollback runs is never overwritten or deleted: the rollback stops with
  ROLLBACK_CONFLICT, takes back what it changed and leaves the write on disk. The write is made
  from the restore's own fault point (`restore.change`, reached before each path is changed), the
  in-process twin of the server-level races in tests/hardening/test_rollback_races.py.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ulid import ULID

from checkpointd.core.config.registry import MAX_FILE_SIZE_BYTES, ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings, RollbackRequest
from checkpointd.core.kernel.errors import FailedPrecondition, Reason
from checkpointd.core.kernel.faults import Point
from checkpointd.core.metadata.db import Database
from checkpointd.core.restore import restorer as restore_module
from checkpointd.core.store.content_store import ContentStore


class Plan:
    def __init__(self, engine: Checkpoints, config: ConfigStore, root: Path) -> None:
        self.engine = engine
        self.config = config
        self.root = root
        self.plan_id = str(ULID())

    def checkpoint(self) -> str:
        request = CreateRequest(plan_id=self.plan_id, workspace_root=str(self.root))
        return self.engine.create(request).row.checkpoint_id

    def rollback(self, checkpoint_id: str, **fields):
        return self.engine.rollback(RollbackRequest(self.plan_id, checkpoint_id, **fields))


@pytest.fixture
def plan(tmp_path: Path) -> Iterator[Plan]:
    allowed = tmp_path / "workspaces"
    root = allowed / "ws"
    root.mkdir(parents=True)
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    store = ContentStore(tmp_path / "store")
    config = ConfigStore(db)
    engine = Checkpoints(db, store, config, EngineSettings(tmp_path / "data", (str(allowed),), watcher=False))
    try:
        yield Plan(engine, config, root)
    finally:
        engine.close()
        store.close()
        db.dispose()


def _listing(root: Path) -> dict[str, tuple]:
    """Every path under root: kind, permission bits, and content or link target."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            st = path.lstat()
            relative = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                found[relative] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[relative] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                found[relative] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


def test_restore_is_exact_across_kinds_modes_links_and_empty_directories(plan: Plan) -> None:
    root = plan.root
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("print('v1')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "secret").write_text("k")
    (root / "secret").chmod(0o600)
    (root / "empty").mkdir()
    (root / "private").mkdir(mode=0o700)
    (root / "private").chmod(0o750)
    (root / "private" / "x").write_text("x")
    (root / "link").symlink_to("src/pkg/mod.py")
    (root / "was_file").write_text("file then")
    (root / "was_dir" / "inner").mkdir(parents=True)
    (root / "was_dir" / "inner" / "f").write_text("dir then")
    before = _listing(root)
    target = plan.checkpoint()

    (root / "src" / "pkg" / "mod.py").write_text("print('v2, longer')\n")
    (root / "run.sh").chmod(0o644)
    (root / "secret").unlink()
    (root / "empty").rmdir()
    (root / "private").chmod(0o755)
    (root / "link").unlink()
    (root / "link").symlink_to("run.sh")
    (root / "was_file").unlink()
    (root / "was_file").mkdir()
    (root / "was_file" / "new").write_text("new")
    (root / "was_dir" / "inner" / "f").unlink()
    (root / "was_dir" / "inner").rmdir()
    (root / "was_dir").rmdir()
    (root / "was_dir").write_text("a file now")
    (root / "added" / "deep").mkdir(parents=True)
    (root / "added" / "deep" / "n.txt").write_text("added")
    changed = _listing(root)

    preview = plan.rollback(target, dry_run=True)
    assert preview.safety is None and _listing(root) == changed
    assert {c.path for c in preview.changes} >= {"src/pkg/mod.py", "secret", "empty", "link", "was_file",
                                                  "was_dir", "added"}
    result = plan.rollback(target)

    assert _listing(root) == before
    assert result.safety is not None
    # The safety checkpoint holds the workspace as it was: rolling back to it brings that back.
    plan.rollback(result.safety.row.checkpoint_id)
    assert _listing(root) == changed


def test_a_rollback_keeps_what_the_target_skipped_or_ignored(plan: Plan) -> None:
    root = plan.root
    plan.config.set(MAX_FILE_SIZE_BYTES, 100, plan_id=plan.plan_id)
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "kept.txt").write_text("kept")
    (root / "big.bin").write_bytes(b"x" * 500)
    (root / "app.log").write_text("log")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_text("obj")
    target = plan.checkpoint()
    (root / "new.txt").write_text("new")
    (root / "new.log").write_text("ignored, never captured")
    (root / "big.bin").write_bytes(b"y" * 600)

    plan.rollback(target)

    assert not (root / "new.txt").exists()
    assert (root / "big.bin").read_bytes() == b"y" * 600  # skipped then: not the target's to change
    assert (root / "new.log").exists() and (root / "app.log").exists()
    assert (root / "build" / "out.o").read_text() == "obj"
    assert (root / "kept.txt").read_text() == "kept"


def test_a_directory_that_must_become_a_file_but_holds_unaccounted_files_changes_nothing(plan: Plan) -> None:
    root = plan.root
    (root / ".gitignore").write_text("*.tmp\n")
    (root / "thing").write_text("a file in the target")
    target = plan.checkpoint()
    (root / "thing").unlink()
    (root / "thing").mkdir()
    (root / "thing" / "scratch.tmp").write_text("ignored, so not the target's")
    (root / "other.txt").write_text("other")
    changed = _listing(root)

    with pytest.raises(FailedPrecondition) as conflict:
        plan.rollback(target)

    assert conflict.value.reason is Reason.ROLLBACK_CONFLICT
    assert "thing" in conflict.value.message
    assert _listing(root) == changed


def test_a_scoped_rollback_restores_its_paths_and_their_parents_only(plan: Plan) -> None:
    root = plan.root
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "c.txt").write_text("c1")
    (root / "a" / "sibling.txt").write_text("s1")
    (root / "top.txt").write_text("t1")
    target = plan.checkpoint()
    (root / "a" / "sibling.txt").write_text("s2")
    (root / "top.txt").write_text("t2")
    (root / "a" / "b" / "c.txt").unlink()
    (root / "a" / "b").rmdir()
    (root / "a" / "b").write_text("a file where the directory was")

    plan.rollback(target, paths=("a/b/c.txt",))

    assert (root / "a" / "b" / "c.txt").read_text() == "c1"
    assert (root / "a" / "sibling.txt").read_text() == "s2"
    assert (root / "top.txt").read_text() == "t2"


RACES: dict[str, Callable[[Path], None]] = {}


def _race(name: str):
    def register(function: Callable[[Path], None]) -> Callable[[Path], None]:
        RACES[name] = function
        return function
    return register


@_race("a file the rollback replaces is rewritten with other content")
def _rewrite(root: Path) -> None:
    (root / "edited.txt").write_text("written during the rollback, longer")


@_race("a file the rollback replaces is rewritten, same size and mtime")
def _same_size_same_mtime(root: Path) -> None:
    path = root / "edited.txt"
    st = path.stat()
    path.write_text("EDITED".ljust(st.st_size, "!")[:st.st_size])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@_race("a file the rollback deletes is rewritten")
def _rewrite_added(root: Path) -> None:
    (root / "added.txt").write_text("written during the rollback")


@_race("a path the rollback creates is created first")
def _create_deleted(root: Path) -> None:
    (root / "deleted.txt").write_text("written during the rollback")


@_race("a file the rollback replaces has its permissions changed")
def _chmod(root: Path) -> None:
    (root / "edited.txt").chmod(0o600)


@_race("a link the rollback replaces is pointed elsewhere")
def _retarget(root: Path) -> None:
    (root / "link").unlink()
    (root / "link").symlink_to("written-during-the-rollback")


@_race("a file the rollback replaces becomes a directory")
def _file_to_dir(root: Path) -> None:
    (root / "edited.txt").unlink()
    (root / "edited.txt").mkdir()
    (root / "edited.txt" / "inside").write_text("written during the rollback")


@_race("a file the rollback replaces is deleted")
def _delete_edited(root: Path) -> None:
    (root / "edited.txt").unlink()


@_race("a file the rollback replaces becomes a link")
def _file_to_link(root: Path) -> None:
    (root / "edited.txt").unlink()
    (root / "edited.txt").symlink_to("written-during-the-rollback")


@pytest.mark.parametrize("race", list(RACES), ids=list(RACES))
def test_a_write_made_while_a_rollback_runs_is_never_lost(plan: Plan, monkeypatch, race: str) -> None:
    root = plan.root
    (root / "edited.txt").write_text("v1")
    (root / "deleted.txt").write_text("v1")
    (root / "link").symlink_to("edited.txt")
    target = plan.checkpoint()
    (root / "edited.txt").write_text("v2 before the rollback")
    (root / "deleted.txt").unlink()
    (root / "added.txt").write_text("added before the rollback")
    (root / "link").unlink()
    (root / "link").symlink_to("deleted.txt")
    fired = []

    def racing_write(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and not fired:
            fired.append(point)
            RACES[race](root)

    monkeypatch.setattr(restore_module, "crash_point", racing_write)
    after_race: dict[str, tuple] = {}
    with pytest.raises(FailedPrecondition) as conflict:
        try:
            plan.rollback(target)
        finally:
            after_race.update(_listing(root))
    assert fired
    assert conflict.value.reason is Reason.ROLLBACK_CONFLICT
    if "becomes a directory" not in race:  # that one is caught as a path swapped under the rollback
        assert "changed after the rollback's safety checkpoint was taken" in conflict.value.message
    if "becomes a link" in race:
        assert "(became a symlink after the rollback's safety checkpoint)" in conflict.value.message
    # The racing write is on disk, and the rest is as it was before the rollback started.
    expected = _listing_after(root, race)
    assert after_race == expected


def _listing_after(root: Path, race: str) -> dict[str, tuple]:
    """What the workspace holds once the rollback has been undone: the state before it, plus the race."""
    scratch = root.parent / f"expected-{ULID()}"
    scratch.mkdir()
    (scratch / "edited.txt").write_text("v2 before the rollback")
    (scratch / "added.txt").write_text("added before the rollback")
    (scratch / "link").symlink_to("deleted.txt")
    for path in root.iterdir():  # keep the permission bits the workspace's files were created with
        if (scratch / path.name).exists() and not path.is_symlink() and path.is_file():
            (scratch / path.name).chmod(stat.S_IMODE((root / path.name).stat().st_mode))
    RACES[race](scratch)
    return _listing(scratch)


def test_a_file_written_into_a_directory_the_rollback_removes_keeps_that_directory(plan: Plan, monkeypatch) -> None:
    root = plan.root
    (root / "kept.txt").write_text("v1")
    target = plan.checkpoint()
    (root / "newdir").mkdir()
    (root / "newdir" / "a.txt").write_text("added after the target")
    (root / "kept.txt").write_text("v2")

    def racing_write(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and not (root / "newdir" / "racing.txt").exists():
            (root / "newdir" / "racing.txt").write_text("written during the rollback")

    monkeypatch.setattr(restore_module, "crash_point", racing_write)
    plan.rollback(target)

    # Nothing was lost: the rollback removed what it accounted for and left the directory holding the write.
    assert set(_listing(root)) == {"kept.txt", "newdir", "newdir/racing.txt"}
    assert (root / "kept.txt").read_text() == "v1"
    assert (root / "newdir" / "racing.txt").read_text() == "written during the rollback"


class _Killed(BaseException):
    """Stands for the process dying at a fault point: nothing in the engine handles it."""


def test_an_interrupted_rollback_that_cannot_be_finished_keeps_every_checkpoint_of_its_plan(
        plan: Plan, monkeypatch) -> None:
    """A rollback interrupted mid-way leaves its journal entry; until whoever takes the plan next
    finishes it, deleting its target or its safety checkpoint (by DeleteCheckpoint, DeleteCheckpoints
    or retention) would leave the workspace half-applied with no record of what it was. Such a
    deletion is refused while the rollback cannot be finished, and goes ahead once it was."""
    from checkpointd.core.kernel.errors import RollbackUnfinished

    for name in ("a", "b", "c"):
        (plan.root / name).write_text(f"target {name}")
    target = plan.checkpoint()
    for name in ("a", "b", "c"):
        (plan.root / name).write_text(f"later {name}")
    newest = plan.checkpoint()
    expected = _listing(plan.root)
    calls = []

    def interrupted(point: Point) -> None:
        calls.append(point)
        if point is Point.RESTORE_CHANGE and len(calls) == 2:
            raise _Killed  # the rollback dies after changing one path

    monkeypatch.setattr(restore_module, "crash_point", interrupted)
    with pytest.raises(_Killed):
        plan.rollback(target)

    def unwritable(point: Point) -> None:
        raise OSError(5, "Input/output error")  # the workspace cannot be written for now

    monkeypatch.setattr(restore_module, "crash_point", unwritable)
    for deletion in (lambda: plan.engine.delete(target), lambda: plan.engine.delete(newest),
                     lambda: plan.engine.delete_matching(plan.plan_id, "")):
        with pytest.raises(RollbackUnfinished) as refused:
            deletion()
        assert refused.value.reason is Reason.ROLLBACK_CONFLICT
    assert plan.engine.count(plan.plan_id) >= 3  # target, newest and the rollback's safety checkpoint

    monkeypatch.undo()
    plan.engine.delete(newest)  # the rollback is finished first, then the deletion goes ahead
    assert _listing(plan.root) == {name: ("file", value[1], f"target {name}".encode())
                                   for name, value in expected.items()}


def test_a_directory_that_fills_up_before_it_becomes_a_file_stops_the_rollback(plan: Plan, monkeypatch) -> None:
    """The plan saw a directory the target turns into a file holding only what the target accounts
    for; a file written into it while the rollback runs keeps it a directory: the rollback stops
    there (it is no longer empty), takes back what it changed, and the write stays."""
    root = plan.root
    (root / "thing").write_text("a file in the target")
    target = plan.checkpoint()
    (root / "thing").unlink()
    (root / "thing").mkdir()
    (root / "thing" / "a.txt").write_text("added after the target")

    def racing_write(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and not (root / "thing" / "racing.txt").exists():
            (root / "thing" / "racing.txt").write_text("written during the rollback")

    changed = _listing(root)
    monkeypatch.setattr(restore_module, "crash_point", racing_write)
    with pytest.raises(FailedPrecondition) as conflict:
        plan.rollback(target)

    assert conflict.value.reason is Reason.ROLLBACK_CONFLICT
    assert "stopped at 'thing' (the directory is no longer empty)" in conflict.value.message
    after = _listing(root)
    assert after.pop("thing/racing.txt")[2] == b"written during the rollback"
    assert after == changed


@pytest.mark.parametrize("retargeted", [False, True], ids=["link left alone", "link pointed elsewhere"])
def test_the_undo_takes_back_a_link_only_while_it_points_where_the_rollback_put_it(
        plan: Plan, monkeypatch, retargeted: bool) -> None:
    """A rollback writes `a_link`, then stops at `b.txt` (rewritten since the safety checkpoint). Its
    undo puts back what `a_link` held before the rollback, unless something pointed it elsewhere
    meanwhile: that is a write made during the rollback, and it is never lost."""
    root = plan.root
    (root / "a_link").symlink_to("target-then")
    (root / "b.txt").write_text("b then")
    target = plan.checkpoint()
    (root / "a_link").unlink()
    (root / "a_link").symlink_to("before-the-rollback")
    (root / "b.txt").write_text("b before the rollback")
    calls: list[Point] = []

    def racing_writes(point: Point) -> None:
        if point is not Point.RESTORE_CHANGE:
            return
        calls.append(point)
        if len(calls) == 2:  # a_link is written; b.txt is next
            assert os.readlink(root / "a_link") == "target-then"
            if retargeted:
                (root / "a_link").unlink()
                (root / "a_link").symlink_to("written-during-the-rollback")
            (root / "b.txt").write_text("b written during the rollback")

    monkeypatch.setattr(restore_module, "crash_point", racing_writes)
    with pytest.raises(FailedPrecondition) as conflict:
        plan.rollback(target)

    assert conflict.value.reason is Reason.ROLLBACK_CONFLICT
    assert "stopped at 'b.txt'" in conflict.value.message
    assert os.readlink(root / "a_link") == ("written-during-the-rollback" if retargeted else "before-the-rollback")
    assert (root / "b.txt").read_text() == "b written during the rollback"


def test_a_fifo_swapped_in_for_a_file_while_the_rollback_hashes_it_does_not_hang_it(
        plan: Plan, monkeypatch) -> None:
    """A file the stat index cannot vouch for is hashed right before it is replaced. If a FIFO takes
    its place between the rollback's lstat and its open, the open must not wait for a writer that
    never comes: the rollback stops with ROLLBACK_CONFLICT and leaves the FIFO."""
    import threading

    root = plan.root
    edited = root / "edited.txt"
    edited.write_text("v1")
    target = plan.checkpoint()
    edited.write_text("v2")
    future = edited.stat().st_mtime_ns + 3600 * 10**9  # within any racy window: the file is hashed
    os.utime(edited, ns=(future, future))
    swapped: list[bool] = []
    real_file_mode = restore_module.file_mode

    def swap_after_lstat(st: os.stat_result) -> int:  # called between the check's lstat and its hash
        if not swapped:
            swapped.append(True)
            edited.unlink()
            os.mkfifo(edited)
        return real_file_mode(st)

    monkeypatch.setattr(restore_module, "file_mode", swap_after_lstat)
    outcome: list[BaseException] = []

    def roll_back() -> None:
        try:
            plan.rollback(target)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=roll_back, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # blocked opening the FIFO: a writer releases it, then the test fails
        os.close(os.open(edited, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(60)
        pytest.fail("the rollback hung opening a FIFO swapped in for the file it checked")
    assert swapped
    assert len(outcome) == 1 and isinstance(outcome[0], FailedPrecondition), outcome
    assert outcome[0].reason is Reason.ROLLBACK_CONFLICT
    assert "changed after the rollback's safety checkpoint was taken" in outcome[0].message
    assert stat.S_ISFIFO(edited.lstat().st_mode)


def _two_edits(plan: Plan) -> tuple[str, dict[str, tuple]]:
    """A plan whose rollback to the returned checkpoint rewrites two files; the listing before it."""
    (plan.root / "a.txt").write_text("a then")
    (plan.root / "b.txt").write_text("b then")
    target = plan.checkpoint()
    (plan.root / "a.txt").write_text("a before the rollback")
    (plan.root / "b.txt").write_text("b before the rollback")
    return target, _listing(plan.root)


@pytest.mark.parametrize("sync_fails", [False, True], ids=["synced", "sync fails too"])
def test_a_full_disk_part_way_through_a_rollback_undoes_it(plan: Plan, monkeypatch, caplog, sync_fails: bool) -> None:
    """A full disk is RESOURCE_EXHAUSTED and corrupts nothing: the file already restored is taken back.
    What the rollback wrote is made durable before the undo; if even that fails, the undo still goes
    on (it syncs each path it writes itself) and the failure is logged."""
    from checkpointd.core.kernel.errors import ResourceExhausted
    from checkpointd.core.workspace import syncbatch as syncbatch_module
    from checkpointd.core.workspace import workspace as workspace_module

    target, before = _two_edits(plan)
    if sync_fails:
        monkeypatch.setattr(syncbatch_module, "_sync", lambda fd: OSError(errno.EIO, os.strerror(errno.EIO)))
        monkeypatch.setattr(syncbatch_module, "_synced_whole_file_systems", lambda fds: False)
    writes: list[Point] = []

    def full_on_the_second_write(point: Point) -> None:
        if point is Point.WORKSPACE_WRITE:
            writes.append(point)
            if len(writes) in (2, 3):  # the write, and its retry once the batch's held files are released
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(workspace_module, "crash_point", full_on_the_second_write)
    with pytest.raises(ResourceExhausted) as full:
        plan.rollback(target)

    assert full.value.reason is Reason.STORAGE_EXHAUSTED
    assert (f"stopped at 'b.txt' ({os.strerror(errno.ENOSPC)}): the workspace's disk is full; the rollback was undone"
            in full.value.message)
    assert len(writes) >= 4  # the two writes of the rollback (the second tried twice), then the undo's
    assert _listing(plan.root) == before
    assert ("could not sync 'a.txt' after an interrupted rollback" in caplog.text) is sync_fails


def test_a_rollback_whose_writes_cannot_be_made_durable_is_undone(plan: Plan, monkeypatch) -> None:
    """A rollback's writes are made durable together before it is acknowledged; if that fails, the
    rollback is not acknowledged: it is undone and the failure reported (FAILED_PRECONDITION)."""
    from checkpointd.core.workspace import syncbatch as syncbatch_module

    target, before = _two_edits(plan)
    failed: list[int] = []

    def cannot_sync(fd: int) -> OSError:
        failed.append(fd)
        return OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(syncbatch_module, "_sync", cannot_sync)
    monkeypatch.setattr(syncbatch_module, "_synced_whole_file_systems", lambda fds: False)
    with pytest.raises(FailedPrecondition) as conflict:
        plan.rollback(target)

    assert failed
    assert conflict.value.reason is Reason.ROLLBACK_CONFLICT
    assert f"({os.strerror(errno.EIO)}); the rollback was undone, nothing was changed" in conflict.value.message
    assert _listing(plan.root) == before


def _rewrite_a(path: Path) -> None:
    path.write_text("a written during the rollback")


def _chmod_a(path: Path) -> None:
    path.chmod(0o600)


def _link_a(path: Path) -> None:
    path.unlink()
    path.symlink_to("written-during-the-rollback")


def _delete_a(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize("race", [None, _rewrite_a, _chmod_a, _link_a, _delete_a],
                         ids=["file left alone", "file rewritten", "file chmodded", "file replaced by a link",
                              "file deleted"])
def test_the_undo_takes_back_a_file_only_while_it_holds_what_the_rollback_wrote(
        plan: Plan, monkeypatch, race) -> None:
    """As for links: the rollback restores `a.txt`, then stops at `b.txt`; its undo puts back the
    `a.txt` from before the rollback only if nothing wrote it (content, permission bits or kind) meanwhile."""
    root = plan.root
    (root / "a.txt").write_text("a then")
    (root / "a.txt").chmod(0o644)
    (root / "b.txt").write_text("b then")
    target = plan.checkpoint()
    (root / "a.txt").write_text("a before the rollback")
    (root / "b.txt").write_text("b before the rollback")
    calls: list[Point] = []

    def racing_writes(point: Point) -> None:
        if point is not Point.RESTORE_CHANGE:
            return
        calls.append(point)
        if len(calls) == 2:  # a.txt is written; b.txt is next
            assert (root / "a.txt").read_text() == "a then"
            if race is not None:
                race(root / "a.txt")
            (root / "b.txt").write_text("b written during the rollback")

    monkeypatch.setattr(restore_module, "crash_point", racing_writes)
    scratch = root.parent / f"expected-{ULID()}"
    scratch.mkdir()
    (scratch / "a.txt").write_text("a before the rollback" if race is None else "a then")
    (scratch / "a.txt").chmod(0o644)
    (scratch / "b.txt").write_text("b written during the rollback")
    (scratch / "b.txt").chmod(stat.S_IMODE((root / "b.txt").stat().st_mode))
    if race is not None:
        race(scratch / "a.txt")
    with pytest.raises(FailedPrecondition) as conflict:
        plan.rollback(target)

    assert conflict.value.reason is Reason.ROLLBACK_CONFLICT
    assert "stopped at 'b.txt'" in conflict.value.message
    assert _listing(root) == _listing(scratch)


def test_the_undo_removes_a_directory_the_rollback_created(plan: Plan, monkeypatch) -> None:
    root = plan.root
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("in the target")
    (root / "z.txt").write_text("z then")
    target = plan.checkpoint()
    (root / "d" / "f.txt").unlink()
    (root / "d").rmdir()
    (root / "z.txt").write_text("z before the rollback")
    before = _listing(root)

    fired: list[Point] = []

    def racing_write(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and not fired and (root / "d" / "f.txt").exists():  # d/, d/f.txt are back
            fired.append(point)
            (root / "z.txt").write_text("z written during the rollback")

    monkeypatch.setattr(restore_module, "crash_point", racing_write)
    with pytest.raises(FailedPrecondition) as conflict:
        plan.rollback(target)

    assert "stopped at 'z.txt'" in conflict.value.message
    after = _listing(root)
    assert after.pop("z.txt")[2] == b"z written during the rollback"
    before.pop("z.txt")
    assert after == before


def test_a_file_the_rollback_deletes_already_gone_is_no_conflict(plan: Plan, monkeypatch) -> None:
    root = plan.root
    (root / "kept.txt").write_text("v1")
    target = plan.checkpoint()
    (root / "added.txt").write_text("added after the target")
    (root / "kept.txt").write_text("v2")

    def deleted_first(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and (root / "added.txt").exists():
            (root / "added.txt").unlink()  # someone deleted it first: nothing is lost by not deleting it

    monkeypatch.setattr(restore_module, "crash_point", deleted_first)
    plan.rollback(target)

    assert set(_listing(root)) == {"kept.txt"} and (root / "kept.txt").read_text() == "v1"


def test_unreadable_content_part_way_through_a_rollback_undoes_it(plan: Plan, monkeypatch) -> None:
    """Content the store cannot give back (DATA_LOSS) stops the rollback; what it changed is taken back."""
    from checkpointd.core.kernel.errors import DataLoss
    from checkpointd.core.workspace import workspace as workspace_module

    target, before = _two_edits(plan)
    writes: list[Point] = []

    def corrupt_on_the_second_write(point: Point) -> None:
        if point is Point.WORKSPACE_WRITE:
            writes.append(point)
            if len(writes) == 2:
                raise DataLoss(Reason.CORRUPT_CONTENT, "stored content is corrupt")

    monkeypatch.setattr(workspace_module, "crash_point", corrupt_on_the_second_write)
    with pytest.raises(DataLoss) as lost:
        plan.rollback(target)

    assert "stopped at 'b.txt' (stored content is corrupt); the rollback was undone" in lost.value.message
    assert _listing(plan.root) == before
