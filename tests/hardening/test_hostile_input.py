"""Hostile requests to every RPC: hypothesis-generated field values (bad ULIDs, huge labels,
odd paths, negative and enormous page sizes, forged page tokens, long and deep filters,
unknown enum numbers, deep config values), raw wire bytes that no proto3 client can send
(invalid UTF-8 in strings, truncated or garbage messages), and messages over the size limit.
Every answer is a clear status - never INTERNAL or UNKNOWN - and the server stays healthy.
"""

from __future__ import annotations

import base64
import json
import os

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2 as config_pb
from tests.hardening.support import serving

EXAMPLES = int(os.environ.get("CHECKPOINTD_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
NEVER = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
#: Documented in server.py (MAX_RECEIVE_BYTES): a 16 MiB state plus room for the other fields.
MAX_RECEIVE_BYTES = 32 * 1024 * 1024

# -- strategies ---------------------------------------------------------------------------

no_surrogates = st.characters(blacklist_categories=("Cs",))
text = st.text(no_surrogates, max_size=64)
long_text = st.one_of(text, st.integers(0, 20_000).map(lambda n: "x" * n),
                      st.text(no_surrogates, min_size=200, max_size=5000))
ulids = st.one_of(
    st.builds(lambda: str(ULID())),
    st.builds(lambda: str(ULID()).lower()),
    st.just("8ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
    st.just("7ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
    st.just("0" * 26),
    st.text("0123456789ABCDEFGHJKMNPQRSTVWXYZILOU", min_size=0, max_size=30),
    text,
    st.builds(lambda: str(ULID()) + "\x00"),
    st.builds(lambda: " " + str(ULID())),
)
relative_paths = st.one_of(
    st.sampled_from(["..", "../x", "a/../../b", "/etc/passwd", "/", "//", "a//b", ".", "./a", "a/./b", "a\nb",
                     "a\x00b", "\\..\\x", "a/", "~", "~root/x", "$HOME", "%2e%2e/x", "\u2024\u2024/x", "a" * 5000,
                     "/".join(["d"] * 600)]),
    text,
)
labels = st.dictionaries(st.one_of(text, st.sampled_from(["a", "A", "1a", "a" * 63, "a" * 64, "a/b.c-d_e", ""])),
                         long_text, max_size=80)
enum_numbers = st.one_of(st.integers(0, 7), st.integers(-(2**31), 2**31 - 1))
page_sizes = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-1, 0, 1, 1000, 1001, 2**31 - 1]))


def _token(body: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


page_tokens = st.one_of(
    text,
    st.binary(max_size=200).map(lambda b: base64.urlsafe_b64encode(b).decode()),
    st.builds(lambda q, s: _token({"q": q, "s": s}), text,
              st.one_of(st.integers(-(2**70), 2**70), text, st.none(), st.lists(st.integers(), max_size=3))),
    st.builds(lambda s: _token({"s": s}), st.integers()),
    st.just(_token([1, 2, 3])),
    st.just("=" * 100),
)
filter_terms = st.one_of(
    st.sampled_from(['phase = "on_error"', 'trigger = "manual"', 'source_tool = "x"', 'labels.k = "v"',
                     'phase = "bogus"', 'labels. = "v"', 'nope = "v"', 'phase="on_error"', "phase = on_error",
                     'labels.a.b/c-d = "\\"q\\""', '(phase = "on_error")', 'NOT phase = "x"', 'phase = "x" OR',
                     'labels.k = "unterminated']),
    st.builds(lambda k, v: f'labels.{k} = "{v}"', text, text),
)
filters = st.one_of(
    text,
    st.lists(filter_terms, max_size=40).map(" AND ".join),
    st.integers(1, 5000).map(lambda depth: "(" * depth + 'phase = "on_error"' + ")" * depth),
    st.integers(1, 3000).map(lambda n: " AND ".join(['labels.k = "v"'] * n)),
    st.integers(0, 3000).map(lambda n: 'source_tool = "' + "\\\\" * n + '"'),
)
json_leaves = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(-(2**53), 2**53), text)
json_values = st.recursive(json_leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                               st.dictionaries(text, inner, max_size=4)),
                           max_leaves=30)


def _value(data: object) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if data is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(data, bool):
        value.bool_value = data
    elif isinstance(data, int | float):
        value.number_value = float(data)
    elif isinstance(data, str):
        value.string_value = data
    elif isinstance(data, list):
        value.list_value.values.extend(_value(v) for v in data)
    else:
        for key, item in data.items():
            value.struct_value.fields[key].CopyFrom(_value(item))
    return value


