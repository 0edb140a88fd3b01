"""Attacks on the API's edges over a real server: request_id reuse (AIP-155), paging (AIP-158),
filters (AIP-160) and the error model (AIP-193), plus the bound on what one plan's callers may take.

A test marked xfail(strict=True) proves a defect (its reason says which); the others are attacks
that held and must keep holding.
"""

from __future__ import annotations

import base64
import concurrent.futures
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc
from checkpoint.v1 import config_service_pb2 as cfg
from tests.conftest import SERVER_ARGS, RunningServer
from tests.hardening.support import start_with_faults
from tests.helpers import error_info, tree_state
from tests.service.test_errors import INVALID, expect

NOT_FOUND = grpc.StatusCode.NOT_FOUND
FAILED = grpc.StatusCode.FAILED_PRECONDITION
DENIED = grpc.StatusCode.PERMISSION_DENIED


def _create(stub, plan_id: str, **fields) -> pb.Checkpoint:
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, **fields)).checkpoint


def _ids(stub, plan_id: str, filter_text: str = "") -> list[str]:
    return [c.checkpoint_id for c in stub.ListCheckpoints(
        pb.ListCheckpointsRequest(plan_id=plan_id, filter=filter_text, page_size=1000)).checkpoints]


def _error(call, request, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, **kwargs)
    return caught.value


def _label_key() -> str:
    return f"k{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------------------------
# Servers with faults armed (their own process, not the session's).
# --------------------------------------------------------------------------------------------

@pytest.fixture
def idle_server(short_tmp: Path, suite_databases) -> Iterator[RunningServer]:
    db_url = suite_databases.create() if suite_databases is not None else ""
    server = RunningServer(Path(tempfile.mkdtemp(prefix="x-", dir=short_tmp)), db_url=db_url,
                           extra_args=SERVER_ARGS)
    yield server
    server.stop()
    if suite_databases is not None:
        suite_databases.drop(db_url)


def _wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


# ============================================================================================
# 1. request_id (AIP-155)
# ============================================================================================

def test_a_create_request_id_reused_for_another_plan_is_refused_and_creates_nothing(checkpoint_stub, workspace):
    rid = str(uuid.uuid4())
    first_plan, other_plan = str(ULID()), str(ULID())
    (workspace / "f.txt").write_text("one")
    first = _create(checkpoint_stub, first_plan, workspace_root=str(workspace), request_id=rid, state=b"s")
    # Same id, another plan (new to the server).
    info = expect(INVALID, "REQUEST_ID_REUSED", checkpoint_stub.CreateCheckpoint,
                  pb.CreateCheckpointRequest(plan_id=other_plan, request_id=rid, state=b"s"))
    assert info.metadata["request_id"] == rid
    expect(NOT_FOUND, "PLAN_NOT_FOUND", checkpoint_stub.GetPlan, pb.GetPlanRequest(plan_id=other_plan))
    # Same id and plan, a different state, description, labels or workspace: all refused.
    other_ws = workspace.parent / f"ws-{uuid.uuid4().hex[:12]}"
    other_ws.mkdir()
    for changed in ({"state": b"other"}, {"description": "d"}, {"labels": {"a": "b"}},
                    {"workspace_root": str(other_ws)}, {"trigger": pb.TRIGGER_ON_ERROR}):
        fields = {"workspace_root": str(workspace), "request_id": rid, "state": b"s", **changed}
        expect(INVALID, "REQUEST_ID_REUSED", checkpoint_stub.CreateCheckpoint,
               pb.CreateCheckpointRequest(plan_id=first_plan, **fields))
    # The identical request replays the first answer, and nothing new was recorded.
    again = _create(checkpoint_stub, first_plan, workspace_root=str(workspace), request_id=rid, state=b"s")
    assert again.checkpoint_id == first.checkpoint_id
    assert _ids(checkpoint_stub, first_plan) == [first.checkpoint_id]


def test_a_create_request_id_given_to_rollback_is_refused_and_changes_nothing(checkpoint_stub, workspace, plan_id):
    rid = str(uuid.uuid4())
    (workspace / "f.txt").write_text("old")
    first = _create(checkpoint_stub, plan_id, workspace_root=str(workspace), request_id=rid)
    (workspace / "f.txt").write_text("new")
    before = tree_state(workspace)
    expect(INVALID, "REQUEST_ID_REUSED", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=plan_id, checkpoint_id=first.checkpoint_id, request_id=rid))
    assert tree_state(workspace) == before
    assert _ids(checkpoint_stub, plan_id) == [first.checkpoint_id]  # no safety checkpoint either


def test_a_rollback_request_id_reused_for_another_target_or_plan_is_refused(checkpoint_stub, workspace, plan_id):
    rid = str(uuid.uuid4())
    (workspace / "f.txt").write_text("v1")
    one = _create(checkpoint_stub, plan_id, workspace_root=str(workspace))
    (workspace / "f.txt").write_text("v2")
    two = _create(checkpoint_stub, plan_id)
    done = checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=one.checkpoint_id,
                                                       request_id=rid))
    assert (workspace / "f.txt").read_text() == "v1"
    count = len(_ids(checkpoint_stub, plan_id))
    for request in (
            pb.RollbackRequest(plan_id=plan_id, checkpoint_id=two.checkpoint_id, request_id=rid),
            pb.RollbackRequest(plan_id=plan_id, checkpoint_id=one.checkpoint_id, request_id=rid,
                               scope=pb.ROLLBACK_SCOPE_STATE),
            pb.RollbackRequest(plan_id=plan_id, checkpoint_id=one.checkpoint_id, request_id=rid, paths=["f.txt"]),
            pb.RollbackRequest(plan_id=str(ULID()), checkpoint_id=one.checkpoint_id, request_id=rid)):
        expect(INVALID, "REQUEST_ID_REUSED", checkpoint_stub.Rollback, request)
    # Nor may Create take it.
    expect(INVALID, "REQUEST_ID_REUSED", checkpoint_stub.CreateCheckpoint,
           pb.CreateCheckpointRequest(plan_id=plan_id, request_id=rid))
    assert (workspace / "f.txt").read_text() == "v1"
    assert len(_ids(checkpoint_stub, plan_id)) == count
    replay = checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=one.checkpoint_id,
                                                         request_id=rid))
    assert replay.safety_checkpoint.checkpoint_id == done.safety_checkpoint.checkpoint_id
    assert len(_ids(checkpoint_stub, plan_id)) == count


