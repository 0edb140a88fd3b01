"""Commit 156666d attacked: the journaled owner-write window of a read-only directory
(``core/workspace/windows.py``: ``Workspace._changing`` -> ``OpenedWindows`` -> ``JournalEntry.opened``,
set back by ``Workspace.close_window`` in ``Recovery.resume``) and an undo's journaled ``interim``
paths (``interim_paths``, ``plan_restore``'s ``keep``). The seven defects found were fixed by
journaling each window's close and its directory's identity, keeping a window open from a run's
first change in its directory to the run's end, taking a chmod made while the window is journaled
as the user's, and keeping an interim directory's mode step only for a directory as the undo's
mkdir leaves it; two tests changed with that (see their docstrings).

Kills are a forked child's ``os._exit`` (nothing of the rollback's ``finally`` runs) or, where no
window is open, ``_Killed`` raised at a fault point in process. Each defect is a strict xfail
asserting the correct behaviour and naming the code at fault; the attacks that hold are plain tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError
from sqlmodel import col, select

from checkpointd.core.engine import recovery as recovery_module
from checkpointd.core.kernel.errors import CheckpointdError, FailedPrecondition, Reason
from checkpointd.core.kernel.faults import Point
from checkpointd.core.kernel.vocabulary import Phase
from checkpointd.core.metadata.models import CheckpointRow
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.restore.journal import Goal
from checkpointd.core.workspace import workspace as workspace_module
from checkpointd.core.workspace.windows import Window
from checkpointd.core.workspace.workspace import Workspace
from tests.core.restore.test_rollback_changes_attacked import (
    _read_only_dir_workspace,
    _recover,
    _reopen,
)
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed, before_workspace_call, write
from tests.core.restore.test_undo_and_retry_attacked import _flip_file_to_dir
from tests.helpers import at_fault_point

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (as the other rollback attack files)")


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(os.lstat(path).st_mode))


def _in_a_child_killed(arm: Callable[[Callable[[], None]], None], run: Callable[[], None]) -> None:
    """Runs ``run`` in a forked child; ``arm(die)`` installs the hooks that call ``die`` (os._exit:
    no ``finally`` runs, as when the process is killed there)."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(30)

            def die() -> None:
                os._exit(9)

            arm(die)
            with contextlib.suppress(CheckpointdError):
                run()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 9, "the child did not die where it should"


def _at_nth_write(n: int) -> Callable[[Callable[[], None]], None]:
    """Arms a kill with the nth restored file's content at its temporary name (inside its directory's
    owner-write window when that directory is read-only)."""
    def arm(die: Callable[[], None]) -> None:
        at_fault_point(pytest.MonkeyPatch(), workspace_module, Point.WORKSPACE_WRITE, {n: die})
    return arm


def _newest_safety(plan: Plan) -> CheckpointRow:
    with plan.db.session() as session:
        return session.exec(select(CheckpointRow).where(CheckpointRow.plan_id == plan.plan_id,
                                                        CheckpointRow.phase == Phase.ROLLBACK_SAFETY.value)
                            .order_by(col(CheckpointRow.sequence).desc()).limit(1)).first()


def _user_rewrites_z_during_the_rollback(plan: Plan, monkeypatch) -> None:
    before_workspace_call(monkeypatch, "z.txt", lambda: write(plan.root / "z.txt", "the user's newer z\n"))


def _kill_at_the_undos_first_change(plan: Plan, monkeypatch) -> None:
    """In process: ``_Killed`` at the first restorer change after the undo's entry is journaled
    (before any of the undo's workspace changes: no window is open, nothing to unwind)."""
    journal = type(plan.engine.journal)
    real_put = journal.put
    undoing = [False]

    def put(self, entry, *args, **kwargs):
        if entry.goal is Goal.UNDO:
            undoing[0] = True
        return real_put(self, entry, *args, **kwargs)

    monkeypatch.setattr(journal, "put", put)
    real_point = restorer_module.crash_point

    def point(which, *args, **kwargs):
        if which is Point.RESTORE_CHANGE and undoing[0]:
            raise _Killed
        return real_point(which, *args, **kwargs)

    monkeypatch.setattr(restorer_module, "crash_point", point)


