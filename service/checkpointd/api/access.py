"""Outermost interceptor: who asked for what, how it ended, how long it took.

Sets the call's plan_id / checkpoint_id / request_id for the logs, writes one access line
per call, echoes the request id in the ``x-request-id`` response trailer (not a header: sending
headers early would commit the call and stop clients from retrying an UNAVAILABLE) and hands code,
latency and response to the metrics recorder. Counts every outcome, including calls
refused by authentication or drain.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from checkpointd.api.interceptors import MethodWrapper
from checkpointd.core import validation
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
        """Records the call now; writes its access line once the reply has gone (gRPC runs the
        call's callbacks after sending its status), so the caller never waits for the log."""
        seconds = time.monotonic() - started
        if self.recorder is not None:
            self.recorder.record_rpc(method, code, seconds, response)
        quiet = method.lstrip("/").partition("/")[0] in self.quiet_services and code is grpc.StatusCode.OK
        # The context variables are not set where the callback runs: the fields travel as extras.
        extra = {**fields, "method": method, "code": code.name, "duration_ms": round(seconds * 1000, 3)}
        safety = _checkpoint_in(response, "safety_checkpoint")
        if safety:
            extra["safety_checkpoint_id"] = safety

        def write() -> None:
            log.log(logging.DEBUG if quiet else logging.INFO, "%s %s %.1fms", method, code.name, seconds * 1000,
                    extra=extra)

        if not context.add_callback(write):
            write()

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        finish = self._finish

        def context_of(request: Any, context: grpc.ServicerContext) -> dict[str, str]:
            return {
                "plan_id": _field(request, "plan_id"),
                "checkpoint_id": _field(request, "checkpoint_id") or _field(request, "base_checkpoint_id"),
                "request_id": _request_id(request, context.invocation_metadata()),
            }

        def outcome(context: grpc.ServicerContext, failed: bool) -> grpc.StatusCode:
            code = context.code()
            if isinstance(code, grpc.StatusCode):
                return code
            return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK

        def run_unary(behaviour: Callable, request: Any, context: grpc.ServicerContext, fields: dict) -> Any:
            started = time.monotonic()
            with request_context(**fields):
                context.set_trailing_metadata(((REQUEST_ID_HEADER, fields["request_id"]),))
                try:
                    response = behaviour(request, context)
                except BaseException:
                    finish(context, method, outcome(context, True), started, None, fields)
                    raise
                created = _checkpoint_in(response, "checkpoint")
                if created and not fields["checkpoint_id"]:
                    fields = {**fields, "checkpoint_id": created}
                finish(context, method, outcome(context, False), started, response, fields)
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

        if handler.unary_unary is not None:
            inner = handler.unary_unary
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: run_unary(inner, request, context, context_of(request, context)),
                handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: run_stream(inner_us, request, context, context_of(request, context)),
                handler.request_deserializer, handler.response_serializer)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary
            return grpc.stream_unary_rpc_method_handler(
                lambda requests, context: run_unary(inner_su, requests, context, context_of(None, context)),
                handler.request_deserializer, handler.response_serializer)
        inner_ss = handler.stream_stream
        return grpc.stream_stream_rpc_method_handler(
            lambda requests, context: run_stream(inner_ss, requests, context, context_of(None, context)),
            handler.request_deserializer, handler.response_serializer)