@pytest.mark.parametrize("rid", ["has space", "caf\u00e9", "x" * 129, "tab\there", "new\nline", "\u2028",
                                 "nul\x00byte"])
def test_malformed_request_ids_are_invalid_request_id_on_create_and_rollback(checkpoint_stub, plan_id, rid):
    expect(INVALID, "INVALID_REQUEST_ID", checkpoint_stub.CreateCheckpoint,
           pb.CreateCheckpointRequest(plan_id=plan_id, request_id=rid))
    expect(INVALID, "INVALID_REQUEST_ID", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=plan_id, checkpoint_id=str(ULID()), request_id=rid))
    expect(NOT_FOUND, "PLAN_NOT_FOUND", checkpoint_stub.GetPlan, pb.GetPlanRequest(plan_id=plan_id))


def test_a_request_id_of_128_printable_characters_and_not_a_uuid_is_accepted(checkpoint_stub, plan_id):
    rid = ("!~" * 64)
    first = _create(checkpoint_stub, plan_id, request_id=rid)
    assert _create(checkpoint_stub, plan_id, request_id=rid).checkpoint_id == first.checkpoint_id


@pytest.mark.parametrize("with_workspace", [False, True])
def test_ten_concurrent_identical_creates_make_exactly_one_checkpoint(checkpoint_stub, checkpointd_server,
                                                                      plan_id, with_workspace):
    fields = {}
    if with_workspace:
        ws = checkpointd_server.new_workspace()
        for i in range(50):
            (ws / f"f{i}.txt").write_text(str(i))
        fields["workspace_root"] = str(ws)
    else:
        _create(checkpoint_stub, plan_id)  # the plan is remembered: the state-only fast path serves the rest
    rid = str(uuid.uuid4())
    request = pb.CreateCheckpointRequest(plan_id=plan_id, request_id=rid, state=b"same", **fields)
    barrier = threading.Barrier(10)

    def call() -> str:
        barrier.wait()
        return checkpoint_stub.CreateCheckpoint(request, timeout=30).checkpoint.checkpoint_id

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: call(), range(10)))
    assert len(set(answers)) == 1
    listed = _ids(checkpoint_stub, plan_id)
    assert answers[0] in listed
    assert len(listed) == (1 if with_workspace else 2)


def test_a_reused_request_id_on_the_state_only_fast_path_is_refused_and_records_nothing(checkpoint_stub, workspace):
    # Remembered state-only plans take the event-loop fast path, which looks no request_id up first.
    fast = str(ULID())
    _create(checkpoint_stub, fast)
    create_rid, rollback_rid = str(uuid.uuid4()), str(uuid.uuid4())
    _create(checkpoint_stub, str(ULID()), request_id=create_rid, state=b"s")
    rolled = str(ULID())
    (workspace / "f").write_text("1")
    target = _create(checkpoint_stub, rolled, workspace_root=str(workspace))
    checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=rolled, checkpoint_id=target.checkpoint_id,
                                                request_id=rollback_rid))
    before = _ids(checkpoint_stub, fast)
    for rid in (create_rid, rollback_rid):
        expect(INVALID, "REQUEST_ID_REUSED", checkpoint_stub.CreateCheckpoint,
               pb.CreateCheckpointRequest(plan_id=fast, request_id=rid, state=b"s"))
    assert _ids(checkpoint_stub, fast) == before
    # The plan's numbering has no gap from the refused attempts.
    assert _create(checkpoint_stub, fast).sequence == len(before) + 1


def test_ten_concurrent_creates_of_ten_plans_sharing_a_request_id_have_exactly_one_effect(checkpoint_stub):
    plans = [str(ULID()) for _ in range(10)]
    for plan in plans:
        _create(checkpoint_stub, plan)  # remembered: the state-only fast path
    rid = str(uuid.uuid4())
    barrier = threading.Barrier(10)

    def call(plan: str) -> str:
        barrier.wait()
        try:
            return checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan, request_id=rid),
                                                    timeout=30).checkpoint.plan_id
        except grpc.RpcError as error:
            assert (error.code(), error_info(error).reason) == (INVALID, "REQUEST_ID_REUSED"), error.details()
            return ""

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        winners = [w for w in pool.map(call, plans) if w]
    assert len(winners) == 1
    assert {plan: len(_ids(checkpoint_stub, plan)) for plan in plans} == {
        plan: 2 if plan == winners[0] else 1 for plan in plans}


def test_a_create_that_loses_its_request_id_to_a_concurrent_create_leaves_no_plan_behind(idle_server):
    faults = idle_server.base / "faults"
    faults.mkdir()
    start_with_faults(idle_server, CHECKPOINTD_PAUSE_AT="create.captured:1", CHECKPOINTD_FAULT_DIR=str(faults))
    rid = str(uuid.uuid4())
    loser_plan, winner_plan = str(ULID()), str(ULID())
    loser_ws, winner_ws, later_ws = (idle_server.new_workspace() for _ in range(3))
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        loser = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(
            plan_id=loser_plan, workspace_root=str(loser_ws), request_id=rid), timeout=60)
        try:
            _wait_for(faults / "paused.create.captured")
            _create(stub, winner_plan, workspace_root=str(winner_ws), request_id=rid)
        finally:
            (faults / "resume.create.captured").touch()
        with pytest.raises(grpc.RpcError) as caught:
            loser.result()
        assert (caught.value.code(), error_info(caught.value).reason) == (INVALID, "REQUEST_ID_REUSED")
        # Refused, so it must have done nothing: as when the same request comes second (see the
        # test above), the plan stays unknown and free to take any workspace.
        _create(stub, loser_plan, workspace_root=str(later_ws))
        assert stub.GetPlan(pb.GetPlanRequest(plan_id=loser_plan)).plan.workspace_root == str(later_ws)


