"""Real edit histories (issue 21): the first-parent commits of a real git repository replayed
into a workspace as an agent's writes would land, a checkpoint after each (checkpointd over
gRPC, shadow git as today's tools do it, side by side), then rollbacks to random earlier
checkpoints, each restore verified against the commit's tree.

    .venv/bin/python -m tests.bench history                        # this repository, 200 commits
    .venv/bin/python -m tests.bench history ../other --commits 100 --rollbacks 10
    .venv/bin/python -m tests.bench history https://github.com/pallets/click --commits 200

"Exact" means: every file and symlink of the commit's tree that the commit's own .gitignore
files do not exclude is there with the commit's bytes, permission bits (0644 or 0755, exactly)
and link target; nothing else is there but paths that the target's .gitignore files, or those
in force before the rollback, exclude (both systems leave those alone by design: what neither
captured cannot be deleted without loss); no directory is left empty. Tracked paths that a
commit's .gitignore excludes (force-added files) and submodules are neither captured by either
system nor judged. git decides what is ignored (``check-ignore``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ulid import ULID

from tests.bench.measure import disk_usage_bytes, median
from tests.bench.run import (
    CHECKPOINTD,
    GIT,
    MIB,
    REPO_ROOT,
    SYSTEMS,
    MetricResult,
    Run,
    RunOptions,
    Series,
    add_run_arguments,
    attempt,
    execute,
    log,
    run_options,
)
from tests.bench.shadow_git import ShadowGit, TreeEntries, parse_ls_tree
from tests.bench.workspace_gen import tree_entries

SYMLINK = "120000"
EXECUTABLE = "100755"
GITLINK = "160000"


def git_blob_id(body: bytes) -> str:
    """The object id git gives a blob of these bytes (SHA-1 repositories)."""
    return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()


class SourceRepo:
    """The replayed repository, only read: its first-parent history, trees and blobs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
        self._env["LC_ALL"] = "C"
        self._cat: subprocess.Popen[bytes] | None = None

    def git(self, *arguments: str) -> bytes:
        result = subprocess.run(["git", "-C", str(self.path), *arguments], env=self._env, capture_output=True,
                                check=False)
        if result.returncode != 0:
            raise RuntimeError(f"git {' '.join(arguments)} in {self.path} failed: "
                               f"{result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    def first_parent_commits(self, rev: str, count: int) -> list[str]:
        """The last ``count`` commits of ``rev``'s first-parent history, oldest first."""
        return self.git("rev-list", "--first-parent", f"--max-count={count}", rev, "--").decode().split()[::-1]

    def is_shallow(self) -> bool:
        return self.git("rev-parse", "--is-shallow-repository").decode().strip() == "true"

    def files(self, commit: str | None) -> TreeEntries:
        """The commit's files and symlinks (submodules left out: nothing of them is on disk)."""
        if commit is None:
            return {}
        return {path: entry for path, entry in parse_ls_tree(self.git("ls-tree", "-r", "-z", "--full-tree", commit))
                .items() if entry[0] != GITLINK}

    def gitlink_count(self, commit: str | None) -> int:
        if commit is None:
            return 0
        return sum(entry[0] == GITLINK for entry in
                   parse_ls_tree(self.git("ls-tree", "-r", "-z", "--full-tree", commit)).values())

    def blob(self, object_id: str) -> bytes:
        """One blob's bytes, through a long-lived ``git cat-file --batch``."""
        if self._cat is None:
            self._cat = subprocess.Popen(["git", "-C", str(self.path), "cat-file", "--batch"], env=self._env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._cat.stdin.write(object_id.encode() + b"\n")
        self._cat.stdin.flush()
        header = self._cat.stdout.readline().split()
        if len(header) != 3:
            raise RuntimeError(f"git cat-file: no blob {object_id} ({header!r})")
        body = self._cat.stdout.read(int(header[2]))
        self._cat.stdout.read(1)
        return body

    def close(self) -> None:
        if self._cat is not None:
            self._cat.stdin.close()
            self._cat.wait()
            self._cat = None


def converge(root: Path, current: TreeEntries, target: TreeEntries, blob: Callable[[str], bytes]) -> None:
    """Makes the paths named in ``current`` and ``target`` look as ``target`` says, the way an
    agent's write tool would: paths ``target`` lacks are deleted (and directories left empty
    with them), new or changed files written in place with exact permission bits, symlinks
    made as links. ``current`` must say what is on disk for those paths."""
    removed = [path for path, (mode, _) in current.items()
               if path not in target or (mode == SYMLINK) != (target[path][0] == SYMLINK)]
    for path in removed:
        os.unlink(root / path)
    for path in sorted(removed, key=len, reverse=True):
        remove_empty_directories(root, (root / path).parent)
    for path, (mode, object_id) in sorted(target.items()):
        was = None if path in removed else current.get(path)
        if was == (mode, object_id):
            continue
        destination = root / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        if mode == SYMLINK:
            if was is not None:
                os.unlink(destination)
            os.symlink(blob(object_id), os.fsencode(destination))
            continue
        permissions = 0o755 if mode == EXECUTABLE else 0o644
        if was is not None and was[1] == object_id:
            os.chmod(destination, permissions)
            continue
        descriptor = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, permissions)
        try:
            os.write(descriptor, blob(object_id))
            os.fchmod(descriptor, permissions)
        finally:
            os.close(descriptor)


def remove_empty_directories(root: Path, directory: Path) -> None:
    """Removes ``directory`` if it is empty, then each parent left empty, up to ``root``."""
    while directory != root and directory.is_dir() and not os.listdir(directory):
        directory.rmdir()
        directory = directory.parent


def workspace_state(root: Path) -> tuple[TreeEntries, set[str]]:
    """What is on disk, in the commit's terms: path -> (git mode, blob id) of each file and
    symlink (a file whose permission bits are neither 0644 nor 0755 gets a mode git never
    writes, so it never matches), and the directories."""
    entries: TreeEntries = {}
    directories: set[str] = set()
    for path, entry in tree_entries(root, git_blob_id).items():
        kind, _, rest = entry.partition(" ")
        if kind == "dir":
            directories.add(path)
        elif kind == "link":
            entries[path] = (SYMLINK, git_blob_id(os.fsencode(rest)))
        elif kind == "file":
            permissions, digest = rest.split(" ")
            entries[path] = (f"100{permissions}", digest)
        else:
            entries[path] = (entry, "")
    return entries, directories


def parents(paths: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        while "/" in path:
            path = path.rsplit("/", 1)[0]
            if path in found:
                break
            found.add(path)
    return found


@dataclass
class Verdict:
    """How a workspace (or a capture) differs from a commit's judged tree (empty lists: exact)."""

    missing: list[str]
    unexpected: list[str]
    changed: list[str]
    empty_directories: list[str]
    on_disk: TreeEntries

    @classmethod
    def of(cls, expected: TreeEntries, on_disk: TreeEntries, left_alone: set[str] | frozenset[str] = frozenset(),
           empty_directories: Iterable[str] = ()) -> Verdict:
        """``left_alone``: paths the target's ignore rules exclude, which may be there or not."""
        return cls(missing=sorted(path for path in expected if path not in on_disk),
                   unexpected=sorted(path for path in on_disk if path not in expected and path not in left_alone),
                   changed=sorted(path for path in expected if path in on_disk and on_disk[path] != expected[path]),
                   empty_directories=[path for path in empty_directories if f"{path}/" not in left_alone],
                   on_disk=on_disk)

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.changed or self.empty_directories)

    def describe(self, limit: int = 5) -> str:
        parts = [f"{len(paths)} {label}: {', '.join(paths[:limit])}" for label, paths in
                 (("missing", self.missing), ("unexpected", self.unexpected), ("changed", self.changed),
                  ("empty directories left", self.empty_directories)) if paths]
        return "; ".join(parts) or "exact"


class IgnoreOracle:
    """git's own answer to "do this commit's .gitignore files exclude that path?": a scratch
    repository whose work tree holds only the commit's .gitignore files."""

    def __init__(self, work_tree: Path, git_dir: Path, source: SourceRepo) -> None:
        work_tree.mkdir(parents=True)
        self._git = ShadowGit(work_tree, git_dir)
        self._git.init()
        self._source = source
        self._loaded: dict[str, str] = {}

    def ignored(self, files: TreeEntries, paths: Iterable[str]) -> set[str]:
        """Those of ``paths`` that the .gitignore files among ``files`` (a commit's) exclude."""
        gitignores = {path: object_id for path, (mode, object_id) in files.items()
                      if path.rsplit("/", 1)[-1] == ".gitignore" and mode != SYMLINK}
        if gitignores != self._loaded:
            for path in self._loaded:
                os.unlink(self._git.work_tree / path)
            for path, object_id in gitignores.items():
                (self._git.work_tree / path).parent.mkdir(parents=True, exist_ok=True)
                (self._git.work_tree / path).write_bytes(self._source.blob(object_id))
            self._loaded = gitignores
        return self._git.ignored(paths)

    def judged(self, files: TreeEntries) -> TreeEntries:
        """The files a capture must hold and a restore must bring back: all but the ignored."""
        ignored = self.ignored(files, files)
        return {path: entry for path, entry in files.items() if path not in ignored}


def changed_paths(before: TreeEntries, after: TreeEntries) -> int:
    return sum(before.get(path) != after.get(path) for path in before.keys() | after.keys())


class HistoryBench:
    """One replay: checkpoints after each commit, then rollbacks, then the stores' sizes."""

    def __init__(self, run: Run, source: SourceRepo, commits: list[str | None], label: str, rollbacks: int) -> None:
        self.run = run
        self.source = source
        self.commits = commits
        self.label = label
        self.rollback_count = min(rollbacks, len(commits) - 1)
        self.oracle = IgnoreOracle(run.scratch / "ignore-oracle", run.stores / "ignore-oracle.git", source)
        self.workspaces = {system: run.workspaces / f"history-{system}" for system in run.options.systems}
        self.git: ShadowGit | None = None
        self.plan_id = str(ULID())
        #: Per system, the checkpoint (checkpointd id or shadow commit) taken after commits[i].
        self.taken: dict[str, list[str]] = {system: [] for system in run.options.systems}
        self.last_digest = ""

    def order(self, step: int) -> list[str]:
        """The systems in the order of this step: alternating, so neither always goes first."""
        systems = [system for system in SYSTEMS if self.run.wants(system)]
        return systems if step % 2 == 0 else systems[::-1]

    # ----- replay ------------------------------------------------------------------------------------------------

    def replay(self) -> None:
        commits = self.commits
        files = self.source.files(commits[0])
        judged = self.oracle.judged(files)
        first = self.run.new_result("history_first", f"first checkpoint (the base: {len(judged)} files)", self.label,
                                    "ms")
        result = self.run.new_result("history_checkpoint", f"checkpoint after each of {len(commits) - 1} real commits",
                                     self.label, "ms")
        for workspace in self.workspaces.values():
            workspace.mkdir()
            converge(workspace, {}, files, self.source.blob)
        if self.run.wants(GIT):
            self.git = ShadowGit(self.workspaces[GIT], self.run.stores / "git-history")
            self.git.init()
        if self.run.wants(CHECKPOINTD):
            attempt(first.for_system(CHECKPOINTD), self.run.fresh_server)
        self.run.wait_for_deletions()
        for system in self.order(0):
            attempt(first.for_system(system), partial(self.checkpoint, system, first, judged, True))
            if first.for_system(system).error:
                result.for_system(system).error = "no first checkpoint to build on"
        unjudged = len(files) - len(judged)
        per_commit = []
        for index, commit in enumerate(commits[1:], start=1):
            new_files = self.source.files(commit)
            new_judged = self.oracle.judged(new_files)
            for workspace in self.workspaces.values():
                converge(workspace, files, new_files, self.source.blob)
            per_commit.append(changed_paths(judged, new_judged))
            for system in self.order(index):
                attempt(result.for_system(system),
                        partial(self.checkpoint, system, result, new_judged, new_judged != judged))
            files, judged = new_files, new_judged
            unjudged = max(unjudged, len(files) - len(judged))
            if index % 10 == 0 or index == len(commits) - 1:
                log(f"[history] commit {index}/{len(commits) - 1}: " + latest(result))
            self.run.settle()
        if per_commit:
            result.notes.append(f"files changed per commit: median {median(per_commit):g} "
                                f"({min(per_commit)}-{max(per_commit)})")
        self.run.workspace_facts["history"].update(
            files_at_tip=len(files), judged_files_at_tip=len(judged), most_unjudged_paths=unjudged,
            gitlinks_at_tip=self.source.gitlink_count(commits[-1]), files_changed_per_commit=per_commit)

    def checkpoint(self, system: str, result: MetricResult, judged: TreeEntries, changed: bool) -> None:
        """One timed checkpoint of one system after the replayed writes; counted if it holds
        exactly the judged files (git: the shadow commit's tree; checkpointd: the file count,
        and a tree digest that changes exactly when the judged files did)."""
        series = result.for_system(system)
        if system == GIT:
            self.run.quiet_server_before_git(series)
            self.run.flush_disk()
            commit, _, seconds = self.git.checkpoint(f"replay {len(self.taken[GIT])}")
            self.git.wait_for_background()
            self.taken[GIT].append(commit)
            captured = Verdict.of(judged, self.git.tree(commit))
            problem = "" if captured.exact else captured.describe()
        else:
            self.run.flush_disk()
            checkpoint, seconds = self.run.client.checkpoint(self.plan_id, self.workspaces[CHECKPOINTD],
                                                             f"replay {len(self.taken[CHECKPOINTD])}")
            self.taken[CHECKPOINTD].append(checkpoint.checkpoint_id)
            problems = []
            if checkpoint.file_count != len(judged):
                problems.append(f"captured {checkpoint.file_count} files, expected {len(judged)}")
            if (checkpoint.tree_digest != self.last_digest) != changed:
                problems.append("tree digest changed without a change" if not changed else "tree digest unchanged")
            self.last_digest = checkpoint.tree_digest
            problem = "; ".join(problems)
        if problem:
            series.wrong.append(f"checkpoint {len(self.taken[system]) - 1}: {problem}")
            log(f"[history] WRONG {system} checkpoint {len(self.taken[system]) - 1}: {problem}")
        else:
            series.samples.append(seconds * 1000)

    # ----- rollbacks ---------------------------------------------------------------------------------------------

    def rollbacks(self, checkpoint_result: MetricResult) -> None:
        count = self.rollback_count
        result = self.run.new_result("history_rollback", f"rollback to a random earlier checkpoint ({count} of them)",
                                     self.label, "ms")
        wrong = self.run.new_result("history_wrong", f"wrong restores (of {count})", self.label, "count")
        ready = [system for system in self.order(0)
                 if checkpoint_result.for_system(system).error is None and len(self.taken[system]) == len(self.commits)]
        for system in set(self.order(0)) - set(ready):
            result.for_system(system).error = wrong.for_system(system).error = "the replay did not complete"
        # The tip (the last checkpoint) is where the workspace is; every target is earlier.
        targets = random.Random(f"history-rollbacks:{self.run.options.seed}").sample(range(len(self.commits) - 1),
                                                                                   count)
        before = self.source.files(self.commits[-1])
        current = self.oracle.judged(before)
        files_changed = []
        for step, target in enumerate(targets):
            target_files = self.source.files(self.commits[target])
            expected = self.oracle.judged(target_files)
            files_changed.append(changed_paths(current, expected))
            for system in [system for system in self.order(step) if system in ready]:
                attempt(result.for_system(system), partial(
                    self.rollback, system, result.for_system(system), target, before, target_files, expected))
            log(f"[history] rollback {step + 1}/{count} to checkpoint {target} ({files_changed[-1]} files): "
                + latest(result))
            before, current = target_files, expected
            self.run.settle()
        result.notes.append(f"files changed per rollback: median {median(files_changed) or 0:g} "
                            f"({min(files_changed, default=0)}-{max(files_changed, default=0)})")
        result.for_system(CHECKPOINTD).extra["files_changed"] = files_changed
        for system in ready:
            wrong_ms = result.for_system(system).extra.get("wrong_ms")
            if wrong_ms:
                result.notes.append(f"{system}'s wrong rollbacks took median {median(wrong_ms):.1f} ms")
        for system in ready:
            if result.for_system(system).error is None:
                wrong.for_system(system).samples.append(len(result.for_system(system).wrong))
            else:
                wrong.for_system(system).error = result.for_system(system).error

    def rollback(self, system: str, series: Series, target: int, before: TreeEntries, target_files: TreeEntries,
                 expected: TreeEntries) -> None:
        """One timed rollback; counted when the workspace is then exactly the target's judged
        tree. A wrong one is listed, and its workspace repaired so the next starts right."""
        workspace = self.workspaces[system]
        if system == GIT:
            self.run.quiet_server_before_git(series)
            self.run.flush_disk()
            seconds = self.git.restore(self.taken[GIT][target])
        else:
            self.run.flush_disk()
            reply, seconds = self.run.client.rollback(self.plan_id, self.taken[CHECKPOINTD][target])
            series.extra.setdefault("reported_changes", []).append(len(reply.changes))
        verdict = self.verify(workspace, before, target_files, expected)
        if verdict.exact:
            series.samples.append(seconds * 1000)
            return
        # Not counted, but kept: how long a wrong restore took is still worth comparing against.
        series.extra.setdefault("wrong_ms", []).append(round(seconds * 1000, 4))
        series.wrong.append(f"to checkpoint {target}: {verdict.describe()}")
        log(f"[history] WRONG {system} rollback to checkpoint {target}: {verdict.describe()}")
        converge(workspace, {path: verdict.on_disk[path] for path in verdict.unexpected + verdict.changed},
                 {path: expected[path] for path in verdict.missing + verdict.changed}, self.source.blob)
        for directory in sorted(verdict.empty_directories, key=len, reverse=True):
            remove_empty_directories(workspace, workspace / directory)
        repaired = self.verify(workspace, before, target_files, expected)
        if not repaired.exact:
            raise RuntimeError(f"could not repair the {system} workspace: {repaired.describe()}")

    def verify(self, workspace: Path, before: TreeEntries, target: TreeEntries, expected: TreeEntries) -> Verdict:
        """The workspace against ``expected`` (the target's judged files). Extra paths and empty
        directories that the ignore rules of the target, or of the tree rolled back from
        (``before``), exclude are left alone by design, so they are not wrong."""
        on_disk, directories = workspace_state(workspace)
        empty = sorted(directories - parents(on_disk) - parents(expected))
        extra = [path for path in on_disk if path not in expected] + [f"{directory}/" for directory in empty]
        left_alone = self.oracle.ignored(target, extra) | self.oracle.ignored(before, extra) if extra else set()
        return Verdict.of(expected, on_disk, left_alone, empty)

    # ----- store sizes -------------------------------------------------------------------------------------------

    def store_sizes(self) -> None:
        commits = len(self.commits) - 1
        store = self.run.new_result("history_store", f"store at rest after {commits} commits (git: after git gc)",
                                    self.label, "MiB")
        wal = self.run.new_result("history_wal", "checkpointd's SQLite WAL files meanwhile (not in the row above)",
                                  self.label, "MiB")
        wal.for_system(GIT).skipped = True

        def git_side() -> None:
            before = self.git.size_bytes()
            self.git.gc()
            series = store.for_system(GIT)
            series.samples.append(self.git.size_bytes() / MIB)
            series.extra.update(bytes_before_gc=before, bytes_after_gc=self.git.size_bytes())

        def checkpointd_side() -> None:
            server = self.run.server
            idle = server.wait_for_idle()
            usage = data_dir_usage(server.data_dir)
            logs = sum(size for name, size in usage.items() if name.endswith(("-wal", "-shm")))
            store.for_system(CHECKPOINTD).samples.append((sum(usage.values()) - logs) / MIB)
            store.for_system(CHECKPOINTD).extra.update(bytes_by_entry=usage, busy_after_last_call=idle.to_json())
            wal.for_system(CHECKPOINTD).samples.append(
                sum(size for name, size in usage.items() if name.endswith("-wal")) / MIB)
            store.notes.append("checkpointd: " + ", ".join(f"{name} {size / MIB:.2f}" for name, size in
                                                           sorted(usage.items(), key=lambda item: -item[1])[:4]
                                                           if not name.endswith(("-wal", "-shm"))) + " MiB")

        if self.git is not None:
            attempt(store.for_system(GIT), git_side)
        if self.run.wants(CHECKPOINTD):
            for result in (store, wal):
                if self.run.server is None:
                    result.for_system(CHECKPOINTD).error = "no server"
            if self.run.server is not None:
                attempt(store.for_system(CHECKPOINTD), checkpointd_side)

    def run_all(self) -> None:
        try:
            self.replay()
            self.rollbacks(next(result for result in self.run.results if result.name == "history_checkpoint"))
            self.store_sizes()
        finally:
            self.source.close()
            self.run.stop_server()


def data_dir_usage(data_dir: Path) -> dict[str, int]:
    """Bytes on disk under a data dir by top-level entry, SQLite's write-ahead logs ("-wal")
    and shared-memory files ("-shm") apart wherever they are."""
    usage: dict[str, int] = {}
    for entry in os.scandir(data_dir):
        if entry.is_dir(follow_symlinks=False):
            logs = [Path(directory, name) for directory, _, names in os.walk(entry.path) for name in names
                    if name.endswith(("-wal", "-shm"))]
            for log_file in logs:
                usage[str(log_file.relative_to(data_dir))] = os.lstat(log_file).st_blocks * 512
            usage[f"{entry.name}/"] = disk_usage_bytes(Path(entry.path)) - sum(
                usage[str(log_file.relative_to(data_dir))] for log_file in logs)
        else:
            usage[entry.name] = entry.stat(follow_symlinks=False).st_blocks * 512
    return usage


def latest(result: MetricResult) -> str:
    parts = []
    for system, series in result.series.items():
        if series.error:
            parts.append(f"{system} ERROR")
        elif series.samples:
            parts.append(f"{system} {series.samples[-1]:.1f} {result.unit} (median {median(series.samples):.1f})")
        if series.wrong:
            parts.append(f"{system} wrong x{len(series.wrong)}")
    return ", ".join(parts)


def open_source(run: Run, repository: str) -> SourceRepo:
    """A local repository is read in place; anything else is cloned (bare, whole history)."""
    if Path(repository).is_dir():
        return SourceRepo(Path(repository).resolve())
    clone = run.scratch / "source.git"
    log(f"[history] cloning {repository}")
    result = subprocess.run(["git", "clone", "--bare", "--quiet", repository, str(clone)], capture_output=True,
                            check=False)
    if result.returncode != 0:
        raise RuntimeError(f"cannot clone {repository!r}: {result.stderr.decode(errors='replace').strip()}")
    return SourceRepo(clone)


def choose_commits(source: SourceRepo, rev: str, count: int) -> tuple[list[str | None], str]:
    """The base (None: an empty workspace) then ``count`` commits to replay, and a warning when
    the history is shorter than asked (a shallow clone says so)."""
    history = source.first_parent_commits(rev, count + 1)
    if len(history) == count + 1:
        return history, ""
    if source.is_shallow():
        return history, (f"{source.path} is a shallow clone: only {len(history)} commits of {rev} are there, so "
                         f"{len(history) - 1} were replayed, not {count} (fetch with --unshallow, or name a full "
                         "clone or URL)")
    return [None, *history], (f"{rev} has only {len(history)} first-parent commits: all were replayed, from an "
                              "empty workspace")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m tests.bench history", description=__doc__.split("\n\n")[0])
    parser.add_argument("repository", nargs="?", default=str(REPO_ROOT),
                        help="a local repository (read in place) or a URL (cloned); default: this repository")
    parser.add_argument("--rev", default="HEAD", help="replay the first-parent history up to this (default HEAD)")
    parser.add_argument("--commits", type=int, default=200, help="commits to replay, a checkpoint after each "
                                                                 "(default 200: the last 200, on the tree before them)")
    parser.add_argument("--rollbacks", type=int, default=20,
                        help="rollbacks to random earlier checkpoints (default 20)")
    add_run_arguments(parser)
    arguments = parser.parse_args(argv)
    if arguments.commits < 1 or arguments.rollbacks < 0:
        parser.error("--commits must be at least 1 and --rollbacks at least 0")
    run = Run(RunOptions(**run_options(parser, arguments)))
    try:
        source = open_source(run, arguments.repository)
        if source.git("rev-parse", "--show-object-format").decode().strip() != "sha1":
            raise RuntimeError("only SHA-1 repositories can be replayed (blob ids are compared as SHA-1)")
        rev = source.git("rev-parse", "--verify", f"{arguments.rev}^{{commit}}").decode().strip()
        commits, warning = choose_commits(source, rev, arguments.commits)
        if len(commits) < 2:
            raise RuntimeError(f"nothing to replay: {arguments.rev} has no commit before it here")
    except RuntimeError as failure:
        run.close()
        parser.error(str(failure))
    if warning:
        log(f"[history] WARNING: {warning}")
    name = Path(arguments.repository.rstrip("/")).name.removesuffix(".git") or "repository"
    run.workspace_facts["history"] = {"repository": arguments.repository, "rev": rev, "base": commits[0],
                                      "commits_replayed": len(commits) - 1, "warning": warning}
    log(f"[history] {name}: {len(commits) - 1} commits up to {rev[:12]}, {arguments.rollbacks} rollbacks; "
        f"scratch {run.scratch}")
    bench = HistoryBench(run, source, commits, name, arguments.rollbacks)
    footer = ("Checkpoints: one per replayed commit (checkpointd: one gRPC call; git: add -A + commit). Rollbacks: "
              "to seeded random earlier checkpoints (checkpointd: one Rollback call, its safety checkpoint included; "
              "git: restore --worktree + clean -fd), each verified against the commit's tree; wrong ones are not "
              "timed, but counted.")
    if warning:
        footer += f"\nWARNING: {warning}."
    return execute(run, [bench.run_all], ["history", *argv], footer)


if __name__ == "__main__":
    raise SystemExit(main())
