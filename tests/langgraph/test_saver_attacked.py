"""Adversarial tests of CheckpointdSaver (the LangGraph checkpointer backend).

They attack what a real graph can hand the saver and what the conformance suite leaves open:
large channel values and pending writes (the client channel's message limits), a task with more
writes than one PutPendingWrites takes (a fan-out of Sends), a checkpoint put again under the same
id (its pending writes and list()'s duplicates, judged against LangGraph's own InMemorySaver),
many threads putting to one thread id at once (the server's per-plan lock), two saver instances
on one thread, tricky metadata strings in server-side filters and delete_for_runs, list() with
before/limit across many checkpoints, and a server restart between calls.

Each test of a defect failed before it was mended (the same session that wrote them); the others
are attacks the saver withstood.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from checkpointd_client.langgraph import CheckpointdSaver

MB = 1024 * 1024


@pytest.fixture
def saver(checkpointd_server):
    with CheckpointdSaver(checkpointd_server.tcp_target) as connected:
        yield connected


def _checkpoint(**channel_values):
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = dict(channel_values)
    checkpoint["channel_versions"] = {name: 1 for name in channel_values}
    return checkpoint


def _put(saver, thread_id: str, checkpoint=None, ns: str = "", parent: str | None = None, **metadata):
    configurable = {"thread_id": thread_id, "checkpoint_ns": ns}
    if parent:
        configurable["checkpoint_id"] = parent
    return saver.put({"configurable": configurable}, checkpoint or empty_checkpoint(),
                     {"source": "loop", "step": 0, **metadata}, {})


class Results(TypedDict):
    results: Annotated[list[int], operator.add]


# -- sizes ----------------------------------------------------------------------------------


def test_a_checkpoint_with_a_5_mib_binary_channel_value_reads_back(saver) -> None:
    blob = bytes(range(256)) * (5 * MB // 256)  # non-UTF-8 bytes, 5 MiB
    thread_id = str(uuid.uuid4())
    stored = _put(saver, thread_id, _checkpoint(blob=blob))  # acknowledged
    found = saver.get_tuple(stored)
    assert found is not None and found.checkpoint["channel_values"]["blob"] == blob


def test_a_checkpoint_with_a_3_mib_binary_channel_value_reads_back(saver) -> None:
    """Large non-UTF-8 values round-trip exactly, with text beside them."""
    blob = bytes(range(255, -1, -1)) * (3 * MB // 256)
    stored = _put(saver, str(uuid.uuid4()), _checkpoint(blob=blob, text="é\x00✓"))
    found = saver.get_tuple(stored)
    assert found.checkpoint["channel_values"]["blob"] == blob


def test_a_checkpoint_over_the_servers_state_limit_is_refused_clearly(saver) -> None:
    """Over 16 MiB of state the put is refused with the server's reason (nothing half-stored)."""
    from checkpointd_client import CheckpointdRpcError

    thread_id = str(uuid.uuid4())
    with pytest.raises(CheckpointdRpcError) as refused:
        _put(saver, thread_id, _checkpoint(blob=b"\x00" * (17 * MB)))
    assert refused.value.reason == "FIELD_TOO_LONG"
    assert saver.get_tuple({"configurable": {"thread_id": thread_id}}) is None


def test_pending_writes_totalling_6_mib_read_back(saver) -> None:
    stored = _put(saver, str(uuid.uuid4()))
    value = b"\xfe" * (2 * MB)
    for task in ("task-a", "task-b", "task-c"):
        saver.put_writes(stored, [("messages", value)], task)  # each acknowledged
    found = saver.get_tuple(stored)
    assert [(task, channel) for task, channel, _ in found.pending_writes] == [
        ("task-a", "messages"), ("task-b", "messages"), ("task-c", "messages")]


def test_a_task_with_more_than_1000_writes_is_recorded(saver) -> None:
    writes = [("branch:to:worker", i) for i in range(1001)]
    reference = InMemorySaver()
    ref_stored = _put(reference, "t")
    reference.put_writes(ref_stored, writes, "fan-out")
    stored = _put(saver, str(uuid.uuid4()))
    saver.put_writes(stored, writes, "fan-out")
    assert len(saver.get_tuple(stored).pending_writes) == len(reference.get_tuple(ref_stored).pending_writes) == 1001


def test_a_long_thread_with_rich_run_metadata_stays_readable(saver) -> None:
    thread_id = str(uuid.uuid4())
    # LangGraph copies the run config's string "metadata" (and configurable) entries into every checkpoint.
    run_metadata = {f"user_field_{i:02d}": f"{i:02d}" + "v" * 240 for i in range(58)}
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}, "metadata": run_metadata}
    for step in range(300):
        saver.put(config, create_checkpoint(empty_checkpoint(), None, step), {"source": "loop", "step": step}, {})
    latest = saver.get_tuple({"configurable": {"thread_id": thread_id}})
    assert latest.metadata["step"] == 299 and latest.metadata["user_field_57"] == run_metadata["user_field_57"]