config_keys = st.one_of(st.sampled_from(["core.checkpoints.auto_create_on", "core.checkpoints.on_unavailable",
                                         "core.checkpoints.client_deadline_ms", "core.snapshot.ignore_patterns",
                                         "core.snapshot.max_file_size_bytes", "core.retention.max_age_seconds",
                                         "CORE.CHECKPOINTS.ON_UNAVAILABLE", "core", ""]), text)

# -- assertions ----------------------------------------------------------------------------


def _expect_clear(call, request, timeout: float = 30):
    """Calls; an error must be a clear status with checkpointd's ErrorInfo. Returns the error or None."""
    try:
        call(request, timeout=timeout)
    except grpc.RpcError as error:
        assert error.code() not in NEVER, f"{error.code()} for {request!r:.500}: {error.details()}"
        _assert_error_info(error)
        return error
    return None


def _assert_error_info(error: grpc.RpcError) -> None:
    status = rpc_status.from_call(error)
    assert status is not None, f"{error.code()} without a rich status: {error.details()}"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert len(infos) == 1 and infos[0].domain == "checkpointd", infos


@pytest.fixture(scope="module")
def healthy(checkpointd_server):
    """Asserts, after each test of this module, that the server still serves."""
    yield checkpointd_server
    assert serving(checkpointd_server.tcp_target), checkpointd_server.log()


# -- every RPC, field by field -------------------------------------------------------------


@FUZZ
@given(plan_id=ulids, phase=enum_numbers, trigger=enum_numbers, source_tool=long_text, labels=labels,
       description=long_text, state=st.binary(max_size=2048), workspace_root=relative_paths, request_id=long_text)
def test_create_checkpoint(checkpoint_stub, healthy, plan_id, phase, trigger, source_tool, labels, description,
                           state, workspace_root, request_id) -> None:
    request = pb.CreateCheckpointRequest(plan_id=plan_id, phase=phase, trigger=trigger, source_tool=source_tool,
                                         labels=labels, description=description, state=state,
                                         workspace_root=workspace_root, request_id=request_id)
    _expect_clear(checkpoint_stub.CreateCheckpoint, request)


@FUZZ
@given(checkpoint_id=ulids, view=enum_numbers)
def test_get_checkpoint(checkpoint_stub, healthy, checkpoint_id, view) -> None:
    _expect_clear(checkpoint_stub.GetCheckpoint, pb.GetCheckpointRequest(checkpoint_id=checkpoint_id, view=view))


@FUZZ
@given(plan_id=ulids, page_size=page_sizes, page_token=page_tokens, filter_text=filters)
def test_list_checkpoints(checkpoint_stub, healthy, plan_id, page_size, page_token, filter_text) -> None:
    _expect_clear(checkpoint_stub.ListCheckpoints, pb.ListCheckpointsRequest(
        plan_id=plan_id, page_size=page_size, page_token=page_token, filter=filter_text))


@FUZZ
@given(checkpoint_id=ulids)
def test_delete_checkpoint(checkpoint_stub, healthy, checkpoint_id) -> None:
    _expect_clear(checkpoint_stub.DeleteCheckpoint, pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id))


@FUZZ
@given(base=ulids, target=ulids, paths=st.lists(relative_paths, max_size=20), page_size=page_sizes,
       page_token=page_tokens)
def test_diff_checkpoints(checkpoint_stub, healthy, base, target, paths, page_size, page_token) -> None:
    _expect_clear(checkpoint_stub.DiffCheckpoints, pb.DiffCheckpointsRequest(
        base_checkpoint_id=base, target_checkpoint_id=target, paths=paths, page_size=page_size,
        page_token=page_token))


@FUZZ
@given(plan_id=ulids, checkpoint_id=ulids, scope=enum_numbers, paths=st.lists(relative_paths, max_size=20),
       dry_run=st.booleans(), request_id=long_text, current_state=st.binary(max_size=1024))
def test_rollback(checkpoint_stub, healthy, plan_id, checkpoint_id, scope, paths, dry_run, request_id,
                  current_state) -> None:
    _expect_clear(checkpoint_stub.Rollback, pb.RollbackRequest(
        plan_id=plan_id, checkpoint_id=checkpoint_id, scope=scope, paths=paths, dry_run=dry_run,
        request_id=request_id, current_state=current_state))


