"""Cross-cutting concerns, kept out of the servicers: turning domain errors into rich
statuses, and one log line per call."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from grpc_status import rpc_status

from checkpointd.api.errors import rich_status, to_status
from checkpointd.core.errors import CheckpointdError, InvalidArgument, Reason

log = logging.getLogger("checkpointd.rpc")


def _abort(context: grpc.ServicerContext, error: CheckpointdError) -> None:
    context.abort_with_status(rpc_status.to_status(to_status(error)))


def _abort_internal(context: grpc.ServicerContext, method: str) -> None:
    log.exception("unexpected error in %s", method)
    status = rich_status(grpc.StatusCode.INTERNAL, "internal error; see server log", "INTERNAL", {"method": method})
    context.abort_with_status(rpc_status.to_status(status))


class _Undecodable:
    """Stands in for a request whose bytes do not parse, so the caller gets
    INVALID_ARGUMENT instead of gRPC's INTERNAL "Exception deserializing request"."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserializer: Callable | None) -> Callable | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:
            return _Undecodable(error)

    return parse


def _check_decoded(request: Any, method: str) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(Reason.MALFORMED_REQUEST, f"the request to {method} is not a valid protobuf message",
                              method=method)


class MethodWrapper(grpc.ServerInterceptor):
    """An interceptor whose wrapping depends only on the method and the handler beneath it.

    gRPC asks every interceptor for a handler on every call; building one (closures and a
    method handler) per call per interceptor is a measurable part of a short call. The handler
    is built once per method and reused while the handler beneath it stays the same object.
    Only registered methods are cached (an unknown one has no handler), so the cache is bounded.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler | None]] = {}

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler | None:
        raise NotImplementedError

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        cached = self._wrapped.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(details.method, handler)
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped


class ErrorInterceptor(MethodWrapper):
    """Maps CheckpointdError to its status with ErrorInfo; anything else is a logged INTERNAL."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                started = time.monotonic()
                try:
                    _check_decoded(request, method)
                    response = inner(request, context)
                except CheckpointdError as error:
                    log.info("%s -> %s %s (%.1f ms)", method, error.kind.name, error.reason.value,
                             (time.monotonic() - started) * 1000)
                    _abort(context, error)
                except Exception:
                    if context.code() is not None:
                        raise
                    _abort_internal(context, method)
                log.debug("%s -> OK (%.1f ms)", method, (time.monotonic() - started) * 1000)
                return response

            return grpc.unary_unary_rpc_method_handler(unary, _tolerant(handler.request_deserializer),
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    _check_decoded(request, method)
                    yield from inner_stream(request, context)
                except CheckpointdError as error:
                    _abort(context, error)
                except Exception:
                    if context.code() is not None:
                        raise
                    _abort_internal(context, method)

            return grpc.unary_stream_rpc_method_handler(stream, _tolerant(handler.request_deserializer),
                                                        handler.response_serializer)
        return handler
