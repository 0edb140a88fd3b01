"""Domain errors to gRPC statuses (AIP-193): one code, one google.rpc.ErrorInfo."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from checkpoint.v1 import errors_pb2
from checkpointd.api.convert import text
from checkpointd.core.kernel.errors import CheckpointdError, Kind, Reason

DOMAIN = "checkpointd"
_PREFIX = "ERROR_REASON_"


def _check_reasons_match_contract() -> None:
    """The domain's reasons and the contract's ErrorReason list must be the same set."""
    contract = {n.removeprefix(_PREFIX) for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}  # noqa: SIM118
    domain = {r.value for r in Reason}
    if contract != domain:
        raise RuntimeError(f"ErrorReason drift: only in proto {contract - domain}, only in domain {domain - contract}")


_check_reasons_match_contract()


def status_code(kind: Kind) -> grpc.StatusCode:
    match kind:
        case Kind.INVALID_ARGUMENT:
            return grpc.StatusCode.INVALID_ARGUMENT
        case Kind.NOT_FOUND:
            return grpc.StatusCode.NOT_FOUND
        case Kind.FAILED_PRECONDITION:
            return grpc.StatusCode.FAILED_PRECONDITION
        case Kind.PERMISSION_DENIED:
            return grpc.StatusCode.PERMISSION_DENIED
        case Kind.RESOURCE_EXHAUSTED:
            return grpc.StatusCode.RESOURCE_EXHAUSTED
        case Kind.UNAVAILABLE:
            return grpc.StatusCode.UNAVAILABLE
        case Kind.DATA_LOSS:
            return grpc.StatusCode.DATA_LOSS
        case Kind.ABORTED:
            return grpc.StatusCode.ABORTED
        case Kind.CANCELLED:
            return grpc.StatusCode.CANCELLED
        case Kind.DEADLINE_EXCEEDED:
            return grpc.StatusCode.DEADLINE_EXCEEDED


#: Longest status message and ErrorInfo metadata value, in UTF-8 bytes. The status travels in
#: the call's trailers, which clients refuse past a few KiB (grpc's soft limit is 8 KiB): a
#: request's value echoed whole would turn a clear error into a transport failure.
MAX_MESSAGE_BYTES = 512
MAX_METADATA_VALUE_BYTES = 256
_ELLIPSIS = "\u2026"


def capped(value: str, limit: int) -> str:
    """``value`` cut to at most ``limit`` UTF-8 bytes (at a character boundary), with an ellipsis when cut."""
    encoded = value.encode("utf-8")
    if len(encoded) <= limit:
        return value
    room = limit - len(_ELLIPSIS.encode("utf-8"))
    return encoded[:room].decode("utf-8", "ignore") + _ELLIPSIS


def rich_status(code: grpc.StatusCode, message: str, reason: str, metadata: dict[str, str]) -> status_pb2.Status:
    """The status with its ErrorInfo; every status the server sends is made here. Message and
    metadata may name a path that is not UTF-8 (held as surrogates), which a proto string
    cannot carry: such bytes travel as escapes. Both are capped (see MAX_MESSAGE_BYTES)."""
    info = error_details_pb2.ErrorInfo(
        reason=reason, domain=DOMAIN,
        metadata={key: capped(text(value), MAX_METADATA_VALUE_BYTES) for key, value in metadata.items()})
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=getattr(code_pb2, code.name), message=capped(text(message), MAX_MESSAGE_BYTES),
                             details=[detail])


def to_status(error: CheckpointdError) -> status_pb2.Status:
    return rich_status(status_code(error.kind), error.message, error.reason.value, error.metadata)
