"""checkpointd benchmark (issue 4): checkpointd through gRPC side by side with a shadow-git
baseline on the same deterministic synthetic workspaces, median of repeated runs.

    .venv/bin/python -m tests.bench --quick
    .venv/bin/python -m tests.bench --sizes 1000,10000,100000 --repeat 5
    .venv/bin/python tests/bench/run.py --sizes 200 --repeat 1 --store-checkpoints 20

Prints a table and writes bench-results/bench-<UTC time>.json. Each system works on its own
copy of the workspace (same seed, same edits). A sample only counts when the result is right:
rollbacks are checked against a full content digest of the tree, captures against the file
count and tree identity. Exit status 1 when a checkpointd result was wrong or failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

import grpc  # noqa: E402
from ulid import ULID  # noqa: E402

from tests.bench.checkpointd_driver import CheckpointdClient, CheckpointdServer, ServerProcess  # noqa: E402
from tests.bench.floor_server import FloorServer  # noqa: E402
from tests.bench.load import STATE, WARMED_UP  # noqa: E402
from tests.bench.measure import (  # noqa: E402
    apparent_size_bytes,
    children_by_parent,
    cpu_times,
    median,
    percentile,
    process_tree_cpu_seconds,
    steal_fraction,
)
from tests.bench.shadow_git import ShadowGit  # noqa: E402
from tests.bench.workspace_gen import (  # noqa: E402
    GeneratedWorkspace,
    WorkspaceEditor,
    describe_difference,
    generate_workspace,
    tree_entries,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTD = "checkpointd"
GIT = "git"
SYSTEMS = (CHECKPOINTD, GIT)
#: The do-nothing grpcio server (floor_server): what no Python gRPC server can go below here.
FLOOR = "grpcio floor"
FLOOR_LATENCY_SAMPLES = 11
METRICS = ("first", "incremental", "no_change", "rollback", "store", "throughput")
ROLLBACK_EDIT_KINDS = ("modify", "add", "delete")
BACKGROUND_STALL_LIMIT_SECONDS = 1.0
MIB = 1024 * 1024
BUSY_LOAD_PER_CPU = 0.5
#: Above this share of CPU time taken by the hypervisor (steal), a run is flagged as slowed.
STEAL_WARNING_FRACTION = 0.05

T = TypeVar("T")


_LOAD_SEEN: list[float] = []
_OTHER_BENCHES_SEEN: dict[int, str] = {}


def _note_other_benchmarks() -> None:
    """Remembers other benchmark processes running beside this one (not its own servers, nor the
    command that started it): they skew every figure."""
    ours = {os.getpid(), os.getppid(), *children_by_parent().get(os.getpid(), ())}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if "python" in command and ("tests.bench" in command or "tests/bench/" in command):
            _OTHER_BENCHES_SEEN[int(entry.name)] = command[:200]


def log(message: str) -> None:
    """Progress to stderr; also samples the machine's load and other benchmark runs."""
    _LOAD_SEEN.append(os.getloadavg()[0])
    _note_other_benchmarks()
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Series:
    """One system's samples of one metric. Wrong results are kept apart and never counted."""

    unit: str
    samples: list[float] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: bool = False
    background: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float | None:
        return median(self.samples)

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "median": self.value, "samples": [round(s, 4) for s in self.samples],
                "wrong": self.wrong, "error": self.error, "skipped": self.skipped,
                "background": self.background, **self.extra}


@dataclass
class MetricResult:
    name: str
    label: str
    size: str
    unit: str
    series: dict[str, Series] = field(default_factory=dict)
    #: Scenario-specific facts shown in the table's notes (e.g. files changed per rollback).
    notes: list[str] = field(default_factory=list)

    def for_system(self, system: str) -> Series:
        return self.series.setdefault(system, Series(self.unit))

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.name, "label": self.label, "size": self.size, "unit": self.unit, "notes": self.notes,
                "systems": {name: series.to_json() for name, series in self.series.items()}}


def attempt(series: Series, action: Callable[[], T]) -> T | None:
    """Runs one step of one system; a failure marks the series failed and skips the rest of it."""
    if series.error is not None or series.skipped:
        return None
    try:
        return action()
    except grpc.RpcError as failure:
        series.error = f"{failure.code().name}: {failure.details()}"
    except (RuntimeError, OSError, subprocess.SubprocessError) as failure:
        series.error = f"{type(failure).__name__}: {failure}"
    log(f"FAILED: {series.error}")
    return None


@dataclass
class RunOptions:
    """What every scenario's Run needs (this module's, history.py's, scale.py's)."""

    systems: tuple[str, ...]
    seed: int
    root: Path
    results_dir: Path
    checkpointd: Path
    keep: bool
    settle_seconds: float


@dataclass
class Options(RunOptions):
    sizes: list[int]
    repeat: int
    first_repeat: int
    store_files: int
    store_checkpoints: int
    throughput_clients: list[int]
    throughput_requests: int
    metrics: tuple[str, ...]


