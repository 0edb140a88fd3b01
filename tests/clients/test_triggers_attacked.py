"""Attacks on the config service and on the clients' automatic checkpoint triggers.

Written by an adversarial review. Each test states a promise (README, the proto, the standards
"closed vocabularies validated at the edge", "one source of truth per fact", "bad input gets a
clear status with an ErrorInfo reason, never INTERNAL", "never lose user data") and tries to break
it against a real server. A test marked ``xfail(strict=True)`` proves a defect (its reason says
which); the others are attacks that held.

Global config is only changed on a server of the test's own (``fresh_server``); on the session
server only plan overrides are set, on plans of the test's own.
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from checkpoint.v1 import config_service_pb2 as pb
from checkpoint.v1 import config_service_pb2_grpc as pb_grpc
from checkpointd_client import (
    AutoTrigger,
    Checkpointd,
    CheckpointdRpcError,
    CheckpointSettings,
    ConfigClient,
    ConfigKey,
    SubplanSpawn,
    ToolCall,
    from_value,
    open_channel,
    phase_name,
    to_value,
    trigger_name,
)
from checkpointd_client.reference import PlanContext, ToolRunner, WriteFileTool

WAIT_S = 30
AUTO = ConfigKey.AUTO_CREATE_ON.value
REPO = Path(__file__).resolve().parents[2]
NODE_SRC = REPO / "clients" / "node" / "src"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def cpd(checkpointd_server):
    """The session server over TCP (one transport is enough for these attacks)."""
    with Checkpointd(checkpointd_server.tcp_target) as connection:
        yield connection


@pytest.fixture
def raw_config(checkpointd_server):
    """A bare ConfigService stub, to send Values no client helper would build."""
    channel = grpc.insecure_channel(checkpointd_server.tcp_target)
    yield pb_grpc.ConfigServiceStub(channel)
    channel.close()


def _rpc_error(call, method: str) -> CheckpointdRpcError:
    try:
        call()
    except grpc.RpcError as error:
        return CheckpointdRpcError.from_grpc(method, error)
    raise AssertionError(f"{method} was accepted")


def _value(**kind) -> struct_pb2.Value:
    return struct_pb2.Value(**kind)


def _list(*items: struct_pb2.Value) -> struct_pb2.Value:
    value = struct_pb2.Value()
    value.list_value.values.extend(items)
    return value


def _s(text: str) -> struct_pb2.Value:
    return struct_pb2.Value(string_value=text)


def _nested(depth: int) -> struct_pb2.Value:
    value = _s("on_error")
    for _ in range(depth):
        value = _list(value)
    return value


def _runner(connection: Checkpointd) -> ToolRunner:
    runner = ToolRunner(connection.checkpoints, connection.policy())
    runner.register(WriteFileTool())
    return runner


def _shape(checkpoint) -> tuple:
    """What an automatic checkpoint says about itself, for comparing two clients."""
    return (phase_name(checkpoint.phase), trigger_name(checkpoint.trigger), checkpoint.source_tool,
            tuple(sorted(checkpoint.labels)), checkpoint.description)


_NODE_WRITE = """
const { CheckpointdClient, ToolRunner, registerLocalFileTools } = require(NODE_SRC);
(async () => {
  const [target, planId, workspaceRoot, content] = process.argv.slice(2);
  const client = new CheckpointdClient(target);
  const runner = registerLocalFileTools(new ToolRunner({ client, logger: { warn: () => {} } }));
  await runner.execute('local/write-file', { path: 'node.txt', content }, { planId, workspaceRoot });
  client.close();
})().catch((e) => { console.error(e); process.exitCode = 1; });
"""


def _node_write(target: str, plan_id: str, workspace: Path, tmp_path: Path, content: str = "from node") -> None:
    """Runs one local/write-file through the Node client's ToolRunner, as its README shows."""
    script = tmp_path / "node_write.js"
    script.write_text(_NODE_WRITE.replace("NODE_SRC", json.dumps(str(NODE_SRC))))
    done = subprocess.run(["node", str(script), target, plan_id, str(workspace), content],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------------
# 1. Config values at the edge (held)
# ---------------------------------------------------------------------------------------------

BAD_TRIGGER_LISTS = {
    "wrong case": _list(_s("Before_Tool_Execute")),
    "upper case": _list(_s("BEFORE_TOOL_EXECUTE")),
    "trailing space": _list(_s("before_tool_execute ")),
    "zero-width space": _list(_s("before\u200btool_execute")),
    "full-width letters": _list(_s("\uff42efore_tool_execute")),
    "proto enum name": _list(_s("TRIGGER_ON_ERROR")),
    "manual (not automatic)": _list(_s("manual")),
    "rollback (server only)": _list(_s("rollback")),
    "empty name": _list(_s("")),
    "unknown name": _list(_s("before_write")),
    "duplicate": _list(_s("on_error"), _s("on_error")),
    "five items": _list(*[_s(t.value) for t in AutoTrigger], _s("on_error")),
    "a string, not a list": _s("before_tool_execute"),
    "a number": _value(number_value=1),
    "a bool": _value(bool_value=True),
    "null": _value(null_value=struct_pb2.NULL_VALUE),
    "unset Value": struct_pb2.Value(),
    "a struct": _value(struct_value=struct_pb2.Struct(fields={"on_error": _value(bool_value=True)})),
    "a nested list": _list(_list(_s("on_error"))),
    "a number in the list": _list(_s("on_error"), _value(number_value=3)),
    "a huge name": _list(_s("on_error" * 200_000)),
    "many items": _list(*[_s("on_error")] * 10_000),
}


@pytest.mark.parametrize("case", BAD_TRIGGER_LISTS, ids=list(BAD_TRIGGER_LISTS))
@pytest.mark.parametrize("scope", ["plan", "global"])
def test_a_bad_auto_create_on_is_refused_at_the_edge_and_changes_nothing(raw_config, plan_id, case, scope) -> None:
    scope_plan = plan_id if scope == "plan" else ""
    before = raw_config.GetConfig(pb.GetConfigRequest(key=AUTO, plan_id=plan_id))

    refused = _rpc_error(lambda: raw_config.SetConfig(
        pb.SetConfigRequest(key=AUTO, plan_id=scope_plan, value=BAD_TRIGGER_LISTS[case])), "SetConfig")

    assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CONFIG_VALUE"), refused
    after = raw_config.GetConfig(pb.GetConfigRequest(key=AUTO, plan_id=plan_id))
    assert (after.entry.value, after.entry.source) == (before.entry.value, before.entry.source)


@pytest.mark.parametrize("value", [
    _value(number_value=float("nan")), _value(number_value=float("inf")), _value(number_value=-float("inf")),
    _value(number_value=0), _value(number_value=600_001), _value(number_value=1.5), _s("5000"),
    _value(bool_value=True), _nested(5),
], ids=["nan", "inf", "-inf", "zero", "over max", "fraction", "string", "bool", "nested"])
def test_a_bad_client_deadline_is_invalid_argument_never_internal(raw_config, plan_id, value) -> None:
    refused = _rpc_error(lambda: raw_config.SetConfig(
        pb.SetConfigRequest(key=ConfigKey.CLIENT_DEADLINE_MS.value, plan_id=plan_id, value=value)), "SetConfig")
    assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CONFIG_VALUE"), refused


def test_a_value_nested_past_protobufs_recursion_limit_is_invalid_argument_never_internal(
    raw_channel: grpc.Channel, plan_id: str
) -> None:
    """150 nested lists cannot be decoded by the server's protobuf runtime (its limit is 100)."""
    data = struct_pb2.Value(string_value="on_error").SerializeToString()
    for _ in range(150):
        # Value.list_value (field 6, LEN) holding a ListValue whose values (field 1, LEN) hold `data`.
        inner = b"\x0a" + _varint(len(data)) + data
        data = b"\x32" + _varint(len(inner)) + inner
    request = (b"\x0a" + _varint(len(AUTO)) + AUTO.encode() + b"\x12" + _varint(len(data)) + data
               + b"\x1a" + _varint(len(plan_id)) + plan_id.encode())

    refused = _rpc_error(lambda: raw_channel.unary_unary("/checkpoint.v1.ConfigService/SetConfig")(
        request, timeout=10), "SetConfig")

    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused
    assert refused.reason in ("MALFORMED_REQUEST", "INVALID_CONFIG_VALUE"), refused


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        if number:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.fixture
def raw_channel(checkpointd_server):
    """A channel that sends request bytes as they are (for requests no stub would build)."""
    channel = grpc.insecure_channel(checkpointd_server.tcp_target)
    yield channel
    channel.close()


UNKNOWN_KEYS = {
    "upper case": "Core.Checkpoints.Auto_Create_On",
    "trailing space": AUTO + " ",
    "leading space": " " + AUTO,
    "trailing newline": AUTO + "\n",
    "full-width letter": "\uff43ore.checkpoints.auto_create_on",
    "NFD-looking": "core.checkpoints.auto_create_on\u0301",
    "empty": "",
    "prefix only": "core.checkpoints",
}


@pytest.mark.parametrize("case", UNKNOWN_KEYS, ids=list(UNKNOWN_KEYS))
def test_keys_that_only_look_like_a_registered_one_are_refused_by_every_method(raw_config, plan_id, case) -> None:
    key = UNKNOWN_KEYS[case]
    calls = {
        "GetConfig": lambda: raw_config.GetConfig(pb.GetConfigRequest(key=key, plan_id=plan_id)),
        "SetConfig": lambda: raw_config.SetConfig(
            pb.SetConfigRequest(key=key, plan_id=plan_id, value=_list(_s("on_error")))),
        "clear": lambda: raw_config.SetConfig(pb.SetConfigRequest(key=key, plan_id=plan_id, clear=True)),
        "WatchConfig": lambda: next(iter(raw_config.WatchConfig(
            pb.WatchConfigRequest(keys=[AUTO, key], plan_id=plan_id), timeout=10))),
    }
    for method, call in calls.items():
        refused = _rpc_error(call, method)
        assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_CONFIG_KEY"), (method,
                                                                                                          refused)


