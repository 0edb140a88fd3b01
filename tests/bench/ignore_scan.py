"""What ignore matching costs a full scan: every entry of a workspace asked of the ignore rules
exactly as a capture's walk asks (ignored directories pruned, directories without a
.gitignore noted), over a listing held in memory, so that only matching is timed.

    .venv/bin/python -m tests.bench.ignore_scan WORKSPACE [--module PATH/TO/ignore.py] [--repeat 5]

WORKSPACE is any directory (``tests.bench.workspace_gen`` makes the benchmark's: 100k files
plus an ignored node_modules). It is timed with its own .gitignore files, then with a typical
50-line Python/Node .gitignore at its root instead. ``--module`` loads another version of
``checkpointd/core/capture/ignore.py`` (e.g. main's) to compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

TYPICAL_GITIGNORE = """\
# Python
__pycache__/
*.py[cod]
*$py.class
*.so
.Python
build/
develop-eggs/
dist/
downloads/
eggs/
.eggs/
lib64/
parts/
sdist/
wheels/
*.egg-info/
.installed.cfg
*.egg
MANIFEST
pip-log.txt
.tox/
.nox/
.coverage
.coverage.*
.cache
nosetests.xml
coverage.xml
*.cover
.hypothesis/
.pytest_cache/
.env
.venv
env/
venv/
/docs/_build/
# Node
node_modules/
npm-debug.log*
yarn-error.log*
.next/
out/
coverage/
*.tsbuildinfo
# editors and OS
.idea/
.vscode/*
!.vscode/settings.json
*.swp
.DS_Store
Thumbs.db
*.log
"""


def listing(root: Path) -> dict[str, list[tuple[str, bool]]]:
    """directory -> its entries (name, is a directory), sorted as the capture sorts them."""
    out: dict[str, list[tuple[str, bool]]] = {}

    def walk(path: Path, prefix: str) -> None:
        with os.scandir(path) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        out[prefix] = entries
        for name, is_dir in entries:
            if is_dir:
                walk(path / name, f"{prefix}/{name}" if prefix else name)

    walk(root, "")
    return out


def scan(module, tree: dict[str, list[tuple[str, bool]]], gitignores: dict[str, str]) -> tuple[int, int]:
    """Asks the rules about every entry a capture's walk would meet; returns (asked, ignored)."""
    rules = module.IgnoreRules([], gitignores.get)
    asked = ignored = 0
    stack = [""]
    while stack:
        directory = stack.pop()
        entries = tree[directory]
        if not any(name == ".gitignore" for name, _ in entries):
            rules.note_absent(directory)
        for name, is_dir in entries:
            path = f"{directory}/{name}" if directory else name
            asked += 1
            if rules.ignores_entry(path, is_dir):
                ignored += 1
            elif is_dir:
                stack.append(path)
    return asked, ignored


def load(path: str | None):
    if path is None:
        import checkpointd.core.capture.ignore as module

        return module
    spec = importlib.util.spec_from_file_location("ignore_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--module", help="another ignore.py to time instead of this checkout's")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    module = load(args.module)
    tree = listing(args.workspace)
    own = {d: (args.workspace / d / ".gitignore").read_text(errors="surrogateescape")
           for d, entries in tree.items() if any(n == ".gitignore" for n, _ in entries)}
    for label, gitignores in (("own .gitignore files", own), ("typical 50-line .gitignore", {"": TYPICAL_GITIGNORE})):
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            asked, ignored = scan(module, tree, gitignores)
            times.append(time.perf_counter() - started)
        print(f"{label}: {asked} entries asked, {ignored} ignored; median {statistics.median(times) * 1000:.1f} ms "
              f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}) over {args.repeat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
