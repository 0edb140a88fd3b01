"""The README's "Debugging with grpcurl" walk-through and its Node example ("Other languages"),
run verbatim against a real server.

Only the two address lines (ADDR=, SOCK=) of the walk-through, and CHECKPOINTD_ADDR for the Node
example, point at the test's server; everything else runs as written, from a directory that looks
like the repository root (it links .venv and clients) and lies under the server's allowed
workspace root.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import skip_unless_ci

from . import readme_commands

REPO = Path(__file__).resolve().parents[2]
SECTION = "Debugging with grpcurl"
OTHER_LANGUAGES = "Other languages"
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


def readme_section(heading: str) -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    try:
        return readme_commands.section(readme, heading)
    except LookupError:
        pytest.fail(f"README.md lacks the '## {heading}' section (its text is in the issue 5 report)")


def looks_like_the_repository(server) -> Path:
    """A fresh directory under the server's allowed root, linking the repository's .venv and clients."""
    cwd = server.new_workspace()
    (cwd / ".venv").symlink_to(REPO / ".venv")
    (cwd / "clients").symlink_to(REPO / "clients")
    return cwd


def require_node_modules() -> None:
    if not BUF.exists():
        skip_unless_ci(f"{BUF.parent.parent} missing: run `npm ci` in clients/node")


@pytest.fixture(scope="module")
def walkthrough() -> list[str]:
    text = readme_section(SECTION)
    blocks = readme_commands.shell_blocks(text)
    assert blocks, f"the '{SECTION}' section has no ```sh block"
    return [command for block in blocks for command in readme_commands.commands(block)]


def test_walkthrough_calls_every_rpc_over_tcp_and_the_unix_socket(walkthrough):
    script = "\n".join(walkthrough)
    missing = [rpc for rpc in RPCS if rpc not in script]
    assert not missing, f"the README never calls {missing}"
    assert any(c.startswith("grpcurl ") and " -unix " in c for c in walkthrough)
    assert any(" list" in c for c in walkthrough) and any(" describe " in c for c in walkthrough)
    assert any("buf curl" in c and "--unix-socket" in c for c in walkthrough)
    for needle, _, _ in EXPECTED_FAILURES:
        assert any(needle in c for c in walkthrough), f"the README no longer runs {needle!r}"


def test_walkthrough_runs_verbatim(walkthrough, fresh_server):
    require_node_modules()
    cwd = looks_like_the_repository(fresh_server)

    results = readme_commands.run(
        walkthrough,
        cwd,
        {"ADDR": fresh_server.tcp_target, "SOCK": str(fresh_server.socket_path)},
    )

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
    assert not (cwd / "demo" / "grpcurl" / "scratch.txt").exists()


def test_node_example_runs_verbatim(fresh_server):
    require_node_modules()
    blocks = readme_commands.fenced_blocks(readme_section(OTHER_LANGUAGES), "js|javascript")
    assert len(blocks) == 1, f"expected one ```js example under '## {OTHER_LANGUAGES}', found {len(blocks)}"
    cwd = looks_like_the_repository(fresh_server)
    (cwd / "try-checkpointd.js").write_text(blocks[0], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    env["CHECKPOINTD_ADDR"] = fresh_server.tcp_target
    result = subprocess.run(
        ["node", "try-checkpointd.js"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
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
    assert (cwd / "demo" / "node" / "notes.md").read_text() == "v1"