# -- 1. close_window: what stands at the journaled path now ----------------------------------------


def test_a_directory_the_user_put_in_place_of_the_killed_windows_directory_keeps_its_mode(plan: Plan) -> None:
    """A rollback of ro/f.txt alone is killed inside ro/'s window (ro/ 0755 for the moment). Before
    any server takes the plan over, the user moves ro/ aside and makes a new ro/ (0755, their file in
    it). The recovery finishes the rollback (f.txt into the new ro/): the new ro/ must stay 0755."""
    target = _read_only_dir_workspace(plan)
    _in_a_child_killed(_at_nth_write(1), lambda: plan.rollback(target, paths=("ro/f.txt",)))
    assert _mode(plan.root / "ro") == oct(0o755), "the kill was not in the window"
    os.rename(plan.root / "ro", plan.root / "ro.old")
    (plan.root / "ro").mkdir()
    os.chmod(plan.root / "ro", 0o755)
    write(plan.root / "ro/mine.txt", "the user's new file\n")
    _recover(plan)
    assert (plan.root / "ro/mine.txt").read_text() == "the user's new file\n"
    assert _mode(plan.root / "ro") == oct(0o755), "the user's new directory was made read-only"


def test_a_users_chmod_u_plus_w_after_the_kill_of_a_window_closed_normally_is_kept(plan: Plan) -> None:
    """A rollback of ro/f.txt and z.txt stops at z.txt (the user rewrote it) and its undo writes
    ro/f.txt back: ro/'s windows open and close (0555 again, each close journaled). The process dies
    after the undo's changes, before the entry goes; the user then runs `chmod u+w ro` (0755). No
    window is open any more: the recovery must leave 0755. (Written when closes were not journaled:
    the rollback's single window then made the kill land inside the undo's.)"""
    write(plan.root / "z.txt", "target z\n")
    target = _read_only_dir_workspace(plan)
    write(plan.root / "z.txt", "changed z\n")
    plan.checkpoint()
    before = plan.state()

    def arm(die: Callable[[], None]) -> None:
        mp = pytest.MonkeyPatch()
        before_workspace_call(mp, "z.txt", lambda: write(plan.root / "z.txt", "the user's newer z\n"))
        at_fault_point(mp, recovery_module, Point.ROLLBACK_APPLIED, {1: die})

    _in_a_child_killed(arm, lambda: plan.rollback(target, paths=("ro/f.txt", "z.txt")))
    assert (plan.root / "ro/f.txt").read_text() == "changed f\n", "the kill was not after the undo"
    assert _mode(plan.root / "ro") == oct(0o555), "ro/'s window was left open"
    assert plan.engine.journal.get(plan.plan_id).opened == ()
    os.chmod(plan.root / "ro", 0o755)
    _recover(plan)
    assert _mode(plan.root / "ro") == oct(0o755), "the user's chmod after the kill was undone"
    assert (plan.root / "ro/f.txt").read_bytes() == before["ro/f.txt"][1]


def test_a_users_chmod_while_the_window_is_being_journaled_is_kept(plan: Plan, monkeypatch) -> None:
    """ro/ is 0555; the rollback rewrites ro/f.txt. While the journal commits ro/'s window the user
    makes ro/ 0700 (a change after the rollback began: it wins, as for a chmod inside the window)."""
    target = _read_only_dir_workspace(plan)
    journal = type(plan.engine.journal)
    real_put = journal.put
    chmodded: list[int] = []

    def put(self, entry, *args, **kwargs):
        real_put(self, entry, *args, **kwargs)
        if entry.opened and not chmodded:
            chmodded.append(1)
            os.chmod(plan.root / "ro", 0o700)

    monkeypatch.setattr(journal, "put", put)
    plan.rollback(target)
    monkeypatch.undo()
    assert chmodded, "no window was journaled"
    assert (plan.root / "ro/f.txt").read_text() == "target f\n"
    assert _mode(plan.root / "ro") == oct(0o700), "the user's chmod during the journal commit was undone"


