"""Cross-cutting concerns, kept out of the servicers: turning domain errors into rich
statuses, and one log line per call.

The server is a ``grpc.aio`` server: a handler is either a coroutine (run on the event loop)
or a plain function (run in the server's thread pool), and each interceptor wraps a handler
with one of its own kind. The same interceptors also serve a sync ``grpc.server`` (tests run
servicers in one through pytest-grpc).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import Any, NamedTuple, NoReturn

import grpc
from grpc_status import rpc_status

from checkpointd.api.errors import rich_status, to_status
from checkpointd.core.kernel.cancellation import Why
from checkpointd.core.kernel.errors import CheckpointdError, InvalidArgument, Reason, short_of_resources
from checkpointd.core.metadata.db import storage_exhausted

log = logging.getLogger("checkpointd.rpc")

#: The code the current call was ended with by ``abort`` (the asyncio server's contexts for
#: plain-function handlers cannot tell it afterwards).
_aborted_with: ContextVar[grpc.StatusCode | None] = ContextVar("aborted_with", default=None)
#: The ErrorInfo reason the current call failed with, for its access line (one line per call).
_failed_with: ContextVar[str] = ContextVar("failed_with", default="")


def is_async(behaviour: Callable | None) -> bool:
    """Whether a handler's behaviour runs on the event loop (a coroutine or async generator function)."""
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)


class HandlerShape(NamedTuple):
    """What a method handler is made of: its behaviour, the function that makes a handler of its
    shape, whether its request is one message and whether its response is a stream."""

    behaviour: Callable
    make: Callable[..., grpc.RpcMethodHandler]
    unary_request: bool
    streams: bool


def shape_of(handler: grpc.RpcMethodHandler) -> HandlerShape:
    if handler.unary_unary is not None:
        return HandlerShape(handler.unary_unary, grpc.unary_unary_rpc_method_handler, True, False)
    if handler.unary_stream is not None:
        return HandlerShape(handler.unary_stream, grpc.unary_stream_rpc_method_handler, True, True)
    if handler.stream_unary is not None:
        return HandlerShape(handler.stream_unary, grpc.stream_unary_rpc_method_handler, False, False)
    return HandlerShape(handler.stream_stream, grpc.stream_stream_rpc_method_handler, False, True)


def abort(context: Any, status: grpc.Status) -> NoReturn:
    """Ends the call from a plain-function handler with ``status`` (its ErrorInfo in the trailers)."""
    _aborted_with.set(status.code)
    if hasattr(context, "abort_with_status"):
        context.abort_with_status(status)
    context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("abort returned")


async def abort_async(context: grpc.aio.ServicerContext, status: grpc.Status) -> NoReturn:
    """``abort`` for a coroutine handler."""
    _aborted_with.set(status.code)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("abort returned")


def _entered() -> float:
    """A call enters ``ErrorInterceptor``: forgets earlier calls' aborts; returns the time."""
    begin_call()
    return time.monotonic()


def begin_call() -> None:
    """Forgets how an earlier call served by this thread ended (called as a call enters the
    interceptors, and again where it enters ``ErrorInterceptor``)."""
    _aborted_with.set(None)
    _failed_with.set("")


def failure_reason() -> str:
    """The ErrorInfo reason the current call failed with ('' if none is known)."""
    return _failed_with.get()


#: A call given up on this close to its deadline counts as past it: a client whose deadline passes
#: cancels the call itself, which the server may hear of a moment before its own copy of the
#: deadline passes (it started counting when the request arrived).
DEADLINE_SLACK_SECONDS = 0.1


def why_ended(context: Any) -> Why:
    """Why a call ended before its handler did: its deadline passed, else it was cancelled."""
    remaining = context.time_remaining() if context is not None else None
    return Why.DEADLINE_EXCEEDED if remaining is not None and remaining <= DEADLINE_SLACK_SECONDS else Why.CANCELLED


