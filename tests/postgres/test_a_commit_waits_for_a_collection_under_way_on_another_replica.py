"""A create whose GC fence session was lost commits while another replica's collection is under
way: past its re-reading of the rows, before its first delete (which bumps the GC epoch). The
commit must wait for that collection (its transaction takes the fence's lock shared) and then see
the epoch moved: refused (LOCK_LOST), never acknowledged with content the collection then deletes."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
from sqlalchemy import text
from ulid import ULID

from checkpointd.core.engine import create as create_module
from checkpointd.core.kernel.errors import Reason, Unavailable
from checkpointd.core.kernel.faults import Point
from tests.postgres.replica_pair import end_session, fence_pid, stored_garbage

pytestmark = pytest.mark.postgres


def advisory_waiters(admin) -> int:
    with admin.connect() as connection:
        return connection.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar()


def test_a_commit_waits_for_a_collection_under_way_and_is_refused_after_it_deleted(pair, admin, monkeypatch):
    first, second, workspaces = pair
    workspace, shared = stored_garbage(first, second, workspaces)
    plan_id = str(ULID())
    deleting, go = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}
    real_delete = second.store.delete

    def paused_delete(digest: str) -> None:
        if not deleting.is_set():
            deleting.set()
            assert go.wait(30)
        real_delete(digest)

    monkeypatch.setattr(second.store, "delete", paused_delete)

    def collect() -> None:
        try:
            outcome["gc"] = second.maintenance.collect_garbage()
        except BaseException as exc:  # reported below
            outcome["gc"] = exc

    def release_when_the_commit_waits_or_ends() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "created" not in outcome and advisory_waiters(admin) == 0:
            time.sleep(0.01)
        go.set()

    collector = threading.Thread(target=collect)
    releaser: list[threading.Thread] = []

    def at(point: Point) -> None:
        if point is Point.CREATE_CAPTURED and not collector.is_alive() and "gc" not in outcome:
            end_session(admin, fence_pid(first))
            collector.start()
            assert deleting.wait(30), "the collection never reached its first delete"
            watcher = threading.Thread(target=release_when_the_commit_waits_or_ends)
            watcher.start()
            releaser.append(watcher)

    monkeypatch.setattr(create_module, "crash_point", at)
    try:
        with pytest.raises(Unavailable) as refused:
            outcome["created"] = first.create(plan_id, workspace, state=b"new state")
    finally:
        outcome.setdefault("created", None)
        go.set()
        collector.join(60)
        for watcher in releaser:
            watcher.join(60)
    monkeypatch.undo()
    assert not isinstance(outcome["gc"], BaseException), outcome["gc"]
    assert outcome["gc"].deleted_objects > 0
    assert refused.value.reason is Reason.LOCK_LOST
    assert second.checkpoints.list(plan_id)[0] == []
    acknowledged = first.create(plan_id, workspace, state=b"new state")  # the retry stores it all again
    assert second.store.has(hashlib.sha256(shared).hexdigest())
    assert second.checkpoints.get(acknowledged.checkpoint_id, with_state=True).state == b"new state"