def test_an_empty_list_is_no_trigger_and_clearing_falls_back_for_server_and_both_clients(
    cpd: Checkpointd, checkpointd_server, workspace: Path, plan_id: str, list_plan, tmp_path: Path
) -> None:
    """[] is a value ("no automatic checkpoint"), not "unset"; clearing it falls back to the global value."""
    entry = cpd.config.set_config(AUTO, [], plan_id=plan_id)
    assert (from_value(entry.value), entry.source) == ([], pb.CONFIG_SOURCE_PLAN)
    assert CheckpointSettings().with_value(AUTO, from_value(entry.value)).auto_create_on == frozenset()

    with Checkpointd(checkpointd_server.tcp_target, plan_id=plan_id) as bound:
        assert bound.settings.current().auto_create_on == frozenset()
        _runner(bound).execute("local/write-file", {"path": "a.txt", "content": "a"}, PlanContext(workspace, plan_id))
        _node_write(checkpointd_server.tcp_target, plan_id, workspace, tmp_path)
        assert list_plan(cpd.checkpoints, plan_id) == []

        cleared = cpd.config.clear_config(AUTO, plan_id=plan_id)
        assert cleared.source == pb.CONFIG_SOURCE_DEFAULT and not cleared.HasField("update_time")
        assert sorted(from_value(cleared.value)) == sorted(t.value for t in AutoTrigger)
        assert bound.settings.wait_for(lambda s: s.auto_create_on == frozenset(AutoTrigger), timeout=WAIT_S)
        _runner(bound).execute("local/write-file", {"path": "a.txt", "content": "b"}, PlanContext(workspace, plan_id))
    assert len(list_plan(cpd.checkpoints, plan_id)) == 2


