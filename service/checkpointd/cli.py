"""The ``checkpointd`` command line: ``serve`` runs the server; ``ls``, ``show``, ``diff``,
``rollback``, ``config`` and friends talk to a running one, ``mcp-proxy`` checkpoints an MCP
server's write tools (see checkpointd.commands).
Every serve option can also come from a ``CHECKPOINTD_*`` environment variable; the flag wins."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

# Only the standard library at module level: everything else is imported inside main(), where
# Ctrl-C while it loads (the client; for serve, seconds of SQLAlchemy and alembic) is a plain
# interruption. Building the parser loads no server code: each command imports what it runs.


def _env_list(name: str, separator: str) -> list[str]:
    return [v for v in os.environ.get(name, "").split(separator) if v]


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {text!r}")
    return text == "on"


class CommandLineParser(argparse.ArgumentParser):
    """argparse, with usage errors that say what to do next: a mistyped choice (a command, a
    verb, an option's value) names the close ones, and every error points at --help."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is None or value in action.choices:
            return
        choices = [str(choice) for choice in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=1)
        meant = f"did you mean {close[0]!r}? " if close else ""
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({meant}choose from "
                                             f"{', '.join(map(repr, choices))})")

    def error(self, message: str) -> NoReturn:
        if message == "the following arguments are required: COMMAND":
            message = "a COMMAND is needed"
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n`{self.prog} --help` says more\n")


def build_parser() -> argparse.ArgumentParser:
    from checkpointd.commands import STORE_CHOICES, register_commands, store_kind
    from checkpointd.defaults import DEFAULT_TCP, default_data_dir
    from checkpointd.logging_setup import log_level
    from checkpointd.serve_options import add_operations_options, seconds

    parser = CommandLineParser(
        prog="checkpointd",
        description="Checkpoint service for AI-agent runtimes: records a plan's workspace files and state, "
                    "lists, diffs and rolls back, over gRPC (package checkpoint.v1).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the gRPC server",
        description="Run the gRPC server (CheckpointService, ConfigService, AdminService, health, reflection). "
                    "Stops gracefully on SIGTERM/SIGINT/SIGHUP. Every option can also come from its CHECKPOINTD_* "
                    "environment variable; the flag wins.",
    )
    serve.add_argument(
        "--listen", action="append", metavar="ADDR",
        help="address to listen on, HOST:PORT or unix:///PATH; repeatable. Env CHECKPOINTD_LISTEN "
             f"(comma-separated). Default: {DEFAULT_TCP} and unix://DATA_DIR/checkpointd.sock",
    )
    serve.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), metavar="DIR",
        help="directory for the SQLite metadata database and the content store. Env CHECKPOINTD_DATA_DIR. "
             "Default: $XDG_DATA_HOME/checkpointd, else ~/.local/share/checkpointd",
    )
    serve.add_argument(
        "--db-url", default=os.environ.get("CHECKPOINTD_DB_URL", ""), metavar="URL",
        help="SQLAlchemy database URL (e.g. postgresql+psycopg://user@host/db). Env CHECKPOINTD_DB_URL. "
             "Default: the SQLite file DATA_DIR/checkpointd.db",
    )
    serve.add_argument(
        "--workspace-root", action="append", metavar="DIR",
        help="directory under which plan workspaces may live; repeatable. Anything else is PERMISSION_DENIED. "
             f"Env CHECKPOINTD_WORKSPACE_ROOT ('{os.pathsep}'-separated). Default: the current directory",
    )
    serve.add_argument(
        "--store", type=store_kind, metavar="{" + ",".join(STORE_CHOICES) + "}",
        default=os.environ.get("CHECKPOINTD_STORE", "disk"),
        help="where checkpoint content lives: 'disk' (DATA_DIR/store) or 'db' (in the database, so replicas "
             "sharing one PostgreSQL need no shared file system). Env CHECKPOINTD_STORE. Default: disk",
    )
    serve.add_argument(
        "--watcher", type=_on_off, metavar="{on,off}", default=os.environ.get("CHECKPOINTD_WATCHER", "on"),
        help="watch workspaces (inotify) so that a checkpoint re-examines only what changed; 'off' scans the "
             "whole workspace at every checkpoint. Env CHECKPOINTD_WATCHER. Default: on",
    )
    # A string default goes through ``type`` when serve is parsed, and only then: a garbage
    # CHECKPOINTD_* value is serve's usage error, never every other command's traceback.
    serve.add_argument("--grace-seconds", type=seconds, default=os.environ.get("CHECKPOINTD_GRACE_SECONDS", "30"),
                       metavar="SECONDS",
                       help="how long a shutdown waits for in-flight calls. Env CHECKPOINTD_GRACE_SECONDS. "
                            "Default: 30")
    serve.add_argument("--log-level", type=log_level, default=os.environ.get("CHECKPOINTD_LOG_LEVEL", "INFO"),
                       metavar="LEVEL",
                       help="logging level (DEBUG, INFO, WARNING, ERROR). Env CHECKPOINTD_LOG_LEVEL. Default: INFO")
    add_operations_options(serve)
    register_commands(commands)
    return parser


