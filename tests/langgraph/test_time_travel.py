"""A real LangGraph graph whose nodes write files, checkpointed by CheckpointdSaver with a
workspace: time travel rewinds the files with the state, and the graph re-runs from there."""

from __future__ import annotations

import asyncio
import operator
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from checkpointd_client import CheckpointClient
from checkpointd_client.langgraph import CheckpointdSaver, thread_plan_id


class Draft(TypedDict):
    steps: Annotated[list[str], operator.add]


def _graph(workspace: Path, saver: CheckpointdSaver, runs: list[str]):
    """outline writes outline.md; expand rewrites it and adds body.md; review adds a review and
    deletes the outline: each node changes the workspace in its own way."""

    def outline(state: Draft) -> Draft:
        runs.append("outline")
        (workspace / "outline.md").write_text("1. intro\n")
        return {"steps": ["outline"]}

    def expand(state: Draft) -> Draft:
        runs.append("expand")
        (workspace / "outline.md").write_text("1. intro\n2. body\n")
        (workspace / "body.md").write_text("the body\n")
        return {"steps": ["expand"]}

    def review(state: Draft) -> Draft:
        runs.append("review")
        (workspace / "review.md").write_text("looks good\n")
        (workspace / "outline.md").unlink()
        return {"steps": ["review"]}

    builder = StateGraph(Draft)
    builder.add_node("outline", outline)
    builder.add_node("expand", expand)
    builder.add_node("review", review)
    builder.add_edge(START, "outline")
    builder.add_edge("outline", "expand")
    builder.add_edge("expand", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


def _files(workspace: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(workspace.iterdir()) if p.is_file()}


@pytest.mark.parametrize("per_thread_root", [False, True], ids=["saver-root", "config-root"])
def test_rewind_restores_files_and_the_graph_resumes_from_there(checkpointd_server, workspace: Path,
                                                               per_thread_root: bool) -> None:
    runs: list[str] = []
    config = {"configurable": {"thread_id": f"draft {uuid.uuid4()} / any string"}}
    if per_thread_root:
        config["configurable"]["workspace_root"] = str(workspace)
    with CheckpointdSaver(checkpointd_server.tcp_target,
                          workspace_root=None if per_thread_root else workspace) as saver:
        graph = _graph(workspace, saver, runs)
        assert graph.invoke({"steps": []}, config, durability="sync") == {"steps": ["outline", "expand", "review"]}
        assert _files(workspace) == {"body.md": "the body\n", "review.md": "looks good\n"}

        history = list(graph.get_state_history(config))
        after_outline = next(s for s in history if s.next == ("expand",))
        assert after_outline.values == {"steps": ["outline"]}

        rewound = saver.rewind(after_outline.config)
        assert _files(workspace) == {"outline.md": "1. intro\n"}
        # The files the rewind replaced are in its safety checkpoint, not lost; LangGraph's
        # history does not see that checkpoint.
        assert rewound.safety_checkpoint.has_files and rewound.safety_checkpoint.file_count == 2
        assert len(list(graph.get_state_history(config))) == len(history)

        runs.clear()
        assert graph.invoke(None, after_outline.config, durability="sync") == {"steps": ["outline", "expand", "review"]}
        assert runs == ["expand", "review"]
        assert _files(workspace) == {"body.md": "the body\n", "review.md": "looks good\n"}

        # The async rewind goes back further: before the first node, no file at all.
        before_outline = next(s for s in history if s.next == ("outline",))
        asyncio.run(saver.arewind(before_outline.config))
        assert _files(workspace) == {}
        assert graph.get_state(before_outline.config).values == {"steps": []}

        # Every LangGraph checkpoint of the thread is a checkpointd checkpoint with the files.
        plan = CheckpointClient(saver._channel).list_checkpoints(thread_plan_id(config["configurable"]["thread_id"]),
                                                                filter_expr='labels.langgraph_record = "checkpoint"')
        assert plan and all(c.has_files for c in plan)


def test_rewind_of_a_thread_without_workspace_is_refused(checkpointd_server) -> None:
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    with CheckpointdSaver(checkpointd_server.tcp_target) as saver:
        graph = _graph(Path("/nonexistent"), saver, [])
        graph.update_state(config, {"steps": ["manual"]}, as_node="review")
        state = graph.get_state(config)
        with pytest.raises(ValueError, match="has no files"):
            saver.rewind(state.config)
        with pytest.raises(LookupError):
            saver.rewind({"configurable": {**state.config["configurable"], "checkpoint_id": "missing"}})


def test_a_run_with_a_workspace_and_async_durability_is_refused(checkpointd_server, workspace: Path) -> None:
    """With "async" durability the capture of a step's checkpoint races the next step's writes:
    refused, rather than recording files of the wrong step."""
    with CheckpointdSaver(checkpointd_server.tcp_target, workspace_root=workspace) as saver:
        graph = _graph(workspace, saver, [])
        with pytest.raises(ValueError, match="durability='sync'"):
            graph.invoke({"steps": []}, {"configurable": {"thread_id": str(uuid.uuid4())}})
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        assert graph.invoke({"steps": []}, config, durability="exit") == {"steps": ["outline", "expand", "review"]}
        assert len(list(graph.get_state_history(config))) == 1


@pytest.mark.parametrize("rewind_forks", [True, False])
def test_a_fork_with_update_state_rewinds_the_files_on_request(checkpointd_server, workspace: Path,
                                                               rewind_forks: bool) -> None:
    runs: list[str] = []
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    with CheckpointdSaver(checkpointd_server.tcp_target, workspace_root=workspace, rewind_forks=rewind_forks) as saver:
        graph = _graph(workspace, saver, runs)
        graph.invoke({"steps": []}, config, durability="sync")
        after_outline = next(s for s in graph.get_state_history(config) if s.next == ("expand",))
        final_files = _files(workspace)

        forked = graph.update_state(after_outline.config, {"steps": ["edited"]}, as_node="outline")
        if not rewind_forks:
            assert _files(workspace) == final_files
            return
        assert _files(workspace) == {"outline.md": "1. intro\n"}
        # The fork's own checkpoint holds those files: rewinding to it later brings them back.
        (workspace / "outline.md").write_text("changed after the fork\n")
        saver.rewind(forked)
        assert _files(workspace) == {"outline.md": "1. intro\n"}
        runs.clear()
        assert graph.invoke(None, forked, durability="sync") == {
            "steps": ["outline", "edited", "expand", "review"]}
        assert runs == ["expand", "review"]


def test_a_thread_without_workspace_runs_with_langgraphs_default_durability(checkpointd_server, tmp_path) -> None:
    """Under "async" durability a task's writes may be put while the checkpoint they follow is still
    being put: they wait for it, and the run's history is whole."""
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    with CheckpointdSaver(checkpointd_server.tcp_target) as saver:
        graph = _graph(tmp_path, saver, [])
        for _ in range(3):
            graph.invoke({"steps": []}, config)
        assert graph.get_state(config).values["steps"] == ["outline", "expand", "review"] * 3
        assert len(list(graph.get_state_history(config))) == 15
