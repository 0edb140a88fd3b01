"""Outermost interceptor: who asked for what, how it ended, how long it took.

Sets the call's plan_id / checkpoint_id / request_id for the logs, writes one access line
per call, echoes the request id in the ``x-request-id`` response trailer (not a header: sending
headers early would commit the call and stop clients from retrying an UNAVAILABLE) and hands code,
latency and response to the metrics recorder. Counts every outcome, including calls
refused by authentication or drain.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import grpc

from checkpointd.api.interceptors import (
    MethodWrapper,
    begin_call,
    failure_reason,
    given_up_code,
    is_async,
    outcome,
    shape_of,
)
from checkpointd.core.kernel import validation
from checkpointd.logging_setup import request_context

log = logging.getLogger("checkpointd.access")
REQUEST_ID_HEADER = "x-request-id"


class RpcRecorder(Protocol):
    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float, response: Any) -> None: ...


def _field(message: Any, name: str) -> str:
    descriptor = getattr(message, "DESCRIPTOR", None)
    if descriptor is None or name not in descriptor.fields_by_name:
        return ""
    value = getattr(message, name)
    return value if isinstance(value, str) else ""


def _request_id(request: Any, metadata: tuple | None) -> str:
    """The caller's request id when it is a valid one (it is echoed in a header, which
    must be printable ASCII), else a fresh one: 128 random bits from the process's generator,
    which only has to tell log lines apart (a uuid4 reads the kernel's entropy on every call)."""
    candidates = [_field(request, "request_id")]
    candidates += [value for key, value in metadata or () if key == REQUEST_ID_HEADER and isinstance(value, str)]
    for candidate in candidates:
        if candidate and validation.is_valid_request_id(candidate):
            return candidate
    return f"{random.getrandbits(128):032x}"


def _checkpoint_in(response: Any, name: str) -> str:
    descriptor = getattr(response, "DESCRIPTOR", None)
    if descriptor is not None and name in descriptor.fields_by_name and response.HasField(name):
        return getattr(response, name).checkpoint_id
    return ""


class AccessInterceptor(MethodWrapper):
    def __init__(self, recorder: RpcRecorder | None, quiet_services: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.recorder = recorder
        self.quiet_services = quiet_services

    def _finish(self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, started: float,
                response: Any, fields: dict[str, str]) -> None:
        """Records the call now; writes its access line once the reply has gone where the server
        can say when (a sync server's callbacks, an asyncio server's done callbacks for coroutine
        handlers), so the caller never waits for the log; exactly one line per call."""
        seconds = time.monotonic() - started
        if self.recorder is not None:
            self.recorder.record_rpc(method, code, seconds, response)
        quiet = method.lstrip("/").partition("/")[0] in self.quiet_services and code is grpc.StatusCode.OK
        # The context variables are not set where the callback runs: the fields travel as extras.
        extra = {**fields, "method": method, "code": code.name, "duration_ms": round(seconds * 1000, 3)}
        safety = _checkpoint_in(response, "safety_checkpoint")
        if safety:
            extra["safety_checkpoint_id"] = safety
        reason = failure_reason() if code is not grpc.StatusCode.OK else ""
        if reason:
            extra["reason"] = reason
        # The failure's reason is said here, not in a line of its own: one line per call.
        shown = f"{code.name} {reason}" if reason else code.name

        def write(*_done: object) -> None:
            log.log(logging.DEBUG if quiet else logging.INFO, "%s %s %.1fms", method, shown, seconds * 1000,
                    extra=extra)

        add_done_callback = getattr(context, "add_done_callback", None)
        if add_done_callback is not None:
            add_done_callback(write)
        elif not isinstance(context, grpc.ServicerContext) or not context.add_callback(write):
            # The asyncio server's context for plain-function handlers runs its callbacks only
            # after a success: the line is written now.
            write()

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        finish = self._finish

        def context_of(request: Any, context: grpc.ServicerContext) -> dict[str, str]:
            begin_call()
            return {
                "plan_id": _field(request, "plan_id"),
                "checkpoint_id": _field(request, "checkpoint_id") or _field(request, "base_checkpoint_id"),
                "request_id": _request_id(request, context.invocation_metadata()),
            }

        def with_created(response: Any, fields: dict[str, str]) -> dict[str, str]:
            created = _checkpoint_in(response, "checkpoint")
            return {**fields, "checkpoint_id": created} if created and not fields["checkpoint_id"] else fields

        def run_unary(behaviour: Callable, request: Any, context: grpc.ServicerContext, fields: dict) -> Any:
            started = time.monotonic()
            with request_context(**fields):
                context.set_trailing_metadata(((REQUEST_ID_HEADER, fields["request_id"]),))
                try:
                    response = behaviour(request, context)
                except BaseException:
                    finish(context, method, outcome(context, True), started, None, fields)
                    raise
                finish(context, method, outcome(context, False), started, response, with_created(response, fields))
                return response

        async def run_unary_async(behaviour: Callable, request: Any, context: grpc.aio.ServicerContext,
                                  fields: dict) -> Any:
            started = time.monotonic()
            with request_context(**fields):
                context.set_trailing_metadata(((REQUEST_ID_HEADER, fields["request_id"]),))
                try:
                    response = await behaviour(request, context)
                except asyncio.CancelledError:
                    finish(context, method, given_up_code(context), started, None, fields)
                    raise
                except BaseException:
                    finish(context, method, outcome(context, True), started, None, fields)
                    raise
                finish(context, method, outcome(context, False), started, response, with_created(response, fields))
                return response

        def run_stream(behaviour: Callable, request: Any, context: grpc.ServicerContext,
                       fields: dict) -> Iterator[Any]:
            started = time.monotonic()
            with request_context(**fields):
                failed = True
                try:
                    yield from behaviour(request, context)
                    failed = False
                finally:
                    finish(context, method, outcome(context, failed), started, None, fields)

        behaviour, make, unary_request, streams = shape_of(handler)
        if is_async(behaviour):
            if not streams:
                async def one_async(argument: Any, context: grpc.aio.ServicerContext) -> Any:
                    request = argument if unary_request else None
                    return await run_unary_async(behaviour, argument, context, context_of(request, context))

                return make(one_async, handler.request_deserializer, handler.response_serializer)

            async def many_async(argument: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                fields = context_of(argument if unary_request else None, context)
                started = time.monotonic()
                with request_context(**fields):
                    code = None
                    try:
                        async for response in behaviour(argument, context):
                            yield response
                    except (asyncio.CancelledError, GeneratorExit):
                        code = given_up_code(context)
                        raise
                    except BaseException:
                        code = outcome(context, True)
                        raise
                    finally:
                        finish(context, method, code or outcome(context, False), started, None, fields)

            return make(many_async, handler.request_deserializer, handler.response_serializer)
        if not streams:
            return make(lambda argument, context: run_unary(
                behaviour, argument, context, context_of(argument if unary_request else None, context)),
                handler.request_deserializer, handler.response_serializer)
        return make(lambda argument, context: run_stream(
            behaviour, argument, context, context_of(argument if unary_request else None, context)),
            handler.request_deserializer, handler.response_serializer)