def test_an_undo_killed_after_its_mode_step_records_the_directorys_real_mode(plan: Plan) -> None:
    """a/d/ is the user's (0755), the target's is 0555 with other content. The rollback writes a/d/f.txt,
    makes a/d/ 0555, then stops at b/'s mode step (the user replaced b/ with a file) and undoes itself:
    its sweep for temporary files opens a/d/'s window (journaled as (a/d, 0555)) and closes it, a/d/f.txt
    goes back, then a/d/ back to 0755. The process
    dies before the entry goes. The recovery's safety checkpoint must record a/d/ as it is (0755); so must
    the workspace end."""
    write(plan.root / "a/d/f.txt", "target f\n")
    os.chmod(plan.root / "a/d", 0o555)
    (plan.root / "b").mkdir(mode=0o750)
    os.chmod(plan.root / "b", 0o750)
    target = plan.checkpoint()
    os.chmod(plan.root / "a/d", 0o755)
    os.chmod(plan.root / "b", 0o755)
    write(plan.root / "a/d/f.txt", "the user's f\n")
    plan.checkpoint()
    before = plan.state()

    def arm(die: Callable[[], None]) -> None:
        mp = pytest.MonkeyPatch()
        real = Workspace.set_dir_mode

        def set_dir_mode(self, path, mode):
            if path == "b" and (plan.root / "b").is_dir():
                (plan.root / "b").rmdir()
                write(plan.root / "b", "the user's file b\n")
            return real(self, path, mode)

        mp.setattr(Workspace, "set_dir_mode", set_dir_mode)
        at_fault_point(mp, recovery_module, Point.ROLLBACK_APPLIED, {1: die})

    _in_a_child_killed(arm, lambda: plan.rollback(target))
    assert plan.state()["a/d"] == ("dir", 0o755), "the kill was not after the undo's mode step"
    assert plan.engine.journal.get(plan.plan_id).opened == ()  # the sweep's window closed, and journaled so
    undoing = _newest_safety(plan)  # "before undoing": a/d/ 0555 then, as the rollback had made it
    again = _reopen(plan)  # a restarted server takes the plan over
    try:
        again.checkpoint()
        assert again.engine.journal.get(plan.plan_id) is None
        assert plan.state()["a/d"] == ("dir", 0o755)
        assert plan.state()["a/d/f.txt"] == before["a/d/f.txt"]
        newest = _newest_safety(again)
        assert newest.checkpoint_id == undoing.checkpoint_id or again.files_of(newest)["a/d"] == ("dir", 0o755), \
            "the recovery's safety checkpoint records a mode a/d/ never had"
    finally:
        again.close()


# -- 2. interim paths: what the user did there after the kill ---------------------------------------


def test_a_directory_the_user_made_where_a_killed_undo_was_to_remake_one_keeps_its_mode(
        plan: Plan, monkeypatch) -> None:
    """The rollback removes d/ (0755, d/f.txt; the target lacks it), stops at z.txt and undoes itself;
    the undo dies before its first change. The user then makes d/ again, private (0700), with a file
    of theirs. The next taker finishes the undo: d/ must stay 0700 (the user's directory)."""
    write(plan.root / "z.txt", "target z\n")
    target = plan.checkpoint()
    write(plan.root / "d/f.txt", "precious f\n")
    os.chmod(plan.root / "d", 0o755)
    write(plan.root / "z.txt", "changed z\n")
    plan.checkpoint()
    _user_rewrites_z_during_the_rollback(plan, monkeypatch)
    _kill_at_the_undos_first_change(plan, monkeypatch)
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    assert not (plan.root / "d").exists(), "the kill was not before the undo remade d/"
    assert "d" in plan.engine.journal.get(plan.plan_id).interim
    (plan.root / "d").mkdir(mode=0o700)
    os.chmod(plan.root / "d", 0o700)
    write(plan.root / "d/mine.txt", "the user's private file\n")
    plan.checkpoint()
    assert plan.engine.journal.get(plan.plan_id) is None
    assert (plan.root / "d/mine.txt").read_text() == "the user's private file\n"
    assert _mode(plan.root / "d") == oct(0o700), "the user's private directory was opened to 0755"


