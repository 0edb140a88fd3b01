"""cat, ls-files, export: a file, a directory listing, or a whole checkpoint as a tar archive, as it was in a
checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from checkpointd.commands import render
from checkpointd.commands.connection import connect
from checkpointd.commands.failures import reports_errors


def _to_stdout(chunks: Iterable[bytes]) -> None:
    """Writes the bytes as they are (no decoding); a reader that stops early (`| head`) is not an
    error: the rest is not fetched, and stdout is pointed at /dev/null so that the interpreter's
    own flush at exit does not fail again."""
    out = sys.stdout.buffer
    try:
        for chunk in chunks:
            out.write(chunk)
        out.flush()
    except BrokenPipeError:
        render.reader_gone()


@reports_errors
def cat(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        _to_stdout(conn.checkpoints().read_file(args.checkpoint_id, args.path))
    return 0


@reports_errors
def ls_files(args: argparse.Namespace) -> int:
    """One `mode type size path` line per entry (a symlink's line ends `-> target`), plain text for
    scripts; a reader that stops early (`| head`) is not an error."""
    with connect(args) as conn:
        files = conn.checkpoints().list_files(args.checkpoint_id, args.path, recursive=args.recursive,
                                              timeout=args.timeout)
    if args.json:
        render.emit_json([render.message_dict(f) for f in files])
        return 0
    lines = []
    for entry in files:
        kind = render.entry_type_name(entry.entry_type)
        line = f"{entry.mode:04o} {kind:<7} {entry.size_bytes:>10} {entry.path}"
        lines.append(f"{line} -> {entry.symlink_target}" if entry.symlink_target else line)
    try:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()
    except BrokenPipeError:
        render.reader_gone()
    return 0


def _refusal(output: Path, force: bool) -> str | None:
    if output.is_dir():
        return f"{output} is a directory: --output names the archive file to write"
    if os.path.lexists(output) and not force:
        return f"{output} already exists; --force replaces it"
    if not output.parent.is_dir():
        return f"{output.parent} is not a directory"
    return None


@reports_errors
def export(args: argparse.Namespace) -> int:
    """Writes the archive to a temporary file beside the output, then puts it in place in one step
    (a link, which fails if the output appeared meanwhile; with --force a rename). Nothing but the
    output is ever written, and an interrupted export leaves no partial archive."""
    if args.output == "-":
        if args.json:
            render.error("--json describes an archive written to a file: with --output - the archive itself is "
                         "what goes to stdout")
            return 2
        if sys.stdout.isatty():
            render.error("refusing to write a tar archive to a terminal: redirect it (> x.tar) or use --output FILE")
            return 1
        with connect(args) as conn:
            _to_stdout(conn.checkpoints().export_checkpoint(args.checkpoint_id, timeout=args.timeout))
        return 0
    output = Path(args.output)
    refusal = _refusal(output, args.force)
    if refusal:
        render.error(refusal)
        return 1
    # A name of up to 255 bytes must work: the temporary one keeps only a part of it.
    fd, temporary = tempfile.mkstemp(prefix=f".{output.name[:64]}.", suffix=".part", dir=output.parent)
    size = 0
    try:
        with os.fdopen(fd, "wb") as archive, connect(args) as conn:
            for chunk in conn.checkpoints().export_checkpoint(args.checkpoint_id, timeout=args.timeout):
                archive.write(chunk)
                size += len(chunk)
            archive.flush()
            os.fsync(archive.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        if args.force:
            os.replace(temporary, output)
        else:
            try:
                os.link(temporary, output)
            except FileExistsError:
                render.error(f"{output} appeared while the archive was written; --force replaces it")
                return 1
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    if args.json:
        render.emit_json({"output": str(output), "size_bytes": size, "checkpoint_id": args.checkpoint_id})
        return 0
    render.err.print(f"wrote {output} ({render.human_size(size)}): checkpoint {args.checkpoint_id}'s files as a tar "
                     f"archive (tar -tvf {output} lists them)", highlight=False, markup=False)
    return 0
