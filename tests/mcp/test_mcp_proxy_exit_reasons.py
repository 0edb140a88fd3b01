"""How `checkpointd mcp-proxy` finds the reason it stops among the exceptions a shutdown raises."""

from __future__ import annotations

import anyio

from checkpointd.commands.mcp_proxy import _expected_failures, _leaf
from checkpointd_client.mcp_proxy.upstream import UpstreamSessionLost


def _raised_during_teardown(reason: BaseException) -> BaseException:
    """What the MCP SDK's HTTP transport raises when closed after the wrapped server forgot the
    session: a task group's BrokenResourceError, raised while `reason` propagated."""
    try:
        try:
            raise reason
        except UpstreamSessionLost:
            raise BaseExceptionGroup("unhandled errors in a TaskGroup", [anyio.BrokenResourceError()])  # noqa: B904
    except BaseExceptionGroup as teardown:
        return teardown


def test_the_reason_survives_a_teardown_error_raised_over_it() -> None:
    reason = UpstreamSessionLost("http://127.0.0.1:1/mcp")
    assert _leaf(_raised_during_teardown(reason), _expected_failures()) is reason


def test_an_unexpected_failure_with_no_reason_behind_it_is_not_hidden() -> None:
    assert _leaf(BaseExceptionGroup("x", [anyio.BrokenResourceError()]), _expected_failures()) is None
