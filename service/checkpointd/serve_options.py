"""The ``serve`` options for day-2 operations: socket permissions, authentication, TLS,
metrics, logs and periodic retention + GC. Kept apart from cli.py so the core options
there stay short; each option has a ``CHECKPOINTD_*`` variable and the flag wins."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkpointd.defaults import MAX_SECONDS
from checkpointd.logging_setup import LogFormat

# The server's modules are imported where they are used, never here: every command's parser
# declares serve's options, and `checkpointd --help` must not load the server to print them.
if TYPE_CHECKING:
    from checkpointd.api.auth import OpenService, TokenSource
    from checkpointd.listeners import TlsFiles


class OptionError(ValueError):
    """Serve options that contradict each other or name something unusable (a data dir that is a
    file, a database that cannot be opened)."""


def startup_errors() -> tuple[type[Exception], ...]:
    """Errors that mean "the server cannot start as configured": reported as one line, exit 2."""
    from checkpointd.api.tokens import TokenError
    from checkpointd.core.maintenance.datadir_lock import DataDirBusy
    from checkpointd.core.metadata.db import DatabaseUrlError, SchemaError
    from checkpointd.listeners import ListenerError

    return OptionError, ListenerError, TokenError, DataDirBusy, SchemaError, DatabaseUrlError


def first_line(error: BaseException) -> str:
    """What an error says, in one line: a database driver's own message without the SQL and the
    links SQLAlchemy adds to it (nor the URL, so no password)."""
    cause = getattr(error, "orig", None)
    text = str(cause if cause is not None else error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def _env(name: str, default: str = "") -> str:
    return os.environ.get(f"CHECKPOINTD_{name}", default)


def _env_flag(name: str) -> bool:
    return _env(name).lower() in ("1", "true", "yes", "on")


def _octal_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal permission mode such as 0660") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a permission mode (0000 to 0777)")
    return mode


def _open_services(text: str) -> frozenset[OpenService]:
    from checkpointd.api.auth import OpenService

    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return frozenset()
    try:
        return frozenset(OpenService(n) for n in names)
    except ValueError:
        known = ", ".join(s.value for s in OpenService)
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {known}, or none") from None


def _log_format(text: str) -> LogFormat:
    try:
        return LogFormat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected text or json") from None


def seconds(text: str) -> float:
    """An interval option: a finite number of seconds from 0 to ``MAX_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_SECONDS:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds from 0 to {MAX_SECONDS} (a year)")
    return value


#: How often a server rechecks the watched workspaces' files (core/capture/recheck.py) unless told.
RECHECK_INTERVAL_SECONDS = 300.0


