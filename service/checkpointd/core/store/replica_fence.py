"""The database store's GC fence across replicas (a mixin of ``DatabaseStore``): captures on
every replica share a PostgreSQL advisory lock that a collection takes exclusively, without
ever queueing for it; a process lets go of its shared hold after a turn, so a collection gets in.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from sqlalchemy import select

from checkpointd.core.kernel.errors import Reason, Unavailable
from checkpointd.core.metadata.db import lock_key
from checkpointd.core.metadata.models import ContentStoreStateRow
from checkpointd.core.metadata.rows import XACT_LOCK_SHARED, RowWriter, Statement
from checkpointd.core.store.content_store import Postponed

_state = ContentStoreStateRow.__table__
#: The advisory lock every replica's captures hold shared and a collection takes exclusively.
FENCE_LOCK = "content-store-gc"
_READ_GC_EPOCH = select(_state.c.gc_epoch).where(_state.c.id == 1)
#: The replica fence stays held this long after its last user, so that back-to-back checkpoints
#: do not each take and drop a database lock...
_FENCE_LINGER_SECONDS = 0.2
#: ...but once it has been held this long, new users wait for a moment with none, when it is
#: let go, so that a collection waiting on another replica gets its turn; not for a user that
#: has itself been in this long (it may be stuck: waiting would stall every capture behind it).
_FENCE_TURN_SECONDS = 2.0
#: Held by a collection while it asks for the replica fence: replicas at their turn give way.
_COLLECTION_WANTED = "content-store-gc-wanted"
#: How often a collection asks again for the exclusive replica lock while others hold it.
_TRY_AGAIN_SECONDS = 0.05


class ReplicaFence:
    """``DatabaseStore``'s GC fence (see the module docstring)."""

    # -- GC fence -----------------------------------------------------------------------

    @contextlib.contextmanager
    def referencing(self) -> Iterator[None]:
        """Hold while writing objects and committing the metadata that references them:
        an object found to exist (and so not rewritten) cannot be collected meanwhile, by
        any replica."""
        with self._local_fence.shared():
            token = self._enter_replica_fence()
            try:
                yield
            finally:
                self._leave_replica_fence(token)

    def try_referencing(self) -> Callable[[], None] | None:
        """Always None: taking the fence may wait for the database (see ``referencing``)."""
        return None

    def confirm_fence(self, rows: RowWriter) -> None:
        """Called in the transaction that commits rows referencing objects, under ``referencing``.
        The replica fence is a session-level lock: if the database ended its session (a failover,
        a pooler's restart, an administrator, a timeout), another replica's collection may have
        deleted objects these rows reference, unseen. The transaction holds the fence's lock shared
        until it ends (a collection under way is waited for; none can begin before it commits, and
        one that begins after sees its rows), then reads the GC epoch (both in the round trip of the
        transaction's numbering, ``RowWriter.check``), which a collection bumps when
        it first deletes: changed since this process took the fence, the rows are refused
        (``LOCK_LOST``, retryable) and the fence is taken afresh once its present users are done."""
        statements: list[Statement] = [(_READ_GC_EPOCH, {})]
        if self.db.is_postgresql:
            statements.insert(0, (XACT_LOCK_SHARED, {"key": lock_key(FENCE_LOCK)}))
        rows.check(statements, self._judge_fence)

    def _judge_fence(self, results: list[list[tuple]]) -> None:
        (epoch,), = results[-1]
        if epoch == self._gc_epoch:
            return
        with self._fence:
            self._fence_lost = True
            self._forget_known()
        raise Unavailable(Reason.LOCK_LOST,
                          "the database ended the session holding this server's content-store fence and "
                          "another replica collected garbage meanwhile; nothing was recorded, retry",
                          lock=FENCE_LOCK)

    def _enter_replica_fence(self) -> object:
        """Joins this process's hold of the replica fence (taking it if none): a token for ``_leave``."""
        with self._fence:
            if self._fence_turn_is_over() and self._fence_users:
                # Wait for the present users, but not past the moment the oldest of them has
                # been in for a whole turn: then it may be stuck, and its turn cannot come anyway.
                oldest = min(self._fence_users.values())
                self._fence.wait_for(lambda: not self._fence_users or self._fence_held_since is None,
                                     timeout=oldest + _FENCE_TURN_SECONDS - time.monotonic())
            if (self._fence_turn_is_over() or self._fence_lost) and not self._fence_users:
                self._let_go_of_replica_fence()
                self._give_way_to_a_collection()
            if self._fence_held_since is None:
                self._take_replica_fence()
            token = object()
            self._fence_users[token] = time.monotonic()
            return token

    def _give_way_to_a_collection(self) -> None:
        """Called with ``_fence`` held, just after letting go of the replica fence: if another
        replica's collection is asking for it (it never queues), gives it time to ask once more."""
        wanted = self.db.advisory_lock(_COLLECTION_WANTED, shared=True)
        if wanted.acquire(wait=False):
            wanted.release()
            return
        time.sleep(2 * _TRY_AGAIN_SECONDS)

    def _leave_replica_fence(self, token: object) -> None:
        with self._fence:
            del self._fence_users[token]
            self._fence_last_left = time.monotonic()
            if not self._fence_users:
                self._fence.notify_all()

    def _fence_turn_is_over(self) -> bool:
        held = self._fence_held_since
        return held is not None and time.monotonic() - held > _FENCE_TURN_SECONDS

    def _take_replica_fence(self) -> None:
        """Called with ``_fence`` held. Reads the GC epoch once the lock is granted: a change
        means some replica collected since this process last held the fence."""
        self._replica_fence.acquire()
        try:
            epoch = self._read_gc_epoch()
        except BaseException:
            self._replica_fence.release()
            raise
        self._fence_lost = False
        if epoch != self._gc_epoch:
            self._forget_known()
            if self._gc_epoch is not None:
                self._deletions += 1
            self._gc_epoch = epoch
        self._fence_held_since = time.monotonic()
        if self._fence_keeper is None:
            self._fence_keeper = threading.Thread(target=self._keep_replica_fence, name="store-fence", daemon=True)
            self._fence_keeper.start()

    def _let_go_of_replica_fence(self) -> None:
        """Called with ``_fence`` held and no users."""
        self._fence_held_since = None
        self._replica_fence.release()
        self._fence.notify_all()

    def _keep_replica_fence(self) -> None:
        """Lets go of the replica fence once it has had no user for a moment."""
        while True:
            with self._fence:
                self._fence.wait_for(lambda: self._closed or (self._fence_held_since is not None
                                                              and not self._fence_users))
                if self._closed:
                    return
                idle_for = time.monotonic() - self._fence_last_left
                if idle_for < _FENCE_LINGER_SECONDS:
                    self._fence.wait(_FENCE_LINGER_SECONDS - idle_for)
                    continue
                with contextlib.suppress(Exception):
                    self._let_go_of_replica_fence()

    @contextlib.contextmanager
    def collecting(self, patience: float | None = None) -> Iterator[None]:
        """Held by garbage collection: no checkpoint, on any replica, is between its objects and
        its row. With a ``patience``, ``Postponed`` rather than wait longer on a capture of this
        process (as ``ContentStore.collecting``) or on the other replicas' fences. The GC epoch is
        bumped by the first ``delete`` (a collection that deletes nothing leaves every replica's
        caches, and so its incremental captures, alone). Deletions run on the session holding the
        exclusive lock: if the database ends it, none commits (another replica may hold the fence
        by then, and have committed references to what this collection marked unreferenced)."""
        with self._local_fence.exclusive(patience):
            with self._fence:
                if self._fence_held_since is not None:
                    self._let_go_of_replica_fence()
            exclusive = self.db.advisory_lock(FENCE_LOCK)
            wanted = self.db.advisory_lock(_COLLECTION_WANTED)
            asking = wanted.acquire(wait=False)
            try:
                self._take_exclusively(exclusive, patience)
            finally:
                if asking:
                    wanted.release()
            try:
                self._epoch_bumped = False
                self._collector_lock = exclusive
                yield
            finally:
                self._collector_lock = None
                exclusive.release()

    @staticmethod
    def _take_exclusively(lock, patience: float | None) -> None:
        """Asks again and again rather than queue: a queued request would hold back every
        replica's new shared requests behind one that may never be let go."""
        deadline = None if patience is None else time.monotonic() + patience
        while not lock.acquire(wait=False):
            if deadline is not None and time.monotonic() >= deadline:
                raise Postponed(f"another replica has held the content store's fence for over {patience:g}s")
            time.sleep(_TRY_AGAIN_SECONDS)

    def _read_gc_epoch(self) -> int:
        with self.db.engine.connect() as connection:
            return connection.execute(_READ_GC_EPOCH).scalar_one()
