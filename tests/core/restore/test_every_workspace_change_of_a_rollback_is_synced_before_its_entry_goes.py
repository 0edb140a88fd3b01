"""Every workspace change a rollback makes (and its undo, and whoever finishes either after a
kill) is covered by a later sync before the rollback lets go of its journal entry, or is
acknowledged: checked by the durability oracle (``durability_oracle``), which records the
server's modifying system calls and its syncs, over many workspaces and ways a rollback ends:
clean, a write racing it (ROLLBACK_CONFLICT, undone), killed at each restore fault point and
finished by the next checkpoint, an undo killed part-way and finished."""

from __future__ import annotations

import contextlib
import errno
import os

import pytest

from checkpointd.core.engine import rollback as rollback_module
from checkpointd.core.engine.restoring import OpenedWindows
from checkpointd.core.kernel.errors import CheckpointdError
from checkpointd.core.kernel.faults import Point
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace import workspace as workspace_module
from checkpointd.core.workspace.workspace import Workspace
from tests.core.restore.durability_oracle import DurabilityOracle, Layout, lay_out, make_writable
from tests.core.restore.test_rollback_write_path_attacked import Plan, _Killed
from tests.helpers import at_fault_point


def F(content: str, mode: int = 0o644) -> tuple:
    return ("file", content.encode(), mode)


def D(mode: int = 0o755) -> tuple:
    return ("dir", mode)


def L(target: str) -> tuple:
    return ("link", target)


FILES_AND_LINKS = (
    {"a.txt": F("target a\n"), "d": D(), "d/b.txt": F("target b\n"), "d/e": D(), "d/e/c.txt": F("target c\n"),
     "l": L("a.txt"), "d/l": L("b.txt")},
    {"a.txt": F("changed a, longer\n"), "d": D(), "d/new.txt": F("new since\n"), "l": L("elsewhere"),
     "d/l": F("a file now\n"), "x": D(), "x/y.txt": F("y\n")},
)

#: name -> (target layout, the layout rolled back from, paths of the rollback)
SCENARIOS: dict[str, tuple[Layout, Layout, tuple[str, ...]]] = {
    "files and links": (*FILES_AND_LINKS, ()),
    "scoped to a directory": (*FILES_AND_LINKS, ("d",)),
    "new and removed directories": (
        {"t": D(0o750), "t/u": D(0o700), "t/u/f.txt": F("f\n"), "keep.txt": F("keep\n")},
        {"keep.txt": F("keep\n"), "r": D(), "r/s": D(), "r/s/g.txt": F("g\n")}, ()),
    "read-only directories": (
        {"ro": D(0o555), "ro/f.txt": F("target f\n"), "ro/sub": D(0o500), "ro/sub/g.txt": F("target g\n")},
        {"ro": D(0o555), "ro/f.txt": F("changed f\n"), "ro/new.txt": F("new\n"), "ro/sub": D(0o500),
         "ro/sub/g.txt": F("changed g\n")}, ()),
    "a file mode only": ({"f.txt": F("same\n", 0o600)}, {"f.txt": F("same\n", 0o644)}, ()),
    "a directory mode only": ({"d": D(0o750), "d/f.txt": F("same\n")}, {"d": D(0o755), "d/f.txt": F("same\n")}, ()),
    "kinds flipped": (
        {"p": F("p is a file\n"), "q": D(), "q/in.txt": F("in q\n"), "s": L("p")},
        {"p": D(), "p/in.txt": F("in p\n"), "q": F("q is a file\n"), "s": F("s is a file\n")}, ()),
    "many files in early flushed batches": (
        {"m": D(), **{f"m/{i}.txt": F(f"target {i}\n") for i in range(12)}},
        {"m": D(), **{f"m/{i}.txt": F(f"changed {i}, longer\n") for i in range(12)}}, ()),
    "many files in a read-only directory": (
        {"ro": D(0o555), **{f"ro/{i}.txt": F(f"target {i}\n") for i in range(9)}},
        {"ro": D(0o555), "ro/new.txt": F("new\n"), **{f"ro/{i}.txt": F(f"changed {i}, longer\n") for i in range(9)}},
        ()),
}

KILLS = {
    "at the 2nd change": (restorer_module, Point.RESTORE_CHANGE, 2),
    "with the 1st file at its temporary name": (workspace_module, Point.WORKSPACE_WRITE, 1),
    "renamed into place, unsynced": (restorer_module, Point.RESTORE_UNSYNCED, 1),
    "applied, entry not removed": (rollback_module, Point.ROLLBACK_APPLIED, 1),
}

WAYS = ["clean", "raced", *(f"killed {k}" for k in KILLS), "a kill leaving a directory's window open",
        "undo killed at its 1st change", "undo killed at its 2nd change", "disk full from the 2nd file on"]


def _disk_full_from_the_second_file(mp: pytest.MonkeyPatch, root: str) -> None:
    """Every write to a workspace file after the first file's fails with ENOSPC (the undo's
    included: it fails too, and is finished by the next checkpoint)."""
    real_write, files = os.write, []

    def write(fd: int, data) -> int:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if path.startswith(root + "/"):
            if path not in files:
                files.append(path)
            if len(files) > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    mp.setattr(os, "write", write)