def add_operations_options(serve: argparse.ArgumentParser) -> None:
    listeners = serve.add_argument_group("listener security")
    listeners.add_argument(
        "--socket-mode", type=_octal_mode, default=_env("SOCKET_MODE", "0660"), metavar="MODE",
        help="permission bits of unix sockets, octal (the socket is created owner-only, then set to this). "
             "Env CHECKPOINTD_SOCKET_MODE. Default: 0660")
    listeners.add_argument(
        "--token-file", type=Path, default=_env("TOKEN_FILE") or None, metavar="FILE",
        help="require 'authorization: Bearer <token>' on every call, the token being this file's content "
             "(re-read when it changes). Env CHECKPOINTD_TOKEN_FILE, or the token itself in CHECKPOINTD_TOKEN. "
             "Default: none (calls need no token)")
    listeners.add_argument(
        "--auth-exempt", type=_open_services, default=_env("AUTH_EXEMPT", "health"),
        metavar="SERVICES",
        help="services reachable without the token: comma-separated from health, reflection; or none. "
             "Env CHECKPOINTD_AUTH_EXEMPT. Default: health, so that kubelet and Docker probes work")
    listeners.add_argument("--tls-cert", type=Path, default=_env("TLS_CERT") or None, metavar="PEM",
                           help="serve TCP listeners over TLS with this certificate chain. Env CHECKPOINTD_TLS_CERT. "
                                "Default: none (plaintext)")
    listeners.add_argument("--tls-key", type=Path, default=_env("TLS_KEY") or None, metavar="PEM",
                           help="private key of --tls-cert. Env CHECKPOINTD_TLS_KEY. Default: none")
    listeners.add_argument(
        "--tls-client-ca", type=Path, default=_env("TLS_CLIENT_CA") or None, metavar="PEM",
        help="require client certificates signed by this CA (mutual TLS). Env CHECKPOINTD_TLS_CLIENT_CA. "
             "Default: none (no client certificates asked for)")
    listeners.add_argument(
        "--allow-unauthenticated-remote", action="store_true", default=_env_flag("ALLOW_UNAUTHENTICATED_REMOTE"),
        help="let a TCP listener that is not on loopback start without a token or client certificates "
             "(only on a network you trust). Env CHECKPOINTD_ALLOW_UNAUTHENTICATED_REMOTE=1. Default: off")
    ops = serve.add_argument_group("observability and maintenance")
    ops.add_argument("--metrics-listen", default=_env("METRICS_LISTEN"), metavar="HOST:PORT",
                     help="serve Prometheus metrics at http://HOST:PORT/metrics. Env CHECKPOINTD_METRICS_LISTEN. "
                          "Default: none (no metrics endpoint)")
    ops.add_argument("--log-format", type=_log_format, default=_env("LOG_FORMAT", "text"), metavar="{text,json}",
                     help="text, or JSON lines carrying plan_id, checkpoint_id and request_id. "
                          "Env CHECKPOINTD_LOG_FORMAT. Default: text")
    ops.add_argument(
        "--gc-interval", type=seconds, default=_env("GC_INTERVAL", "0"), metavar="SECONDS",
        help="apply retention (core.retention.* config keys) and collect unreferenced content every SECONDS; "
             "0 disables. With the disk store this server must then be the only one on its data dir. "
             "Env CHECKPOINTD_GC_INTERVAL. Default: 0 (off)")
    ops.add_argument(
        "--usage-interval", type=seconds, default=_env("USAGE_INTERVAL", "300"), metavar="SECONDS",
        help="with --metrics-listen, measure what each plan's checkpoints take in the content store "
             "(checkpointd_plan_store_bytes) at start-up and then every SECONDS, in the background; 0 disables. "
             "Env CHECKPOINTD_USAGE_INTERVAL. Default: 300")
    ops.add_argument(
        "--recheck-interval", type=seconds, default=_env("RECHECK_INTERVAL", f"{RECHECK_INTERVAL_SECONDS:g}"),
        metavar="SECONDS",
        help="with the file watcher on, stat every captured file of each watched workspace again every SECONDS, "
             "in the background, so that a write no file-watcher event reports (through a hard link outside the "
             "workspace, a shared mmap) is captured by the next checkpoint; 0 disables. "
             f"Env CHECKPOINTD_RECHECK_INTERVAL. Default: {RECHECK_INTERVAL_SECONDS:g}")


def _token(args: argparse.Namespace) -> TokenSource | None:
    from checkpointd.api.auth import TokenSource

    if args.token_file is not None:
        return TokenSource.from_file(Path(args.token_file).expanduser())
    token = os.environ.get("CHECKPOINTD_TOKEN")
    return TokenSource.from_value(token) if token is not None else None


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    from checkpointd.listeners import TlsFiles

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise OptionError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise OptionError("--tls-cert and --tls-key go together")
    return TlsFiles(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_client_ca) if args.tls_client_ca else None)


def operations_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerSettings fields these options set."""
    return {
        "socket_mode": args.socket_mode,
        "token": _token(args),
        "open_services": args.auth_exempt,
        "tls": _tls(args),
        "allow_unauthenticated_remote": args.allow_unauthenticated_remote,
        "metrics_listen": args.metrics_listen,
        "gc_interval_seconds": args.gc_interval,
        "usage_interval_seconds": args.usage_interval,
        "recheck_interval_seconds": args.recheck_interval,
    }
