"""Cooperative cancellation: work whose caller gave up stops, if it has not committed anything yet.

A ``Cancellation`` is made for one call by the layer that hears of the caller giving up (the
gRPC servicers: an asyncio handler cancelled by the transport, a sync server's termination
callback) and set there, from any thread. The work itself, running in another thread, never
waits for it: it calls ``check`` at bounded intervals (a capture: per directory, every
``CHECK_EVERY`` entries of one, per file read, between the chunks of a large file), which raises
``Cancelled`` (or ``DeadlineExceeded``) once the token is set. Only work that has not reached
its commit point checks: what a rollback does to the workspace, or a checkpoint's metadata
commit, always runs to its end; what was staged before the check is dropped as any failure's is.
"""

from __future__ import annotations

import enum
import time

from checkpointd.core.kernel.errors import Cancelled, DeadlineExceeded, Reason

#: A scan checks its token at least once per this many entries of a directory.
CHECK_EVERY = 256


class Why(enum.StrEnum):
    """Why a caller gave up (a metric label)."""

    #: The caller cancelled the call (or the server stopped it, shutting down).
    CANCELLED = "cancelled"
    #: The call's deadline passed.
    DEADLINE_EXCEEDED = "deadline_exceeded"


class Cancellation:
    """Set once (the first reason wins) by whoever learns that the caller gave up; checked by the
    work. Setting it is cheap and thread-safe; so is checking it (one attribute read)."""

    __slots__ = ("_why", "_at")

    def __init__(self) -> None:
        self._why: Why | None = None
        self._at = 0.0

    def cancel(self, why: Why = Why.CANCELLED) -> None:
        if self._why is None:
            self._at = time.monotonic()  # before _why: whoever sees _why set sees _at too
            self._why = why

    @property
    def requested(self) -> bool:
        return self._why is not None

    @property
    def why(self) -> Why | None:
        return self._why

    def seconds_since(self) -> float:
        """How long ago the token was set (0 if it is not)."""
        return time.monotonic() - self._at if self._why is not None else 0.0

    def check(self) -> None:
        """Raises ``Cancelled`` (``DeadlineExceeded`` for a deadline) once the token is set."""
        if self._why is not None:
            raise self.error()

    def error(self) -> Cancelled:
        if self._why is Why.DEADLINE_EXCEEDED:
            return DeadlineExceeded(Reason.CALL_ABANDONED,
                                    "the call's deadline passed before the server had recorded anything; it "
                                    "stopped, and nothing was recorded: retry with a longer deadline (with the same "
                                    "request_id, if it had one)")
        return Cancelled(Reason.CALL_ABANDONED,
                         "the call was cancelled before the server had recorded anything; it stopped, and nothing "
                         "was recorded")


class _Never(Cancellation):
    """The token of work nobody can give up on (start-up recovery, retention, tests)."""

    __slots__ = ()

    def cancel(self, why: Why = Why.CANCELLED) -> None:
        raise TypeError("NEVER cannot be cancelled: make a Cancellation for the call")


#: The default token: never set.
NEVER: Cancellation = _Never()
