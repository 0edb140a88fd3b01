"""Per-plan locks that a busy plan cannot turn into a stalled server.

One plan's operations are serialized (capture to commit). A capture can take long (a huge
workspace, a slow disk) or hang (a file system that does not answer), and meanwhile the plan
stays locked. Were every further call for that plan to wait for the lock in a thread of the
server's pool, a client retrying it could take every thread and stall all plans. So a call
from the event loop never waits in a thread: it tries the lock in its thread; if the plan is
busy, the thread is given back, the call waits for the plan on the loop (costing no thread),
and runs again holding it. At most ``MAX_WAITERS`` calls wait per plan; more are answered
UNAVAILABLE with reason PLAN_BUSY, which clients retry with backoff.

Threads outside the loop (start-up recovery, retention) wait on the lock as before. The lock
is handed over in arrival order to loop and thread waiters alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from checkpointd.core.kernel.errors import Reason, Unavailable

T = TypeVar("T")

#: Calls of one plan that wait for it on the event loop at most; more are refused.
MAX_WAITERS = 64

#: How a caller on an event loop runs a blocking function: in a thread, awaiting its result.
RunBlocking = Callable[..., Awaitable[Any]]


class PlanBusy(Exception):
    """Raised inside a thread when its plan is busy and the call should wait on the loop instead."""

    def __init__(self, plan_id: str) -> None:
        super().__init__(plan_id)
        self.plan_id = plan_id


class _Waiter:
    """One caller waiting for a plan; ``grant`` hands it the lock (from any thread)."""

    __slots__ = ("grant", "granted", "on_loop")

    def __init__(self, grant: Callable[[], None], on_loop: bool) -> None:
        self.grant = grant
        self.granted = False
        self.on_loop = on_loop


class _Entry:
    """A plan whose lock is held, and who waits for it."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: deque[_Waiter] = deque()


class _Turn:
    """A plan's lock taken on the loop for a call about to run in a thread. Whoever claims it
    first owns it: the thread (which then runs the call and releases it) or, when the call is
    cancelled before its thread starts, the canceller (which releases it)."""

    __slots__ = ("plan_id", "_release", "_claim")

    def __init__(self, plan_id: str, release: Callable[[], None]) -> None:
        self.plan_id = plan_id
        self._release = release
        self._claim = threading.Lock()

    def claim(self) -> bool:
        return self._claim.acquire(blocking=False)

    def release(self) -> None:
        self._release()


class PlanLocks:
    def __init__(self, max_waiters: int = MAX_WAITERS) -> None:
        self._max_waiters = max_waiters
        self._guard = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._local = threading.local()

    # -- the lock ------------------------------------------------------------------------

    def try_acquire(self, plan_id: str) -> Callable[[], None] | None:
        """The plan's lock if no other operation holds or awaits it: its release, else None."""
        with self._guard:
            if plan_id in self._entries:
                return None
            self._entries[plan_id] = _Entry()
        return lambda: self._release(plan_id)

    def _release(self, plan_id: str) -> None:
        while True:
            with self._guard:
                entry = self._entries[plan_id]
                if not entry.waiters:
                    del self._entries[plan_id]
                    return
                waiter = entry.waiters.popleft()
                waiter.granted = True
            try:
                waiter.grant()
                return
            except RuntimeError:
                # Its event loop is closed: nobody will take the lock there; hand it on.
                with self._guard:
                    waiter.granted = False

    def _acquire_blocking(self, plan_id: str) -> None:
        woken = threading.Event()
        with self._guard:
            entry = self._entries.get(plan_id)
            if entry is None:
                self._entries[plan_id] = _Entry()
                return
            entry.waiters.append(_Waiter(woken.set, on_loop=False))
        woken.wait()

    async def _acquire_async(self, plan_id: str) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        granted = loop.create_future()

        def settle() -> None:
            if not granted.done():
                granted.set_result(None)

        waiter = _Waiter(lambda: loop.call_soon_threadsafe(settle), on_loop=True)
        with self._guard:
            entry = self._entries.get(plan_id)
            if entry is None:
                self._entries[plan_id] = _Entry()
                return lambda: self._release(plan_id)
            if sum(w.on_loop for w in entry.waiters) >= self._max_waiters:
                raise Unavailable(Reason.PLAN_BUSY,
                                  f"plan {plan_id} is busy with an earlier operation and {self._max_waiters} more "
                                  "calls wait for it; retry later", plan_id=plan_id)
            entry.waiters.append(waiter)
        try:
            await granted
        except BaseException:
            with self._guard:
                owned = waiter.granted
                if not owned and waiter in entry.waiters:
                    entry.waiters.remove(waiter)
            if owned:
                self._release(plan_id)
            raise
        return lambda: self._release(plan_id)

    # -- how operations take it ----------------------------------------------------------

    @contextlib.contextmanager
    def hold(self, plan_id: str) -> Iterator[None]:
        """Holds the plan's lock: the one taken on the loop for this call, else taken here;
        in a call from the loop (see ``run``), a busy plan raises PlanBusy instead of waiting."""
        turn: _Turn | None = getattr(self._local, "turn", None)
        if turn is not None and turn.plan_id == plan_id:
            self._local.turn = None
            release = turn.release
        elif getattr(self._local, "deferring", False):
            release = self.try_acquire(plan_id)
            if release is None:
                raise PlanBusy(plan_id)
        else:
            self._acquire_blocking(plan_id)
            release = lambda: self._release(plan_id)  # noqa: E731
        try:
            yield
        finally:
            release()

    def busy(self, plan_id: str) -> bool:
        return plan_id in self._entries

    async def run(self, run_blocking: RunBlocking, function: Callable[..., T], *arguments: Any,
                  plan_id: str = "") -> T:
        """``function(*arguments)`` in a thread, for a caller on the event loop: if it needs a
        busy plan, it waits for that plan on the loop, not in the thread, then runs again.
        ``plan_id``, when the caller knows the plan, spares a busy plan's callers the first try.
        The caller must not hold the lock of a plan ``function`` takes."""
        if not (plan_id and self.busy(plan_id)):
            try:
                return await run_blocking(self._first_try, function, *arguments)
            except PlanBusy as busy:
                plan_id = busy.plan_id
        turn = _Turn(plan_id, await self._acquire_async(plan_id))
        try:
            return await run_blocking(self._with_turn, turn, function, *arguments)
        except asyncio.CancelledError:
            if turn.claim():  # the thread never started: the lock is this caller's to release
                turn.release()
            raise

    def _first_try(self, function: Callable[..., T], *arguments: Any) -> T:
        self._local.deferring = True
        try:
            return function(*arguments)
        finally:
            self._local.deferring = False

    def _with_turn(self, turn: _Turn, function: Callable[..., T], *arguments: Any) -> T | None:
        if not turn.claim():
            return None  # cancelled before it started; the caller released the lock
        self._local.turn = turn
        try:
            return function(*arguments)
        finally:
            if self._local.turn is turn:  # the call ended before taking its plan's lock
                self._local.turn = None
                turn.release()
