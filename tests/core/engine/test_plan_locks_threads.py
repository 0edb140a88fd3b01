"""PlanLocks in the threads a server shares between calls: what one call's first try set up in
its thread (refuse a busy plan rather than wait) ends with it, so a later caller in that thread
that waits for a plan (start-up recovery, retention, a call holding its turn) still waits."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import pytest

from checkpointd.core.engine.plan_locks import PlanLocks


def hold_briefly(locks: PlanLocks, plan_id: str) -> str:
    with locks.hold(plan_id):
        return f"held {plan_id}"


def waiters(locks: PlanLocks, plan_id: str) -> int:
    entry = locks._entries.get(plan_id)
    return 0 if entry is None else len(entry.waiters)


def test_a_thread_that_ran_a_first_try_waits_for_a_busy_plan_when_called_outside_the_loop():
    locks = PlanLocks()
    with futures.ThreadPoolExecutor(1) as pool:  # one thread: every call below runs in it

        async def first_try() -> str:
            loop = asyncio.get_running_loop()
            return await locks.run(lambda f, *a: loop.run_in_executor(pool, f, *a), hold_briefly, locks, "p")

        assert asyncio.run(first_try()) == "held p"
        release = locks.try_acquire("p")
        assert release is not None
        waiting = pool.submit(hold_briefly, locks, "p")  # the same thread, not from the loop: it waits
        while waiters(locks, "p") == 0 and not waiting.done():
            threading.Event().wait(0.001)
        assert not waiting.done(), f"refused instead of waiting: {waiting.exception()!r}"
        release()
        assert waiting.result(10) == "held p"
    assert locks._entries == {}


def test_a_call_holding_its_turn_waits_for_another_busy_plan_in_its_thread():
    """The call was given plan p's turn on the loop; in its thread it also needs plan q, busy:
    it waits for q there (it holds p, so it cannot give its thread back and start again)."""
    locks = PlanLocks()
    release_p = locks.try_acquire("p")
    release_q = locks.try_acquire("q")
    log: list[str] = []

    def both() -> str:
        with locks.hold("p"):
            log.append("p")
            with locks.hold("q"):
                log.append("q")
        return "both"

    with futures.ThreadPoolExecutor(2) as pool:

        async def scenario() -> str:
            loop = asyncio.get_running_loop()
            call = asyncio.create_task(locks.run(lambda f, *a: loop.run_in_executor(pool, f, *a), both, plan_id="p"))
            while not waiters(locks, "p"):
                await asyncio.sleep(0)
            release_p()
            while not waiters(locks, "q") and not call.done():
                await asyncio.sleep(0.001)
            assert not call.done(), f"refused instead of waiting for q: {call.exception()!r}"
            release_q()
            return await asyncio.wait_for(call, 10)

        assert asyncio.run(scenario()) == "both"
    assert log == ["p", "q"] and locks._entries == {}


def test_a_call_cancelled_while_its_thread_runs_leaves_the_lock_to_that_thread():
    """The call's thread already runs it when the caller gives up: the thread keeps the plan until
    it is done and releases it; the cancelled caller returns at once (it must not wait for the
    thread on the event loop, which serves every other call)."""
    locks, log = PlanLocks(), []
    release = locks.try_acquire("p")
    running, finish = threading.Event(), threading.Event()

    def slow() -> str:
        with locks.hold("p"):
            running.set()
            assert finish.wait(30)
            log.append("slow")
        return "slow"

    outcome: dict[str, object] = {}
    with futures.ThreadPoolExecutor(2) as pool:

        async def scenario() -> None:
            loop = asyncio.get_running_loop()
            call = asyncio.create_task(locks.run(lambda f, *a: loop.run_in_executor(pool, f, *a), slow, plan_id="p"))
            while not waiters(locks, "p"):
                await asyncio.sleep(0)
            release()
            await loop.run_in_executor(None, running.wait, 30)
            call.cancel()
            try:
                await call
            except asyncio.CancelledError:
                outcome["cancelled"] = True

        loop_thread = threading.Thread(target=lambda: asyncio.run(scenario()), daemon=True)
        loop_thread.start()
        try:
            loop_thread.join(10)
            assert not loop_thread.is_alive(), "the event loop waited for the cancelled call's thread"
            assert outcome == {"cancelled": True}
            assert locks.busy("p"), "the plan was released while the call's thread still ran it"
        finally:
            finish.set()
    assert log == ["slow"] and locks._entries == {}


def test_a_cancelled_waiter_hands_nothing_to_those_behind_it_while_the_lock_is_held():
    locks, log = PlanLocks(), []
    release = locks.try_acquire("p")

    def work() -> str:
        with locks.hold("p"):
            log.append("ahead")
        return "ahead"

    with futures.ThreadPoolExecutor(2) as pool:

        async def scenario() -> str:
            loop = asyncio.get_running_loop()

            def run(**kwargs):
                return asyncio.create_task(locks.run(lambda f, *a: loop.run_in_executor(pool, f, *a), work, **kwargs))

            ahead = run(plan_id="p")
            while waiters(locks, "p") < 1:
                await asyncio.sleep(0)
            behind = run(plan_id="p")
            while waiters(locks, "p") < 2:
                await asyncio.sleep(0)
            behind.cancel()
            with pytest.raises(asyncio.CancelledError):
                await behind
            assert waiters(locks, "p") == 1
            # Held still: the call ahead may not run, however long it is given.
            done, _ = await asyncio.wait({ahead}, timeout=1)
            assert not done and log == [], "the cancelled waiter handed the held lock to the one ahead of it"
            release()
            return await asyncio.wait_for(ahead, 10)

        assert asyncio.run(scenario()) == "ahead"
    assert log == ["ahead"] and locks._entries == {}


def test_threads_waiting_for_a_plan_do_not_count_against_the_loops_waiting_limit():
    """The limit bounds calls waiting on the loop; start-up recovery or retention waiting in their
    own threads must not make a client's call be refused PLAN_BUSY."""
    locks = PlanLocks(max_waiters=1)
    release = locks.try_acquire("p")
    with futures.ThreadPoolExecutor(2) as pool:
        in_thread = pool.submit(hold_briefly, locks, "p")
        while waiters(locks, "p") == 0:
            threading.Event().wait(0.001)

        async def scenario() -> str:
            loop = asyncio.get_running_loop()
            call = asyncio.create_task(locks.run(lambda f, *a: loop.run_in_executor(pool, f, *a), hold_briefly, locks,
                                                 "p", plan_id="p"))
            while waiters(locks, "p") < 2 and not call.done():
                await asyncio.sleep(0)
            refused = call.done()
            release()
            assert not refused, f"refused: {call.exception()!r}"
            return await asyncio.wait_for(call, 10)

        assert asyncio.run(scenario()) == "held p"
        assert in_thread.result(10) == "held p"
    assert locks._entries == {}
