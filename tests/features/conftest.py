"""pytest-bdd wiring for the auto-trigger feature: tag markers and connections to the real server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checkpointd_client import Checkpointd

FEATURE_TAGS = {
    "checkpoint": "checkpoint feature scenarios",
    "auto_triggers": "automatic checkpoint trigger scenarios",
    "tdd_issue": "scenario tracked by an upstream issue",
    "tdd_issue_4236": "upstream issue 4236 (on_subplan_spawn)",
}


def pytest_configure(config: pytest.Config) -> None:
    for tag, description in FEATURE_TAGS.items():
        config.addinivalue_line("markers", f"{tag}: {description}")


@pytest.fixture
def tcp_checkpointd(checkpointd_server) -> Iterator[Checkpointd]:
    """The session server over TCP, for the tool runner scenarios."""
    with Checkpointd(checkpointd_server.tcp_target) as connection:
        yield connection


@pytest.fixture
def unix_checkpointd(checkpointd_server) -> Iterator[Checkpointd]:
    """The session server over its unix socket, for the sub-plan and executor scenarios."""
    with Checkpointd(checkpointd_server.unix_target) as connection:
        yield connection
