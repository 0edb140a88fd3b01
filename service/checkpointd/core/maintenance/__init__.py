"""Maintenance: retention (which checkpoints to prune), garbage collection of unreferenced objects,
fsck, store usage, and the data-directory lock that keeps a collection from racing another process.
May import: every core package but engine."""
