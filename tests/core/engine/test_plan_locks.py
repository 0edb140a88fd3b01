"""PlanLocks: callers on an event loop wait for a busy plan without holding a thread, are
refused past the waiting limit, and a cancelled waiter never leaks or double-releases a lock."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import pytest

from checkpointd.core.engine.plan_locks import PlanLocks
from checkpointd.core.kernel.errors import Reason, Unavailable


def blocking_hold(locks: PlanLocks, plan_id: str, entered: threading.Event, leave: threading.Event) -> str:
    with locks.hold(plan_id):
        entered.set()
        assert leave.wait(30)
    return "held"


def work(locks: PlanLocks, plan_id: str, log: list[str], tag: str) -> str:
    with locks.hold(plan_id):
        log.append(tag)
    return tag


def test_calls_for_a_busy_plan_wait_on_the_loop_and_leave_the_threads_to_other_plans():
    locks, log = PlanLocks(), []
    entered, leave = threading.Event(), threading.Event()
    with futures.ThreadPoolExecutor(2) as pool:
        holder = pool.submit(blocking_hold, locks, "busy", entered, leave)
        assert entered.wait(10)

        async def scenario():
            loop = asyncio.get_running_loop()

            def in_thread(function, *arguments):
                return loop.run_in_executor(pool, function, *arguments)

            waiting = [asyncio.create_task(locks.run(in_thread, work, locks, "busy", log, f"w{i}")) for i in range(10)]
            # One thread is left, and it serves another plan at once: no waiter holds it.
            other = await asyncio.wait_for(locks.run(in_thread, work, locks, "other", log, "other"), 10)
            assert other == "other" and not any(t.done() for t in waiting)
            leave.set()
            return await asyncio.wait_for(asyncio.gather(*waiting), 30)

        assert asyncio.run(scenario()) == [f"w{i}" for i in range(10)], "waiters are served in arrival order"
        assert holder.result(10) == "held"
    assert log == ["other", *(f"w{i}" for i in range(10))]
    assert locks._entries == {}


def test_waiters_past_the_limit_are_refused_plan_busy():
    locks = PlanLocks(max_waiters=2)
    release = locks.try_acquire("p")

    async def scenario():
        loop = asyncio.get_running_loop()

        def in_thread(function, *arguments):
            return loop.run_in_executor(None, function, *arguments)

        waiting = [asyncio.create_task(locks.run(in_thread, work, locks, "p", [], i, plan_id="p")) for i in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Unavailable) as refused:  # at once: a call let wait would time out
            await asyncio.wait_for(locks.run(in_thread, work, locks, "p", [], 3, plan_id="p"), 5)
        assert refused.value.reason is Reason.PLAN_BUSY and refused.value.metadata["plan_id"] == "p"
        release()
        return await asyncio.wait_for(asyncio.gather(*waiting), 10)

    assert asyncio.run(scenario()) == [0, 1]
    assert locks._entries == {}


def test_a_cancelled_waiter_leaves_the_lock_to_the_next_and_nothing_leaks():
    locks, log = PlanLocks(), []
    release = locks.try_acquire("p")

    async def scenario():
        loop = asyncio.get_running_loop()

        def in_thread(function, *arguments):
            return loop.run_in_executor(None, function, *arguments)

        first = asyncio.create_task(locks.run(in_thread, work, locks, "p", log, "first", plan_id="p"))
        second = asyncio.create_task(locks.run(in_thread, work, locks, "p", log, "second", plan_id="p"))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        release()
        return await asyncio.wait_for(second, 10)

    assert asyncio.run(scenario()) == "second"
    assert log == ["second"] and locks._entries == {}


def test_a_call_cancelled_between_its_turn_and_its_thread_releases_the_turn():
    """The lock was handed to the call, whose thread had not started when it was cancelled:
    the canceller releases it, and the thread, if it starts, does nothing."""
    locks, log = PlanLocks(), []
    release = locks.try_acquire("p")
    gate = threading.Event()
    with futures.ThreadPoolExecutor(1) as pool:
        pool.submit(gate.wait, 30)  # the only thread is busy: the call's thread cannot start

        async def scenario():
            loop = asyncio.get_running_loop()
            submitted = asyncio.Event()

            def in_thread(function, *arguments):
                submitted.set()
                return loop.run_in_executor(pool, function, *arguments)

            call = asyncio.create_task(locks.run(in_thread, work, locks, "p", log, "cancelled", plan_id="p"))
            await asyncio.sleep(0)
            release()  # handed to the waiting call, which now waits for a thread
            await asyncio.wait_for(submitted.wait(), 10)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            gate.set()
            return await asyncio.wait_for(locks.run(in_thread, work, locks, "p", log, "next", plan_id="p"), 10)

        assert asyncio.run(scenario()) == "next"
    assert log == ["next"] and locks._entries == {}


def test_threads_and_loop_callers_take_turns_in_arrival_order():
    locks, log = PlanLocks(), []
    release = locks.try_acquire("p")
    with futures.ThreadPoolExecutor(4) as pool:
        thread_waiter = pool.submit(work, locks, "p", log, "thread")
        for _ in range(1000):
            if locks._entries["p"].waiters:
                break
            threading.Event().wait(0.001)

        async def scenario():
            loop = asyncio.get_running_loop()

            def in_thread(function, *arguments):
                return loop.run_in_executor(pool, function, *arguments)

            task = asyncio.create_task(locks.run(in_thread, work, locks, "p", log, "loop", plan_id="p"))
            await asyncio.sleep(0)
            release()
            return await asyncio.wait_for(task, 10)

        assert asyncio.run(scenario()) == "loop"
        assert thread_waiter.result(10) == "thread"
    assert log == ["thread", "loop"] and locks._entries == {}


def test_a_waiter_cancelled_just_as_the_lock_is_handed_to_it_passes_it_on():
    locks, log = PlanLocks(), []
    release = locks.try_acquire("p")

    async def scenario():
        loop = asyncio.get_running_loop()

        def in_thread(function, *arguments):
            return loop.run_in_executor(None, function, *arguments)

        first = asyncio.create_task(locks.run(in_thread, work, locks, "p", log, "first", plan_id="p"))
        second = asyncio.create_task(locks.run(in_thread, work, locks, "p", log, "second", plan_id="p"))
        await asyncio.sleep(0)
        release()  # hands the lock to the first waiter, which has not woken up yet
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await asyncio.wait_for(second, 10)

    assert asyncio.run(scenario()) == "second"
    assert log == ["second"] and locks._entries == {}
