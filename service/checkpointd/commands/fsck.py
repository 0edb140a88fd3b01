"""fsck: the integrity check, offline on a data directory or through a running server's
AdminService (``--target``). Exit status 0 when nothing was found, 1 on any finding (an
unfinished rollback included), 2 when the check could not run."""

from __future__ import annotations

import argparse

import grpc
from rich import box
from rich.table import Table

from checkpoint.v1 import admin_service_pb2 as pb
from checkpoint.v1 import admin_service_pb2_grpc as pb_grpc
from checkpointd.commands import offline_location, render
from checkpointd.commands.connection import ConnectionOptionsError, connect
from checkpointd.core.maintenance.fsck import CannotCheck, FsckReport, Problem, check_data_dir
from checkpointd.core.metadata.db import DatabaseUrlError
from checkpointd_client import CheckpointdRpcError

#: Exit statuses.
CLEAN, FOUND, CANNOT_CHECK = 0, 1, 2


def fsck(args: argparse.Namespace) -> int:
    if args.target and (args.data_dir or args.db_url or args.store):
        render.error("--target checks a running server: --data-dir, --db-url and --store are for an offline check")
        return CANNOT_CHECK
    try:
        report = _through_server(args) if args.target else _offline(args)
    except (CannotCheck, DatabaseUrlError, ConnectionOptionsError, CheckpointdRpcError) as exc:
        render.error(str(exc))
        return CANNOT_CHECK
    if args.json:
        render.emit_json(report.to_json())
    else:
        _print(report)
    return CLEAN if report.ok and not report.pending_rollbacks else FOUND


def _offline(args: argparse.Namespace) -> FsckReport:
    data_dir, db_url, store = offline_location(args)
    return check_data_dir(data_dir, db_url, store, full=args.unreferenced)


def _through_server(args: argparse.Namespace) -> FsckReport:
    from checkpointd.api.convert import FINDING_KINDS

    with connect(args) as conn:
        metadata = (("authorization", f"Bearer {conn.token}"),) if conn.token else ()
        method = "/checkpoint.v1.AdminService/CheckIntegrity"
        try:
            reply = pb_grpc.AdminServiceStub(conn.channel).CheckIntegrity(
                pb.CheckIntegrityRequest(verify_unreferenced_objects=args.unreferenced), timeout=args.timeout,
                metadata=metadata)
        except grpc.RpcError as error:
            raise CheckpointdRpcError.from_grpc(method, error) from None
    return FsckReport(plans=reply.plan_count, checkpoints=reply.checkpoint_count,
                      objects_verified=reply.verified_object_count,
                      unreferenced_objects=reply.unreferenced_object_count,
                      problems=[Problem(FINDING_KINDS[f.kind], f.subject, f.detail) for f in reply.findings],
                      pending_rollbacks=list(reply.unfinished_rollback_plan_ids))


def _print(report: FsckReport) -> None:
    render.out.print(f"{render.counted(report.plans, 'plan')}, {render.counted(report.checkpoints, 'checkpoint')}, "
                     f"{render.counted(report.objects_verified, 'object')} verified, "
                     f"{report.unreferenced_objects} unreferenced", highlight=False)
    if report.problems:
        table = Table(title=render.counted(len(report.problems), "problem"), box=box.SIMPLE, title_justify="left")
        for column in ("kind", "subject", "detail"):
            table.add_column(column, overflow="fold")
        for problem in report.problems:
            table.add_row(problem.kind.value, problem.subject, problem.detail)
        render.out.print(table)
    for plan_id in report.pending_rollbacks:
        render.out.print(f"plan {plan_id} has an unfinished rollback (a server finishes or undoes it when it starts)",
                         highlight=False)
    if report.ok and not report.pending_rollbacks:
        render.out.print("clean: every checkpoint can be restored", highlight=False)
