"""The server's interceptors build their handler once per method, not once per call, and build
it again when the handler beneath them changes. A real server in this process, a real channel."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.api.access import AccessInterceptor
from checkpointd.api.drain import DrainInterceptor
from checkpointd.api.interceptors import ErrorInterceptor, MethodWrapper
from checkpointd.server import CheckpointdServer, ServerSettings
from tests.helpers import error_info

CREATE = "/checkpoint.v1.CheckpointService/CreateCheckpoint"


class FreshHandlerEachCall(grpc.aio.ServerInterceptor):
    """Sits between the server's own interceptors and hands out a new (equivalent) handler on
    every call, as an interceptor that rebuilds its wrapping per call would."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(handler.unary_unary, handler.request_deserializer,
                                                   handler.response_serializer)


@pytest.fixture
def wraps(monkeypatch) -> Counter:
    """How often each interceptor class built a handler, by (class, method)."""
    built: Counter = Counter()
    for cls in (AccessInterceptor, DrainInterceptor, ErrorInterceptor):
        original = cls.wrap

        def counting(self, method, handler, original=original, cls=cls):
            built[cls.__name__, method] += 1
            return original(self, method, handler)

        monkeypatch.setattr(cls, "wrap", counting)
    return built


@contextmanager
def _serve(base: Path, extra: tuple[grpc.aio.ServerInterceptor, ...] = ()) -> Iterator[pb_grpc.CheckpointServiceStub]:
    settings = ServerSettings(listen=("127.0.0.1:0",), data_dir=base / "data",
                              workspace_roots=(str(base),), extra_interceptors=extra)
    server = CheckpointdServer(settings)
    server.start()
    try:
        with grpc.insecure_channel(server.addresses[0]) as channel:
            yield pb_grpc.CheckpointServiceStub(channel)
    finally:
        server.stop(grace=5)


def test_each_interceptor_builds_one_handler_per_method_for_many_calls(tmp_path, wraps):
    with _serve(tmp_path) as stub:
        plan = str(ULID())
        replies = [stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan, state=b"s"), timeout=30)
                   for _ in range(5)]
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id="not-a-ulid"), timeout=30)
        call = stub.CreateCheckpoint.with_call(pb.CreateCheckpointRequest(plan_id=plan), timeout=30,
                                               metadata=(("x-request-id", "from-the-caller"),))[1]
    assert [r.checkpoint.sequence for r in replies] == [1, 2, 3, 4, 5]
    assert error_info(refused.value).reason == "INVALID_CHECKPOINT_ID"
    # The request id is read from each call's own metadata, not from the first call's.
    assert ("x-request-id", "from-the-caller") in call.trailing_metadata()
    for name in ("AccessInterceptor", "DrainInterceptor", "ErrorInterceptor"):
        assert wraps[name, CREATE] == 1, wraps
        assert wraps[name, "/checkpoint.v1.CheckpointService/GetCheckpoint"] == 1, wraps


def test_a_new_handler_beneath_is_wrapped_anew(tmp_path, wraps):
    with _serve(tmp_path, extra=(FreshHandlerEachCall(),)) as stub:
        plan = str(ULID())
        for _ in range(3):
            stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan), timeout=30)
    # Beneath the extra interceptor nothing changes; above it, every call brings a new handler.
    assert wraps["ErrorInterceptor", CREATE] == 1
    assert wraps["AccessInterceptor", CREATE] == 3
    assert wraps["DrainInterceptor", CREATE] == 3


def test_an_unknown_method_is_not_cached():
    wrapper = ErrorInterceptor()
    details = type("Details", (), {"method": "/checkpoint.v1.CheckpointService/NoSuchMethod",
                                   "invocation_metadata": ()})()
    assert wrapper.intercept_service(lambda _details: None, details) is None
    assert isinstance(wrapper, MethodWrapper) and wrapper._wrapped == {}
