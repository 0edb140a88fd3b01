"""The human side of the ``checkpointd`` command: ls, show, diff, rollback, create, delete,
config, health (all through the Python client, against a running server), gc and stats
(offline, on a data directory), fsck (either) and mcp-proxy (an MCP server wrapping another,
checkpointing its write tools; the code is checkpointd_client.mcp_proxy). Parsers are declared
here; each command's module is imported only when it runs, so ``checkpointd serve`` does not
pay for rich and the client."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
from collections.abc import Callable
from pathlib import Path

from checkpointd.defaults import MAX_SECONDS, default_data_dir

#: Deadline for calls that may capture a whole workspace (a first snapshot of a big tree).
LONG_TIMEOUT_S = 600.0
SHORT_TIMEOUT_S = 30.0
SCOPES = ("files", "state", "files_and_state")
#: The content stores serve, gc, stats and fsck take (core.store.db_store.StoreKind's values, named
#: here so that building the parser does not load the store and SQLAlchemy).
STORE_CHOICES = ("disk", "db")


def store_kind(text: str) -> str:
    """--store's value, or CHECKPOINTD_STORE's (argparse checks ``choices`` against the command
    line only, not against a default read from the environment): one of STORE_CHOICES."""
    if text not in STORE_CHOICES:
        close = difflib.get_close_matches(text.lower(), STORE_CHOICES, n=1)
        meant = f"did you mean {close[0]!r}? " if close else ""
        raise argparse.ArgumentTypeError(f"{text!r} (from --store or CHECKPOINTD_STORE) is not a store: {meant}"
                                         f"choose from {', '.join(STORE_CHOICES)}")
    return text
#: What a rollback restores unless told otherwise: what the contract's ROLLBACK_SCOPE_UNSPECIFIED
#: means, and the default of the Python and Node clients too.
DEFAULT_SCOPE = "files_and_state"


class _Lazy:
    """A command's function, imported when first loaded or called: building the parser loads no
    command's modules, and ``cli.main`` loads the chosen one while a Ctrl-C is only noted."""

    def __init__(self, module: str, function: str) -> None:
        self._where = (f"checkpointd.commands.{module}", function)
        self._run: Callable[[argparse.Namespace], int] | None = None

    def load(self) -> Callable[[argparse.Namespace], int]:
        if self._run is None:
            module, function = self._where
            self._run = getattr(importlib.import_module(module), function)
        return self._run

    def __call__(self, args: argparse.Namespace) -> int:
        return self.load()(args)


_TARGET_HELP = ("server address, HOST:PORT or unix:///PATH. Env CHECKPOINTD_TARGET. Default: the default data dir's "
                "unix socket if it exists, else 127.0.0.1:50051")


