"""Workspace: confined access to a workspace directory (no path escapes its root), batched syncs,
mount points, and the reader process of large scans (and the record encoding it shares).
May import: kernel."""
