"""Workspace: confined access to a workspace directory (no path escapes its root), mount points,
and the reader process that reads workspace files for large scans (and the record encoding it shares).
May import: kernel."""
