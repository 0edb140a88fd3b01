"""Adversarial tests of `checkpointd mcp-proxy`.

They attack the proxy where a host or a model can push it: a confirmed checkpoint_rollback whose
answer is larger than the proxy's gRPC channel takes (many long paths), malformed tools/call
requests written straight to the proxy's stdin (numbers JSON allows but Python cannot make an int
of, a lone UTF-16 surrogate as a Node host's JSON.stringify writes it), concurrent write tools on
one plan, a tool result of several megabytes, and checkpointd dying and coming back mid-session.

Each test of a defect failed before it was mended (the same session that wrote them); the others
are attacks the proxy withstood.
"""

from __future__ import annotations

import json
import select
import subprocess
import time
from pathlib import Path

import anyio
import grpc
import pytest
from ulid import ULID

from checkpointd_client import CheckpointClient
from tests.mcp.proxy_host import SLOW_SERVER, checkpoints_of, proxied, proxy_command, stop, text_of, timeline

pytestmark = pytest.mark.anyio


# -- undo tools against big workspaces --------------------------------------------------------


def _many_long_paths(workspace: Path, count: int = 5000) -> Path:
    """`count` files whose workspace-relative paths are ~1000 bytes: a rollback's change list of
    them is ~5 MB."""
    deep = workspace / ("a" * 250) / ("b" * 250) / ("c" * 250)
    deep.mkdir(parents=True)
    for i in range(count):
        (deep / (f"{i:05d}" + "f" * 240)).write_text("x")
    return deep


async def test_a_large_confirmed_rollback_is_reported_as_done(checkpointd_server, workspace: Path) -> None:
    plan_id = str(ULID())
    with grpc.insecure_channel(checkpointd_server.tcp_target) as channel:
        empty = CheckpointClient(channel).create_checkpoint(plan_id, workspace_root=workspace)
    deep = _many_long_paths(workspace)
    async with proxied(checkpointd_server.tcp_target, workspace, [*SLOW_SERVER, str(workspace)],
                       plan_id=plan_id) as proxy:
        result = await proxy.call("checkpoint_rollback", {"checkpoint_id": empty.checkpoint_id, "confirm": True})
    assert not deep.exists(), "the rollback was not applied"
    # It was applied: the host must hear so, with the safety checkpoint that can undo it.
    assert not result.is_error, text_of(result)
    assert "Safety checkpoint" in text_of(result)


async def test_checkpoint_diff_stays_within_the_proxys_plan(checkpointd_server, workspace: Path) -> None:
    other_workspace = checkpointd_server.new_workspace()
    (other_workspace / "secret.txt").write_text("another plan's secret\n")
    with grpc.insecure_channel(checkpointd_server.tcp_target) as channel:
        foreign = CheckpointClient(channel).create_checkpoint(str(ULID()), workspace_root=other_workspace)
    (other_workspace / "secret.txt").write_text("another plan's new secret\n")
    async with proxied(checkpointd_server.tcp_target, workspace, [*SLOW_SERVER, str(workspace)],
                       plan_id=str(ULID())) as proxy:
        rollback = await proxy.call("checkpoint_rollback", {"checkpoint_id": foreign.checkpoint_id})
        diff = await proxy.call("checkpoint_diff", {"checkpoint_id": foreign.checkpoint_id, "patch": True})
    assert rollback.is_error and "CHECKPOINT_PLAN_MISMATCH" in text_of(rollback)
    assert "secret" not in text_of(diff), text_of(diff)
    assert diff.is_error


# -- malformed requests straight on the proxy's stdin -------------------------------------------


