"""What a newcomer is told when they get a detail wrong: a target written as a URL or a bare path,
a thread id reused with another directory, a checkpointd that is not running. Each message says
what to do, on a real server and real channels."""

from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path

import grpc
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from ulid import ULID

from checkpointd_client import (
    CheckpointClient,
    Checkpointd,
    CheckpointdRpcError,
    CheckpointSettings,
    CheckpointUnavailableError,
    FixedSettings,
    OnUnavailable,
    ToolCall,
    ToolCheckpointInterceptor,
    TriggerPolicy,
    open_channel,
    targets,
)
from checkpointd_client.client import validate_target
from checkpointd_client.langgraph import CheckpointdSaver
from checkpointd_client.langgraph.records import thread_plan_id
from tests.conftest import CHECKPOINTD, free_port

DROP_THE_SCHEME = "drop the scheme: use HOST:PORT or unix:///path"

# -- targets written as URLs or paths -------------------------------------------------------------


@pytest.mark.parametrize("target", ["http://127.0.0.1:50051", "https://localhost:50051", "grpc://localhost:50051",
                                    "localhost/checkpointd:50051", "http:/127.0.0.1:50051"])
def test_a_target_written_as_a_url_is_refused_saying_drop_the_scheme(target: str) -> None:
    with pytest.raises(ValueError, match=DROP_THE_SCHEME) as refused:
        open_channel(target)
    assert repr(target) in str(refused.value)


def test_a_url_target_is_refused_with_the_host_and_port_to_write() -> None:
    with pytest.raises(ValueError, match=r"\(here: 127\.0\.0\.1:50051\)"):
        validate_target("http://127.0.0.1:50051/")


def test_a_bare_socket_path_is_refused_with_its_unix_target() -> None:
    with pytest.raises(ValueError, match="unix:///abs/x.sock"):
        validate_target("/abs/x.sock")


@pytest.mark.parametrize("target", ["unix-abstract:checkpointd", "ipv6:[::1]:50051", "dns:///localhost:50051",
                                    "dns://8.8.8.8/localhost:50051", "ipv4:127.0.0.1:50051,127.0.0.2:50051",
                                    "[::1]:50051", "localhost:50051", "unix:///run/checkpointd/checkpointd.sock",
                                    "unix:/run/checkpointd.sock"])
def test_target_forms_grpc_resolves_itself_are_accepted(target: str) -> None:
    assert validate_target(target) == target


@pytest.mark.parametrize("form", ["dns:///127.0.0.1:{port}", "dns:127.0.0.1:{port}", "ipv4:127.0.0.1:{port}",
                                  "127.0.0.1:{port}"])
def test_grpc_target_forms_reach_the_real_server(checkpointd_server, form: str) -> None:
    port = checkpointd_server.tcp_target.rpartition(":")[2]
    with open_channel(form.format(port=port)) as channel:
        CheckpointClient(channel).list_plans()  # answered


def test_the_cli_refuses_a_url_target_in_one_line_saying_what_to_write() -> None:
    finished = subprocess.run([CHECKPOINTD, "plans", "--target", "http://127.0.0.1:50051"],
                              capture_output=True, text=True, timeout=60)
    assert finished.returncode != 0
    assert DROP_THE_SCHEME in finished.stderr, finished.stderr
    assert "Misformatted" not in finished.stderr and "UNAVAILABLE" not in finished.stderr


# -- a plan (or LangGraph thread) reused with another directory -----------------------------------


def test_a_plan_reused_with_another_workspace_root_says_what_to_do(checkpointd_server) -> None:
    first, second = checkpointd_server.new_workspace(), checkpointd_server.new_workspace()
    plan_id = str(ULID())
    with open_channel(checkpointd_server.tcp_target) as channel:
        client = CheckpointClient(channel)
        client.create_checkpoint(plan_id, workspace_root=str(first))
        with pytest.raises(CheckpointdRpcError) as refused:
            client.create_checkpoint(plan_id, workspace_root=str(second))
    error = refused.value
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_ROOT_MISMATCH")
    assert error.metadata == {"workspace_root": str(second), "plan_workspace_root": str(first)}
    assert f"plan {plan_id} already has workspace_root {str(first)!r}" in error.message
    assert "leave workspace_root out" in error.message
    assert "new plan id" in error.message and "checkpointd new-plan-id" in error.message