def test_a_create_that_fails_after_mentioning_its_plan_leaves_no_plan_and_binds_no_root(idle_server):
    """A create that fails after it recorded its plan (here: refused UNAVAILABLE once its capture
    is done) takes back what it recorded: a plan it created, a workspace root it bound to a plan
    known without one. Retried elsewhere, the plan takes the workspace of the call that succeeds."""
    new_plan, state_only_plan = str(ULID()), str(ULID())
    wrong_ws, right_ws = idle_server.new_workspace(), idle_server.new_workspace()
    idle_server.start()
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        _create(checkpoint_service_pb2_grpc.CheckpointServiceStub(channel), state_only_plan, state=b"no workspace")
    idle_server.stop()
    start_with_faults(idle_server, CHECKPOINTD_UNAVAILABLE_AT="create.captured:2")
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        for plan in (new_plan, state_only_plan):
            with pytest.raises(grpc.RpcError) as caught:
                _create(stub, plan, workspace_root=str(wrong_ws))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
        expect(grpc.StatusCode.NOT_FOUND, "PLAN_NOT_FOUND", stub.GetPlan, pb.GetPlanRequest(plan_id=new_plan))
        assert stub.GetPlan(pb.GetPlanRequest(plan_id=state_only_plan)).plan.workspace_root == ""
        for plan in (new_plan, state_only_plan):
            _create(stub, plan, workspace_root=str(right_ws))
            assert stub.GetPlan(pb.GetPlanRequest(plan_id=plan)).plan.workspace_root == str(right_ws)


# ============================================================================================
# 2. Paging (AIP-158)
# ============================================================================================

@pytest.fixture
def five(checkpoint_stub, plan_id) -> list[str]:
    """Five checkpoints of one plan, newest first."""
    for i in range(5):
        _create(checkpoint_stub, plan_id, labels={"n": str(i)})
    return _ids(checkpoint_stub, plan_id)


def _token(stub, plan_id: str, page_size: int = 2, filter_text: str = "") -> str:
    token = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=page_size,
                                                           filter=filter_text)).next_page_token
    assert token
    return token


def _tampered(token: str) -> list[str]:
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    flipped = []
    for index in (0, 1, 8, 9, len(raw) - 1):
        copy = bytearray(raw)
        copy[index] ^= 0x01
        flipped.append(base64.urlsafe_b64encode(bytes(copy)).decode().rstrip("="))
    return [*flipped, token[:-1], token[:-4], token + "A", token + "AAAA", "A", "====", "not a token",
            base64.urlsafe_b64encode(b"\x01" + b"\x00" * 40).decode().rstrip("="), "\u00e9" * 55, "x" * 100_000]


def test_tampered_truncated_and_garbage_page_tokens_are_invalid_page_token(checkpoint_stub, plan_id, five):
    for bad in _tampered(_token(checkpoint_stub, plan_id)):
        expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
               pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2, page_token=bad))


def test_a_page_token_of_another_plan_or_filter_is_refused_but_page_size_may_change(checkpoint_stub, plan_id, five):
    token = _token(checkpoint_stub, plan_id)
    other = str(ULID())
    for _ in range(3):
        _create(checkpoint_stub, other)
    expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=other, page_size=2, page_token=token))
    for filter_text in ('source_tool = ""', 'labels.n = "1"'):
        expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
               pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2, page_token=token, filter=filter_text))
    rest = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1000,
                                                                     page_token=token))
    assert [c.checkpoint_id for c in rest.checkpoints] == five[2:]
    assert not rest.next_page_token


@pytest.mark.parametrize("size", [-1, -(2**31)])
def test_a_negative_page_size_is_invalid_page_size_everywhere(checkpoint_stub, plan_id, five, size):
    expect(INVALID, "INVALID_PAGE_SIZE", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan_id, page_size=size))
    expect(INVALID, "INVALID_PAGE_SIZE", checkpoint_stub.ListPlans, pb.ListPlansRequest(page_size=size))


def test_a_huge_page_size_is_lowered_not_refused(checkpoint_stub, plan_id, five):
    found = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2**31 - 1))
    assert [c.checkpoint_id for c in found.checkpoints] == five and not found.next_page_token
    plans = checkpoint_stub.ListPlans(pb.ListPlansRequest(page_size=2**31 - 1))
    assert len(plans.plans) <= 1000


def test_paging_while_checkpoints_are_added_and_deleted_neither_repeats_nor_skips(checkpoint_stub, plan_id, five):
    page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2))
    seen = [c.checkpoint_id for c in page.checkpoints]
    for _ in range(3):
        _create(checkpoint_stub, plan_id)
    # The checkpoint the token points at (the last one returned) is deleted: paging goes on below it.
    checkpoint_stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=seen[-1]))
    token = page.next_page_token
    while token:
        page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1,
                                                                         page_token=token))
        seen += [c.checkpoint_id for c in page.checkpoints]
        token = page.next_page_token
    assert seen == five


def test_a_page_token_after_every_checkpoint_went_gives_an_empty_last_page(checkpoint_stub, plan_id, five):
    token = _token(checkpoint_stub, plan_id)
    checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(plan_id=plan_id))
    page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2, page_token=token))
    assert not page.checkpoints and not page.next_page_token


def test_list_plans_page_tokens_refuse_garbage_and_tokens_of_other_lists(checkpoint_stub, plan_id, five):
    for _ in range(2):
        _create(checkpoint_stub, str(ULID()))
    plans_token = checkpoint_stub.ListPlans(pb.ListPlansRequest(page_size=1)).next_page_token
    assert plans_token
    checkpoints_token = _token(checkpoint_stub, plan_id)
    for bad in [*_tampered(plans_token), checkpoints_token]:
        expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListPlans, pb.ListPlansRequest(page_token=bad))
    expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListPlans,
           pb.ListPlansRequest(page_token=plans_token, filter='workspace_root : "/"'))
    expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan_id, page_token=plans_token))


