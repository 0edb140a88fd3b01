"""Domain errors to gRPC statuses (AIP-193): one code, one google.rpc.ErrorInfo."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from checkpoint.v1 import errors_pb2
from checkpointd.api.convert import text
from checkpointd.core.errors import CheckpointdError, Kind, Reason

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


def rich_status(code: grpc.StatusCode, message: str, reason: str, metadata: dict[str, str]) -> status_pb2.Status:
    """The status with its ErrorInfo. Message and metadata may name a path that is not UTF-8
    (held as surrogates), which a proto string cannot carry: such bytes travel as escapes."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN,
                                       metadata={key: text(value) for key, value in metadata.items()})
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=getattr(code_pb2, code.name), message=text(message), details=[detail])


def to_status(error: CheckpointdError) -> status_pb2.Status:
    return rich_status(status_code(error.kind), error.message, error.reason.value, error.metadata)
