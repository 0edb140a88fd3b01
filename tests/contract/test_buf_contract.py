"""buf lint (STANDARD + comment rules) and buf breaking against the released contract snapshot.

buf comes from the npm package @bufbuild/buf, a devDependency of clients/node (`npm ci` there).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from tests.helpers import skip_unless_ci

REPO = pathlib.Path(__file__).resolve().parents[2]
PROTOS = REPO / "protos"
BUF = REPO / "clients" / "node" / "node_modules" / ".bin" / "buf"
RELEASED = PROTOS / "released" / "checkpoint-v1.binpb"
CHECKPOINT_PROTO = pathlib.Path("checkpoint") / "v1" / "checkpoint_service.proto"

if not BUF.exists():
    skip_unless_ci(f"buf is not installed ({BUF} missing): run `npm ci` in clients/node", allow_module_level=True)


def buf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUF), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def copy_of_protos(tmp_path: pathlib.Path) -> pathlib.Path:
    """The module's .proto files and buf.yaml only, so a test can change them freely."""
    module = tmp_path / "protos"
    for source in PROTOS.rglob("*.proto"):
        target = module / source.relative_to(PROTOS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    shutil.copy(PROTOS / "buf.yaml", module / "buf.yaml")
    return module


def edit(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}; update this test to the current contract"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_buf_lint_is_clean():
    result = buf("lint", "protos")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_lint_reports_a_violation(tmp_path):
    module = copy_of_protos(tmp_path)
    edit(module / CHECKPOINT_PROTO, "PHASE_UNSPECIFIED = 0;", "PHASE_NONE = 0;")
    result = buf("lint", str(module))
    assert result.returncode != 0
    assert "PHASE_NONE" in result.stdout


def test_buf_lint_requires_field_comments(tmp_path):
    module = copy_of_protos(tmp_path)
    edit(module / CHECKPOINT_PROTO, "  // Why it was taken.\n  Trigger trigger = 5;", "  Trigger trigger = 5;")
    result = buf("lint", str(module))
    assert result.returncode != 0
    assert "trigger" in result.stdout and "comment" in result.stdout


def test_released_snapshot_is_a_buf_image_of_the_contract():
    result = buf("build", str(RELEASED), "-o", "-#format=json")
    assert result.returncode == 0, result.stderr
    for name in ("checkpoint_service.proto", "config_service.proto", "errors.proto"):
        assert f'"checkpoint/v1/{name}"' in result.stdout


def test_no_breaking_change_since_the_released_contract():
    result = buf("breaking", "protos", "--against", str(RELEASED))
    assert result.returncode == 0, (
        "the contract breaks the released checkpoint.v1 snapshot:\n" + result.stdout + result.stderr
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("  string source_tool = 6;", "  string source_tool = 66;", "source_tool"),
        ("  int64 file_count = 12;", "  int32 file_count = 12;", "file_count"),
        ("  rpc DeleteCheckpoint(DeleteCheckpointRequest) returns (DeleteCheckpointResponse);\n", "", "Delete"),
        ("  PHASE_ON_ERROR = 4;", "  PHASE_ON_FAILURE = 4;", "PHASE_ON_ERROR"),
    ],
    ids=["renumbered-field", "retyped-field", "removed-rpc", "renamed-enum-value"],
)
def test_a_breaking_change_is_reported(tmp_path, old, new, expected):
    module = copy_of_protos(tmp_path)
    edit(module / CHECKPOINT_PROTO, old, new)
    result = buf("breaking", str(module), "--against", str(RELEASED))
    assert result.returncode != 0, "buf breaking accepted a breaking change"
    assert expected in result.stdout
