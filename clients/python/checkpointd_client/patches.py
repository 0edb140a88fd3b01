"""Unified diffs of a DiffCheckpoints response made with `text_diffs=True`, as `git diff` shows them."""

from __future__ import annotations

from collections.abc import Iterable

from checkpoint.v1 import checkpoint_service_pb2 as pb

_RESET = "\x1b[0m"
_COLORS = {"+": "\x1b[32m", "-": "\x1b[31m", "@": "\x1b[36m", "header": "\x1b[1m"}
_NO_TEXT = {
    pb.TEXT_DIFF_STATUS_BINARY: "Binary files differ",
    pb.TEXT_DIFF_STATUS_TOO_LARGE: "File too large for a text diff (over 1 MiB, or the response's 2 MiB of diffs "
                                   "was used up: diff fewer paths with --path)",
    pb.TEXT_DIFF_STATUS_UNREADABLE: "The live file changed while it was read: diff again",
}
_KINDS = {
    pb.CHANGE_KIND_ADDED: "new file",
    pb.CHANGE_KIND_DELETED: "deleted file",
    pb.CHANGE_KIND_TYPE_CHANGED: "type changed",
    pb.CHANGE_KIND_MODIFIED: "modified",
}


def _paint(line: str, color: bool) -> str:
    if not color:
        return line
    if line.startswith(("+++", "---")):
        return f"{_COLORS['header']}{line}{_RESET}"
    code = _COLORS.get(line[:1])
    return f"{code}{line}{_RESET}" if code else line


def format_patch(changes: Iterable[pb.FileChange], *, color: bool = False) -> str:
    """One `diff --checkpointd a/PATH b/PATH` section per change: its text diff, or a line that says
    why it has none (binary, too large, a directory or symlink). `color=True` adds ANSI colours."""
    out: list[str] = []
    for change in changes:
        header = f"diff --checkpointd a/{change.path} b/{change.path}"
        out.append(f"{_COLORS['header']}{header}{_RESET}" if color else header)
        if change.base_mode != change.target_mode and change.base_mode and change.target_mode:
            out.append(f"old mode {change.base_mode:o}")
            out.append(f"new mode {change.target_mode:o}")
        elif change.kind != pb.CHANGE_KIND_MODIFIED:
            out.append(_KINDS[change.kind])
        status = change.text_diff_status
        if status == pb.TEXT_DIFF_STATUS_TEXT:
            out.extend(_paint(line, color) for line in change.text_diff.splitlines())
        elif status == pb.TEXT_DIFF_STATUS_NOT_A_FILE:
            out.append("(a directory or symlink: no content diff)")
        elif status in _NO_TEXT:
            out.append(_NO_TEXT[status])
    return "\n".join(out) + ("\n" if out else "")
