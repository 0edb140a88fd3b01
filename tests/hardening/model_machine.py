"""The state machine of the model-based test (tests/hardening/test_model.py says how it runs and
how a failure is replayed). ``Calls`` drives the servers through kills and pauses;
``ModelMachine`` holds the model and the rules."""

from __future__ import annotations

import os
import random
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.hardening import model_workspace as ws
from tests.hardening.model_cluster import SPLIT_ENTRIES, Cluster
from tests.hardening.support import GONE, exported
from tests.helpers import error_info

ENTRY_TYPES = {pb.ENTRY_TYPE_FILE: "file", pb.ENTRY_TYPE_SYMLINK: "symlink", pb.ENTRY_TYPE_DIRECTORY: "dir",
               pb.ENTRY_TYPE_UNSPECIFIED: ""}
#: Codes no call may ever get: a bug, whatever the input.
NEVER = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


@dataclass
class Ack:
    """An acknowledged checkpoint: what it must hold, and how it was made."""

    tree: ws.Tree
    rules: ws.Rules
    sequence: int
    state: bytes | None
    pinned: bool = False
    safety: bool = False
    #: The paths it reported as skipped (too large): a rollback to it keeps what is at or under them.
    skipped: frozenset[str] = frozenset()


def reported(changes) -> dict[str, ws.ChangeRow]:
    return {c.path: (pb.ChangeKind.Name(c.kind).removeprefix("CHANGE_KIND_"), ENTRY_TYPES[c.base_type],
                     ENTRY_TYPES[c.target_type], c.base_size_bytes, c.target_size_bytes, c.base_mode, c.target_mode)
            for c in changes}


def mismatch(got: dict, want: dict) -> str:
    keys = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
    return "\n".join(f"  {k}: got {str(got.get(k))[:160]} want {str(want.get(k))[:160]}" for k in keys[:20])


class Race:
    """A tool that writes into the workspace while a rollback is paused before its first change."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.path: str | None = None
        self.node: ws.Node | None = None

    def __call__(self) -> None:
        tree = ws.read_tree(self.root)
        files = sorted(p for p, n in tree.items() if n[0] == "file")
        how = self.rng.choice(["rewrite", "same-size-same-mtime", "create"])
        if how != "create" and files:
            self.path = self.rng.choice(files)
            if not tree[self.path][1]:
                how = "rewrite"  # an empty file has no other bytes of its length: that race would write nothing
            if how == "rewrite":
                ws.write_file(self.root, self.path, b"written while the rollback ran %d" % self.rng.getrandbits(32))
            else:
                ws.rewrite_same_size_same_mtime(self.root, self.path)
        else:
            dirs = [""] + sorted(p + "/" for p, n in tree.items() if n[0] == "dir")
            self.path = f"{self.rng.choice(dirs)}raced-{self.rng.getrandbits(16)}.txt"
            ws.write_file(self.root, self.path, b"created while the rollback ran")
        self.node = ws.read_tree(self.root).get(self.path)


class Calls:
    """Every call of a machine goes through ``call``: INTERNAL and UNKNOWN fail the test; a server
    killed by an armed fault is restarted (on PostgreSQL the call is first retried on the other
    replica, then the killed one restarts) and the call retried with its request_id; a server
    paused at an armed point runs the rollback's ``race`` in the pause, then resumes."""

    cluster: Cluster

    def __init__(self) -> None:
        self.replica = 0
        self.kills = 0
        self.log: list[str] = []

    def call(self, method: str, request, race: Race | None = None):
        pending_restart: list[tuple[int, bool]] = []
        try:
            while True:
                index = self.replica
                began = time.monotonic()
                try:
                    return self._invoke(index, method, request, race)
                except grpc.RpcError as error:
                    assert error.code() not in NEVER, f"{method} answered {error.code()}: {error.details()}"
                    if error.code() in GONE and not self.cluster.alive(index):
                        # A race not run yet stays armed, unless the restart recovers a rollback.
                        race_again = method != "Rollback" and "CHECKPOINTD_PAUSE_AT" in self.cluster.armed[index]
                        assert self.cluster.died_of_kill(index)
                        self.kills += 1
                        self.cluster.stats["kills at armed points"] += 1
                        self.log.append(f"killed server {index} during {method} ({self.cluster.armed[index]})")
                        if self.cluster.replicated:
                            pending_restart.append((index, race_again))
                            other = 1 - index
                            # Both killed in one call: the one killed first restarts before the retry on it.
                            for waiting in [p for p in pending_restart if p[0] == other]:
                                pending_restart.remove(waiting)
                                self.cluster.start(other, race=waiting[1])
                            self.replica = other
                        else:
                            self.cluster.start(index, race=race_again)
                        continue
                    raise
                finally:
                    self.cluster.stats[f"calls {method}"] += 1
                    self.cluster.stats[f"seconds in {method}"] += time.monotonic() - began
        finally:
            for index, race_again in pending_restart:
                self.cluster.start(index, race=race_again)

    def _invoke(self, index: int, method: str, request, race: Race | None):
        function = getattr(self.cluster.stub(index), method)
        armed = self.cluster.armed[index]
        if "CHECKPOINTD_PAUSE_AT" not in armed:
            return function(request, timeout=120)
        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                outcome["reply"] = function(request, timeout=120)
            except grpc.RpcError as error:
                outcome["error"] = error

        worker = threading.Thread(target=run)
        worker.start()
        handshake = self.cluster.handshake
        point = armed["CHECKPOINTD_PAUSE_AT"].rsplit(":", 1)[0]
        while worker.is_alive():
            if (handshake / f"paused.{point}").exists():
                if race is not None and method == "Rollback":
                    race()
                    self.cluster.stats["writes racing a rollback"] += 1
                    self.log.append(f"raced {race.path} during a rollback")
                (handshake / f"resume.{point}").touch()
                worker.join(timeout=120)
                self.cluster.armed[index].pop("CHECKPOINTD_PAUSE_AT", None)
                for leftover in handshake.iterdir():
                    leftover.unlink()
            worker.join(timeout=0.01)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["reply"]

    def wait_healthy(self) -> None:
        for index in range(len(self.cluster.servers)):
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert self.cluster.healthy(index), f"server {index} is not SERVING"
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, f"server {index} does not answer health"
                    time.sleep(0.1)


