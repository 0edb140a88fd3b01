"""``checkpointd mcp-proxy``: parse the command line, then hand over to checkpointd_client.mcp_proxy."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from checkpointd.commands.connection import ConnectionOptionsError, tls_credentials, token
from checkpointd.defaults import default_target
from checkpointd.logging_setup import LogFormat
from checkpointd.logging_setup import configure as configure_logging


def _header(text: str) -> tuple[str, str]:
    from checkpointd_client.mcp_proxy import ProxyOptionsError

    name, separator, value = text.partition(":")
    if not separator or not name.strip():
        raise ProxyOptionsError(f"--upstream-header takes 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def _upstream_failures() -> tuple[type[BaseException], ...]:
    """Failures of the wrapped server: it cannot be started or reached, or broke off the handshake."""
    import httpx2
    from mcp.shared.exceptions import MCPError

    return OSError, MCPError, httpx2.HTTPError


def _expected_failures() -> tuple[type[BaseException], ...]:
    """Failures that end the proxy with one line on stderr instead of a traceback."""
    from checkpointd_client import CheckpointdClientError
    from checkpointd_client.mcp_proxy import ProxyOptionsError, ToolNameClash, UpstreamGone

    return ProxyOptionsError, ToolNameClash, UpstreamGone, CheckpointdClientError, ConnectionOptionsError, ValueError


def _leaf(error: BaseException | None, wanted: tuple[type[BaseException], ...]) -> BaseException | None:
    """The expected failure inside `error`, unwrapping the exception groups of task groups and
    the exceptions a teardown raised while it propagated: the MCP SDK's HTTP transport, closed
    after the wrapped server forgot the session, raises BrokenResourceError over the reason."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, wanted):
            return error
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                found = _leaf(inner, wanted)
                if found is not None:
                    return found
        error = error.__context__
    return None


def mcp_proxy(args: argparse.Namespace) -> int:
    try:
        from checkpointd_client import mcp_proxy as proxy
    except ImportError as error:
        print(f"checkpointd mcp-proxy: error: needs the 'mcp' extra (the MCP SDK): {error}",
              file=sys.stderr)
        return 2
    upstream_failures = _upstream_failures()
    expected = (*_expected_failures(), *upstream_failures)
    upstream = None
    try:
        configure_logging(args.log_level, LogFormat.TEXT, stream=sys.stderr)
        upstream_command = list(args.upstream_command)
        if args.upstream_url and upstream_command:
            raise proxy.ProxyOptionsError("give either --upstream-url or -- COMMAND [ARGS...], not both")
        if args.upstream_headers and not args.upstream_url:
            raise proxy.ProxyOptionsError("--upstream-header goes with --upstream-url")
        if args.upstream_url:
            upstream = proxy.HttpUpstream(args.upstream_url, dict(_header(h) for h in args.upstream_headers))
        elif upstream_command:
            upstream = proxy.StdioUpstream(upstream_command[0], tuple(upstream_command[1:]))
        else:
            raise proxy.ProxyOptionsError("no MCP server to wrap: give -- COMMAND [ARGS...] or --upstream-url URL")
        options = proxy.ProxyOptions(
            upstream=upstream,
            workspace_root=Path(args.workspace_root),
            checkpointd=proxy.CheckpointdConnection(
                target=args.target or default_target(),
                token=token(args),
                credentials=tls_credentials(args),
                server_name=args.tls_server_name or None,
                call_deadline_s=args.timeout,
            ),
            plan_id=args.plan_id,
            read_only_tools=frozenset(args.read_only_tools),
            write_tools=frozenset(args.write_tools),
            extra_tools=not args.no_extra_tools,
            listen_http=proxy.HttpListener.parse(args.listen_http) if args.listen_http else None,
        ).validated()
        proxy.run(options)
    except KeyboardInterrupt:
        return 130
    except BaseException as error:
        failure = _leaf(error, expected)
        if failure is None:
            raise
        logging.getLogger("checkpointd.mcp_proxy").debug("proxy failed", exc_info=error)
        message = str(failure) or type(failure).__name__
        if isinstance(failure, upstream_failures) and upstream is not None:
            message = f"the wrapped MCP server ({upstream.describe()}): {message}"
        print(f"checkpointd mcp-proxy: error: {message}", file=sys.stderr)
        return 2 if isinstance(failure, proxy.ProxyOptionsError | ConnectionOptionsError) else 1
    return 0
