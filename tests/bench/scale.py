"""Large workspaces (issue 21), through a real checkpointd server: one directory of 200,000
entries, and (opt-in, --million) a workspace of 1,000,000 files. For each: the first
checkpoint, one-file incremental checkpoints, no-change checkpoints, one-file rollbacks and the
server's peak resident memory. checkpointd only: the goals are absolute.

    .venv/bin/python -m tests.bench scale                                # the 200k-entry directory
    .venv/bin/python -m tests.bench scale --million                      # and 1M files (~15 GiB of disk)
    .venv/bin/python -m tests.bench scale --million --million-files 20000 --directory-entries 5000  # smoke
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import stat
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ulid import ULID

from tests.bench.measure import children_by_parent, peak_rss_bytes
from tests.bench.run import (
    CHECKPOINTD,
    MIB,
    ROLLBACK_EDIT_KINDS,
    MetricResult,
    Run,
    RunOptions,
    add_run_arguments,
    attempt,
    execute,
    log,
    run_options,
    size_label,
)
from tests.bench.workspace_gen import GeneratedWorkspace, WorkspaceEditor, generate_workspace

GIB = 1024 * MIB
#: Disk a generated workspace takes per tracked file, with its ignored half and the store
#: (measured: ~9 KiB with 20k files; rounded up), and inodes per tracked file.
MILLION_BYTES_PER_FILE = 14 * 1024
MILLION_INODES_PER_FILE = 1.6
#: The same for the one-directory workspace of small files.
DIRECTORY_BYTES_PER_ENTRY = 8 * 1024
BIG_DIRECTORY = "big"


def generate_directory(path: Path, entries: int, seed: int) -> GeneratedWorkspace:
    """A workspace whose every file is in one directory: ``entries`` small text files."""
    rng = random.Random(f"checkpointd-bench-directory:{seed}:{entries}")
    (path / BIG_DIRECTORY).mkdir(parents=True)
    names = []
    total = 0
    for index in range(entries):
        name = f"{BIG_DIRECTORY}/entry_{index:07d}.txt"
        body = "".join(f"value_{index}_{line} = {rng.randrange(10**9)}\n" for line in range(rng.randint(3, 12)))
        (path / name).write_text(body)
        names.append(name)
        total += len(body)
    return GeneratedWorkspace(path, names, names, 0, total, 0, [BIG_DIRECTORY])


def room_problem(root: Path, needed_bytes: int, needed_inodes: int) -> str:
    """Why ``root``'s file system cannot take a workspace of that size (empty if it can)."""
    free = shutil.disk_usage(root).free
    inodes = os.statvfs(root).f_favail
    if free < needed_bytes:
        return (f"{root} has {free / GIB:.1f} GiB free, the scenario needs about {needed_bytes / GIB:.1f} GiB "
                "(workspace and store); pass --root elsewhere or fewer files")
    if inodes < needed_inodes:
        return f"{root} has {inodes:,} free inodes, the scenario needs about {needed_inodes:,}"
    return ""