def server_settings(args: argparse.Namespace):
    """The ServerSettings that ``serve`` runs with, flags first, then CHECKPOINTD_* variables."""
    from checkpointd.defaults import DEFAULT_TCP, SOCKET_NAME
    from checkpointd.serve_options import operations_settings
    from checkpointd.server import ServerSettings

    data_dir = Path(args.data_dir).expanduser().resolve()
    listen = args.listen or _env_list("CHECKPOINTD_LISTEN", ",") or [DEFAULT_TCP, f"unix://{data_dir}/{SOCKET_NAME}"]
    roots = args.workspace_root or _env_list("CHECKPOINTD_WORKSPACE_ROOT", os.pathsep) or [os.getcwd()]
    return ServerSettings(
        listen=tuple(listen),
        data_dir=data_dir,
        workspace_roots=tuple(os.path.abspath(r) for r in roots),
        db_url=args.db_url,
        store=args.store,
        watcher=args.watcher,
        grace_seconds=args.grace_seconds,
        **operations_settings(args),
    )


def serve(args: argparse.Namespace, pending: list[int]) -> int:
    """Runs the server until a drain signal; ``pending`` holds the drain signals noted so far.

    Until the server has started, a drain signal is only noted, and acted on once it has been
    built: a KeyboardInterrupt can land in a finalizer or a weakref callback (SQLAlchemy has some;
    the heap freeze runs collections), where Python prints "Exception ignored" with a traceback
    and goes on, and the server then started and served as if Ctrl-C had never been pressed (2
    runs in 400). Building can wait (a database that takes no connection, another replica's
    migration lock): a second signal then interrupts it."""
    from checkpointd.commands.interruption import INTERRUPTED_EXIT
    from checkpointd.core.kernel import heap
    from checkpointd.logging_setup import LogFormat
    from checkpointd.logging_setup import configure as configure_logging
    from checkpointd.server import CheckpointdServer

    def note_while_building(received: int, _frame) -> None:
        pending.append(received)
        if len(pending) == 1:
            # os.write: a signal handler may run in the middle of a print to the same stream.
            os.write(2, f"checkpointd serve: {signal.Signals(received).name} while starting: stopping once the "
                        "server is built (send it again to stop at once)\n".encode())
        elif len(pending) == 2:
            raise KeyboardInterrupt  # once: a later one must not interrupt the half-built server's undoing

    configure_logging(args.log_level, LogFormat(args.log_format))
    settings = server_settings(args)
    dump_stacks_on_request()
    for signum in _drain_signals():
        signal.signal(signum, note_while_building)
    server = None
    try:
        if not pending:
            server = CheckpointdServer(settings)
        _note_drain_signals(pending)
    except BaseException:
        # A second signal interrupted the build (which undid itself), or landed once the server
        # was handed back, before the handler that raises was swapped: that server is stopped.
        # Either way a later signal is only noted, not raised where Python would print it as a
        # traceback while the process exits.
        _note_drain_signals(pending)
        if server is not None:
            server.stop(0)
        raise
    if pending:
        if server is not None:
            server.stop(0)  # built, never listened: nothing to drain
        print(f"checkpointd serve: {signal.Signals(pending[0]).name} while starting; stopped before serving",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    # What the server has built lives as long as the process: out of the collector's sight.
    heap.freeze_startup_heap()
    server.start()
    shutdown = install_signal_handlers(server)
    if pending:
        shutdown(pending[0], None)
    else:
        if server.metrics_address:
            print(f"checkpointd metrics: http://{server.metrics_address}/metrics", flush=True)
        print(f"checkpointd ready: listening on {' '.join(server.addresses)}; data dir {settings.data_dir}; "
              f"workspace roots {' '.join(settings.workspace_roots)}", flush=True)
    server.wait()
    return 1 if server.teardown_failed else 0


def dump_stacks_on_request() -> None:
    """``kill -USR1`` writes every thread's stack to stderr (the log), the server going on: what
    an operator (or a test) asks of a server that does not answer or does not stop. Done by
    faulthandler in C, so it answers even when no Python thread can run."""
    import faulthandler

    usr1 = getattr(signal, "SIGUSR1", None)  # none on Windows
    if usr1 is not None:
        faulthandler.register(usr1, all_threads=True, chain=False)


def install_signal_handlers(server):
    """SIGTERM, SIGINT and SIGHUP (the terminal it was started from closed) start a graceful drain
    on another thread (see CheckpointdServer.stop), where SIGHUP's default would end the process
    with its calls in flight; returns the handler."""

    def shutdown(signum, _frame) -> None:
        logging.getLogger("checkpointd").info("received %s, draining", signal.Signals(signum).name)
        threading.Thread(target=server.stop, name="drain").start()

    for signum in _drain_signals():
        signal.signal(signum, shutdown)
    return shutdown


def _note_drain_signals(noted: list[int]) -> dict[int, object]:
    """Drain signals are only appended to ``noted`` from now on; returns the handlers replaced."""
    return {signum: signal.signal(signum, lambda received, _frame: noted.append(received))
            for signum in _drain_signals()}


def _drain_signals() -> tuple[signal.Signals, ...]:
    hangup = getattr(signal, "SIGHUP", None)  # none on Windows
    return (signal.SIGTERM, signal.SIGINT) + ((hangup,) if hangup is not None else ())


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C (and SIGTERM, SIGHUP) is only noted while modules load and the arguments are parsed
    # (a KeyboardInterrupt raised in the middle of an import can land in a garbage collector
    # callback, where Python prints it as a traceback and goes on), and acted on once that is
    # done: "interrupted while loading", exit 130, whichever it was. ``serve`` goes on noting them
    # until its server has started (see serve); the other commands get the previous handlers back.
    pressed: list[int] = []
    previous = _note_drain_signals(pressed)
    serving = False
    try:
        from checkpointd.commands.interruption import INTERRUPTED_EXIT, NOTHING_CHANGED, Interrupted

        parser = build_parser()
        args = parser.parse_args(argv)
        load = getattr(getattr(args, "run", None), "load", None)
        if load is not None:
            load()  # the command's modules (the client, rich; gc and fsck: SQLAlchemy), here
        if args.command == "serve":
            serving = True
            import checkpointd.server  # noqa: F401  (seconds of imports, before anything starts)
            from checkpointd.serve_options import startup_errors

            cannot_start = startup_errors()
    finally:
        if not serving:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    if pressed:
        print(f"checkpointd: interrupted while loading, {NOTHING_CHANGED}", file=sys.stderr)
        return INTERRUPTED_EXIT
    try:
        if args.command == "serve":
            try:
                return serve(args, pressed)
            except cannot_start as exc:
                parser.exit(2, f"checkpointd serve: error: {exc}\n")
            except KeyboardInterrupt:
                # A second signal while the server was being built (see serve): no call was served.
                print("checkpointd serve: interrupted while starting", file=sys.stderr)
                return INTERRUPTED_EXIT
        code = args.run(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is seen below
        return code
    except BrokenPipeError:
        # The reader of stdout stopped early (`checkpointd ... | head`): not an error.
        from checkpointd.commands.render import reader_gone

        reader_gone()
        return 0
    except Interrupted as interrupted:
        print(f"checkpointd: {interrupted}", file=sys.stderr)
        return INTERRUPTED_EXIT
    except KeyboardInterrupt:
        print(f"checkpointd: {NOTHING_CHANGED}", file=sys.stderr)
        return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