@pytest.fixture
def oracle(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> DurabilityOracle:
    found = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)
    yield found
    make_writable(str(plan.root))


#: Set once a kill is on its way up: what a real kill would not run (finally blocks) does nothing.
_killed: list[bool] = []


def _die() -> None:
    _killed.append(True)
    raise _Killed


def _journaled_closed_unless_killed(closed):
    """``OpenedWindows.closed``, skipped while a kill unwinds (``windows_open``'s finally journals
    the windows closed; a killed process journals nothing: its entry keeps naming them)."""
    def wrapped(windows, window) -> None:
        if not _killed:
            closed(windows, window)
    return wrapped


def run(plan: Plan, oracle: DurabilityOracle, target: Layout, current: Layout, paths: tuple[str, ...],
        way: str) -> dict:
    """Lays out ``target``, checkpoints it, lays out ``current``, rolls back the way ``way`` says and
    lets the next checkpoint finish what is left. Returns what the target checkpoint holds."""
    with oracle.user():
        lay_out(str(plan.root), target)
    row = plan.checkpoint()
    with oracle.user():
        lay_out(str(plan.root), current)
    plan.checkpoint()

    def race() -> None:
        with oracle.user():
            for directory, _dirs, files in os.walk(plan.root):
                for name in files:
                    if os.path.islink(os.path.join(directory, name)):
                        continue
                    with open(os.path.join(directory, name), "ab") as f:
                        f.write(b" and the user's raced write\n")

    _killed.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OpenedWindows, "closed", _journaled_closed_unless_killed(OpenedWindows.closed))
        if way == "raced":
            at_fault_point(mp, restorer_module, Point.RESTORE_CHANGE, {2: race})
        elif way.startswith("killed "):
            module, point, nth = KILLS[way.removeprefix("killed ")]
            at_fault_point(mp, module, point, {nth: _die})
        elif way == "a kill leaving a directory's window open":
            # A real kill runs no finally: the window's mode is not set back.
            mp.setattr(Workspace, "_close", lambda self, window, fd: _die())
        elif way == "disk full from the 2nd file on":
            _disk_full_from_the_second_file(mp, str(plan.root))
        elif way.startswith("undo killed"):
            nth = 3 if "1st" in way else 4
            at_fault_point(mp, restorer_module, Point.RESTORE_CHANGE, {2: race, nth: _die})
        with contextlib.suppress(CheckpointdError, _Killed):
            plan.rollback(row, paths=list(paths))
    _killed.clear()
    plan.checkpoint()  # takes the plan over: finishes (or undoes) what a kill left
    assert plan.engine.journal.get(plan.plan_id) is None
    return plan.files_of(row)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_change_is_synced_before_the_rollback_lets_go_of_it(
        plan: Plan, oracle: DurabilityOracle, monkeypatch: pytest.MonkeyPatch, scenario: str, way: str) -> None:
    target, current, paths = SCENARIOS[scenario]
    if scenario.startswith("many files"):
        monkeypatch.setattr(syncbatch, "MAX_PENDING", 5)
    closed = _windows_closed_by_the_finisher(monkeypatch)
    expected = run(plan, oracle, target, current, paths, way)
    if way == "a kill leaving a directory's window open" and "read-only" in scenario:
        assert closed, "no window was left open for the finisher to close"
    assert oracle.changes, "the oracle recorded no change: it watched nothing"
    assert oracle.moments, "the oracle never checked"
    oracle.assert_durable()
    if way == "clean" or way.startswith(("killed ", "a kill")):
        _assert_holds(plan, expected, paths)


def _windows_closed_by_the_finisher(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    closed: list[str] = []
    real = Workspace.close_window

    def close_window(self, window):
        done = real(self, window)
        if done:
            closed.append(window.path)
        return done

    monkeypatch.setattr(Workspace, "close_window", close_window)
    return closed


def _assert_holds(plan: Plan, expected: dict, paths: tuple[str, ...]) -> None:
    state = plan.state()
    assert {p: v for p, v in state.items() if not paths or p.startswith(paths)} == \
        {p: v for p, v in expected.items() if not paths or p.startswith(paths)}


@pytest.mark.parametrize("way", ["clean", "raced", "killed renamed into place, unsynced"])
@pytest.mark.parametrize("scenario", ["files and links", "new and removed directories", "read-only directories",
                                      "many files in early flushed batches"])
def test_without_a_syncfs_that_reports_errors_every_change_is_still_synced(
        plan: Plan, oracle: DurabilityOracle, monkeypatch: pytest.MonkeyPatch, scenario: str, way: str) -> None:
    """Batches are then synced file by file, and a finisher calls sync(2)."""
    monkeypatch.setattr(syncbatch, "_libc_syncfs", None)
    target, current, paths = SCENARIOS[scenario]
    if scenario.startswith("many files"):
        monkeypatch.setattr(syncbatch, "MAX_PENDING", 5)
    expected = run(plan, oracle, target, current, paths, way)
    assert not any(s.device is not None for s in oracle.syncs), "a syncfs was counted though it is missing"
    oracle.assert_durable()
    if way != "raced":
        _assert_holds(plan, expected, paths)