@FUZZ
@given(key=config_keys, plan_id=st.one_of(st.just(""), ulids))
def test_get_and_list_config(config_stub, healthy, key, plan_id) -> None:
    _expect_clear(config_stub.GetConfig, config_pb.GetConfigRequest(key=key, plan_id=plan_id))
    _expect_clear(config_stub.ListConfig, config_pb.ListConfigRequest(plan_id=plan_id))


@FUZZ
@given(key=config_keys, value=json_values, plan_id=st.one_of(st.just(""), ulids), clear=st.booleans())
def test_set_config(config_stub, healthy, key, value, plan_id, clear) -> None:
    request = config_pb.SetConfigRequest(key=key, value=_value(value), plan_id=plan_id or str(ULID()), clear=clear)
    _expect_clear(config_stub.SetConfig, request)


@FUZZ
@given(keys=st.lists(config_keys, max_size=10), plan_id=st.one_of(st.just(""), ulids))
def test_watch_config(config_stub, healthy, keys, plan_id) -> None:
    stream = config_stub.WatchConfig(config_pb.WatchConfigRequest(keys=keys, plan_id=plan_id), timeout=5)
    try:
        for _ in stream:
            break
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            assert error.code() not in NEVER, error.details()
            _assert_error_info(error)
    finally:
        stream.cancel()


# -- raw wire bytes ------------------------------------------------------------------------

METHODS = [
    "/checkpoint.v1.CheckpointService/CreateCheckpoint",
    "/checkpoint.v1.CheckpointService/GetCheckpoint",
    "/checkpoint.v1.CheckpointService/ListCheckpoints",
    "/checkpoint.v1.CheckpointService/DeleteCheckpoint",
    "/checkpoint.v1.CheckpointService/DiffCheckpoints",
    "/checkpoint.v1.CheckpointService/Rollback",
    "/checkpoint.v1.CheckpointService/DeleteCheckpoints",
    "/checkpoint.v1.CheckpointService/PutPendingWrites",
    "/checkpoint.v1.CheckpointService/ListPendingWrites",
    "/checkpoint.v1.ConfigService/GetConfig",
    "/checkpoint.v1.ConfigService/ListConfig",
    "/checkpoint.v1.ConfigService/SetConfig",
]


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _string_field(number: int, raw: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b", b"\xf8\x88\x80\x80\x80", b"../\xfe\xfe/x"]


def _deep_value(depth: int) -> bytes:
    """A google.protobuf.Value nested ``depth`` lists deep, past protobuf's recursion limit."""
    body = _varint(4 << 3 | 0) + _varint(1)
    for _ in range(depth):
        body = _string_field(6, _string_field(1, body))
    return body


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("raw", INVALID_UTF8, ids=lambda r: r.hex())
def test_invalid_utf8_in_every_string_field(channel, healthy, method: str, raw: bytes) -> None:
    call = channel.unary_unary(method)
    for field_number in (1, 2, 3, 4, 6, 8, 9):
        _expect_clear(call, _string_field(field_number, raw))


@pytest.mark.parametrize("method", METHODS)
@FUZZ
@given(garbage=st.one_of(st.binary(min_size=1, max_size=300),
                         st.sampled_from([b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05ab", b"\xff" * 12, b"\x08",
                                          b"\x12\x80\x80\x80\x80\x10", _string_field(2, _deep_value(150))])))
def test_garbage_wire_bytes(channel, healthy, method: str, garbage: bytes) -> None:
    _expect_clear(channel.unary_unary(method), garbage)


# -- size limits -----------------------------------------------------------------------------


def test_an_oversized_message_is_resource_exhausted_and_the_server_stays_up(checkpoint_stub, healthy,
                                                                            plan_id) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id,
                                                                    state=b"\0" * (MAX_RECEIVE_BYTES + 1)),
                                         timeout=60)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert serving(healthy.tcp_target)
    created = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"ok"),
                                               timeout=30)
    assert created.checkpoint.state_size_bytes == 2


