"""The proxy's own tools: an agent lists, diffs and rolls back its own steps through MCP."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ulid import ULID

from tests.mcp.proxy_host import checkpoints_of, proxied, text_of

pytestmark = pytest.mark.anyio

CHECKPOINT_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


async def test_the_undo_tools_are_listed_honestly_and_check_their_arguments(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    async with proxied(checkpointd_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=str(ULID())) as proxy:
        tools = {tool.name: tool for tool in (await proxy.session.list_tools()).tools}
        empty = await proxy.call("checkpoint_list", {})
        assert not empty.is_error and "no checkpoints yet" in text_of(empty)
        for arguments, reason in (
            ({}, "checkpoint_id must be a non-empty string"),
            ({"checkpoint_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "confirm": "yes"}, "confirm must be true or false"),
            ({"checkpoint_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "everything": True}, "unknown arguments"),
            ({"checkpoint_id": "not-a-ulid"}, "INVALID_CHECKPOINT_ID"),
            ({"checkpoint_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}, "NOT_FOUND"),
        ):
            result = await proxy.call("checkpoint_rollback", arguments)
            assert result.is_error and reason in text_of(result), (arguments, text_of(result))
    assert tools["checkpoint_list"].annotations.read_only_hint is True
    assert tools["checkpoint_diff"].annotations.read_only_hint is True
    rollback = tools["checkpoint_rollback"].annotations
    assert rollback.read_only_hint is False and rollback.destructive_hint is True
    assert tools["checkpoint_rollback"].input_schema["required"] == ["checkpoint_id"]
    # The wrapped server's tools pass through as it described them.
    assert tools["write_file"].annotations.destructive_hint is True
    assert tools["read_text_file"].annotations.read_only_hint is True


async def test_no_extra_tools_leaves_only_the_wrapped_servers(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    async with proxied(checkpointd_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=str(ULID()), options=["--no-extra-tools"]) as proxy:
        names = {tool.name for tool in (await proxy.session.list_tools()).tools}
    assert "write_file" in names and not names & {"checkpoint_list", "checkpoint_diff", "checkpoint_rollback"}


async def test_checkpoint_rollback_restores_the_file_after_a_dry_run(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    notes = workspace / "notes.txt"
    plan_id = str(ULID())
    target = checkpointd_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=plan_id) as proxy:
        await proxy.call("write_file", {"path": str(notes), "content": "good\n"})
        await proxy.call("write_file", {"path": str(notes), "content": "broken\n"})
        await proxy.call("write_file", {"path": str(workspace / "stray.txt"), "content": "stray\n"})

        listing = text_of(await proxy.call("checkpoint_list", {}))
        header, *lines = listing.splitlines()
        assert header.startswith(f"Plan {plan_id}: 6 checkpoints, newest first")
        ids = [CHECKPOINT_ID.search(line).group(0) for line in lines]
        assert ids == [cp.checkpoint_id for cp in reversed(checkpoints_of(target, plan_id))]
        # Newest first: stray's after, stray's before, the second write's after, its before, ...
        before_breaking = ids[3]
        assert "before_tool_execute  write_file" in lines[3]

        diff = text_of(await proxy.call("checkpoint_diff", {"checkpoint_id": before_breaking}))
        assert "modified" in diff and "notes.txt" in diff and "added" in diff and "stray.txt" in diff
        assert "-good" not in diff, "the changed lines are shown on request only"
        patch = text_of(await proxy.call("checkpoint_diff", {"checkpoint_id": before_breaking, "patch": True}))
        assert "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-good\n+broken\n" in patch
        assert "+++ b/stray.txt\n@@ -0,0 +1 @@\n+stray\n" in patch
        refused = await proxy.call("checkpoint_diff", {"checkpoint_id": before_breaking, "patch": "yes"})
        assert refused.is_error and "patch must be true or false" in text_of(refused)

        dry_run = await proxy.call("checkpoint_rollback", {"checkpoint_id": before_breaking})
        assert not dry_run.is_error
        assert "Dry run" in text_of(dry_run) and "confirm: true" in text_of(dry_run)
        assert "restore      notes.txt" in text_of(dry_run) and "remove       stray.txt" in text_of(dry_run)
        assert notes.read_text() == "broken\n" and (workspace / "stray.txt").exists()

        applied = await proxy.call("checkpoint_rollback", {"checkpoint_id": before_breaking, "confirm": True})
        assert not applied.is_error, text_of(applied)
        assert notes.read_text() == "good\n"
        assert not (workspace / "stray.txt").exists()

        # The safety checkpoint it names undoes the rollback.
        safety = re.search(r"Safety checkpoint (\S+)", text_of(applied)).group(1)
        newest = checkpoints_of(target, plan_id)[-1]
        assert (newest.checkpoint_id, newest.rollback_target_checkpoint_id) == (safety, before_breaking)
        await proxy.call("checkpoint_rollback", {"checkpoint_id": safety, "confirm": True})
        assert notes.read_text() == "broken\n" and (workspace / "stray.txt").read_text() == "stray\n"


async def test_checkpoint_diff_of_more_paths_than_it_shows_counts_the_rest(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    """One page of the diff, of the 200 paths the text lists: the header and the last line count
    the others (the server made text diffs of the 200 only)."""
    plan_id = str(ULID())
    target = checkpointd_server.tcp_target
    async with proxied(target, workspace, [str(filesystem_server), str(workspace)], plan_id=plan_id) as proxy:
        await proxy.call("write_file", {"path": str(workspace / "first.txt"), "content": "one\n"})
        newest = checkpoints_of(target, plan_id)[-1].checkpoint_id
        for i in range(203):
            (workspace / f"bulk-{i:03d}.txt").write_text(f"{i}\n")
        diff = text_of(await proxy.call("checkpoint_diff", {"checkpoint_id": newest, "patch": True}))
    assert diff.startswith(f"203 paths differ from checkpoint {newest} to the workspace now:"), diff[:300]
    assert "bulk-199.txt" in diff and "bulk-200.txt" not in diff
    assert "  ... and 3 more (diff fewer paths (paths) to see them)" in diff
    assert diff.count("+++ b/bulk-") == 200