def closed_list(parser: argparse.ArgumentParser, text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A comma-separated choice from a closed vocabulary; anything else is refused by name."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        parser.error(f"unknown {what} {unknown or text!r}; choose from {', '.join(allowed)}")
    return names


def add_run_arguments(parser: argparse.ArgumentParser, systems: bool = True) -> None:
    """The flags every scenario shares (see RunOptions); ``systems`` false: checkpointd alone."""
    if systems:
        parser.add_argument("--systems", default=",".join(SYSTEMS),
                            help=f"which systems to run, comma-separated from {','.join(SYSTEMS)}")
    parser.add_argument("--seed", type=int, default=1, help="workspace and edit seed (default 1)")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()),
                        help="directory under which the run's workspaces and stores are made (default: TMPDIR)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench-results",
                        help="where the JSON result goes (default bench-results/)")
    parser.add_argument("--checkpointd", type=Path, default=REPO_ROOT / ".venv" / "bin" / "checkpointd",
                        help="the checkpointd executable (default .venv/bin/checkpointd)")
    parser.add_argument("--keep", action="store_true", help="keep workspaces, stores and server logs")
    parser.add_argument("--settle-ms", type=float, default=50.0,
                        help="pause between repeats, outside any timing (default 50)")


def run_options(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> dict[str, Any]:
    """The RunOptions fields from the shared flags, checked."""
    systems = closed_list(parser, getattr(arguments, "systems", CHECKPOINTD), SYSTEMS, "system")
    if CHECKPOINTD in systems and not arguments.checkpointd.exists():
        parser.error(f"{arguments.checkpointd} does not exist (run `make install`, or pass --systems git)")
    return {"systems": systems, "seed": arguments.seed, "root": arguments.root.resolve(),
            "results_dir": arguments.results_dir.resolve(), "checkpointd": arguments.checkpointd,
            "keep": arguments.keep, "settle_seconds": arguments.settle_ms / 1000}


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.split("\n\n")[0],
                                     epilog="Other scenarios: `python -m tests.bench history --help` (real edit "
                                            "histories), `python -m tests.bench scale --help` (1M files, one huge "
                                            "directory).")
    parser.add_argument("--quick", action="store_true",
                        help="1k+10k files, 3 repeats, 1 first-checkpoint repeat, store at 1k files x 200 "
                             "checkpoints, 1000 throughput calls per round (explicit flags still win)")
    parser.add_argument("--sizes", help="comma-separated tracked file counts (default 1000,10000,100000)")
    parser.add_argument("--repeat", type=int, help="samples per metric and size; the median is reported (default 5)")
    parser.add_argument("--first-repeat", type=int, help="samples of the first checkpoint (default: --repeat)")
    parser.add_argument("--store-files", type=int, help="workspace size of the store-size run (default 10000)")
    parser.add_argument("--store-checkpoints", type=int,
                        help="one-file-change checkpoints in the store-size run (default 1000)")
    parser.add_argument("--throughput-clients", default="4,16,64",
                        help="comma-separated concurrencies of the throughput sweep, one row each (default 4,16,64)")
    parser.add_argument("--throughput-requests", type=int,
                        help="state-only CreateCheckpoint calls per round, split evenly across the clients "
                             "(default 2000)")
    parser.add_argument("--metrics", default=",".join(METRICS),
                        help=f"which metrics to run, comma-separated from {','.join(METRICS)}; the first "
                             "checkpoint runs whenever a per-size metric does, the others build on it")
    add_run_arguments(parser)
    arguments = parser.parse_args(argv)

    def chosen(value: int | None, quick: int, full: int) -> int:
        return value if value is not None else (quick if arguments.quick else full)

    sizes_text = arguments.sizes or ("1000,10000" if arguments.quick else "1000,10000,100000")
    try:
        sizes = [int(size.replace("_", "")) for size in sizes_text.split(",") if size.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {sizes_text!r}")
    try:
        throughput_clients = [int(count) for count in arguments.throughput_clients.split(",") if count.strip()]
    except ValueError:
        throughput_clients = []
    if not throughput_clients or min(throughput_clients) < 1:
        parser.error(f"--throughput-clients must be comma-separated positive integers, "
                     f"got {arguments.throughput_clients!r}")
    repeat = chosen(arguments.repeat, 3, 5)
    options = Options(
        sizes=sizes, repeat=repeat, first_repeat=chosen(arguments.first_repeat, 1, repeat),
        store_files=chosen(arguments.store_files, 1000, 10000),
        store_checkpoints=chosen(arguments.store_checkpoints, 200, 1000),
        throughput_clients=list(dict.fromkeys(throughput_clients)),
        throughput_requests=chosen(arguments.throughput_requests, 1000, 2000),
        metrics=closed_list(parser, arguments.metrics, METRICS, "metric"), **run_options(parser, arguments))
    for name in ("repeat", "first_repeat", "store_files", "store_checkpoints", "throughput_requests"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(size < 10 for size in options.sizes) or options.store_files < 10:
        parser.error("workspace sizes must be at least 10 files")
    return options


class Run:
    """One benchmark run: its scratch directories, results, and the live checkpointd server."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        options.root.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="checkpointd-bench-", dir=options.root))
        self.workspaces = self.scratch / "workspaces"
        self.stores = self.scratch / "stores"
        self.workspaces.mkdir()
        self.stores.mkdir()
        self.results: list[MetricResult] = []
        self.workspace_facts: dict[str, Any] = {}
        self.server: CheckpointdServer | None = None
        self.client: CheckpointdClient | None = None
        self._server_count = 0
        self._deletions: list[subprocess.Popen[bytes]] = []
        self.started = datetime.now(UTC)
        self.load_at_start = list(os.getloadavg())
        self.cpu_times_at_start = cpu_times()

    def wants(self, system: str) -> bool:
        return system in self.options.systems

    def new_result(self, name: str, label: str, size: str, unit: str) -> MetricResult:
        result = MetricResult(name, label, size, unit)
        for system in SYSTEMS:
            result.for_system(system).skipped = not self.wants(system)
        self.results.append(result)
        return result

    def settle(self) -> None:
        time.sleep(self.options.settle_seconds)

    @staticmethod
    def flush_disk() -> None:
        """Writes back every dirty page before a timed step (outside its timing): git writes its
        objects and index without syncing, and their write-back would otherwise run during the
        next step, into whose fsyncs (checkpointd makes one or two per checkpoint) it queues."""
        os.sync()

    def fresh_server(self) -> CheckpointdServer:
        """Stops the current server (dropping its store) and starts one on an empty data dir."""
        self.stop_server()
        self._server_count += 1
        server = CheckpointdServer(self.options.checkpointd, self.stores / f"checkpointd-{self._server_count}",
                                   self.workspaces, self.scratch / f"checkpointd-{self._server_count}.log")
        self.server = server
        server.start()
        self.client = CheckpointdClient(server.target)
        return server

    def quiet_server_before_git(self, series: Series) -> None:
        """Lets work the server does after answering end before git is timed, so git never
        pays for it; how long that took is kept with git's series."""
        if self.server is not None:
            busy = self.server.wait_for_idle(quiet_seconds=0.2)
            series.extra.setdefault("waited_for_busy_checkpointd_seconds", []).append(round(busy.seconds, 3))

    def stop_server(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            self.server.stop()
            if self.options.keep:
                log(f"kept checkpointd data dir {self.server.data_dir}")
            else:
                shutil.rmtree(self.server.data_dir, ignore_errors=True)
            self.server = None

    def generate_pair(self, file_count: int, label: str) -> dict[str, GeneratedWorkspace]:
        """Generates one workspace per system (same seed), then waits for background deletions so
        that nothing but the measured systems works on the disk afterwards."""
        started = time.perf_counter()
        pair = {system: generate_workspace(self.workspaces / f"{label}-{system}", file_count, self.options.seed)
                for system in self.options.systems}
        self.wait_for_deletions()
        some = next(iter(pair.values()))
        log(f"generated {len(pair)} workspace(s) of {file_count} tracked ({some.tracked_bytes / MIB:.0f} MiB) + "
            f"{some.ignored_file_count} ignored ({some.ignored_bytes / MIB:.0f} MiB) files "
            f"in {time.perf_counter() - started:.1f} s")
        return pair

    def discard(self, *paths: Path, background: bool = False) -> None:
        """Deletes scratch trees (unless --keep). In the background only where a workspace
        generation, which waits for it, comes next: deleting 100k files takes a while here."""
        if self.options.keep:
            return
        for path in paths:
            if background:
                self._deletions.append(subprocess.Popen(["rm", "-rf", "--", str(path)]))
            else:
                shutil.rmtree(path, ignore_errors=True)

    def wait_for_deletions(self) -> None:
        """Waits for background deletions, then for the kernel to write back every dirty page
        (theirs, a just-generated workspace's), so that the next phase's fsyncs and reads do not
        queue behind write-back that neither measured system caused."""
        for deletion in self._deletions:
            deletion.wait()
        self._deletions.clear()
        self.flush_disk()

    def close(self) -> None:
        self.stop_server()
        self.wait_for_deletions()
        if self.options.keep:
            log(f"kept scratch directory {self.scratch}")
        else:
            shutil.rmtree(self.scratch, ignore_errors=True)


def size_label(file_count: int) -> str:
    if file_count >= 1_000_000 and file_count % 1_000_000 == 0:
        return f"{file_count // 1_000_000}M"
    return f"{file_count // 1000}k" if file_count % 1000 == 0 and file_count >= 1000 else str(file_count)


class SizeBench:
    """All per-size metrics for one workspace size, both systems interleaved per repeat."""

    def __init__(self, run: Run, file_count: int) -> None:
        self.run = run
        self.options = run.options
        self.file_count = file_count
        self.label = size_label(file_count)
        self.workspaces = run.generate_pair(file_count, self.label)
        self.editors = {system: WorkspaceEditor(workspace, self.options.seed)
                        for system, workspace in self.workspaces.items()}
        self.git: ShadowGit | None = None
        self.plan_id = ""
        self.last_tree: dict[str, str] = {}
        run.workspace_facts[self.label] = {
            "tracked_files": file_count, "ignored_files": next(iter(self.workspaces.values())).ignored_file_count,
            "tracked_bytes": next(iter(self.workspaces.values())).tracked_bytes,
            "ignored_bytes": next(iter(self.workspaces.values())).ignored_bytes}

    def workspace(self, system: str) -> Path:
        return self.workspaces[system].path

    # ----- first checkpoint -------------------------------------------------------------------------------

    def first_checkpoint(self) -> None:
        timing = self.run.new_result("first", "first checkpoint", self.label, "ms")
        stall = self.run.new_result("first_background", "background work after first checkpoint", self.label, "s")
        for repeat in range(self.options.first_repeat):
            if self.run.wants(GIT):
                attempt(timing.for_system(GIT), lambda repeat=repeat: self._first_git(repeat, timing, stall))
            if self.run.wants(CHECKPOINTD):
                attempt(timing.for_system(CHECKPOINTD), lambda: self._first_checkpointd(timing, stall))
            log(f"[{self.label}] first checkpoint #{repeat + 1}: " + self._latest(timing))
        for system in SYSTEMS:
            if timing.for_system(system).error:
                stall.for_system(system).error = "first checkpoint failed"

    def _first_git(self, repeat: int, timing: MetricResult, stall: MetricResult) -> None:
        if self.git is not None:
            self.run.discard(self.git.git_dir)
        self.git = ShadowGit(self.workspace(GIT), self.run.stores / f"git-{self.label}-{repeat}")
        self.git.init()
        os.sync()
        commit, tree, seconds = self.git.checkpoint("first")
        background = self.git.wait_for_background()
        self.last_tree[GIT] = tree
        captured = self.git.tracked_file_count(commit)
        series = timing.for_system(GIT)
        if captured != self.file_count:
            series.wrong.append(f"captured {captured} files, expected {self.file_count}")
        else:
            series.samples.append(seconds * 1000)
        stall.for_system(GIT).samples.append(background.seconds)
        stall.for_system(GIT).background.append(background.to_json())

    def _first_checkpointd(self, timing: MetricResult, stall: MetricResult) -> None:
        server = self.run.fresh_server()
        self.plan_id = str(ULID())
        os.sync()
        checkpoint, seconds = self.run.client.checkpoint(self.plan_id, self.workspace(CHECKPOINTD), "first")
        background = server.wait_for_idle()
        self.last_tree[CHECKPOINTD] = checkpoint.tree_digest
        series = timing.for_system(CHECKPOINTD)
        if checkpoint.file_count != self.file_count or not checkpoint.has_files:
            series.wrong.append(f"captured {checkpoint.file_count} files (has_files={checkpoint.has_files}), "
                                f"expected {self.file_count}")
        else:
            series.samples.append(seconds * 1000)
        stall.for_system(CHECKPOINTD).samples.append(background.seconds)
        stall.for_system(CHECKPOINTD).background.append(background.to_json())

    # ----- incremental and no-change checkpoints -----------------------------------------------------------

    def repeated_checkpoints(self, name: str, label: str, edit: bool) -> None:
        result = self.run.new_result(name, label, self.label, "ms")
        cpu_before = self._server_cpu()
        for repeat in range(self.options.repeat):
            for system in self._ready_systems(result):
                series = result.for_system(system)
                attempt(series, lambda system=system, series=series: self._one_checkpoint(system, series, edit))
            log(f"[{self.label}] {label} #{repeat + 1}: " + self._latest(result))
            self.run.settle()
        self._note_server_cpu(result, cpu_before, self.options.repeat)

    def _one_checkpoint(self, system: str, series: Series, edit: bool) -> None:
        if edit:
            self.editors[system].modify()
        if system == GIT:
            self.run.quiet_server_before_git(series)
            self.run.flush_disk()
            _, tree, seconds = self.git.checkpoint("step")
            background = self.git.wait_for_background()
            if background.seconds:
                series.background.append(background.to_json())
        else:
            self.run.flush_disk()
            checkpoint, seconds = self.run.client.checkpoint(self.plan_id, self.workspace(CHECKPOINTD), "step")
            tree = checkpoint.tree_digest
        changed = tree != self.last_tree.get(system)
        self.last_tree[system] = tree
        if changed != edit:
            series.wrong.append("tree identity unchanged after an edit" if edit
                                else "tree identity changed without an edit")
        else:
            series.samples.append(seconds * 1000)

    # ----- rollback -----------------------------------------------------------------------------------------

    def rollback(self) -> None:
        result = self.run.new_result("rollback", "rollback of a 1-file delta", self.label, "ms")
        targets: dict[str, tuple[str, dict[str, str]]] = {}
        for system in self._ready_systems(result):
            series = result.for_system(system)
            target = attempt(series, lambda system=system: self._rollback_target(system))
            if target is not None:
                targets[system] = target
        if len(targets) == 2 and targets[GIT][1] != targets[CHECKPOINTD][1]:
            log(f"[{self.label}] note: the two workspaces differ before rollback: "
                f"{describe_difference(targets[GIT][1], targets[CHECKPOINTD][1])}")
        cpu_before = self._server_cpu()
        for repeat in range(self.options.repeat):
            kind = ROLLBACK_EDIT_KINDS[repeat % len(ROLLBACK_EDIT_KINDS)]
            for system, (target_id, expected) in targets.items():
                series = result.for_system(system)
                attempt(series, lambda system=system, series=series, kind=kind, target_id=target_id,
                        expected=expected: self._one_rollback(system, series, kind, target_id, expected))
            log(f"[{self.label}] rollback ({kind}) #{repeat + 1}: " + self._latest(result))
            self.run.settle()
        self._note_server_cpu(result, cpu_before, self.options.repeat)

    def _rollback_target(self, system: str) -> tuple[str, dict[str, str]]:
        if system == GIT:
            target_id, _, _ = self.git.checkpoint("rollback target")
            self.git.wait_for_background()
        else:
            checkpoint, _ = self.run.client.checkpoint(self.plan_id, self.workspace(CHECKPOINTD), "rollback target")
            target_id = checkpoint.checkpoint_id
        return target_id, tree_entries(self.workspace(system))

    def _one_rollback(self, system: str, series: Series, kind: str, target_id: str,
                      expected: dict[str, str]) -> None:
        delta = self.editors[system].apply(kind)
        if system == GIT:
            self.git.checkpoint("after edit")
            self.git.wait_for_background()
            self.run.quiet_server_before_git(series)
            self.run.flush_disk()
            seconds = self.git.restore(target_id)
        else:
            self.run.client.checkpoint(self.plan_id, self.workspace(CHECKPOINTD), "after edit")
            self.run.flush_disk()
            reply, seconds = self.run.client.rollback(self.plan_id, target_id)
            series.extra.setdefault("reported_changes", []).append(len(reply.changes))
        self.editors[system].rolled_back(delta)
        actual = tree_entries(self.workspace(system))
        if actual == expected:
            series.samples.append(seconds * 1000)
            return
        difference = describe_difference(expected, actual)
        series.wrong.append(f"{kind} {delta.path}: {difference}")
        log(f"[{self.label}] WRONG {system} rollback after {kind} of {delta.path}: {difference}")
        if system != GIT:
            raise RuntimeError("checkpointd rollback left a wrong tree; its later samples are skipped")
        self.git.repair(target_id)
        repaired = tree_entries(self.workspace(GIT))
        if repaired != expected:
            raise RuntimeError(f"could not repair the git workspace: {describe_difference(expected, repaired)}")

    # ----- helpers -----------------------------------------------------------------------------------------

    def _ready_systems(self, result: MetricResult) -> list[str]:
        """Systems whose first checkpoint exists; the others get this metric marked failed."""
        ready = []
        for system in self.options.systems:
            has_base = (self.git is not None) if system == GIT else bool(self.plan_id and self.run.client)
            if has_base:
                ready.append(system)
            else:
                result.for_system(system).error = "no first checkpoint to build on"
        return ready

    def _server_cpu(self) -> float | None:
        return process_tree_cpu_seconds(self.run.server.pid) if self.run.server else None

    def _note_server_cpu(self, result: MetricResult, before: float | None, operations: int) -> None:
        if before is None or self.run.server is None:
            return
        idle = self.run.server.wait_for_idle()
        spent = process_tree_cpu_seconds(self.run.server.pid) - before
        result.for_system(CHECKPOINTD).extra["server_cpu_ms_per_operation"] = round(spent * 1000 / operations, 2)
        result.for_system(CHECKPOINTD).extra["busy_after_last_call"] = idle.to_json()

    @staticmethod
    def _latest(result: MetricResult) -> str:
        parts = []
        for system, series in result.series.items():
            if series.skipped:
                continue
            if series.error:
                parts.append(f"{system} ERROR")
            elif series.samples:
                parts.append(f"{system} {series.samples[-1]:.1f} {result.unit}")
            if series.wrong:
                parts.append(f"{system} wrong x{len(series.wrong)}")
        return ", ".join(parts)

    def close(self) -> None:
        self.run.stop_server()
        paths = [workspace.path for workspace in self.workspaces.values()]
        self.run.discard(*paths, *([self.git.git_dir] if self.git else []), background=True)

    def run_all(self) -> None:
        metrics = self.options.metrics
        try:
            self.first_checkpoint()
            if "incremental" in metrics:
                self.repeated_checkpoints("incremental", "incremental checkpoint, 1 file changed", edit=True)
            if "no_change" in metrics:
                self.repeated_checkpoints("no_change", "no-change checkpoint", edit=False)
            if "rollback" in metrics:
                self.rollback()
        finally:
            self.close()


def bench_store(run: Run) -> None:
    """Store size after N one-file-change checkpoints: checkpointd's data dir as it stands vs the
    shadow .git after a plain ``git gc``."""
    options = run.options
    count = options.store_checkpoints
    label = size_label(options.store_files)
    result = run.new_result("store", f"store size after {count} one-file-change checkpoints", label, "MiB")
    workspaces = run.generate_pair(options.store_files, f"store-{label}")
    editors = {system: WorkspaceEditor(workspace, options.seed + 1) for system, workspace in workspaces.items()}

    def git_side() -> None:
        git = ShadowGit(workspaces[GIT].path, run.stores / f"git-store-{label}")
        git.init()
        git.checkpoint("first")
        background_seconds = git.wait_for_background().seconds
        timings = []
        for index in range(count):
            editors[GIT].modify()
            timings.append(git.checkpoint(f"step {index}")[2] * 1000)
            background_seconds += git.wait_for_background().seconds
        before_gc = git.size_bytes()
        git.gc()
        series = result.for_system(GIT)
        series.samples.append(git.size_bytes() / MIB)
        series.extra.update({"bytes_after_gc": git.size_bytes(), "bytes_before_gc": before_gc,
                             "median_checkpoint_ms": median(timings), "background_seconds": background_seconds})
        run.discard(git.git_dir)

    def checkpointd_side() -> None:
        server = run.fresh_server()
        plan_id = str(ULID())
        run.client.checkpoint(plan_id, workspaces[CHECKPOINTD].path, "first")
        timings = []
        for index in range(count):
            editors[CHECKPOINTD].modify()
            timings.append(run.client.checkpoint(plan_id, workspaces[CHECKPOINTD].path, f"step {index}")[1] * 1000)
        idle = server.wait_for_idle()
        live = server.store_size_bytes()
        series = result.for_system(CHECKPOINTD)
        series.samples.append(live / MIB)
        series.extra.update({"bytes_live_idle": live, "apparent_bytes": apparent_size_bytes(server.data_dir),
                             "median_checkpoint_ms": median(timings), "busy_after_last_call": idle.to_json()})
        server.stop()
        series.extra["bytes_after_clean_stop"] = server.store_size_bytes()

    log(f"[store] {count} one-file-change checkpoints on {label} files per system")
    if run.wants(GIT):
        attempt(result.for_system(GIT), git_side)
    if run.wants(CHECKPOINTD):
        attempt(result.for_system(CHECKPOINTD), checkpointd_side)
    run.stop_server()
    run.discard(*(workspace.path for workspace in workspaces.values()), background=True)
    log(f"[store] {SizeBench._latest(result)}")


def bench_throughput(run: Run) -> None:
    """State-only CreateCheckpoint calls per second at each concurrency of the sweep, the load coming from a
    process of its own (load.py: concurrent grpc.aio clients, each on its own channel and plan, no
    workspace_root); the same load against the do-nothing floor server in alternate rounds, and that server's
    latency after an idle second (see floor_server). One checkpointd server serves the whole phase."""
    options = run.options
    results: dict[int, MetricResult] = {}
    for clients in options.throughput_clients:
        result = run.new_result("throughput", f"state-only CreateCheckpoint, {clients} clients", "-", "per s")
        result.for_system(GIT).skipped = True
        results[clients] = result
    if not run.wants(CHECKPOINTD):
        return
    first_row = next(iter(results.values()))
    run.wait_for_deletions()

    def one_round(server: ServerProcess, measured: Series, clients: int) -> None:
        """One run of the load process; the server's CPU time is read around its timed part only."""
        calls_per_client = max(1, options.throughput_requests // clients)
        command = [sys.executable, "-m", "tests.bench.load", server.target, str(clients), str(calls_per_client),
                   "--wait-for-go"]
        server_cpu = 0.0
        with subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) as load:
            line = load.stdout.readline()
            if line.strip() == WARMED_UP:
                server_cpu_before = process_tree_cpu_seconds(server.pid)
                load.stdin.write("go\n")
                load.stdin.flush()
                line = load.stdout.readline()
                server_cpu = process_tree_cpu_seconds(server.pid) - server_cpu_before
        report = json.loads(line) if line.strip() else {}
        if load.returncode != 0 or not report.get("calls"):
            failures = report.get("failures") or ["no report (its stderr is above)"]
            raise RuntimeError(f"the load process exited with {load.returncode}, first failure: {failures[0]}")
        seconds = report["seconds"]
        measured.extra.setdefault("client_cpu_cores", []).append(round(report["client_cpu_seconds"] / seconds, 2))
        measured.extra.setdefault("server_cpu_cores", []).append(round(server_cpu / seconds, 2))
        measured.extra.update(clients=clients, calls_per_round=report["calls"])
        measured.samples.append(report["calls"] / seconds)

    def idle_latency(target: str) -> None:
        with CheckpointdClient(target) as client:
            plan = str(ULID())
            client.checkpoint(plan, None, "warm-up", STATE)
            for _ in range(FLOOR_LATENCY_SAMPLES):
                time.sleep(1.0)
                first_row.for_system(FLOOR).extra.setdefault("idle_call_ms", []).append(
                    round(client.checkpoint(plan, None, "idle", STATE)[1] * 1000, 3))

    server = attempt(first_row.for_system(CHECKPOINTD), run.fresh_server)
    if server is None:
        for result in results.values():
            result.for_system(CHECKPOINTD).error = first_row.for_system(CHECKPOINTD).error
        return
    with FloorServer(run.scratch / "floor-server.log") as floor:
        for repeat in range(options.repeat):
            for clients, result in results.items():
                rounds = [(server, result.for_system(CHECKPOINTD)), (floor, result.for_system(FLOOR))]
                for loaded, measured in rounds if repeat % 2 == 0 else reversed(rounds):
                    attempt(measured, lambda loaded=loaded, measured=measured, clients=clients:
                            one_round(loaded, measured, clients))
                log(f"[throughput] {clients} clients #{repeat + 1}: {SizeBench._latest(result)}")
        attempt(first_row.for_system(FLOOR), lambda: idle_latency(floor.target))
    run.stop_server()


# ----- report ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Goal:
    text: str
    met: Callable[[float, float | None], bool]
    #: Judged against git's figure: unjudged ("—") when git did not run.
    relative: bool = False


_GOALS: dict[str, dict[str | None, Goal]] = {
    "first": {"100k": Goal("≤ 8 s", lambda value, _git: value <= 8000)},
    "first_background": {"100k": Goal(f"no stall (≤ {BACKGROUND_STALL_LIMIT_SECONDS:g} s busy)",
                                      lambda value, _git: value <= BACKGROUND_STALL_LIMIT_SECONDS)},
    "incremental": {"10k": Goal("≤ 5 ms", lambda value, _git: value <= 5),
                    "100k": Goal("≤ 5 ms", lambda value, _git: value <= 5)},
    "no_change": {"100k": Goal("≤ 3 ms", lambda value, _git: value <= 3)},
    "rollback": {"100k": Goal("≤ 10 ms", lambda value, _git: value <= 10)},
    "store": {None: Goal("≤ 1.5× git", lambda value, git: git is not None and value <= 1.5 * git, relative=True)},
    "throughput": {None: Goal("≥ 2,000/s", lambda value, _git: value >= 2000)},
    # Real edit histories (history.py) and large workspaces (scale.py), issue 21.
    "history_checkpoint": {None: Goal("≥ 4× faster than git", lambda value, git: git is not None and git >= 4 * value,
                                      relative=True)},
    "history_rollback": {None: Goal("≥ 2× faster than git", lambda value, git: git is not None and git >= 2 * value,
                                    relative=True)},
    "history_wrong": {None: Goal("0", lambda value, _git: value == 0)},
    "history_store": {None: Goal("≤ 1.0× git gc", lambda value, git: git is not None and value <= git, relative=True)},
    "scale_first": {"1M": Goal("≤ 60 s", lambda value, _git: value <= 60_000)},
    "scale_incremental": {"1M": Goal("≤ 10 ms", lambda value, _git: value <= 10),
                          "200k in 1 dir": Goal("≤ 20 ms", lambda value, _git: value <= 20)},
    "scale_rss": {"1M": Goal("≤ 1.5 GiB", lambda value, _git: value <= 1536)},
}


def _goal_for(result: MetricResult) -> Goal | None:
    goals = _GOALS.get(result.name, {})
    return goals.get(result.size, goals.get(None))


def _cell(series: Series, unit: str) -> str:
    if series.skipped:
        return "—" if unit == "per s" and not series.samples and series.error is None else "skipped"
    if series.error:
        return "ERROR"
    value = series.value
    if value is None:
        return "WRONG" if series.wrong else "n/a"
    if unit == "s" or (unit == "ms" and value >= 10_000):
        text = f"{value if unit == 's' else value / 1000:.2f} s"
    elif unit == "MiB":
        text = f"{value:.2f} MiB" if value < 10 else f"{value:.1f} MiB"
    elif unit == "per s":
        text = f"{value:,.0f}/s"
    elif unit == "count":
        text = f"{value:,.0f}"
    else:
        text = f"{value:.1f} ms" if value < 100 else f"{value:,.0f} ms"
    return text


#: From this many samples on, a timing row's notes give the 90th percentile beside the median.
P90_MIN_SAMPLES = 10


def _notes(result: MetricResult) -> str:
    notes = []
    for system, series in result.series.items():
        if series.wrong:
            total = len(series.wrong) + len(series.samples)
            notes.append(f"{system} wrong {len(series.wrong)}/{total} (not counted)")
        if series.error:
            notes.append(f"{system} error: {series.error.splitlines()[0][:100]}")
    if result.unit == "ms":
        tails = [f"{system} {percentile(series.samples, 0.9):.1f} ms" for system, series in result.series.items()
                 if len(series.samples) >= P90_MIN_SAMPLES]
        if tails:
            notes.append("p90: " + ", ".join(tails))
    notes.extend(result.notes)
    extra = result.series.get(CHECKPOINTD, Series("")).extra
    if extra.get("server_cpu_cores"):
        # One Python process: what it can use of the machine's cores is the throughput's bound.
        notes.append(f"our server used {median(extra['server_cpu_cores']):.2f} cores")
    if extra.get("client_cpu_cores"):
        notes.append(f"client used {median(extra['client_cpu_cores']):.2f} cores")
    floor = result.series.get(FLOOR)
    ours = result.series[CHECKPOINTD].value
    if floor is not None and floor.value and ours:
        notes.append(f"a do-nothing grpcio server: {floor.value:,.0f}/s (ours {ours / floor.value:.0%} of it)")
        costs = [cost for cost in (_server_us_per_call(result.series[CHECKPOINTD]), _server_us_per_call(floor))
                 if cost is not None]
        if len(costs) == 2:
            notes.append(f"server CPU per call: ours {costs[0]:.0f} µs, the floor's {costs[1]:.0f} µs")
    return "; ".join(notes)


def _server_us_per_call(series: Series) -> float | None:
    """Median over rounds of the server's CPU time per call, from each round's cores and rate."""
    cores = series.extra.get("server_cpu_cores", [])
    if not cores or len(cores) != len(series.samples):
        return None
    return median(core / rate * 1e6 for core, rate in zip(cores, series.samples, strict=True))


def floor_summary(results: list[MetricResult]) -> str:
    """The floor line printed under the table, from the throughput phase's floor server."""
    floors = [floor for result in results if (floor := result.series.get(FLOOR)) is not None]
    rates = ", ".join(f"{floor.value:,.0f}/s from {floor.extra['clients']} clients" for floor in floors if floor.value)
    for floor in floors:
        if not floor.extra.get("idle_call_ms"):
            continue
        calls = floor.extra["idle_call_ms"]
        rate = f", and serves {rates} in the throughput rounds" if rates else ""
        return (f"Floor on this machine, this run: a do-nothing grpcio server (served as checkpointd is) answers "
                f"CreateCheckpoint in {median(calls):.2f} ms after an idle second (median of {len(calls)}, "
                f"{min(calls):.2f}-{max(calls):.2f}){rate}. Every checkpointd latency above includes such a call.")
    return ""


def table_rows(results: list[MetricResult]) -> list[dict[str, str]]:
    rows = []
    for result in results:
        ours, theirs = result.series[CHECKPOINTD], result.series[GIT]
        ratio = "—"
        if ours.value and theirs.value is not None and not (theirs.skipped or ours.error or theirs.error):
            ratio = f"{theirs.value / ours.value:.1f}×"
        goal = _goal_for(result)
        met = "—"
        if goal is not None and not ours.skipped and not (goal.relative and theirs.skipped):
            met = "yes" if (ours.value is not None and not ours.error and not ours.wrong
                            and goal.met(ours.value, theirs.value)) else "NO"
        rows.append({"size": result.size, "metric": result.label, "checkpointd": _cell(ours, result.unit),
                     "shadow git": _cell(theirs, result.unit), "git/checkpointd": ratio,
                     "goal": goal.text if goal else "—", "met": met, "notes": _notes(result)})
    return rows


def render_table(rows: list[dict[str, str]]) -> str:
    columns = ["size", "metric", "checkpointd", "shadow git", "git/checkpointd", "goal", "met", "notes"]
    widths = {column: max(len(column), *(len(row[column]) for row in rows)) for column in columns}
    lines = [" | ".join(column.ljust(widths[column]) for column in columns).rstrip(),
             "-+-".join("-" * widths[column] for column in columns)]
    lines += [" | ".join(row[column].ljust(widths[column]) for column in columns).rstrip() for row in rows]
    return "\n".join(lines)


def _command_output(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO_ROOT).stdout.strip()
    except OSError:
        return ""


def write_results(run: Run, rows: list[dict[str, str]], argv: list[str], complete: bool) -> Path:
    """Writes the JSON (and the table as text); also after each phase, so a long run that is
    stopped keeps what it measured (``complete`` false until the end). ``argv`` is the whole
    command line after ``-m tests.bench``; a scenario's name, its first word, prefixes the file."""
    options = run.options
    run.options.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = run.started.strftime("%Y%m%dT%H%M%SZ")
    scenario = f"{argv[0]}-" if argv and not argv[0].startswith("-") else ""
    path = options.results_dir / f"bench-{scenario}{stamp}.json"
    document = {
        "complete": complete, "started": run.started.isoformat(), "written": datetime.now(UTC).isoformat(),
        "command": [sys.executable, "-m", "tests.bench", *argv],
        "options": {key: str(value) if isinstance(value, Path) else value
                    for key, value in options.__dict__.items()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "git": _command_output("git", "--version"), "load_average_at_start": run.load_at_start,
                    "load_average_1min_max_seen": max(_LOAD_SEEN, default=None),
                    "other_benchmark_processes_seen": _OTHER_BENCHES_SEEN,
                    "load_average_at_end": list(os.getloadavg()),
                    "cpu_steal_fraction": round(steal_fraction(run.cpu_times_at_start), 4)},
        "repo_commit": _command_output("git", "rev-parse", "HEAD"),
        "repo_dirty": bool(_command_output("git", "status", "--porcelain", "--untracked-files=no")),
        "workspaces": run.workspace_facts,
        "results": [result.to_json() for result in run.results],
        "table": rows,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    path.with_suffix(".txt").write_text(render_table(rows) + "\n")
    return path


def checkpointd_failed(results: list[MetricResult]) -> bool:
    return any(result.series[CHECKPOINTD].error or result.series[CHECKPOINTD].wrong for result in results)


def execute(run: Run, phases: list[Callable[[], None]], argv: list[str], footer: str) -> int:
    """Runs a scenario's phases (writing the results after each), closes the run, prints the
    table, ``footer`` and warnings about a busy machine. Exit status 1 when a checkpointd
    call failed or gave a wrong result; unmet goals do not fail the run."""
    try:
        for phase in phases:
            phase()
            write_results(run, table_rows(run.results), argv, complete=False)
    finally:
        run.close()
    rows = table_rows(run.results)
    print(render_table(rows))
    floor = floor_summary(run.results)
    if floor:
        print(f"\n{floor}")
    path = write_results(run, rows, argv, complete=True)
    print(f"\nresults: {path}")
    print(footer)
    busiest = max(run.load_at_start[0], os.getloadavg()[0], *_LOAD_SEEN)
    if busiest > BUSY_LOAD_PER_CPU * (os.cpu_count() or 1):
        print(f"WARNING: the machine was busy (1-min load average up to {busiest:.1f} on {os.cpu_count()} CPUs); "
              "other work competed with both systems, so absolute figures are noisy.")
    for pid, command in _OTHER_BENCHES_SEEN.items():
        print(f"WARNING: another benchmark ran at the same time (pid {pid}: {command[:120]})")
    stolen = steal_fraction(run.cpu_times_at_start)
    if stolen > STEAL_WARNING_FRACTION:
        print(f"WARNING: the hypervisor gave {stolen:.0%} of this machine's CPU time to other guests during the run "
              "(steal): every figure is slower than this machine's own, git's as much as checkpointd's.")
    return 1 if checkpointd_failed(run.results) else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parse_options(argv)
    run = Run(options)
    log(f"scratch {run.scratch}; systems {','.join(options.systems)}; sizes {options.sizes}; "
        f"repeat {options.repeat}")
    phases: list[Callable[[], None]] = []
    if {"first", "incremental", "no_change", "rollback"} & set(options.metrics):
        phases += [lambda file_count=file_count: SizeBench(run, file_count).run_all() for file_count in options.sizes]
    if "store" in options.metrics:
        phases.append(lambda: bench_store(run))
    if "throughput" in options.metrics:
        phases.append(lambda: bench_throughput(run))
    return execute(run, phases, argv, "Medians of repeated runs, measured at the client (checkpointd: one gRPC "
                   "call; git: add+commit, restore+clean). Wrong results are excluded and noted.")


if __name__ == "__main__":
    raise SystemExit(main())
