"""The throughput phase's load, in a process of its own so that neither the bench's work nor its GIL slows the
clients: CLIENTS concurrent ``grpc.aio`` clients on one event loop, each with its own channel and plan, each
sending CALLS_PER_CLIENT state-only CreateCheckpoint calls one after the other (after untimed warm-up calls).

    python -m tests.bench.load 127.0.0.1:PORT CLIENTS CALLS_PER_CLIENT [--wait-for-go]

Prints one JSON line: {"calls", "seconds", "client_cpu_seconds", "failures"}, the first three of the timed part.
Exit status 1 when a call failed. With --wait-for-go it prints ``warmed up`` after the warm-up and starts the
timed part on a line from stdin, so that the bench can read the server's CPU time around exactly that part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc  # noqa: E402
from ulid import ULID  # noqa: E402

from checkpoint.v1 import checkpoint_service_pb2 as pb  # noqa: E402
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc  # noqa: E402
from tests.bench.checkpointd_driver import CALL_DEADLINE_SECONDS, STARTUP_LIMIT_SECONDS  # noqa: E402

WARM_UP_CALLS = 10
#: The same 1 KiB every call: after the first, the store has it already.
STATE = bytes(range(256)) * 4
FAILURES_REPORTED = 5
WARMED_UP = "warmed up"


async def send_calls(stub: pb_grpc.CheckpointServiceStub, plan_id: str, count: int, description: str,
                     failures: list[str]) -> int:
    """Sends ``count`` calls one after the other, as CheckpointdClient.checkpoint(plan, None, description,
    STATE) does; stops at the first failure (noted in ``failures``). Returns how many succeeded."""
    request = pb.CreateCheckpointRequest(plan_id=plan_id, trigger=pb.TRIGGER_MANUAL, source_tool="bench/driver",
                                         description=description, state=STATE)
    for done in range(count):
        try:
            await stub.CreateCheckpoint(request, timeout=CALL_DEADLINE_SECONDS)
        except grpc.aio.AioRpcError as failure:
            failures.append(f"{failure.code().name}: {failure.details()}")
            return done
    return count


async def generate_load(target: str, clients: int, calls_per_client: int, wait_for_go: bool) -> dict[str, object]:
    channels = [grpc.aio.insecure_channel(target) for _ in range(clients)]
    failures: list[str] = []
    report: dict[str, object] = {"calls": 0, "seconds": 0.0, "client_cpu_seconds": 0.0}
    try:
        await asyncio.wait_for(asyncio.gather(*(channel.channel_ready() for channel in channels)),
                               STARTUP_LIMIT_SECONDS)
        stubs = [pb_grpc.CheckpointServiceStub(channel) for channel in channels]
        plans = [str(ULID()) for _ in channels]
        await asyncio.gather(*(send_calls(stub, plan, WARM_UP_CALLS, "warm-up", failures)
                               for stub, plan in zip(stubs, plans, strict=True)))
        if not failures:
            if wait_for_go:
                print(WARMED_UP, flush=True)
                sys.stdin.readline()
            cpu_before = time.process_time()
            started = time.perf_counter()
            done = await asyncio.gather(*(send_calls(stub, plan, calls_per_client, "throughput", failures)
                                          for stub, plan in zip(stubs, plans, strict=True)))
            report = {"calls": sum(done), "seconds": time.perf_counter() - started,
                      "client_cpu_seconds": time.process_time() - cpu_before}
    except TimeoutError:
        failures.append(f"TIMEOUT: no connection to {target} within {STARTUP_LIMIT_SECONDS:.0f} s")
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    return {**report, "failures": failures[:FAILURES_REPORTED]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="host:port of the server")
    parser.add_argument("clients", type=int, help="concurrent clients, each with its own channel and plan")
    parser.add_argument("calls_per_client", type=int, help="timed calls each client sends, one after the other")
    parser.add_argument("--wait-for-go", action="store_true",
                        help=f"print {WARMED_UP!r} after the warm-up and wait for a line on stdin")
    arguments = parser.parse_args(argv)
    if arguments.clients < 1 or arguments.calls_per_client < 1:
        parser.error("CLIENTS and CALLS_PER_CLIENT must be at least 1")
    report = asyncio.run(generate_load(arguments.target, arguments.clients, arguments.calls_per_client,
                                       arguments.wait_for_go))
    print(json.dumps(report), flush=True)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