def given_up_code(context: Any) -> grpc.StatusCode:
    """The code of a call whose handler the transport cancelled, as its caller saw it (a caller
    whose deadline passed was told DEADLINE_EXCEEDED, not CANCELLED)."""
    match why_ended(context):
        case Why.DEADLINE_EXCEEDED:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        case Why.CANCELLED:
            return grpc.StatusCode.CANCELLED


def outcome(context: Any, failed: bool) -> grpc.StatusCode:
    """How the current call ended: the code it was aborted with, else OK, or UNKNOWN if it raised."""
    code = _aborted_with.get()
    if code is None and callable(getattr(context, "code", None)):
        code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK


def _already_ended(context: Any, error: Exception) -> bool:
    """Whether ``error`` is the way an abort ends a handler (the call has its status)."""
    return isinstance(error, grpc.aio.AbortError) or outcome(context, False) is not grpc.StatusCode.OK


def failure_status(method: str, context: Any, error: Exception, started: float) -> grpc.Status:
    """The status a handler's exception ends its call with: a domain error's own status (a
    write the disk had no room for is one), an INTERNAL for anything else (logged). Raises
    ``error`` again when it is the call's abort."""
    domain = (error if isinstance(error, CheckpointdError)
              else storage_exhausted(error) or short_of_resources(error))
    if domain is not None:
        _failed_with.set(domain.reason.value)  # the call's access line says it
        log.debug("%s -> %s %s (%.1f ms)", method, domain.kind.name, domain.reason.value,
                  (time.monotonic() - started) * 1000)
        return rpc_status.to_status(to_status(domain))
    if _already_ended(context, error):
        raise error
    _failed_with.set("INTERNAL")
    log.error("unexpected error in %s", method, exc_info=error)
    status = rich_status(grpc.StatusCode.INTERNAL, "internal error; see server log", "INTERNAL", {"method": method})
    return rpc_status.to_status(status)


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


class HandlerInterceptor(grpc.ServerInterceptor):
    """An interceptor that only decides which handler serves a call, from the call's details and
    the handler beneath it; ``for_asyncio`` serves the same decision to a ``grpc.aio`` server."""

    def decorate(self, details: grpc.HandlerCallDetails,
                 handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        raise NotImplementedError

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        return self.decorate(details, continuation(details))

    def for_asyncio(self) -> grpc.aio.ServerInterceptor:
        return _AsyncioInterceptor(self)


class _AsyncioInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, interceptor: HandlerInterceptor) -> None:
        self.interceptor = interceptor

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        return self.interceptor.decorate(details, await continuation(details))


class MethodWrapper(HandlerInterceptor):
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

    def decorate(self, details: grpc.HandlerCallDetails,
                 handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None:
            return None
        method = details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class ErrorInterceptor(MethodWrapper):
    """Maps CheckpointdError to its status with ErrorInfo; anything else is a logged INTERNAL."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        deserializer, serializer = _tolerant(handler.request_deserializer), handler.response_serializer
        if handler.unary_unary is not None:
            inner = handler.unary_unary
            if is_async(inner):
                async def unary_async(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    started = _entered()
                    try:
                        _check_decoded(request, method)
                        return await inner(request, context)
                    except Exception as error:
                        await abort_async(context, failure_status(method, context, error, started))

                return grpc.unary_unary_rpc_method_handler(unary_async, deserializer, serializer)

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                started = _entered()
                try:
                    _check_decoded(request, method)
                    return inner(request, context)
                except Exception as error:
                    abort(context, failure_status(method, context, error, started))

            return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream
            if is_async(inner_stream):
                async def stream_async(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                    started = _entered()
                    try:
                        _check_decoded(request, method)
                        async for response in inner_stream(request, context):
                            yield response
                    except Exception as error:
                        await abort_async(context, failure_status(method, context, error, started))

                return grpc.unary_stream_rpc_method_handler(stream_async, deserializer, serializer)

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                started = _entered()
                try:
                    _check_decoded(request, method)
                    yield from inner_stream(request, context)
                except Exception as error:
                    abort(context, failure_status(method, context, error, started))

            return grpc.unary_stream_rpc_method_handler(stream, deserializer, serializer)
        return handler
