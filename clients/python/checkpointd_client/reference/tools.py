"""Two real tools that act on a plan's workspace, with every path confined to it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar, Protocol


class WorkspacePathError(ValueError):
    """A tool argument names a path outside the plan's workspace."""


@dataclass(frozen=True)
class ToolResult:
    output: str


class Tool(Protocol):
    """A tool the reference runner can run. Leave `read_only` False unless it never writes."""

    name: str
    read_only: bool

    def run(self, workspace_root: Path, arguments: Mapping[str, str]) -> ToolResult: ...


def resolve_in_workspace(workspace_root: Path, relative_path: str) -> Path:
    """The absolute path of `relative_path` inside the workspace, following symlinks.

    Absolute paths, and paths that leave the workspace (through '..' or a symlink), are refused.
    """
    if not relative_path or PurePosixPath(relative_path).is_absolute():
        raise WorkspacePathError(f"expected a path relative to the workspace, got {relative_path!r}")
    root = workspace_root.resolve(strict=True)
    candidate = (root / relative_path).resolve()
    if candidate == root or not candidate.is_relative_to(root):
        raise WorkspacePathError(f"{relative_path!r} is not a file path inside the workspace")
    return candidate


def _argument(arguments: Mapping[str, str], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise TypeError(f"argument {name!r} must be a string, got {value!r}")
    return value


class WriteFileTool:
    """local/write-file: write `content` (UTF-8) to `path`, creating parent directories."""

    name: ClassVar[str] = "local/write-file"
    read_only: ClassVar[bool] = False

    def run(self, workspace_root: Path, arguments: Mapping[str, str]) -> ToolResult:
        target = resolve_in_workspace(workspace_root, _argument(arguments, "path"))
        content = _argument(arguments, "content")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return ToolResult(output=f"wrote {len(content.encode())} bytes to {arguments['path']}")


class ReadFileTool:
    """local/read-file: return the UTF-8 text of `path`."""

    name: ClassVar[str] = "local/read-file"
    read_only: ClassVar[bool] = True

    def run(self, workspace_root: Path, arguments: Mapping[str, str]) -> ToolResult:
        target = resolve_in_workspace(workspace_root, _argument(arguments, "path"))
        return ToolResult(output=target.read_text(encoding="utf-8"))