def test_every_value_the_server_accepts_both_clients_can_parse(raw_config, plan_id: str) -> None:
    """Every subset of the four triggers, in any order the server accepts, parses in the Python client
    (the Node client's parser is the same closed list: clients/node/src/contract.js)."""
    import itertools

    names = [t.value for t in AutoTrigger]
    for size in range(len(names) + 1):
        for combo in itertools.permutations(names, size):
            entry = raw_config.SetConfig(pb.SetConfigRequest(key=AUTO, plan_id=plan_id, value=to_value(list(combo))))
            value = from_value(entry.entry.value)
            assert value == list(combo)
            assert CheckpointSettings().with_value(AUTO, value).auto_create_on == {AutoTrigger(n) for n in combo}


# ---------------------------------------------------------------------------------------------
# Watches and concurrent updates
# ---------------------------------------------------------------------------------------------


def test_a_watch_never_ends_on_an_old_value_while_many_writers_race(checkpointd_server, plan_id: str) -> None:
    channel = open_channel(checkpointd_server.tcp_target)
    config = ConfigClient(channel)
    seen: queue.Queue = queue.Queue()
    watch = config.watch_config([AUTO], plan_id=plan_id, timeout=120)

    def follow() -> None:
        try:
            for entry in watch:
                seen.put(from_value(entry.value))
        except CheckpointdRpcError as error:
            seen.put(error)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    values = [[t.value for t in random.Random(i).sample(list(AutoTrigger), k=1 + i % 4)] for i in range(200)]
    errors: list[Exception] = []

    def writer(chunk: list[list[str]]) -> None:
        for value in chunk:
            try:
                config.set_config(AUTO, value, plan_id=plan_id)
            except Exception as error:  # noqa: BLE001 - any failure is the finding
                errors.append(error)

    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(writer, [values[i::8] for i in range(8)]))
        final = from_value(config.get_config(AUTO, plan_id=plan_id).value)
        last = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                last = seen.get(timeout=0.5)
            except queue.Empty:
                if last == final:
                    break
                continue
            assert not isinstance(last, Exception), last
        assert errors == []
        assert last == final, f"the watch ended on {last}, the value is {final}"
    finally:
        watch.cancel()
        channel.close()


