"""new_plan_id() makes ids the server takes; Checkpointd() with no target finds a local server
where `checkpointd serve` puts it by default, as the CLI does."""

from __future__ import annotations

import time

from ulid import ULID

from checkpointd_client import Checkpointd, CheckpointdRpcError, new_plan_id


def test_a_new_plan_id_is_a_ulid_of_now():
    before = time.time()
    ids = [new_plan_id() for _ in range(500)]
    after = time.time()
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = ULID.from_str(value)
        assert str(parsed) == value
        assert before - 0.001 <= parsed.timestamp <= after + 0.001
    time.sleep(0.002)
    assert max(ids) < new_plan_id(), "an id made later sorts after earlier ones"


def test_the_server_takes_a_new_plan_id_and_names_the_helper_when_it_refuses_one(checkpointd_server, workspace):
    with Checkpointd(checkpointd_server.tcp_target, watch_config=False) as client:
        plan_id = new_plan_id()
        created = client.checkpoints.create_checkpoint(plan_id, workspace_root=str(workspace))
        assert created.plan_id == plan_id
        try:
            client.checkpoints.list_checkpoints("01ARZ3NDEKTSV4RRFFQ69G5FAL")
        except CheckpointdRpcError as refused:
            assert refused.reason == "INVALID_PLAN_ID"
            assert "outside Crockford base32: 'L'" in refused.message and "new_plan_id()" in refused.message
        else:
            raise AssertionError("a plan id with an L was accepted")


def test_with_no_target_the_client_finds_the_default_socket_or_the_variable(checkpointd_server, monkeypatch):
    # The test server's socket lies where a server whose data dir is its base directory would put it.
    monkeypatch.delenv("CHECKPOINTD_TARGET", raising=False)
    monkeypatch.setenv("CHECKPOINTD_DATA_DIR", str(checkpointd_server.socket_path.parent))
    with Checkpointd(watch_config=False) as client:
        assert client.target == checkpointd_server.unix_target
        assert client.checkpoints.list_checkpoints(new_plan_id()) == []
    monkeypatch.setenv("CHECKPOINTD_TARGET", checkpointd_server.tcp_target)
    with Checkpointd(watch_config=False) as client:
        assert client.target == checkpointd_server.tcp_target
        assert client.checkpoints.list_checkpoints(new_plan_id()) == []