class ScaleBench:
    """The metrics of one large workspace, checkpointd alone, on a fresh server."""

    def __init__(self, run: Run, label: str, workspace: GeneratedWorkspace, repeat: int) -> None:
        self.run = run
        self.label = label
        self.workspace = workspace
        self.repeat = repeat
        self.editor = WorkspaceEditor(workspace, run.options.seed)
        self.plan_id = str(ULID())
        self.digest = ""

    def checkpoint(self, description: str) -> tuple[str, float, int]:
        """One CreateCheckpoint after a sync (outside its timing): (tree digest, seconds, files)."""
        self.run.flush_disk()
        checkpoint, seconds = self.run.client.checkpoint(self.plan_id, self.workspace.path, description)
        return checkpoint.tree_digest, seconds, checkpoint.file_count

    def first(self, result: MetricResult) -> None:
        series = result.for_system(CHECKPOINTD)
        server = self.run.fresh_server()
        self.digest, seconds, files = self.checkpoint("first")
        # Reader processes outlive a large scan for a while: their peaks are readable now.
        readers = [peak_rss_bytes(pid) or 0 for pid in children_by_parent().get(server.pid, [])]
        background = server.wait_for_idle()
        series.background.append(background.to_json())
        series.extra["reader_peak_rss_bytes"] = readers
        result.notes.append(f"busy {background.seconds:.1f} s after answering")
        if readers:
            result.notes.append(f"{len(readers)} reader processes, peak RSS up to {max(readers) / MIB:,.0f} MiB each")
        if files != len(self.workspace.tracked_files):
            series.wrong.append(f"captured {files} files, expected {len(self.workspace.tracked_files)}")
        else:
            series.samples.append(seconds * 1000)

    def repeated(self, result: MetricResult, edit: bool) -> None:
        series = result.for_system(CHECKPOINTD)
        for _ in range(self.repeat):
            if edit:
                self.editor.modify()
            digest, seconds, _ = self.checkpoint("step")
            if (digest != self.digest) != edit:
                series.wrong.append("tree digest unchanged after an edit" if edit else "tree digest changed")
            else:
                series.samples.append(seconds * 1000)
            self.digest = digest
            self.run.settle()

    def rollbacks(self, result: MetricResult) -> None:
        """One-file rollbacks (modify / add / delete in turn); each counted when the touched path
        is back as it was, its directory lists the same names as before the edit, and the reply
        names that path alone. (A whole-tree check of a million files would take minutes.)"""
        series = result.for_system(CHECKPOINTD)
        for repeat in range(self.repeat):
            kind = ROLLBACK_EDIT_KINDS[repeat % len(ROLLBACK_EDIT_KINDS)]
            target, _ = self.run.client.checkpoint(self.plan_id, self.workspace.path, "rollback target")
            delta = self.editor.apply(kind)
            path = self.workspace.path / delta.path
            names = set(os.listdir(path.parent))
            names_before = names - {path.name} if kind == "add" else names | {path.name}
            self.run.client.checkpoint(self.plan_id, self.workspace.path, "after edit")
            self.run.flush_disk()
            reply, seconds = self.run.client.rollback(self.plan_id, target.checkpoint_id)
            self.editor.rolled_back(delta)
            problems = []
            if [change.path for change in reply.changes] != [delta.path]:
                problems.append(f"reported {len(reply.changes)} changes")
            if set(os.listdir(path.parent)) != names_before:
                problems.append("the directory lists other names than before")
            if kind == "add" and os.path.lexists(path):
                problems.append("the added file is still there")
            if kind != "add" and (not path.is_file() or path.read_bytes() != delta.before
                                  or stat.S_IMODE(path.stat().st_mode) != delta.before_mode):
                problems.append("the file is not back as it was")
            if problems:
                series.wrong.append(f"{kind} {delta.path}: {'; '.join(problems)}")
                raise RuntimeError(f"rollback after {kind} of {delta.path} went wrong; later samples skipped")
            series.samples.append(seconds * 1000)
            self.run.settle()

    def peak_memory(self, result: MetricResult) -> None:
        peak = peak_rss_bytes(self.run.server.pid)
        if peak is None:
            raise RuntimeError("the server is gone")
        result.for_system(CHECKPOINTD).samples.append(peak / MIB)

    def run_all(self) -> None:
        """Each step builds on the one before; after a failure the rest are marked failed."""
        steps: list[tuple[str, str, str, Callable[[MetricResult], None]]] = [
            ("scale_first", f"first checkpoint ({len(self.workspace.tracked_files):,} files)", "ms", self.first),
            ("scale_incremental", "incremental checkpoint, 1 file changed", "ms", partial(self.repeated, edit=True)),
            ("scale_no_change", "no-change checkpoint", "ms", partial(self.repeated, edit=False)),
            ("scale_rollback", "rollback of a 1-file delta", "ms", self.rollbacks),
            ("scale_rss", "server peak RSS (VmHWM) over all of the above", "MiB", self.peak_memory)]
        failure = None
        try:
            for name, label, unit, step in steps:
                result = self.run.new_result(name, label, self.label, unit)
                series = result.for_system(CHECKPOINTD)
                if failure:
                    series.error = f"not run: {failure}"
                    continue
                attempt(series, partial(step, result))
                failure = series.error
                log(f"[scale] {self.label}: {label}: median {series.value}, samples "
                    f"{[round(sample, 1) for sample in series.samples]}")
        finally:
            self.run.stop_server()
            self.run.discard(self.workspace.path, background=True)