def test_config_updates_made_conditional_lose_no_one_s_update(cpd: Checkpointd, plan_id: str) -> None:
    """Two read-modify-write updates of one key from the same read (AIP-154): the first wins, the
    second is ABORTED / ETAG_MISMATCH with the current etag and changes nothing; so is a clear
    from that stale read. Read again, it goes through. (A design gap when first attacked.)"""
    read = cpd.config.get_config(AUTO, plan_id=plan_id)
    assert read.etag
    first = cpd.config.set_config(AUTO, ["on_error"], plan_id=plan_id, etag=read.etag)
    assert first.etag not in ("", read.etag)
    for stale in (lambda: cpd.config.set_config(AUTO, ["before_tool_execute"], plan_id=plan_id, etag=read.etag),
                  lambda: cpd.config.clear_config(AUTO, plan_id=plan_id, etag=read.etag)):
        with pytest.raises(CheckpointdRpcError) as refused:
            stale()
        error = refused.value
        assert (error.code, error.reason, error.metadata["key"], error.metadata["etag"]) == (
            grpc.StatusCode.ABORTED, "ETAG_MISMATCH", AUTO, first.etag)
    now = cpd.config.get_config(AUTO, plan_id=plan_id)
    assert (from_value(now.value), now.etag) == (["on_error"], first.etag)
    again = cpd.config.set_config(AUTO, ["on_error"], plan_id=plan_id, etag=now.etag)  # the same value, set again
    assert again.etag != now.etag, "a set that no one can tell from no set"
    cleared = cpd.config.clear_config(AUTO, plan_id=plan_id, etag=again.etag)
    assert cleared.source != pb.CONFIG_SOURCE_PLAN


def test_a_watch_always_holds_the_etag_to_change_the_value_by(cpd: Checkpointd, plan_id: str) -> None:
    """A set to the same value moves the etag: the watch sends the entry again with it, so a
    watcher's conditional change is not refused for an etag it could not have known."""
    cpd.config.set_config(AUTO, ["on_error"], plan_id=plan_id)  # the plan's own value, set again below
    watch = cpd.config.watch_config([AUTO], plan_id=plan_id, timeout=30)
    entries = iter(watch)
    try:
        first = next(entries)
        assert first.source == pb.CONFIG_SOURCE_PLAN
        again = cpd.config.set_config(AUTO, from_value(first.value), plan_id=plan_id, etag=first.etag)
        assert again.etag != first.etag
        assert next(entries).etag == again.etag
    finally:
        watch.cancel()


