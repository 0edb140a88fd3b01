"""health: the gRPC health check as an exit status (for HEALTHCHECK and scripts)."""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from checkpointd.commands import render
from checkpointd.commands.connection import connect
from checkpointd.commands.failures import reports_errors, unreachable
from checkpointd_client import CheckpointdRpcError


@reports_errors
def health(args: argparse.Namespace) -> int:
    why = None
    with connect(args) as conn:
        metadata = (("authorization", f"Bearer {conn.token}"),) if conn.token else ()
        try:
            reply = health_pb2_grpc.HealthStub(conn.channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout, metadata=metadata)
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as error:
            status = error.code().name
            why = unreachable(CheckpointdRpcError.from_grpc("Check", error), conn.target, args.timeout)
    if args.json:
        render.emit_json({"target": conn.target, "service": args.service, "status": status})
    else:
        render.out.print(f"{conn.target}: {status}", highlight=False)
        if why:
            render.error(why)
    return 0 if status == "SERVING" else 1
