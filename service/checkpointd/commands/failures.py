"""How the client commands fail: one line on stderr that says what to do, never a traceback.

A call that never reached checkpointd says which target was tried and how to start a server or
point at another; Ctrl-C says what it left behind (see interruption.on_interrupt) and exits 130."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import wraps

import grpc

from checkpointd.commands import render
from checkpointd.commands.connection import ConnectionOptionsError, target_of
from checkpointd_client import CheckpointdRpcError
from checkpointd_client.targets import START_HINT

#: Causes the gRPC library names in its text when it could not reach the target, said plainly.
_TRANSPORT_CAUSES = (
    ("Connection refused", "connection refused"),
    ("No such file or directory", "no socket at that path"),
    ("Permission denied", "permission denied"),
    ("handshake", "the TLS handshake failed: check --tls-ca, --tls-cert and --tls-key"),
    ("DNS resolution failed", "the host name does not resolve"),
)
#: Words of gRPC's own transport failures (the connection failed or broke: no server spoke).
_TRANSPORT_MARKERS = ("failed to connect", "Failed to connect", "Socket closed", "Connection reset", "GOAWAY",
                      "connection attempt timed out", "Broken pipe", "Network is unreachable", "keepalive",
                      "Cancelling all calls", "Connection timed out", "End of TCP stream",
                      "connections to all backends failed")


def unreachable(error: CheckpointdRpcError, target: str, timeout: float) -> str | None:
    """The message for a call that never got an answer from checkpointd; None for any other failure."""
    if error.reason:
        return None  # checkpointd itself answered (e.g. SHUTTING_DOWN)
    hint = f"{START_HINT}, or point at yours with --target HOST:PORT or --target unix:///PATH (env CHECKPOINTD_TARGET)"
    if error.code is grpc.StatusCode.UNAVAILABLE:
        cause = next((plain for marker, plain in _TRANSPORT_CAUSES if marker in error.message), None)
        if cause is None and error.message and not any(m in error.message for m in _TRANSPORT_MARKERS):
            # Something at the target did answer, in words of its own (a proxy, a server that is not
            # checkpointd): what it said is the clue.
            return f"{target} answered UNAVAILABLE: {error.message} (is it checkpointd, or a proxy in front of it?)"
        return f"cannot reach checkpointd at {target} ({cause or 'no answer'}): is it running? {hint}"
    if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return (f"no answer from checkpointd at {target} within {timeout:g}s: a slow call needs a larger "
                f"--timeout; if nothing is running there, {hint}")
    return None


#: What to do next, for the reasons whose message alone does not say.
_NEXT_STEP = {
    "NO_WORKSPACE": "it was made without --workspace-root (its plan had no workspace yet), so it holds the plan "
                    "state only; `checkpointd create PLAN_ID --workspace-root DIR` records the plan's files from "
                    "then on",
}


def describe(error: CheckpointdRpcError, args: argparse.Namespace) -> str:
    unanswered = unreachable(error, target_of(args), args.timeout)
    if unanswered:
        return unanswered
    next_step = _NEXT_STEP.get(error.reason)
    return f"{error}: {next_step}" if next_step else str(error)


def failure_message(error: BaseException, args: argparse.Namespace) -> str | None:
    """The one line a client command prints for an expected failure; None for anything else.
    The one place that says which errors are expected ones."""
    if isinstance(error, CheckpointdRpcError):
        return describe(error, args)
    if isinstance(error, UnicodeError):
        return not_utf8(error)
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        # "/a/state.bin: No such file or directory", not Python's "[Errno 2] ...: '/a/state.bin'".
        return f"{os.fsdecode(error.filename)}: {error.strerror}"
    if isinstance(error, ConnectionOptionsError | OSError):
        return str(error)
    return None


def not_utf8(error: UnicodeError) -> str:
    """An argument (an id, a path, a label, a filter) that is not UTF-8 cannot be sent."""
    value = getattr(error, "object", b"")
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    shown = f" ({bytes(value)[:80]!r})" if value else ""
    return (f"an argument is not valid UTF-8{shown}: checkpointd names plans, checkpoints, labels, filters and "
            "workspace roots in UTF-8")


def reports_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Failed calls become one line on stderr and exit status 1, not a traceback; output into a
    closed pipe (`| head`) is not an error."""

    @wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except BrokenPipeError:
            render.reader_gone()
            return 0
        except (CheckpointdRpcError, ConnectionOptionsError, OSError, UnicodeError) as error:
            render.error(failure_message(error, args) or str(error))
            return 1

    return run
