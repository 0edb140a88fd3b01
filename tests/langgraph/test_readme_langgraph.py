"""The README's "Use with LangGraph" block, run as written against a server started as `make run`
starts one: the graph runs, time-travels with its files and runs its last node again."""

from __future__ import annotations

from checkpointd_client import CheckpointClient, phase_name
from checkpointd_client.langgraph import thread_plan_id
from tests.readme_blocks import readme_block


def test_the_readme_langgraph_example_rewinds_files_and_state(checkout, monkeypatch) -> None:
    for variable, value in checkout.environment().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("CHECKPOINTD_TARGET", raising=False)
    monkeypatch.chdir(checkout.root)  # where a reader runs it: the checkout, make run's workspace root
    namespace: dict[str, object] = {}
    exec(compile(readme_block("README.md", "langgraph"), "README.md", "exec"), namespace)
    saver, graph, workspace = namespace["saver"], namespace["graph"], namespace["workspace"]
    try:
        assert workspace == checkout.root / "demo" / "langgraph"
        assert saver.target == checkout.unix_target, "CheckpointdSaver() did not find make run's socket"
        assert (workspace / "essay.md").read_text() == "# Polished\n"
        plan = CheckpointClient(saver._channel).list_checkpoints(thread_plan_id("essay 42"))
        safety = [c for c in plan if phase_name(c.phase) == "rollback_safety"]
        assert len(safety) == 1 and safety[0].file_count == 1
        # polish ran again from before_polish: the newest checkpoint is a finished run whose
        # ancestors include before_polish and not the first run's final checkpoint.
        config, before_polish = namespace["config"], namespace["before_polish"]
        history = list(graph.get_state_history(config))
        first_final = history[-1 - next(i for i, s in enumerate(reversed(history)) if not s.next)]
        newest = graph.get_state(config)
        assert newest.next == () and newest.values == {"topic": "Time travel"}
        assert newest.config["configurable"]["checkpoint_id"] != first_final.config["configurable"]["checkpoint_id"]
        ancestors, cursor = [], newest.parent_config
        while cursor is not None:
            ancestors.append(cursor["configurable"]["checkpoint_id"])
            cursor = graph.get_state(cursor).parent_config
        assert before_polish.config["configurable"]["checkpoint_id"] in ancestors
        assert first_final.config["configurable"]["checkpoint_id"] not in ancestors
    finally:
        saver.close()
