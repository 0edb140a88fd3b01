"""Integrity check of a stopped checkpointd's data directory, until `checkpointd fsck` exists.

    .venv/bin/python -m tests.hardening.fsck_tool DATA_DIR [--db-url URL] [--store disk|db] [--quick]

Prints the report as JSON; exits 0 when it is clean, 1 when it found problems, 2 when a
rollback is still unfinished (the server finishes it when it starts), 3 when a server is
running on the data directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from checkpointd.core.fsck import check_data_dir, render
from checkpointd.datadir_lock import DataDirBusy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--db-url", default="")
    parser.add_argument("--store", default="disk", choices=["disk", "db"])
    parser.add_argument("--quick", action="store_true", help="verify referenced objects only")
    args = parser.parse_args(argv)
    try:
        report = check_data_dir(args.data_dir, args.db_url, args.store, full=not args.quick)
    except DataDirBusy as busy:
        print(f"fsck: {busy}; stop the server first", file=sys.stderr)
        return 3
    print(render(report))
    if not report.ok:
        return 1
    return 2 if report.pending_rollbacks else 0


if __name__ == "__main__":
    sys.exit(main())