def test_list_checkpoint_files_tokens_are_bound_to_checkpoint_path_and_recursion(checkpoint_stub, workspace, plan_id):
    (workspace / "d").mkdir()
    for name in ("a", "b", "c", "d/x", "d/y"):
        (workspace / name).write_text(name)
    one = _create(checkpoint_stub, plan_id, workspace_root=str(workspace))
    two = _create(checkpoint_stub, plan_id)
    token = checkpoint_stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(
        checkpoint_id=one.checkpoint_id, page_size=1)).next_page_token
    assert token
    for request in (pb.ListCheckpointFilesRequest(checkpoint_id=two.checkpoint_id, page_token=token),
                    pb.ListCheckpointFilesRequest(checkpoint_id=one.checkpoint_id, page_token=token, recursive=True),
                    pb.ListCheckpointFilesRequest(checkpoint_id=one.checkpoint_id, page_token=token, path="d"),
                    *(pb.ListCheckpointFilesRequest(checkpoint_id=one.checkpoint_id, page_token=bad)
                      for bad in _tampered(token))):
        expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpointFiles, request)
    expect(INVALID, "INVALID_PAGE_SIZE", checkpoint_stub.ListCheckpointFiles,
           pb.ListCheckpointFilesRequest(checkpoint_id=one.checkpoint_id, page_size=-5))


# ============================================================================================
# 3. Filters (AIP-160)
# ============================================================================================

NASTY_FILTERS = [
    'phase = "on_error" OR trigger = "manual"',
    'phase = "on_error" and trigger = "manual"',
    'phase = "ON_ERROR"',
    'phase = "nonsense"',
    'trigger = "x"',
    'phase = 1',
    'phase = "on_error" AND phase = "manual"',
    'state = "x"',
    'labels = "x"',
    'checkpoint_id = "x"',
    "source_tool = 'x'",
    'source_tool = "x',
    'source_tool = "x" AND',
    'AND source_tool = "x"',
    'source_tool != "x"',
    'source_tool : "x"',
    'NOT source_tool = "x"',
    '-source_tool = "x"',
    'source_tool = "x"; DROP TABLE checkpoints; --',
    '" OR 1=1 --',
    "source_tool = \"x\" OR \"1\" = \"1\"",
    '(' * 1000 + 'source_tool = "x"' + ')' * 1000,
    '(' * 100_000,
    'source_tool = "' + "\\" * 2047,
    'source_tool = "' + "a" * 2100 + '"',
    " AND ".join(['source_tool = "x"'] * 17),
    'labels.a = "' + '\\"' * 1000,
    "x" * (1 << 20),
    'source_tool = "x"\x00',
    '\ud7ff',
]


@pytest.mark.parametrize("filter_text", NASTY_FILTERS, ids=range(len(NASTY_FILTERS)))
def test_nasty_filters_are_invalid_filter_and_delete_nothing(checkpoint_stub, plan_id, filter_text):
    keep = _create(checkpoint_stub, plan_id, source_tool="x")
    expect(INVALID, "INVALID_FILTER", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan_id, filter=filter_text))
    for request in (pb.DeleteCheckpointsRequest(filter=filter_text),
                    pb.DeleteCheckpointsRequest(plan_id=plan_id, filter=filter_text)):
        expect(INVALID, "INVALID_FILTER", checkpoint_stub.DeleteCheckpoints, request)
    assert _ids(checkpoint_stub, plan_id) == [keep.checkpoint_id]


@pytest.mark.parametrize("filter_text", ["", " ", "\t\n ", " " * (1 << 20)])
def test_a_bulk_delete_across_plans_without_a_real_filter_is_refused(checkpoint_stub, plan_id, filter_text):
    keep = _create(checkpoint_stub, plan_id)
    expect(INVALID, "MISSING_FIELD", checkpoint_stub.DeleteCheckpoints, pb.DeleteCheckpointsRequest(filter=filter_text))
    assert _ids(checkpoint_stub, plan_id) == [keep.checkpoint_id]


def test_bulk_delete_deletes_exactly_what_the_filter_says(checkpoint_stub):
    key = _label_key()
    plan_a, plan_b = str(ULID()), str(ULID())
    doomed = {_create(checkpoint_stub, plan_a, labels={key: "r"}, source_tool="t").checkpoint_id,
              _create(checkpoint_stub, plan_b, labels={key: "r"}, source_tool="t").checkpoint_id}
    kept = {_create(checkpoint_stub, plan_a, labels={key: "r"}, source_tool="u").checkpoint_id,
            _create(checkpoint_stub, plan_b, labels={key: "R"}, source_tool="t").checkpoint_id,
            _create(checkpoint_stub, plan_b, labels={key: "r "}, source_tool="t").checkpoint_id,
            _create(checkpoint_stub, plan_b, source_tool="t").checkpoint_id}
    deleted = checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(
        filter=f'labels.{key} = "r" AND source_tool = "t"')).checkpoints
    assert {c.checkpoint_id for c in deleted} == doomed
    assert set(_ids(checkpoint_stub, plan_a)) | set(_ids(checkpoint_stub, plan_b)) == kept


def test_a_bulk_delete_whose_label_terms_contradict_deletes_nothing(checkpoint_stub):
    key = _label_key()
    plan = str(ULID())
    made = {_create(checkpoint_stub, plan, labels={key: value}).checkpoint_id for value in ("a", "b")}
    contradiction = f'labels.{key} = "a" AND labels.{key} = "b"'
    try:
        deleted = checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(filter=contradiction)).checkpoints
    except grpc.RpcError as error:  # refusing it (as "phase given twice" is) is as good
        assert (error.code(), error_info(error).reason) == (INVALID, "INVALID_FILTER")
        deleted = []
    assert [c.checkpoint_id for c in deleted] == []
    assert set(_ids(checkpoint_stub, plan)) == made


