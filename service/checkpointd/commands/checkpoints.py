"""ls, show, diff, rollback, create, delete: CheckpointService for people."""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import sys
import time
from collections.abc import Iterator

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.commands import render
from checkpointd.commands.connection import connect
from checkpointd.commands.failures import reports_errors
from checkpointd.commands.interruption import on_interrupt
from checkpointd_client import format_patch

_SCOPES = {
    "files": pb.ROLLBACK_SCOPE_FILES,
    "state": pb.ROLLBACK_SCOPE_STATE,
    "files_and_state": pb.ROLLBACK_SCOPE_FILES_AND_STATE,
}


def confirm(question: str) -> bool:
    """Asks on stderr, reads one line from stdin; anything but y/yes (or end of input) is no."""
    try:
        render.err.print(f"{question} [y/N] ", end="", markup=False, highlight=False)
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        render.err.print()  # end the prompt's line before the command says it aborted
        raise
    if not answer:
        render.err.print()
    return answer.strip().lower() in ("y", "yes")


def declined(what: str) -> None:
    """Says that the command did nothing, and, when no terminal could have answered its question
    (a script, a pipe), how to confirm in advance."""
    unasked = "" if sys.stdin.isatty() else " (stdin is not a terminal: pass --yes to confirm without being asked)"
    render.err.print(f"{what}{unasked}", highlight=False)


@contextlib.contextmanager
def progress(message: str) -> Iterator[None]:
    """A spinner with elapsed time on a terminal; two plain lines on stderr otherwise."""
    if render.err.is_terminal:
        with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                      console=render.err, transient=True) as bar:
            bar.add_task(message, total=None)
            yield
        return
    started = time.monotonic()
    render.err.print(f"{message} ...", highlight=False)
    yield
    render.err.print(f"done in {time.monotonic() - started:.1f}s", highlight=False)