def positive_seconds(text: str) -> float:
    """A --timeout: a number of seconds above zero (a deadline of 0 or less can never be met)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_SECONDS:  # also refuses nan; longer overflows gRPC's deadline
        raise argparse.ArgumentTypeError(f"{text!r}: a timeout is a number of seconds above 0, "
                                         f"at most {MAX_SECONDS} (a year)")
    return value


def _connection_options(parser: argparse.ArgumentParser, timeout: float, target_help: str = _TARGET_HELP) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--target", default=None, help=target_help)
    group.add_argument("--token-file", type=Path, default=os.environ.get("CHECKPOINTD_TOKEN_FILE") or None,
                       metavar="FILE",
                       help="bearer token file. Env CHECKPOINTD_TOKEN_FILE, or the token in CHECKPOINTD_TOKEN")
    group.add_argument("--tls-ca", type=Path, default=os.environ.get("CHECKPOINTD_TLS_CA") or None, metavar="PEM",
                       help="connect over TLS, trusting this CA. Env CHECKPOINTD_TLS_CA")
    group.add_argument("--tls-cert", type=Path, default=os.environ.get("CHECKPOINTD_TLS_CLIENT_CERT") or None,
                       metavar="PEM", help="client certificate for mutual TLS. Env CHECKPOINTD_TLS_CLIENT_CERT")
    group.add_argument("--tls-key", type=Path, default=os.environ.get("CHECKPOINTD_TLS_CLIENT_KEY") or None,
                       metavar="PEM", help="key of --tls-cert. Env CHECKPOINTD_TLS_CLIENT_KEY")
    group.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="expect this name in the server certificate instead of the target's host")
    group.add_argument("--timeout", type=positive_seconds, default=timeout, metavar="SECONDS",
                       help=f"deadline of each call (default {timeout:g})")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _offline_options(group) -> None:
    """--data-dir, --db-url and --store of the commands that work on a data directory without a
    server (gc, stats, fsck): declared once so that their help says the same, read by offline_location."""
    group.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                       help="the data directory. Env CHECKPOINTD_DATA_DIR. Default: the server's default "
                            "($XDG_DATA_HOME/checkpointd, else ~/.local/share/checkpointd)")
    group.add_argument("--db-url", default=None, metavar="URL",
                       help="the database, as for serve. Env CHECKPOINTD_DB_URL. Default: the SQLite file "
                            "DATA_DIR/checkpointd.db")
    group.add_argument("--store", type=store_kind, default=None, metavar="{" + ",".join(STORE_CHOICES) + "}",
                       help="the content store, as for serve. Env CHECKPOINTD_STORE. Default: disk")


def offline_location(args: argparse.Namespace) -> tuple[Path, str, str]:
    """The data directory (resolved), database URL and store an offline command works on: its
    options, else their CHECKPOINTD_* variables, else serve's defaults."""
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    db_url = args.db_url if args.db_url is not None else os.environ.get("CHECKPOINTD_DB_URL", "")
    try:
        # Not a default of --store: fsck tells an offline check by the options given.
        store = args.store or store_kind(os.environ.get("CHECKPOINTD_STORE", "disk"))
    except argparse.ArgumentTypeError as exc:
        from checkpointd.commands import render

        render.error(f"argument --store: {exc}")
        raise SystemExit(2) from None
    return data_dir, db_url, store


def _client_command(commands, name: str, help_text: str, module: str, function: str,
                    timeout: float = SHORT_TIMEOUT_S, json_output: bool = True) -> argparse.ArgumentParser:
    """A command that calls a running server; ``json_output`` is False for one whose output is
    not a table (cat prints the file itself), so that --json is refused rather than ignored."""
    parser = commands.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    if json_output:
        _json_option(parser)
    _connection_options(parser, timeout)
    parser.set_defaults(run=_Lazy(module, function))
    return parser


def local_directory(text: str) -> str:
    """A --workspace-root as the server must receive it: a relative path (or ~) is resolved here,
    against this shell's directory; an absolute one is sent as given, for the server to resolve
    in its own view of the file system."""
    expanded = os.path.expanduser(text)
    return expanded if os.path.isabs(expanded) else os.path.realpath(expanded)


def _label(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"labels are KEY=VALUE, got {text!r}")
    return key, value