def test_a_list_whose_label_terms_contradict_lists_nothing(checkpoint_stub, plan_id):
    for value in ("a", "b"):
        _create(checkpoint_stub, plan_id, labels={"run": value})
    try:
        found = _ids(checkpoint_stub, plan_id, 'labels.run = "a" AND labels.run = "b"')
    except grpc.RpcError as error:
        assert (error.code(), error_info(error).reason) == (INVALID, "INVALID_FILTER")
        found = []
    assert found == []


def test_list_plans_with_contradicting_workspace_roots_lists_nothing(checkpoint_stub, checkpointd_server):
    ws_a, ws_b = checkpointd_server.new_workspace(), checkpointd_server.new_workspace()
    _create(checkpoint_stub, str(ULID()), workspace_root=str(ws_a))
    _create(checkpoint_stub, str(ULID()), workspace_root=str(ws_b))
    contradiction = f'workspace_root = "{ws_a}" AND workspace_root = "{ws_b}"'
    try:
        found = checkpoint_stub.ListPlans(pb.ListPlansRequest(filter=contradiction, page_size=1000)).plans
    except grpc.RpcError as error:
        assert (error.code(), error_info(error).reason) == (INVALID, "INVALID_FILTER")
        found = []
    assert [p.plan_id for p in found] == []


def test_list_plans_two_values_of_one_label_each_need_a_checkpoint(checkpoint_stub):
    key = _label_key()
    both, only_b = str(ULID()), str(ULID())
    _create(checkpoint_stub, both, labels={key: "a"})
    _create(checkpoint_stub, both, labels={key: "b"})
    _create(checkpoint_stub, only_b, labels={key: "b"})
    found = checkpoint_stub.ListPlans(pb.ListPlansRequest(
        filter=f'labels.{key} = "a" AND labels.{key} = "b"', page_size=1000)).plans
    assert [p.plan_id for p in found] == [both]


def test_an_empty_label_key_in_a_checkpoint_filter_is_refused(checkpoint_stub, plan_id):
    _create(checkpoint_stub, plan_id)
    # ListPlans refuses it: the two filters of the same API must agree.
    expect(INVALID, "INVALID_FILTER", checkpoint_stub.ListPlans, pb.ListPlansRequest(filter='labels. = "x"'))
    expect(INVALID, "INVALID_FILTER", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan_id, filter='labels. = "x"'))


@pytest.mark.parametrize("filter_text", [
    'update_time > "yesterday"',
    'update_time > "2026-01-01"',
    'update_time > "2026-01-01T00:00:00"',
    'update_time > "2026-13-01T00:00:00Z"',
    'update_time > "2026-01-01T00:00:00+24:00"',
    'update_time = "2026-01-01T00:00:00Z"',
    'update_time > 5',
    'workspace_root = "relative"',
    'workspace_root > "/a"',
    'labels.a : "x"',
    'labels. = "x"',
    'plan_id = "x"',
    '(' * 5000,
])
def test_bad_list_plans_filters_are_invalid_filter(checkpoint_stub, filter_text):
    expect(INVALID, "INVALID_FILTER", checkpoint_stub.ListPlans, pb.ListPlansRequest(filter=filter_text))


def test_label_values_with_quotes_backslashes_json_and_unicode_match_exactly(checkpoint_stub):
    key = _label_key()
    values = ['a"b\\c', "\u00e9\U0001F600", "1", "true", "null", "", "[1]", '{"a":1}', " x ", "%", "_", "*"]
    plans = {value: str(ULID()) for value in values}
    for value, plan in plans.items():
        _create(checkpoint_stub, plan, labels={key: value})
        _create(checkpoint_stub, plan, labels={key: value + "-other"})
    for value, plan in plans.items():
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        found = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan,
                                                                          filter=f'labels.{key} = "{escaped}"'))
        assert [c.labels[key] for c in found.checkpoints] == [value]
        listed = checkpoint_stub.ListPlans(pb.ListPlansRequest(filter=f'labels.{key} = "{escaped}"', page_size=1000))
        assert [p.plan_id for p in listed.plans] == [plan]


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_list_plans_time_filter_at_the_calendars_edge_is_not_internal(checkpoint_stub, moment):
    error = _error(checkpoint_stub.ListPlans, pb.ListPlansRequest(filter=f'update_time > "{moment}"'))
    assert error.code() != grpc.StatusCode.INTERNAL, error.details()
    assert (error.code(), error_info(error).reason) == (INVALID, "INVALID_FILTER")


def test_list_plans_time_filters_work_at_the_calendars_edge_without_an_offset(checkpoint_stub, plan_id):
    _create(checkpoint_stub, plan_id)
    found = checkpoint_stub.ListPlans(pb.ListPlansRequest(
        filter='update_time > "0001-01-01T00:00:00Z" AND update_time < "9999-12-31T23:59:59Z"', page_size=1000))
    assert plan_id in {p.plan_id for p in found.plans} or found.next_page_token


def test_health_and_other_plans_answer_while_nasty_filters_are_evaluated(checkpoint_stub, channel, plan_id):
    _create(checkpoint_stub, plan_id)
    nasty = ['source_tool = "' + "\\" * 2000 + '"x',
             " AND ".join(['labels.a = "' + "\\\"" * 50 + '"'] * 16),
             'source_tool = "' + "\\a" * 1000 + '"']
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            for filter_text in nasty:
                try:
                    checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, filter=filter_text),
                                                    timeout=10)
                except grpc.RpcError as error:
                    assert error.code() == INVALID, error.details()

    health = health_pb2_grpc.HealthStub(channel)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        running = [pool.submit(hammer) for _ in range(8)]
        try:
            for _ in range(20):
                started = time.monotonic()
                assert health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                    health_pb2.HealthCheckResponse.SERVING
                checkpoint_stub.GetPlan(pb.GetPlanRequest(plan_id=plan_id), timeout=1)
                assert time.monotonic() - started < 1
                time.sleep(0.05)
        finally:
            stop.set()
        for future in running:
            future.result()


