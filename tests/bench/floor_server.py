"""The floor of every checkpointd figure: a grpcio server, served the way checkpointd serves (a ``grpc.aio``
server on a uvloop event loop, whose CreateCheckpoint is a coroutine on that loop, with checkpointd's default
thread pool for the RPCs that are not), whose CreateCheckpoint does nothing. What a call to it costs on this
machine, no server in Python can go below; the bench prints it beside checkpointd's figures.

    python -m tests.bench.floor_server 127.0.0.1:PORT
"""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc  # noqa: E402
import uvloop  # noqa: E402

from checkpoint.v1 import checkpoint_service_pb2 as pb  # noqa: E402
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc  # noqa: E402
from checkpointd.server import ServerSettings  # noqa: E402
from tests.bench.checkpointd_driver import STARTUP_LIMIT_SECONDS, ServerProcess, free_tcp_port  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
#: As many threads as checkpointd's default pool for the RPCs it does not serve on the event loop.
RPC_THREADS = ServerSettings.__dataclass_fields__["max_workers"].default


class DoNothingCheckpoints(pb_grpc.CheckpointServiceServicer):
    """Answers CreateCheckpoint with a checkpoint of the request's plan, recording nothing."""

    async def CreateCheckpoint(self, request: pb.CreateCheckpointRequest, context: grpc.aio.ServicerContext):
        return pb.CreateCheckpointResponse(checkpoint=pb.Checkpoint(
            checkpoint_id="01KB0000000000000000000000", plan_id=request.plan_id, sequence=1,
            trigger=request.trigger, source_tool=request.source_tool, description=request.description,
            state_size_bytes=len(request.state)))


class FloorServer(ServerProcess):
    """The do-nothing server in its own process (as checkpointd runs in its own)."""

    def start(self) -> None:
        self.target = f"127.0.0.1:{free_tcp_port()}"
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen([sys.executable, "-m", "tests.bench.floor_server", self.target],
                                             cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        with grpc.insecure_channel(self.target) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=STARTUP_LIMIT_SECONDS)
            except grpc.FutureTimeoutError:
                self.stop()
                raise RuntimeError(f"the floor server did not start; see {self.log_path}") from None


async def serve(target: str) -> None:
    server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(max_workers=RPC_THREADS))
    pb_grpc.add_CheckpointServiceServicer_to_server(DoNothingCheckpoints(), server)
    if server.add_insecure_port(target) == 0:
        raise SystemExit(f"cannot listen on {target}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    uvloop.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
