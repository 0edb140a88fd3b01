"""stats: what each plan's checkpoints hold in the content store, offline, on a data directory."""

from __future__ import annotations

import argparse
import contextlib

from rich import box
from rich.table import Table

from checkpointd.commands import offline_location, render
from checkpointd.commands.maintenance import OFFLINE_ERRORS, offline_data_dir, offline_failure
from checkpointd.core.maintenance.datadir_lock import OfflineCommand, held_offline
from checkpointd.core.maintenance.usage import StoreUsage, store_usage
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import open_store
from checkpointd.server import ServerSettings

#: What `checkpointd stats` beside a running server is told: that server answers for a plan.
STATS = OfflineCommand("`checkpointd stats`",
                       ", or ask it: `checkpointd plans` lists each plan's checkpoints and size (before "
                       "deduplication), and a server with --metrics-listen exports what each takes in the store "
                       "(checkpointd_plan_store_bytes)")


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
    data_dir, db_url, store_kind = offline_location(args)
    if offline_data_dir(data_dir, db_url) is None:
        return 1
    db = None
    try:
        with contextlib.ExitStack() as stack:
            settings = ServerSettings(listen=(), data_dir=data_dir, workspace_roots=(), db_url=db_url,
                                      store=store_kind)
            db = Database(settings.database_url)
            stack.enter_context(held_offline(data_dir, store_kind, db, STATS))
            db.migrate()
            usage = store_usage(db, open_store(store_kind, db, data_dir), data_dir, args.plan)
    except OFFLINE_ERRORS as exc:
        return offline_failure(exc)
    finally:
        if db is not None:
            db.dispose()
    unknown = sorted(set(args.plan) - {plan.plan_id for plan in usage.plans})
    if unknown:
        render.error(f"no checkpoints of plan {', '.join(unknown)} in {data_dir}")
        return 1
    if args.json:
        render.emit_json(usage.as_dict())
    else:
        render.out.print(_table(usage, whole_store=not args.plan))
    if usage.missing_nodes:
        unread = render.counted(usage.missing_nodes, "referenced tree node")
        render.err.print(f"warning: {unread} could not be read; run `checkpointd fsck`", highlight=False)
    return 0