# ============================================================================================
# 4. Error model (AIP-193)
# ============================================================================================

@pytest.fixture
def first(checkpoint_stub, workspace, plan_id) -> pb.Checkpoint:
    (workspace / "f.txt").write_text("x")
    return _create(checkpoint_stub, plan_id, workspace_root=str(workspace))


def test_bad_rollback_requests_get_their_reason_and_change_nothing(checkpoint_stub, workspace, plan_id, first):
    other_plan = str(ULID())
    foreign = _create(checkpoint_stub, other_plan)
    (workspace / "f.txt").write_text("changed")
    before = tree_state(workspace)
    cases = [
        ({"checkpoint_id": first.checkpoint_id, "scope": 99}, INVALID, "UNKNOWN_ENUM_VALUE"),
        ({"checkpoint_id": first.checkpoint_id, "scope": -1}, INVALID, "UNKNOWN_ENUM_VALUE"),
        ({"checkpoint_id": ""}, INVALID, "MISSING_FIELD"),
        ({"checkpoint_id": "x" * 26}, INVALID, "INVALID_CHECKPOINT_ID"),
        ({"checkpoint_id": "8" + "0" * 25}, INVALID, "INVALID_CHECKPOINT_ID"),
        ({"checkpoint_id": "0" * 10_000}, INVALID, "INVALID_CHECKPOINT_ID"),
        ({"checkpoint_id": str(ULID())}, NOT_FOUND, "CHECKPOINT_NOT_FOUND"),
        ({"checkpoint_id": foreign.checkpoint_id}, FAILED, "CHECKPOINT_PLAN_MISMATCH"),
        ({"checkpoint_id": first.checkpoint_id, "paths": ["../etc"]}, INVALID, "INVALID_PATH"),
        ({"checkpoint_id": first.checkpoint_id, "paths": ["/abs"]}, INVALID, "INVALID_PATH"),
        ({"checkpoint_id": first.checkpoint_id, "paths": ["a\x00b"]}, INVALID, "INVALID_PATH"),
        ({"checkpoint_id": first.checkpoint_id, "paths": ["p"] * 1001}, INVALID, "FIELD_TOO_LONG"),
        ({"checkpoint_id": first.checkpoint_id, "current_state": b"s" * (16 * 1024 * 1024 + 1)}, INVALID,
         "FIELD_TOO_LONG"),
    ]
    for fields, code, reason in cases:
        expect(code, reason, checkpoint_stub.Rollback, pb.RollbackRequest(plan_id=plan_id, **fields))
    expect(INVALID, "MISSING_FIELD", checkpoint_stub.Rollback, pb.RollbackRequest(checkpoint_id=first.checkpoint_id))
    # The foreign checkpoint named with its own plan, but with another plan's id: still refused.
    expect(FAILED, "CHECKPOINT_PLAN_MISMATCH", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=str(ULID()), checkpoint_id=first.checkpoint_id, dry_run=True))
    assert tree_state(workspace) == before
    assert _ids(checkpoint_stub, plan_id) == [first.checkpoint_id]


def test_bad_workspace_roots_get_their_reason_and_record_no_plan(checkpoint_stub, checkpointd_server, plan_id):
    ws = checkpointd_server.new_workspace()
    (ws / "file").write_text("x")
    outside = Path(tempfile.mkdtemp(prefix="outside-"))
    try:
        cases = [
            ("relative/path", INVALID, "INVALID_WORKSPACE_ROOT"),
            (".", INVALID, "INVALID_WORKSPACE_ROOT"),
            (str(ws / "missing"), INVALID, "INVALID_WORKSPACE_ROOT"),
            (str(ws / "file"), INVALID, "INVALID_WORKSPACE_ROOT"),
            (str(ws) + "\x00/x", INVALID, "INVALID_WORKSPACE_ROOT"),
            (str(ws / ("n" * 300)), INVALID, "INVALID_WORKSPACE_ROOT"),
            (str(ws) + "/x" * 3000, INVALID, "INVALID_WORKSPACE_ROOT"),
            (str(outside), DENIED, "WORKSPACE_ROOT_NOT_ALLOWED"),
            (str(ws) + "/../../..", DENIED, "WORKSPACE_ROOT_NOT_ALLOWED"),
            ("/", DENIED, "WORKSPACE_ROOT_NOT_ALLOWED"),
        ]
        for root, code, reason in cases:
            expect(code, reason, checkpoint_stub.CreateCheckpoint,
                   pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=root))
    finally:
        outside.rmdir()
    expect(NOT_FOUND, "PLAN_NOT_FOUND", checkpoint_stub.GetPlan, pb.GetPlanRequest(plan_id=plan_id))


def test_state_of_exactly_the_limit_is_stored_and_one_byte_more_refused(checkpoint_stub, plan_id):
    limit = 16 * 1024 * 1024
    expect(INVALID, "FIELD_TOO_LONG", checkpoint_stub.CreateCheckpoint,
           pb.CreateCheckpointRequest(plan_id=plan_id, state=b"\x01" * (limit + 1)))
    expect(NOT_FOUND, "PLAN_NOT_FOUND", checkpoint_stub.GetPlan, pb.GetPlanRequest(plan_id=plan_id))
    made = _create(checkpoint_stub, plan_id, state=b"\x02" * limit)
    assert made.state_size_bytes == limit
    got = checkpoint_stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=made.checkpoint_id))
    assert got.checkpoint.state_size_bytes == limit and not got.checkpoint.state