def test_fields_over_their_limits_inside_the_message_limit(checkpoint_stub, healthy, plan_id) -> None:
    cases = [
        pb.CreateCheckpointRequest(plan_id=plan_id, state=b"s" * (16 * 1024 * 1024 + 1)),
        pb.CreateCheckpointRequest(plan_id=plan_id, labels={f"k{i}": "v" * 256 for i in range(50_000)}),
        pb.CreateCheckpointRequest(plan_id=plan_id, description="d" * 1_000_000),
        pb.CreateCheckpointRequest(plan_id=plan_id, request_id="r" * 1_000_000),
        pb.RollbackRequest(plan_id=plan_id, checkpoint_id=str(ULID()), paths=["p"] * 200_000),
        pb.DiffCheckpointsRequest(base_checkpoint_id=str(ULID()), paths=["a/" * 2000] * 2000),
        pb.ListCheckpointsRequest(plan_id=plan_id, filter='labels.k = "' + "v" * 1_000_000 + '"'),
        pb.ListCheckpointsRequest(plan_id=plan_id, page_token="t" * 1_000_000),
    ]
    methods = {pb.CreateCheckpointRequest: checkpoint_stub.CreateCheckpoint,
               pb.RollbackRequest: checkpoint_stub.Rollback,
               pb.DiffCheckpointsRequest: checkpoint_stub.DiffCheckpoints,
               pb.ListCheckpointsRequest: checkpoint_stub.ListCheckpoints}
    for request in cases:
        assert request.ByteSize() < MAX_RECEIVE_BYTES
        error = _expect_clear(methods[type(request)], request, timeout=120)
        assert error is not None and error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), \
            type(request).__name__
    assert serving(healthy.tcp_target)


# -- the longest values echoed back ------------------------------------------------------------

#: The longest string field a request can carry: the message limit, less room for the rest.
LONGEST = MAX_RECEIVE_BYTES - 64 * 1024
#: Characters of one, two, three and four UTF-8 bytes, and some that need escaping somewhere.
LONG_CHARACTERS = ["x", "é", "\u2028", "😀", '"', "\\", "%", "\n", "/", "\x00"]
long_values = st.builds(lambda char, size: char * (size // len(char.encode())),
                        st.sampled_from(LONG_CHARACTERS), st.sampled_from([300, 9000, 70_000, 1 << 20, LONGEST]))
LONG_FUZZ = settings(FUZZ, max_examples=int(os.environ.get("CHECKPOINTD_LONG_VALUE_EXAMPLES", "4")))


@pytest.fixture(scope="module")
def existing(checkpoint_stub, checkpointd_server) -> tuple[str, str]:
    """A plan with a workspace and a checkpoint, so that calls get past the ids to their other fields."""
    workspace = checkpointd_server.new_workspace()
    (workspace / "f.txt").write_text("x")
    plan_id = str(ULID())
    checkpoint = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(
        plan_id=plan_id, workspace_root=str(workspace)), timeout=30).checkpoint
    return plan_id, checkpoint.checkpoint_id


