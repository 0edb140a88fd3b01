"""The rollback's write path attacked, in process (real SQLite, content store and files; no
watcher, no server): directories moved, swapped or recreated while one rollback runs, special
files, kinds flipped at many levels at once, many files, undo chains, concurrent rollbacks.

Races are made deterministic by hooks at the restorer's and the workspace's own fault points
(``restore.change``: before each workspace change; ``workspace.write``: a file's content is at its
temporary name, not renamed yet) or by wrapping a workspace method, monkeypatched.

Many of these guard the rollback write path against a rewrite that caches directory descriptors
across the files of one rollback: a directory moved out of the root, renamed, or swapped for a
symlink between two changes must never receive a write through a descriptor opened before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ulid import ULID

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings, RollbackRequest, Scope
from checkpointd.core.kernel.errors import CheckpointdError, FailedPrecondition, Reason
from checkpointd.core.kernel.faults import Point
from checkpointd.core.metadata.db import Database
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.workspace import workspace as workspace_module
from checkpointd.core.workspace.workspace import Workspace, is_temp_name
from tests.helpers import at_fault_point, checkpoint_files, tree_state


class Plan:
    def __init__(self, base: Path) -> None:
        self.base = base
        allowed = base / "workspaces"
        self.root = allowed / "ws"
        self.root.mkdir(parents=True)
        self.outside = base / "outside"
        self.outside.mkdir()
        self.db = Database(f"sqlite:///{base / 'meta.db'}")
        self.db.migrate()
        self.store = ContentStore(base / "store")
        self.config = ConfigStore(self.db)
        self.engine = Checkpoints(self.db, self.store, self.config,
                                  EngineSettings(base / "data", (str(allowed),), watcher=False))
        self.plan_id = str(ULID())

    def close(self) -> None:
        self.engine.close()
        self.store.close()
        self.db.dispose()

    def checkpoint(self, plan_id: str | None = None):
        return self.engine.create(CreateRequest(plan_id=plan_id or self.plan_id, workspace_root=str(self.root))).row

    def rollback(self, row, plan_id: str | None = None, **fields):
        return self.engine.rollback(RollbackRequest(plan_id=plan_id or self.plan_id, checkpoint_id=row.checkpoint_id,
                                                    scope=Scope.FILES, request_id=str(ULID()), **fields))

    def files_of(self, row) -> dict[str, tuple]:
        """What a checkpoint holds, in ``tree_state``'s shape."""
        return checkpoint_files(self.engine.trees, self.store, row.tree_digest)

    def state(self) -> dict[str, tuple]:
        return tree_state(self.root)