def test_a_plan_s_etag_covers_the_global_value_it_inherits(cpd: Checkpointd, new_plan_id) -> None:
    """A plan without its own value reads the global one: a change of the global value since
    makes the plan's read stale too."""
    plan_id = new_plan_id()
    key = "core.retention.max_age_seconds"  # values of years: they prune nothing another test has
    read = cpd.config.get_config(key, plan_id=plan_id)
    assert read.source != pb.CONFIG_SOURCE_PLAN
    try:
        cpd.config.set_config(key, 9 * 365 * 86400, etag=cpd.config.get_config(key).etag)
        with pytest.raises(CheckpointdRpcError) as refused:
            cpd.config.set_config(key, 8 * 365 * 86400, plan_id=plan_id, etag=read.etag)
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.ABORTED, "ETAG_MISMATCH")
        assert cpd.config.get_config(key, plan_id=plan_id).source == pb.CONFIG_SOURCE_GLOBAL
    finally:
        cpd.config.clear_config(key)


# ---------------------------------------------------------------------------------------------
# 2. Interceptors (Python)
# ---------------------------------------------------------------------------------------------


def test_python_interceptor_follows_the_plans_own_auto_create_on(
    cpd: Checkpointd, workspace: Path, plan_id: str, list_plan
) -> None:
    entry = cpd.config.set_config(AUTO, ["on_error"], plan_id=plan_id)
    assert (from_value(entry.value), entry.source) == (["on_error"], pb.CONFIG_SOURCE_PLAN)
    time.sleep(2)  # far longer than a WatchConfig push takes (a global change arrives in milliseconds)

    _runner(cpd).execute("local/write-file", {"path": "a.txt", "content": "x"}, PlanContext(workspace, plan_id))

    assert [phase_name(c.phase) for c in list_plan(cpd.checkpoints, plan_id)] == []


def test_python_interceptor_bound_to_one_plan_does_not_apply_its_override_to_another(
    checkpointd_server, cpd: Checkpointd, workspace: Path, new_plan_id, list_plan
) -> None:
    bound_plan, other_plan = new_plan_id(), new_plan_id()
    cpd.config.set_config(AUTO, ["on_error"], plan_id=bound_plan)
    with Checkpointd(checkpointd_server.tcp_target, plan_id=bound_plan) as bound:
        assert bound.settings.current().auto_create_on == {AutoTrigger.ON_ERROR}
        plan = PlanContext(workspace, other_plan)
        _runner(bound).execute("local/write-file", {"path": "b.txt", "content": "x"}, plan)
    # other_plan has no override: the global value (the default, all four triggers) applies.
    assert sorted(phase_name(c.phase) for c in list_plan(cpd.checkpoints, other_plan)) == [
        "after_tool_execute", "before_tool_execute"]


def _remove_workspace(call_workspace: Path, state: list[bytes]):
    def tool() -> str:
        shutil.rmtree(call_workspace)  # e.g. a "discard this project" tool
        return "the tool's result"
    return tool


def _grow_state(call_workspace: Path, state: list[bytes]):
    def tool() -> str:
        (call_workspace / "out.txt").write_text("written")
        state[0] = b"s" * (17 * 1024 * 1024)  # the executor's state grew past 16 MiB while the tool ran
        return "the tool's result"
    return tool


@pytest.mark.parametrize("tool_kind", [_remove_workspace, _grow_state], ids=["workspace removed", "state grew"])
def test_an_after_checkpoint_the_server_refuses_never_hides_the_tool_result(
    cpd: Checkpointd, workspace: Path, plan_id: str, list_plan, tool_kind
) -> None:
    state = [b"small"]
    call = ToolCall("custom/risky", plan_id, workspace, plan_state=lambda: state[0])

    result = cpd.tool_interceptor().around(call, tool_kind(workspace, state))

    assert result == "the tool's result"
    assert [phase_name(c.phase) for c in list_plan(cpd.checkpoints, plan_id)] == ["before_tool_execute"]


