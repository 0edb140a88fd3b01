"""kill -9 at seeded points of CreateCheckpoint and Rollback (and of the recovery that follows),
restart, and prove: every acknowledged checkpoint is intact and restorable, no half-written or
duplicate checkpoint is visible, an interrupted rollback is finished on restart (never left
half-done without the safety checkpoint that holds the workspace as it was), and the store
passes the integrity check.

One server start per kill: the driver keeps going in the next armed process, and every call
the kill interrupted is retried with its request_id, as a client would.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.kernel.faults import Point
from tests.hardening.support import (
    GONE,
    TOP_DIRECTORIES,
    assert_fsck_clean,
    fsck,
    list_all,
    mutate_workspace,
    pending_rollbacks,
    seed_workspace,
    start_with_faults,
    with_subset,
    workspace_state,
)

SEED = int(os.environ.get("CHECKPOINTD_HARDENING_SEED", "20240611"))

#: Calls made with one fault armed before the server is restarted with another (a fault whose N
#: the workload happens not to reach must not stall the campaign).
STEPS_PER_ARMING = 40
#: Points of each family and the largest N drawn for them (how often one call reaches them).
CREATE_POINTS = {Point.CREATE_CAPTURED: 2, Point.CREATE_COMMITTED: 2, Point.WORKSPACE_READ: 14}
ROLLBACK_POINTS = {Point.ROLLBACK_PLANNED: 2, Point.ROLLBACK_SAFETY_COMMITTED: 2, Point.RESTORE_CHANGE: 24,
                   Point.WORKSPACE_WRITE: 8, Point.RESTORE_UNSYNCED: 2, Point.ROLLBACK_APPLIED: 2}


#: How a kill during a state-only create (served on the event loop) is recorded.
STATE_ONLY_CREATE = "CreateCheckpoint (state only)"


@dataclass
class Kill:
    point: Point
    n: int
    during: str


@dataclass
class CrashDriver:
    """A plan worked on through repeated kill -9s; it models what every checkpoint holds."""

    server: object
    rng: random.Random
    workspace: Path
    plan_id: str = field(default_factory=lambda: str(ULID()))
    #: checkpoint_id -> the workspace it holds, for every acknowledged checkpoint.
    acked: dict[str, dict] = field(default_factory=dict)
    acked_state: dict[str, bytes] = field(default_factory=dict)
    acked_digest: dict[str, str] = field(default_factory=dict)
    create_request_ids: set[str] = field(default_factory=set)
    #: A second plan with no workspace: its state-only creates are served on the event loop.
    state_plan_id: str = field(default_factory=lambda: str(ULID()))
    state_request_ids: set[str] = field(default_factory=set)
    kills: list[Kill] = field(default_factory=list)
    armed: Kill | None = None
    family: str = "create"
    steps_armed: int = 0
    rearmed: int = 0
    stub: pb_grpc.CheckpointServiceStub | None = None
    channel: grpc.Channel | None = None

    # -- server lifecycle -----------------------------------------------------------------

    def arm_and_start(self, family: str | None = None) -> None:
        """Starts the server with the next kill armed (for calls of ``family``)."""
        while True:
            self.family = family or self.rng.choice(["create", "rollback"])
            points = CREATE_POINTS if self.family == "create" else ROLLBACK_POINTS
            point = self.rng.choice(sorted(points))
            pending = self.pending_journals()
            if pending and self.rng.random() < 0.5:
                point, self.family = Point.RESTORE_CHANGE, "recovery"
            self.armed = Kill(point, self.rng.randint(1, points.get(point, 3)), self.family)
            self.steps_armed = 0
            try:
                start_with_faults(self.server, CHECKPOINTD_CRASH_AT=f"{point.value}:{self.armed.n}")
            except RuntimeError:
                assert pending, "the server died while starting, with no rollback to recover"
                self.reap(during="recovery")
                continue
            self.connect()
            return

    def connect(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(self.server.tcp_target)
        self.stub = pb_grpc.CheckpointServiceStub(self.channel)

    def reap(self, during: str) -> None:
        """The server must have died of the armed SIGKILL, nothing else."""
        process = self.server.process
        code = process.wait(timeout=60)
        assert code == -signal.SIGKILL, f"server exited with {code}, not the injected kill:\n{self.server.log()}"
        self.server.stop()
        self.kills.append(Kill(self.armed.point, self.armed.n, during))
        if len(self.kills) % 10 == 0:
            report = fsck(self.server)
            assert report.ok, report.to_json()

    def pending_journals(self) -> list[str]:
        """Plans with an unfinished rollback: entries of the journal in the server's database."""
        return pending_rollbacks(self.server)

    def call(self, method: str, request, after_restart=None, during: str = ""):
        """One mutating call, carried through kills by retrying the same request (same request_id);
        a kill is recorded as ``during`` (the method, unless said)."""
        while True:
            try:
                return getattr(self.stub, method)(request, timeout=60)
            except grpc.RpcError as error:
                if error.code() not in GONE:
                    raise
                if self.server.process.poll() is None:
                    self.server.process.wait(timeout=30)
            self.reap(during=during or method)
            self.arm_and_start()
            if after_restart is not None:
                after_restart()

    # -- the workload ---------------------------------------------------------------------

    def create(self) -> None:
        for _ in range(self.rng.randint(1, 4)):
            mutate_workspace(self.workspace, self.rng)
        expected = workspace_state(self.workspace)
        request_id = str(ULID())
        state = f"state {len(self.create_request_ids)}".encode()
        self.create_request_ids.add(request_id)
        request = pb.CreateCheckpointRequest(plan_id=self.plan_id, workspace_root=str(self.workspace),
                                             request_id=request_id, state=state,
                                             labels={"request": request_id.lower()})
        created = self.call("CreateCheckpoint", request).checkpoint
        assert workspace_state(self.workspace) == expected
        self.remember(created, expected, state)

    def create_state_only(self) -> None:
        """A state-only create with a state of its own (so its object is new and must be made durable)."""
        request_id = str(ULID())
        state = f"state-only {len(self.state_request_ids)} {self.rng.random()}".encode()
        self.state_request_ids.add(request_id)
        request = pb.CreateCheckpointRequest(plan_id=self.state_plan_id, request_id=request_id, state=state,
                                             labels={"request": request_id.lower()})
        created = self.call("CreateCheckpoint", request, during=STATE_ONLY_CREATE).checkpoint
        assert created.plan_id == self.state_plan_id and not created.tree_digest
        self.acked_state[created.checkpoint_id] = state

    def remember(self, checkpoint: pb.Checkpoint, content: dict, state: bytes | None = None) -> None:
        cid = checkpoint.checkpoint_id
        if cid in self.acked:
            assert self.acked[cid] == content and self.acked_digest[cid] == checkpoint.tree_digest
        self.acked[cid] = content
        self.acked_digest[cid] = checkpoint.tree_digest
        if state is not None:
            self.acked_state[cid] = state

    def rollback(self, target_id: str | None = None, top: str | None = None) -> str:
        """Rolls back to an acknowledged checkpoint; returns the safety checkpoint's id."""
        target_id = target_id or self.rng.choice(sorted(self.acked))
        before = workspace_state(self.workspace)
        expected = with_subset(self.acked[target_id], before, top)
        request = pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=target_id, request_id=str(ULID()),
                                     scope=pb.ROLLBACK_SCOPE_FILES, paths=[top] if top else [])

        def finished_or_untouched() -> None:
            now = workspace_state(self.workspace)
            assert now in (before, expected), "an interrupted rollback left the workspace half-restored"

        reply = self.call("Rollback", request, after_restart=finished_or_untouched)
        assert workspace_state(self.workspace) == expected
        safety = reply.safety_checkpoint
        assert safety.trigger == pb.TRIGGER_ROLLBACK and safety.rollback_target_checkpoint_id == target_id
        self.remember(safety, before)
        return safety.checkpoint_id

    def step(self) -> None:
        self.steps_armed += 1
        if self.steps_armed > STEPS_PER_ARMING:
            self.server.stop()
            self.rearmed += 1
            self.arm_and_start()
        if not self.acked or self.family == "create" and self.rng.random() < 0.8:
            if self.acked and self.rng.random() < 0.3:
                self.create_state_only()
            else:
                self.create()
            return
        for _ in range(self.rng.randint(1, 3)):
            mutate_workspace(self.workspace, self.rng)
        top = self.rng.choice([None, None, *TOP_DIRECTORIES])
        crashes = len(self.kills)
        safety = self.rollback(top=top)
        if len(self.kills) > crashes:
            self.rollback(target_id=safety)

    # -- the final word -------------------------------------------------------------------

    def verify_everything(self) -> None:
        listed = list_all(self.stub, self.plan_id)
        assert [c.sequence for c in listed] == list(range(1, len(listed) + 1)), "sequences must be gap-free"
        by_id = {c.checkpoint_id: c for c in listed}
        assert set(self.acked) <= set(by_id), "an acknowledged checkpoint is missing"
        regular = [c for c in listed if c.trigger != pb.TRIGGER_ROLLBACK]
        assert len(regular) == len(self.create_request_ids), "a create was recorded twice or lost"
        assert {c.labels["request"] for c in regular} == {r.lower() for r in self.create_request_ids}
        for cid, digest in self.acked_digest.items():
            assert by_id[cid].tree_digest == digest
        state_only = list_all(self.stub, self.state_plan_id)
        assert [c.sequence for c in state_only] == list(range(1, len(state_only) + 1))
        assert {c.labels["request"] for c in state_only} == {r.lower() for r in self.state_request_ids}, \
            "a state-only create was recorded twice or lost"
        for cid, state in self.acked_state.items():
            full = self.stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=cid, view=pb.CHECKPOINT_VIEW_FULL),
                                           timeout=30).checkpoint
            assert full.state == state
        for cid in sorted(self.acked, key=lambda c: by_id[c].sequence):
            self.stub.Rollback(pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=cid,
                                                  scope=pb.ROLLBACK_SCOPE_FILES), timeout=60)
            assert workspace_state(self.workspace) == self.acked[cid], f"checkpoint {cid} did not restore exactly"


