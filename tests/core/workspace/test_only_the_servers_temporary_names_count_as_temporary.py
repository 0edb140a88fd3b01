"""The server's temporary files have exactly the names ``Workspace._temp_name`` gives them: only
those are left out of captures, and a recovery removes only its own rollback's (by its tag). A
user's file whose name merely starts with the same prefix is the user's, captured and kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace, is_temp_name

TAG = "0123456789abcdef0123456789abcdef"
UUID = "fedcba9876543210fedcba9876543210"


@pytest.mark.parametrize("name", [f"{TEMP_PREFIX}{UUID}", f"{TEMP_PREFIX}{TAG}-{UUID}"])
def test_the_names_the_server_gives_are_temporary(name: str) -> None:
    assert is_temp_name(name)


@pytest.mark.parametrize("name", [
    f"{TEMP_PREFIX}notes.txt", f"{TEMP_PREFIX}{UUID}.bak", f"{TEMP_PREFIX}{TAG}-{UUID}-copy", f"x{TEMP_PREFIX}{UUID}",
    f"{TEMP_PREFIX}{UUID.upper()}", TEMP_PREFIX, "notes.txt",
])
def test_a_users_name_that_only_looks_alike_is_not(name: str) -> None:
    assert not is_temp_name(name)


def test_the_names_a_workspace_writes_under_are_temporary_and_carry_its_tag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    untagged, tagged = Workspace(str(tmp_path)), Workspace(str(tmp_path), TAG)
    assert is_temp_name(untagged._temp_name()) and not untagged._temp_name().startswith(f"{TEMP_PREFIX}{TAG}-")
    assert is_temp_name(tagged._temp_name()) and tagged._temp_name().startswith(f"{TEMP_PREFIX}{TAG}-")


def test_a_recovery_removes_only_the_temporary_files_of_its_own_rollback(tmp_path: Path) -> None:
    other = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    (tmp_path / "d").mkdir()
    for name in (f"{TEMP_PREFIX}{TAG}-{UUID}", f"{TEMP_PREFIX}{TAG}-{other}"):
        (tmp_path / "d" / name).write_text("left by a crashed write")
    kept = [f"{TEMP_PREFIX}{other}-{UUID}", f"{TEMP_PREFIX}{UUID}", "notes.txt"]
    for name in kept:
        (tmp_path / "d" / name).write_text("not this rollback's")

    workspace = Workspace(str(tmp_path))
    assert workspace.remove_temp_files("d", TAG) == 2
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == sorted(kept)
    assert workspace.remove_temp_files("d", TAG) == 0
    assert workspace.remove_temp_files("missing", TAG) == 0
