"""Listener addresses and transport security: parsing, the loopback test that decides
whether a listener needs authentication, and TLS/mTLS server credentials."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc


class ListenerError(ValueError):
    """A listen address or TLS setting is unusable; the server refuses to start."""


@dataclass(frozen=True)
class Listener:
    """``unix:///abs/path`` or ``HOST:PORT`` (IPv6 hosts in brackets)."""

    unix_path: str = ""
    host: str = ""
    port: int = 0

    @property
    def is_unix(self) -> bool:
        return bool(self.unix_path)

    @property
    def display_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def grpc_address(self) -> str:
        return f"unix://{self.unix_path}" if self.is_unix else f"{self.display_host}:{self.port}"


def parse_tcp(address: str) -> Listener:
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit() or int(port) > 65535:
        raise ListenerError(f"listen address must be HOST:PORT or unix:///PATH, got {address!r}")
    host = host.removeprefix("[").removesuffix("]")
    if not host:
        raise ListenerError(f"listen address {address!r} has no host; use 0.0.0.0 or [::] for every interface")
    return Listener(host=host, port=int(port))


def parse_listen(address: str) -> Listener:
    if address.startswith("unix:"):
        path = address.removeprefix("unix://") if address.startswith("unix://") else address.removeprefix("unix:")
        if not path.startswith("/"):
            raise ListenerError(f"unix listen address must be unix:///absolute/path, got {address!r}")
        return Listener(unix_path=path)
    return parse_tcp(address)


def is_loopback(host: str) -> bool:
    """True only if every address ``host`` names is a loopback address (unresolvable: False)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    #: When set, clients must present a certificate signed by this CA (mutual TLS).
    client_ca: Path | None = None

    def _read(self, path: Path, what: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ListenerError(f"cannot read TLS {what} {path}: {exc.strerror}") from None

    def server_credentials(self) -> grpc.ServerCredentials:
        key, cert = self._read(self.key, "key"), self._read(self.cert, "certificate")
        client_ca = self._read(self.client_ca, "client CA") if self.client_ca else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                           require_client_auth=client_ca is not None)
