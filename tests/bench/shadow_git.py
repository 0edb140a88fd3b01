"""The incumbent baseline: a shadow git repository beside the workspace, driven the way
Gemini CLI / Cline / Roo do it. GIT_DIR lives outside the workspace and GIT_WORK_TREE points
at it; a checkpoint is ``git add -A`` + ``git commit --allow-empty``; a restore is
``git restore --source <commit> --worktree -- .`` + ``git clean -fd``.

Each step spawns git exactly as those tools do (one process per command), so process start
costs count, as they do for them. Only the commands of a checkpoint or restore are timed;
reading the new commit id (``git rev-parse``) is left out of the timing, in git's favour.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from tests.bench.measure import BackgroundWork, disk_usage_bytes, process_cpu_seconds

#: path (relative, '/'-separated) -> (git mode such as "100644", object id).
TreeEntries = dict[str, tuple[str, str]]


def parse_ls_tree(output: bytes) -> TreeEntries:
    """Parses ``git ls-tree -r -z`` output ("<mode> <type> <id>\\t<path>\\0" records)."""
    entries: TreeEntries = {}
    for record in output.split(b"\0"):
        if record:
            header, path = record.split(b"\t", 1)
            mode, _, object_id = header.decode().split(" ")
            entries[os.fsdecode(path)] = (mode, object_id)
    return entries


_IDENTITY = ("-c", "user.name=checkpointd bench", "-c", "user.email=bench@checkpointd.invalid",
             "-c", "commit.gpgsign=false")


class ShadowGit:
    """One shadow repository for one workspace."""

    def __init__(self, work_tree: Path, git_dir: Path) -> None:
        self.work_tree = work_tree
        self.git_dir = git_dir
        empty_config = git_dir.parent / f"{git_dir.name}.gitconfig"
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(git_dir.parent),
            "LC_ALL": "C",
            "GIT_DIR": str(git_dir),
            "GIT_WORK_TREE": str(work_tree),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": str(empty_config),
        }
        self._empty_config = empty_config

    def _git(self, *arguments: str) -> str:
        return self._git_bytes(*arguments).decode(errors="surrogateescape")

    def _git_bytes(self, *arguments: str, stdin: bytes | None = None, also_fine: tuple[int, ...] = ()) -> bytes:
        result = subprocess.run(["git", *_IDENTITY, *arguments], cwd=self.work_tree, env=self._env,
                                input=stdin, capture_output=True, check=False)
        if result.returncode != 0 and result.returncode not in also_fine:
            raise RuntimeError(f"git {' '.join(arguments)} failed ({result.returncode}): "
                               f"{result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    def init(self) -> None:
        self._empty_config.write_text("")
        self.git_dir.mkdir(parents=True, exist_ok=False)
        self._git("init", "-q")

    def checkpoint(self, message: str) -> tuple[str, str, float]:
        """Records the whole work tree; returns (commit id, tree id, seconds spent in add + commit)."""
        start = time.perf_counter()
        self._git("add", "-A")
        self._git("commit", "--allow-empty", "-q", "-m", message)
        elapsed = time.perf_counter() - start
        commit, tree = self._git("rev-parse", "HEAD", "HEAD^{tree}").split()
        return commit, tree, elapsed

    def tracked_file_count(self, commit: str) -> int:
        return len(self._git("ls-tree", "-r", "--name-only", commit).splitlines())

    def tree(self, commit: str) -> TreeEntries:
        """What ``commit`` recorded: path -> (git mode, object id) of every file and symlink."""
        return parse_ls_tree(self._git_bytes("ls-tree", "-r", "-z", "--full-tree", commit))

    def ignored(self, paths: Iterable[str]) -> set[str]:
        """Those of ``paths`` (relative; a trailing '/' names a directory) that the work tree's
        .gitignore files exclude, as git itself decides (``check-ignore --no-index``): whether
        they exist or are tracked does not matter."""
        listed = "\0".join(paths)
        if not listed:
            return set()
        output = self._git_bytes("check-ignore", "--no-index", "--stdin", "-z", stdin=os.fsencode(listed),
                                 also_fine=(1,))  # 1: none of them is ignored
        return {os.fsdecode(path) for path in output.split(b"\0") if path}

    def restore(self, commit: str) -> float:
        """Puts the work tree back to ``commit``; returns the seconds it took."""
        start = time.perf_counter()
        self._git("restore", "--source", commit, "--worktree", "--", ".")
        self._git("clean", "-fd")
        return time.perf_counter() - start

    def repair(self, commit: str) -> None:
        """Forces the work tree to ``commit`` (index included) after a restore that went wrong,
        so later measurements start from the intended tree."""
        self._git("restore", "--source", commit, "--staged", "--worktree", "--", ".")
        self._git("clean", "-fd")

    def gc(self) -> None:
        """A plain ``git gc`` (not --aggressive), waited for."""
        self._git("gc", "-q")

    def size_bytes(self) -> int:
        return disk_usage_bytes(self.git_dir)

    def loose_object_count(self) -> int:
        counts = dict(line.split(": ", 1) for line in self._git("count-objects", "-v").splitlines())
        return int(counts["count"])

    def _background_pids(self) -> list[int]:
        """Live processes working on this repository that we did not wait for (a detached
        ``git gc --auto`` and its repack/prune children), found by their GIT_DIR."""
        needle = f"GIT_DIR={self.git_dir}".encode()
        pids = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as handle:
                    environment = handle.read().split(b"\0")
            except OSError:
                continue
            if needle in environment:
                pids.append(int(entry.name))
        return pids

    def wait_for_background(self, limit_seconds: float = 900.0) -> BackgroundWork:
        """Waits for git work detached by the last command (auto gc / repack) to finish; returns
        how long it ran after the command returned and the CPU it used (as last seen)."""
        start = time.perf_counter()
        cpu_seen: dict[int, float] = {}
        ran = False
        while time.perf_counter() - start < limit_seconds:
            pids = self._background_pids()
            if not pids:
                break
            ran = True
            for pid in pids:
                cpu = process_cpu_seconds(pid)
                if cpu is not None:
                    cpu_seen[pid] = cpu
            time.sleep(0.05)
        if not ran:
            return BackgroundWork(0.0, 0.0)
        return BackgroundWork(time.perf_counter() - start, sum(cpu_seen.values()))