def test_a_path_the_user_emptied_before_the_killed_undo_reached_it_gets_the_users_file_back(
        plan: Plan, monkeypatch) -> None:
    """The target has p/ (a directory); the user's p is a file. The rollback makes p/ a directory,
    stops at z.txt and undoes itself; the undo dies before its first change. The user deletes p/ (the
    rollback's directory, not theirs). The next taker finishes the undo as a live undo does when p/
    is deleted before it gets there (its removal finds nothing, and the file goes back): the user's
    file p is back. (Reported as a defect first: keep's 'a deletion wins' is for what the rollback
    wrote being the user's choice to delete; here the undo journaled p as its own to empty.)"""
    target = _flip_file_to_dir(plan)
    _user_rewrites_z_during_the_rollback(plan, monkeypatch)
    _kill_at_the_undos_first_change(plan, monkeypatch)
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    assert (plan.root / "p/x.txt").exists(), "the kill was not before the undo's first change"
    assert "p" in plan.engine.journal.get(plan.plan_id).interim
    shutil.rmtree(plan.root / "p")
    plan.checkpoint()
    assert plan.engine.journal.get(plan.plan_id) is None
    assert (plan.root / "p").read_text() == "the user's precious p\n"


# -- 3. attacks that hold ---------------------------------------------------------------------------


@pytest.mark.parametrize("swap", ["symlink", "ancestor-symlink", "file", "fifo", "missing", "writable-bit-journaled"])
def test_close_window_touches_only_a_directory_at_the_path_and_never_follows_a_link(tmp_path: Path, swap: str) -> None:
    """close_window on a path that is now a symlink to a 0755 directory outside, below a symlinked
    ancestor, a file, a FIFO or nothing: False, nothing changed anywhere (and a journaled mode that
    already has u+w is never acted on)."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    (outside / "ro").mkdir(parents=True)
    os.chmod(outside / "ro", 0o755)
    path = "a/ro"
    mode = 0o555
    if swap == "symlink":
        os.symlink(outside / "ro", root / "a/ro")
    elif swap == "ancestor-symlink":
        os.rmdir(root / "a")
        os.symlink(outside, root / "a")
    elif swap == "file":
        write(root / "a/ro", "a file now\n", 0o755)
    elif swap == "fifo":
        os.mkfifo(root / "a/ro", 0o755)
    elif swap == "writable-bit-journaled":
        (root / "a/ro").mkdir()
        os.chmod(root / "a/ro", 0o755)
        mode = 0o755
    st = os.lstat(root / "a") if swap != "ancestor-symlink" else os.stat(outside)
    assert Workspace(str(root)).close_window(Window(path, mode, st.st_dev, st.st_ino)) is False
    assert _mode(outside / "ro") == oct(0o755)
    if os.path.lexists(root / "a/ro"):
        assert _mode(root / "a/ro") in (oct(0o755), oct(0o777))  # a symlink's own bits are 0777


def test_a_window_directory_swapped_for_a_link_outside_after_the_kill_is_never_chmodded(plan: Plan) -> None:
    """The kill leaves ro/ writable; the user moves ro/ out of the root and puts a symlink to it in its
    place. The takeover must never set the mode outside the root (the link is not followed)."""
    target = _read_only_dir_workspace(plan)
    _in_a_child_killed(_at_nth_write(1), lambda: plan.rollback(target, paths=("ro/f.txt",)))
    os.rename(plan.root / "ro", plan.outside / "ro")
    os.symlink(plan.outside / "ro", plan.root / "ro")
    again = _reopen(plan)
    try:
        again.checkpoint()
    finally:
        again.close()
    assert _mode(plan.outside / "ro") == oct(0o755), "the recovery followed the link and chmod-ed outside the root"
    assert (plan.outside / "ro/f.txt").read_text() == "changed f\n", "the recovery wrote outside the root"


@pytest.mark.parametrize("nth", [1, 2])
def test_nested_read_only_directories_killed_in_either_window_are_both_read_only_again(plan: Plan, nth: int) -> None:
    """ro/ (0555) holds g.txt and sub/ (0555) holding f.txt; both files are rewritten. The process dies
    in the first or the second window; the restarted server finishes: both 0555, both files the target's."""
    write(plan.root / "ro/g.txt", "target g\n")
    write(plan.root / "ro/sub/f.txt", "target f\n")
    os.chmod(plan.root / "ro/sub", 0o555)
    os.chmod(plan.root / "ro", 0o555)
    target = plan.checkpoint()
    for d in ("ro", "ro/sub"):
        os.chmod(plan.root / d, 0o755)
    write(plan.root / "ro/g.txt", "changed g\n")
    write(plan.root / "ro/sub/f.txt", "changed f\n")
    os.chmod(plan.root / "ro/sub", 0o555)
    os.chmod(plan.root / "ro", 0o555)
    plan.checkpoint()
    try:
        _in_a_child_killed(_at_nth_write(nth), lambda: plan.rollback(target, paths=("ro/g.txt", "ro/sub/f.txt")))
        _recover(plan)
        assert plan.state() == plan.files_of(target)
    finally:
        for d in ("ro", "ro/sub"):
            with contextlib.suppress(OSError):
                os.chmod(plan.root / d, 0o755)