def choose(data, choices: list):
    """One of ``choices``: drawn by hypothesis (``data``) or by a seeded random.Random."""
    if isinstance(data, random.Random):
        return data.choice(choices)
    return data.draw(st.sampled_from(choices))


def inodes(full: Path) -> set[tuple[int, int]]:
    """The regular files at or under ``full`` (never through a link), as (device, inode)."""
    found = set()
    paths = [full] if not full.is_dir() or full.is_symlink() else [full, *full.rglob("*")]
    for path in paths:
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.add((st.st_dev, st.st_ino))
    return found


def as_exported(tree: ws.Tree) -> dict[str, tuple]:
    """A modelled tree in the shape of ``tests.hardening.support.exported``."""
    return {path: ("dir", mode) if kind == "dir" else ("symlink", os.fsdecode(content)) if kind == "symlink"
            else ("file", content, mode) for path, (kind, content, mode) in tree.items()}


def conflict_reason(error: grpc.RpcError) -> str:
    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return ""
    return error_info(error).reason


# -- the machine ------------------------------------------------------------------------------

import uuid  # noqa: E402

from google.protobuf import struct_pb2  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402
from ulid import ULID  # noqa: E402

from checkpoint.v1 import config_service_pb2 as config_pb  # noqa: E402

seeds = st.integers(0, 2**16)

def random_edit(rng: random.Random) -> tuple:
    """One workspace edit: the name of a ModelMachine method (less its underscore) and its arguments."""
    path = lambda: rng.choice(ws.ALL_PATHS)  # noqa: E731
    content = lambda: random.Random(rng.randrange(2**16)).randbytes(  # noqa: E731
        rng.choice([0, 1, 100, 3000, 20_000, ws.BIG_FILE_SIZE]))
    return rng.choice([
        lambda: ("write", path(), content(), rng.choice(ws.FILE_MODES)),
        lambda: ("append", path(), content()),
        lambda: ("same_size_same_mtime", path()),
        lambda: ("delete", path()),
        lambda: ("rename", path(), path()),
        lambda: ("mkdir", path(), rng.choice(ws.DIR_MODES)),
        lambda: ("chmod", path(), rng.choice(ws.FILE_MODES), rng.choice(ws.DIR_MODES)),
        lambda: ("symlink", path(), rng.choice(ws.LINK_TARGETS)),
        lambda: ("hard_link_inside", path(), path()),
        lambda: ("hard_link_outside", path(), content()),
        lambda: ("flip_type", path()),
        lambda: ("gitignore", rng.choice(ws.GITIGNORES)),
    ])()


CRASH_POINTS = ("create.captured:1", "create.committed:1", "rollback.planned:1", "rollback.safety_committed:1",
                "restore.change:1", "restore.change:2", "workspace.write:1", "rollback.applied:1")
#: Kill points no rollback reaches before its first change (where the race is armed).
AFTER_THE_RACE = ("create.captured:1", "create.committed:1", "restore.change:2", "workspace.write:2",
                  "rollback.applied:1")
#: How often random_steps takes each rule.
STEP_WEIGHTS = {"edit": 6, "create": 3, "rollback": 3, "diff_live": 1, "diff_pages": 1.5, "delete_checkpoint": 1,
                "set_retention": 0.5, "collect": 0.6, "restart": 0.3, "give_up": 1.2}
