"""AdminService: operator calls on a running server. No logic of its own."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from checkpoint.v1 import admin_service_pb2 as pb
from checkpoint.v1 import admin_service_pb2_grpc as pb_grpc
from checkpointd.api import convert
from checkpointd.core.maintenance.fsck import FsckReport


class AdminServicer(pb_grpc.AdminServiceServicer):
    """Plain functions: the asyncio server runs them in its thread pool."""

    def __init__(self, check_integrity: Callable[[bool], FsckReport]) -> None:
        self.check_integrity = check_integrity

    def CheckIntegrity(self, request: pb.CheckIntegrityRequest, context: grpc.ServicerContext):
        return convert.integrity_report(self.check_integrity(request.verify_unreferenced_objects))
