"""What the conformance suite does not pin down: arbitrary thread ids and namespaces (longer than
a label value may be), exact metadata, and how repeated pending writes merge."""

from __future__ import annotations

import uuid

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.types import ERROR

from checkpointd_client.langgraph import CheckpointdSaver, thread_plan_id

LONG_NS = "|".join(f"subgraph_{i}:{uuid.uuid4()}" for i in range(8))  # ~400 characters


@pytest.fixture
def saver(checkpointd_server):
    with CheckpointdSaver(checkpointd_server.tcp_target) as connected:
        yield connected


def _put(saver: CheckpointdSaver, thread_id: str, ns: str = "", parent: str | None = None, **metadata):
    configurable = {"thread_id": thread_id, "checkpoint_ns": ns}
    if parent:
        configurable["checkpoint_id"] = parent
    return saver.put({"configurable": configurable}, empty_checkpoint(), {"source": "loop", "step": 0, **metadata}, {})


def test_plan_ids_are_ulids_derived_from_any_thread_id() -> None:
    for thread_id in ["1", "user@example.com/chat #7", "é" * 1000, ""]:
        plan_id = thread_plan_id(thread_id)
        assert len(plan_id) == 26 and plan_id[0] in "01234567" and plan_id == thread_plan_id(thread_id)
    assert thread_plan_id("a") != thread_plan_id("b")


def test_long_namespaces_unicode_threads_and_nested_metadata_round_trip(saver) -> None:
    thread_id = f"thread ✓ {uuid.uuid4()} " + "x" * 300
    metadata = {"parents": {"": "abc"}, "nested": {"list": [1, 2.5, None, "s"], "flag": True}, "run_id": "r" * 300}
    root = _put(saver, thread_id, "", **metadata)
    child = _put(saver, thread_id, LONG_NS, parent=None, step=3)
    grandchild = _put(saver, thread_id, LONG_NS, parent=child["configurable"]["checkpoint_id"], step=4)

    found = saver.get_tuple(root)
    assert found.metadata == {"source": "loop", "step": 0, **metadata}
    latest_child = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": LONG_NS}})
    assert latest_child.config == grandchild
    assert latest_child.parent_config == child
    assert [t.config for t in saver.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": LONG_NS}})] == [
        grandchild, child]
    # Without a namespace, list covers all of them, newest checkpoint id first.
    assert [t.config for t in saver.list({"configurable": {"thread_id": thread_id}})] == [grandchild, child, root]
    assert [t.config for t in saver.list({"configurable": {"thread_id": thread_id}}, filter={"step": 4})] == [
        grandchild]


def test_listing_without_a_thread_covers_every_thread_newest_first(saver) -> None:
    """As LangGraph's own savers do for ``list(None)``: every thread's checkpoints, newest
    checkpoint id first, each with its own thread id; filter, before and limit apply across them."""
    marker = str(uuid.uuid4())
    first = _put(saver, f"one {marker}", "", marker=marker)
    second = _put(saver, f"two {marker}", "", marker=marker, step=1)
    third = _put(saver, f"one {marker}", LONG_NS, marker=marker, step=2)
    _put(saver, f"three {marker}", "", marker="someone else's")
    listed = [t.config for t in saver.list(None, filter={"marker": marker})]
    assert listed == [third, second, first]
    assert [t.config for t in saver.list({"configurable": {}}, filter={"marker": marker, "step": 1})] == [second]
    assert [t.config for t in saver.list(None, filter={"marker": marker}, before=third, limit=1)] == [second]
    newest = {t.config["configurable"]["thread_id"] for t in saver.list(None, limit=4)}
    assert newest == {f"one {marker}", f"two {marker}", f"three {marker}"}


def test_repeated_writes_keep_the_first_regular_value_and_the_last_special_one(saver) -> None:
    stored = _put(saver, str(uuid.uuid4()), LONG_NS)
    saver.put_writes(stored, [("a", 1), ("b", 2), (ERROR, "first error")], "task-2", task_path="~b")
    saver.put_writes(stored, [("a", 10), ("b", 20), (ERROR, "last error")], "task-2", task_path="~b")
    saver.put_writes(stored, [("a", "from task 1")], "task-1", task_path="~a")
    assert saver.get_tuple(stored).pending_writes == [
        ("task-1", "a", "from task 1"), ("task-2", ERROR, "last error"), ("task-2", "a", 1), ("task-2", "b", 2)]


def test_prune_keeps_each_namespaces_latest_and_its_writes_only(saver) -> None:
    thread_id = str(uuid.uuid4())
    old = _put(saver, thread_id, LONG_NS)
    saver.put_writes(old, [("a", "old")], "t")
    new = _put(saver, thread_id, LONG_NS, parent=old["configurable"]["checkpoint_id"])
    saver.put_writes(new, [("a", "new")], "t")
    root = _put(saver, thread_id, "")
    saver.prune([thread_id])
    assert [t.config for t in saver.list({"configurable": {"thread_id": thread_id}})] == [root, new]
    assert saver.get_tuple(new).pending_writes == [("t", "a", "new")]
    # The pruned checkpoint's writes went with it: nothing else of the thread's holds them.
    remaining = saver.client.list_checkpoints(thread_plan_id(thread_id))
    assert sorted(len(saver.client.list_pending_writes(c.checkpoint_id)) for c in remaining) == [0, 1]


def test_metadata_filters_run_on_the_server_and_are_checked_exactly(saver) -> None:
    thread_id = str(uuid.uuid4())
    config = {"configurable": {"thread_id": thread_id}}
    as_int = _put(saver, thread_id, flag=1, name="a")
    as_text = _put(saver, thread_id, flag="1", name="b")
    as_bool = _put(saver, thread_id, flag=True, name="c")
    as_float = _put(saver, thread_id, flag=1.0, ratio=0.5, name="d", Upper="x", tags={"a": [1]})
    crowded = _put(saver, thread_id, flag=1, **{f"k{i}": i for i in range(70)})  # more than fit in labels

    def matches(**wanted) -> list:
        return [t.config for t in saver.list(config, filter=wanted)]

    assert matches(flag=1) == [crowded, as_float, as_int]
    assert matches(flag="1") == [as_text]
    assert matches(flag=True) == [as_bool]
    assert matches(ratio=0.5, Upper="x") == [as_float]
    assert matches(k69=69) == [crowded]
    assert matches(flag=1, name="a") == [as_int]
    assert matches(tags={"a": [1]}) == [as_float]
    assert matches(step=0) == [crowded, as_float, as_bool, as_text, as_int]
    assert saver.client.list_checkpoints(thread_plan_id(thread_id), filter_expr='labels.langgraph_md.flag = "i:1"')
