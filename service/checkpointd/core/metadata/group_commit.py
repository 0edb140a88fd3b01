"""Group commit: the checkpoint rows of concurrent callers written in one transaction."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from checkpointd.core.kernel import telemetry
from checkpointd.core.metadata.rows import RowWriter

log = logging.getLogger("checkpointd.db")
U = TypeVar("U")


class _Unit(Generic[U]):
    __slots__ = ("item", "finished", "error", "prepare", "future")

    def __init__(self, item: U, prepare: Callable[[], None] | None = None, future: Future[None] | None = None) -> None:
        self.item = item
        self.finished = False
        self.error: BaseException | None = None
        #: Work the committing thread does for this item before its transaction (see ``submit_nowait``).
        self.prepare = prepare
        #: Set for items submitted without waiting: completed when the item is written or has failed.
        self.future = future


class GroupCommit(Generic[U]):
    """Group commit: items submitted by concurrent callers are written together, in one
    transaction, so one commit (one log fsync) and one statement per table serve every item
    waiting at that moment.

    The first caller of ``submit`` to find no group running leads one with every item queued so
    far, its own included; the others wait for theirs to be written or for their turn to lead. A
    caller alone pays nothing extra. Callers that must not block (an event loop) use
    ``submit_nowait``; a thread of the group commit's own leads when no caller does.
    ``write(rows, items)`` writes a group. If a group's transaction fails, each of its items is
    written again alone, so one item's error (a request_id taken before) fails only that item;
    ``write`` must therefore not change anything outside the database that a second run would not set again.
    """

    def __init__(self, transaction: Callable[[], contextlib.AbstractContextManager[RowWriter]],
                 write: Callable[[RowWriter, list[U]], None]) -> None:
        self._transaction = transaction
        self._write = write
        self._queue: list[_Unit[U]] = []
        self._leading = False
        guard = threading.Lock()
        self._turn = threading.Condition(guard)
        #: Wakes the group commit's own thread: items of ``submit_nowait`` wait and nobody leads.
        self._unled = threading.Condition(guard)
        self._committer: threading.Thread | None = None
        self._closed = False

    def submit(self, item: U) -> None:
        """Returns once ``item`` is committed; raises what writing it raised."""
        unit = _Unit(item)
        with self._turn:
            self._queue.append(unit)
            while self._leading and not unit.finished:
                self._turn.wait()
            if not unit.finished:
                self._leading = True
                group, self._queue = self._queue, []
        if not unit.finished:
            self._lead(group)
        if unit.error is not None:
            raise unit.error

    def submit_nowait(self, item: U, prepare: Callable[[], None] | None = None) -> Future[None]:
        """Queues ``item`` and returns at once: the future completes when the item is committed
        (or fails with what writing it raised). ``prepare`` runs on the committing thread before
        the item's transaction, so that a caller that must not block hands its blocking work over
        (making durable the objects the item references); if it raises, the item fails alone."""
        unit = _Unit(item, prepare, Future())
        with self._turn:
            if self._closed:
                raise RuntimeError("the group commit is closed")
            self._queue.append(unit)
            if self._committer is None:
                self._committer = threading.Thread(target=self._lead_unled, name="group-commit", daemon=True)
                self._committer.start()
            if not self._leading:
                self._unled.notify()
        return unit.future

    def close(self) -> None:
        """Ends the group commit's own thread once the items queued without waiting are written."""
        with self._turn:
            self._closed = True
            self._unled.notify()
            committer = self._committer
        if committer is not None:
            committer.join()

    def _lead_unled(self) -> None:
        while True:
            with self._turn:
                while self._leading or not self._queue:
                    if self._closed and not self._queue:
                        return
                    self._unled.wait()
                self._leading = True
                group, self._queue = self._queue, []
            self._lead(group)

    def _lead(self, group: list[_Unit[U]]) -> None:
        try:
            self._apply(group)
        finally:
            with self._turn:
                self._leading = False
                self._turn.notify_all()
                if self._queue:
                    self._unled.notify()

    def _apply(self, group: list[_Unit[U]]) -> None:
        ready = []
        for unit in group:
            if unit.prepare is not None:
                try:
                    unit.prepare()
                except BaseException as exc:
                    self._finish(unit, exc)
                    continue
                # A lone second attempt (below) does not prepare again.
                unit.prepare = None
            ready.append(unit)
        if not ready:
            return
        started = time.perf_counter()
        try:
            with self._transaction() as rows:
                self._write(rows, [unit.item for unit in ready])
        except BaseException as exc:
            if len(ready) == 1 or not isinstance(exc, Exception):
                for unit in ready:
                    self._finish(unit, exc)
                return
            for unit in ready:
                self._apply([unit])
            return
        telemetry.made_durable(telemetry.Durable.METADATA, time.perf_counter() - started)
        for unit in ready:
            self._finish(unit, None)

    @staticmethod
    def _finish(unit: _Unit[U], error: BaseException | None) -> None:
        unit.error, unit.finished = error, True
        if unit.future is None:
            return
        if error is None:
            unit.future.set_result(None)
        else:
            unit.future.set_exception(error)
