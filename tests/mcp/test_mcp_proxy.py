"""`checkpointd mcp-proxy` wrapping the reference MCP filesystem server, driven by the SDK's own
host-side ClientSession, against a real checkpointd: which calls get checkpoints, and what a
write tool's before/after checkpoints hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ulid import ULID

from checkpointd_client import ConfigKey
from tests.mcp.proxy_host import checkpoints_of, proxied, text_of, timeline

pytestmark = pytest.mark.anyio

READ_ONLY_CALLS = [
    ("read_text_file", lambda ws: {"path": str(ws / "notes.txt")}),
    ("read_multiple_files", lambda ws: {"paths": [str(ws / "notes.txt")]}),
    ("list_directory", lambda ws: {"path": str(ws)}),
    ("list_directory_with_sizes", lambda ws: {"path": str(ws)}),
    ("directory_tree", lambda ws: {"path": str(ws)}),
    ("search_files", lambda ws: {"path": str(ws), "pattern": "*.txt"}),
    ("get_file_info", lambda ws: {"path": str(ws / "notes.txt")}),
    ("list_allowed_directories", lambda ws: {}),
]


async def test_read_only_tools_make_no_checkpoint(checkpointd_server, workspace: Path, filesystem_server) -> None:
    """... in the plan the proxy made for the run (no --plan-id) and named on stderr."""
    (workspace / "notes.txt").write_text("first draft\n")
    target = checkpointd_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=None) as proxy:
        log = await proxy.wait_for_stderr("checkpointd mcp-proxy: plan ")
        plan_id = log.split("checkpointd mcp-proxy: plan ", 1)[1].split(",", 1)[0]
        tools = {tool.name: tool for tool in (await proxy.session.list_tools()).tools}
        for name, arguments in READ_ONLY_CALLS:
            assert tools[name].annotations.read_only_hint is True
            result = await proxy.call(name, arguments(workspace))
            assert not result.is_error, (name, text_of(result))
        assert "first draft" in text_of(await proxy.call("read_text_file", {"path": str(workspace / "notes.txt")}))
        assert checkpoints_of(target, plan_id) == []
        await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})

    assert str(ULID.from_str(plan_id)) == plan_id
    assert timeline(checkpoints_of(target, plan_id)) == [
        ("before_tool_execute", "write_file"),
        ("after_tool_execute", "write_file"),
    ]


async def test_write_tools_run_between_a_before_and_an_after_checkpoint(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    plan_id = str(ULID())
    target = checkpointd_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=plan_id) as proxy:
        calls = [
            ("write_file", {"path": str(workspace / "notes.txt"), "content": "one\ntwo\n"}),
            ("edit_file", {"path": str(workspace / "notes.txt"), "edits": [{"oldText": "two", "newText": "2"}]}),
            ("create_directory", {"path": str(workspace / "drafts")}),
            ("move_file", {"source": str(workspace / "notes.txt"), "destination": str(workspace / "drafts/n.txt")}),
        ]
        for name, arguments in calls:
            result = await proxy.call(name, arguments)
            assert not result.is_error, (name, text_of(result))
            assert "checkpointd warning" not in text_of(result)

    checkpoints = checkpoints_of(target, plan_id)
    assert timeline(checkpoints) == [
        (trigger, name) for name, _ in calls for trigger in ("before_tool_execute", "after_tool_execute")
    ]
    for before, after in zip(checkpoints[::2], checkpoints[1::2], strict=True):
        assert before.labels["tool_call_id"] == after.labels["tool_call_id"]
        assert before.workspace_root == after.workspace_root == str(workspace)
        assert before.tree_digest != after.tree_digest, f"{before.source_tool} changed nothing between them?"
    # Each before checkpoint holds the workspace as the tool found it.
    write_before, write_after, edit_before = checkpoints[0], checkpoints[1], checkpoints[2]
    assert write_before.file_count == 0 and write_after.file_count == 1
    assert edit_before.tree_digest == write_after.tree_digest
    assert (workspace / "drafts" / "n.txt").read_text() == "one\n2\n"


async def test_a_failing_write_gets_the_before_checkpoint_only(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    (workspace / "notes.txt").write_text("unchanged\n")
    plan_id = str(ULID())
    async with proxied(checkpointd_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=plan_id) as proxy:
        result = await proxy.call(
            "edit_file", {"path": str(workspace / "notes.txt"), "edits": [{"oldText": "absent", "newText": "x"}]}
        )
        assert result.is_error

    assert timeline(checkpoints_of(checkpointd_server.tcp_target, plan_id)) == [("before_tool_execute", "edit_file")]
    assert (workspace / "notes.txt").read_text() == "unchanged\n"


async def test_a_live_config_change_applies_to_the_next_call(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    from checkpointd_client import Checkpointd

    plan_id = str(ULID())
    target = checkpointd_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=plan_id) as proxy:
        await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
        with Checkpointd(target, watch_config=False) as client:
            # This plan's override, set while the proxy runs: no after_tool_execute any more.
            client.config.set_config(ConfigKey.AUTO_CREATE_ON, ["before_tool_execute"], plan_id=plan_id)
        await proxy.wait_for_stderr(
            f"{ConfigKey.AUTO_CREATE_ON.value} is now {json.dumps(['before_tool_execute'])} (plan)"
        )
        await proxy.call("write_file", {"path": str(workspace / "b.txt"), "content": "b"})

    assert timeline(checkpoints_of(target, plan_id)) == [
        ("before_tool_execute", "write_file"),
        ("after_tool_execute", "write_file"),
        ("before_tool_execute", "write_file"),
    ]


async def test_overrides_beat_the_annotations(checkpointd_server, workspace: Path, filesystem_server) -> None:
    (workspace / "notes.txt").write_text("text\n")
    plan_id = str(ULID())
    options = ["--read-only-tool", "write_file", "--write-tool", "read_text_file"]
    async with proxied(checkpointd_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=plan_id, options=options) as proxy:
        await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
        await proxy.call("read_text_file", {"path": str(workspace / "notes.txt")})

    assert timeline(checkpoints_of(checkpointd_server.tcp_target, plan_id)) == [
        ("before_tool_execute", "read_text_file"),
        ("after_tool_execute", "read_text_file"),
    ]
