"""plans, plan show: finding plans (ListPlans, GetPlan) without remembering their ids."""

from __future__ import annotations

import argparse
from datetime import UTC

from google.protobuf import timestamp_pb2
from rich import box
from rich.table import Table

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.commands import render
from checkpointd.commands.connection import connect
from checkpointd.commands.failures import reports_errors


def _local(moment: timestamp_pb2.Timestamp) -> str:
    return moment.ToDatetime(tzinfo=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _filter(args: argparse.Namespace) -> str:
    terms = [args.filter] if args.filter else []
    if args.under:
        quoted = args.under.replace("\\", "\\\\").replace('"', '\\"')
        terms.append(f'workspace_root : "{quoted}"')
    return " AND ".join(terms)


def plans_table(plans: list[pb.Plan], title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    for column, justify in (("plan", "left"), ("last checkpoint", "left"), ("checkpoints", "right"),
                            ("size", "right"), ("workspace", "left")):
        table.add_column(column, justify=justify, no_wrap=column != "workspace")
    for plan in plans:
        table.add_row(plan.plan_id, _local(plan.update_time) if plan.checkpoint_count else "-",
                      str(plan.checkpoint_count), render.human_size(plan.total_size_bytes),
                      plan.workspace_root or "(state only)")
    return table


@reports_errors
def plans(args: argparse.Namespace) -> int:
    text = _filter(args)
    with connect(args) as conn:
        found = conn.checkpoints().list_plans(filter_expr=text)
    if args.json:
        render.emit_json([render.message_dict(p) for p in found])
    elif not found:
        render.err.print("no plans" + (" match the filter" if text else " yet: `checkpointd create PLAN_ID "
                                                                       "--workspace-root DIR` records a first one"),
                         highlight=False)
    else:
        render.out.print(plans_table(found, f"{render.counted(len(found), 'plan')}, newest plan id first"))
    return 0


@reports_errors
def plan_show(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        plan = conn.checkpoints().get_plan(args.plan_id)
    if args.json:
        render.emit_json(render.message_dict(plan))
        return 0
    table = Table(box=box.SIMPLE, show_header=False, title=f"plan {plan.plan_id}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for field, value in (("workspace", plan.workspace_root or "(state only)"), ("first seen", _local(plan.create_time)),
                         ("last checkpoint", _local(plan.update_time) if plan.checkpoint_count else "-"),
                         ("checkpoints", str(plan.checkpoint_count)),
                         ("newest", plan.newest_checkpoint_id or "-"),
                         ("size", f"{render.human_size(plan.total_size_bytes)} (before deduplication)")):
        table.add_row(field, value)
    render.out.print(table)
    if plan.checkpoint_count:
        render.out.print(f"`checkpointd ls {plan.plan_id}` lists its checkpoints", highlight=False, markup=False)
    return 0