def test_a_graph_fanning_out_to_1001_sends_runs(saver) -> None:
    builder = StateGraph(Results)
    builder.add_node("worker", lambda state: {"results": [state["results"][0] * 2]})
    builder.add_conditional_edges(START, lambda state: [Send("worker", {"results": [i]}) for i in range(1001)],
                                  ["worker"])
    builder.add_edge("worker", END)
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    assert len(builder.compile(checkpointer=InMemorySaver()).invoke(
        {"results": []}, config, durability="sync")["results"]) == 1001  # LangGraph's own saver runs it
    out = builder.compile(checkpointer=saver).invoke({"results": []}, config, durability="sync")
    assert sorted(out["results"]) == [2 * i for i in range(1001)]


# -- the same checkpoint id put twice ---------------------------------------------------------


def _put_twice_with_writes_between(saver) -> tuple[dict, str]:
    thread_id = str(uuid.uuid4())
    checkpoint = create_checkpoint(empty_checkpoint(), None, 1)
    first = _put(saver, thread_id, checkpoint)
    saver.put_writes(first, [("a", "written after the first put")], "task-1")
    second = _put(saver, thread_id, checkpoint)  # e.g. a put retried after its answer was lost
    return second, thread_id


def test_reference_saver_keeps_writes_of_a_checkpoint_put_again() -> None:
    """What LangGraph's own InMemorySaver does: the writes and a single list entry stay."""
    reference = InMemorySaver()
    stored, thread_id = _put_twice_with_writes_between(reference)
    assert reference.get_tuple(stored).pending_writes == [("task-1", "a", "written after the first put")]
    assert len(list(reference.list({"configurable": {"thread_id": thread_id}}))) == 1


def test_writes_survive_a_second_put_of_the_same_checkpoint(saver) -> None:
    stored, _ = _put_twice_with_writes_between(saver)
    assert saver.get_tuple(stored).pending_writes == [("task-1", "a", "written after the first put")]


def test_a_checkpoint_put_twice_is_listed_once(saver) -> None:
    _, thread_id = _put_twice_with_writes_between(saver)
    listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list({"configurable": {"thread_id": thread_id}})]
    assert len(listed) == len(set(listed)) == 1


def test_copy_thread_retried_lists_each_checkpoint_once(saver) -> None:
    source, target = str(uuid.uuid4()), str(uuid.uuid4())
    first = _put(saver, source, create_checkpoint(empty_checkpoint(), None, 1))
    _put(saver, source, create_checkpoint(empty_checkpoint(), None, 2), parent=first["configurable"]["checkpoint_id"])
    saver.copy_thread(source, target)
    assert len(list(saver.list({"configurable": {"thread_id": target}}))) == 2
    saver.copy_thread(source, target)  # retried
    listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list({"configurable": {"thread_id": target}})]
    assert len(listed) == len(set(listed)) == 2


# -- concurrency ----------------------------------------------------------------------------


def test_many_threads_putting_to_one_thread_id_all_land(saver) -> None:
    """Subgraphs run in parallel put to one thread (a plan) in different namespaces at once: every
    acknowledged put is readable, each with its own writes."""
    thread_id = str(uuid.uuid4())
    barrier = threading.Barrier(24)

    def put_one(i: int):
        barrier.wait()
        stored = _put(saver, thread_id, _checkpoint(n=i), ns=f"sub_{i}:{uuid.uuid4()}")
        saver.put_writes(stored, [("n", i)], f"task-{i}")
        return stored

    with ThreadPoolExecutor(24) as pool:
        stored = list(pool.map(put_one, range(24)))
    for i, config in enumerate(stored):
        found = saver.get_tuple(config)
        assert found.checkpoint["channel_values"] == {"n": i}
        assert found.pending_writes == [(f"task-{i}", "n", i)]
    assert len(list(saver.list({"configurable": {"thread_id": thread_id}}))) == 24


def test_two_saver_instances_async_and_sync_on_one_thread(checkpointd_server) -> None:
    """A checkpoint put by one saver gets writes from another (which has no memory of it), through
    the async API, concurrently with more puts."""
    thread_id = str(uuid.uuid4())
    with CheckpointdSaver(checkpointd_server.tcp_target) as one, CheckpointdSaver(checkpointd_server.tcp_target) as two:
        parent = _put(one, thread_id)

        async def main() -> None:
            config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            await asyncio.gather(
                *(two.aput_writes(parent, [("x", i)], f"t{i}") for i in range(8)),
                *(two.aput({**config, "configurable": {**config["configurable"], "checkpoint_id":
                                                         parent["configurable"]["checkpoint_id"]}},
                           create_checkpoint(empty_checkpoint(), None, i + 1), {"step": i + 1}, {})
                  for i in range(4)))

        asyncio.run(main())
        found = one.get_tuple(parent)
        assert sorted(found.pending_writes) == [(f"t{i}", "x", i) for i in range(8)]
        assert len(list(one.list({"configurable": {"thread_id": thread_id}}))) == 5