class RawHost:
    """A host that writes JSON-RPC lines itself, so it can send what the SDK's client would not."""

    def __init__(self, target: str, workspace: Path) -> None:
        command = proxy_command(target, workspace, plan_id=None, extra=["--", *SLOW_SERVER, str(workspace)])
        self.stderr_path = workspace.parent / f"{workspace.name}.raw-proxy.log"
        with open(self.stderr_path, "w") as errlog:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog)
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert self.answer(1, 30) is not None, self.stderr()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict | str) -> None:
        line = message if isinstance(message, str) else json.dumps(message)
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def answer(self, request_id: int, timeout: float) -> dict | None:
        """The answer to `request_id`, or None when none comes within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if not ready:
                return None
            line = self.process.stdout.readline()
            if not line:
                return None
            message = json.loads(line)
            if message.get("id") == request_id:
                return message
        return None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        stop(self.process)


@pytest.fixture
def raw_host(checkpointd_server, workspace: Path):
    host = RawHost(checkpointd_server.tcp_target, workspace)
    yield host
    host.close()


@pytest.mark.parametrize("limit", ["1e400", "NaN"])
def test_checkpoint_list_with_a_non_finite_limit_gets_a_clear_error_result(raw_host, limit: str) -> None:
    raw_host.send('{"jsonrpc":"2.0","id":7,"method":"tools/call",'
                  '"params":{"name":"checkpoint_list","arguments":{"limit":' + limit + '}}}')
    answer = raw_host.answer(7, 15)
    assert answer is not None
    assert "Traceback" not in raw_host.stderr()
    assert "result" in answer, answer
    assert answer["result"]["isError"] is True and "limit must be" in answer["result"]["content"][0]["text"]


def test_checkpoint_list_with_a_huge_finite_limit_gets_a_clear_error_result(raw_host) -> None:
    raw_host.send('{"jsonrpc":"2.0","id":8,"method":"tools/call",'
                  '"params":{"name":"checkpoint_list","arguments":{"limit":1e300}}}')
    answer = raw_host.answer(8, 15)
    assert answer["result"]["isError"] is True and "limit must be between" in answer["result"]["content"][0]["text"]


@pytest.mark.parametrize("tool", ["checkpoint_diff", "quick_write"])
def test_a_call_with_a_lone_surrogate_is_answered(raw_host, workspace: Path, tool: str) -> None:
    key = "checkpoint_id" if tool == "checkpoint_diff" else "name"
    raw_host.send(f'{{"jsonrpc":"2.0","id":9,"method":"tools/call",'
                  f'"params":{{"name":"{tool}","arguments":{{"{key}":"bad \\ud800 text"}}}}}}')
    answer = raw_host.answer(9, 5)
    # The proxy is alive and answers the next request: the first was dropped, not slow.
    raw_host.send({"jsonrpc": "2.0", "id": 10, "method": "ping"})
    assert raw_host.answer(10, 10) is not None
    assert answer is not None, "no answer to the tools/call in 5 s (and none logged on stderr)"


# -- concurrency, size, checkpointd dying --------------------------------------------------------


async def test_concurrent_write_tools_each_get_their_own_before_and_after(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    plan_id = str(ULID())
    async with proxied(checkpointd_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=plan_id) as proxy:
        results = {}

        async def write(i: int) -> None:
            results[i] = await proxy.call("write_file", {"path": str(workspace / f"f{i}.txt"), "content": f"{i}\n"})

        async with anyio.create_task_group() as group:
            for i in range(8):
                group.start_soon(write, i)
    assert all(not r.is_error and "checkpointd warning" not in text_of(r) for r in results.values())
    checkpoints = checkpoints_of(checkpointd_server.tcp_target, plan_id)
    by_call: dict[str, list[str]] = {}
    for checkpoint, (trigger, tool) in zip(checkpoints, timeline(checkpoints), strict=True):
        assert tool == "write_file"
        by_call.setdefault(checkpoint.labels["tool_call_id"], []).append(trigger)
    assert len(by_call) == 8
    assert all(triggers == ["before_tool_execute", "after_tool_execute"] for triggers in by_call.values())
    assert checkpoints[-1].file_count == 8  # the last after checkpoint holds every write


async def test_a_multi_megabyte_tool_result_passes_through_intact(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    text = "".join(f"line {i:07d} ✓\n" for i in range(400_000))  # ~6.4 MB
    (workspace / "big.txt").write_text(text)
    async with proxied(checkpointd_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=str(ULID())) as proxy:
        result = await proxy.call("read_text_file", {"path": str(workspace / "big.txt")})
    assert not result.is_error
    assert text_of(result) == text


async def test_checkpointd_dying_mid_session_warns_then_recovers(fresh_server, filesystem_server) -> None:
    """Default policy (proceed): while checkpointd is down a write runs with a warning the host sees;
    once it is back, the next write is checkpointed again, and what was recorded before survived."""
    workspace = fresh_server.new_workspace()
    plan_id = str(ULID())
    async with proxied(fresh_server.tcp_target, workspace, [str(filesystem_server), str(workspace)],
                       plan_id=plan_id) as proxy:
        first = await proxy.call("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
        assert "checkpointd warning" not in text_of(first)
        fresh_server.kill()
        down = await proxy.call("write_file", {"path": str(workspace / "b.txt"), "content": "b"})
        assert not down.is_error and "checkpointd warning" in text_of(down)
        assert (workspace / "b.txt").read_text() == "b"
        fresh_server.start()
        # The proxy's channel reconnects within its backoff (at most 1 s): until then a write would
        # still run with the warning (and might get its after checkpoint without its before one).
        # checkpoint_list asks checkpointd on the same channel: once it answers, the channel is back.
        deadline = time.monotonic() + 15
        while (await proxy.call("checkpoint_list", {})).is_error and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        back = await proxy.call("write_file", {"path": str(workspace / "c.txt"), "content": "c"})
        assert not back.is_error and "checkpointd warning" not in text_of(back), text_of(back)
    assert timeline(checkpoints_of(fresh_server.tcp_target, plan_id)) == [
        ("before_tool_execute", "write_file"), ("after_tool_execute", "write_file")] * 2
    assert checkpoints_of(fresh_server.tcp_target, plan_id)[-1].file_count == 3
