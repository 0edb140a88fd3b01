"""Fixtures for the operations tests: servers started with day-2 options (token, TLS,
metrics, periodic GC), certificates made on the fly, and the `checkpointd` CLI as a
subprocess."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import CHECKPOINTD, SERVER_ARGS, PostgresDatabases, RunningServer

TOKEN = "ops-test-token-0123456789abcdef"


class OpsServer(RunningServer):
    """A RunningServer with its own environment, and a readiness probe that can use TLS."""

    def __init__(self, base: Path, db_url: str, extra_args: tuple[str, ...], env: dict[str, str],
                 credentials: grpc.ChannelCredentials | None = None, listen: tuple[str, ...] = ()) -> None:
        super().__init__(base, db_url=db_url, extra_args=(*SERVER_ARGS, *extra_args))
        self.env = env
        self.credentials = credentials
        self.listen = listen

    def command(self) -> list[str]:
        cmd = super().command()
        for address in self.listen:
            cmd += ["--listen", address]
        return cmd

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"checkpointd exited with {self.process.returncode}:\n{self.log()}")
            if self.serving():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"checkpointd did not become healthy in {timeout}s:\n{self.log()}")

    def channel(self, target: str | None = None) -> grpc.Channel:
        target = target or self.tcp_target
        if self.credentials is not None and not target.startswith("unix:"):
            return grpc.secure_channel(target, self.credentials)
        return grpc.insecure_channel(target)

    def serving(self) -> bool:
        """SERVING on TCP; the probe carries the test token in case health is not exempt."""
        try:
            with self.channel() as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=0.5, metadata=(("authorization", f"Bearer {TOKEN}"),))
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def metrics_url(self) -> str:
        """The address the server printed; it prints it just after health turns SERVING (after
        ``CheckpointdServer.start``), so a test may get here first."""
        def printed() -> list[str]:
            return re.findall(r"checkpointd metrics: (http://\S+)", self.log_path.read_text())

        found = printed() or wait_until(printed, f"the metrics address in the server log:\n{self.log()}", 30)
        return found[-1]

    def scrape(self) -> str:
        with urllib.request.urlopen(self.metrics_url(), timeout=10) as reply:
            return reply.read().decode()


@pytest.fixture
def ops_server(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[Callable[..., OpsServer]]:
    """Starts servers with extra serve arguments; stops them (and drops their databases) at the end."""
    started: list[tuple[OpsServer, str]] = []

    def start(*extra_args: str, env: dict[str, str] | None = None, credentials=None,
              listen: tuple[str, ...] = ()) -> OpsServer:
        db_url = suite_databases.create() if suite_databases is not None else ""
        base = Path(tempfile.mkdtemp(prefix="o-", dir=short_tmp))
        server = OpsServer(base, db_url, extra_args, env or {}, credentials, listen)
        started.append((server, db_url))
        server.start()
        return server

    yield start
    for server, db_url in started:
        server.stop()
        if suite_databases is not None and db_url:
            suite_databases.drop(db_url)


def run_cli(*args: str, stdin: str = "", env: dict[str, str] | None = None,
            timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`checkpointd ARGS` as a user would run it, output captured as text."""
    return subprocess.run([CHECKPOINTD, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "250", **(env or {})}, cwd=cwd)


def server_exit(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `checkpointd serve ARGS` (no CHECKPOINTD_* from our environment) expecting it to refuse to start."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    return subprocess.run([CHECKPOINTD, "serve", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


@dataclass(frozen=True)
class Pki:
    """A throwaway CA with a server certificate (127.0.0.1, localhost) and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    def channel_credentials(self, with_client_cert: bool) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.client_key.read_bytes() if with_client_cert else None,
            certificate_chain=self.client_cert.read_bytes() if with_client_cert else None)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, name: str,
          server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
    else:
        usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


@pytest.fixture(scope="session")
def pki(short_tmp: Path) -> Pki:
    base = short_tmp / "pki"
    base.mkdir()
    ca, ca_key = _ca("checkpointd test CA")
    server_cert, server_key = _leaf(ca, ca_key, "checkpointd", server=True)
    client_cert, client_key = _leaf(ca, ca_key, "agent", server=False)
    other_ca, _ = _ca("some other CA")
    return Pki(ca=_write_cert(ca, base / "ca.pem"),
               server_cert=_write_cert(server_cert, base / "server.pem"),
               server_key=_write_key(server_key, base / "server-key.pem"),
               client_cert=_write_cert(client_cert, base / "client.pem"),
               client_key=_write_key(client_key, base / "client-key.pem"),
               other_ca=_write_cert(other_ca, base / "other-ca.pem"))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> object:
    """Polls ``condition`` until it returns something truthy; fails with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def base(short_tmp: Path) -> Path:
    """A fresh directory with a short path (unix socket paths stay under 108 bytes), laid out as
    RunningServer(base) uses it: ``workspaces`` beside the data directory."""
    path = Path(tempfile.mkdtemp(prefix="ops-", dir=short_tmp))
    (path / "workspaces").mkdir()
    return path


def health_status(target: str) -> int | None:
    """The server's overall health status, or None when it does not answer."""
    try:
        with grpc.insecure_channel(target) as channel:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
    except grpc.RpcError:
        return None


def no_traceback(text: str) -> None:
    """What a user must never see for an expected condition (``Exception ignored`` is Python's
    traceback for an error it dropped in a finalizer or callback)."""
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
