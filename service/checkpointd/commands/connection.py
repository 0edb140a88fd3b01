"""Opening a channel to the server for the human CLI: target, bearer token, TLS/mTLS."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from checkpointd.defaults import default_target
from checkpointd_client import CheckpointClient, ConfigClient, open_channel, retry_service_config
from checkpointd_client.client import validate_target


class ConnectionOptionsError(ValueError):
    """The connection options cannot work (unreadable file, half a key pair)."""


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConnectionOptionsError(f"cannot read {what} {path}: {exc.strerror}") from None


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        return _read(args.token_file, "token file").decode().strip()
    return os.environ.get("CHECKPOINTD_TOKEN") or None


def _channel(args: argparse.Namespace, target: str) -> grpc.Channel:
    if args.tls_ca is None and args.tls_cert is None:
        return open_channel(target)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConnectionOptionsError("--tls-cert and --tls-key go together")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(args.tls_ca, "CA certificate") if args.tls_ca else None,
        private_key=_read(args.tls_key, "client key") if args.tls_key else None,
        certificate_chain=_read(args.tls_cert, "client certificate") if args.tls_cert else None,
    )
    options = [("grpc.enable_retries", 1), ("grpc.service_config", retry_service_config())]
    if args.tls_server_name:
        options.append(("grpc.ssl_target_name_override", args.tls_server_name))
    return grpc.secure_channel(validate_target(target), credentials, options=options)


@dataclass
class Connection:
    target: str
    channel: grpc.Channel
    token: str | None
    timeout: float

    def checkpoints(self) -> CheckpointClient:
        return CheckpointClient(self.channel, deadline_s=self.timeout, token=self.token)

    def config(self) -> ConfigClient:
        return ConfigClient(self.channel, deadline_s=self.timeout, token=self.token)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def connect(args: argparse.Namespace) -> Connection:
    target = args.target or default_target()
    return Connection(target, _channel(args, target), _token(args), args.timeout)