@pytest.mark.parametrize("method, request_message, code, reason", [
    ("GetCheckpoint", pb.GetCheckpointRequest(checkpoint_id=""), INVALID, "MISSING_FIELD"),
    ("GetCheckpoint", pb.GetCheckpointRequest(checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FAV", view=99), INVALID,
     "UNKNOWN_ENUM_VALUE"),
    ("GetCheckpoint", pb.GetCheckpointRequest(checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FA\u00e9"), INVALID,
     "INVALID_CHECKPOINT_ID"),
    ("DeleteCheckpoint", pb.DeleteCheckpointRequest(checkpoint_id=" "), INVALID, "INVALID_CHECKPOINT_ID"),
    ("DeleteCheckpoint", pb.DeleteCheckpointRequest(checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FAV"), NOT_FOUND,
     "CHECKPOINT_NOT_FOUND"),
    ("ListCheckpoints", pb.ListCheckpointsRequest(plan_id=""), INVALID, "MISSING_FIELD"),
    ("ListCheckpoints", pb.ListCheckpointsRequest(plan_id="z" * 26), INVALID, "INVALID_PLAN_ID"),
    ("DeleteCheckpoints", pb.DeleteCheckpointsRequest(plan_id="nope", filter='source_tool = "x"'), INVALID,
     "INVALID_PLAN_ID"),
    ("GetPlan", pb.GetPlanRequest(plan_id=""), INVALID, "MISSING_FIELD"),
    ("DiffCheckpoints", pb.DiffCheckpointsRequest(base_checkpoint_id=""), INVALID, "MISSING_FIELD"),
    ("DiffCheckpoints", pb.DiffCheckpointsRequest(base_checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FAV",
                                                  target_checkpoint_id="bad"), INVALID, "INVALID_CHECKPOINT_ID"),
    ("PutPendingWrites", pb.PutPendingWritesRequest(checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FAV"), INVALID,
     "MISSING_FIELD"),
    ("PutPendingWrites", pb.PutPendingWritesRequest(checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FAV", writes=[
        pb.PendingWrite(task_id="t", channel="c")]), NOT_FOUND, "CHECKPOINT_NOT_FOUND"),
    ("ListPendingWrites", pb.ListPendingWritesRequest(checkpoint_id=""), INVALID, "MISSING_FIELD"),
    ("ListCheckpointFiles", pb.ListCheckpointFilesRequest(checkpoint_id="01ARZ3NDEKTSV4RRFFQ69G5FAV",
                                                          path="../x"), INVALID, "INVALID_PATH"),
])
def test_bad_input_everywhere_gets_a_reason_never_internal(checkpoint_stub, method, request_message, code, reason):
    expect(code, reason, getattr(checkpoint_stub, method), request_message)


def test_streams_refuse_bad_input_before_the_first_message(checkpoint_stub, first):
    for call, request, code, reason in (
            (checkpoint_stub.ReadCheckpointFile, pb.ReadCheckpointFileRequest(checkpoint_id="", path="f.txt"),
             INVALID, "MISSING_FIELD"),
            (checkpoint_stub.ReadCheckpointFile, pb.ReadCheckpointFileRequest(
                checkpoint_id=first.checkpoint_id, path="../../etc/passwd"), INVALID, "INVALID_PATH"),
            (checkpoint_stub.ReadCheckpointFile, pb.ReadCheckpointFileRequest(
                checkpoint_id=first.checkpoint_id, path="nope"), NOT_FOUND, "PATH_NOT_FOUND"),
            (checkpoint_stub.ReadCheckpointFile, pb.ReadCheckpointFileRequest(
                checkpoint_id=first.checkpoint_id, raw_path=b"\xff/../x"), INVALID, "INVALID_PATH"),
            (checkpoint_stub.ExportCheckpoint, pb.ExportCheckpointRequest(checkpoint_id="bad"), INVALID,
             "INVALID_CHECKPOINT_ID")):
        with pytest.raises(grpc.RpcError) as caught:
            list(call(request))
        assert (caught.value.code(), error_info(caught.value).reason) == (code, reason), caught.value.details()


@pytest.mark.parametrize("method", ["CreateCheckpoint", "GetPlan", "ListCheckpoints", "DeleteCheckpoints",
                                    "Rollback"])
def test_undecodable_request_bytes_are_malformed_request(channel, method):
    # Field 1 (a string in every one of these requests) holding bytes that are not UTF-8.
    call = channel.unary_unary(f"/checkpoint.v1.CheckpointService/{method}")
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\x0a\x02\xff\xfe", timeout=10)
    assert (caught.value.code(), error_info(caught.value).reason) == (INVALID, "MALFORMED_REQUEST")


def test_a_checkpoint_of_another_plan_in_a_diff_is_plan_mismatch(checkpoint_stub, first):
    other = _create(checkpoint_stub, str(ULID()))
    expect(FAILED, "CHECKPOINT_PLAN_MISMATCH", checkpoint_stub.DiffCheckpoints,
           pb.DiffCheckpointsRequest(base_checkpoint_id=first.checkpoint_id, target_checkpoint_id=other.checkpoint_id))


# ============================================================================================
# 5. Bounded work: one plan's callers cannot take what other plans need
# ============================================================================================

def _other_plans_under_a_stuck_plan(server: RunningServer, make_waiter) -> None:
    """Hangs one plan's capture (holding its lock), sends 40 calls made by ``make_waiter(stub,
    plan_id)`` that need that plan, then asks for a checkpoint of another plan within 5 s."""
    faults = server.base / "faults"
    faults.mkdir()
    start_with_faults(server, CHECKPOINTD_PAUSE_AT="create.captured:2", CHECKPOINTD_FAULT_DIR=str(faults))
    busy_plan, other_plan = str(ULID()), str(ULID())
    busy_ws, other_ws = server.new_workspace(), server.new_workspace()
    (busy_ws / "f").write_text("x")
    (other_ws / "f").write_text("y")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        first = _create(stub, busy_plan, workspace_root=str(busy_ws))
        stuck = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=busy_plan), timeout=120)
        waiting = []
        try:
            _wait_for(faults / "paused.create.captured")  # busy_plan's capture hangs, holding its lock
            waiting = [make_waiter(stub, busy_plan, first.checkpoint_id) for _ in range(40)]
            time.sleep(1.0)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                health_pb2.HealthCheckResponse.SERVING
            made = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=other_plan,
                                                                    workspace_root=str(other_ws)), timeout=5)
            assert made.checkpoint.plan_id == other_plan
        finally:
            (faults / "resume.create.captured").touch()
            stuck.exception()
            for future in waiting:
                future.exception()


