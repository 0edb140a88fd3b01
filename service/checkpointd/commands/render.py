"""Output for the human CLI: rich tables on stdout, messages on stderr, or JSON."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Iterable
from datetime import UTC

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2
from checkpointd_client import from_value, phase_name, trigger_name


class _StdoutConsole(Console):
    """A reader of stdout that went away is reported as the BrokenPipeError it is, for the one place
    that handles it (failures.reports_errors, cli.main: a quiet exit 0, as `cat` does), where rich's
    own handling would exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


#: Piped output is not cut to 80 columns (ids would be cropped); COLUMNS still wins.
_PIPE_WIDTH = 200
#: Neither console reads markup: what is printed holds ids, paths, labels and server messages, where
#: square brackets are text ("[/x]" would otherwise be a MarkupError); styles are given as styles.
out = _StdoutConsole(soft_wrap=False, markup=False,
              width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else _PIPE_WIDTH)
#: Messages are not cut into 80-column lines: an error stays one line, for people and for grep.
err = Console(stderr=True, soft_wrap=True, markup=False)

_CHANGE_STYLE = {
    pb.CHANGE_KIND_ADDED: ("added", "green"),
    pb.CHANGE_KIND_MODIFIED: ("modified", "yellow"),
    pb.CHANGE_KIND_DELETED: ("deleted", "red"),
    pb.CHANGE_KIND_TYPE_CHANGED: ("type changed", "magenta"),
}
_ENTRY_TYPE = {
    pb.ENTRY_TYPE_UNSPECIFIED: "",
    pb.ENTRY_TYPE_FILE: "file",
    pb.ENTRY_TYPE_SYMLINK: "symlink",
    pb.ENTRY_TYPE_DIRECTORY: "dir",
}


def error(message: str) -> None:
    """One line on stderr, however long: "error: ..." (a message is never read as markup)."""
    err.print(Text.assemble(("error:", "red"), " ", message), soft_wrap=True, highlight=False)


