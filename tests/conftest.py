"""Shared fixtures: real `checkpointd serve` processes over TCP and a unix socket.

The same suite runs on SQLite (the default) or PostgreSQL, and with extra serve arguments:
  CHECKPOINTD_TEST_DB_URL      a PostgreSQL server URL (postgresql+psycopg://postgres@127.0.0.1:5432/postgres):
                               every server then gets a fresh database checkpointd_test_<pid>_<random>,
                               dropped when its fixture ends (or by a later run, if this one died).
  CHECKPOINTD_TEST_SERVER_ARGS extra `checkpointd serve` arguments, shell-split (e.g. "--store db").
Tests that need PostgreSQL whatever the variant (tests/postgres) use the `postgres` fixture. When no
PostgreSQL answers, they (and, with CHECKPOINTD_TEST_DB_URL, every test with a server) skip with the
reason, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2_grpc, config_service_pb2_grpc
from tests.helpers import dump_stacks_then_kill, skip_unless_ci

CHECKPOINTD = str(Path(sys.executable).with_name("checkpointd"))
#: PostgreSQL server the whole suite runs on when set; SQLite files in each data dir otherwise.
TEST_DB_URL = os.environ.get("CHECKPOINTD_TEST_DB_URL", "")
#: Extra `serve` arguments for every server the fixtures start.
SERVER_ARGS = tuple(shlex.split(os.environ.get("CHECKPOINTD_TEST_SERVER_ARGS", "")))
#: Test databases are named PREFIX<pid of the test process>_<random>, so a later run can drop a dead run's.
TEST_DATABASE_PREFIX = "checkpointd_test_"
#: Where the PostgreSQL-only tests look when CHECKPOINTD_TEST_DB_URL is not set.
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


#: Each pytest-xdist worker hands out its servers' ports from a range of its own, below the kernel's
#: ephemeral range, in turn: a port a stopped server frees (to be restarted on) is never handed to
#: another server meanwhile, whose health check would then pass for it and which would then answer
#: its calls (seen once: WORKSPACE_ROOT_NOT_ALLOWED from another worker's server).
_PORTS_PER_WORKER = 2000
_FIRST_PORT = 12000
_next_port = [random.randrange(_PORTS_PER_WORKER)]


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % 8 if worker[2:].isdigit() else 0
    low = _FIRST_PORT + index * _PORTS_PER_WORKER
    for _ in range(_PORTS_PER_WORKER):
        port = low + _next_port[0] % _PORTS_PER_WORKER
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + _PORTS_PER_WORKER - 1}")


class RunningServer:
    """A `checkpointd serve` subprocess; restartable on the same port, socket and data."""

    def __init__(self, base: Path, db_url: str = "", extra_args: tuple[str, ...] = SERVER_ARGS) -> None:
        self.base = base
        self.data_dir = base / "data"
        self.allowed_root = base / "workspaces"
        self.allowed_root.mkdir(parents=True, exist_ok=True)
        self.socket_path = base / "checkpointd.sock"
        self.port = free_port()
        self.tcp_target = f"127.0.0.1:{self.port}"
        self.unix_target = f"unix://{self.socket_path}"
        self.db_url = db_url
        self.extra_args = extra_args
        self.log_path = base / "server.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = [CHECKPOINTD, "serve", "--listen", self.tcp_target, "--listen", self.unix_target,
               "--data-dir", str(self.data_dir), "--workspace-root", str(self.allowed_root),
               "--grace-seconds", "5", *self.extra_args]
        if self.db_url:
            cmd += ["--db-url", self.db_url]
        return cmd

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float) -> None:
        """Returns once health says SERVING; fails with the log if the process ends or takes too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"checkpointd exited with {self.process.returncode}:\n{self.log()}")
            if self.serving():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"checkpointd did not become healthy in {timeout}s:\n{self.log()}")

    def serving(self) -> bool:
        try:
            with grpc.insecure_channel(self.tcp_target) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                dump_stacks_then_kill(self.process)
                print(f"the server did not stop within 30s of {signal.Signals(sig).name}; its log ends:\n{self.log()}",
                      file=sys.stderr)
        code, self.process = self.process.returncode, None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""

    def new_workspace(self) -> Path:
        path = self.allowed_root / f"ws-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path

    @property
    def store_kind(self) -> str:
        """The content store this server runs with: "disk" or "db" (the last --store wins, as in argparse)."""
        args = self.command()
        kinds = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--store"]
        kinds += [arg.split("=", 1)[1] for arg in args if arg.startswith("--store=")]
        return kinds[-1] if kinds else os.environ.get("CHECKPOINTD_STORE", "disk")

    def object_count(self) -> int:
        """Objects in this server's database content store (--store db). The disk store's packs
        are read by the server alone, so there is no count from outside for it."""
        if self.store_kind != "db":
            raise NotImplementedError(f"object_count needs --store db; this server runs --store {self.store_kind}")
        engine = create_engine(self.db_url or f"sqlite:///{self.data_dir / 'checkpointd.db'}")
        try:
            with engine.connect() as connection:
                return connection.execute(text("SELECT count(*) FROM objects")).scalar_one()
        finally:
            engine.dispose()