@reports_errors
def ls(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        found = conn.checkpoints().list_checkpoints(args.plan_id, filter_expr=args.filter)
    if args.json:
        render.emit_json([render.message_dict(cp) for cp in found])
    elif not found:
        render.err.print(f"plan {args.plan_id} has no checkpoints" + (" matching the filter" if args.filter else ""))
    else:
        title = f"plan {args.plan_id}: {render.counted(len(found), 'checkpoint')}"
        render.out.print(render.checkpoints_table(found, title))
    return 0


@reports_errors
def show(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        cp = conn.checkpoints().get_checkpoint(args.checkpoint_id, full=args.state)
    if args.json:
        render.emit_json(render.message_dict(cp))
        return 0
    render.out.print(render.checkpoint_table(cp))
    if cp.skipped_files:
        render.out.print(render.skipped_table(cp))
    if args.state:
        render.out.print("state:", style="bold")
        try:
            render.out.print(cp.state.decode("utf-8"), markup=False, highlight=False)
        except UnicodeDecodeError:
            render.out.print(f"(binary, base64) {base64.b64encode(cp.state).decode()}", markup=False)
    return 0


def _use_color(choice: str) -> bool:
    if choice != "auto":
        return choice == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


@reports_errors
def diff(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        changes = conn.checkpoints().diff_checkpoints(args.base_id, args.target_id, paths=args.path,
                                                      text_diffs=args.patch)
    if args.patch and not args.json:
        if not changes:
            render.err.print(f"no changes between {args.base_id} and {args.target_id or 'the live workspace'}",
                             highlight=False)
        sys.stdout.write(format_patch(changes, color=_use_color(args.color)))
        sys.stdout.flush()
        if getattr(changes, "omitted", 0):
            render.err.print(render.omitted_line(changes.omitted), highlight=False)
        return 0
    omitted = getattr(changes, "omitted", 0)
    if args.json:
        render.emit_json([render.message_dict(c) for c in changes])
        if omitted:
            render.err.print(render.omitted_line(omitted), highlight=False)
        return 0
    against = args.target_id or "the live workspace"
    render.print_changes(f"{args.base_id} -> {against}", changes, omitted)
    return 0


def _rollback_json(preview: pb.RollbackResponse, applied: pb.RollbackResponse | None) -> dict:
    result: dict = {"dry_run": [render.message_dict(c) for c in preview.changes], "applied": applied is not None}
    if preview.changes_omitted:
        result["dry_run_omitted"] = preview.changes_omitted
    if applied is not None:
        result["changes"] = [render.message_dict(c) for c in applied.changes]
        if applied.changes_omitted:
            result["changes_omitted"] = applied.changes_omitted
        result["safety_checkpoint_id"] = applied.safety_checkpoint.checkpoint_id
    return result


def _state_out_refusal(args: argparse.Namespace) -> str | None:
    """Why --state-out cannot be written, checked before anything is rolled back; None if it can."""
    if args.state_out is None or args.scope == "files":
        return None
    path = args.state_out.expanduser()
    if path.is_dir():
        return f"--state-out {path} is a directory: it names the file the plan state is written to"
    if not path.parent.is_dir():
        return f"--state-out {path}: {path.parent} is not a directory; nothing was rolled back"
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        return f"--state-out {path} cannot be written (permission denied); nothing was rolled back"
    return None


@reports_errors
def rollback(args: argparse.Namespace) -> int:
    scope = _SCOPES[args.scope]
    refusal = _state_out_refusal(args)
    if refusal:
        render.error(refusal)
        return 1
    with connect(args) as conn:
        client = conn.checkpoints()
        with progress(f"Computing what a rollback of plan {args.plan_id} to {args.checkpoint_id} would change"):
            preview = client.rollback(args.plan_id, args.checkpoint_id, scope=scope, paths=args.path, dry_run=True,
                                      allow_nested_workspaces=args.allow_nested)
        if not args.json:
            render.print_changes(f"rollback to {args.checkpoint_id} would make", list(preview.changes),
                                 preview.changes_omitted)
            if args.scope != "files" and preview.state:
                keep = f"written to {args.state_out}" if args.state_out else "--state-out FILE keeps it"
                render.out.print(f"and return the checkpoint's plan state ({render.human_size(len(preview.state))}; "
                                 f"{keep})", highlight=False)
        if not args.yes and not confirm(f"Roll plan {args.plan_id} back to {args.checkpoint_id}?"):
            declined("rollback cancelled; nothing was changed")
            if args.json:
                render.emit_json(_rollback_json(preview, None))
            return 1
        with on_interrupt(f"interrupted after the rollback was sent: the server finishes it (or completes or undoes "
                          f"it from its journal), so it may have happened; `checkpointd ls {args.plan_id}` shows "
                          "its safety checkpoint if it did"), \
                progress("Rolling back (a safety checkpoint is recorded first)"):
            applied = client.rollback(args.plan_id, args.checkpoint_id, scope=scope, paths=args.path,
                                      allow_nested_workspaces=args.allow_nested)
    unwritten = None
    if args.state_out is not None and args.scope != "files":
        try:
            args.state_out.expanduser().write_bytes(applied.state)
        except OSError as exc:  # it could be written a moment ago: the rollback is done all the same
            unwritten = (f"the rollback was applied (safety checkpoint {applied.safety_checkpoint.checkpoint_id}), but "
                         f"its plan state could not be written to {args.state_out}: {exc.strerror or exc}")
    if args.json:
        render.emit_json(_rollback_json(preview, applied))
        if unwritten:
            render.error(unwritten)
        return 1 if unwritten else 0
    for nested in applied.nested_workspaces:
        render.out.print(f"changed {render.counted(nested.change_count, 'path')} in the workspace of plan "
                         f"{nested.plan_id} ({nested.workspace_root}), as --allow-nested allowed",
                         highlight=False, markup=False)
    more = f" and {applied.changes_omitted} more not listed" if applied.changes_omitted else ""
    render.out.print(f"rolled back: {render.change_summary(list(applied.changes))}{more}. Safety checkpoint "
                     f"{applied.safety_checkpoint.checkpoint_id} holds what was there before "
                     f"(checkpointd rollback {args.plan_id} {applied.safety_checkpoint.checkpoint_id} undoes this)",
                     highlight=False)
    if unwritten:
        render.error(unwritten)
        return 1
    return 0


@reports_errors
def create(args: argparse.Namespace) -> int:
    labels = dict(args.label)
    if args.pin:
        labels["pinned"] = "true"
    state = args.state_file.read_bytes() if args.state_file is not None else b""
    interrupted = (f"interrupted after the checkpoint was requested: it may still be recorded "
                   f"(`checkpointd ls {args.plan_id}` shows it)")
    with connect(args) as conn, on_interrupt(interrupted), progress(
            f"Recording a checkpoint of plan {args.plan_id} (a first snapshot of a large workspace can take a while)"):
        cp = conn.checkpoints().create_checkpoint(args.plan_id, labels=labels, description=args.description,
                                                  state=state, workspace_root=args.workspace_root,
                                                  source_tool="checkpointd-cli")
    if args.json:
        render.emit_json(render.message_dict(cp))
    else:
        render.out.print(render.checkpoint_table(cp))
    return 0


@reports_errors
def delete(args: argparse.Namespace) -> int:
    """Asks only about a checkpoint that exists (an unknown id fails at once, NOT_FOUND), naming
    what it is, then deletes it."""
    with connect(args) as conn:
        client = conn.checkpoints()
        if not args.yes:
            cp = client.get_checkpoint(args.checkpoint_id)
            if not confirm(f"Delete checkpoint {cp.checkpoint_id} (#{cp.sequence} of plan {cp.plan_id}, "
                           f"{render.local_time(cp)})?"):
                declined("nothing was deleted")
                return 1
        interrupted = (f"interrupted after the delete was sent: the checkpoint may be gone "
                       f"(`checkpointd show {args.checkpoint_id}` tells)")
        with on_interrupt(interrupted):
            client.delete_checkpoint(args.checkpoint_id)
    if args.json:
        render.emit_json({"deleted": args.checkpoint_id})
    else:
        render.out.print(f"deleted {args.checkpoint_id}", highlight=False)
    return 0
