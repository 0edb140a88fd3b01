"""What the proxy's undo tools tell a newcomer when checkpointd is not running, or refuses the
workspace: each answer says why and what to do (real proxy, real filesystem server, real checkpointd)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import anyio
import pytest
from ulid import ULID

from tests.mcp.proxy_host import WAIT_S, checkpoints_of, proxied, text_of

pytestmark = pytest.mark.anyio


async def test_the_undo_tools_say_checkpointd_is_not_reachable_and_how_to_start_it(
    fresh_server, filesystem_server
) -> None:
    workspace = fresh_server.new_workspace()
    target = fresh_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=str(ULID())) as proxy:
        fresh_server.stop()
        listed = await proxy.call("checkpoint_list", {})
        diffed = await proxy.call("checkpoint_diff", {"checkpoint_id": str(ULID())})

    for result in (listed, diffed):
        text = text_of(result)
        assert result.is_error, text
        assert f"checkpointd is not reachable at {target}" in text and "is it running?" in text, text
        assert "checkpointd serve" in text and "--target" in text, text
        assert "checkpointd answered" not in text, text


async def test_a_workspace_outside_the_servers_roots_is_named_when_checkpoint_list_finds_nothing(
    checkpointd_server, filesystem_server, short_tmp: Path
) -> None:
    outside = Path(tempfile.mkdtemp(prefix="outside-", dir=short_tmp))  # not under the server's --workspace-root
    plan_id = str(ULID())
    async with proxied(checkpointd_server.tcp_target, outside, [str(filesystem_server), str(outside)],
                       plan_id=plan_id) as proxy:
        written = await proxy.call("write_file", {"path": str(outside / "a.txt"), "content": "a"})
        listed = await proxy.call("checkpoint_list", {})

    assert written.is_error and "WORKSPACE_ROOT_NOT_ALLOWED" in text_of(written)
    text = text_of(listed)
    assert not listed.is_error, text
    assert "no tool has written" not in text, text
    assert "write_file" in text and "was not run" in text, text
    assert "outside the server's allowed workspace roots" in text and "--workspace-root" in text, text
    assert checkpoints_of(checkpointd_server.tcp_target, plan_id) == []


async def test_a_write_that_ran_without_its_checkpoint_is_named_by_checkpoint_list(
    fresh_server, filesystem_server
) -> None:
    """on_unavailable "proceed" (the default): checkpointd is down, the write runs without a
    checkpoint; once checkpointd is back, checkpoint_list says so instead of "no tool has written"."""
    workspace = fresh_server.new_workspace()
    async with proxied(fresh_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=str(ULID())) as proxy:
        fresh_server.stop()
        written = await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
        fresh_server.start()
        listed = await proxy.call("checkpoint_list", {})
        deadline = time.monotonic() + WAIT_S
        while listed.is_error and time.monotonic() < deadline:  # the channel reconnecting
            await anyio.sleep(0.2)
            listed = await proxy.call("checkpoint_list", {})

    assert not written.is_error and (workspace / "a.txt").read_text() == "a"
    text = text_of(listed)
    assert not listed.is_error, text
    assert "no tool has written" not in text, text
    assert "write_file" in text and "ran without its checkpoint" in text, text


async def test_one_change_and_one_file_are_counted_in_the_singular(checkpointd_server, workspace: Path,
                                                                   filesystem_server) -> None:
    plan_id = str(ULID())
    target = checkpointd_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=plan_id) as proxy:
        await proxy.call("write_file", {"path": str(workspace / "only.txt"), "content": "one\n"})
        newest = checkpoints_of(target, plan_id)[-1].checkpoint_id
        (workspace / "only.txt").write_text("two\n")
        diff = text_of(await proxy.call("checkpoint_diff", {"checkpoint_id": newest}))
        listed = text_of(await proxy.call("checkpoint_list", {}))
    assert diff.startswith(f"1 path differs from checkpoint {newest} to the workspace now:"), diff[:300]
    assert "(1 file)" in listed and "(1 files)" not in listed, listed