@pytest.mark.parametrize("size_mib", [
    17,
    33,
], ids=["17 MiB", "33 MiB"])
def test_an_oversized_plan_state_stops_the_write_tool_whatever_its_size(
    cpd: Checkpointd, workspace: Path, plan_id: str, size_mib: int
) -> None:
    ran: list[bool] = []
    call = ToolCall("custom/write", plan_id, workspace, plan_state=lambda: b"s" * (size_mib * 1024 * 1024))
    assert cpd.settings.current().on_unavailable.value == "proceed"

    with pytest.raises(CheckpointdRpcError) as refused:
        cpd.tool_interceptor().around(call, lambda: ran.append(True))

    assert ran == []
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_long_tool_name_is_clipped_like_goals_and_errors_never_refused(
    cpd: Checkpointd, workspace: Path, plan_id: str, list_plan
) -> None:
    name = "mcp__a-very-long-server-name__" + "t" * 270
    assert cpd.tool_interceptor().around(ToolCall(name, plan_id, workspace), lambda: "ran") == "ran"
    checkpoints = list_plan(cpd.checkpoints, plan_id)
    assert len(checkpoints) == 2 and all(len(c.source_tool) <= 256 for c in checkpoints)


@pytest.mark.parametrize("flag", ["false", "no", 1], ids=["'false'", "'no'", "1"])
def test_only_read_only_true_skips_the_checkpoints_of_a_tool_call(
    cpd: Checkpointd, workspace: Path, plan_id: str, list_plan, flag
) -> None:
    call = ToolCall("custom/write", plan_id, workspace, read_only=flag)
    cpd.tool_interceptor().around(call, lambda: (workspace / "w.txt").write_text("written"))
    assert len(list_plan(cpd.checkpoints, plan_id)) == 2


def test_concurrent_write_tools_in_one_plan_each_get_their_own_before_and_after(
    cpd: Checkpointd, workspace: Path, plan_id: str
) -> None:
    """Ten write tools at once (asyncio.gather over begin/finish in threads, as the MCP proxy runs them)."""
    import asyncio

    tools = cpd.tool_interceptor()

    async def one(index: int) -> tuple[str, object]:
        call = ToolCall(f"custom/write-{index}", plan_id, workspace)
        taken = await asyncio.to_thread(tools.begin, call)
        await asyncio.to_thread((workspace / f"f{index}.txt").write_text, str(index))
        await asyncio.to_thread(tools.finish, call, taken)
        return taken

    async def all_of_them():
        return await asyncio.gather(*(one(i) for i in range(10)))

    taken_all = asyncio.run(all_of_them())
    checkpoints = cpd.checkpoints.list_checkpoints(plan_id)
    assert len(checkpoints) == 20
    assert sorted(c.sequence for c in checkpoints) == list(range(1, 21))
    for index, taken in enumerate(taken_all):
        assert taken.before is not None and taken.after is not None and taken.warnings == []
        assert taken.before.labels["tool_call_id"] == taken.after.labels["tool_call_id"] == taken.tool_call_id
        assert taken.before.sequence < taken.after.sequence
        after_files = {f.path for f in cpd.checkpoints.list_files(taken.after.checkpoint_id, recursive=True)}
        before_files = {f.path for f in cpd.checkpoints.list_files(taken.before.checkpoint_id, recursive=True)}
        assert f"f{index}.txt" in after_files and f"f{index}.txt" not in before_files


