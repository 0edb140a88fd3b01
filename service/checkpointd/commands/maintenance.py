"""gc: retention + garbage collection on a data directory, without a server."""

from __future__ import annotations

import argparse
import contextlib

from rich import box
from rich.table import Table

from checkpointd.commands import render
from checkpointd.commands.failures import on_interrupt
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.maintenance.datadir_lock import DataDirBusy, held_offline
from checkpointd.core.maintenance.retention import GcAborted, Maintenance, MaintenanceReport, store_footprint
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import open_store
from checkpointd.server import ServerSettings


def _report_table(report: MaintenanceReport) -> Table:
    data = report.as_dict()
    title = "garbage collection" + (" (dry run: nothing was deleted)" if report.gc.dry_run else "")
    table = Table(title=title, box=box.SIMPLE, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    verb = "prunable" if report.gc.dry_run else "pruned"
    for rule, count in data["pruned_by_rule"].items():
        table.add_row(f"checkpoints {verb} by {rule}", str(count))
    table.add_row("objects deleted" if not report.gc.dry_run else "objects unreferenced",
                  str(report.gc.deleted_objects))
    table.add_row("bytes reclaimed" if not report.gc.dry_run else "bytes reclaimable",
                  render.human_size(report.gc.reclaimed_bytes))
    table.add_row("objects in the store", str(report.gc.store_objects))
    table.add_row("store size", render.human_size(report.gc.store_bytes))
    return table


def gc(args: argparse.Namespace) -> int:
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
            store = open_store(args.store, db, data_dir)
            config = ConfigStore(db)
            checkpoints = Checkpoints(db, store, config, EngineSettings(data_dir, ()))
            maintenance = Maintenance(db, store, checkpoints.trees, config, checkpoints.delete)
            interrupted = ("aborted, nothing changed" if args.dry_run else
                           "interrupted: retention and collection may have done part of their work; "
                           "run `checkpointd gc` again to finish")
            with on_interrupt(interrupted):
                report = maintenance.run(dry_run=args.dry_run)
                compacted = _compact(store, report) if args.compact and not args.dry_run else None
    except (DataDirBusy, GcAborted) as exc:
        render.err.print(f"error: {exc}", highlight=False)
        return 1
    finally:
        db.dispose()
    if args.json:
        render.emit_json(report.as_dict() | ({"compaction": compacted} if compacted is not None else {}))
    else:
        render.out.print(_report_table(report))
        if compacted is not None:
            render.out.print(f"compaction: {compacted['packs']} pack(s) rewritten, "
                             f"{render.human_size(compacted['reclaimed_bytes'])} reclaimed; store size now "
                             f"{render.human_size(compacted['store_bytes'])}", highlight=False)
    return 0


def _compact(store, report: MaintenanceReport) -> dict[str, int]:
    """Repacks the disk store after collection (the database store keeps no packs)."""
    if not isinstance(store, ContentStore):
        return {"packs": 0, "reclaimed_bytes": 0, "store_bytes": report.gc.store_bytes}
    with store.collecting():
        packs, reclaimed = store.compact_all()
    return {"packs": packs, "reclaimed_bytes": reclaimed, "store_bytes": store_footprint(store)[1]}
