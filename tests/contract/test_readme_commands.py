"""The README's "Debugging with grpcurl" walk-through and the Node examples (the README's
ToolRunner script and clients/node/README.md's), run as written in a checkout with a server started
as `make run` starts one (tests.readme_blocks): the default address is the only thing replaced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import skip_unless_ci
from tests.readme_blocks import readme_block

from . import readme_commands

REPO = Path(__file__).resolve().parents[2]
BUF = REPO / "clients" / "node" / "node_modules" / ".bin" / "buf"
RPCS = [
    "checkpoint.v1.CheckpointService/CreateCheckpoint",
    "checkpoint.v1.CheckpointService/GetCheckpoint",
    "checkpoint.v1.CheckpointService/ListCheckpoints",
    "checkpoint.v1.CheckpointService/DeleteCheckpoint",
    "checkpoint.v1.CheckpointService/DiffCheckpoints",
    "checkpoint.v1.CheckpointService/Rollback",
    "checkpoint.v1.ConfigService/GetConfig",
    "checkpoint.v1.ConfigService/ListConfig",
    "checkpoint.v1.ConfigService/SetConfig",
    "checkpoint.v1.ConfigService/WatchConfig",
    "checkpoint.v1.AdminService/CheckIntegrity",
    "grpc.health.v1.Health/Check",
]
#: Commands that fail on purpose: (substring of the command, grpcurl exit code, text the output shows).
#: grpcurl exits with 64 + the gRPC status code.
EXPECTED_FAILURES = [
    ("ConfigService/WatchConfig", 64 + 4, '"key": "core.checkpoints.auto_create_on"'),
    ("01ARZ3NDEKTSV4RRFFQ69G5FZZ", 64 + 5, '"reason":"CHECKPOINT_NOT_FOUND"'),
]


def require_node_modules() -> None:
    if not BUF.exists():
        skip_unless_ci(f"{BUF.parent.parent} missing: run `npm ci` in clients/node")


def run_node(checkout, script: str, name: str) -> subprocess.CompletedProcess:
    """Saves the example in the checkout's root and runs it there with node, as its README says."""
    (checkout.root / name).write_text(checkout.adapt(script), encoding="utf-8")
    return subprocess.run(["node", name], cwd=checkout.root, env=checkout.environment(), capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def walkthrough() -> list[str]:
    return readme_commands.commands(readme_block("README.md", "debugging"))


def test_walkthrough_calls_every_rpc_over_tcp_and_the_unix_socket(walkthrough):
    script = "\n".join(walkthrough)
    missing = [rpc for rpc in RPCS if rpc not in script]
    assert not missing, f"the README never calls {missing}"
    assert any(c.startswith("grpcurl ") and " -unix " in c for c in walkthrough)
    assert any(" list" in c for c in walkthrough) and any(" describe " in c for c in walkthrough)
    assert any("buf curl" in c and "--unix-socket" in c for c in walkthrough)
    for needle, _, _ in EXPECTED_FAILURES:
        assert any(needle in c for c in walkthrough), f"the README no longer runs {needle!r}"


def test_walkthrough_runs_verbatim(walkthrough, checkout):
    require_node_modules()
    results = readme_commands.run([checkout.adapt(c) for c in walkthrough], checkout.root, checkout.environment())

    for result in results:
        expected = next((e for e in EXPECTED_FAILURES if e[0] in result.command), None)
        report = f"$ {result.command}\n[exit {result.exit_code}]\n{result.output}"
        if expected:
            _, code, shows = expected
            assert result.exit_code == code, report
            assert shows in result.output, report
        else:
            assert result.exit_code == 0, report
            assert "ERROR:" not in result.output, report
    by_command = {r.command: r for r in results}
    restored = by_command["cat demo/grpcurl/notes.txt"].output.strip()
    assert restored == "first draft", "the rollback did not restore demo/grpcurl"
    filtered = next(r for r in results if "labels.step" in r.command)
    assert '"step": "draft"' in filtered.output, filtered.output
    assert not (checkout.root / "demo" / "grpcurl" / "scratch.txt").exists()
    over_the_socket = next(r for r in results if r.command.startswith("grpcurl -plaintext -unix $SOCK list"))
    assert "checkpoint.v1.CheckpointService" in over_the_socket.output, "SOCK is not make run's socket"


def test_node_tool_runner_example_runs_as_written(checkout):
    require_node_modules()
    result = run_node(checkout, readme_block("README.md", "node-tool-runner"), "try-checkpointd.js")
    report = f"[exit {result.returncode}]\n{result.stdout}{result.stderr}"
    assert result.returncode == 0, report
    lines = result.stdout.splitlines()
    assert lines[:4] == [
        "4 after_tool_execute local/write-file",
        "3 before_tool_execute local/write-file",
        "2 after_tool_execute local/write-file",
        "1 before_tool_execute local/write-file",
    ], report
    assert "notes.md: v1" in lines, report
    assert "NOT_FOUND CHECKPOINT_NOT_FOUND" in lines, report
    assert (checkout.root / "demo" / "node" / "notes.md").read_text() == "v1"
    again = run_node(checkout, readme_block("README.md", "node-tool-runner"), "try-checkpointd.js")
    assert again.returncode == 0 and again.stdout.splitlines()[:4] == lines[:4], "a second run is not a new plan"


def test_node_client_readme_example_runs_as_written(checkout):
    require_node_modules()
    result = run_node(checkout, readme_block("clients/node/README.md", "node-client"), "try-node-client.js")
    report = f"[exit {result.returncode}]\n{result.stdout}{result.stderr}"
    assert result.returncode == 0, report
    lines = result.stdout.splitlines()
    assert lines[0].startswith("draft checkpoints: [ '") and "notes.md: draft" in lines, report
    assert lines[-1] == "checkpoints: 4", report
    assert (checkout.root / "demo" / "node-client" / "notes.md").read_text() == "hi"