def _mcp_proxy_command(commands) -> None:
    proxy = commands.add_parser(
        "mcp-proxy", help="wrap an MCP server, checkpointing around its write tools",
        usage="checkpointd mcp-proxy [options] --workspace-root DIR (-- COMMAND [ARGS...] | --upstream-url URL)",
        description="An MCP server to the host (stdio, or Streamable HTTP with --listen-http) and an MCP client "
                    "to the wrapped MCP server. Every call of a write tool (one whose annotations do not say "
                    "readOnlyHint: true) runs between a before_tool_execute and, when it succeeds, an "
                    "after_tool_execute checkpoint of the workspace, as core.checkpoints.auto_create_on and "
                    "on_unavailable say. Adds the tools checkpoint_list, checkpoint_diff and checkpoint_rollback. "
                    "Needs the mcp extra.")
    proxy.add_argument("upstream_command", nargs="*", metavar="COMMAND",
                       help="after --: the stdio MCP server to start and wrap, with its arguments")
    proxy.add_argument("--upstream-url", default=None, metavar="URL",
                       help="wrap a Streamable HTTP MCP server instead (e.g. http://127.0.0.1:8000/mcp)")
    proxy.add_argument("--upstream-header", dest="upstream_headers", action="append", default=[],
                       metavar="'NAME: VALUE'", help="HTTP header sent to --upstream-url (repeatable)")
    proxy.add_argument("--workspace-root", required=True, metavar="DIR",
                       help="the directory the wrapped server writes to; it is what each checkpoint captures and "
                            "must lie under one of the server's --workspace-root directories")
    proxy.add_argument("--plan-id", default=None, metavar="ULID",
                       help="record into this plan; default: a new plan per run, its id printed on stderr")
    proxy.add_argument("--read-only-tool", dest="read_only_tools", action="append", default=[], metavar="NAME",
                       help="never checkpoint around this tool, whatever its annotations say (repeatable)")
    proxy.add_argument("--write-tool", dest="write_tools", action="append", default=[], metavar="NAME",
                       help="always checkpoint around this tool, even if annotated readOnlyHint (repeatable)")
    proxy.add_argument("--no-extra-tools", action="store_true",
                       help="do not add checkpoint_list, checkpoint_diff and checkpoint_rollback")
    proxy.add_argument("--listen-http", default=None, metavar="HOST:PORT",
                       help="serve the host over Streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    proxy.add_argument("--log-level", default=os.environ.get("CHECKPOINTD_LOG_LEVEL", "INFO"),
                       help="logging level of the proxy's stderr. Env CHECKPOINTD_LOG_LEVEL")
    _connection_options(proxy, LONG_TIMEOUT_S)
    proxy.set_defaults(run=_Lazy("mcp_proxy", "mcp_proxy"))


