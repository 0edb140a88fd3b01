"""Graceful drain: once shutdown begins, new calls are refused with UNAVAILABLE /
SHUTTING_DOWN while the calls already running (checkpoints, rollbacks) finish. Health and
reflection stay reachable, so probes read NOT_SERVING instead of a refused connection. A call
still running when the grace period ends is answered UNAVAILABLE / SHUTTING_DOWN too (see
``Drain.cut_off``), not gRPC's CANCELLED, which clients do not retry."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from grpc_status import rpc_status

from checkpointd.api.errors import to_status
from checkpointd.api.interceptors import MethodWrapper, abort, abort_async, is_async
from checkpointd.core.kernel.errors import Reason, Unavailable


class Drain:
    """Counts in-flight unary calls; ``begin`` stops admitting new ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._in_flight = 0
        self._draining = False
        #: The tasks of the coroutine calls in flight (touched on the event loop only).
        self._tasks: set[asyncio.Task] = set()
        self._cut_off = False

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def was_cut_off(self) -> bool:
        return self._cut_off

    def admit(self, task: asyncio.Task | None = None) -> bool:
        """Counts a call in, unless draining; ``task``, a coroutine call's, can be cut off."""
        with self._cond:
            if self._draining:
                return False
            self._in_flight += 1
        if task is not None:
            self._tasks.add(task)
        return True

    def done(self, task: asyncio.Task | None = None) -> None:
        if task is not None:
            self._tasks.discard(task)
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def begin(self) -> None:
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    def cut_off(self) -> None:
        """The grace period is over: every coroutine call still in flight stops waiting for its
        work and is answered UNAVAILABLE (see ``_cut_off_status``). Runs on the event loop.
        The work itself goes on in its thread and may still complete: each step was already
        safe against a caller that gives up (a client's cancel takes the same path)."""
        self._cut_off = True
        for task in self._tasks:
            task.cancel("checkpointd's grace period ended")

    def wait_idle(self, timeout: float) -> bool:
        """True when every admitted call finished within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout=max(0.0, deadline - time.monotonic()))


def _refusal() -> grpc.Status:
    error = Unavailable(Reason.SHUTTING_DOWN, "checkpointd is shutting down; retry elsewhere or later")
    return rpc_status.to_status(to_status(error))


def _cut_off_status() -> grpc.Status:
    error = Unavailable(Reason.SHUTTING_DOWN,
                        "checkpointd stopped before this call finished (its grace period ended): it may "
                        "still have taken effect; retry with the same request_id, elsewhere or later")
    return rpc_status.to_status(to_status(error))


class DrainInterceptor(MethodWrapper):
    def __init__(self, drain: Drain, always_open: frozenset[str]) -> None:
        super().__init__()
        self.drain = drain
        self.always_open = always_open

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if method.lstrip("/").partition("/")[0] in self.always_open:
            return handler
        drain = self.drain
        deserializer, serializer = handler.request_deserializer, handler.response_serializer
        if handler.unary_unary is not None:
            inner = handler.unary_unary
            if is_async(inner):
                async def unary_async(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    task = asyncio.current_task()
                    if not drain.admit(task):
                        await abort_async(context, _refusal())
                    try:
                        return await inner(request, context)
                    except asyncio.CancelledError:
                        if not drain.was_cut_off:
                            raise  # the client cancelled
                        await abort_async(context, _cut_off_status())
                    finally:
                        drain.done(task)

                return grpc.unary_unary_rpc_method_handler(unary_async, deserializer, serializer)

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                if not drain.admit():
                    abort(context, _refusal())
                try:
                    return inner(request, context)
                finally:
                    drain.done()

            return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream
            # Watch streams are not waited for: they end when the server stops.
            if is_async(inner_stream):
                async def stream_async(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                    if drain.draining:
                        await abort_async(context, _refusal())
                    async for response in inner_stream(request, context):
                        yield response

                return grpc.unary_stream_rpc_method_handler(stream_async, deserializer, serializer)

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                if drain.draining:
                    abort(context, _refusal())
                yield from inner_stream(request, context)

            return grpc.unary_stream_rpc_method_handler(stream, deserializer, serializer)
        return handler