# -- list -----------------------------------------------------------------------------------


def test_list_before_and_limit_across_more_than_a_page(saver) -> None:
    """More checkpoints than one ListCheckpoints page (page_size 1000 is not hit, but ordering,
    before and limit apply across all of them and across namespaces)."""
    thread_id = str(uuid.uuid4())
    ids = []
    parent = None
    for i in range(40):
        stored = _put(saver, thread_id, create_checkpoint(empty_checkpoint(), None, i), ns="" if i % 2 else "ns",
                      parent=parent, step=i)
        ids.append(stored["configurable"]["checkpoint_id"])
        parent = stored["configurable"]["checkpoint_id"]
    config = {"configurable": {"thread_id": thread_id}}
    newest_first = sorted(ids, reverse=True)
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)] == newest_first
    before = {"configurable": {"thread_id": thread_id, "checkpoint_id": newest_first[10]}}
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(config, before=before, limit=5)] == \
        newest_first[11:16]
    assert list(saver.list(config, limit=0)) == []
    assert [t.config["configurable"]["checkpoint_id"]
            for t in saver.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, limit=3)] == \
        [i for i in newest_first if ids.index(i) % 2][:3]


@pytest.mark.parametrize("value", ['quote " and \\ backslash', "new\nline", "tab\tand\x01control", "ümlaut ✓",
                                   "labels.x = \"y\" OR true", "*", ""])
def test_filters_and_delete_for_runs_with_tricky_strings_are_exact(saver, value: str) -> None:
    thread_id = str(uuid.uuid4())
    config = {"configurable": {"thread_id": thread_id}}
    mine = _put(saver, thread_id, create_checkpoint(empty_checkpoint(), None, 1), note=value, run_id=value or "r")
    other = _put(saver, thread_id, create_checkpoint(empty_checkpoint(), None, 2), note=value + "x", run_id="other")
    assert [t.config for t in saver.list(config, filter={"note": value})] == [mine]
    saver.delete_for_runs([value or "r"])
    assert [t.config for t in saver.list(config)] == [other]


# -- deletes and restarts ----------------------------------------------------------------------


def test_put_writes_after_delete_thread_fails_clearly(saver) -> None:
    """Writes for a checkpoint whose thread was deleted meanwhile get a clear error, never land on
    some other record."""
    from checkpointd_client import CheckpointdRpcError

    thread_id = str(uuid.uuid4())
    stored = _put(saver, thread_id)
    saver.delete_thread(thread_id)
    with pytest.raises(CheckpointdRpcError) as raised:
        saver.put_writes(stored, [("a", 1)], "t")
    assert raised.value.reason == "CHECKPOINT_NOT_FOUND"
    assert saver.get_tuple({"configurable": {"thread_id": thread_id}}) is None


def test_a_server_restart_between_calls_loses_nothing(fresh_server) -> None:
    thread_id = str(uuid.uuid4())
    with CheckpointdSaver(fresh_server.tcp_target) as saver:
        stored = _put(saver, thread_id, _checkpoint(v=b"\x00\xff"))
        saver.put_writes(stored, [("v", b"\x80")], "t")
        fresh_server.kill()
        fresh_server.start()
        found = saver.get_tuple(stored)
        assert found.checkpoint["channel_values"] == {"v": b"\x00\xff"}
        assert found.pending_writes == [("t", "v", b"\x80")]
        child = _put(saver, thread_id, create_checkpoint(empty_checkpoint(), None, 1),
                     parent=stored["configurable"]["checkpoint_id"])
        assert saver.get_tuple({"configurable": {"thread_id": thread_id}}).config == child


def test_a_rewind_over_many_long_paths_reports_success(checkpointd_server, workspace) -> None:
    """The reply of a rollback that removes 5,000 long paths (megabytes of change list) is read back.
    What it claims is that reply, not a speed: the call gets a deadline of minutes, not the client's
    default 5 s, which a rollback this size on PostgreSQL overran on a busy 2-core machine."""
    thread_id = str(uuid.uuid4())
    with CheckpointdSaver(checkpointd_server.tcp_target, workspace_root=workspace, deadline_s=120) as saver:
        empty = _put(saver, thread_id)
        deep = workspace / ("a" * 250) / ("b" * 250) / ("c" * 250)
        deep.mkdir(parents=True)
        for i in range(5000):
            (deep / (f"{i:05d}" + "f" * 240)).write_text("x")
        try:
            rewound = saver.rewind(empty)
        finally:
            assert not deep.exists(), "the rewind was not applied"
        assert rewound.safety_checkpoint.file_count == 5000
