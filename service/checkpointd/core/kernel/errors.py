"""Domain errors: a status kind, a stable reason and the dynamic values behind it.

The API layer turns these into gRPC statuses with one google.rpc.ErrorInfo; the domain
itself knows nothing of gRPC.
"""

from __future__ import annotations

import enum
import errno


class Reason(enum.StrEnum):
    """Stable ErrorInfo reasons; mirrored one-to-one by checkpoint.v1.ErrorReason."""

    INVALID_PLAN_ID = "INVALID_PLAN_ID"
    INVALID_CHECKPOINT_ID = "INVALID_CHECKPOINT_ID"
    MISSING_FIELD = "MISSING_FIELD"
    UNKNOWN_ENUM_VALUE = "UNKNOWN_ENUM_VALUE"
    INVALID_PHASE = "INVALID_PHASE"
    INVALID_LABEL = "INVALID_LABEL"
    FIELD_TOO_LONG = "FIELD_TOO_LONG"
    INVALID_REQUEST_ID = "INVALID_REQUEST_ID"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    INVALID_PAGE_SIZE = "INVALID_PAGE_SIZE"
    INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"
    INVALID_FILTER = "INVALID_FILTER"
    INVALID_PATH = "INVALID_PATH"
    INVALID_WORKSPACE_ROOT = "INVALID_WORKSPACE_ROOT"
    WORKSPACE_ROOT_NOT_ALLOWED = "WORKSPACE_ROOT_NOT_ALLOWED"
    WORKSPACE_ROOT_MISMATCH = "WORKSPACE_ROOT_MISMATCH"
    NO_WORKSPACE = "NO_WORKSPACE"
    CHECKPOINT_NOT_FOUND = "CHECKPOINT_NOT_FOUND"
    PLAN_NOT_FOUND = "PLAN_NOT_FOUND"
    CHECKPOINT_PLAN_MISMATCH = "CHECKPOINT_PLAN_MISMATCH"
    ROLLBACK_CONFLICT = "ROLLBACK_CONFLICT"
    UNKNOWN_CONFIG_KEY = "UNKNOWN_CONFIG_KEY"
    INVALID_CONFIG_VALUE = "INVALID_CONFIG_VALUE"
    STORAGE_EXHAUSTED = "STORAGE_EXHAUSTED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    WORKSPACE_UNAVAILABLE = "WORKSPACE_UNAVAILABLE"
    CORRUPT_CONTENT = "CORRUPT_CONTENT"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    PLAN_BUSY = "PLAN_BUSY"
    PATH_NOT_FOUND = "PATH_NOT_FOUND"
    NOT_A_FILE = "NOT_A_FILE"
    NESTED_WORKSPACE = "NESTED_WORKSPACE"
    NOT_A_DIRECTORY = "NOT_A_DIRECTORY"
    LOCK_LOST = "LOCK_LOST"
    INVALID_CHARACTER = "INVALID_CHARACTER"
    ETAG_MISMATCH = "ETAG_MISMATCH"
    PENDING_WRITES_FULL = "PENDING_WRITES_FULL"
    IGNORE_RULES_TOO_COSTLY = "IGNORE_RULES_TOO_COSTLY"
    CALL_ABANDONED = "CALL_ABANDONED"
    SERVER_RESOURCES_EXHAUSTED = "SERVER_RESOURCES_EXHAUSTED"


class Kind(enum.Enum):
    """The class of failure; the API layer maps each to exactly one status code."""

    INVALID_ARGUMENT = enum.auto()
    NOT_FOUND = enum.auto()
    FAILED_PRECONDITION = enum.auto()
    PERMISSION_DENIED = enum.auto()
    RESOURCE_EXHAUSTED = enum.auto()
    UNAVAILABLE = enum.auto()
    DATA_LOSS = enum.auto()
    ABORTED = enum.auto()
    CANCELLED = enum.auto()
    DEADLINE_EXCEEDED = enum.auto()


class CheckpointdError(Exception):
    kind: Kind

    def __init__(self, reason: Reason, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {k: str(v) for k, v in metadata.items()}


class InvalidArgument(CheckpointdError):
    kind = Kind.INVALID_ARGUMENT


class NotFound(CheckpointdError):
    kind = Kind.NOT_FOUND


class FailedPrecondition(CheckpointdError):
    kind = Kind.FAILED_PRECONDITION


class RollbackUnfinished(FailedPrecondition):
    """A plan's interrupted rollback could not be finished now: its checkpoints are kept until it is
    (deleting its target or safety checkpoint would leave the workspace half-applied for good)."""


class PermissionDenied(CheckpointdError):
    kind = Kind.PERMISSION_DENIED


class ResourceExhausted(CheckpointdError):
    kind = Kind.RESOURCE_EXHAUSTED


class Unavailable(CheckpointdError):
    kind = Kind.UNAVAILABLE


class DataLoss(CheckpointdError):
    kind = Kind.DATA_LOSS


class Aborted(CheckpointdError):
    """A concurrency conflict (AIP-154's etag): read again and retry."""

    kind = Kind.ABORTED


class Cancelled(CheckpointdError):
    """The caller gave up on the call (cancelled it) while its work had not reached its commit
    point: the work stopped and recorded nothing (see ``kernel.cancellation``)."""

    kind = Kind.CANCELLED


class DeadlineExceeded(Cancelled):
    """``Cancelled``, because the call's deadline passed."""

    kind = Kind.DEADLINE_EXCEEDED


#: errno values of the server itself running short (descriptors, memory), not of any path.
_SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


def short_of_resources(error: BaseException) -> Unavailable | None:
    """SERVER_RESOURCES_EXHAUSTED for an error that is (or was caused by) the server running
    short of descriptors or memory; None for any other. Retryable, unlike a full disk."""
    cause: BaseException | None = error
    for _ in range(8):
        if cause is None:
            break
        if isinstance(cause, OSError) and cause.errno in _SHORT_OF:
            return Unavailable(Reason.SERVER_RESOURCES_EXHAUSTED,
                               f"the server ran short of resources: {cause.strerror}; retry (same request_id)")
        cause = cause.__cause__ or cause.__context__
    return None