def test_a_recovery_killed_in_its_own_window_is_finished_by_the_next_with_the_mode_back(plan: Plan) -> None:
    """A scoped rollback dies in ro/'s window; the restarted server's recovery dies in the same window
    (its own write of ro/f.txt); a third takes over: ro/ 0555, f.txt the target's, no entry left."""
    target = _read_only_dir_workspace(plan)
    _in_a_child_killed(_at_nth_write(1), lambda: plan.rollback(target, paths=("ro/f.txt",)))

    def recover_in_child() -> None:
        again = _reopen(plan)
        again.checkpoint()

    _in_a_child_killed(_at_nth_write(1), recover_in_child)
    assert _mode(plan.root / "ro") == oct(0o755), "the recovery was not killed in its window"
    _recover(plan)
    assert (plan.root / "ro/f.txt").read_text() == "target f\n"
    assert _mode(plan.root / "ro") == oct(0o555)


def test_the_same_window_journaled_twice_is_set_back_once_and_the_entry_finishes(plan: Plan) -> None:
    """An entry naming (ro, 0555) twice (and once more, another mode of ro) is resumed without error:
    ro/ 0555 again."""
    from dataclasses import replace

    target = _read_only_dir_workspace(plan)
    _in_a_child_killed(_at_nth_write(1), lambda: plan.rollback(target, paths=("ro/f.txt",)))
    journal = plan.engine.journal
    entry = journal.get(plan.plan_id)
    (window,) = entry.opened
    assert (window.path, window.mode) == ("ro", 0o555)
    journal.put(replace(entry, opened=(window, window._replace(mode=0o500), window)))
    _recover(plan)
    assert (plan.root / "ro/f.txt").read_text() == "target f\n"
    assert _mode(plan.root / "ro") == oct(0o555)


@pytest.mark.parametrize("paths", [(), ("ro",)])
def test_a_recovery_killed_after_its_mode_step_set_exactly_mode_plus_u_w_ends_on_the_target(
        plan: Plan, paths: tuple[str, ...]) -> None:
    """ro/ is 0555 now, 0755 in the target (exactly 0555|u+w). The rollback dies before its first change;
    the takeover opens ro/'s window to look for temporary files (journaled as (ro, 0555)), makes ro/
    0755 and dies before the entry goes. The next takeover's close_window takes 0755 for an open
    window and sets 0555, but plans ro/'s mode step again: ro/ ends 0755, the target's."""
    write(plan.root / "ro/f.txt", "target f\n")
    os.chmod(plan.root / "ro", 0o755)
    target = plan.checkpoint()
    write(plan.root / "ro/f.txt", "changed f\n")
    os.chmod(plan.root / "ro", 0o555)
    plan.checkpoint()

    def at_first_change(die: Callable[[], None]) -> None:
        at_fault_point(pytest.MonkeyPatch(), restorer_module, Point.RESTORE_CHANGE, {1: die})

    def at_recovery_applied(die: Callable[[], None]) -> None:
        at_fault_point(pytest.MonkeyPatch(), recovery_module, Point.ROLLBACK_APPLIED, {1: die})

    _in_a_child_killed(at_first_change, lambda: plan.rollback(target, paths=paths))
    _in_a_child_killed(at_recovery_applied, lambda: _reopen(plan).checkpoint())
    assert plan.engine.journal.get(plan.plan_id).opened == ()  # the sweep's window closed, and journaled so
    assert _mode(plan.root / "ro") == oct(0o755)
    _recover(plan)
    assert plan.state() == plan.files_of(target)


