"""Assembles the gRPC server: services, health, reflection, listeners, graceful drain."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from checkpoint.v1 import (
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    config_service_pb2,
    config_service_pb2_grpc,
)
from checkpointd.api.checkpoint_servicer import CheckpointServicer
from checkpointd.api.config_servicer import ConfigServicer
from checkpointd.api.interceptors import ErrorInterceptor
from checkpointd.core.checkpoints import Checkpoints, EngineSettings
from checkpointd.core.config import ConfigStore
from checkpointd.core.db import Database
from checkpointd.core.db_store import StoreKind, open_store

log = logging.getLogger("checkpointd")

SERVICE_NAMES = (
    checkpoint_service_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name,
    config_service_pb2.DESCRIPTOR.services_by_name["ConfigService"].full_name,
)
#: Largest request accepted: a 16 MiB state plus headroom for the other fields.
MAX_RECEIVE_BYTES = 32 * 1024 * 1024
MAX_SEND_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    listen: tuple[str, ...]
    data_dir: Path
    workspace_roots: tuple[str, ...]
    db_url: str = ""
    #: Where content lives: "disk" (under data_dir) or "db" (in the database, for replicas without shared disk).
    store: str = StoreKind.DISK.value
    max_workers: int = 32
    grace_seconds: float = 30.0
    extra_interceptors: tuple[grpc.ServerInterceptor, ...] = field(default=())

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_dir / 'checkpointd.db'}"


def _prepare_unix_socket(path: str) -> None:
    """Removes a stale socket file left by a crashed server; refuses to steal a live one."""
    if not os.path.exists(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise RuntimeError(f"another server is listening on unix socket {path}")
    finally:
        probe.close()


class CheckpointdServer:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.db = Database(settings.database_url)
        self.db.migrate()
        self.store = open_store(settings.store, self.db, settings.data_dir)
        self.config = ConfigStore(self.db)
        self.checkpoints = Checkpoints(self.db, self.store, self.config,
                                       EngineSettings(settings.data_dir, settings.workspace_roots))
        self._stopping = threading.Event()
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=settings.max_workers, thread_name_prefix="rpc"),
            interceptors=[*settings.extra_interceptors, ErrorInterceptor()],
            options=[
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        checkpoint_service_pb2_grpc.add_CheckpointServiceServicer_to_server(
            CheckpointServicer(self.checkpoints), self.server)
        config_service_pb2_grpc.add_ConfigServiceServicer_to_server(
            ConfigServicer(self.config, self._stopping.is_set), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        self.addresses: list[str] = []
        self._unix_paths: list[str] = []
        for address in settings.listen:
            self.addresses.append(self._add_listener(address))

    def _add_listener(self, address: str) -> str:
        if address.startswith("unix:"):
            path = address.removeprefix("unix://") if address.startswith("unix://") else address.removeprefix("unix:")
            _prepare_unix_socket(path)
            self.server.add_insecure_port(f"unix://{path}")
            self._unix_paths.append(path)
            return f"unix://{path}"
        port = self.server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError(f"cannot listen on {address}")
        host = address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    def start(self) -> None:
        self.server.start()
        for path in self._unix_paths:
            os.chmod(path, 0o660)
        for name in ("", *SERVICE_NAMES):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("checkpointd listening on %s", " ".join(self.addresses))

    def stop(self, grace: float | None = None) -> None:
        """Drains: health flips to NOT_SERVING first, new calls are refused, in-flight
        checkpoints and rollbacks get ``grace`` seconds to finish, watch streams end."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.health.enter_graceful_shutdown()
        self.config.wake_all()
        self.server.stop(self.settings.grace_seconds if grace is None else grace).wait()
        for path in self._unix_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.db.dispose()
        log.info("checkpointd stopped")

    def wait(self) -> None:
        self.server.wait_for_termination()
