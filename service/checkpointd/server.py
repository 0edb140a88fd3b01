"""Assembles the gRPC server: services, health, reflection, listeners and their security,
metrics, periodic retention + GC, graceful drain.

The server is a ``grpc.aio`` server on an event loop of its own thread, so that a state-only
CreateCheckpoint is served on the loop without a thread switch (see ``Checkpoints.create_async``);
every other call runs in a thread pool, as on a sync server. ``CheckpointdServer``'s own methods
are plain ones, called from any thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Coroutine
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from checkpoint.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    config_service_pb2,
    config_service_pb2_grpc,
)
from checkpointd.api.access import AccessInterceptor
from checkpointd.api.admin_servicer import AdminServicer
from checkpointd.api.auth import BearerTokenInterceptor, OpenService, TokenSource
from checkpointd.api.checkpoint_servicer import AsyncCheckpointServicer
from checkpointd.api.config_servicer import AsyncConfigServicer
from checkpointd.api.drain import Drain, DrainInterceptor
from checkpointd.api.interceptors import ErrorInterceptor, HandlerInterceptor
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.kernel import telemetry
from checkpointd.core.maintenance.datadir_lock import DataDirLock, ServingLock, needs_data_dir_lock
from checkpointd.core.maintenance.fsck import FsckReport
from checkpointd.core.maintenance.fsck import check as check_integrity
from checkpointd.core.maintenance.retention import GcPostponed, Maintenance, MaintenanceReport
from checkpointd.core.maintenance.usage import PlansUsage, plans_usage
from checkpointd.core.metadata.db import Database
from checkpointd.core.restore.journal import LEGACY_DIRECTORY
from checkpointd.core.store.db_store import StoreKind, open_store
from checkpointd.listeners import (
    MAX_UNIX_PATH_BYTES,
    Listener,
    ListenerError,
    TlsFiles,
    check_address_free,
    is_loopback,
    parse_listen,
    parse_tcp,
    stale_socket,
)
from checkpointd.serve_options import RECHECK_INTERVAL_SECONDS, OptionError, first_line

log = logging.getLogger("checkpointd")
T = TypeVar("T")

SERVICE_NAMES = (
    checkpoint_service_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name,
    config_service_pb2.DESCRIPTOR.services_by_name["ConfigService"].full_name,
    admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)
#: Largest request accepted: a 16 MiB state plus headroom for the other fields.
MAX_RECEIVE_BYTES = 32 * 1024 * 1024
MAX_SEND_BYTES = 64 * 1024 * 1024
#: Health and reflection answer during a drain, so probes read NOT_SERVING.
_ALWAYS_OPEN = OpenService.HEALTH.service_names | OpenService.REFLECTION.service_names
#: Threads of the pool that plan calls (captures, diffs, rollbacks) never take: what Get, List and the
#: config service keep while captures are stuck on their workspaces.
RESERVED_THREADS = 8
#: How long past its grace period a drain waits for gRPC's own stop before it goes on.
STOP_SLACK_SECONDS = 2.0
#: How long the calls cut off at the end of the grace period get to send their UNAVAILABLE.
CUT_OFF_ANSWER_SECONDS = 1.0
#: How often the main thread wakes to run signal handlers (see CheckpointdServer.wait).
WAIT_SLICE_SECONDS = 0.2
#: How long a drain waits for the event loop to flip health, or to stop, before it goes on: a
#: drain always ends, whatever holds the loop.
LOOP_ANSWER_SECONDS = 10.0


def plan_threads(max_workers: int) -> int:
    """How many of ``max_workers`` threads plan calls may take at once (at least one)."""
    return max(1, max_workers - RESERVED_THREADS)


@dataclass(frozen=True)
class ServerSettings:
    listen: tuple[str, ...]
    data_dir: Path
    workspace_roots: tuple[str, ...]
    db_url: str = ""
    #: Where content lives: "disk" (under data_dir) or "db" (in the database, for replicas without shared disk).
    store: str = StoreKind.DISK.value
    #: Watch workspaces so that a checkpoint re-examines only what changed (off: full scans).
    watcher: bool = True
    #: Seconds between rechecks of the watched files' stats, for writes no watcher event reports; 0 for none.
    recheck_interval_seconds: float = RECHECK_INTERVAL_SECONDS
    #: Threads that run the calls not served on the event loop.
    max_workers: int = 32
    grace_seconds: float = 30.0
    #: How long a drain goes on answering new calls UNAVAILABLE once nothing is in flight, before
    #: gRPC's own stop (within the grace period): calls already on their way when it began get
    #: that retryable answer, where the stop would have cancelled them (CANCELLED is not retried).
    linger_seconds: float = 0.25
    extra_interceptors: tuple[grpc.aio.ServerInterceptor, ...] = field(default=())
    #: Permission bits of unix sockets (created owner-only, then set to this).
    socket_mode: int = 0o660
    #: When set, every call (except ``open_services``) needs ``authorization: Bearer <token>``.
    token: TokenSource | None = None
    open_services: frozenset[OpenService] = frozenset({OpenService.HEALTH})
    #: TLS (and mTLS with a client CA) for TCP listeners; unix sockets rely on file permissions.
    tls: TlsFiles | None = None
    #: Without this, a TCP listener off loopback needs a token or client certificates.
    allow_unauthenticated_remote: bool = False
    #: HOST:PORT of the Prometheus /metrics endpoint; empty for none.
    metrics_listen: str = ""
    #: Seconds between retention + GC runs; 0 for none.
    gc_interval_seconds: float = 0.0
    #: Seconds between measurements of each plan's store usage for the metrics (with
    #: ``metrics_listen`` only); 0 for none.
    usage_interval_seconds: float = 300.0

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_dir / 'checkpointd.db'}"


def _prepare_unix_socket(path: str) -> None:
    """Removes a stale socket file left by a crashed server; refuses to steal a live one, and
    never removes anything that is not a socket (see listeners.stale_socket)."""
    if stale_socket(path):
        os.unlink(path)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def check_listener_security(listeners: list[Listener], settings: ServerSettings) -> None:
    """A listener reachable from other hosts must authenticate its callers, unless told otherwise."""
    authenticated = settings.token is not None or (settings.tls is not None and settings.tls.client_ca is not None)
    for listener in listeners:
        if listener.is_unix or is_loopback(listener.host):
            continue
        if not authenticated and not settings.allow_unauthenticated_remote:
            raise ListenerError(
                f"refusing to listen on {listener.grpc_address} without authentication: it is reachable from "
                "other hosts. Set a bearer token (--token-file or CHECKPOINTD_TOKEN), require client "
                "certificates (--tls-client-ca), listen on loopback or a unix socket, or pass "
                "--allow-unauthenticated-remote if the network is trusted")
        if settings.token is not None and settings.tls is None:
            log.warning("%s is reachable from other hosts and the bearer token travels in clear text; "
                        "consider --tls-cert/--tls-key", listener.grpc_address)


def _make_data_dir(data_dir: Path) -> None:
    """Creates the data directory (and its parents); one line when it cannot be one."""
    if os.path.lexists(data_dir) and not data_dir.is_dir():
        raise OptionError(f"data directory {data_dir} exists and is not a directory: give another with --data-dir "
                          "(env CHECKPOINTD_DATA_DIR)")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OptionError(f"cannot create data directory {data_dir}: {exc.strerror}") from None
    # One that exists may still take no file (a read-only mount, /proc, its permission bits for a
    # server that is not root): said here, not as a traceback from the first file made in it.
    probe = data_dir / f".checkpointd-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        probe.unlink()
    except OSError as exc:
        raise OptionError(f"cannot write in data directory {data_dir}: {exc.strerror}: give another with "
                          "--data-dir (env CHECKPOINTD_DATA_DIR)") from None


def _shown_url(settings: ServerSettings) -> str:
    """The database as an error names it: the SQLite file, or the URL without its password."""
    if not settings.db_url:
        return str(settings.data_dir / "checkpointd.db")
    try:
        return make_url(settings.db_url).render_as_string(hide_password=True)
    except Exception:  # a URL SQLAlchemy cannot parse is named by its scheme only
        return settings.db_url.partition(":")[0] + " URL"


def _private_socket_name(path: str) -> str:
    """A name in ``path``'s directory for gRPC to bind, no longer than a socket path may be; the
    path itself when there is no room for one."""
    directory = os.path.dirname(path)
    candidate = os.path.join(directory, f".checkpointd-{os.getpid()}-{secrets.token_hex(4)}.sock")
    return candidate if len(os.fsencode(candidate)) <= MAX_UNIX_PATH_BYTES else path


def _link_into_place(bound: str, path: str) -> None:
    """Gives the socket bound at ``bound`` the name ``path`` (a hard link, which never replaces
    anything that appeared at ``path`` meanwhile), then drops ``bound``."""
    appeared = (f"{path} appeared while this server was binding it: refusing to replace it; give this server "
                "another socket with --listen unix:///PATH (env CHECKPOINTD_LISTEN)")
    try:
        os.link(bound, path)
    except FileExistsError:
        os.unlink(bound)
        raise ListenerError(appeared) from None
    except OSError:
        # A file system without hard links: a rename, unless something is there now.
        if os.path.lexists(path):
            os.unlink(bound)
            raise ListenerError(appeared) from None
        os.rename(bound, path)
        return
    os.unlink(bound)


def _remove_own_socket(path: str, identity: tuple[int, int, int]) -> None:
    """Unlinks ``path`` only if it is still the socket file this server bound (the same st_dev,
    st_ino and st_ctime_ns): a socket another server has made there since, or anything else, is
    left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino, st.st_ctime_ns) == identity:
        os.unlink(path)
    else:
        log.warning("leaving %s alone: it is no longer the socket this server made", path)


