"""stats: what each plan's checkpoints hold in the content store, offline, on a data directory."""

from __future__ import annotations

import argparse
import contextlib

from rich import box
from rich.table import Table

from checkpointd.commands import render
from checkpointd.core.maintenance.datadir_lock import DataDirBusy, held_offline
from checkpointd.core.maintenance.usage import StoreUsage, store_usage
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import open_store
from checkpointd.server import ServerSettings


def _table(usage: StoreUsage, whole_store: bool) -> Table:
    table = Table(title="content store by plan (an object two plans share counts in both)", box=box.SIMPLE,
                  title_justify="left")
    table.add_column("plan")
    table.add_column("checkpoints", justify="right")
    table.add_column("objects", justify="right")
    table.add_column("store bytes", justify="right")
    table.add_column("exclusive bytes", justify="right")
    for plan in usage.plans:
        table.add_row(plan.plan_id, str(plan.checkpoints), str(plan.objects), render.human_size(plan.store_bytes),
                      render.human_size(plan.exclusive_bytes))
    if whole_store:
        table.add_section()
        table.add_row("whole store", "", str(usage.store_objects), render.human_size(usage.store_bytes), "")
        table.add_row("SQLite write-ahead logs", "", "", render.human_size(usage.wal_bytes), "")
    return table


def stats(args: argparse.Namespace) -> int:
    data_dir = args.data_dir.expanduser().resolve()
    if not data_dir.is_dir():
        render.err.print(f"error: no data directory at {data_dir}", highlight=False)
        return 1
    settings = ServerSettings(listen=(), data_dir=data_dir, workspace_roots=(), db_url=args.db_url,
                              store=args.store)
    db = Database(settings.database_url)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(held_offline(data_dir, args.store, db))
            db.migrate()
            usage = store_usage(db, open_store(args.store, db, data_dir), data_dir, args.plan)
    except DataDirBusy as exc:
        render.err.print(f"error: {exc}", highlight=False)
        return 1
    finally:
        db.dispose()
    unknown = sorted(set(args.plan) - {plan.plan_id for plan in usage.plans})
    if unknown:
        render.err.print(f"error: no checkpoints of plan {', '.join(unknown)} in {data_dir}", highlight=False)
        return 1
    if args.json:
        render.emit_json(usage.as_dict())
    else:
        render.out.print(_table(usage, whole_store=not args.plan))
    if usage.missing_nodes:
        render.err.print(f"warning: {usage.missing_nodes} referenced tree node(s) could not be read; run "
                         "`checkpointd fsck`", highlight=False)
    return 0
