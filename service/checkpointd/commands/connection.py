"""Opening a channel to the server for the human CLI: target, bearer token, TLS/mTLS."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from checkpointd.api.tokens import TokenError, token_text
from checkpointd.defaults import default_target
from checkpointd_client import CheckpointClient, ConfigClient, open_channel


class ConnectionOptionsError(ValueError):
    """The connection options cannot work (unreadable file, half a key pair)."""


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConnectionOptionsError(f"cannot read {what} {path}: {exc.strerror}") from None


def token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token-file, else CHECKPOINTD_TOKEN, else none; taken as the server
    takes it (api.tokens.token_text: UTF-8, surrounding whitespace stripped)."""
    try:
        if args.token_file is not None:
            return token_text(_read(args.token_file, "token file"), f"token file {args.token_file}") or None
        return token_text(os.environ.get("CHECKPOINTD_TOKEN", ""), "CHECKPOINTD_TOKEN") or None
    except TokenError as exc:
        raise ConnectionOptionsError(str(exc)) from None


def tls_credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """Channel credentials from the --tls-* options; None for plaintext."""
    if args.tls_ca is not None or args.tls_cert is not None:
        if (args.tls_cert is None) != (args.tls_key is None):
            raise ConnectionOptionsError("--tls-cert and --tls-key go together")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(args.tls_ca, "CA certificate") if args.tls_ca else None,
            private_key=_read(args.tls_key, "client key") if args.tls_key else None,
            certificate_chain=_read(args.tls_cert, "client certificate") if args.tls_cert else None,
        )
    if args.tls_server_name:
        raise ConnectionOptionsError("--tls-server-name needs TLS: give --tls-ca (or --tls-cert and --tls-key)")
    return None


def _channel(args: argparse.Namespace, target: str) -> grpc.Channel:
    credentials = tls_credentials(args)
    try:
        return open_channel(target, credentials=credentials, server_name=args.tls_server_name or None)
    except ValueError as exc:
        # A target or TLS combination the client refuses: one line, as for any other bad option.
        raise ConnectionOptionsError(str(exc)) from None


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


def target_of(args: argparse.Namespace) -> str:
    """--target, else CHECKPOINTD_TARGET, else the default data dir's socket if it exists, else TCP."""
    return args.target or default_target()


def connect(args: argparse.Namespace) -> Connection:
    target = target_of(args)
    return Connection(target, _channel(args, target), token(args), args.timeout)