def run_crash_campaign(server, seed: int, kills_wanted: int) -> CrashDriver:
    rng = random.Random(seed)
    workspace = server.new_workspace()
    seed_workspace(workspace, rng)
    driver = CrashDriver(server, rng, workspace)
    driver.arm_and_start(family="create")
    while len(driver.kills) < kills_wanted:
        driver.step()
    driver.server.stop()
    report = fsck(server)
    assert report.ok, report.to_json()
    server.start()
    driver.connect()
    assert driver.pending_journals() == []
    driver.verify_everything()
    driver.channel.close()
    server.stop()
    assert_fsck_clean(server)
    return driver


def run_parallel_campaigns(idle_servers, seeds: list[int], kills_each: int) -> list[CrashDriver]:
    """Independent campaigns on their own servers at once: a kill costs a server start, and
    starts overlap."""
    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        futures = [pool.submit(run_crash_campaign, idle_servers(), seed, kills_each) for seed in seeds]
        return [future.result() for future in futures]


def _assert_coverage(drivers: list[CrashDriver], kills_wanted: int) -> None:
    kills = [k for driver in drivers for k in driver.kills]
    points = Counter(k.point for k in kills)
    assert len(kills) >= kills_wanted
    assert {k.during for k in kills} >= {"CreateCheckpoint", STATE_ONLY_CREATE, "Rollback", "recovery"}
    assert sum(points[p] for p in CREATE_POINTS) > 0 and sum(points[p] for p in ROLLBACK_POINTS) > 0
    print(f"\n{len(kills)} kills: " + ", ".join(f"{p.value} x{n}" for p, n in sorted(points.items()))
          + f"; during recovery: {sum(k.during == 'recovery' for k in kills)}; "
          + f"re-armed without a kill: {sum(d.rearmed for d in drivers)}")


@pytest.mark.timeout(1200)
def test_kill_dash_nine_at_fifty_seeded_points_loses_nothing(idle_servers) -> None:
    drivers = run_parallel_campaigns(idle_servers, [SEED, SEED + 1], kills_each=25)
    _assert_coverage(drivers, 50)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_kill_dash_nine_at_a_hundred_more_seeded_points(idle_servers) -> None:
    drivers = run_parallel_campaigns(idle_servers, [SEED + 2, SEED + 3], kills_each=50)
    _assert_coverage(drivers, 100)