def register_commands(commands) -> None:
    ls = _client_command(commands, "ls", "list a plan's checkpoints, newest first", "checkpoints", "ls")
    ls.add_argument("plan_id", metavar="PLAN_ID")
    ls.add_argument("--filter", default="", metavar="EXPR",
                    help='AIP-160 filter, e.g. \'trigger = "on_error"\' or \'labels.pinned = "true"\'')

    show = _client_command(commands, "show", "show one checkpoint", "checkpoints", "show")
    show.add_argument("checkpoint_id", metavar="CHECKPOINT_ID")
    show.add_argument("--state", action="store_true", help="include the plan state")

    diff = _client_command(commands, "diff", "what changed between two checkpoints, or since one",
                           "checkpoints", "diff", LONG_TIMEOUT_S)
    diff.add_argument("base_id", metavar="BASE_ID")
    diff.add_argument("target_id", metavar="TARGET_ID", nargs="?", default="",
                      help="default: the plan's live workspace")
    diff.add_argument("--path", action="append", default=[], metavar="PATH", help="only these paths (repeatable)")
    diff.add_argument("-p", "--patch", action="store_true",
                      help="show each changed text file's lines as a unified diff (binary files and files over "
                           "1 MiB are named, not shown)")
    diff.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                      help="colour the -p output: auto (on a terminal, unless NO_COLOR is set), always or never")

    rollback = _client_command(commands, "rollback", "roll a plan back to a checkpoint (shows the dry run first)",
                               "checkpoints", "rollback", LONG_TIMEOUT_S)
    rollback.add_argument("plan_id", metavar="PLAN_ID")
    rollback.add_argument("checkpoint_id", metavar="CHECKPOINT_ID")
    rollback.add_argument("--scope", choices=SCOPES, default=DEFAULT_SCOPE,
                          help=f"what to restore: the workspace files, the plan state (returned, see --state-out) "
                               f"or both (default: {DEFAULT_SCOPE}, as in the clients)")
    rollback.add_argument("--path", action="append", default=[], metavar="PATH", help="only these paths (repeatable)")
    rollback.add_argument("--state-out", type=Path, default=None, metavar="FILE",
                          help="write the restored plan state here (scopes state, files_and_state)")
    rollback.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    rollback.add_argument("--allow-nested", action="store_true",
                          help="let the rollback change files inside another plan's workspace (nested in this "
                               "plan's, or containing it); refused otherwise")

    create = _client_command(commands, "create", "record a manual checkpoint now", "checkpoints", "create",
                             LONG_TIMEOUT_S)
    create.add_argument("plan_id", metavar="PLAN_ID")
    create.add_argument("--workspace-root", type=local_directory, default=None, metavar="DIR",
                        help="the plan's workspace, recorded by the first checkpoint that gives it and the "
                             "plan's from then on; a relative path is resolved against the current directory. "
                             "Without one (none given yet) a checkpoint records the plan state only: no files")
    create.add_argument("--label", action="append", type=_label, default=[], metavar="KEY=VALUE")
    create.add_argument("--pin", action="store_true", help="label it pinned=true: retention never prunes it")
    create.add_argument("--description", default="")
    create.add_argument("--state-file", type=Path, default=None, metavar="FILE", help="plan state to record")

    plans = _client_command(commands, "plans", "list the plans the server knows, newest plan id first", "plans",
                            "plans")
    plans.add_argument("--under", type=local_directory, default=None, metavar="DIR",
                       help="only plans whose workspace is DIR or lies under it (a relative DIR is resolved here)")
    plans.add_argument("--filter", default="", metavar="EXPR",
                       help='AIP-160 filter: workspace_root = "/dir", workspace_root : "/dir" (at or under), '
                            'update_time > "2026-01-31T00:00:00Z" (also <, <=, >=), labels.KEY = "VALUE" (one '
                            'of its checkpoints has that label), joined by AND')
    plan = commands.add_parser("plan", help="show one plan", description="Show one plan.")
    plan_verbs = plan.add_subparsers(dest="plan_command", required=True, metavar="VERB")
    plan_show = _client_command(plan_verbs, "show", "show a plan: its workspace, checkpoint count, newest "
                                                    "checkpoint and size", "plans", "plan_show")
    plan_show.add_argument("plan_id", metavar="PLAN_ID")

    cat = _client_command(commands, "cat", "print a file as it was in a checkpoint", "contents", "cat",
                          LONG_TIMEOUT_S, json_output=False)
    cat.add_argument("checkpoint_id", metavar="CHECKPOINT_ID")
    cat.add_argument("path", metavar="PATH", help="workspace-relative path of the file (a symlink prints its target)")

    ls_files = _client_command(commands, "ls-files", "list a directory as it was in a checkpoint", "contents",
                               "ls_files", LONG_TIMEOUT_S)
    ls_files.add_argument("checkpoint_id", metavar="CHECKPOINT_ID")
    ls_files.add_argument("path", metavar="PATH", nargs="?", default="",
                          help="workspace-relative path of the directory (default: the workspace root)")
    ls_files.add_argument("--recursive", "-r", action="store_true", help="list the whole subtree")

    export = _client_command(commands, "export", "write a checkpoint's files as a tar archive", "contents", "export",
                             LONG_TIMEOUT_S)
    export.add_argument("checkpoint_id", metavar="CHECKPOINT_ID")
    export.add_argument("--output", "-o", required=True, metavar="FILE",
                        help="the archive to write ('-' for stdout); an existing file is refused unless --force")
    export.add_argument("--force", action="store_true", help="replace --output if it exists")

    delete = _client_command(commands, "delete", "delete a checkpoint", "checkpoints", "delete")
    delete.add_argument("checkpoint_id", metavar="CHECKPOINT_ID")
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    config = commands.add_parser("config", help="read and change configuration",
                                 description="Read and change configuration, globally or for one plan.")
    verbs = config.add_subparsers(dest="config_command", required=True, metavar="VERB")
    for verb, help_text in (("ls", "list every key with its effective value"),
                            ("get", "show one key"),
                            ("set", "set a key (VALUE is JSON, a bare word is a string; for a list-valued key "
                                    "each word is an item)"),
                            ("clear", "remove the value set at this scope")):
        parser = _client_command(verbs, verb, help_text, "config", f"config_{verb}")
        parser.add_argument("--plan", default="", metavar="PLAN_ID", help="a plan's override instead of global")
        if verb != "ls":
            parser.add_argument("key", metavar="KEY")
        if verb == "set":
            parser.add_argument("value", metavar="VALUE", nargs="+",
                                help="e.g. 5000, refuse, '[\"a\",\"b\"]'; a list as words: "
                                     "before_tool_execute on_error")
        if verb in ("set", "clear"):
            parser.add_argument("--etag", default="", metavar="ETAG",
                                help="only if the value is still the one `config get` showed with this etag "
                                     "(else ETAG_MISMATCH and nothing changes)")

    plan_id = commands.add_parser("new-plan-id", help="print a fresh plan id (a ULID)",
                                  description="Print a fresh ULID to use as a new plan's id (checkpointd_client."
                                              "new_plan_id() and the Node client's newPlanId() make the same).")
    plan_id.set_defaults(run=_Lazy("plan_ids", "new_plan_id"))

    health = commands.add_parser("health", help="check that a server is serving (exit 0) or not (exit 1)",
                                 description="Ask the gRPC health service; exit 0 when SERVING. Used by the "
                                             "container HEALTHCHECK.")
    health.add_argument("--service", default="", help="a service name (default: the server as a whole)")
    _json_option(health)
    _connection_options(health, 5.0)
    health.set_defaults(run=_Lazy("health", "health"))

    _mcp_proxy_command(commands)

    gc = commands.add_parser(
        "gc", help="apply retention and collect unreferenced content, offline",
        description="Apply the retention config (core.retention.*) and delete content no checkpoint references, "
                    "working directly on a data directory. Refuses while a server uses it: a running server "
                    "does the same every --gc-interval seconds.")
    _offline_options(gc)
    gc.add_argument("--dry-run", action="store_true", help="report what would be pruned and reclaimed")
    gc.add_argument("--compact", action="store_true",
                    help="then repack: rewrite every pack that holds deleted or superseded records (the disk "
                         "store compacts a pack by itself only once half of it is dead)")
    _json_option(gc)
    gc.set_defaults(run=_Lazy("maintenance", "gc"))

    stats = commands.add_parser(
        "stats", help="show what each plan's checkpoints hold in the content store, offline",
        description="For each plan: its checkpoints, the distinct objects they reference, the bytes those take in "
                    "the store as stored (compressed; an object two plans share counts in both) and the part of "
                    "it no other plan references (what deleting the plan would reclaim); then the whole store and "
                    "SQLite's write-ahead logs. Works directly on a data directory, like gc: refuses while a "
                    "server uses it.")
    _offline_options(stats)
    stats.add_argument("--plan", action="append", default=[], metavar="PLAN",
                       help="show only this plan (repeatable); exit 1 if it has no checkpoints")
    _json_option(stats)
    stats.set_defaults(run=_Lazy("stats", "stats"))

    fsck = commands.add_parser(
        "fsck", help="check that every checkpoint can be restored (exit 1 on any finding)",
        description="Check every checkpoint's tree and state objects (present, and hashing to their names), the "
                    "checkpoint rows, the content store's packs and delta chains, and unfinished rollbacks. "
                    "Offline by default, on --data-dir: it opens the store as a server would (cutting off a torn "
                    "pack tail left by a crash) and so refuses while a server uses the data dir; with --store db "
                    "on PostgreSQL it changes nothing and runs beside running replicas. With --target it asks a "
                    "running server (AdminService.CheckIntegrity), which keeps serving meanwhile. Exit status: 0 "
                    "clean, 1 on any finding (an unfinished rollback included), 2 when the check could not run.")
    _offline_options(fsck.add_argument_group("offline (the default)"))
    fsck.add_argument("--unreferenced", action="store_true",
                      help="also verify the objects no checkpoint references (garbage collection deletes them)")
    _json_option(fsck)
    _connection_options(fsck, LONG_TIMEOUT_S, target_help="check this running server (HOST:PORT or unix:///PATH) "
                                                          "instead of a data directory")
    fsck.set_defaults(run=_Lazy("fsck", "fsck"))