def reader_gone() -> None:
    """The reader of stdout went away (`| head`): not an error. Whatever is still buffered, and
    the interpreter's own flush at exit, go to /dev/null instead of failing again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def emit_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def message_dict(message: Message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def counted(count: int, noun: str) -> str:
    """E.g. "1 path", "2 paths", "0 paths": a count with its noun in the number it takes."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def local_time(checkpoint: pb.Checkpoint) -> str:
    if not checkpoint.HasField("create_time"):
        return ""
    return checkpoint.create_time.ToDatetime(tzinfo=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def labels_text(labels: dict[str, str]) -> Text:
    text = Text()
    for i, (key, value) in enumerate(sorted(labels.items())):
        if i:
            text.append(" ")
        text.append(f"{key}={value}", style="bold cyan" if (key, value) == ("pinned", "true") else "")
    return text


def checkpoints_table(checkpoints: Iterable[pb.Checkpoint], title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    for column, justify in (("#", "right"), ("checkpoint", "left"), ("created", "left"), ("trigger", "left"),
                            ("phase", "left"), ("tool", "left"), ("files", "right"), ("size", "right"),
                            ("state", "right"), ("labels", "left")):
        table.add_column(column, justify=justify, no_wrap=column != "labels")
    for cp in checkpoints:
        table.add_row(str(cp.sequence), cp.checkpoint_id, local_time(cp), trigger_name(cp.trigger),
                      phase_name(cp.phase), cp.source_tool, str(cp.file_count) if cp.has_files else "-",
                      human_size(cp.total_size_bytes) if cp.has_files else "-", human_size(cp.state_size_bytes),
                      labels_text(dict(cp.labels)))
    return table


def checkpoint_table(cp: pb.Checkpoint) -> Table:
    table = Table(box=box.SIMPLE, show_header=False, title=f"checkpoint {cp.checkpoint_id}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows: list[tuple[str, str | Text]] = [
        ("plan", cp.plan_id), ("sequence", str(cp.sequence)), ("created", local_time(cp)),
        ("trigger", trigger_name(cp.trigger)), ("phase", phase_name(cp.phase)), ("tool", cp.source_tool),
        ("description", cp.description), ("labels", labels_text(dict(cp.labels))),
        ("workspace", cp.workspace_root if cp.has_files else "(no files)"),
    ]
    if cp.has_files:
        rows += [("files", str(cp.file_count)), ("size", human_size(cp.total_size_bytes)),
                 ("tree", cp.tree_digest), ("skipped", str(len(cp.skipped_files) + cp.skipped_files_omitted))]
    rows.append(("state", human_size(cp.state_size_bytes)))
    if cp.rollback_target_checkpoint_id:
        rows.append(("safety before rollback to", cp.rollback_target_checkpoint_id))
    for field, value in rows:
        table.add_row(field, value)
    return table


def skipped_table(cp: pb.Checkpoint) -> Table:
    table = Table(title="skipped files", box=box.SIMPLE, title_justify="left")
    table.add_column("path")
    table.add_column("size", justify="right")
    table.add_column("reason")
    for skipped in cp.skipped_files:
        table.add_row(skipped.path, human_size(skipped.size_bytes), skipped.reason)
    if cp.skipped_files_omitted:
        table.caption = f"and {cp.skipped_files_omitted} more, not listed"
    return table


def entry_type_name(entry_type: int) -> str:
    return _ENTRY_TYPE.get(entry_type, "")


def _side(entry_type: int, size: int, mode: int) -> str:
    kind = _ENTRY_TYPE[entry_type]
    if not kind:
        return ""
    detail = f" {human_size(size)}" if kind == "file" else ""
    return f"{kind}{detail} {mode:04o}"


def print_changes(heading: str, changes: list[pb.FileChange], omitted: int = 0) -> None:
    """A one-line summary after ``heading``, then the table of changed paths (if any), and how
    many more paths changed than the server listed."""
    out.print(f"{heading}: {change_summary(changes)}", highlight=False)
    if changes:
        out.print(changes_table(changes))
    if omitted:
        out.print(omitted_line(omitted), highlight=False)


def omitted_line(omitted: int) -> str:
    return (f"and {counted(omitted, 'more changed path')}, not listed (the answer holds up to 16 MiB of changes; "
            "narrow it with --path to see them)")


def changes_table(changes: Iterable[pb.FileChange]) -> Table:
    table = Table(box=box.SIMPLE_HEAVY)
    table.add_column("change", no_wrap=True)
    table.add_column("path")
    table.add_column("before", no_wrap=True)
    table.add_column("after", no_wrap=True)
    for change in changes:
        word, style = _CHANGE_STYLE.get(change.kind, ("?", ""))
        table.add_row(Text(word, style=style), change.path,
                      _side(change.base_type, change.base_size_bytes, change.base_mode),
                      _side(change.target_type, change.target_size_bytes, change.target_mode))
    return table


def change_summary(changes: list[pb.FileChange]) -> str:
    """E.g. "1 added, 2 modified", always in the order added, modified, deleted, type changed."""
    counts = {word: sum(c.kind == kind for c in changes) for kind, (word, _style) in _CHANGE_STYLE.items()}
    parts = [f"{n} {word}" for word, n in counts.items() if n]
    return ", ".join(parts) if parts else "no changes"


def _plain(value: object) -> object:
    """google.protobuf.Value numbers are doubles; show whole ones as integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_value(value) -> str:
    return json.dumps(_plain(from_value(value)))


def config_table(entries, title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("key", no_wrap=True, style="bold")
    table.add_column("value")
    table.add_column("source", no_wrap=True)
    table.add_column("default")
    table.add_column("description", ratio=1)
    for entry in entries:
        table.add_row(entry.key, config_value(entry.value), source_name(entry.source),
                      config_value(entry.default_value), entry.description)
    return table


def source_name(source: int) -> str:
    return config_service_pb2.ConfigSource.Name(source).removeprefix("CONFIG_SOURCE_").lower()