def _result_in_slices(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """``future.result(timeout)``, waited for in WAIT_SLICE_SECONDS slices: a main thread blocked
    on a lock for good never runs the handler of a signal the kernel handed to another thread
    (see CheckpointdServer.wait)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAIT_SLICE_SECONDS if deadline is None else max(0.0, min(WAIT_SLICE_SECONDS,
                                                                         deadline - time.monotonic()))
        try:
            return future.result(left)
        except concurrent.futures.TimeoutError:
            if future.done() or (deadline is not None and time.monotonic() >= deadline):
                raise


class CheckpointdServer:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        listeners = [parse_listen(address) for address in settings.listen]
        check_listener_security(listeners, settings)
        if not 0 <= settings.socket_mode <= 0o777:
            raise ListenerError(f"socket mode {settings.socket_mode:o} is not a permission mode")
        # Before anything is created: a busy address must not leave a new database behind.
        for listener in listeners:
            check_address_free(listener)
        if settings.metrics_listen:
            check_address_free(parse_tcp(settings.metrics_listen))
        _make_data_dir(settings.data_dir)
        self.db = Database(settings.database_url)
        self._serving_lock = ServingLock(Path(self.db.sqlite_path)).acquire() if self.db.sqlite_path else None
        self._data_lock: DataDirLock | None = None
        # What a start that fails (or a second Ctrl-C) undoes, the last made first; once all is
        # made, stop() does (a later failure is undone by _abandon).
        with contextlib.ExitStack() as undo:
            undo.callback(self._release_locks)
            undo.callback(self.db.dispose)
            try:
                self._data_lock = DataDirLock.for_server(
                    settings.data_dir, settings.store, settings.gc_interval_seconds,
                    fenced_by_database=not needs_data_dir_lock(settings.store, self.db)).acquire()
                self.db.migrate()
            except SQLAlchemyError as exc:
                raise OptionError(f"cannot use the database {_shown_url(settings)}: {first_line(exc)}") from None
            self.store = open_store(settings.store, self.db, settings.data_dir)
            undo.callback(self.store.close)
            self.config = ConfigStore(self.db)
            self.checkpoints = Checkpoints(self.db, self.store, self.config,
                                           EngineSettings(settings.data_dir, settings.workspace_roots,
                                                          watcher=settings.watcher,
                                                          recheck_interval_seconds=settings.recheck_interval_seconds))
            undo.callback(self.checkpoints.close)
            self.maintenance = Maintenance(self.db, self.store, self.checkpoints.trees, self.config,
                                           self.checkpoints.delete)
            self.metrics = None
            if settings.metrics_listen:
                from checkpointd.metrics import PrometheusMetrics

                self.metrics = PrometheusMetrics(self.store)
            undo.pop_all()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.drain = Drain()
        self._executor = futures.ThreadPoolExecutor(max_workers=settings.max_workers, thread_name_prefix="rpc")
        # uvloop: the same loop, cheaper per call (paired, 16 and 64 clients: 13% more state-only creates/s).
        self._loop = uvloop.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._loop_thread.start()
        self.addresses: list[str] = []
        self.metrics_address = ""
        #: The unix sockets this server made: path and (st_dev, st_ino, st_ctime_ns) once bound.
        self._unix_paths: list[tuple[str, tuple[int, int, int]]] = []
        #: Set when a step of stop()'s teardown failed (logged); serve then exits 1.
        self.teardown_failed = False
        self._maintenance_thread: threading.Thread | None = None
        self._usage_thread: threading.Thread | None = None
        #: Made by _build, on the loop.
        self.server: grpc.aio.Server | None = None
        build = asyncio.run_coroutine_threadsafe(self._build(listeners), self._loop)
        try:
            _result_in_slices(build)
        except BaseException:
            # A second drain signal while serve waited (KeyboardInterrupt), or a listener that
            # could not be bound: nothing was served, and what the build made goes, its unix
            # socket files with it.
            self._abandon(build)
            raise

    def _on_loop(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Runs ``coroutine`` on the server's event loop and waits for its result (at most
        ``timeout`` seconds: then concurrent.futures.TimeoutError)."""
        return _result_in_slices(asyncio.run_coroutine_threadsafe(coroutine, self._loop), timeout)

    def _abandon(self, build: concurrent.futures.Future) -> None:
        """Undoes a build that was interrupted or failed. One the loop has not begun never runs;
        one it has runs whole (it awaits nothing), so it is waited for before its listeners close."""
        self._stopping.set()
        if not build.cancel():
            concurrent.futures.wait([build], timeout=LOOP_ANSWER_SECONDS)
        server = self.server
        if server is not None:
            self._teardown("closing the listeners",
                           lambda: self._on_loop(server.stop(0), timeout=LOOP_ANSWER_SECONDS))
        self._release(grace=0)

    async def _build(self, listeners: list[Listener]) -> None:
        """Made on the loop: the asyncio server and its health servicer belong to the loop they are made on."""
        settings = self.settings
        self.health = health.aio.HealthServicer()
        interceptors: list[HandlerInterceptor] = [
            AccessInterceptor(self.metrics, quiet_services=_ALWAYS_OPEN),
            DrainInterceptor(self.drain, _ALWAYS_OPEN),
        ]
        if settings.token is not None:
            interceptors.append(BearerTokenInterceptor(settings.token, settings.open_services))
        self.server = grpc.aio.server(
            migration_thread_pool=self._executor,
            interceptors=[*(i.for_asyncio() for i in interceptors), *settings.extra_interceptors,
                          ErrorInterceptor().for_asyncio()],
            options=[
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        checkpoint_service_pb2_grpc.add_CheckpointServiceServicer_to_server(
            AsyncCheckpointServicer(self.checkpoints, self._executor, plan_threads(settings.max_workers)),
            self.server)
        config_service_pb2_grpc.add_ConfigServiceServicer_to_server(
            AsyncConfigServicer(self.config, self._stopping.is_set, self._executor), self.server)
        admin_service_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(self.check_integrity), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        for listener in listeners:
            self.addresses.append(self._add_listener(listener))

    def _add_listener(self, listener: Listener) -> str:
        if listener.is_unix:
            path = listener.unix_path
            _prepare_unix_socket(path)
            # gRPC binds a private name beside the path, which is then linked into place: gRPC's own
            # shutdown unlinks whatever socket is at the name it bound, and that name is gone by then,
            # so a socket another server has made at the path since is not removed (stop() removes
            # the path only while it is still this server's socket).
            bound = _private_socket_name(path)
            # The socket file is created here: owner-only from the first instant, then widened.
            previous = os.umask(0o177)
            try:
                self.server.add_insecure_port(f"unix://{bound}")
            except RuntimeError:  # grpc's "Failed to bind"
                raise ListenerError(f"cannot listen on unix socket {path}: gRPC could not bind it; give another "
                                    "with --listen unix:///PATH (env CHECKPOINTD_LISTEN)") from None
            finally:
                os.umask(previous)
            os.chmod(bound, self.settings.socket_mode)
            if bound != path:
                _link_into_place(bound, path)
            # Its inode number alone could be a new file's (a freed inode is soon reused): the ctime
            # tells them apart.
            made = os.lstat(path)
            self._unix_paths.append((path, (made.st_dev, made.st_ino, made.st_ctime_ns)))
            return f"unix://{path}"
        address = listener.grpc_address
        try:
            if self.settings.tls is not None:
                port = self.server.add_secure_port(address, self.settings.tls.server_credentials())
            else:
                port = self.server.add_insecure_port(address)
        except RuntimeError:  # grpc's "Failed to bind": taken since check_address_free looked
            port = 0
        if port == 0:
            raise ListenerError(f"cannot listen on {address}: the address is taken or unusable; pick another with "
                                "--listen HOST:PORT (env CHECKPOINTD_LISTEN)")
        return f"{listener.display_host}:{port}"

    def start(self) -> None:
        if self.metrics is not None:
            telemetry.bind(self.metrics)
            try:
                self.metrics_address = self.metrics.serve(self.settings.metrics_listen)
            except ListenerError:
                # Taken since __init__ looked: nothing served yet; the socket files and locks go.
                self.stop(0)
                raise
        self._on_loop(self._start())
        if self.settings.gc_interval_seconds > 0:
            self._maintenance_thread = threading.Thread(target=self._maintenance_loop, name="maintenance",
                                                        daemon=True)
            self._maintenance_thread.start()
        if self.metrics is not None and self.settings.usage_interval_seconds > 0:
            self._usage_thread = threading.Thread(target=self._usage_loop, name="usage", daemon=True)
            self._usage_thread.start()
        log.info("checkpointd listening on %s", " ".join(self.addresses))

    async def _start(self) -> None:
        await self.server.start()
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def check_integrity(self, full: bool = False) -> FsckReport:
        """``checkpointd fsck`` on the live store (AdminService.CheckIntegrity)."""
        return check_integrity(self.db, self.store, self.settings.data_dir / LEGACY_DIRECTORY, full=full)

    def run_maintenance(self, dry_run: bool = False) -> MaintenanceReport:
        """Retention then GC, now (the periodic task calls this too)."""
        return self.maintenance.run(dry_run=dry_run)

    def _maintenance_loop(self) -> None:
        while not self._stopping.wait(self.settings.gc_interval_seconds):
            try:
                self.run_maintenance()
            except GcPostponed as exc:
                log.warning("%s; trying again in %ss", exc, self.settings.gc_interval_seconds)
            except Exception:
                log.exception("retention/GC run failed; retrying in %ss", self.settings.gc_interval_seconds)
                if self.metrics is not None:
                    self.metrics.maintenance_failed()

    def measure_usage(self) -> PlansUsage:
        """Each plan's store usage, now, into the metrics (the usage thread calls this)."""
        usage = plans_usage(self.db, self.store)
        if usage.missing_nodes:
            # A checkpoint deleted, and its objects collected, while it was being measured.
            log.debug("store usage: %d referenced tree node(s) could not be read", usage.missing_nodes)
        if self.metrics is not None:
            self.metrics.plan_usage.update(usage)
        return usage

    def _usage_loop(self) -> None:
        """Measures at once, then every ``usage_interval_seconds``, off the event loop: a scrape
        only reads the last measurement."""
        interval = self.settings.usage_interval_seconds
        while not self._stopping.is_set():
            try:
                self.measure_usage()
            except Exception:
                if self._stopping.is_set():
                    return
                log.exception("measuring the store usage of each plan failed; retrying in %ss", interval)
            if self._stopping.wait(interval):
                return

    def stop(self, grace: float | None = None) -> None:
        """Drains: new calls are refused (UNAVAILABLE / SHUTTING_DOWN) and health flips to
        NOT_SERVING, in-flight checkpoints and rollbacks get ``grace`` seconds to finish,
        watch streams end, then the listeners close."""
        if self._stopping.is_set():
            self._stopped.wait()
            return
        grace = self.settings.grace_seconds if grace is None else grace
        deadline = time.monotonic() + grace
        self._stopping.set()
        try:
            # New calls are refused before health says NOT_SERVING: a client that reads NOT_SERVING
            # and calls at once must be refused, not served (the other order left a window).
            self.drain.begin()
            try:
                self._on_loop(self.health.enter_graceful_shutdown(), timeout=LOOP_ANSWER_SECONDS)
            except concurrent.futures.TimeoutError:
                log.warning("the event loop did not flip health to NOT_SERVING within %.0fs; draining anyway",
                            LOOP_ANSWER_SECONDS)
            self.config.wake_all()
            log.info("draining: %d call(s) in flight", self.drain.in_flight)
            if not self.drain.wait_idle(grace):
                log.warning("grace period of %ss ended with %d call(s) still running; answering them UNAVAILABLE",
                            grace, self.drain.in_flight)
                self._loop.call_soon_threadsafe(self.drain.cut_off)
                self.drain.wait_idle(CUT_OFF_ANSWER_SECONDS)
                deadline = time.monotonic() + CUT_OFF_ANSWER_SECONDS
            linger = min(self.settings.linger_seconds, max(0.0, deadline - time.monotonic()))
            if linger > 0 and not self.drain.was_cut_off:
                time.sleep(linger)  # the drain refuses what arrives meanwhile (see linger_seconds)
            # A call's handler has returned, but its response may still be on its way (a large one, a
            # slow client): stopping with a grace lets gRPC finish sending what is in flight; whatever
            # still runs when the grace period ends (an open health Watch stream) is cancelled.
            remaining = max(0.0, deadline - time.monotonic())
            log.info("every call has finished; waiting for their responses to be sent (at most %.1fs)", remaining)
            try:
                # Bounded: grpcio's stop can hang after a streaming call was cancelled (grpc/grpc#28999),
                # and a drain must end, whatever is left unsent then.
                self._on_loop(self.server.stop(remaining), timeout=remaining + STOP_SLACK_SECONDS)
            except concurrent.futures.TimeoutError:
                log.warning("gRPC's server had not stopped %.1fs after its grace period; stopping anyway",
                            STOP_SLACK_SECONDS)
        except Exception:
            self._teardown_error("draining")
        self._release(grace)

    def _release(self, grace: float) -> None:
        """Stops the loop and the threads, removes this server's unix sockets and closes the
        engine, store, database and locks. Each step runs whatever an earlier one hit, and the
        process always gets to exit."""
        try:
            self._teardown("stopping the event loop", self._stop_loop)
            self._teardown("stopping the thread pool",
                           lambda: self._executor.shutdown(wait=True, cancel_futures=True))
            for thread in (self._maintenance_thread, self._usage_thread):
                if thread is not None:
                    self._teardown(f"joining the {thread.name} thread", lambda t=thread: t.join(timeout=grace))
            for path, identity in self._unix_paths:
                self._teardown(f"removing unix socket {path}", lambda p=path, i=identity: _remove_own_socket(p, i))
            if self.metrics is not None:
                self._teardown("closing the metrics endpoint", self.metrics.close)
                self._teardown("unbinding the metrics", lambda: telemetry.unbind(self.metrics))
            self._teardown("closing the checkpoint engine", self.checkpoints.close)
            if self._maintenance_thread is not None and self._maintenance_thread.is_alive():
                # A collection still running may be compacting: closing the packs under it would let
                # its next write land in whatever file reuses their descriptors. The process exits
                # with them open instead, which a compaction survives as it survives a kill.
                log.warning("the maintenance thread is still running %ss after it was asked to stop; the "
                            "content store is left open for it", grace)
            else:
                self._teardown("closing the content store", self.store.close)
            self._teardown("closing the database", self.db.dispose)
            self._teardown("releasing the data dir locks", self._release_locks)
            if self.teardown_failed:
                log.error("checkpointd stopped; some of its teardown failed (see above)")
            else:
                log.info("checkpointd stopped")
        finally:
            self._stopped.set()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(LOOP_ANSWER_SECONDS)
        if self._loop_thread.is_alive():
            raise RuntimeError(f"the event loop had not stopped {LOOP_ANSWER_SECONDS:.0f}s after it was asked to")
        self._loop.close()

    def _teardown_error(self, step: str) -> None:
        self.teardown_failed = True
        log.exception("stopping: %s failed", step)

    def _teardown(self, step: str, action) -> None:
        try:
            action()
        except Exception:
            self._teardown_error(step)

    def _release_locks(self) -> None:
        for lock in (self._data_lock, self._serving_lock):
            if lock is not None:
                lock.release()

    def wait(self) -> None:
        """Returns once the server has stopped. In slices (as grpc's own wait_for_termination):
        Python runs signal handlers in the main thread only, between bytecodes, and a signal the
        kernel hands to another thread does not wake a main thread blocked on a lock, so SIGTERM
        went unanswered for good (2 runs in ~40 under load; py-spy: the main thread here, no drain)."""
        while not self._stopped.wait(WAIT_SLICE_SECONDS):
            pass
