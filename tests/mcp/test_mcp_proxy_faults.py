"""The proxy when checkpointd is down or stuck, when the host cancels a long write tool, over
Streamable HTTP on either side, and when the wrapped server's tool names clash with its own."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from ulid import ULID

from checkpointd_client import Checkpointd, ConfigKey
from tests.conftest import free_port
from tests.mcp.proxy_host import (
    SLOW_SERVER,
    WAIT_S,
    checkpoints_of,
    proxied,
    proxied_over_http,
    proxy_command,
    stop,
    text_of,
    timeline,
    wait_for_port,
)

pytestmark = pytest.mark.anyio

DEADLINE_MS = 3000
# Liveness bound, not a speed claim: two checkpoints, each bounded by the deadline, plus a slow machine.
BOUND_S = 2 * DEADLINE_MS / 1000 + 8


def _configure(target: str, on_unavailable: str) -> None:
    with Checkpointd(target, watch_config=False) as client:
        client.config.set_config(ConfigKey.ON_UNAVAILABLE, on_unavailable)
        client.config.set_config(ConfigKey.CLIENT_DEADLINE_MS, DEADLINE_MS)


async def _settings_seen(proxy, on_unavailable: str) -> None:
    await proxy.wait_for_stderr(f"{ConfigKey.CLIENT_DEADLINE_MS.value} is now {float(DEADLINE_MS)}")
    if on_unavailable != "proceed":
        await proxy.wait_for_stderr(f'{ConfigKey.ON_UNAVAILABLE.value} is now "{on_unavailable}"')


async def test_checkpointd_stuck_with_proceed_runs_the_write_with_a_warning(
    fresh_server, filesystem_server
) -> None:
    workspace = fresh_server.new_workspace()
    _configure(fresh_server.tcp_target, "proceed")
    plan_id = str(ULID())
    async with proxied(fresh_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=plan_id) as proxy:
        await _settings_seen(proxy, "proceed")
        os.kill(fresh_server.process.pid, signal.SIGSTOP)  # accepts connections, answers nothing
        try:
            started = time.monotonic()
            read = await proxy.call("list_directory", {"path": str(workspace)})
            read_s = time.monotonic() - started
            started = time.monotonic()
            written = await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
            write_s = time.monotonic() - started
        finally:
            os.kill(fresh_server.process.pid, signal.SIGCONT)

    assert not read.is_error and "checkpointd" not in text_of(read)
    assert read_s < DEADLINE_MS / 1000, "a read-only tool waited on checkpointd"
    assert not written.is_error and (workspace / "a.txt").read_text() == "a"
    warnings = [line for line in text_of(written).splitlines() if line.startswith("checkpointd warning")]
    assert len(warnings) == 2, text_of(written)
    assert "before_tool_execute" in warnings[0] and "after_tool_execute" in warnings[1]
    assert "DEADLINE_EXCEEDED" in warnings[0]
    assert write_s < BOUND_S


async def test_checkpointd_down_with_refuse_does_not_run_the_write(fresh_server, filesystem_server) -> None:
    workspace = fresh_server.new_workspace()
    _configure(fresh_server.tcp_target, "refuse")
    plan_id = str(ULID())
    async with proxied(fresh_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=plan_id) as proxy:
        await _settings_seen(proxy, "refuse")
        fresh_server.stop()
        started = time.monotonic()
        refused = await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
        refused_s = time.monotonic() - started
        read = await proxy.call("list_directory", {"path": str(workspace)})

    assert refused.is_error
    assert "did not run the write tool 'write_file'" in text_of(refused)
    assert "on_unavailable is 'refuse'" in text_of(refused) and "UNAVAILABLE" in text_of(refused)
    assert not (workspace / "a.txt").exists()
    assert refused_s < BOUND_S
    assert not read.is_error


async def test_a_cancelled_write_keeps_its_before_checkpoint_and_gets_no_after(
    checkpointd_server, workspace: Path
) -> None:
    plan_id = str(ULID())
    target = checkpointd_server.tcp_target
    started = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    async with proxied(target, workspace, [*SLOW_SERVER, str(workspace)], plan_id=plan_id) as proxy:
        async with anyio.create_task_group() as calls:

            async def long_call() -> None:
                await proxy.call("slow_write", {"name": "long"}, progress_callback=on_progress)

            calls.start_soon(long_call)
            with anyio.fail_after(WAIT_S):
                await started.wait()  # the upstream tool is running (its progress reached the host)
            calls.cancel_scope.cancel()  # the host gives up: notifications/cancelled to the proxy
        with anyio.fail_after(WAIT_S):
            while not (workspace / "long.cancelled").exists():  # ... and on to the wrapped server
                await anyio.sleep(0.05)
        await proxy.call("quick_write", {"name": "next"})

    assert (workspace / "long.started").exists()
    assert timeline(checkpoints_of(target, plan_id)) == [
        ("before_tool_execute", "slow_write"),
        ("before_tool_execute", "quick_write"),
        ("after_tool_execute", "quick_write"),
    ]


async def test_streamable_http_on_both_sides(checkpointd_server, workspace: Path) -> None:
    """The host reaches the proxy over --listen-http; the proxy reaches the server over --upstream-url."""
    port = free_port()
    upstream = subprocess.Popen([*SLOW_SERVER, str(workspace), "--http", str(port)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    plan_id = str(ULID())
    try:
        await wait_for_port(port, upstream)
        async with proxied_over_http(checkpointd_server.tcp_target, workspace,
                                     ["--upstream-url", f"http://127.0.0.1:{port}/mcp"], plan_id=plan_id) as proxy:
            result = await proxy.call("quick_write", {"name": "over-http"})
            assert not result.is_error, text_of(result)
            listing = await proxy.call("checkpoint_list", {})
    finally:
        stop(upstream)

    assert (workspace / "over-http").read_text() == "quick"
    assert "after_tool_execute  quick_write" in text_of(listing)
    assert timeline(checkpoints_of(checkpointd_server.tcp_target, plan_id)) == [
        ("before_tool_execute", "quick_write"),
        ("after_tool_execute", "quick_write"),
    ]


def test_a_wrapped_tool_named_like_an_undo_tool_stops_the_proxy(checkpointd_server, workspace: Path) -> None:
    command = proxy_command(checkpointd_server.tcp_target, workspace, plan_id=None,
                            extra=["--", *SLOW_SERVER, str(workspace), "--clash"])
    finished = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 1
    assert "tools named checkpoint_list" in finished.stderr and "--no-extra-tools" in finished.stderr
    assert "Traceback" not in finished.stderr


async def test_resources_prompts_and_notifications_pass_through(checkpointd_server, workspace: Path) -> None:
    plan_id = str(ULID())
    logged: list[types.LoggingMessageNotificationParams] = []
    tools_changed = anyio.Event()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            tools_changed.set()

    async with proxied(checkpointd_server.tcp_target, workspace, [*SLOW_SERVER, str(workspace)], plan_id=plan_id,
                       logging_callback=on_log, message_handler=on_message) as proxy:
        capabilities = proxy.session.server_capabilities
        assert capabilities.resources is not None and capabilities.prompts is not None
        assert capabilities.tools.list_changed is True

        (resource,) = (await proxy.session.list_resources()).resources
        assert (resource.uri, resource.mime_type, resource.annotations.priority) == ("note://hello", "text/plain", 0.25)
        assert resource.meta == {"test/origin": "slow_server"}
        (contents,) = (await proxy.session.read_resource("note://hello")).contents
        assert contents.text == "hello, reader"
        (prompt,) = (await proxy.session.list_prompts()).prompts
        assert prompt.name == "greet" and prompt.arguments[0].name == "who"
        greeting = await proxy.session.get_prompt("greet", {"who": "the host"})
        assert greeting.messages[0].content.text == "Say hello to the host."

        await proxy.call("announce")
        with anyio.fail_after(WAIT_S):
            await tools_changed.wait()
        assert [(entry.level, entry.data) for entry in logged] == [("info", "announced")]
        assert not (await proxy.call("late_read")).is_error

    # announce has no annotations (a write tool); late_read, learnt from the new list, is read-only.
    assert timeline(checkpoints_of(checkpointd_server.tcp_target, plan_id)) == [
        ("before_tool_execute", "announce"),
        ("after_tool_execute", "announce"),
    ]


@pytest.mark.parametrize(
    ("upstream", "exit_code", "message"),
    [
        (["--", "/no/such/server"], 1, "the wrapped MCP server (/no/such/server): [Errno 2]"),
        (["--upstream-url", "http://127.0.0.1:1/mcp"], 1, "the wrapped MCP server (http://127.0.0.1:1/mcp):"),
        (["--", "false"], 1, "the wrapped MCP server (false): Connection closed"),
        ([], 2, "no MCP server to wrap"),
    ],
)
def test_a_proxy_that_cannot_start_says_why_in_one_line(
    checkpointd_server, workspace: Path, upstream: list[str], exit_code: int, message: str
) -> None:
    command = proxy_command(checkpointd_server.tcp_target, workspace, plan_id=None, extra=upstream)
    finished = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert finished.returncode == exit_code
    assert message in finished.stderr and "Traceback" not in finished.stderr
