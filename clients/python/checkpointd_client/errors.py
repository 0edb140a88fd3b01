"""Exceptions raised by the client, so callers can match on stable reasons instead of message text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from checkpointd_client.targets import unreachable_hint

ERROR_DOMAIN = "checkpointd"


class CheckpointdClientError(Exception):
    """Base of every exception this package raises on purpose."""


class CheckpointdRpcError(CheckpointdClientError):
    """A failed RPC: the gRPC status plus the server's google.rpc.ErrorInfo, when it sent one.

    `reason` is the ErrorReason name without its prefix (e.g. "INVALID_PLAN_ID"), or "" when the
    failure never reached checkpointd (connection refused, deadline exceeded on the client side).
    `hint` says what to do where gRPC's own words do not: for UNAVAILABLE without checkpointd's
    ErrorInfo (nothing answered), which target was dialed, how it was chosen, and how to start
    checkpointd (``targets.unreachable_hint``); "" otherwise.
    """

    def __init__(
        self,
        method: str,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        hint: str = "",
    ) -> None:
        self.method = method
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        self.hint = hint
        detail = f" [{reason}]" if reason else ""
        if hint:
            super().__init__(f"{method}: {hint} ({code.name}{detail}: {message})")
        else:
            super().__init__(f"{method}: {code.name}{detail}: {message}")

    @classmethod
    def from_grpc(cls, method: str, error: grpc.RpcError, *, target: str | None = None) -> CheckpointdRpcError:
        """Translate a grpc.RpcError, reading the ErrorInfo from the rich status details.
        ``target``, where known, is named in the hint of a call nothing answered."""
        code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
        message = error.details() if isinstance(error, grpc.Call) else str(error)
        status = rpc_status.from_call(error) if isinstance(error, grpc.Call) else None
        if status is not None:
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return cls(
                        method,
                        code,
                        message or status.message,
                        reason=info.reason,
                        domain=info.domain,
                        metadata=dict(info.metadata),
                    )
        hint = unreachable_hint(target) if code is grpc.StatusCode.UNAVAILABLE else ""
        return cls(method, code, message or "", hint=hint)


class CheckpointUnavailableError(CheckpointdClientError):
    """An automatic checkpoint could not be recorded and `core.checkpoints.on_unavailable` is "refuse".

    Raised before the guarded action runs, so the write tool or sub-plan never starts.
    """

    def __init__(self, trigger: StrEnum, plan_id: str, cause: CheckpointdRpcError) -> None:
        # ``trigger`` is a vocabulary.AutoTrigger; vocabulary imports this module, not the reverse.
        self.trigger = trigger
        self.plan_id = plan_id
        self.cause = cause
        super().__init__(
            f"refusing to continue: the {trigger.value} checkpoint of plan {plan_id} could not be recorded "
            f"({cause.code.name}: {cause.message}) and core.checkpoints.on_unavailable is 'refuse'"
            + (f"; {cause.hint}" if cause.hint else "")
        )


class UnknownTriggerError(CheckpointdClientError, ValueError):
    """A trigger name outside the automatic-trigger vocabulary, from local code or from the server."""

    def __init__(self, name: str, *, allowed: Sequence[str], source: str = "") -> None:
        self.name = name
        self.allowed = list(allowed)
        origin = f" (from {source})" if source else ""
        super().__init__(f"unknown trigger {name!r}{origin}; allowed: {self.allowed}")


class InvalidConfigValueError(CheckpointdClientError, ValueError):
    """A config value the client cannot use (wrong type, or outside the key's vocabulary)."""

    def __init__(self, key: str, value: object, detail: str) -> None:
        self.key = key
        self.value = value
        super().__init__(f"config {key} = {value!r} is unusable: {detail}")