def _long_value_cases(plan_id: str, checkpoint_id: str) -> dict[str, tuple[str, object]]:
    """For every string field of every RPC: (method, make request from the value)."""
    create, get, listing = "CreateCheckpoint", "GetCheckpoint", "ListCheckpoints"
    diff, rollback = "DiffCheckpoints", "Rollback"
    new_plan = str(ULID())
    return {
        "create.plan_id": (create, lambda v: pb.CreateCheckpointRequest(plan_id=v)),
        "create.source_tool": (create, lambda v: pb.CreateCheckpointRequest(plan_id=plan_id, source_tool=v)),
        "create.description": (create, lambda v: pb.CreateCheckpointRequest(plan_id=plan_id, description=v)),
        "create.workspace_root": (create, lambda v: pb.CreateCheckpointRequest(plan_id=new_plan, workspace_root=v)),
        "create.other_workspace_root": (create, lambda v: pb.CreateCheckpointRequest(plan_id=plan_id,
                                                                                     workspace_root="/" + v)),
        "create.request_id": (create, lambda v: pb.CreateCheckpointRequest(plan_id=plan_id, request_id=v)),
        "create.label_key": (create, lambda v: pb.CreateCheckpointRequest(plan_id=plan_id, labels={v: "v"})),
        "create.label_value": (create, lambda v: pb.CreateCheckpointRequest(plan_id=plan_id, labels={"k": v})),
        "get.checkpoint_id": (get, lambda v: pb.GetCheckpointRequest(checkpoint_id=v)),
        "list.plan_id": (listing, lambda v: pb.ListCheckpointsRequest(plan_id=v)),
        "list.page_token": (listing, lambda v: pb.ListCheckpointsRequest(plan_id=plan_id, page_token=v)),
        "list.filter": (listing, lambda v: pb.ListCheckpointsRequest(plan_id=plan_id, filter=v)),
        "list.filter_value": (listing, lambda v: pb.ListCheckpointsRequest(plan_id=plan_id,
                                                                          filter=f'labels.k = "{v[:1500]}"')),
        "delete.checkpoint_id": ("DeleteCheckpoint", lambda v: pb.DeleteCheckpointRequest(checkpoint_id=v)),
        "diff.base_checkpoint_id": (diff, lambda v: pb.DiffCheckpointsRequest(base_checkpoint_id=v)),
        "diff.target_checkpoint_id": (diff, lambda v: pb.DiffCheckpointsRequest(base_checkpoint_id=checkpoint_id,
                                                                                target_checkpoint_id=v)),
        "diff.paths": (diff, lambda v: pb.DiffCheckpointsRequest(base_checkpoint_id=checkpoint_id, paths=[v])),
        "diff.raw_paths": (diff, lambda v: pb.DiffCheckpointsRequest(base_checkpoint_id=checkpoint_id,
                                                                     raw_paths=[v.encode()])),
        "rollback.plan_id": (rollback, lambda v: pb.RollbackRequest(plan_id=v, checkpoint_id=checkpoint_id)),
        "rollback.checkpoint_id": (rollback, lambda v: pb.RollbackRequest(plan_id=plan_id, checkpoint_id=v)),
        "rollback.paths": (rollback, lambda v: pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id,
                                                                  paths=[v], dry_run=True)),
        "rollback.raw_paths": (rollback, lambda v: pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id,
                                                                      raw_paths=[v.encode()], dry_run=True)),
        "rollback.request_id": (rollback, lambda v: pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id,
                                                                       request_id=v, dry_run=True)),
        "get_config.key": ("GetConfig", lambda v: config_pb.GetConfigRequest(key=v)),
        "get_config.plan_id": ("GetConfig", lambda v: config_pb.GetConfigRequest(
            key="core.checkpoints.on_unavailable", plan_id=v)),
        "list_config.plan_id": ("ListConfig", lambda v: config_pb.ListConfigRequest(plan_id=v)),
        "set_config.key": ("SetConfig", lambda v: config_pb.SetConfigRequest(key=v, plan_id=new_plan)),
        "set_config.plan_id": ("SetConfig", lambda v: config_pb.SetConfigRequest(
            key="core.checkpoints.on_unavailable", plan_id=v, value=struct_pb2.Value(string_value="refuse"))),
        "set_config.string_value": ("SetConfig", lambda v: config_pb.SetConfigRequest(
            key="core.checkpoints.on_unavailable", plan_id=new_plan, value=struct_pb2.Value(string_value=v))),
        "set_config.list_item": ("SetConfig", lambda v: config_pb.SetConfigRequest(
            key="core.snapshot.ignore_patterns", plan_id=new_plan, value=_value([v]))),
        "set_config.struct_key": ("SetConfig", lambda v: config_pb.SetConfigRequest(
            key="core.snapshot.ignore_patterns", plan_id=new_plan, value=_value({v: 1}))),
        "watch_config.keys": ("WatchConfig", lambda v: config_pb.WatchConfigRequest(keys=[v])),
        "watch_config.plan_id": ("WatchConfig", lambda v: config_pb.WatchConfigRequest(plan_id=v)),
    }


LONG_VALUE_FIELDS = sorted(_long_value_cases("", ""))


@pytest.mark.parametrize("field", LONG_VALUE_FIELDS)
@LONG_FUZZ
@given(value=long_values)
def test_the_longest_value_in_every_string_field_gets_a_clear_status(channel, checkpoint_stub, config_stub, healthy,
                                                                     existing, field, value) -> None:
    """A value as long as the request limit allows, echoed into an error, must not break the
    status trailer: the answer is a clear status whose ErrorInfo parses, never INTERNAL or UNKNOWN."""
    method, make = _long_value_cases(*existing)[field]
    stubs = {"GetConfig": config_stub, "ListConfig": config_stub, "SetConfig": config_stub,
             "WatchConfig": config_stub}
    call = getattr(stubs.get(method, checkpoint_stub), method)
    request = make(value)
    assert request.ByteSize() < MAX_RECEIVE_BYTES
    if method != "WatchConfig":
        _expect_clear(call, request, timeout=120)
        return
    stream = call(request, timeout=30)
    try:
        next(iter(stream))
    except grpc.RpcError as error:
        assert error.code() not in NEVER, error.details()
        _assert_error_info(error)
    finally:
        stream.cancel()
