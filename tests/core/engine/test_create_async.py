"""``Checkpoints.create_async``: a state-only create is served on the event loop up to its commit
(written by the group commit's thread); every create that could wait runs in a thread; the answers
are the ones ``create`` gives."""

from __future__ import annotations

import asyncio
import os
import threading
from contextlib import contextmanager

import pytest
from ulid import ULID

from checkpointd.core.engine import create as create_module
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.create import LOOP_STATE_LIMIT
from checkpointd.core.engine.requests import CreateRequest
from checkpointd.core.kernel.errors import InvalidArgument, Reason


class Threads:
    """A ``run_blocking`` that runs each function in a thread and notes its name."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def __call__(self, function, *arguments):
        # Through a plan lock's wrappers (PlanLocks.run), the function they run is what ran.
        inner = next((a for a in arguments if callable(a)), None) if function.__name__ in (
            "_first_try", "_with_turn") else None
        self.ran.append((inner or function).__name__)
        return await asyncio.get_running_loop().run_in_executor(None, function, *arguments)


def _create(engine: Checkpoints, threads: Threads, plan_id: str, state: bytes = b"state", **fields):
    return asyncio.run(engine.create_async(CreateRequest(plan_id=plan_id, state=state, **fields), threads))


def test_a_state_only_create_of_a_remembered_plan_is_served_on_the_loop(engine):
    plan_id, threads = str(ULID()), Threads()
    first = _create(engine, threads, plan_id, b"state 1")
    assert threads.ran == ["create"], "a plan not remembered yet is read from the database, in a thread"

    later = [_create(engine, threads, plan_id, f"state {n}".encode()) for n in (2, 3)]

    assert threads.ran == ["create"], "nothing more ran in a thread"
    assert [c.row.sequence for c in (first, *later)] == [1, 2, 3]
    for n, created in enumerate(later, start=2):
        stored = engine.get(created.row.checkpoint_id, with_state=True)
        assert stored.state == f"state {n}".encode()
        assert stored.row.state_size_bytes == len(stored.state)
    assert engine.count(plan_id) == 3


def test_every_create_that_could_wait_runs_in_a_thread(engine, tmp_path, monkeypatch):
    plan_id, threads = str(ULID()), Threads()
    _create(engine, threads, plan_id)
    threads.ran.clear()

    _create(engine, threads, plan_id, b"x" * (LOOP_STATE_LIMIT + 1))
    assert threads.ran == ["create"], "a large state"

    workspace = tmp_path / "workspaces" / "w"
    workspace.mkdir()
    (workspace / "file.txt").write_text("content")
    with_files = str(ULID())
    _create(engine, threads, with_files, workspace_root=str(workspace))
    _create(engine, threads, with_files)
    assert threads.ran == ["create"] * 3, "a workspace to capture, also when a plan's root is remembered"

    collecting = threading.Event()
    done = threading.Event()

    def collect() -> None:
        with engine.store.collecting():
            collecting.set()
            done.wait(timeout=30)

    collector = threading.Thread(target=collect)
    collector.start()
    assert collecting.wait(timeout=30)

    async def while_collecting():
        task = asyncio.create_task(engine.create_async(CreateRequest(plan_id=plan_id, state=b"s"), threads))
        # A window, not a wait for an event: a create that did not wait for the collection would end in it.
        await asyncio.sleep(0.1)
        assert not task.done(), "the create waits for garbage collection, in its thread"
        done.set()
        return await task

    asyncio.run(while_collecting())
    collector.join(timeout=30)
    assert threads.ran == ["create"] * 4, "garbage collection held the store"

    monkeypatch.setattr(create_module, "may_stall", lambda *points: True)
    _create(engine, threads, plan_id)
    assert threads.ran == ["create"] * 5, "a fault that stalls is configured"
    assert engine.count(plan_id) == 4


def test_a_busy_plan_is_served_in_a_thread_once_it_is_free(engine):
    plan_id, threads = str(ULID()), Threads()
    _create(engine, threads, plan_id)
    release = engine.registry.try_lock(plan_id)
    assert release is not None

    async def while_busy():
        task = asyncio.create_task(engine.create_async(CreateRequest(plan_id=plan_id, state=b"s"), threads))
        # A window, not a wait for an event: a create that did not wait for the plan would end in it.
        await asyncio.sleep(0.1)
        assert not task.done(), "the create waits for the plan, in its thread"
        release()
        return await task

    created = asyncio.run(while_busy())
    assert threads.ran == ["create", "create"]
    assert created.row.sequence == 2


def test_concurrent_creates_on_the_loop_keep_each_plans_sequence_gap_free(engine):
    plans, threads = [str(ULID()) for _ in range(4)], Threads()
    for plan_id in plans:
        _create(engine, threads, plan_id)

    async def many():
        return await asyncio.gather(*(engine.create_async(CreateRequest(plan_id=plans[n % 4], state=f"{n}".encode()),
                                                          threads) for n in range(80)))

    created = asyncio.run(many())
    for plan_id in plans:
        sequences = sorted(c.row.sequence for c in created if c.row.plan_id == plan_id)
        assert sequences == list(range(2, 22))
    assert len(threads.ran) > 4, "creates of a plan already busy on the loop waited in threads"


def test_a_retried_request_id_replays_the_first_checkpoint_and_a_reused_one_is_refused(engine):
    plan_id, threads = str(ULID()), Threads()
    _create(engine, threads, plan_id)
    threads.ran.clear()

    first = _create(engine, threads, plan_id, b"s", request_id="retried-create")
    again = _create(engine, threads, plan_id, b"s", request_id="retried-create")

    assert again.row.checkpoint_id == first.row.checkpoint_id
    assert threads.ran == ["_after_failed_commit"], "the retry's row failed to insert; the first was read back"
    assert engine.count(plan_id) == 2
    with pytest.raises(InvalidArgument) as reused:
        _create(engine, threads, plan_id, b"another state", request_id="retried-create")
    assert reused.value.reason is Reason.REQUEST_ID_REUSED
    assert engine.count(plan_id) == 2


def test_a_cancelled_create_is_committed_and_holds_its_plan_until_then(engine, monkeypatch):
    plan_id, threads = str(ULID()), Threads()
    _create(engine, threads, plan_id)
    writing, finish = threading.Event(), threading.Event()
    group_commit = engine.parts.new_checkpoints
    write = group_commit._write

    def slow_write(rows, items):
        writing.set()
        finish.wait(timeout=30)
        write(rows, items)

    monkeypatch.setattr(group_commit, "_write", slow_write)

    async def cancelled():
        task = asyncio.create_task(engine.create_async(CreateRequest(plan_id=plan_id, state=b"s"), threads))
        await asyncio.get_running_loop().run_in_executor(None, writing.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert engine.registry.try_lock(plan_id) is None, "the plan stays locked while its commit runs"
    finish.set()
    group_commit.close()
    release = engine.registry.try_lock(plan_id)
    assert release is not None, "the commit's end freed the plan"
    release()
    assert engine.count(plan_id) == 2
    assert threads.ran == ["create"]


def test_a_new_state_is_synced_before_the_row_that_references_it_is_committed(engine, monkeypatch):
    plan_id, threads = str(ULID()), Threads()
    _create(engine, threads, plan_id, b"first state")
    events: list[str] = []
    packs = {pack.fd for pack in engine.store._packs}
    real_fdatasync = os.fdatasync

    def noting_fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        if fd in packs:
            events.append("pack synced")

    group_commit = engine.parts.new_checkpoints
    transaction = group_commit._transaction

    @contextmanager
    def noting_transaction():
        with transaction() as rows:
            yield rows
        events.append("row committed")

    monkeypatch.setattr(os, "fdatasync", noting_fdatasync)
    monkeypatch.setattr(group_commit, "_transaction", noting_transaction)

    _create(engine, threads, plan_id, b"a state never stored before")
    assert events == ["pack synced", "row committed"]
    events.clear()
    _create(engine, threads, plan_id, b"a state never stored before")
    assert events == ["row committed"], "a state already stored needs no sync"
    assert threads.ran == ["create"]
