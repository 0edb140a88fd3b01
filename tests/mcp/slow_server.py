"""A tiny MCP server for the proxy tests, written with the SDK: a write tool that never finishes.

    python slow_server.py WORKSPACE [--http PORT] [--clash]

`slow_write` writes `<name>.started`, reports progress, then waits until it is cancelled and writes
`<name>.cancelled` (the proof that the host's cancellation reached it). `quick_write` writes and
returns. `announce` logs a message, adds the read-only tool `late_read` and says the tool list
changed. One resource (note://hello) and one prompt (greet) have annotations and `_meta` of their
own. `--clash` also offers a tool named like one of the proxy's own (checkpoint_list).
Serves stdio, or Streamable HTTP at http://127.0.0.1:PORT/mcp with --http.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

_NAME_ONLY = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def build(workspace: Path, clash: bool) -> Server[Any]:
    tools = [
        types.Tool(name="slow_write", description="Writes, then works until cancelled.", input_schema=_NAME_ONLY),
        types.Tool(name="quick_write", description="Writes a file.", input_schema=_NAME_ONLY),
        types.Tool(name="announce", description="Logs, and adds late_read.", input_schema={"type": "object"}),
    ]
    late_read = types.Tool(
        name="late_read",
        description="Reads nothing.",
        input_schema={"type": "object"},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
    if clash:
        tools.append(types.Tool(name="checkpoint_list", description="Not the proxy's.", input_schema=_NAME_ONLY))

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        name = str((params.arguments or {}).get("name"))
        match params.name:
            case "announce":
                await ctx.session.send_notification(
                    types.LoggingMessageNotification(
                        params=types.LoggingMessageNotificationParams(level="info", data="announced", logger="slow")
                    )
                )
                tools.append(late_read)
                await ctx.session.send_tool_list_changed()
                return types.CallToolResult(content=[types.TextContent(type="text", text="announced")])
            case "late_read":
                return types.CallToolResult(content=[types.TextContent(type="text", text="nothing")])
            case "quick_write":
                (workspace / name).write_text("quick")
                return types.CallToolResult(content=[types.TextContent(type="text", text=f"wrote {name}")])
            case "slow_write":
                (workspace / f"{name}.started").write_text("started")
                try:
                    await ctx.session.report_progress(1, 2, "started; working until cancelled")
                    await anyio.sleep_forever()
                finally:
                    (workspace / f"{name}.cancelled").write_text("cancelled")
        return types.CallToolResult(content=[types.TextContent(type="text", text="no such tool")], is_error=True)

    resource = types.Resource(
        uri="note://hello", name="hello", mime_type="text/plain", annotations=types.Annotations(priority=0.25),
        _meta={"test/origin": "slow_server"},
    )
    prompt = types.Prompt(
        name="greet", description="Says hello.", arguments=[types.PromptArgument(name="who", required=True)]
    )

    async def list_resources(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[resource])

    async def read_resource(ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams) -> Any:
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type="text/plain", text="hello, reader")]
        )

    async def list_prompts(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[prompt])

    async def get_prompt(ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams) -> Any:
        who = (params.arguments or {}).get("who", "nobody")
        text = types.TextContent(type="text", text=f"Say hello to {who}.")
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])

    return Server(
        "slow-test-server",
        version="1",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--http", type=int, default=None, metavar="PORT")
    parser.add_argument("--clash", action="store_true")
    args = parser.parse_args()
    server = build(args.workspace, args.clash)
    if args.http is None:

        async def serve_stdio() -> None:
            async with stdio_server() as (read_stream, write_stream):
                options = server.create_initialization_options(NotificationOptions(tools_changed=True))
                await server.run(read_stream, write_stream, options)

        anyio.run(serve_stdio)
    else:
        import uvicorn

        print(f"serving http://127.0.0.1:{args.http}/mcp", file=sys.stderr, flush=True)
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
