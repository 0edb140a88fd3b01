"""Liveness probes for "no workspace can stall the server": health, and other plans' creates
(state only, and with a workspace of their own), each timed against a bound while something
else is stuck."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc

#: Every probe must answer within this many seconds.
BOUND_SECONDS = 0.1
#: A probe that takes this long has stalled (its deadline; a stalled server fails, never hangs the test).
STALLED_SECONDS = 5.0
#: The share of each kind of probe that must answer within the bound. A stall holds up every call of
#: its kind; one call held up by the machine (two cores, a test suite beside it) is not a stall, and
#: a single slow call in 120 failed CI once (274 ms) while the server was not stalled.
WITHIN_BOUND_SHARE = 0.9


def over_bound(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Kinds of call whose 90th-percentile time (nearest rank) reached the bound: that time and the
    slowest, in ms. Every call must also have answered, within STALLED_SECONDS (its deadline)."""
    over = {}
    for kind, took in samples.items():
        ordered = sorted(took)
        percentile = ordered[math.ceil(WITHIN_BOUND_SHARE * len(ordered)) - 1]
        if percentile >= BOUND_SECONDS:
            over[kind] = {"p90": round(percentile * 1000, 1), "slowest": round(ordered[-1] * 1000, 1)}
    return over


@dataclass
class Probes:
    """Calls that must keep answering within the bound; ``samples``: their times per kind of call."""

    server: object
    plans: int = 2
    samples: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        self._channel = grpc.insecure_channel(self.server.tcp_target)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._checkpoints = pb_grpc.CheckpointServiceStub(self._channel)
        self._state_plan = str(ULID())
        self._workspaces = []
        for _ in range(self.plans):
            root = self.server.new_workspace()
            (root / "notes.txt").write_text("other plan")
            self._workspaces.append((str(ULID()), str(root)))
        self._round(timed=False)  # plans recorded, first captures done: what follows is steady state

    def _calls(self):
        yield "health", lambda: self._health.Check(health_pb2.HealthCheckRequest(), timeout=STALLED_SECONDS)
        yield "state-only create", lambda: self._checkpoints.CreateCheckpoint(
            pb.CreateCheckpointRequest(plan_id=self._state_plan, state=b"s"), timeout=STALLED_SECONDS)
        for plan_id, root in self._workspaces:
            yield "workspace create", lambda plan_id=plan_id, root=root: self._checkpoints.CreateCheckpoint(
                pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=root), timeout=STALLED_SECONDS)

    def _round(self, timed: bool = True) -> None:
        for kind, call in self._calls():
            started = time.perf_counter()
            call()
            took = time.perf_counter() - started
            if timed:
                self.samples.setdefault(kind, []).append(took)
        if timed:
            self.rounds += 1

    def run(self, rounds: int, until=lambda: True, give_up_seconds: float = 60.0) -> None:
        """At least ``rounds`` rounds, and more until ``until()`` holds (at most ``give_up_seconds``)."""
        deadline = time.monotonic() + give_up_seconds
        done = 0
        while done < rounds or not until():
            assert time.monotonic() < deadline, f"gave up waiting after {done} rounds; slowest: {self.slowest()}"
            self._round()
            done += 1

    def slowest(self) -> dict[str, float]:
        return {kind: max(took) for kind, took in self.samples.items()}

    def assert_within_bound(self) -> None:
        over = over_bound(self.samples)
        assert not over, f"calls slower than {BOUND_SECONDS * 1000:.0f} ms (ms) over {self.rounds} rounds: {over}"

    def close(self) -> None:
        self._channel.close()
