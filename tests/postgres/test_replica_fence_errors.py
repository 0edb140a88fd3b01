"""The content store's GC fence across replicas (``ReplicaFence``) on its error paths and idle
times: a hold that failed half-way or that nobody uses any more is let go, so that a collection
on another replica is never shut out for good, and a replica never trusts what it knew across
another's collection. Real stores on one PostgreSQL database, one ``Database`` per replica."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from checkpointd.core.metadata.db import Database
from checkpointd.core.store import replica_fence
from checkpointd.core.store.content_store import Postponed
from checkpointd.core.store.db_store import DatabaseStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def database(pg_url: str) -> Iterator[Database]:
    db = Database(pg_url)
    db.migrate()
    try:
        yield db
    finally:
        db.dispose()


@pytest.fixture
def replicas(database: Database, tmp_path: Path) -> Iterator[tuple[DatabaseStore, DatabaseStore]]:
    stores = [DatabaseStore(Database(database.url), tmp_path / name) for name in ("a", "b")]
    try:
        yield stores[0], stores[1]
    finally:
        for store in stores:
            store.close()
            store.db.dispose()


def fence_sessions(database: Database) -> int:
    """Sessions granted an advisory lock in this database (the fence is the only one taken here)."""
    with database.engine.connect() as connection:
        return connection.execute(text(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar()


def until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_fence_taken_whose_gc_epoch_cannot_be_read_is_let_go_at_once(replicas, database, monkeypatch):
    """The lock is granted, then reading the GC epoch fails (the database went away for a moment):
    the call fails, and the lock is let go with it, not kept by a session nobody will release."""
    busy, collector = replicas
    real_read = busy._read_gc_epoch

    def unreadable() -> int:
        monkeypatch.setattr(busy, "_read_gc_epoch", real_read)
        raise OperationalError("SELECT gc_epoch", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(busy, "_read_gc_epoch", unreadable)
    with pytest.raises(OperationalError), busy.referencing():
        pytest.fail("referenced without the fence")
    assert fence_sessions(database) == 0
    with collector.collecting(patience=10):
        pass
    with busy.referencing(), busy.batch() as batch:
        digest = batch.put_bytes(b"after the failure")
    assert collector.read_bytes(digest) == b"after the failure"


def test_a_fence_nobody_uses_is_let_go_soon_and_taken_again_when_needed(replicas, database):
    busy, collector = replicas
    with busy.referencing():
        assert fence_sessions(database) == 1
    assert until(lambda: fence_sessions(database) == 0), "an idle replica kept the fence"
    with busy.referencing():
        assert fence_sessions(database) == 1


def test_a_fence_in_use_is_kept_however_long_its_user_takes(replicas, database):
    """The replica lets go of an idle fence, never of one a capture is inside (between its objects
    and its row): a collection elsewhere waits for it, whatever its patience allows."""
    busy, collector = replicas
    with busy.referencing():
        for _ in range(2):
            with pytest.raises(Postponed, match="another replica"), collector.collecting(patience=0.5):
                pytest.fail("collected while another replica references the store")
        assert fence_sessions(database) == 1


def test_a_collection_leaves_no_lock_behind(replicas, database):
    """Neither its exclusive hold nor the one that asks the other replicas to give way outlives it."""
    busy, collector = replicas
    with busy.referencing(), busy.batch() as batch:
        batch.put_bytes(b"some content")
    with collector.collecting(patience=30):
        assert fence_sessions(database) == 1
    assert until(lambda: fence_sessions(database) == 0), "a lock outlived its collection"
    with busy.referencing():
        assert fence_sessions(database) == 1


def test_a_collection_lets_go_of_its_own_replicas_idle_hold_at_once(replicas, database):
    """A collection right after a checkpoint on the same replica does not wait for the idle hold
    to be let go in its own time (it would be postponed by a patience shorter than that)."""
    busy, _ = replicas
    for _ in range(3):
        with busy.referencing(), busy.batch() as batch:
            batch.put_bytes(b"just checkpointed")
        with busy.collecting(patience=0.05):
            assert fence_sessions(database) == 1


def test_a_replica_giving_way_to_a_collection_keeps_no_lock_of_its_own(replicas, database):
    """Between two turns, a replica looks whether a collection is asking for the fence; with or
    without one, it holds nothing afterwards (a kept hold would be a lock no session lets go)."""
    busy, collector = replicas
    asking = collector.db.advisory_lock(replica_fence._COLLECTION_WANTED)
    with busy._fence:
        busy._give_way_to_a_collection()
    assert fence_sessions(database) == 0
    assert asking.acquire(wait=False), "a replica keeps holding what a collection asks with"
    with busy._fence:
        busy._give_way_to_a_collection()
    assert fence_sessions(database) == 1  # the collection's own
    asking.release()
    assert fence_sessions(database) == 0


class StoppedClock:
    """The fence module's clock, moved only by the test: turns and idle times are decided by it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


def test_back_to_back_users_share_one_hold_until_its_turn_is_over(replicas, monkeypatch):
    """Checkpoints one after the other do not each take and drop the lock; once the hold has
    lasted a turn, the next user takes it afresh (a collection elsewhere gets its chance between)."""
    busy, _ = replicas
    clock = StoppedClock()
    monkeypatch.setattr(replica_fence, "time", clock)
    with busy.referencing():
        first = busy._replica_fence.holder
    for _ in range(3):
        with busy.referencing():
            assert busy._replica_fence.holder is first, "the fence was let go between two users"
    # The clock stands still, so the hold is never idle long enough to be let go: nothing may let it go.
    assert not until(lambda: busy._replica_fence.holder is not first, seconds=0.5), "let go before its linger"
    clock.now += replica_fence._FENCE_TURN_SECONDS + 0.1
    with busy.referencing():
        again = busy._replica_fence.holder
        assert again is not None and again is not first, "a hold past its turn was kept"


def test_a_second_user_joins_the_hold_at_once_while_its_turn_lasts(replicas, monkeypatch):
    """Captures of one replica run side by side inside one hold: one does not wait for another
    to leave unless the hold's turn is over (then a collection elsewhere gets its chance)."""
    busy, _ = replicas
    clock = StoppedClock()
    monkeypatch.setattr(replica_fence, "time", clock)
    joined = threading.Event()

    def second_user() -> None:
        with busy.referencing():
            joined.set()

    with busy.referencing():
        clock.now -= 1000  # the turn is far from over: a second user who waited would wait long
        other = threading.Thread(target=second_user, daemon=True)
        other.start()
        assert joined.wait(10), "a second user waited for the first to leave within the hold's turn"
    other.join(10)


def test_a_user_past_its_turn_is_not_waited_for_by_the_next(replicas, monkeypatch):
    """A user in for longer than a turn may be stuck (a capture on a hung file system): the next
    one joins the hold instead of waiting for it, so one stuck capture stalls no other."""
    busy, _ = replicas
    clock = StoppedClock()
    monkeypatch.setattr(replica_fence, "time", clock)
    joined = threading.Event()

    def second_user() -> None:
        with busy.referencing():
            joined.set()

    with busy.referencing():
        clock.now += replica_fence._FENCE_TURN_SECONDS + 1
        other = threading.Thread(target=second_user, daemon=True)
        other.start()
        assert joined.wait(10), "a user waited for one in for longer than a turn"
    other.join(10)