#: A directory of files outside the model's names that a give-up step may add for its capture to read.
SCRATCH = "scratch"
SCRATCH_FILES = 200
#: What a caller that gives up may get: the call's end as it saw it, or its reply if it was quick.
GIVEN_UP = (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
COMPACTION_CRASHES = ("", "compact.copied:1", "compact.synced:1")


@dataclass
class PagedDiff:
    """A DiffCheckpoints read a page at a time: its request, the model's diff, what was listed."""

    base: str
    target: str
    page_size: int
    want: dict
    listed: dict = field(default_factory=dict)
    token: str = ""


class ModelMachine(Calls, RuleBasedStateMachine):
    """One plan, one workspace; rules edit it and call the service; the model is ``acked``."""

    #: Server (re)starts one example may cost: restarts, armed faults, offline collections.
    restart_budget = 2

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        Calls.__init__(self)
        self.root = self.cluster.new_workspace()
        self.outside = self.cluster.base / f"outside-{self.root.name}"
        self.outside.mkdir()
        self.plan_id = str(ULID())
        self.acked: dict[str, Ack] = {}
        #: A diff between two checkpoints left after a page, for the next diff_pages step.
        self.paused_diff: PagedDiff | None = None
        self.retention = 0
        self.collected = False
        self.restarts = 0
        self.call("CreateCheckpoint", pb.CreateCheckpointRequest(plan_id=self.plan_id, state=b"first"))
        self.set_config("core.snapshot.max_file_size_bytes", struct_pb2.Value(number_value=ws.MAX_FILE_SIZE))

    def set_config(self, key: str, value: struct_pb2.Value) -> None:
        self.cluster.config(self.replica).SetConfig(
            config_pb.SetConfigRequest(key=key, value=value, plan_id=self.plan_id), timeout=30)

    def restarts_left(self) -> bool:
        return self.restarts < self.restart_budget

    def disk(self) -> ws.Tree:
        return ws.read_tree(self.root)

    # -- workspace edits --------------------------------------------------------------------

    def edit(self, edits):
        """One to four edits of the workspace (see ``random_edit``); none through a symbolic link."""
        for name, *arguments in edits:
            if not any(isinstance(a, str) and ws.through_a_link(self.root, a) for a in arguments):
                getattr(self, f"_{name}")(*arguments)

    def _write(self, path, content, mode):
        ws.write_file(self.root, path, content, mode)

    def _append(self, path, content):
        ws.append(self.root, path, content[:500] or b"+")

    def _same_size_same_mtime(self, path):
        ws.rewrite_same_size_same_mtime(self.root, path)

    def _delete(self, path):
        ws.remove(self.root / path)

    def _rename(self, source, destination):
        ws.rename(self.root, source, destination)

    def _mkdir(self, path, mode):
        ws.make_dir(self.root, path, mode)

    def _chmod(self, path, file_mode, dir_mode):
        ws.chmod(self.root, path, file_mode, dir_mode)

    def _symlink(self, path, link_text):
        ws.symlink(self.root, path, link_text)

    def _hard_link_inside(self, source, path):
        ws.hard_link(self.root, self.root / source, path)

    def _hard_link_outside(self, path, content):
        """A file outside the workspace gains a name inside it (or, if it has one, is written
        through its outside name: no event reaches a watcher of the workspace)."""
        outside = self.outside / path.replace("/", "_")
        if outside.exists() and outside.stat().st_nlink > 1:
            with open(outside, "r+b") as f:
                f.truncate(0)
                f.write(content[:5000] or b"written outside")
        else:
            outside.write_bytes(content[:5000])
            ws.hard_link(self.root, outside, path)

    def _flip_type(self, path):
        ws.flip_type(self.root, path)

    def _gitignore(self, text):
        ws.write_file(self.root, ".gitignore", text)

    # -- the service ------------------------------------------------------------------------

    def create(self, pinned, state) -> str:
        request = pb.CreateCheckpointRequest(plan_id=self.plan_id, workspace_root=str(self.root),
                                             state=b"state %d" % state, request_id=str(uuid.uuid4()),
                                             labels={"pinned": "true"} if pinned else {})
        disk = self.disk()
        checkpoint = self.call("CreateCheckpoint", request).checkpoint
        assert self.disk() == disk
        self.acknowledge(checkpoint, disk, request.state, pinned)
        return checkpoint.checkpoint_id

    def acknowledge(self, checkpoint: pb.Checkpoint, disk: ws.Tree, state: bytes, pinned: bool = False) -> None:
        """Models ``checkpoint``, captured while the workspace was ``disk``."""
        rules = ws.Rules.of(disk)
        want_skipped = {p for p in disk if rules.oversized(p, disk) and not rules.ignored(p, disk)}
        assert {s.path for s in checkpoint.skipped_files} == want_skipped, checkpoint.skipped_files
        held = ws.capture(disk)
        if max(Counter(path.rpartition("/")[0] for path in held).values(), default=0) > SPLIT_ENTRIES:
            self.cluster.stats["checkpoints holding a split directory"] += 1
        self.acked[checkpoint.checkpoint_id] = Ack(held, rules, checkpoint.sequence, state, pinned,
                                                   skipped=frozenset(want_skipped))

    def diff_live(self, data):
        base = self.pick(data)
        changes = self.call("DiffCheckpoints", pb.DiffCheckpointsRequest(base_checkpoint_id=base)).changes
        want = ws.diff(self.acked[base].tree, ws.capture(self.disk()))
        assert reported(changes) == want, f"diff of {base} against the live workspace:\n" + mismatch(
            reported(changes), want)

    def diff_pages(self, data, page_size: int, live: bool):
        """A diff read a few changes a page (the token resumes the tree walk and, between two
        checkpoints, carries the count of what is left): the pages are the model's diff, each path
        once, and each page's changes_omitted is what the later pages hold. One between two
        checkpoints pauses after its first page and goes on after the next step, whatever it was
        (GC with compaction, a restart, a kill, a rollback): its token still resumes it, or the call
        is NOT_FOUND when a side was deleted meanwhile."""
        self.go_on_with_paused_diff()
        base, target = self.pick(data), "" if live else self.pick(data)
        want = ws.diff(self.acked[base].tree, self.acked[target].tree if target else ws.capture(self.disk()))
        self.read_pages(PagedDiff(base, target, page_size, want), pause=bool(target))

    def go_on_with_paused_diff(self) -> None:
        """Reads the rest of the diff diff_pages paused, if any (see there)."""
        paused, self.paused_diff = self.paused_diff, None
        if paused is None:
            return
        if paused.base in self.acked and paused.target in self.acked:
            self.read_pages(paused, pause=False)
            self.cluster.stats["diffs paged on after another step"] += 1
            return
        try:
            self.read_pages(paused, pause=False)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND, error
            self.cluster.stats["diffs paged on after a side was deleted"] += 1
        else:
            raise AssertionError(f"a page of {paused.base} to {paused.target} after one was deleted")

    def read_pages(self, diff: PagedDiff, pause: bool) -> None:
        """Reads ``diff``'s pages to the end, or (``pause``) leaves it after one for later."""
        while True:
            page = self.call("DiffCheckpoints", pb.DiffCheckpointsRequest(
                base_checkpoint_id=diff.base, target_checkpoint_id=diff.target, page_size=diff.page_size,
                page_token=diff.token))
            rows = reported(page.changes)
            assert len(rows) == len(page.changes) <= diff.page_size and not rows.keys() & diff.listed.keys(), page
            diff.listed |= rows
            assert page.changes_omitted == len(diff.want) - len(diff.listed), (diff, page.changes_omitted)
            diff.token = page.next_page_token
            if not diff.token:
                break
            if diff.target:
                self.cluster.stats["diff pages resumed between two checkpoints"] += 1
            if pause:
                self.paused_diff = diff
                return
        assert diff.listed == diff.want, f"pages of {diff.page_size} from {diff.base} to " \
            f"{diff.target or 'the workspace'}:\n" + mismatch(diff.listed, diff.want)

    def delete_checkpoint(self, data):
        doomed = self.pick(data)
        try:
            self.call("DeleteCheckpoint", pb.DeleteCheckpointRequest(checkpoint_id=doomed))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND, error  # a retry after a kill
        del self.acked[doomed]

    def set_retention(self, keep):
        self.retention = keep
        self.set_config("core.retention.max_checkpoints_per_plan", struct_pb2.Value(number_value=keep))

    def collect(self, crash_at):
        """Retention and garbage collection (once per example: it restarts the single server)."""
        self.collected = True
        self.restarts += 1
        self.cluster.gc(crash_at if not self.cluster.replicated else "")
        self.wait_healthy()
        self.check_retention()

    def restart(self, kill, crash_at):
        """Restarts a server (after a kill -9, or a SIGTERM) with the next rollback's first change
        paused (a tool writes meanwhile) and, if ``crash_at``, a kill -9 armed at that point (the
        call that reaches it is retried with its request_id)."""
        self.restarts += 1
        index = self.next_victim()
        if kill:
            self.cluster.servers[index].kill()
        faults = {"CHECKPOINTD_CRASH_AT": crash_at} if crash_at else {}
        self.cluster.start(index, race=crash_at in ("", *AFTER_THE_RACE), **faults)

    @initialize(crash_at=st.sampled_from(AFTER_THE_RACE))
    def arm(self, crash_at):
        """Every example starts with a server restarted with a race and a kill -9 armed."""
        self.cluster.start(self.next_victim(), CHECKPOINTD_CRASH_AT=crash_at)
        for number, path in enumerate(("x.txt", "a/y.log", "a/b/z", "build/keep.log")):
            ws.write_file(self.root, path, b"first version of %d\n" % number)

    def pick(self, data, *, regular: bool = False) -> str:
        """An acknowledged checkpoint (one is created first if there is none)."""
        choices = sorted(c for c, a in self.acked.items() if not (regular and a.safety))
        if not choices:
            self.create(pinned=False, state=0)
            return self.pick(data, regular=regular)
        return choose(data, choices)

    def next_victim(self) -> int:
        """The server that is restarted next; replicas take turns, and calls go to it."""
        if self.cluster.replicated:
            self.replica = 1 - self.replica
        return self.replica

    def rollback(self, data, how, race):
        target_id = self.pick(data)
        target = self.acked[target_id]
        before = self.disk()
        top = None
        if how == "scoped":
            tops = sorted({p.split("/")[0] for p in before.keys() | target.tree.keys()})
            if not tops:
                return
            top = choose(data, tops)
        self.roll_back(target_id, before, top, dry_run=how == "dry-run", race=Race(self.root, race))

    def roll_back(self, target_id: str, before: ws.Tree, top: str | None, dry_run: bool = False,
                  race: Race | None = None, request_id: str = "") -> str | None:
        """Rolls back to ``target_id`` (``before``: the workspace now) and checks the result; the
        safety checkpoint's id (None for a dry run or a refusal)."""
        target = self.acked[target_id]
        expected = ws.expect_rollback(before, target.tree, target.rules, top, target.skipped)
        request = pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=target_id, dry_run=dry_run,
                                     paths=[top] if top else [],
                                     request_id="" if dry_run else request_id or str(uuid.uuid4()))
        killed_before = self.kills
        try:
            reply = self.call("Rollback", request, race=race)
        except grpc.RpcError as error:
            assert conflict_reason(error) == "ROLLBACK_CONFLICT", f"{error.code()} {error.details()}"
            raced = race is not None and race.path is not None
            assert expected.may_conflict or raced, f"unexpected conflict: {error.details()}"
            want = dict(before)
            if raced:
                want[race.path] = race.node
                for parent in ws.parents(race.path):
                    want.setdefault(parent, self.disk()[parent])
            assert self.disk() == want, "a refused rollback changed the workspace:\n" + mismatch(self.disk(), want)
            self.cluster.stats["rollbacks refused (ROLLBACK_CONFLICT)"] += 1
            return None
        after = self.disk()
        if dry_run:
            assert after == before, "a dry run changed the workspace:\n" + mismatch(after, before)
            assert {c.path for c in reply.changes} <= expected.changes | set(expected.safety), reply.changes
            return None
        if target.state is not None:
            assert reply.state == target.state
        want = dict(expected.after)
        if race is not None and race.path is not None:
            if after.get(race.path) != race.node:
                self.held_by_a_recovery_checkpoint(race, target_id, killed_before)
            for path in [race.path, *ws.parents(race.path)]:
                want.pop(path, None)
                after = {p: n for p, n in after.items() if p != path}
            after = {p: n for p, n in after.items() if not ws.inside(p, race.path)}
        safety = reply.safety_checkpoint
        # Paths today's rules leave out that the target lacks are left alone, except where the
        # rollback captures them into its safety checkpoint first and then removes them: allowed,
        # as long as that checkpoint holds them (nothing is lost).
        taken = {p for p in want.keys() - after.keys() if p not in target.tree and p in before}
        if taken:
            candidates = [safety.checkpoint_id] + ([c.checkpoint_id for c in self.list_checkpoints()
                                                    if c.phase == pb.PHASE_ROLLBACK_SAFETY and c.checkpoint_id
                                                    not in self.acked and c.checkpoint_id != safety.checkpoint_id]
                                                   if self.kills > killed_before else [])
            held: dict[str, ws.ChangeRow] = {}
            for candidate in candidates:
                for path, row in reported(self.call("DiffCheckpoints", pb.DiffCheckpointsRequest(
                        base_checkpoint_id=target_id, target_checkpoint_id=candidate)).changes).items():
                    held.setdefault(path, row)
            for path in taken:
                node = before[path]
                assert path in held and held[path][2] == node[0] and (node[0] == "dir" or held[path][4] == len(
                    node[1])), f"rollback to {target_id} removed {path}, which no checkpoint holds: {held.get(path)}"
                want.pop(path)
            if self.kills == killed_before:
                expected.safety.update({path: before[path] for path in taken})
            self.cluster.stats["left-out paths a rollback took into its safety checkpoint"] += 1
        assert after == want, (f"rollback to {target_id} (scope {top}, captured under {target.rules}, before it "
                               f"{ {p: before.get(p) for p in sorted(after.keys() ^ want.keys())} }) is not exact:\n"
                               + mismatch(after, want))
        self.cluster.stats["rollbacks checked byte for byte"] += 1
        now_rules = ws.Rules.of(before)
        self.acked[safety.checkpoint_id] = Ack(expected.safety, now_rules, safety.sequence, None, safety=True,
                                               skipped=frozenset(p for p in before if p not in expected.safety
                                                                 and now_rules.oversized(p, before)
                                                                 and not now_rules.ignored(p, before)))
        return safety.checkpoint_id

    # -- calls given up on ----------------------------------------------------------------------

    def give_up(self, data, what, scoped, deadline, delay, racing, after, state, race, scratch):
        """A call its caller gives up on: a Rollback (full, or scoped to a top-level path; its own
        request_id), a CreateCheckpoint or a DiffCheckpoints of the live workspace, cancelled
        ``delay`` seconds after it was sent, or sent with a deadline that short (``deadline``),
        with the edit ``racing`` (if any) made right after (with ``scratch``, a rollback or diff
        has a few hundred rewritten files to capture: see ``scratch_base``). It may end OK, CANCELLED or
        DEADLINE_EXCEEDED, nothing else. Once nothing of it runs any more (a call that takes the
        plan has answered), what the server shows must be one of the outcomes the README allows
        (see ``_give_up_rollback`` and the others). Then the ``after`` edits, and a
        CreateCheckpoint that must hold the workspace exactly, read back byte for byte: a capture
        stopped by a give-up keeps the base it would have built on (capture/capturer.py), and a
        base kept when it should not be makes that checkpoint miss a change."""
        armed = self.cluster.armed[self.replica].get("CHECKPOINTD_CRASH_AT", "")
        if armed and (what == "create") == armed.startswith("create."):
            what = "diff"  # a kill armed on this call's way is for the calls retried with their request_id
        if scratch and what != "create":
            self.scratch_base()
            delay = round(delay * 5, 4)  # the capture is several times longer
        lines = self.abandoned_lines()
        if what == "rollback":
            self._give_up_rollback(data, scoped, deadline, delay, racing, race)
        elif what == "create":
            self._give_up_create(deadline, delay, racing)
        else:
            self._give_up_diff(data, deadline, delay, racing)
        self.cluster.stats["captures stopped by a give-up (server log)"] += max(0, self.abandoned_lines() - lines)
        self.edit(after)
        self.exact_create(state)
        if (self.root / SCRATCH).exists() or scratch:
            for checkpoint_id in [c for c, a in self.acked.items() if any(ws.inside(p, SCRATCH) for p in a.tree)]:
                del self.acked[checkpoint_id]  # read back already; the rest of the example goes on without them
            ws.remove(self.root / SCRATCH)

    def scratch_base(self) -> None:
        """Files enough that a capture of them all takes some milliseconds, checkpointed (the
        base the next capture builds on; not modelled: they go once the step is over), then all
        rewritten: the give-up that follows has them all to read, and is likely stopped among them."""
        for number in range(SCRATCH_FILES):
            ws.write_file(self.root, f"{SCRATCH}/f{number:03}", b"scratch %d\n" % number)
        self.call("CreateCheckpoint", pb.CreateCheckpointRequest(plan_id=self.plan_id, state=b"scratch"))
        for number in range(SCRATCH_FILES):
            ws.write_file(self.root, f"{SCRATCH}/f{number:03}", b"rewritten %d\n" % number)
        self.cluster.stats["give-ups with scratch files to capture"] += 1

    def abandoned_lines(self) -> int:
        """How many captures of the plan the server's log says a give-up stopped (its log since it last started)."""
        server = self.cluster.servers[self.replica]
        text = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
        return text.count(f"of plan {self.plan_id} abandoned")

    def given_up(self, method: str, request, deadline: bool, delay: float, racing: tuple | None):
        """Sends ``request``, makes the ``racing`` edit, gives up; the code the caller saw and the reply (or error)."""
        function = getattr(self.cluster.stub(self.replica), method)
        future = function.future(request, timeout=max(delay, 0.0005) if deadline else 60)
        if not deadline:  # the edit after the cancel: its timing is the give-up's
            time.sleep(delay)
            future.cancel()
        if racing is not None:
            self.edit([racing])
            self.cluster.stats["edits racing a call given up on"] += 1
        try:
            reply, code = future.result(timeout=120), grpc.StatusCode.OK
        except grpc.FutureCancelledError:
            reply, code = None, grpc.StatusCode.CANCELLED
        except grpc.RpcError as error:
            reply, code = error, error.code()
        assert code not in NEVER, f"{method} given up on answered {code}: {reply.details()}"
        self.cluster.stats["calls given up on"] += 1
        self.cluster.stats[f"calls {method} given up on, ended {code.name}"] += 1
        return code, reply

    def settle(self, target_id: str, race: Race | None) -> None:
        """Returns once nothing of an earlier call of the plan runs any more: a dry-run rollback
        takes the plan as every rollback and create does (a rollback given up on past its commit
        point, paused before its first change, is resumed by ``call``, after ``race`` wrote), and
        changes nothing, neither the workspace nor the base the next capture builds on (its look
        is never committed)."""
        try:
            self.call("Rollback", pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=target_id, dry_run=True),
                      race=race)
        except grpc.RpcError as error:
            assert conflict_reason(error) == "ROLLBACK_CONFLICT", f"{error.code()} {error.details()}"

    def _give_up_rollback(self, data, scoped, deadline, delay, racing, race_seed) -> None:
        """Either it did not happen (no safety checkpoint of it listed; the workspace exactly as it
        was, or, with an edit racing it, as it was within its scope) or it ran to its end (exactly
        one safety checkpoint of it, labelled rollback_target; its request_id answers with that
        one, and the workspace is the target's, as ``roll_back`` checks): never anything between.
        An edit races only a scoped rollback, outside its scope and away from its files. Where the
        server pauses its first rollback's first change, a tool writes in that pause (``Race``):
        then the rollback either ran to its end with the write on disk, or met the write and
        undid all it had changed (its safety checkpoint recorded, the workspace as it was plus
        the write), as ``roll_back`` allows."""
        target_id = self.pick(data)
        target = self.acked[target_id]
        before = self.disk()
        top = None
        if scoped:
            tops = sorted({p.split("/")[0] for p in before.keys() | target.tree.keys()})
            top = choose(data, tops) if tops else None
        race = Race(self.root, race_seed) if "CHECKPOINTD_PAUSE_AT" in self.cluster.armed[self.replica] else None
        if racing is not None and (race is not None or top is None or not self.clear_of(racing, top)):
            racing = None
        expected = ws.expect_rollback(before, target.tree, target.rules, top, target.skipped)
        known = {c.checkpoint_id for c in self.list_checkpoints()}
        request = pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=target_id, paths=[top] if top else [],
                                     request_id=str(uuid.uuid4()))
        code, reply = self.given_up("Rollback", request, deadline, delay, racing)
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            assert conflict_reason(reply) == "ROLLBACK_CONFLICT" and expected.may_conflict, reply.details()
        else:
            assert code in GIVEN_UP, f"a rollback given up on answered {code}: {reply.details()}"
        self.settle(target_id, race)
        now = self.disk()
        listed = [c for c in self.list_checkpoints() if c.checkpoint_id not in known]
        made = [c for c in listed if c.labels.get("rollback_target") == target_id]
        # An undo of it (a write raced it) records the workspace first, in a safety checkpoint of its own.
        undoing = [c for c in listed if c not in made]
        assert len(made) <= 1 and all(c.phase == pb.PHASE_ROLLBACK_SAFETY for c in listed) and all(
            made and c.labels.get("rollback_target") == made[0].checkpoint_id for c in undoing), \
            f"a rollback given up on recorded {listed}"
        if code == grpc.StatusCode.OK:
            assert [c.checkpoint_id for c in made] == [reply.safety_checkpoint.checkpoint_id], made
        if not made:
            if racing is None:
                assert now == before, "a rollback that did not happen changed the workspace:\n" + mismatch(now, before)
            else:
                inside = {p: n for p, n in now.items() if ws.inside(p, top)}
                was = {p: n for p, n in before.items() if ws.inside(p, top)}
                assert inside == was, f"a rollback that did not happen changed {top}:\n" + mismatch(inside, was)
            self.cluster.stats["rollbacks given up on that did not happen"] += 1
            return
        if race is not None and race.path is not None:
            self.cluster.stats["writes racing a rollback"] += 1
            raced = {**before, race.path: race.node}
            for parent in ws.parents(race.path):
                raced.setdefault(parent, now[parent])
            if now == raced:
                self.cluster.stats["rollbacks given up on, undone after a write raced them"] += 1
                return
        else:
            race = None
        assert not undoing or expected.may_conflict, f"a rollback given up on was undone, nothing raced it: {undoing}"
        if racing is not None:  # what it found: its scope as it was, the rest as the edit left it
            before = {**{p: n for p, n in now.items() if not ws.inside(p, top)},
                      **{p: n for p, n in before.items() if ws.inside(p, top)}}
        safety_id = self.roll_back(target_id, before, top, race=race, request_id=request.request_id)
        # Its request_id answers with the safety checkpoint it recorded (unless it was undone, a
        # conflict the model allows, and the retry is a rollback of its own).
        assert safety_id == made[0].checkpoint_id or expected.may_conflict, (safety_id, made)
        if racing is not None and safety_id is not None:
            self.acked.pop(safety_id)  # taken before or after the racing edit
        self.cluster.stats["rollbacks given up on that ran to their end"] += 1

    def clear_of(self, edit: tuple, top: str) -> bool:
        """Whether ``edit`` keeps out of the top-level ``top``: none of its paths is in it, it is
        not a .gitignore edit (the rules decide what a rollback leaves alone), and none of the
        files it may write, chmod or remove is a hard link of one in ``top``."""
        name, *arguments = edit
        paths = [a for a in arguments if isinstance(a, str)]
        if name == "gitignore" or any(ws.inside(p, top) or ws.inside(top, p) for p in paths):
            return False
        touched = set().union(*(inodes(self.root / p) for p in paths))
        if name == "hard_link_outside":
            touched |= inodes(self.outside / paths[0].replace("/", "_"))
        return not touched & inodes(self.root / top)

    def _give_up_create(self, deadline, delay, racing) -> None:
        """It recorded its checkpoint or it did not: its request_id (once the plan is free)
        answers with the one it recorded, or records one now. With no edit racing it, that
        checkpoint holds the workspace exactly and is modelled; with one, what its capture saw
        is not pinned down: the next create's exactness checks what it left."""
        before = self.disk()
        request = pb.CreateCheckpointRequest(plan_id=self.plan_id, workspace_root=str(self.root),
                                             state=b"given up on", request_id=str(uuid.uuid4()))
        code, reply = self.given_up("CreateCheckpoint", request, deadline, delay, racing)
        assert code in GIVEN_UP, f"a create given up on answered {code}: {reply.details()}"
        now = self.disk()
        checkpoint = self.call("CreateCheckpoint", request).checkpoint
        if code == grpc.StatusCode.OK:
            assert checkpoint.checkpoint_id == reply.checkpoint.checkpoint_id, (checkpoint, reply)
        assert self.disk() == now
        if racing is None:
            assert now == before
            self.acknowledge(checkpoint, now, request.state)
            self.cluster.stats["creates given up on, modelled"] += 1

    def _give_up_diff(self, data, deadline, delay, racing) -> None:
        """It changes nothing; if it answered (and no edit raced it), it is the model's diff."""
        base = self.pick(data)
        want = ws.diff(self.acked[base].tree, ws.capture(self.disk()))
        code, reply = self.given_up("DiffCheckpoints", pb.DiffCheckpointsRequest(base_checkpoint_id=base),
                                    deadline, delay, racing)
        assert code in GIVEN_UP, f"a live diff given up on answered {code}: {reply.details()}"
        if code == grpc.StatusCode.OK and racing is None:
            assert reported(reply.changes) == want, "a live diff:\n" + mismatch(reported(reply.changes), want)

    def exact_create(self, state: int) -> None:
        """A CreateCheckpoint, modelled, whose files are read back: exactly the workspace's."""
        checkpoint_id = self.create(pinned=False, state=state)
        got = exported(self.cluster.stub(self.replica), checkpoint_id)
        want = as_exported(self.acked[checkpoint_id].tree)
        assert got == want, "the create after a call given up on is not exact:\n" + mismatch(got, want)
        self.cluster.stats["creates after a give-up read back byte for byte"] += 1

    @rule(seed=seeds)
    def random_steps(self, seed):
        """Eight steps chosen by a seeded random.Random, weighted towards edits, checkpoints and
        rollbacks (hypothesis's own choice of rules repeats one rule for long stretches when it
        runs few examples), each followed by the invariants."""
        rng = random.Random(seed)
        for _ in range(8):
            name = rng.choices(list(STEP_WEIGHTS), weights=list(STEP_WEIGHTS.values()))[0]
            if name == "collect" and not (self.restarts_left() and not self.collected):
                name = "create"
            if name == "restart" and not self.restarts_left():
                name = "edit"
            arguments = {
                "edit": lambda: {"edits": [random_edit(rng) for _ in range(rng.randint(1, 4))]},
                "create": lambda: {"pinned": rng.random() < 0.2, "state": rng.randrange(2**16)},
                "diff_live": lambda: {"data": rng},
                "diff_pages": lambda: {"data": rng, "page_size": rng.randint(1, 3), "live": rng.random() < 0.3},
                "delete_checkpoint": lambda: {"data": rng},
                "set_retention": lambda: {"keep": rng.choice([0, 1, 2, 4])},
                "collect": lambda: {"crash_at": rng.choice(COMPACTION_CRASHES)},
                "restart": lambda: {"kill": rng.random() < 0.5, "crash_at": rng.choice(("",) + CRASH_POINTS)},
                "rollback": lambda: {"data": rng, "how": rng.choice(["full", "full", "scoped", "dry-run"]),
                                     "race": rng.randrange(2**16)},
                "give_up": lambda: {"data": rng, "what": rng.choice(["rollback", "rollback", "create", "diff"]),
                                    "scoped": rng.random() < 0.4, "deadline": rng.random() < 0.5,
                                    # A rollback's safety capture of the model's workspace is over
                                    # about a millisecond after it is sent: most give-ups aim there.
                                    "delay": rng.choice([0.0, round(rng.uniform(0, 0.001), 5),
                                                         round(rng.uniform(0, 0.0015), 5),
                                                         round(rng.uniform(0.0005, 0.002), 5),
                                                         round(rng.uniform(0, 0.008), 4),
                                                         round(rng.uniform(0, 0.05), 3)]),
                                    "racing": random_edit(rng) if rng.random() < 0.5 else None,
                                    "after": [random_edit(rng) for _ in range(rng.randint(0, 2))],
                                    "state": rng.randrange(2**16), "race": rng.randrange(2**16),
                                    "scratch": rng.random() < 0.7},
            }[name]()
            self.log.append(f"{name}({', '.join(f'{k}={v!r}'[:200] for k, v in arguments.items() if k != 'data')})")
            try:
                getattr(self, name)(**arguments)
                if name != "diff_pages":  # a paused diff goes on after one other step
                    self.go_on_with_paused_diff()
                self.every_acknowledged_checkpoint_holds_its_model(integrity=False)
            except AssertionError as failure:
                steps = "\n  ".join(self.log[-12:])
                raise AssertionError(f"{failure}\nafter these steps (random_steps(seed={seed})):\n  {steps}") from None

    def held_by_a_recovery_checkpoint(self, race: Race, target_id: str, killed_before: int) -> None:
        """A raced write that a rollback replaced is lost unless the rollback was killed and its
        recovery, finding the workspace changed since the safety checkpoint, recorded it first in
        a safety checkpoint of its own (which the client never heard of)."""
        assert self.kills > killed_before, f"the write racing the rollback at {race.path} was lost"
        size, mode = len(race.node[1]), race.node[2]
        for checkpoint in self.list_checkpoints():
            if checkpoint.phase != pb.PHASE_ROLLBACK_SAFETY or checkpoint.checkpoint_id in self.acked:
                continue
            changes = self.call("DiffCheckpoints", pb.DiffCheckpointsRequest(
                base_checkpoint_id=target_id, target_checkpoint_id=checkpoint.checkpoint_id)).changes
            if any(c.path == race.path and c.target_type == pb.ENTRY_TYPE_FILE and c.target_size_bytes == size
                   and c.target_mode == mode for c in changes):
                self.cluster.stats["raced writes kept by a recovery's safety checkpoint"] += 1
                return
        raise AssertionError(f"the write racing the rollback at {race.path} is neither on disk nor in a checkpoint")

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def every_acknowledged_checkpoint_holds_its_model(self, integrity: bool = True):
        """Health, every acknowledged checkpoint diffed against the newest one (compared with the
        model's diff of the two trees) and, after each rule (every eight steps of random_steps:
        it reads the whole store), fsck through AdminService/CheckIntegrity."""
        began = time.monotonic()
        self.wait_healthy()
        if integrity:
            report = self.cluster.integrity(self.replica)
            assert report.ok and not report.unfinished_rollback_plan_ids, report
        if not self.acked:
            return
        anchor = max(self.acked, key=lambda c: self.acked[c].sequence)
        for checkpoint_id, ack in self.acked.items():
            if checkpoint_id == anchor:
                continue
            changes = self.call("DiffCheckpoints", pb.DiffCheckpointsRequest(
                base_checkpoint_id=checkpoint_id, target_checkpoint_id=anchor)).changes
            want = ws.diff(ack.tree, self.acked[anchor].tree)
            assert reported(changes) == want, f"{checkpoint_id} against {anchor}:\n" + mismatch(reported(changes), want)
        self.cluster.stats["seconds checking invariants"] += time.monotonic() - began

    def check_retention(self) -> None:
        """Acknowledged checkpoints gone after a collection were pruned by the plan's rule: never
        a pinned one, a safety one or the newest; at most ``retention`` unpinned regular ones left."""
        listed = {c.checkpoint_id: c for c in self.list_checkpoints()}
        regular = [c for c in listed.values() if c.phase != pb.PHASE_ROLLBACK_SAFETY]
        for checkpoint_id in [c for c in self.acked if c not in listed]:
            ack = self.acked.pop(checkpoint_id)
            assert self.retention and not ack.pinned and not ack.safety, f"{checkpoint_id} was lost: {ack}"
            self.cluster.stats["acknowledged checkpoints pruned by retention"] += 1
            assert regular and ack.sequence < max(c.sequence for c in regular)
        if self.retention:
            unpinned = [c for c in regular if c.labels.get("pinned") != "true"]
            assert len(unpinned) <= self.retention, [c.sequence for c in unpinned]

    def list_checkpoints(self) -> list[pb.Checkpoint]:
        found, token = [], ""
        while True:
            reply = self.call("ListCheckpoints", pb.ListCheckpointsRequest(
                plan_id=self.plan_id, page_size=1000, page_token=token))
            found.extend(reply.checkpoints)
            token = reply.next_page_token
            if not token:
                return found

    def teardown(self):
        """A collection (if the example had none), then every acknowledged checkpoint restores
        byte for byte (a full rollback to each)."""
        try:
            if not self.collected:
                self.collect(crash_at="")
            for checkpoint_id in sorted(self.acked, key=lambda c: self.acked[c].sequence):
                if checkpoint_id in self.acked:
                    self.roll_back(checkpoint_id, self.disk(), None, race=Race(self.root, len(self.acked)))
        finally:
            for index in range(len(self.cluster.servers)):
                if not self.cluster.alive(index):
                    self.cluster.start(index, race=False)