class PostgresDatabases:
    """Creates throwaway databases on one PostgreSQL server and drops them (and their sessions)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = make_url(server_url).set(drivername="postgresql+psycopg")
        self._admin = create_engine(self.server_url, isolation_level="AUTOCOMMIT", pool_size=1,
                                    connect_args={"connect_timeout": 5})
        self.created: list[str] = []

    def reachable(self) -> str:
        """Empty when the server answers; otherwise why not."""
        try:
            with self._admin.connect() as connection:
                connection.execute(text("SELECT 1"))
        except Exception as exc:  # any failure to connect is the reason to report
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return ""

    def create(self) -> str:
        name = f"{TEST_DATABASE_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"
        with self._admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        self.created.append(name)
        return self.server_url.set(database=name).render_as_string(hide_password=False)

    def drop(self, url: str) -> None:
        name = make_url(url).database
        with self._admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if name in self.created:
            self.created.remove(name)

    def sweep_orphans(self) -> list[str]:
        """Drops the test databases of test runs on this machine that died without cleaning up.
        A name carries the pid of the process that made it (a pytest-xdist worker's under -n), so a
        sibling worker's, or another run's, stays while that process lives."""
        if self.server_url.host not in ("127.0.0.1", "localhost", "::1", None):
            return []
        with self._admin.connect() as connection:
            names = connection.execute(text("SELECT datname FROM pg_database WHERE datname LIKE :prefix"),
                                       {"prefix": TEST_DATABASE_PREFIX.replace("_", r"\_") + "%"}).scalars().all()
        orphans = []
        for name in names:
            pid = name.removeprefix(TEST_DATABASE_PREFIX).split("_", 1)[0]
            if pid.isdigit() and not _process_exists(int(pid)):
                self.drop(self.server_url.set(database=name).render_as_string(hide_password=False))
                orphans.append(name)
        return orphans

    def close(self) -> None:
        for name in list(self.created):
            self.drop(self.server_url.set(database=name).render_as_string(hide_password=False))
        self._admin.dispose()


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _postgres_or_skip(server_url: str) -> PostgresDatabases:
    databases = PostgresDatabases(server_url)
    problem = databases.reachable()
    if problem:
        databases.close()
        skip_unless_ci(f"PostgreSQL is not reachable at {databases.server_url.render_as_string()}: {problem}")
    databases.sweep_orphans()
    return databases


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresDatabases]:
    """The PostgreSQL server (CHECKPOINTD_TEST_DB_URL, else 127.0.0.1:5432 as postgres); skips when
    unreachable, except under CI=true."""
    databases = _postgres_or_skip(TEST_DB_URL or DEFAULT_POSTGRES_URL)
    yield databases
    databases.close()


@pytest.fixture(scope="session")
def suite_databases() -> Iterator[PostgresDatabases | None]:
    """Where the fixtures' servers keep their metadata: None for SQLite in their data dirs."""
    if not TEST_DB_URL:
        yield None
        return
    databases = _postgres_or_skip(TEST_DB_URL)
    yield databases
    databases.close()


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """A short base path: unix socket paths must stay under 108 bytes."""
    base = Path(tempfile.mkdtemp(prefix="cpd-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def serving_server(base: Path, databases: PostgresDatabases | None, kind: type[RunningServer] = RunningServer,
                   **kwargs) -> Iterator[RunningServer]:
    """A started server (``kwargs`` go to ``kind``: ``extra_args``...) on a database of its own when
    the suite runs on PostgreSQL; stopped, and its database dropped, at the end."""
    db_url = databases.create() if databases is not None else ""
    server = kind(base, db_url=db_url, **kwargs)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if databases is not None:
            databases.drop(db_url)


@pytest.fixture(scope="session")
def checkpointd_server(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    yield from serving_server(short_tmp / "session", suite_databases)


@pytest.fixture
def fresh_server(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    yield from serving_server(Path(tempfile.mkdtemp(prefix="f-", dir=short_tmp)), suite_databases)


@pytest.fixture
def checkout(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    """A directory that looks like the repository, with a server started in it as `make run`
    starts one: where the READMEs' code blocks run (tests.readme_blocks.Checkout)."""
    from tests.readme_blocks import Checkout

    yield from serving_server(Path(tempfile.mkdtemp(prefix="r-", dir=short_tmp)), suite_databases, kind=Checkout)


@pytest.fixture
def workspace(checkpointd_server: RunningServer) -> Path:
    return checkpointd_server.new_workspace()


@pytest.fixture
def plan_id() -> str:
    return str(ULID())


@pytest.fixture(scope="session")
def channel(checkpointd_server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(checkpointd_server.tcp_target) as ch:
        yield ch


@pytest.fixture(scope="session")
def checkpoint_stub(channel: grpc.Channel) -> checkpoint_service_pb2_grpc.CheckpointServiceStub:
    return checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)


@pytest.fixture(scope="session")
def config_stub(channel: grpc.Channel) -> config_service_pb2_grpc.ConfigServiceStub:
    return config_service_pb2_grpc.ConfigServiceStub(channel)


def pytest_report_header(config) -> list[str]:
    database = make_url(TEST_DB_URL).render_as_string() if TEST_DB_URL else "SQLite in each server's data dir"
    return [f"checkpointd binary: {CHECKPOINTD} (exists: {os.path.exists(CHECKPOINTD)})",
            f"checkpointd metadata database: {database}; extra serve args: {shlex.join(SERVER_ARGS) or '(none)'}"]
