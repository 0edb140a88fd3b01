"""Capture: turns a workspace into a stored tree: ignore rules (.gitignore and configured),
the stat index, the file watcher, reader processes, full scans and incremental captures.
May import: kernel, workspace, metadata, store."""
