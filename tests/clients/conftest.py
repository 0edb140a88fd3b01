"""Fixtures for the client tests: connections to the real server over TCP and the unix socket."""

from __future__ import annotations

import queue
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import config_service_pb2, config_service_pb2_grpc
from checkpointd_client import AutoTrigger, Checkpoint, CheckpointClient, Checkpointd, CheckpointdRpcError, ConfigKey
from checkpointd_client.client import JsonValue, to_value

ListPlan = Callable[..., list[Checkpoint]]


@pytest.fixture(params=["tcp", "unix"])
def target(request: pytest.FixtureRequest, checkpointd_server) -> str:
    """The session server's address, once per transport."""
    return checkpointd_server.tcp_target if request.param == "tcp" else checkpointd_server.unix_target


@pytest.fixture
def checkpointd(target: str) -> Iterator[Checkpointd]:
    """A client wired to the session server, reading its checkpoint settings."""
    with Checkpointd(target) as connection:
        yield connection


@pytest.fixture
def fresh_checkpointd(fresh_server) -> Iterator[Checkpointd]:
    """A client wired to a server of this test's own (which the test may stop)."""
    with Checkpointd(fresh_server.tcp_target) as connection:
        yield connection


@pytest.fixture
def fresh_workspace(fresh_server) -> Path:
    """An empty workspace the fresh server accepts."""
    return Path(tempfile.mkdtemp(prefix="ws-", dir=fresh_server.allowed_root))


def _list_plan(client: CheckpointClient, plan_id: str, filter_expr: str = "") -> list[Checkpoint]:
    try:
        return client.list_checkpoints(plan_id, filter_expr=filter_expr)
    except CheckpointdRpcError as error:
        if error.code == grpc.StatusCode.NOT_FOUND and error.reason == "PLAN_NOT_FOUND":
            return []
        raise


@pytest.fixture
def list_plan() -> ListPlan:
    """list_plan(client, plan_id, filter_expr=""): a plan's checkpoints, [] for a plan never seen."""
    return _list_plan


@pytest.fixture
def new_plan_id() -> Callable[[], str]:
    return lambda: str(ULID())


# ---------------------------------------------------------------------------------------------
# Fault injection: the only fakes in these tests. Everything else is the real server.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardedCall:
    method: str
    request: bytes
    metadata: dict[str, str]


class FaultProxy:
    """A pass-through gRPC server in front of the real one that can lose responses on the way back.

    A lost response is the case retries exist for: the server did the work, the client saw
    UNAVAILABLE and sends the same request again.
    """

    def __init__(self, upstream_target: str) -> None:
        self._upstream = grpc.insecure_channel(upstream_target)
        self._lock = threading.Lock()
        self._responses_to_drop: dict[str, int] = {}
        self.calls: list[ForwardedCall] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers([_ForwardingHandler(self)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.target = f"127.0.0.1:{port}"

    def drop_responses(self, method_name: str, count: int) -> None:
        """Forward the next `count` calls of `method_name`, then answer UNAVAILABLE instead."""
        with self._lock:
            self._responses_to_drop[method_name] = count

    def calls_to(self, method_name: str) -> list[ForwardedCall]:
        with self._lock:
            return [call for call in self.calls if call.method.endswith("/" + method_name)]

    def forward(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        method_name = method.rsplit("/", 1)[-1]
        with self._lock:
            self.calls.append(ForwardedCall(method, request, dict(context.invocation_metadata())))
        try:
            response = self._upstream.unary_unary(method)(request, timeout=context.time_remaining())
        except grpc.RpcError as error:
            context.set_trailing_metadata(error.trailing_metadata())
            context.abort(error.code(), error.details())
        with self._lock:
            drop = self._responses_to_drop.get(method_name, 0) > 0
            if drop:
                self._responses_to_drop[method_name] -= 1
        if drop:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fault injected: the response was lost")
        return response

    def close(self) -> None:
        self._server.stop(grace=None)
        self._upstream.close()


class _ForwardingHandler(grpc.GenericRpcHandler):
    def __init__(self, proxy: FaultProxy) -> None:
        self._proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._proxy.forward(method, request, context)
        )


@pytest.fixture
def fault_proxy(checkpointd_server) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the session server (TCP)."""
    proxy = FaultProxy(checkpointd_server.tcp_target)
    yield proxy
    proxy.close()


@pytest.fixture
def hung_server_target() -> Iterator[str]:
    """A TCP address that accepts connections and never answers, like a hung checkpointd."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        yield f"127.0.0.1:{listener.getsockname()[1]}"


class ScriptedConfigService(config_service_pb2_grpc.ConfigServiceServicer):
    """A ConfigService that serves whatever values the test pushes, including ones no real server would."""

    def __init__(self) -> None:
        self.values: dict[str, JsonValue] = {
            ConfigKey.AUTO_CREATE_ON.value: [t.value for t in AutoTrigger],
            ConfigKey.ON_UNAVAILABLE.value: "proceed",
            ConfigKey.CLIENT_DEADLINE_MS.value: 5000,
        }
        self._pushed: queue.Queue[str] = queue.Queue()
        self.reads_started = threading.Event()
        self._reads_released = threading.Event()
        self._reads_released.set()
        self.read_failure: grpc.StatusCode | None = None
        self.plans_read: list[str] = []
        self.watches_opened = 0
        self._watches_broken = threading.Event()

    def push(self, key: str, value: JsonValue) -> None:
        self.values[key] = value
        self._pushed.put(key)

    def hold_reads(self) -> None:
        """Fault: GetConfig answers nothing until release_reads() (a stuck server, for one RPC)."""
        self._reads_released.clear()

    def release_reads(self) -> None:
        self._reads_released.set()

    def break_watches(self) -> None:
        """Fault: every open WatchConfig stream ends with UNAVAILABLE (a server gone for a moment)."""
        self._watches_broken.set()

    def _entry(self, key: str) -> config_service_pb2.ConfigEntry:
        return config_service_pb2.ConfigEntry(
            key=key, value=to_value(self.values[key]), source=config_service_pb2.CONFIG_SOURCE_GLOBAL
        )

    def GetConfig(self, request, context):  # noqa: N802 - gRPC method name
        self.reads_started.set()
        self._reads_released.wait()
        self.plans_read.append(request.plan_id)
        if self.read_failure is not None:
            context.abort(self.read_failure, "fault injected: the read is refused")
        return config_service_pb2.GetConfigResponse(entry=self._entry(request.key))

    def WatchConfig(self, request, context):  # noqa: N802 - gRPC method name
        self.watches_opened += 1
        self._watches_broken.clear()
        for key in request.keys:
            yield config_service_pb2.WatchConfigResponse(entry=self._entry(key))
        while context.is_active():
            if self._watches_broken.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "fault injected: the watch is broken")
            try:
                key = self._pushed.get(timeout=0.1)
            except queue.Empty:
                continue
            yield config_service_pb2.WatchConfigResponse(entry=self._entry(key))


@dataclass
class ScriptedConfigServer:
    service: ScriptedConfigService
    target: str


@pytest.fixture
def scripted_config_server() -> Iterator[ScriptedConfigServer]:
    service = ScriptedConfigService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    config_service_pb2_grpc.add_ConfigServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield ScriptedConfigServer(service, f"127.0.0.1:{port}")
    service.release_reads()
    server.stop(grace=None)