def write(path: Path, content: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mode is not None:
        os.chmod(path, mode)
    return path


def at_restore_change(monkeypatch, hooks: dict[int, Callable[[], None]]) -> list[int]:
    """Runs ``hooks[n]`` when the restorer is about to make its nth workspace change (1-based)."""
    return at_fault_point(monkeypatch, restorer_module, Point.RESTORE_CHANGE, hooks)


def at_workspace_write(monkeypatch, hooks: dict[int, Callable[[], None]]) -> list[int]:
    """Runs ``hooks[n]`` when the nth restored file's content is at its temporary name (1-based),
    between the walk to its directory and the rename into place."""
    return at_fault_point(monkeypatch, workspace_module, Point.WORKSPACE_WRITE, hooks)



# -- (a) a directory moved, renamed or swapped between two changes of one rollback ------------------
#
# Every change walks from the root again today; a rewrite caching directory descriptors across the
# changes of one rollback must notice that the directory it opened is no longer the one at its path.


def _moved_out(plan: Plan) -> None:
    os.rename(plan.root / "d", plan.outside / "d")


def _moved_out_and_recreated_empty(plan: Plan) -> None:
    os.rename(plan.root / "d", plan.outside / "d")
    (plan.root / "d").mkdir()


def _renamed_inside_and_recreated(plan: Plan) -> None:
    os.rename(plan.root / "d", plan.root / "d.old")
    write(plan.root / "d/b.txt", "the user's new d/b.txt\n")


def _moved_out_behind_a_symlink(plan: Plan) -> None:
    os.rename(plan.root / "d", plan.outside / "d")
    os.symlink(plan.outside / "d", plan.root / "d")


DIRECTORY_MOVES = {
    "moved-out": _moved_out,
    "moved-out-and-recreated-empty": _moved_out_and_recreated_empty,
    "renamed-inside-and-recreated": _renamed_inside_and_recreated,
    "moved-out-behind-a-symlink": _moved_out_behind_a_symlink,
}


def _d_workspace(plan: Plan):
    """A target of d/ holding files, a link and a subdirectory; then d/ changed in every way. The
    rollback's changes in d, in order: remove d/x.txt, d/y.txt; make d/sub; write d/a.txt, d/b.txt
    (recreated: deleted since), d/l, d/sub/s.txt; set d/sub's mode."""
    write(plan.root / "d/a.txt", "target a\n")
    write(plan.root / "d/b.txt", "target b\n")
    os.symlink("a.txt", plan.root / "d/l")
    write(plan.root / "d/sub/s.txt", "target s\n")
    os.chmod(plan.root / "d/sub", 0o750)
    write(plan.root / "top.txt", "target top\n")
    target = plan.checkpoint()
    write(plan.root / "d/a.txt", "changed a\n")
    os.unlink(plan.root / "d/b.txt")
    os.unlink(plan.root / "d/l")
    os.symlink("elsewhere", plan.root / "d/l")
    shutil.rmtree(plan.root / "d/sub")
    write(plan.root / "d/x.txt", "new since: x\n")
    write(plan.root / "d/y.txt", "new since: y\n")
    write(plan.root / "top.txt", "changed top\n")
    plan.checkpoint()
    return target


def before_workspace_call(monkeypatch, path: str, attack: Callable[[], None]) -> list[str]:
    """Runs ``attack`` once, right before the rollback's workspace call (write, link, mkdir or
    removal) for ``path``: after the changes before it, before its own walk to its directory.
    Returns the paths changed so far, when it ran."""
    calls: list[str] = []
    fired: list[str] = []
    for name in ("write_file", "write_symlink", "make_dir", "remove", "remove_empty_dir"):
        real = getattr(Workspace, name)

        def wrapped(self, target_path, *args, _real=real, **kwargs):
            if target_path == path and not fired:
                fired.extend(calls)
                fired.append("<attack>")
                attack()
            calls.append(target_path)
            return _real(self, target_path, *args, **kwargs)

        monkeypatch.setattr(Workspace, name, wrapped)
    return fired


@pytest.mark.parametrize("before", ["d/y.txt", "d/sub", "d/b.txt", "d/l", "d/sub/s.txt"])
@pytest.mark.parametrize("move", sorted(DIRECTORY_MOVES))
def test_a_directory_moved_between_two_changes_of_a_rollback_receives_nothing_after_the_move(
        plan: Plan, monkeypatch, move: str, before: str) -> None:
    target = _d_workspace(plan)
    expected = plan.files_of(target)
    seen: dict[str, dict] = {}

    def attack() -> None:
        DIRECTORY_MOVES[move](plan)
        seen["outside"] = tree_state(plan.outside)
        seen["renamed"] = tree_state(plan.root / "d.old") if (plan.root / "d.old").exists() else {}

    fired = before_workspace_call(monkeypatch, before, attack)
    try:
        plan.rollback(target)
        error = None
    except CheckpointdError as exc:
        error = exc
    assert fired, "the attack never ran"
    assert tree_state(plan.outside) == seen["outside"], "the rollback wrote outside the root after the move"
    renamed = tree_state(plan.root / "d.old") if (plan.root / "d.old").exists() else {}
    assert renamed == seen["renamed"], "the rollback wrote into the renamed directory after the move"
    if error is None:
        # It went on: what it had still to do landed in the workspace, at the target's paths.
        done = set(fired[:fired.index("<attack>")])
        now = plan.state()
        for path, value in expected.items():
            if path.startswith("d/") and path not in done and not any(path.startswith(p + "/") for p in done):
                assert now.get(path) == value, f"{path} is not the target's after a rollback reported done"
    else:
        assert isinstance(error, FailedPrecondition) and error.reason is Reason.ROLLBACK_CONFLICT, error


# Found by this file's first run (a strict xfail until fixed): restoring.py plan_restore's keep
# (holds(change.base, wrote[path]), restorer.py holds) takes an undo's 'put back a file the rollback removed'
# as still due when the file is absent because its whole directory was moved away meanwhile; the undo plan
# holds no change for that directory, so writing the file fails (ENOENT / UnsafePath) on every attempt: the
# journal entry is never finished and the plan's checkpoints can never be deleted until the user recreates the
# directory Fixed: restoring.py _with_a_directory_to_go_in: an undo no longer puts a file back into a
# directory gone since the rollback began.


@pytest.mark.parametrize("move", ["moved-out", "moved-out-behind-a-symlink", "deleted"])
def test_a_directory_moved_away_mid_rollback_leaves_no_undo_that_can_never_finish(
        plan: Plan, monkeypatch, move: str) -> None:
    """The rollback removes d/x.txt, then d/ is moved out of the root (a user's `mv`) or deleted
    (`rm -r`), and the rollback stops at its next change in d. Its undo must end: d/x.txt went with
    its directory, a change made after the rollback started, which wins."""
    target = _d_workspace(plan)
    moves = {**DIRECTORY_MOVES, "deleted": lambda plan: shutil.rmtree(plan.root / "d")}
    before_workspace_call(monkeypatch, "d/y.txt", lambda: moves[move](plan))
    with pytest.raises(CheckpointdError):
        plan.rollback(target)
    monkeypatch.undo()
    outside = tree_state(plan.outside)
    plan.checkpoint()  # takes the plan over: its unfinished undo is tried again first
    assert plan.engine.journal.get(plan.plan_id) is None, "the undo is still unfinished"
    assert tree_state(plan.outside) == outside
    plan.engine.delete(target.checkpoint_id)  # refused (RollbackUnfinished) while the undo cannot finish


# -- (b) a directory moved out, or swapped for a symlink, within one change -------------------------

# Found by this file's first run: the rename or unlink went through the parent's fd opened before the
# content was written and the check ran, so a directory moved out of the root meanwhile received it.
# Now the parent is resolved again right before the change (workspace.py Workspace._still_at).


def _without_temporary_files(state: dict) -> dict:
    """A tree's state without the server's temporary files: a write stopped because its directory
    left the root takes back the temporary file it had made there (its own, never the user's)."""
    return {path: value for path, value in state.items() if not is_temp_name(path.rpartition("/")[2])}


MID_CHANGE = {name: DIRECTORY_MOVES[name] for name in ("moved-out", "moved-out-behind-a-symlink")}


@pytest.mark.parametrize("move", sorted(MID_CHANGE))
def test_a_directory_moved_out_while_a_file_is_written_into_it_is_not_written(
        plan: Plan, monkeypatch, move: str) -> None:
    """d/b.txt's new content is at its temporary name when d/ leaves the root: the rename must not
    land in the moved directory, and the rollback must not report the workspace restored."""
    for name in ("a", "b"):
        write(plan.root / f"d/{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b"):
        write(plan.root / f"d/{name}.txt", f"changed {name}\n")
    plan.checkpoint()
    seen: dict[str, dict] = {}

    def attack() -> None:
        MID_CHANGE[move](plan)
        seen["outside"] = tree_state(plan.outside)

    at_workspace_write(monkeypatch, {2: attack})  # d/a.txt is written; d/b.txt's content is at its temp name
    try:
        plan.rollback(target)
        reported_done = True
    except CheckpointdError:
        reported_done = False
    assert seen, "the attack never ran"
    assert _without_temporary_files(tree_state(plan.outside)) == _without_temporary_files(seen["outside"]), \
        "the rollback wrote outside the root (beyond taking back its own temporary file)"
    assert not reported_done or plan.state() == plan.files_of(target), \
        "the rollback reported success with the workspace unlike its target"


@pytest.mark.parametrize("move", sorted(MID_CHANGE))
def test_a_directory_moved_out_while_a_file_in_it_is_removed_keeps_that_file(
        plan: Plan, monkeypatch, move: str) -> None:
    """The rollback removes d/new.txt (the target lacks it); d/ leaves the root after the removal
    walked to it: the file, now outside the root, must stay."""
    write(plan.root / "d/keep.txt", "kept\n")
    target = plan.checkpoint()
    write(plan.root / "d/new.txt", "new since the target\n")
    plan.checkpoint()
    seen: dict[str, dict] = {}
    real = Workspace._synced_dir  # called between the walk to the parent and the check

    def synced_dir(self, path, fd):
        if path == "d" and not seen:
            MID_CHANGE[move](plan)
            seen["outside"] = tree_state(plan.outside)
        return real(self, path, fd)

    monkeypatch.setattr(Workspace, "_synced_dir", synced_dir)
    try:
        plan.rollback(target)
        reported_done = True
    except CheckpointdError:
        reported_done = False
    assert seen, "the attack never ran"
    assert tree_state(plan.outside) == seen["outside"], "the rollback removed a file outside the root"
    assert not reported_done or plan.state() == plan.files_of(target), \
        "the rollback reported success with the workspace unlike its target"


# -- (c) read-only directories ------------------------------------------------------------------------

_CAPS = ctypes.CDLL(None, use_errno=True)
_CAP_V3 = 0x20080522
_DAC = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def as_plain_owner() -> Iterator[None]:
    """This thread (capabilities are per thread) without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH while
    the block runs: permission bits bind it as they bind a server run by the workspace's owner (as
    tests/hardening/test_rollback_races.py runs its server). A no-op for a process that lacks them."""
    header = _CapHeader(_CAP_V3, 0)
    data = (_CapData * 2)()
    if _CAPS.capget(ctypes.byref(header), data) != 0:
        pytest.fail(f"capget: {os.strerror(ctypes.get_errno())}")
    saved = data[0].effective
    data[0].effective = saved & ~_DAC
    if _CAPS.capset(ctypes.byref(header), data) != 0:
        pytest.fail(f"capset: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        data[0].effective = saved
        _CAPS.capset(ctypes.byref(header), data)


# Found by this file's first run (a strict xfail until fixed): restorer.py Restorer._steps sets directory
# modes (a 0555 directory included) before apply's final SyncBatch.flush, and neither the undo
# (Recovery.resume -> Restorer.apply) nor Workspace.remove makes a directory writable again to take back a
# file the rollback itself put in it: removing ro/f.txt fails with EACCES on every attempt, so the workspace
# stays partly restored and the journal entry is never finished Fixed: workspace.py Workspace._changing: a
# directory without its owner's write bit gets it for the change.


def test_a_rollback_that_restored_a_read_only_directory_can_still_be_undone(plan: Plan, monkeypatch) -> None:
    """The target has ro/ (0555) holding a file; the rollback creates both, sets ro/ to 0555, then its
    final sync fails (EIO): the rollback is not acknowledged and must be taken back, read-only directory
    and all, by a server bound by permission bits (run by the workspace's owner)."""
    from checkpointd.core.workspace import syncbatch as syncbatch_module

    write(plan.root / "ro/f.txt", "in a read-only directory\n")
    os.chmod(plan.root / "ro", 0o555)
    write(plan.root / "z.txt", "z then\n")
    target = plan.checkpoint()
    os.chmod(plan.root / "ro", 0o755)
    shutil.rmtree(plan.root / "ro")
    write(plan.root / "z.txt", "z now\n")
    plan.checkpoint()
    before = plan.state()
    real_flush = syncbatch_module.SyncBatch.flush
    failed: list[bool] = []

    def flush(self) -> None:
        if not failed and len(self):
            failed.append(True)
            raise syncbatch_module.SyncFailed("z.txt", OSError(errno.EIO, os.strerror(errno.EIO)))
        real_flush(self)

    monkeypatch.setattr(syncbatch_module.SyncBatch, "flush", flush)
    with as_plain_owner():
        with pytest.raises(CheckpointdError):
            plan.rollback(target)
        assert failed
        plan.checkpoint()  # the undo, tried again if it failed
    assert plan.engine.journal.get(plan.plan_id) is None, "the undo never finishes"
    assert plan.state() == before


def test_a_read_only_directory_and_read_only_files_come_back_exactly_and_are_undone(plan: Plan) -> None:
    """As root (the process running the suite), read-only bits do not stop the rollback: the target's
    0555 directory, 0444 file, setuid/setgid/sticky bits come back exactly, and the undo brings back
    the workspace as it was."""
    write(plan.root / "ro/f.txt", "read-only file in a read-only directory\n", 0o444)
    write(plan.root / "ro/inner/g.txt", "deeper\n", 0o400)
    os.chmod(plan.root / "ro/inner", 0o500)
    os.chmod(plan.root / "ro", 0o555)
    write(plan.root / "suid", "#!/bin/sh\n", 0o4755)
    write(plan.root / "sgid/x", "x\n")
    os.chmod(plan.root / "sgid", 0o2775)
    write(plan.root / "sticky/y", "y\n")
    os.chmod(plan.root / "sticky", 0o1777)
    target = plan.checkpoint()
    expected = plan.state()
    for directory in ("ro/inner", "ro"):
        os.chmod(plan.root / directory, 0o755)
    write(plan.root / "ro/f.txt", "rewritten\n", 0o644)
    os.unlink(plan.root / "ro/inner/g.txt")
    write(plan.root / "ro/inner/new.txt", "new\n", 0o444)
    os.chmod(plan.root / "ro/inner", 0o555)
    os.chmod(plan.root / "ro", 0o555)
    write(plan.root / "suid", "#!/bin/sh\necho changed\n", 0o755)
    os.chmod(plan.root / "sgid", 0o755)
    shutil.rmtree(plan.root / "sticky")
    write(plan.root / "sticky", "a file now\n", 0o1644)
    changed = plan.state()
    plan.checkpoint()
    result = plan.rollback(target)
    assert plan.state() == expected == plan.files_of(target)
    plan.rollback(result.safety.row)
    assert plan.state() == changed


# -- (d) special files: FIFOs, sockets, devices -------------------------------------------------------


def listing(root: Path) -> dict[str, tuple]:
    """``tree_state``, with special files as ('special', their type) (reading a FIFO would block)."""
    out: dict[str, tuple] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            full = Path(directory, name)
            st = full.lstat()
            relative = full.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                out[relative] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[relative] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                out[relative] = ("file", full.read_bytes(), stat.S_IMODE(st.st_mode))
            else:
                out[relative] = ("special", stat.S_IFMT(st.st_mode))
    return out


def make_special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        here = os.getcwd()
        os.chdir(path.parent)  # a relative name: the path may be longer than sun_path allows
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(path.name)
        finally:
            os.chdir(here)
    else:
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("this process may not create device nodes")


SPECIAL = ["fifo", "socket", "chardev"]


def rollback_bounded(plan: Plan, target, **fields) -> BaseException | None:
    """The rollback, in a thread: what it raised (None: done). A rollback blocked opening a FIFO
    fails the test instead of hanging it."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            plan.rollback(target, **fields)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        for directory, _dirs, files in os.walk(plan.root):  # release a reader blocked on a FIFO
            for name in files:
                with contextlib.suppress(OSError):
                    os.close(os.open(Path(directory, name), os.O_WRONLY | os.O_NONBLOCK))
        thread.join(60)
        pytest.fail("the rollback hung on a special file")
    return outcome[0]


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_file_where_the_target_has_a_file_is_kept_and_nothing_changes(plan: Plan, kind: str) -> None:
    write(plan.root / "a.txt", "target a\n")
    write(plan.root / "p", "the target's regular file\n")
    write(plan.root / "z.txt", "target z\n")
    target = plan.checkpoint()
    write(plan.root / "a.txt", "changed a\n")
    os.unlink(plan.root / "p")
    make_special(plan.root / "p", kind)
    write(plan.root / "z.txt", "changed z\n")
    plan.checkpoint()
    before = listing(plan.root)
    error = rollback_bounded(plan, target)
    assert isinstance(error, FailedPrecondition) and error.reason is Reason.ROLLBACK_CONFLICT, error
    assert listing(plan.root) == before
    assert plan.engine.journal.get(plan.plan_id) is None


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_file_in_a_directory_the_target_lacks_or_makes_a_file_is_kept(plan: Plan, kind: str) -> None:
    write(plan.root / "thing", "a file in the target\n")
    write(plan.root / "a.txt", "target a\n")
    target = plan.checkpoint()
    os.unlink(plan.root / "thing")
    write(plan.root / "thing/accounted.txt", "captured\n")
    make_special(plan.root / "thing/p", kind)
    write(plan.root / "gone/accounted.txt", "captured\n")
    make_special(plan.root / "gone/p", kind)
    write(plan.root / "a.txt", "changed a\n")
    plan.checkpoint()
    before = listing(plan.root)
    # thing/ must become a file but holds what no checkpoint accounts for: refused, nothing changed.
    error = rollback_bounded(plan, target)
    assert isinstance(error, FailedPrecondition) and error.reason is Reason.ROLLBACK_CONFLICT, error
    assert "thing" in error.message
    assert listing(plan.root) == before
    # Scoped to the rest: gone/ loses what the target accounts for and keeps the special file.
    assert rollback_bounded(plan, target, paths=("gone", "a.txt")) is None
    after = listing(plan.root)
    assert after["gone/p"][0] == "special" and "gone/accounted.txt" not in after
    assert after["a.txt"] == ("file", b"target a\n", before["a.txt"][2])
    assert {k: v for k, v in after.items() if k.startswith("thing")} == \
        {k: v for k, v in before.items() if k.startswith("thing")}


def _swap_at_change(plan: Plan, path: str, kind: str) -> Callable[[], None]:
    def swap() -> None:
        os.unlink(plan.root / path)
        make_special(plan.root / path, kind)
    return swap


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("swapped", ["replaced.txt", "removed.txt"])
def test_a_file_swapped_for_a_special_file_during_the_rollback_is_kept_and_the_rollback_undone(
        plan: Plan, monkeypatch, kind: str, swapped: str) -> None:
    """Between the safety capture and the change of the path (hook: restore.change), and, for the file
    the rollback replaces, after its new content is at its temporary name (hook: workspace.write)."""
    write(plan.root / "a.txt", "target a\n")
    write(plan.root / "replaced.txt", "target replaced\n")
    target = plan.checkpoint()
    write(plan.root / "a.txt", "changed a\n")
    write(plan.root / "replaced.txt", "changed replaced\n")
    write(plan.root / "removed.txt", "new since the target\n")
    plan.checkpoint()
    before = listing(plan.root)
    # Changes: remove removed.txt; write a.txt; write replaced.txt.
    if swapped == "removed.txt":
        at_restore_change(monkeypatch, {1: _swap_at_change(plan, swapped, kind)})
    else:
        at_workspace_write(monkeypatch, {2: _swap_at_change(plan, swapped, kind)})
    error = rollback_bounded(plan, target)
    assert isinstance(error, FailedPrecondition) and error.reason is Reason.ROLLBACK_CONFLICT, error
    assert f"stopped at {swapped!r}" in error.message
    expected = {**before, swapped: ("special", stat.S_IFMT((plan.root / swapped).lstat().st_mode))}
    assert listing(plan.root) == expected  # no temporary file left behind either
    assert plan.engine.journal.get(plan.plan_id) is None


# Found by this file's first run (a strict xfail until fixed): snapshot.py Snapshotter.capture_paths re-raises
# any OSError of _entry_at's os.open but the FLIPPED ones; a socket (ENXIO) swapped in for the file between
# its lstat and its open escapes plan_restore (restoring.py catches only Inaccessible, UnsafePath,
# FileNotFoundError, NotADirectoryError) as a raw OSError: the gRPC answer is INTERNAL, where a full capture's
# read_file just skips such a file Fixed: snapshot.py capture_paths: ENXIO (a socket or device swapped in) is
# a kind change; a lease's EWOULDBLOCK is Inaccessible.


def test_a_socket_swapped_in_while_the_safety_capture_reads_an_ignored_file_is_a_clear_conflict(
        plan: Plan, monkeypatch) -> None:
    """e.log is in the target and ignored now: the safety capture reads it on its own
    (capture_paths). It becomes a socket between that capture's lstat and its open."""
    write(plan.root / "e.log", "target e\n")
    write(plan.root / "f.txt", "target f\n")
    target = plan.checkpoint()
    write(plan.root / "e.log", "changed e, ignored now\n")
    write(plan.root / ".gitignore", "*.log\n")
    plan.checkpoint()
    before = listing(plan.root)
    real = snapshot_module._restat
    swapped: list[bool] = []

    def restat(dir_fd: int, name: str):
        found = real(dir_fd, name)
        if name == "e.log" and not swapped:
            swapped.append(True)
            os.unlink(plan.root / "e.log")
            make_special(plan.root / "e.log", "socket")
        return found

    monkeypatch.setattr(snapshot_module, "_restat", restat)
    error = rollback_bounded(plan, target)
    assert swapped
    assert isinstance(error, CheckpointdError), f"a raw {type(error).__name__} ({error}) is an INTERNAL answer"
    assert error.reason is Reason.ROLLBACK_CONFLICT
    assert {k: v for k, v in listing(plan.root).items() if k != "e.log"} == \
        {k: v for k, v in before.items() if k != "e.log"}


# -- (e) kinds flipped at many levels at once; undo chains; many files --------------------------------


def _flip_target(plan: Plan) -> None:
    """Every kind at many levels, names with a newline, a backslash and bytes that are not UTF-8."""
    (plan.outside / "bdir").mkdir()
    write(plan.outside / "bdir/f.txt", "outside, same name as b/f.txt\n")
    os.symlink(plan.outside, plan.root / "a")
    write(plan.root / "b/f.txt", "target b/f\n")
    write(plan.root / "b/sub/g.txt", "target b/sub/g\n", 0o600)
    write(plan.root / "c", "target c, a file\n")
    write(plan.root / "e/x", "target e/x, a file\n")
    write(plan.root / "deep/1/2/3/leaf", "target leaf\n")
    write(plan.root / "m/n.txt", "target m/n\n")
    os.symlink("../c", plan.root / "m/link")
    write(plan.root / os.fsdecode(b"caf\xe9\ndir\\x/inner"), "target inner\n")
    write(plan.root / "q", "target q\n")


def _flip_current(plan: Plan) -> None:
    """The same names, each of another kind (a directory, a link, a file), at several depths."""
    os.unlink(plan.root / "a")
    write(plan.root / "a/one.txt", "now a directory\n")
    write(plan.root / "a/two/three.txt", "deeper\n")
    shutil.rmtree(plan.root / "b")
    os.symlink(plan.outside / "bdir", plan.root / "b")
    os.unlink(plan.root / "c")
    write(plan.root / "c/inner/file", "c is a directory now\n")
    os.unlink(plan.root / "e/x")
    write(plan.root / "e/x/y/z.txt", "e/x is a directory now\n")
    shutil.rmtree(plan.root / "deep")
    write(plan.root / "deep", "deep is a file now\n")
    shutil.rmtree(plan.root / "m")
    os.symlink("b", plan.root / "m")
    shutil.rmtree(plan.root / os.fsdecode(b"caf\xe9\ndir\\x"))
    write(plan.root / os.fsdecode(b"caf\xe9\ndir\\x"), "a file now\n")
    os.unlink(plan.root / "q")
    os.symlink("q", plan.root / "q")  # a link to itself


def test_kinds_flipped_at_many_levels_at_once_come_back_exactly_along_an_undo_chain(plan: Plan) -> None:
    """A rollback, the rollback of that rollback, and so on: each lands exactly on its target, and
    nothing outside the root (where links point) is ever written."""
    _flip_target(plan)
    first = plan.checkpoint()
    flipped_from = plan.state()
    outside = tree_state(plan.outside)
    _flip_current(plan)
    plan.checkpoint()
    flipped_to = plan.state()
    goal, expected = first, flipped_from
    for step in range(4):
        result = plan.rollback(goal)
        assert plan.state() == expected == plan.files_of(goal), f"step {step}"
        assert tree_state(plan.outside) == outside, f"step {step} wrote outside the root"
        assert plan.engine.journal.get(plan.plan_id) is None
        goal, expected = result.safety.row, (flipped_to if expected is flipped_from else flipped_from)


def test_thousands_of_files_across_many_directories_come_back_exactly_and_are_undone(plan: Plan) -> None:
    """More files and directories than a sync batch holds (MAX_PENDING): rewritten, deleted, created,
    directories removed and turned into files, in one rollback, then undone."""
    for d in range(40):
        for f in range(40):
            write(plan.root / f"d{d:02}/s{f % 4}/f{f:02}.txt", f"target {d} {f}\n")
    target = plan.checkpoint()
    expected = plan.state()
    for d in range(40):
        base = plan.root / f"d{d:02}"
        if d % 10 == 3:
            shutil.rmtree(base)
            write(base, "a directory became this file\n")
            continue
        if d % 10 == 7:
            shutil.rmtree(base / "s1")
        for f in range(0, 40, 3):
            path = base / f"s{f % 4}/f{f:02}.txt"
            if path.exists():
                write(path, f"changed {d} {f}, longer than before\n")
        for f in range(1, 40, 5):
            path = base / f"s{f % 4}/f{f:02}.txt"
            if path.exists():
                path.unlink()
        write(base / "s0/new.txt", "new since\n")
        write(base / "fresh/x/y.txt", "a new directory\n")
    changed = plan.state()
    plan.checkpoint()
    result = plan.rollback(target)
    assert len(result.changes) > 1000
    assert plan.state() == expected
    plan.rollback(result.safety.row)
    assert plan.state() == changed


def test_a_directory_swapped_for_a_link_outside_in_the_middle_of_a_large_rollback_receives_nothing(
        plan: Plan, monkeypatch) -> None:
    """Hundreds of changes in; the directory the rollback has just written into (d20/s0: f00.txt
    is written, f12.txt is next) leaves the root and a symlink to it takes its place."""
    for d in range(30):
        for f in range(40):
            write(plan.root / f"d{d:02}/s{f % 4}/f{f:02}.txt", f"target {d} {f}\n")
    target = plan.checkpoint()
    for d in range(30):
        for f in range(0, 40, 3):
            write(plan.root / f"d{d:02}/s{f % 4}/f{f:02}.txt", f"changed {d} {f}\n")
    plan.checkpoint()
    seen: dict[str, dict] = {}

    def attack() -> None:
        os.rename(plan.root / "d20", plan.outside / "d20")
        os.symlink(plan.outside / "d20", plan.root / "d20")
        seen["outside"] = tree_state(plan.outside)

    fired = before_workspace_call(monkeypatch, "d20/s0/f12.txt", attack)
    with pytest.raises(CheckpointdError) as stopped:
        plan.rollback(target)
    assert fired and fired[-2] == "d20/s0/f00.txt" and len(fired) > 250
    assert stopped.value.reason is Reason.ROLLBACK_CONFLICT
    assert tree_state(plan.outside) == seen["outside"], "the rollback wrote through a directory that left the root"
    assert (plan.outside / "d20/s0/f12.txt").read_text() == "changed 20 12\n"


# -- (f) concurrent rollbacks of one plan ------------------------------------------------------------


def test_a_second_rollback_of_the_plan_started_during_the_first_runs_after_it(plan: Plan, monkeypatch) -> None:
    """Rollback A (to T1) is at its second change when rollback B (to T2) of the same plan starts in
    another thread: B waits for the plan, then records A's result as its safety checkpoint and
    lands exactly on T2."""
    for name in ("a", "b", "c"):
        write(plan.root / f"{name}.txt", f"T1 {name}\n")
    t1 = plan.checkpoint()
    for name in ("a", "b", "c"):
        write(plan.root / f"{name}.txt", f"T2 {name}, longer\n")
    write(plan.root / "t2-only/x.txt", "only in T2\n")
    t2 = plan.checkpoint()
    write(plan.root / "a.txt", "after T2\n")
    plan.checkpoint()
    outcome: dict[str, object] = {}

    def second() -> None:
        try:
            outcome["result"] = plan.rollback(t2)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=second, daemon=True)
    at_restore_change(monkeypatch, {2: thread.start})
    plan.rollback(t1)
    thread.join(120)
    assert not thread.is_alive(), "the second rollback never ran"
    assert "error" not in outcome, outcome.get("error")
    assert plan.state() == plan.files_of(t2)
    assert plan.files_of(outcome["result"].safety.row) == plan.files_of(t1)
    assert plan.engine.journal.get(plan.plan_id) is None


def test_two_threads_rolling_one_plan_back_at_once_end_on_the_later_ones_target(plan: Plan) -> None:
    write(plan.root / "shared.txt", "T1\n")
    write(plan.root / "t1/x.txt", "only in T1\n")
    t1 = plan.checkpoint()
    shutil.rmtree(plan.root / "t1")
    write(plan.root / "shared.txt", "T2, longer\n")
    write(plan.root / "t2/y.txt", "only in T2\n")
    t2 = plan.checkpoint()
    for _round in range(3):
        results: dict[str, object] = {}
        barrier = threading.Barrier(2)

        def run(name: str, row, results: dict[str, object] = results, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                results[name] = plan.rollback(row)
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                results[name] = exc

        threads = [threading.Thread(target=run, args=(n, r), daemon=True) for n, r in (("t1", t1), ("t2", t2))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        errors = [r for r in results.values() if isinstance(r, BaseException)]
        assert not errors, errors
        later = max(("t1", "t2"), key=lambda n: results[n].safety.row.sequence)
        assert plan.state() == plan.files_of(t1 if later == "t1" else t2)
        assert plan.engine.journal.get(plan.plan_id) is None


# -- (g) scoped rollbacks, ignore rules that changed, hard links ---------------------------------------


def test_a_scoped_rollback_keeps_what_the_target_ignored_in_nested_directories(plan: Plan) -> None:
    from checkpointd.core.config.registry import IGNORE_PATTERNS

    plan.config.set(IGNORE_PATTERNS, ["*.tmp"], plan_id=plan.plan_id)
    write(plan.root / "src/.gitignore", "build/\n")
    write(plan.root / "src/a/b/c.txt", "target c\n")
    write(plan.root / "src/a/keep.tmp", "ignored by the target's configured patterns\n")
    write(plan.root / "src/build/out.o", "ignored by the target's src/.gitignore\n")
    write(plan.root / "src/a/cache.bin", "target cache\n")
    write(plan.root / "other.txt", "target other\n")
    target = plan.checkpoint()
    # Now nothing is ignored by configuration, src/.gitignore ignores *.bin instead of build/.
    plan.config.set(IGNORE_PATTERNS, [], plan_id=plan.plan_id)
    write(plan.root / "src/.gitignore", "*.bin\n")
    write(plan.root / "src/a/b/c.txt", "changed c\n")
    write(plan.root / "src/a/b/new/deep.txt", "new since\n")
    write(plan.root / "src/a/keep.tmp", "captured now, the target ignored it\n")
    write(plan.root / "src/a/new.tmp", "new, the target would have ignored it\n")
    write(plan.root / "src/build/out.o", "captured now, the target ignored it\n")
    write(plan.root / "src/build/more/o2.o", "under a directory the target ignored\n")
    write(plan.root / "src/a/cache.bin", "changed, ignored now\n")
    write(plan.root / "other.txt", "changed other\n")
    plan.checkpoint()
    before = plan.state()

    result = plan.rollback(target, paths=("src/a", "src/build"))

    after = plan.state()
    for kept in ("src/a/keep.tmp", "src/a/new.tmp", "src/build/out.o", "src/build/more/o2.o",
                 "other.txt", "src/.gitignore"):
        assert after[kept] == before[kept], kept
    assert after["src/a/b/c.txt"][1] == b"target c\n"
    assert after["src/a/cache.bin"][1] == b"target cache\n"  # ignored now: captured into the safety first
    assert "src/a/b/new" not in after and "src/a/b/new/deep.txt" not in after
    assert plan.files_of(result.safety.row)["src/a/cache.bin"] == before["src/a/cache.bin"]
    # (Rolling back to the safety checkpoint is refused today: see the next test.)
    plan.rollback(result.safety.row, paths=("src/a/b",))
    assert plan.state() == {**after, **{k: v for k, v in before.items() if k.startswith("src/a/b")}}


# Found by this file's first run (a strict xfail until fixed): restoring.py seen_by_capture takes the stat
# index's entry of a path as the identity the safety capture saw whenever its digest and size match the base;
# for a file ignored now, the base comes from capture_paths (find_uncaptured), which leaves the index alone,
# so the entry is the stale one of its last full capture, of an inode the first rollback replaced with the
# same content. restorer.py _Expect._same_file then finds another inode and refuses ('was written after the
# rollback's safety checkpoint'): undoing the rollback is refused, every time, although nothing wrote the file
# Fixed: restoring.py seen_by_capture: no stat identity for a path capture_paths read
# (CaptureResult.unindexed).


@pytest.mark.parametrize("ignored_by", ["configured-pattern", "gitignore-outside-the-scope"])
def test_a_rollback_restoring_a_file_ignored_now_can_be_undone(plan: Plan, ignored_by: str) -> None:
    """x.bin was captured by the target; it is ignored now and changed. The rollback brings the
    target's content back (saving the changed one in its safety checkpoint first); rolling back to
    that safety checkpoint must bring the changed content back: nothing wrote x.bin in between."""
    from checkpointd.core.config.registry import IGNORE_PATTERNS

    write(plan.root / "d/x.bin", "the target's x\n")
    write(plan.root / "d/y.txt", "the target's y\n")
    target = plan.checkpoint()
    if ignored_by == "configured-pattern":
        plan.config.set(IGNORE_PATTERNS, ["*.bin"], plan_id=plan.plan_id)
    else:
        write(plan.root / ".gitignore", "*.bin\n")
    write(plan.root / "d/x.bin", "changed since, ignored now: precious\n")
    write(plan.root / "d/y.txt", "changed y\n")
    plan.checkpoint()
    before = plan.state()
    result = plan.rollback(target, paths=("d",))
    assert (plan.root / "d/x.bin").read_text() == "the target's x\n"
    plan.rollback(result.safety.row, paths=("d",))
    assert plan.state() == before


def test_a_hard_link_to_a_file_outside_is_never_written_by_a_rollback_or_its_undo(plan: Plan, monkeypatch) -> None:
    """h and outside/alias are one inode; the rollback replaces h, then stops at the next file (a
    racing write) and is undone: the outside name keeps its content through both."""
    write(plan.root / "h", "target h\n")
    write(plan.root / "z.txt", "target z\n")
    target = plan.checkpoint()
    os.unlink(plan.root / "h")
    write(plan.outside / "alias", "the outside file's content\n")
    os.link(plan.outside / "alias", plan.root / "h")
    write(plan.root / "z.txt", "changed z\n")
    plan.checkpoint()
    inode = (plan.outside / "alias").stat().st_ino

    def racing() -> None:
        assert (plan.root / "h").read_text() == "target h\n"
        write(plan.root / "z.txt", "written during the rollback\n")

    at_restore_change(monkeypatch, {2: racing})
    with pytest.raises(FailedPrecondition):
        plan.rollback(target)
    assert (plan.outside / "alias").read_text() == "the outside file's content\n"
    assert (plan.outside / "alias").stat().st_ino == inode
    assert (plan.root / "h").read_text() == "the outside file's content\n"
    assert (plan.root / "z.txt").read_text() == "written during the rollback\n"
    monkeypatch.undo()
    write(plan.root / "z.txt", "changed z\n")
    plan.rollback(target)
    assert (plan.outside / "alias").read_text() == "the outside file's content\n"
    assert plan.state() == plan.files_of(target)


@pytest.mark.parametrize("replaced_by", ["nothing", "an-empty-directory", "a-symlink-to-it"])
def test_a_workspace_root_moved_away_between_two_changes_receives_nothing_after_the_move(
        plan: Plan, monkeypatch, replaced_by: str) -> None:
    """The root itself leaves its path between two changes (d/a.txt is written, d/b.txt next): no
    later change may land in it through a descriptor opened before."""
    for name in ("a", "b", "c"):
        write(plan.root / f"d/{name}.txt", f"target {name}\n")
    target = plan.checkpoint()
    for name in ("a", "b", "c"):
        write(plan.root / f"d/{name}.txt", f"changed {name}\n")
    write(plan.root / "d/new.txt", "new since\n")
    plan.checkpoint()
    moved = plan.outside / "ws"
    seen: dict[str, dict] = {}

    def attack() -> None:
        os.rename(plan.root, moved)
        if replaced_by == "an-empty-directory":
            plan.root.mkdir()
        elif replaced_by == "a-symlink-to-it":
            os.symlink(moved, plan.root)
        seen["moved"] = tree_state(moved)

    before_workspace_call(monkeypatch, "d/b.txt", attack)
    with pytest.raises(CheckpointdError):
        plan.rollback(target)
    assert seen, "the attack never ran"
    assert tree_state(moved) == seen["moved"], "the rollback wrote into the root after it was moved away"
    if replaced_by == "an-empty-directory":
        assert tree_state(plan.root) == {}


# Found by this file's first run (a strict xfail until fixed): restorer.py Restorer.plan keeps a path the
# target lacks only if `path not in target_skipped` (or the target's rules ignore it, counting ignored
# ancestors); a file under a directory the target skipped (UNREADABLE: the target never saw inside it) is not
# itself in target_skipped, so the rollback deletes it, although the target does not account for it Fixed:
# restorer.py Restorer.plan: a path under a directory the target skipped is kept (_within).


def test_files_inside_a_directory_the_target_could_not_read_are_kept(plan: Plan) -> None:
    """The target was captured while locked/ could not be entered (mode 000, a server bound by
    permission bits): it skipped locked/ as UNREADABLE, never seeing what is inside. Rolling back to
    it must leave what is inside locked/ alone, as it leaves the directory itself."""
    write(plan.root / "locked/precious.txt", "the target never saw this\n")
    write(plan.root / "locked/deeper/more.txt", "nor this\n")
    write(plan.root / "a.txt", "target a\n")
    os.chmod(plan.root / "locked", 0)
    with as_plain_owner():
        target = plan.checkpoint()
    assert [s[0] for s in target.skipped] == ["locked"], target.skipped
    os.chmod(plan.root / "locked", 0o755)
    write(plan.root / "a.txt", "changed a\n")
    plan.checkpoint()
    before = plan.state()
    plan.rollback(target)
    after = plan.state()
    assert after["a.txt"][1] == b"target a\n"
    assert {k: v for k, v in after.items() if k.startswith("locked")} == \
        {k: v for k, v in before.items() if k.startswith("locked")}


class _Killed(BaseException):
    """Stands for the process dying at a fault point: nothing in the engine handles it."""


@pytest.mark.parametrize("at", ["restore.change", "workspace.write"])
def test_a_rollback_killed_mid_way_whose_directory_then_leaves_the_root_is_finished_inside_it(
        plan: Plan, monkeypatch, at: str) -> None:
    """The process dies part-way (at the third change, or with the second file's content at its
    temporary name); then d/ is moved out and a symlink to it takes its place. Whoever takes the plan
    next finishes the rollback: d/ comes back as the target's directory, and the moved d/ outside
    (where the link points) is never written."""
    for name in ("a", "b", "c"):
        write(plan.root / f"d/{name}.txt", f"target {name}\n")
    write(plan.root / "top.txt", "target top\n")
    target = plan.checkpoint()
    for name in ("a", "b", "c"):
        write(plan.root / f"d/{name}.txt", f"changed {name}\n")
    write(plan.root / "top.txt", "changed top\n")
    plan.checkpoint()

    def die() -> None:
        raise _Killed

    if at == "restore.change":
        at_restore_change(monkeypatch, {3: die})
    else:
        at_workspace_write(monkeypatch, {2: die})
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    os.rename(plan.root / "d", plan.outside / "d")
    os.symlink(plan.outside / "d", plan.root / "d")
    outside = tree_state(plan.outside)
    plan.checkpoint()  # takes the plan over: finishes the rollback first
    assert plan.engine.journal.get(plan.plan_id) is None
    assert tree_state(plan.outside) == outside, "finishing the rollback wrote outside the root"
    assert {k: v for k, v in plan.state().items() if k.startswith("d")} == \
        {k: v for k, v in plan.files_of(target).items() if k.startswith("d")}


def _ancestor_moved_out_and_recreated(plan: Plan) -> None:
    os.rename(plan.root / "p", plan.outside / "p")
    (plan.root / "p/q/r").mkdir(parents=True)


def _ancestor_moved_out_behind_a_symlink(plan: Plan) -> None:
    os.rename(plan.root / "p", plan.outside / "p")
    os.symlink(plan.outside / "p", plan.root / "p")


def _middle_moved_out_behind_a_symlink(plan: Plan) -> None:
    os.rename(plan.root / "p/q", plan.outside / "q")
    os.symlink(plan.outside / "q", plan.root / "p/q")


def _ancestors_swapped_inside(plan: Plan) -> None:
    # p/ and s/ trade places: p/q/r is now the other tree's directory, still under the root.
    os.rename(plan.root / "p", plan.root / "tmp-p")
    os.rename(plan.root / "s", plan.root / "p")
    os.rename(plan.root / "tmp-p", plan.root / "s")


ANCESTOR_MOVES = {
    "grandparent-moved-out-and-recreated": _ancestor_moved_out_and_recreated,
    "grandparent-moved-out-behind-a-symlink": _ancestor_moved_out_behind_a_symlink,
    "parent-of-parent-moved-out-behind-a-symlink": _middle_moved_out_behind_a_symlink,
    "grandparent-swapped-with-a-sibling-tree": _ancestors_swapped_inside,
}


@pytest.mark.parametrize("move", sorted(ANCESTOR_MOVES))
def test_an_ancestor_moved_between_two_writes_into_one_deep_directory_receives_nothing_after_the_move(
        plan: Plan, monkeypatch, move: str) -> None:
    """p/q/r/ receives f0..f5 (rewritten, in order); after f2, an ancestor of p/q/r moves. What is
    written after that lands at the paths under the root, or the rollback stops; never in the
    moved tree, which a descriptor of p/q/r kept from before would reach."""
    for i in range(6):
        write(plan.root / f"p/q/r/f{i}.txt", f"target {i}\n")
        write(plan.root / f"s/q/r/f{i}.txt", f"sibling {i}\n")
    target = plan.checkpoint()
    for i in range(6):
        write(plan.root / f"p/q/r/f{i}.txt", f"changed {i}\n")
    plan.checkpoint()
    seen: dict[str, dict] = {}

    def attack() -> None:
        ANCESTOR_MOVES[move](plan)
        seen["outside"] = tree_state(plan.outside)
        seen["s"] = tree_state(plan.root / "s") if (plan.root / "s").is_dir() else {}

    before_workspace_call(monkeypatch, "p/q/r/f3.txt", attack)
    try:
        plan.rollback(target)
        error = None
    except CheckpointdError as exc:
        error = exc
    assert seen, "the attack never ran"
    assert tree_state(plan.outside) == seen["outside"], "the rollback wrote into the moved tree outside the root"
    now_s = tree_state(plan.root / "s") if (plan.root / "s").is_dir() else {}
    assert now_s == seen["s"], "the rollback wrote into the tree that moved away from p/"
    if error is None:
        for i in range(3, 6):
            assert (plan.root / f"p/q/r/f{i}.txt").read_text() == f"target {i}\n"
    else:
        assert error.reason is Reason.ROLLBACK_CONFLICT, error
