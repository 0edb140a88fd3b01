"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance) against
CheckpointdSaver on a real server: every base and extended capability, nothing skipped."""

from __future__ import annotations

import asyncio

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from checkpointd_client.langgraph import CheckpointdSaver


def test_conformance_level_is_full_with_nothing_skipped(checkpointd_server, capsys) -> None:
    @checkpointer_test(name="CheckpointdSaver")
    async def saver():
        with CheckpointdSaver(checkpointd_server.tcp_target) as connected:
            yield connected

    failures: list[str] = []

    def on_result(capability: str, test: str, passed: bool, error: str | None) -> None:
        if not passed:
            failures.append(f"{capability}/{test}:\n{error}")

    report = asyncio.run(validate(saver, progress=ProgressCallbacks(on_test_result=on_result)))
    with capsys.disabled():
        report.print_report()
    assert not failures, "\n".join(failures)
    assert {name for name, result in report.results.items() if result.detected} == {c.value for c in ALL_CAPABILITIES}
    assert all(result.passed and not result.tests_skipped for result in report.results.values()), report.results
    assert report.conformance_level() == "FULL"
