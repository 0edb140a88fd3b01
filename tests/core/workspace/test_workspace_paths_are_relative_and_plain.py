"""A path a caller names in a workspace is relative, '/'-separated, with no empty, '.' or '..'
component and no NUL: anything else is refused with INVALID_PATH, saying what is wrong."""

from __future__ import annotations

import pytest

from checkpointd.core.kernel.errors import InvalidArgument
from checkpointd.core.workspace.workspace import is_under, validate_relpath


@pytest.mark.parametrize("path", ["a", "a/b.txt", ".hidden/x", "..x/y", "a/.../b"])
def test_a_plain_relative_path_is_taken_as_it_is(path: str) -> None:
    assert validate_relpath(path) == path


@pytest.mark.parametrize("path", ["", "/etc/passwd", "/", "a\0b"])
def test_an_empty_absolute_or_nul_path_is_refused_as_not_relative(path: str) -> None:
    with pytest.raises(InvalidArgument, match="must be relative and non-empty"):
        validate_relpath(path, "raw_paths")


@pytest.mark.parametrize("path", ["a//b", "a/", "./a", "a/./b", "..", "a/../../b"])
def test_an_empty_dot_or_dotdot_component_is_refused(path: str) -> None:
    with pytest.raises(InvalidArgument, match="empty, '.' or '..' component"):
        validate_relpath(path)


def test_a_path_is_under_a_prefix_only_at_a_component_boundary() -> None:
    assert is_under("a/b", ["a"]) and is_under("a", ["a"]) and is_under("x/y/z", ["q", "x/y"])
    assert not is_under("ab", ["a"]) and not is_under("a", ["a/b"]) and not is_under("a", [])