def test_the_interim_paths_the_journal_cannot_record_stop_the_undo_clearly_and_it_finishes_later(
        plan: Plan, monkeypatch) -> None:
    """The undo of a rollback that made the user's file p a directory must journal p as interim first;
    the database refuses that put. The rollback's error is a clear FailedPrecondition (the undo failed
    too), nothing of the undo was done, and the plan's next use finishes it: p is the user's file."""
    target = _flip_file_to_dir(plan)
    before = plan.state()
    _user_rewrites_z_during_the_rollback(plan, monkeypatch)
    journal = type(plan.engine.journal)
    real_put = journal.put

    def put(self, entry, *args, **kwargs):
        if entry.interim:
            raise OperationalError("INSERT", {}, Exception("disk I/O error"))
        return real_put(self, entry, *args, **kwargs)

    monkeypatch.setattr(journal, "put", put)
    with pytest.raises(FailedPrecondition) as raised:
        plan.rollback(target)
    monkeypatch.undo()
    assert raised.value.reason is Reason.ROLLBACK_CONFLICT
    assert "undoing it failed too" in raised.value.message, raised.value.message
    assert (plan.root / "p/x.txt").read_text() == "target x\n", "the undo changed something unjournaled"
    plan.checkpoint()
    assert plan.engine.journal.get(plan.plan_id) is None
    assert plan.state()["p"] == before["p"]
    assert plan.state()["z.txt"][1] == b"the user's newer z\n"


def test_a_file_the_user_puts_where_a_killed_undo_emptied_an_interim_path_is_kept(plan: Plan, monkeypatch) -> None:
    """The undo removes the rollback's directory p/ (to put the user's file p back) and dies before the
    write; the user then writes a new file p. The takeover must keep the user's new file (interim keeps
    only an empty path or a directory)."""
    target = _flip_file_to_dir(plan)
    _user_rewrites_z_during_the_rollback(plan, monkeypatch)
    undoing = [False]
    real_put = type(plan.engine.journal).put

    def put(self, entry, *args, **kwargs):
        undoing[0] = undoing[0] or entry.goal is Goal.UNDO
        return real_put(self, entry, *args, **kwargs)

    monkeypatch.setattr(type(plan.engine.journal), "put", put)
    real_write = Workspace.write_file

    def write_file(self, path, *args, **kwargs):
        if path == "p" and undoing[0]:
            raise _Killed
        return real_write(self, path, *args, **kwargs)

    monkeypatch.setattr(Workspace, "write_file", write_file)
    with pytest.raises(_Killed):
        plan.rollback(target)
    monkeypatch.undo()
    assert not os.path.lexists(plan.root / "p"), "the kill was not between the undo's removal and write"
    write(plan.root / "p", "the user's newest p\n")
    plan.checkpoint()
    assert plan.engine.journal.get(plan.plan_id) is None
    assert (plan.root / "p").read_text() == "the user's newest p\n"


def test_an_entry_of_the_format_before_windows_is_resumed_and_finished(plan: Plan) -> None:
    """The kill leaves an entry; it is rewritten as a server before 156666d wrote it (no ``opened``, no
    ``interim`` keys). The takeover reads it and finishes the rollback (the window it cannot know of
    stays as the kill left it)."""
    from sqlalchemy import update

    from checkpointd.core.metadata.models import RollbackJournalRow

    target = _read_only_dir_workspace(plan)
    _in_a_child_killed(_at_nth_write(1), lambda: plan.rollback(target, paths=("ro/f.txt",)))
    table = RollbackJournalRow.__table__
    with plan.db.session() as session:
        body = dict(session.connection().execute(select(table.c.entry).where(
            table.c.plan_id == plan.plan_id)).scalar_one())
        assert [opened[:2] for opened in body.pop("opened")] == [["ro", 0o555]]
        body.pop("opened_born_ns", None)
        assert "interim" not in body
        session.connection().execute(update(table).where(table.c.plan_id == plan.plan_id).values(entry=body))
        session.commit()
    _recover(plan)
    assert (plan.root / "ro/f.txt").read_text() == "target f\n"