def test_sub_plan_spawns_racing_the_parents_tool_checkpoints_are_all_recorded(
    cpd: Checkpointd, workspace: Path, plan_id: str, new_plan_id
) -> None:
    tools, spawns = cpd.tool_interceptor(), cpd.subplan_interceptor()
    children = [new_plan_id() for _ in range(5)]

    def tool(index: int) -> str:
        return tools.around(ToolCall("custom/write", plan_id, workspace),
                            lambda: (workspace / f"t{index}.txt").write_text("x") and "ok")

    def spawn(child: str) -> str:
        return spawns.around(SubplanSpawn(plan_id, child, workspace, goal="race"), lambda: child)

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        done = [pool.submit(tool, i) for i in range(5)] + [pool.submit(spawn, c) for c in children]
        results = [f.result(timeout=120) for f in done]

    assert results[5:] == children
    checkpoints = cpd.checkpoints.list_checkpoints(plan_id)
    assert sorted(c.sequence for c in checkpoints) == list(range(1, 16))
    assert sorted(c.labels["child_plan_id"] for c in checkpoints if "child_plan_id" in c.labels) == sorted(children)
    pairs: dict[str, list[str]] = {}
    for c in checkpoints:
        if "tool_call_id" in c.labels:
            pairs.setdefault(c.labels["tool_call_id"], []).append(phase_name(c.phase))
    assert len(pairs) == 5 and all(sorted(p) == ["after_tool_execute", "before_tool_execute"] for p in pairs.values())


def test_a_read_only_call_and_a_base_exception_in_a_write_tool(cpd: Checkpointd, workspace: Path, plan_id: str,
                                                               list_plan) -> None:
    """A read-only call never checkpoints; a write tool interrupted by a BaseException keeps its before
    checkpoint, gets no after one, and the interruption propagates unchanged."""
    tools = cpd.tool_interceptor()
    assert tools.around(ToolCall("custom/read", plan_id, workspace, read_only=True), lambda: "read") == "read"
    assert list_plan(cpd.checkpoints, plan_id) == []

    class Interrupted(BaseException):
        pass

    def interrupted() -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        tools.around(ToolCall("custom/write", plan_id, workspace), interrupted)
    assert [phase_name(c.phase) for c in list_plan(cpd.checkpoints, plan_id)] == ["before_tool_execute"]


def test_a_global_change_reaches_a_running_python_client(
    fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str, list_plan
) -> None:
    runner = _runner(fresh_checkpointd)
    fresh_checkpointd.config.set_config(AUTO, ["after_tool_execute"])
    assert fresh_checkpointd.settings.wait_for(
        lambda s: s.auto_create_on == {AutoTrigger.AFTER_TOOL_EXECUTE}, timeout=WAIT_S)
    runner.execute("local/write-file", {"path": "a.txt", "content": "x"}, PlanContext(fresh_workspace, plan_id))
    assert [phase_name(c.phase) for c in list_plan(fresh_checkpointd.checkpoints, plan_id)] == ["after_tool_execute"]


# ---------------------------------------------------------------------------------------------
# 3. Python vs Node parity
# ---------------------------------------------------------------------------------------------


def test_python_and_node_record_the_same_checkpoints_for_the_same_write(
    checkpointd_server, cpd: Checkpointd, new_plan_id, tmp_path: Path
) -> None:
    python_plan, node_plan = new_plan_id(), new_plan_id()
    python_ws, node_ws = checkpointd_server.new_workspace(), checkpointd_server.new_workspace()

    _runner(cpd).execute("local/write-file", {"path": "node.txt", "content": "x"}, PlanContext(python_ws, python_plan))
    _node_write(checkpointd_server.tcp_target, node_plan, node_ws, tmp_path)

    python_shapes = [_shape(c) for c in reversed(cpd.checkpoints.list_checkpoints(python_plan))]
    node_shapes = [_shape(c) for c in reversed(cpd.checkpoints.list_checkpoints(node_plan))]
    assert len(python_shapes) == len(node_shapes) == 2
    assert python_shapes == node_shapes


