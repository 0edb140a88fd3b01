"""Fault injection for the hardening tests: named points in the server's code where a test can
make the process die, stall or answer UNAVAILABLE, to prove what survives.

Every point is a no-op unless the server process was started with one of these variables
(each ``NAME:VALUE``; several faults separated by commas):

- ``CHECKPOINTD_CRASH_AT="NAME:N"``: SIGKILL itself the Nth time NAME is reached (1-based).
- ``CHECKPOINTD_SLOW_AT="NAME:SECONDS"``: sleep that long every time NAME is reached.
- ``CHECKPOINTD_UNAVAILABLE_AT="NAME:COUNT"``: the first COUNT times NAME is reached, fail the
  call with UNAVAILABLE (reason SHUTTING_DOWN, metadata fault=NAME).
- ``CHECKPOINTD_PAUSE_AT="NAME:N"``: the Nth time NAME is reached, create
  ``$CHECKPOINTD_FAULT_DIR/paused.NAME`` and wait (at most a minute) until the test creates
  ``$CHECKPOINTD_FAULT_DIR/resume.NAME``: a race made deterministic.

Point names are a closed list (``Point``); a variable naming anything else, or a malformed
value, stops the server at import time rather than silently testing nothing. Where each is
reached (under ``checkpointd/core/``): ``create.*`` in engine/create.py; ``rollback.*`` in
engine/rollback.py (``rollback.applied`` also in engine/recovery.py); ``restore.*`` in
restore/restorer.py; ``workspace.*`` in workspace/workspace.py; ``gc.listed`` in
maintenance/retention.py; ``compact.*`` in store/compaction.py.
"""

from __future__ import annotations

import enum
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from checkpointd.core.kernel.errors import Reason, Unavailable


class Point(enum.StrEnum):
    """Where a fault can be injected. The values are the names used in the variables."""

    #: CreateCheckpoint: the workspace was captured and its objects made durable; no row yet.
    CREATE_CAPTURED = "create.captured"
    #: CreateCheckpoint: the row is committed; the response is not sent yet.
    CREATE_COMMITTED = "create.committed"
    #: A small workspace file (a .gitignore) is read: once per directory during a capture.
    WORKSPACE_READ = "workspace.read"
    #: Rollback: the changes are planned and the safety checkpoint's objects are durable; no row yet.
    ROLLBACK_PLANNED = "rollback.planned"
    #: Rollback: the safety checkpoint and its journal entry are committed; no workspace change yet.
    ROLLBACK_SAFETY_COMMITTED = "rollback.safety_committed"
    #: Rollback (or its recovery): one workspace path is about to be removed, created or replaced.
    RESTORE_CHANGE = "restore.change"
    #: A restored file's content is written to its temporary name, not yet renamed into place.
    WORKSPACE_WRITE = "workspace.write"
    #: Rollback (not an undo): every change is written and renamed into place; none is synced yet
    #: (the batch's one sync point comes next).
    RESTORE_UNSYNCED = "restore.unsynced"
    #: Rollback: every change is applied; the journal entry is not deleted yet.
    ROLLBACK_APPLIED = "rollback.applied"
    #: Garbage collection: the candidates (objects no checkpoint referenced) are listed; nothing
    #: is deleted yet, and checkpoints, diffs and rollbacks go on meanwhile.
    GC_LISTED = "gc.listed"
    #: Pack compaction: the live records and carried tombstones are appended, not synced yet.
    COMPACT_COPIED = "compact.copied"
    #: Pack compaction: the copies are durable; the compacted pack is not removed yet.
    COMPACT_SYNCED = "compact.synced"


class FaultSpecError(ValueError):
    """A fault-injection variable names an unknown point or has a malformed value."""


class Action(enum.Enum):
    CRASH = "CHECKPOINTD_CRASH_AT"
    SLOW = "CHECKPOINTD_SLOW_AT"
    UNAVAILABLE = "CHECKPOINTD_UNAVAILABLE_AT"
    PAUSE = "CHECKPOINTD_PAUSE_AT"


FAULT_DIR_VARIABLE = "CHECKPOINTD_FAULT_DIR"
PAUSE_LIMIT_SECONDS = 60.0


@dataclass
class _Fault:
    action: Action
    value: float
    hits: int = 0


def _parse(environ: dict[str, str]) -> dict[Point, list[_Fault]]:
    faults: dict[Point, list[_Fault]] = {}
    for action in Action:
        for item in filter(None, (part.strip() for part in environ.get(action.value, "").split(","))):
            name, sep, raw = item.rpartition(":")
            try:
                point = Point(name)
                value = float(raw)
            except ValueError:
                known = ", ".join(p.value for p in Point)
                raise FaultSpecError(f"{action.value}={item!r}: expected NAME:NUMBER, NAME one of {known}") from None
            if not sep or value < 0 or (action is not Action.SLOW and value != int(value)):
                raise FaultSpecError(f"{action.value}={item!r}: the number must be a non-negative "
                                     f"{'duration' if action is Action.SLOW else 'integer'}")
            faults.setdefault(point, []).append(_Fault(action, value))
    if Action.PAUSE.value in environ and not environ.get(FAULT_DIR_VARIABLE):
        raise FaultSpecError(f"{Action.PAUSE.value} needs {FAULT_DIR_VARIABLE}, the directory of its handshake files")
    return faults


_FAULTS = _parse(dict(os.environ))
_lock = threading.Lock()


def active() -> bool:
    """Whether any fault is configured in this process (tests use it to refuse a wrong setup)."""
    return bool(_FAULTS)


def may_stall(*points: Point) -> bool:
    """Whether reaching one of ``points`` may wait (a SLOW or PAUSE fault is configured there):
    such a point must not be reached on an event loop, where it would stall every call."""
    return any(fault.action in (Action.SLOW, Action.PAUSE) for point in points for fault in _FAULTS.get(point, ()))


def crash_point(point: Point) -> None:
    """Reached at ``point``: does nothing unless a fault is configured for it."""
    faults = _FAULTS.get(point)
    if not faults:
        return
    for fault in faults:
        with _lock:
            fault.hits += 1
            hits = fault.hits
        if fault.action is Action.CRASH and hits == fault.value:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
        elif fault.action is Action.SLOW:
            time.sleep(fault.value)
        elif fault.action is Action.UNAVAILABLE and hits <= fault.value:
            raise Unavailable(Reason.SHUTTING_DOWN, f"fault injected at {point.value}: unavailable",
                              fault=point.value)
        elif fault.action is Action.PAUSE and hits == fault.value:
            _pause(point)


def _pause(point: Point) -> None:
    directory = Path(os.environ[FAULT_DIR_VARIABLE])
    (directory / f"paused.{point.value}").touch()
    resume = directory / f"resume.{point.value}"
    deadline = time.monotonic() + PAUSE_LIMIT_SECONDS
    while not resume.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
