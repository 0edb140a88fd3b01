"""gc: retention + garbage collection on a data directory, without a server."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from rich import box
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from checkpointd.commands import offline_location, render
from checkpointd.commands.interruption import on_interrupt
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.kernel.errors import CheckpointdError
from checkpointd.core.maintenance.datadir_lock import DataDirBusy, OfflineCommand, held_offline
from checkpointd.core.maintenance.retention import GcAborted, Maintenance, MaintenanceReport, store_footprint
from checkpointd.core.metadata.db import Database, DatabaseUrlError, SchemaError
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import open_store
from checkpointd.serve_options import first_line
from checkpointd.server import ServerSettings

#: The SQLite database a data directory holds (without --db-url).
DATABASE_FILE = "checkpointd.db"
#: What `checkpointd gc` beside a running server is told: that server can collect garbage itself.
GC = OfflineCommand("`checkpointd gc`", ", or let it collect garbage itself (serve --gc-interval SECONDS)")


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


def offline_data_dir(data_dir: Path, db_url: str) -> Path | None:
    """The data directory gc and stats work on, or None (the reason printed) when it is not one:
    as fsck does, a directory that holds no checkpointd database (and no --db-url names one) is
    refused, and nothing is created in it."""
    if not data_dir.is_dir():
        render.error(f"no data directory at {data_dir}")
        return None
    if not db_url and not (data_dir / DATABASE_FILE).is_file():
        render.error(f"{data_dir} holds no checkpointd database ({DATABASE_FILE}): is it the data directory? "
                     "(--data-dir, env CHECKPOINTD_DATA_DIR)")
        return None
    return data_dir


#: Errors of an offline command's database or data directory: one line, exit 1.
OFFLINE_ERRORS = (DataDirBusy, DatabaseUrlError, SchemaError, SQLAlchemyError, CheckpointdError, OSError)


def offline_failure(exc: BaseException) -> int:
    """Prints the one line for one of OFFLINE_ERRORS; returns the exit status."""
    render.error(str(exc) if isinstance(exc, DataDirBusy | DatabaseUrlError | SchemaError) else
                 f"cannot use the data directory's database: {first_line(exc)}")
    return 1


def gc(args: argparse.Namespace) -> int:
    data_dir, db_url, store_kind = offline_location(args)
    if offline_data_dir(data_dir, db_url) is None:
        return 1
    db = None
    try:
        with contextlib.ExitStack() as stack:
            settings = ServerSettings(listen=(), data_dir=data_dir, workspace_roots=(), db_url=db_url,
                                      store=store_kind)
            db = Database(settings.database_url)
            stack.enter_context(held_offline(data_dir, store_kind, db, GC))
            db.migrate()
            store = open_store(store_kind, db, data_dir)
            config = ConfigStore(db)
            checkpoints = Checkpoints(db, store, config, EngineSettings(data_dir, ()))
            maintenance = Maintenance(db, store, checkpoints.trees, config, checkpoints.delete)
            interrupted = ("aborted, nothing changed" if args.dry_run else
                           "interrupted: retention and collection may have done part of their work; "
                           "run `checkpointd gc` again to finish")
            with on_interrupt(interrupted):
                report = maintenance.run(dry_run=args.dry_run)
                compacted = _compact(store, report) if args.compact and not args.dry_run else None
    except GcAborted as exc:
        render.error(str(exc))
        return 1
    except OFFLINE_ERRORS as exc:
        return offline_failure(exc)
    finally:
        if db is not None:
            db.dispose()
    if args.json:
        render.emit_json(report.as_dict() | ({"compaction": compacted} if compacted is not None else {}))
    else:
        render.out.print(_report_table(report))
        if compacted is not None:
            render.out.print(f"compaction: {render.counted(compacted['packs'], 'pack')} rewritten, "
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