def test_single_deletes_for_a_busy_plan_do_not_stall_other_plans(idle_server):
    # The control: DeleteCheckpoint waits for the busy plan on the event loop (PlanLocks.run).
    _other_plans_under_a_stuck_plan(idle_server, lambda stub, plan_id, checkpoint_id: stub.DeleteCheckpoint.future(
        pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=120))


def test_bulk_deletes_for_a_busy_plan_do_not_stall_other_plans(idle_server):
    _other_plans_under_a_stuck_plan(idle_server, lambda stub, plan_id, checkpoint_id: stub.DeleteCheckpoints.future(
        pb.DeleteCheckpointsRequest(plan_id=plan_id), timeout=120))


# --------------------------------------------------------------------------------------------
# ConfigService: closed vocabularies at the edge
# --------------------------------------------------------------------------------------------

MAX_FILE = "core.snapshot.max_file_size_bytes"


def _number(value: float) -> struct_pb2.Value:
    return struct_pb2.Value(number_value=value)


@pytest.mark.parametrize("request_message, reason", [
    (cfg.SetConfigRequest(key="nope", value=_number(1)), "UNKNOWN_CONFIG_KEY"),
    (cfg.SetConfigRequest(key="nope", clear=True), "UNKNOWN_CONFIG_KEY"),
    (cfg.SetConfigRequest(key="", value=_number(1)), "UNKNOWN_CONFIG_KEY"),
    (cfg.SetConfigRequest(key=MAX_FILE, value=_number(float("nan"))), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key=MAX_FILE, value=_number(float("inf"))), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key=MAX_FILE, value=_number(1e300)), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key=MAX_FILE, value=_number(5.5)), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key=MAX_FILE, value=_number(-1)), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key=MAX_FILE, value=struct_pb2.Value(bool_value=True)),
     "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key=MAX_FILE), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key="core.checkpoints.auto_create_on", value=struct_pb2.Value(string_value="on_error")),
     "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key="core.checkpoints.auto_create_on", value=struct_pb2.Value(
        list_value=struct_pb2.ListValue(values=[struct_pb2.Value(string_value="ON_ERROR")]))), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key="core.checkpoints.auto_create_on", value=struct_pb2.Value(
        list_value=struct_pb2.ListValue(values=[struct_pb2.Value(string_value="manual")]))), "INVALID_CONFIG_VALUE"),
    (cfg.SetConfigRequest(key="core.checkpoints.auto_create_on", plan_id="bad", value=_number(1)), "INVALID_PLAN_ID"),
    (cfg.SetConfigRequest(key="core.snapshot.ignore_patterns", value=struct_pb2.Value(list_value=struct_pb2.ListValue(
        values=[struct_pb2.Value(string_value="(" * 5000)]))), "INVALID_CONFIG_VALUE"),
])
def test_bad_config_writes_get_their_reason_and_change_nothing(config_stub, request_message, reason):
    key = request_message.key
    before = config_stub.ListConfig(cfg.ListConfigRequest())
    expect(INVALID, reason, config_stub.SetConfig, request_message)
    assert config_stub.ListConfig(cfg.ListConfigRequest()) == before, key


def test_bad_config_reads_and_watches_get_their_reason(config_stub):
    expect(INVALID, "UNKNOWN_CONFIG_KEY", config_stub.GetConfig, cfg.GetConfigRequest(key=""))
    expect(INVALID, "UNKNOWN_CONFIG_KEY", config_stub.GetConfig, cfg.GetConfigRequest(key="x" * 100_000))
    expect(INVALID, "INVALID_PLAN_ID", config_stub.ListConfig, cfg.ListConfigRequest(plan_id="x"))
    with pytest.raises(grpc.RpcError) as caught:
        list(config_stub.WatchConfig(cfg.WatchConfigRequest(keys=["core.snapshot.ignore_patterns", "nope"]),
                                     timeout=5))
    assert (caught.value.code(), error_info(caught.value).reason) == (INVALID, "UNKNOWN_CONFIG_KEY")


@pytest.mark.parametrize("fields", [dict(description="a\0b"), dict(source_tool="t\0"), dict(labels={"k": "a\0b"})])
def test_a_nul_character_in_a_create_is_invalid_character_on_every_database(checkpoint_stub, fields):
    """PostgreSQL cannot store a NUL in text (it answered INTERNAL there); SQLite could: refused on both."""
    plan = str(ULID())
    expect(INVALID, "INVALID_CHARACTER", checkpoint_stub.CreateCheckpoint,
           pb.CreateCheckpointRequest(plan_id=plan, **fields))
    expect(grpc.StatusCode.NOT_FOUND, "PLAN_NOT_FOUND", checkpoint_stub.GetPlan, pb.GetPlanRequest(plan_id=plan))


@pytest.mark.parametrize("filter_text", ['labels.k = "a\0"', 'source_tool = "\0"'])
def test_a_nul_character_in_a_filter_is_invalid_filter_on_every_database(checkpoint_stub, plan_id, filter_text):
    _create(checkpoint_stub, plan_id)
    for call, request in ((checkpoint_stub.ListCheckpoints, pb.ListCheckpointsRequest(plan_id=plan_id,
                                                                                       filter=filter_text)),
                          (checkpoint_stub.DeleteCheckpoints, pb.DeleteCheckpointsRequest(filter=filter_text)),
                          (checkpoint_stub.ListPlans, pb.ListPlansRequest(filter=filter_text.replace(
                              "source_tool", "labels.t")))):
        expect(INVALID, "INVALID_FILTER", call, request)
    assert len(_ids(checkpoint_stub, plan_id)) == 1