def scenario(run: Run, label: str, make: Callable[[], GeneratedWorkspace], repeat: int) -> None:
    started = time.perf_counter()
    workspace = make()
    run.wait_for_deletions()
    log(f"[scale] generated {label}: {len(workspace.tracked_files):,} files (+{workspace.ignored_file_count:,} "
        f"ignored) in {time.perf_counter() - started:.0f} s")
    run.workspace_facts[label] = {"tracked_files": len(workspace.tracked_files),
                                  "ignored_files": workspace.ignored_file_count,
                                  "tracked_bytes": workspace.tracked_bytes, "ignored_bytes": workspace.ignored_bytes}
    ScaleBench(run, label, workspace, repeat).run_all()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m tests.bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--million", action="store_true",
                        help="also the many-file workspace (generated like the synthetic sizes: ~4 KiB files and an "
                             "ignored node_modules of half as many; needs ~14 KiB of disk per file, checked first)")
    parser.add_argument("--million-files", type=int, default=1_000_000,
                        help="tracked files of that workspace (default 1,000,000)")
    parser.add_argument("--directory-entries", type=int, default=200_000,
                        help="entries of the one-directory workspace (default 200,000; 0 skips it)")
    parser.add_argument("--repeat", type=int, default=5, help="samples of the per-call metrics (default 5)")
    add_run_arguments(parser, systems=False)
    arguments = parser.parse_args(argv)
    if arguments.repeat < 1 or arguments.million_files < 10 or arguments.directory_entries < 0:
        parser.error("--repeat must be at least 1, --million-files at least 10, --directory-entries at least 0")
    options = RunOptions(**run_options(parser, arguments))
    options.root.mkdir(parents=True, exist_ok=True)
    # The two scenarios run one after the other, each deleted before the next: the larger must fit.
    files = arguments.million_files if arguments.million else 0
    problem = room_problem(options.root, max(files * MILLION_BYTES_PER_FILE,
                                             arguments.directory_entries * DIRECTORY_BYTES_PER_ENTRY) + GIB,
                           int(max(files * MILLION_INODES_PER_FILE, arguments.directory_entries * 1.1)) + 10_000)
    if problem:
        print(f"scale: refusing to start: {problem}", file=sys.stderr)
        return 2
    run = Run(options)
    phases = []
    if arguments.directory_entries:
        phases.append(partial(scenario, run, f"{size_label(arguments.directory_entries)} in 1 dir", partial(
            generate_directory, run.workspaces / "directory", arguments.directory_entries, options.seed),
            arguments.repeat))
    if arguments.million:
        phases.append(partial(scenario, run, size_label(arguments.million_files), partial(
            generate_workspace, run.workspaces / "million", arguments.million_files, options.seed), arguments.repeat))
    log(f"[scale] scratch {run.scratch}")
    return execute(run, phases, ["scale", *argv],
                   "checkpointd alone (one gRPC call per timing, after a sync); medians of --repeat. Peak RSS: "
                   "the server process's VmHWM, reader processes apart (notes of the first checkpoint).")


if __name__ == "__main__":
    raise SystemExit(main())
