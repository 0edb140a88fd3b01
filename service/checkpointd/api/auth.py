"""Bearer-token authentication: every call must carry ``authorization: Bearer <token>``.

The token comes from a file (re-read when it changes, so a rotated Kubernetes Secret
takes effect without a restart) or from a fixed value (the CHECKPOINTD_TOKEN variable).
Comparison is constant-time. Services named exempt (health, so that kubelet and Docker
probes work; optionally reflection) are open.
"""

from __future__ import annotations

import enum
import hmac
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from checkpointd.api.errors import rich_status
from checkpointd.api.interceptors import HandlerInterceptor, abort, abort_async, is_async, shape_of
from checkpointd.api.tokens import TokenError, token_text
from checkpointd.core.kernel.errors import Reason

log = logging.getLogger("checkpointd.auth")

#: Tokens shorter than this are refused at start-up: they can be guessed.
MIN_TOKEN_LENGTH = 16
_RECHECK_SECONDS = 1.0


class OpenService(enum.StrEnum):
    """Services that may be left reachable without a token (``--auth-exempt``)."""

    HEALTH = "health"
    REFLECTION = "reflection"

    @property
    def service_names(self) -> frozenset[str]:
        match self:
            case OpenService.HEALTH:
                return frozenset({health.SERVICE_NAME})
            case OpenService.REFLECTION:
                return frozenset({reflection.SERVICE_NAME, "grpc.reflection.v1.ServerReflection"})


def _validated(token: bytes | str, origin: str) -> bytes:
    token = token_text(token, origin)
    if not token:
        raise TokenError(f"the bearer token from {origin} is empty")
    if len(token) < MIN_TOKEN_LENGTH:
        raise TokenError(f"the bearer token from {origin} is shorter than {MIN_TOKEN_LENGTH} characters")
    # gRPC metadata values are printable ASCII: a token with anything else could never be sent.
    if any(c.isspace() for c in token) or not (token.isascii() and token.isprintable()):
        raise TokenError(f"the bearer token from {origin} contains whitespace, control or non-ASCII characters "
                         "(a token travels in gRPC metadata, which holds printable ASCII only)")
    return token.encode()


class TokenSource:
    """The expected token; a file-backed one is re-read (at most once a second) when it changes."""

    def __init__(self, token: bytes, path: Path | None = None) -> None:
        self._token = token
        self._path = path
        self._stamp = self._file_stamp() if path else None
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    @classmethod
    def from_value(cls, token: str, origin: str = "CHECKPOINTD_TOKEN") -> TokenSource:
        return cls(_validated(token, origin))

    @classmethod
    def from_file(cls, path: Path) -> TokenSource:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise TokenError(f"cannot read token file {path}: {exc.strerror}") from None
        return cls(_validated(raw, f"token file {path}"), path)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def current(self) -> bytes:
        if self._path is None or time.monotonic() - self._checked < _RECHECK_SECONDS:
            return self._token
        with self._lock:
            self._checked = time.monotonic()
            stamp = self._file_stamp()
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._token = _validated(self._path.read_bytes(), f"token file {self._path}")
                    log.info("bearer token reloaded from %s", self._path)
                except OSError as exc:
                    log.warning("keeping the previous bearer token: cannot read token file %s: %s", self._path,
                                exc.strerror)
                except TokenError as exc:
                    log.warning("keeping the previous bearer token: %s", exc)
            return self._token


def _presented_token(metadata: tuple | None) -> bytes | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, credential = value.strip().partition(" ")
            if scheme.lower() == "bearer" and credential.strip():
                return credential.strip().encode()
    return None


def _service_of(method: str) -> str:
    return method.lstrip("/").partition("/")[0]


def _rejecting(handler: grpc.RpcMethodHandler, method: str, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape (and kind: coroutine or plain) as ``handler`` that fails with UNAUTHENTICATED."""
    status = rpc_status.to_status(rich_status(grpc.StatusCode.UNAUTHENTICATED, message,
                                              Reason.UNAUTHENTICATED.value, {"method": method}))

    def reject(_request: Any, context: grpc.ServicerContext) -> Any:
        abort(context, status)

    async def reject_async(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort_async(context, status)

    async def reject_stream_async(_request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await abort_async(context, status)
        yield

    shape = shape_of(handler)
    if is_async(shape.behaviour):
        return shape.make(reject_stream_async if shape.streams else reject_async, handler.request_deserializer,
                          handler.response_serializer)
    return shape.make(reject, handler.request_deserializer, handler.response_serializer)


class BearerTokenInterceptor(HandlerInterceptor):
    def __init__(self, tokens: TokenSource, open_services: frozenset[OpenService] = frozenset()) -> None:
        self.tokens = tokens
        self.open_service_names = frozenset().union(*(s.service_names for s in open_services))

    def decorate(self, details: grpc.HandlerCallDetails,
                 handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None or _service_of(details.method) in self.open_service_names:
            return handler
        presented = _presented_token(details.invocation_metadata)
        if presented is not None and hmac.compare_digest(presented, self.tokens.current()):
            return handler
        if presented is None:
            message = "this server requires a bearer token: send metadata 'authorization: Bearer <token>'"
        else:
            message = "the bearer token is not valid"
        return _rejecting(handler, details.method, message)
