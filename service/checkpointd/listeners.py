"""Listener addresses and transport security: parsing, the loopback test that decides
whether a listener needs authentication, and TLS/mTLS server credentials."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
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


#: The longest path a unix socket can have (sockaddr_un.sun_path holds 108 bytes with the final NUL).
MAX_UNIX_PATH_BYTES = 107


def parse_listen(address: str) -> Listener:
    if address.startswith("unix:"):
        path = address.removeprefix("unix://") if address.startswith("unix://") else address.removeprefix("unix:")
        if not path.startswith("/"):
            raise ListenerError(f"unix listen address must be unix:///absolute/path, got {address!r}")
        if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
            raise ListenerError(f"unix socket path {path} is {len(os.fsencode(path))} bytes long; the most a socket "
                                f"path can have is {MAX_UNIX_PATH_BYTES}: give a shorter one with --listen "
                                "unix:///PATH (env CHECKPOINTD_LISTEN)")
        return Listener(unix_path=path)
    return parse_tcp(address)


def stale_socket(path: str) -> bool:
    """Whether ``path`` holds a socket file nothing listens on (left by a server that died), which
    a new server may replace. False when nothing is there; ListenerError when something is that
    must not be touched: a live socket, or anything that is not a socket (a user's file, a
    directory, a symlink), which is never deleted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ListenerError(f"cannot use unix socket path {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a symlink" if stat.S_ISLNK(st.st_mode) else \
            "a file that is not a socket"
        raise ListenerError(f"{path} is {kind}: refusing to replace it with a unix socket; remove it, or give "
                            "this server another socket with --listen unix:///PATH (env CHECKPOINTD_LISTEN)")
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            return True
    raise ListenerError(_held_elsewhere(Listener(unix_path=path)))


def _held_elsewhere(listener: Listener) -> str:
    if listener.is_unix:
        return (f"another server is listening on unix socket {listener.unix_path}: stop it, or give this server "
                "another socket with --listen unix:///PATH (env CHECKPOINTD_LISTEN)")
    return (f"cannot listen on {listener.grpc_address}: another process is already listening there (a checkpointd "
            f"started earlier? `checkpointd health --target {listener.grpc_address}` asks it). Stop it, or give "
            "this server another address with --listen HOST:PORT (env CHECKPOINTD_LISTEN)")


def check_address_free(listener: Listener) -> None:
    """Refuses, before the server touches its data dir, an address that another process holds.

    A TCP address is bound once and let go (with SO_REUSEADDR, as gRPC binds, so connections
    still closing do not count); a unix socket is free unless something answers on it (a
    stale file is replaced later). gRPC itself binds a moment later: a process that takes the
    address in between makes that bind fail, which the server reports too (ListenerError)."""
    if listener.is_unix:
        stale_socket(listener.unix_path)  # refuses a live socket and anything that is not a socket
        return
    if listener.port == 0:
        return
    try:
        addresses = socket.getaddrinfo(listener.host, listener.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ListenerError(f"cannot listen on {listener.grpc_address}: {listener.host!r} does not resolve "
                            f"({exc.strerror}); give an address with --listen HOST:PORT") from None
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind(address)
                probe.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ListenerError(_held_elsewhere(listener)) from None
                if exc.errno == errno.EACCES:
                    raise ListenerError(f"cannot listen on {listener.grpc_address}: permission denied (ports below "
                                        "1024 need privileges); pick another with --listen HOST:PORT") from None
                # Anything else (an address family this host lacks...) is left to gRPC to judge.


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