def test_python_and_node_follow_a_plan_override_alike(
    checkpointd_server, cpd: Checkpointd, new_plan_id, tmp_path: Path
) -> None:
    python_plan, node_plan = new_plan_id(), new_plan_id()
    for plan in (python_plan, node_plan):
        cpd.config.set_config(AUTO, ["after_tool_execute"], plan_id=plan)
    time.sleep(2)
    python_ws, node_ws = checkpointd_server.new_workspace(), checkpointd_server.new_workspace()

    _runner(cpd).execute("local/write-file", {"path": "node.txt", "content": "x"}, PlanContext(python_ws, python_plan))
    _node_write(checkpointd_server.tcp_target, node_plan, node_ws, tmp_path)

    python_phases = [phase_name(c.phase) for c in cpd.checkpoints.list_checkpoints(python_plan)]
    node_phases = [phase_name(c.phase) for c in cpd.checkpoints.list_checkpoints(node_plan)]
    assert node_phases == ["after_tool_execute"]  # Node follows the override
    assert python_phases == node_phases


# ---------------------------------------------------------------------------------------------
# 4. Per-plan settings in the Python client (the fixes' own checks)
# ---------------------------------------------------------------------------------------------


def test_a_plan_override_set_or_cleared_after_the_plans_first_call_is_followed(
    cpd: Checkpointd, workspace: Path, plan_id: str, list_plan
) -> None:
    """A plan's settings are watched once read: a later override, and its clearing, reach the client."""
    policy = cpd.policy()
    assert policy.settings(plan_id).auto_create_on == frozenset(AutoTrigger)
    cpd.config.set_config(AUTO, ["after_tool_execute"], plan_id=plan_id)
    deadline = time.monotonic() + WAIT_S
    while policy.settings(plan_id).auto_create_on != {AutoTrigger.AFTER_TOOL_EXECUTE}:
        assert time.monotonic() < deadline, "the plan override never reached the client"
        time.sleep(0.05)
    _runner(cpd).execute("local/write-file", {"path": "a.txt", "content": "1"}, PlanContext(workspace, plan_id))
    assert [phase_name(c.phase) for c in list_plan(cpd.checkpoints, plan_id)] == ["after_tool_execute"]

    cpd.config.clear_config(AUTO, plan_id=plan_id)
    while policy.settings(plan_id).auto_create_on != frozenset(AutoTrigger):
        assert time.monotonic() < deadline, "the cleared override never reached the client"
        time.sleep(0.05)
    assert cpd.settings.current().auto_create_on == frozenset(AutoTrigger)


def test_the_plans_a_connection_follows_are_bounded_least_recently_used_first(
    cpd: Checkpointd, new_plan_id
) -> None:
    from checkpointd_client.policy import MAX_WATCHED_PLANS

    plans = [new_plan_id() for _ in range(MAX_WATCHED_PLANS + 5)]
    policy = cpd.policy()
    for plan in plans:
        assert policy.settings(plan).auto_create_on == frozenset(AutoTrigger)
    policy.settings(plans[0])  # dropped long ago: followed again, in place of the least recently used
    watched = cpd.plan_settings.watched_plans()
    assert len(watched) == MAX_WATCHED_PLANS
    assert watched[-1] == plans[0] and plans[1] not in watched and plans[-1] in watched


@pytest.mark.parametrize(("reason", "tool_runs"), [("STORAGE_EXHAUSTED", True), ("", False)],
                         ids=["store full: proceed runs the tool", "no ErrorInfo (oversized): stops it"])
def test_resource_exhausted_is_unavailable_only_with_checkpointds_storage_exhausted_reason(
    reason: str, tool_runs: bool
) -> None:
    """The same classification as the Node client (errors.js `unreachable`)."""
    from checkpointd_client import FixedSettings, ToolCheckpointInterceptor, TriggerPolicy
    from checkpointd_client.policy import is_unavailable

    refusal = CheckpointdRpcError("CreateCheckpoint", grpc.StatusCode.RESOURCE_EXHAUSTED, "no", reason=reason)
    assert is_unavailable(refusal) is tool_runs

    class Refusing:
        def create_checkpoint(self, *args, **kwargs):
            raise refusal

    tools = ToolCheckpointInterceptor(Refusing(), TriggerPolicy(FixedSettings()))  # proceed
    call = ToolCall("custom/write", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    if tool_runs:
        with tools.guard(call) as taken:
            pass
        assert len(taken.warnings) == 2  # the before and the after checkpoint
    else:
        with pytest.raises(CheckpointdRpcError):
            tools.around(call, lambda: pytest.fail("the tool ran"))