def test_a_langgraph_thread_reused_with_another_workspace_root_names_the_thread(checkpointd_server) -> None:
    first, second = checkpointd_server.new_workspace(), checkpointd_server.new_workspace()
    thread_id = f"thread-{uuid.uuid4()}"
    metadata = {"source": "loop", "step": 0}
    with CheckpointdSaver(checkpointd_server.tcp_target) as saver:
        saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "workspace_root": str(first)}},
                  empty_checkpoint(), metadata, {})
        with pytest.raises(CheckpointdRpcError) as refused:
            saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                        "workspace_root": str(second)}}, empty_checkpoint(), metadata, {})
    error = refused.value
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_ROOT_MISMATCH")
    assert error.metadata == {"workspace_root": str(second), "plan_workspace_root": str(first)}
    assert f"LangGraph thread {thread_id!r}" in str(error) and str(first) in str(error)
    assert "new thread_id" in str(error)
    cause = error.__cause__
    assert isinstance(cause, CheckpointdRpcError) and thread_plan_id(thread_id) in cause.message


# -- a checkpointd that is not running ------------------------------------------------------------


def test_an_unreachable_target_says_is_checkpointd_running_and_how_to_start_it() -> None:
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    with open_channel(target) as channel, pytest.raises(CheckpointdRpcError) as failed:
        CheckpointClient(channel, deadline_s=10).list_plans()
    error = failed.value
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == ""
    text = str(error)
    assert f"checkpointd is not reachable at {target}" in text and "is it running?" in text
    assert "checkpointd serve" in text and "CHECKPOINTD_TARGET" in text
    assert error.message and error.message in text  # gRPC's own words stay, after the hint's lead


def test_a_refused_write_tool_says_checkpointd_is_not_reachable_and_where(tmp_path: Path) -> None:
    """on_unavailable "refuse": the refusal says where checkpointd was looked for, not only gRPC's words."""
    target = f"127.0.0.1:{free_port()}"
    settings = CheckpointSettings(on_unavailable=OnUnavailable.REFUSE, client_deadline_s=10)
    with open_channel(target) as channel:
        interceptor = ToolCheckpointInterceptor(CheckpointClient(channel), TriggerPolicy(FixedSettings(settings)))
        with pytest.raises(CheckpointUnavailableError) as refused:
            interceptor.begin(ToolCall(tool_name="write_file", plan_id=str(ULID()), workspace_root=tmp_path))
    text = str(refused.value)
    assert "on_unavailable is 'refuse'" in text
    assert f"checkpointd is not reachable at {target}" in text and "checkpointd serve" in text


def test_the_hint_says_the_target_came_from_checkpointd_target(monkeypatch) -> None:
    target = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("CHECKPOINTD_TARGET", target)
    with Checkpointd(watch_config=False, deadline_s=10) as connection, pytest.raises(CheckpointdRpcError) as failed:
        connection.checkpoints.list_plans()
    assert f"checkpointd is not reachable at {target} (from CHECKPOINTD_TARGET)" in str(failed.value)


def test_the_hint_says_the_target_is_the_default_socket(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CHECKPOINTD_TARGET", raising=False)
    monkeypatch.setenv("CHECKPOINTD_DATA_DIR", str(tmp_path))
    stale = tmp_path / "checkpointd.sock"
    with socket.socket(socket.AF_UNIX) as left_behind:  # a server that died left its socket file
        left_behind.bind(str(stale))
    with Checkpointd(watch_config=False, deadline_s=10) as connection, pytest.raises(CheckpointdRpcError) as failed:
        connection.config.list_config()
    assert (f"checkpointd is not reachable at unix://{stale} (the default: the socket `checkpointd serve` "
            f"makes in its data directory {tmp_path})") in str(failed.value)


def test_the_hint_says_when_the_target_is_the_tcp_default(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CHECKPOINTD_TARGET", raising=False)
    monkeypatch.setenv("CHECKPOINTD_DATA_DIR", str(tmp_path))
    assert targets.target_origin(targets.DEFAULT_TCP) == (
        f"the default: CHECKPOINTD_TARGET is unset and there is no socket at {tmp_path / 'checkpointd.sock'}")
    assert targets.target_origin("10.0.0.1:50051") == ""


def test_a_refusal_from_checkpointd_gets_no_unreachable_hint(checkpointd_server) -> None:
    with open_channel(checkpointd_server.tcp_target) as channel, pytest.raises(CheckpointdRpcError) as refused:
        CheckpointClient(channel).get_checkpoint("not-an-id")
    assert refused.value.reason == "INVALID_CHECKPOINT_ID" and "is it running" not in str(refused.value)
